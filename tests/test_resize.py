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
