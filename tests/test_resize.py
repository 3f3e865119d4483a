from pathlib import Path

import numpy as np
import pytest

from dataprep.images import resize


@pytest.mark.parametrize(
    "h, w, size, mode, upscale, scaled, out",
    [
        (375, 500, 256, "shorter", False, (256, 341), (256, 341)),
        (375, 500, 256, "longer", False, (192, 256), (192, 256)),
        (375, 500, 256, "center-crop", False, (256, 341), (256, 256)),
        (375, 500, 256, "pad", False, (192, 256), (256, 256)),
        (100, 80, 256, "shorter", False, (100, 80), (100, 80)),  # no upscaling by default
        (100, 80, 256, "shorter", True, (320, 256), (320, 256)),
        (100, 80, 256, "center-crop", False, (100, 80), (256, 256)),  # small: padded to the square
        (2048, 1536, 512, "shorter", False, (683, 512), (683, 512)),
    ],
)
def test_plan(h, w, size, mode, upscale, scaled, out):
    g = resize.plan(h, w, size, mode, upscale)
    assert g.scaled == scaled and g.out == out


def test_apply_center_crop_takes_the_middle():
    img = np.zeros((100, 200, 1), np.uint8)
    img[:, 50:150] = 200  # the central 100 columns are bright
    out = resize.apply(img, resize.plan(100, 200, 100, "center-crop"))
    assert out.shape == (100, 100, 1) and out.min() == 200


def test_apply_pad_centres_the_image_on_black():
    img = np.full((50, 100, 3), 255, np.uint8)
    out = resize.apply(img, resize.plan(50, 100, 100, "pad"))
    assert out.shape == (100, 100, 3)
    assert out[:25].max() == 0 and out[75:].max() == 0 and out[25:75].min() == 255


def _coordinate_image(h, w):
    """Pixels that encode their coordinates ((37 x, 53 y, 11 (x + 3 y)) mod 256): every pixel of a 4x4 block
    differs from its neighbours, so a filter that picks or weights pixels wrongly, or a window off by one
    source pixel, changes the block averages."""
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([(37 * x) % 256, (53 * y) % 256, (11 * (x + 3 * y)) % 256], axis=2).astype(np.uint8)


def _check_area_shrink():
    """A 4x shrink is the exact mean of each 4x4 block, computed here (within 0.5: rounding to uint8)."""
    img = _coordinate_image(400, 600)
    out = resize.apply(img, resize.plan(400, 600, 100, "shorter"))
    assert out.shape == (100, 150, 3)
    ref = img.reshape(100, 4, 150, 4, 3).astype(np.float64).mean(axis=(1, 3))
    err = np.abs(out - ref).max()
    assert err <= 0.5, f"largest difference from the 4x4 block means: {err}"


def test_apply_area_shrink_is_the_block_average():
    _check_area_shrink()


@pytest.mark.parametrize("wrong", ["nearest", "cubic", "shifted crop"])
def test_area_shrink_check_fails_for_a_wrong_implementation(wrong, monkeypatch):
    """Negative controls: nearest and cubic filters, and an area filter over a window one source pixel off."""
    import cv2

    def scale(pixels, geom):
        h, w = geom.scaled
        if wrong == "shifted crop":
            return cv2.resize(np.roll(pixels, (-1, -1), axis=(0, 1)), (w, h), interpolation=cv2.INTER_AREA)
        return cv2.resize(pixels, (w, h), interpolation=cv2.INTER_NEAREST if wrong == "nearest" else cv2.INTER_CUBIC)

    monkeypatch.setattr(resize, "scale", scale)  # apply() calls the module's scale
    with pytest.raises(AssertionError):
        _check_area_shrink()


# -- 16-bit pixels: an area shrink keeps all 16 bits --------------------------------------------------------
def _coordinate_16(h, w):
    """uint16 pixels: ramps across x and down y over the whole 16-bit range, and 4099 (x + 31 y) mod 65536, so
    neighbours differ in their low bits too (an 8-bit detour, or a filter that picks, changes block means)."""
    y, x = np.mgrid[0:h, 0:w].astype(np.int64)
    return np.stack([x * 65535 // (w - 1), y * 65535 // (h - 1), (4099 * (x + 31 * y)) % 65536], axis=2).astype(np.uint16)


def _check_16_bit_shrink(tmp_path, part):
    """A 256x384 16-bit source at size 64 (4x smaller), through resize.apply ("apply") or a --depth 16 build of
    RGB and grey PNG sources into a colour and a grey pack ("build"), is the mean of each 4x4 block, computed
    here in float64 (of the ITU-R 601 luma for an RGB source in a grey pack), within 0.5: rounding to uint16.
    The area filter scores 0.5; nearest 36720, the 8-bit detour (round(x / 257), area, x 257) 162."""
    import cv2

    from dataprep import InMemoryImageDataset
    from dataprep.images.build import build_images
    from dataprep.images.settings import ImageSettings
    from dataprep.settings import BuildSettings
    from dataprep.sources import scan_folder

    img = _coordinate_16(256, 384)

    def blocks(a):
        return a.reshape(64, 4, 96, 4, a.shape[2]).astype(np.float64).mean(axis=(1, 3))

    if part == "apply":
        out = resize.apply(img, resize.plan(256, 384, 64, "shorter"))
        assert out.dtype == np.uint16 and out.shape == (64, 96, 3)
        err = np.abs(out - blocks(img)).max()
        assert err <= 0.5, f"resize.apply: largest difference from the 4x4 block means {err}"
        return
    luma = np.rint(img.astype(np.float64) @ np.array([0.299, 0.587, 0.114]))[:, :, None]
    want = {(False, "rgb"): blocks(img), (False, "grey"): np.repeat(blocks(img[:, :, 2:]), 3, axis=2),
            (True, "rgb"): blocks(luma), (True, "grey"): blocks(img[:, :, 2:])}
    (tmp_path / "src" / "c").mkdir(parents=True)
    assert cv2.imwrite(str(tmp_path / "src" / "c" / "rgb.png"), img[:, :, ::-1])  # OpenCV writes BGR
    assert cv2.imwrite(str(tmp_path / "src" / "c" / "grey.png"), img[:, :, 2])
    checked = 0
    for grey in (False, True):
        out_dir = tmp_path / f"p{int(grey)}"
        build_images(scan_folder(tmp_path / "src"), out_dir, BuildSettings(workers=1),  # workers=1: in this process
                     ImageSettings(size=64, mode="raw", depth=16, grayscale=grey))
        ds = InMemoryImageDataset(out_dir, as_numpy=True)
        for i in range(len(ds)):
            got, ref = ds[i][0], want[grey, Path(ds.sources[i]).stem]
            assert got.dtype == np.uint16 and got.shape == ref.shape, (ds.sources[i], got.shape)
            err = np.abs(got - ref).max()
            assert err <= 0.5, f"{ds.sources[i]} (grey pack: {grey}): largest difference from the block means {err}"
            checked += 1
    assert checked == 4


@pytest.mark.parametrize("part", ["apply", "build"])
def test_16_bit_area_shrink_keeps_every_bit(tmp_path, part):
    _check_16_bit_shrink(tmp_path, part)


@pytest.mark.parametrize("part", ["apply", "build"])
@pytest.mark.parametrize("wrong", ["nearest", "8-bit detour"])
def test_16_bit_shrink_check_fails_for_a_wrong_implementation(tmp_path, part, wrong, monkeypatch):
    import cv2

    from dataprep.images.decode import to_depth

    def scale(pixels, geom):
        h, w = geom.scaled
        if wrong == "nearest":
            out = cv2.resize(pixels, (w, h), interpolation=cv2.INTER_NEAREST)
        else:
            out = to_depth(cv2.resize(to_depth(pixels, 8), (w, h), interpolation=cv2.INTER_AREA), 16)
        return out.reshape(h, w, pixels.shape[2])

    monkeypatch.setattr(resize, "scale", scale)  # what resize.apply and the build's process_levels call
    with pytest.raises(AssertionError, match="largest difference"):
        _check_16_bit_shrink(tmp_path, part)
