"""Decode stage: every awkward kind of file has an expected outcome, decoded correctly or skipped with a reason."""
import io
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from dataprep.errors import ImageDecodeError
from dataprep.images import resize
from dataprep.images.codec import compiled, decode_cv2, decode_pil, with_restarts
from dataprep.images.decode import decode_source, sniff
from dataprep.images.process import process_image
from dataprep.images.settings import ImageSettings
from dataprep.synthetic import photo_like

from .conftest import corpus_dir

S = ImageSettings(size=1024)  # large enough that nothing here is resized


def _jpeg(arr, **kw):
    b = io.BytesIO()
    Image.fromarray(arr).save(b, "JPEG", quality=95, **kw)
    return b.getvalue()


def test_sniff_ignores_the_name():
    png = io.BytesIO()
    Image.new("RGB", (4, 4)).save(png, "PNG")
    assert sniff(png.getvalue()) == "PNG"
    assert sniff(b"\xff\xd8\xff\xe0rest") == "JPEG"
    assert sniff(b"garbage") is None


@pytest.mark.parametrize(
    "data, reason",
    [(b"", "empty file"), (bytes(range(256)) * 8, "not an image"), (b"\xff\xd8\xff\xe0" + b"\0" * 20, "corrupt header")],
)
def test_undecodable_bytes_give_a_reason(data, reason):
    with pytest.raises(ImageDecodeError) as e:
        decode_source(data, "x.JPEG", S)
    assert e.value.reason == reason and "x.JPEG" in str(e.value)


def test_truncated_jpeg_is_skipped_not_grey():
    data = _jpeg(photo_like(0, 120, 160))
    with pytest.raises(ImageDecodeError) as e:
        decode_source(data[: len(data) // 2], "t.JPEG", S)
    assert e.value.reason == "truncated"


def test_exif_orientation_is_applied():
    upright = photo_like(1, 60, 100)  # landscape as the viewer should see it
    stored = np.ascontiguousarray(np.rot90(upright, 1))  # the camera stored it rotated 90 degrees counter-clockwise
    ex = Image.Exif()
    ex[0x0112] = 6  # "rotate 90 CW to view"
    b = io.BytesIO()
    Image.fromarray(stored).save(b, "PNG", exif=ex)
    d = decode_source(b.getvalue(), "r.png", S)
    assert d.pixels.shape == (60, 100, 3)
    assert np.array_equal(d.pixels, upright)
    assert not d.keepable


# -- EXIF orientations 2-8, one by one ------------------------------------------------------------------
# Where the stored pixel (r, c) of an H x W picture lands in the upright one, for each EXIF orientation, written
# here from the definition (EXIF 2.3, tag 0x0112: which visual sides the 0th row and the 0th column are), not
# from the decoder's tables: 5 is the transpose, 7 the transverse, 6 turns clockwise, 8 counter-clockwise.
_EXIF_DEST = {
    2: lambda r, c, h, w: (r, w - 1 - c),
    3: lambda r, c, h, w: (h - 1 - r, w - 1 - c),
    4: lambda r, c, h, w: (h - 1 - r, c),
    5: lambda r, c, h, w: (c, r),
    6: lambda r, c, h, w: (c, h - 1 - r),
    7: lambda r, c, h, w: (w - 1 - c, h - 1 - r),
    8: lambda r, c, h, w: (w - 1 - c, r),
}


def _exif_upright(stored: np.ndarray, k: int) -> np.ndarray:
    """The upright picture of `stored` (HWC) under orientation k, by moving every pixel to its place."""
    h, w = stored.shape[:2]
    r, c = np.mgrid[0:h, 0:w]
    out = np.zeros(((w, h) if k >= 5 else (h, w)) + stored.shape[2:], stored.dtype)
    out[_EXIF_DEST[k](r, c, h, w)] = stored
    return out


def _coordinate_rgb(h: int, w: int, period: float) -> np.ndarray:
    """R a ramp across x, G a ramp down y, B a sinusoid along x + 2y: smooth enough for JPEG, and any flip,
    turn or transpose moves the ramps far (a wrong orientation scores 70 or more, or another shape)."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    b = 128 + 100 * np.sin(2 * np.pi * (x + 2 * y) / period)
    return np.rint(np.stack([255 * x / (w - 1), 255 * y / (h - 1), b], axis=2)).astype(np.uint8)


_SMALL, _LARGE = _coordinate_rgb(48, 80, 16), _coordinate_rgb(384, 640, 128)  # stored (unrotated) pixels


def _oriented_jpeg(stored: np.ndarray, k: int) -> bytes:
    ex = Image.Exif()
    ex[0x0112] = k
    b = io.BytesIO()
    Image.fromarray(stored).save(b, "JPEG", quality=95, subsampling=0, exif=ex)
    return b.getvalue()


def _ignoring_orientation(data: bytes) -> np.ndarray:
    """Pillow's plain decode of the bytes: it never applies EXIF orientation by itself (JPEG)."""
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def _check_exif_orientations(tmp_path, part: str) -> None:
    """Each orientation 2-8 on its own. "decode": decode_source's pixels are within mean abs diff 4 of the
    upright coordinates (JPEG q95 noise scores 1.32; the nearest wrong orientation of the same shape 70.6),
    then exactly the test's transform of Pillow's own decode. "build": a raw pack at full size serves exactly
    that; a pack at size 48 from 640x384 sources (upright 48x80 or, turned, 80x48) is within 2 of the 8x8 block
    means of the upright coordinates (0.50; wrong orientations 69.6 or more), made from libjpeg's 1/8-scale
    decode (the test spies on the draft: 80x48 as stored, the orientation swapped into the draft's request)."""
    if part == "decode":
        for k in range(2, 9):
            data = _oriented_jpeg(_SMALL, k)
            px = decode_source(data, f"o{k}.jpg", S).pixels
            want = _exif_upright(_SMALL, k)
            assert px.shape == want.shape, f"orientation {k}: {px.shape}, upright is {want.shape}"
            diff = np.abs(px.astype(int) - want).mean()
            assert diff < 4, f"orientation {k}: mean abs diff {diff:.1f} from the upright coordinates"
            assert np.array_equal(px, _exif_upright(_ignoring_orientation(data), k)), f"orientation {k}"
        return
    from dataprep import InMemoryImageDataset
    from dataprep.images.build import build_images
    from dataprep.settings import BuildSettings
    from dataprep.sources import scan_folder

    for name, stored in (("small", _SMALL), ("large", _LARGE)):
        (tmp_path / name / "o").mkdir(parents=True)
        for k in range(2, 9):
            (tmp_path / name / "o" / f"{k}.jpg").write_bytes(_oriented_jpeg(stored, k))
    build_images(scan_folder(tmp_path / "small"), tmp_path / "full", BuildSettings(workers=1), ImageSettings(size=1024, mode="raw"))
    build_images(scan_folder(tmp_path / "large"), tmp_path / "draft", BuildSettings(workers=1), ImageSettings(size=48, mode="raw"))
    full, small = InMemoryImageDataset(tmp_path / "full", as_numpy=True), InMemoryImageDataset(tmp_path / "draft", as_numpy=True)
    assert len(full) == len(small) == 7
    for i in range(7):
        k = int(Path(small.sources[i]).stem)
        up = _exif_upright(_LARGE, k)
        h, w = up.shape[:2]
        blocks = up.reshape(h // 8, 8, w // 8, 8, 3).astype(np.float64).mean(axis=(1, 3))
        img = small[i][0]
        assert img.shape == blocks.shape, f"orientation {k}: stored {img.shape}, upright at 48 is {blocks.shape}"
        diff = np.abs(img - blocks).mean()
        assert diff < 2, f"orientation {k}: mean abs diff {diff:.2f} from the upright 8x8 block means"
        k = int(Path(full.sources[i]).stem)
        data = (tmp_path / "small" / full.sources[i]).read_bytes()
        assert np.array_equal(full[i][0], _exif_upright(_ignoring_orientation(data), k)), f"orientation {k}"


@pytest.mark.parametrize("part", ["decode", "build"])
def test_every_exif_orientation_is_applied(tmp_path, part, monkeypatch):
    from PIL import JpegImagePlugin

    calls = []
    draft = JpegImagePlugin.JpegImageFile.draft

    def spy(self, mode, size=None):
        got = draft(self, mode, size)
        calls.append(self.size)  # the size the draft gave
        return got

    monkeypatch.setattr(JpegImagePlugin.JpegImageFile, "draft", spy)
    _check_exif_orientations(tmp_path, part)
    if part == "build":  # 640x384 stored: 1/8 scale is 80x48, whatever the orientation
        assert calls == [(80, 48)] * 7, f"the reduced-scale decode gave {calls}"


@pytest.mark.parametrize("part", ["decode", "build"])
@pytest.mark.parametrize("wrong", ["orientation ignored", "5 and 7 swapped", "6 and 8 swapped", "2 and 4 swapped"])
def test_exif_orientation_check_fails_for_a_wrong_implementation(tmp_path, part, wrong, monkeypatch):
    """Negative controls: the tolerances above refuse an ignored orientation and each confusable pair swapped
    (measured: 70.6 to 126.4 against the limits 4 and 2, where the right decode scores 1.32 and 0.50)."""
    from dataprep.images import decode

    if wrong == "orientation ignored":
        monkeypatch.setattr(decode, "_orientation", lambda im: 1)
    else:
        a, b = int(wrong[0]), int(wrong[6])
        ta, tb = decode._ORIENT[a], decode._ORIENT[b]
        monkeypatch.setitem(decode._ORIENT, a, tb)
        monkeypatch.setitem(decode._ORIENT, b, ta)
    with pytest.raises(AssertionError):
        _check_exif_orientations(tmp_path, part)


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    import struct
    import zlib

    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def _deep_oriented(stored: np.ndarray, k: int, fmt: str) -> bytes:
    """A 16-bit PNG (written by OpenCV, an eXIf chunk spliced in before its pixels) or 16-bit grey TIFF
    (Pillow, orientation tag 274) of `stored` with EXIF orientation k."""
    if fmt == "tif":
        b = io.BytesIO()
        Image.fromarray(stored[:, :, 0]).save(b, "TIFF", tiffinfo={0x0112: k})
        return b.getvalue()
    ok, buf = cv2.imencode(".png", stored[:, :, ::-1] if stored.shape[2] == 3 else stored[:, :, 0])
    assert ok and buf[24] == 16  # IHDR bit depth
    png = buf.tobytes()
    ex = Image.Exif()
    ex[0x0112] = k
    body = ex.tobytes()
    body = body[6:] if body.startswith(b"Exif\0\0") else body  # an eXIf chunk holds the TIFF header on
    at = png.index(b"IDAT") - 4
    return png[:at] + _png_chunk(b"eXIf", body) + png[at:]


def _coordinate_16(h: int, w: int, channels: int) -> np.ndarray:
    """Every pixel its own 16-bit value: grey (y w + x) * 25; RGB ramps across x and down y, and x + 31 y in
    steps of 4099 (mod 65536), so low bits differ too and an 8-bit detour would show."""
    y, x = np.mgrid[0:h, 0:w].astype(np.int64)
    if channels == 1:
        return ((y * w + x) * 25).astype(np.uint16)[:, :, None]
    return np.stack([x * 65535 // (w - 1), y * 65535 // (h - 1), (4099 * (x + 31 * y)) % 65536], axis=2).astype(np.uint16)


_DEEP_CASES = [("png", 1), ("png", 3), ("tif", 1)]


def _check_deep_orientations(tmp_path) -> None:
    """16-bit PNG (grey, RGB) and TIFF (grey) sources with orientation 2-8 decode upright and exact at depth 16,
    and at depth 8 to round(x / 257) of the upright values, through decode_source and through a --depth 16
    build. (For TIFF, Pillow and OpenCV apply the tag themselves on load; PNG's eXIf is dataprep's to apply.)"""
    from dataprep import InMemoryImageDataset
    from dataprep.images.build import build_images
    from dataprep.settings import BuildSettings
    from dataprep.sources import scan_folder

    for fmt, c in _DEEP_CASES:
        stored = _coordinate_16(40, 64, c)
        src = tmp_path / f"{fmt}{c}" / "o"
        src.mkdir(parents=True)
        for k in range(2, 9):
            data = _deep_oriented(stored, k, fmt)
            (src / f"{k}.{fmt}").write_bytes(data)
            want = _exif_upright(stored, k)
            for depth in (16, 8):
                s = ImageSettings(size=1024, mode="raw", depth=depth, grayscale=c == 1)
                px = decode_source(data, f"{k}.{fmt}", s).pixels
                expect = want if depth == 16 else np.floor(want / 257 + 0.5).astype(np.uint8)
                assert px.shape == expect.shape and np.array_equal(px, expect), f"{fmt} {c} channel(s), orientation {k}, depth {depth}"
        out = tmp_path / f"p-{fmt}{c}"
        build_images(scan_folder(src.parent), out, BuildSettings(workers=1), ImageSettings(size=1024, mode="raw", depth=16, grayscale=c == 1))
        ds = InMemoryImageDataset(out, as_numpy=True)
        assert len(ds) == 7
        for i in range(7):
            k = int(Path(ds.sources[i]).stem)
            img = ds[i][0]
            assert img.dtype == np.uint16 and np.array_equal(img, _exif_upright(stored, k)), f"built {fmt}, orientation {k}"


def test_exif_orientation_on_16_bit_files(tmp_path):
    _check_deep_orientations(tmp_path)


@pytest.mark.parametrize("wrong", ["orientation ignored", "5 and 7 swapped"])
def test_16_bit_orientation_check_fails_for_a_wrong_implementation(tmp_path, wrong, monkeypatch):
    """Negative controls for the 16-bit path (its own table, `upright`): each is refused (by the PNG cases)."""
    from dataprep.images import decode

    if wrong == "orientation ignored":
        monkeypatch.setattr(decode, "upright", lambda arr, orientation: arr)
    else:
        monkeypatch.setitem(decode._ORIENT_NP, 5, decode._ORIENT_NP[7])
        monkeypatch.setitem(decode._ORIENT_NP, 7, decode._ORIENT_NP[5])
    with pytest.raises(AssertionError):
        _check_deep_orientations(tmp_path)


def test_sixteen_bit_is_scaled_not_truncated():
    g16 = (np.arange(256, dtype=np.uint16).reshape(16, 16) * 257)
    b = io.BytesIO()
    Image.fromarray(g16).save(b, "PNG")
    d = decode_source(b.getvalue(), "g16.png", ImageSettings(size=64, grayscale=True))
    assert np.array_equal(d.pixels[:, :, 0], np.arange(256, dtype=np.uint8).reshape(16, 16))


def test_alpha_is_composited_on_white_and_palette_converted():
    rgba = np.zeros((8, 8, 4), np.uint8)
    rgba[..., 0] = 200
    rgba[:4, :, 3] = 255  # top half opaque red-ish, bottom half transparent
    b = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(b, "PNG")
    px = decode_source(b.getvalue(), "a.png", S).pixels
    assert (px[:4, :, 0] == 200).all() and (px[4:] == 255).all()
    b = io.BytesIO()
    Image.fromarray(photo_like(2, 32, 32)).convert("P").save(b, "PNG")
    assert decode_source(b.getvalue(), "p.png", S).pixels.shape == (32, 32, 3)


def _rgba_with_every_alpha():
    """16x16 RGBA: alpha runs 0..255 over the pixels, colours encode the coordinates."""
    y, x = np.mgrid[0:16, 0:16]
    return np.stack([(16 * x + 7) % 256, (16 * y + 3) % 256, (5 * x * y) % 256, 16 * y + x], axis=2).astype(np.uint8)


def _check_partial_alpha():
    """Every alpha 0..255 is composited onto white exactly: c a / 255 + 255 (1 - a / 255), within rounding."""
    rgba = _rgba_with_every_alpha()
    b = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(b, "PNG")
    px = decode_source(b.getvalue(), "a.png", S).pixels
    alpha = rgba[..., 3:].astype(np.float64) / 255
    expected = rgba[..., :3] * alpha + 255 * (1 - alpha)
    assert px.shape == (16, 16, 3)
    err = np.abs(px - expected).max()
    assert err <= 0.5, f"largest difference from the composite on white: {err:.2f}"


def test_partial_alpha_is_composited_on_white_exactly():
    _check_partial_alpha()


@pytest.mark.parametrize("wrong", ["alpha ignored", "composited on black"])
def test_partial_alpha_check_fails_for_a_wrong_implementation(wrong, monkeypatch):
    composite = Image.alpha_composite
    if wrong == "alpha ignored":
        monkeypatch.setattr(Image, "alpha_composite", lambda under, over: over)  # convert("RGB") then drops alpha
    else:
        monkeypatch.setattr(Image, "alpha_composite",
                            lambda under, over: composite(Image.new("RGBA", over.size, (0, 0, 0, 255)), over))
    with pytest.raises(AssertionError):
        _check_partial_alpha()


def test_cmyk_jpeg_converts_to_rgb():
    rgb = photo_like(3, 64, 64)
    b = io.BytesIO()
    Image.fromarray(rgb).convert("CMYK").save(b, "JPEG", quality=95)
    px = decode_source(b.getvalue(), "c.JPEG", S).pixels
    assert px.shape == (64, 64, 3)
    assert np.abs(px.astype(int) - rgb.astype(int)).mean() < 8  # colours survive, not inverted


def test_grayscale_source_in_colour_pack_and_colour_source_in_gray_pack():
    gray = photo_like(4, 40, 40)[:, :, 0]
    d = decode_source(_jpeg(gray), "g.JPEG", S)
    assert d.pixels.shape == (40, 40, 3) and (d.pixels[..., 0] == d.pixels[..., 1]).all()
    d = decode_source(_jpeg(photo_like(5, 40, 40)), "c.JPEG", ImageSettings(size=64, grayscale=True))
    assert d.pixels.shape == (40, 40, 1) and d.keepable is False


def _large_source():
    """A 2048x1536 photo with a 24-px checkerboard over it: each square is 4 px once stored at 256, so the wrong
    filter (nearest, bilinear, cubic), a 1-px shift or a crop off the centre moves many pixels a long way."""
    y, x = np.mgrid[0:1536, 0:2048]
    board = ((y // 24 + x // 24) % 2 * 120).astype(np.uint8)
    return (photo_like(6, 1536, 2048) // 2 + board[..., None]).astype(np.uint8)


def _check_large_jpeg(data, src, monkeypatch):
    """The build's pixels for a large JPEG equal an area resize of the full picture (mean abs diff < 1.5; the
    draft path scores 0.48, bilinear 3.5, nearest 5.8, cubic 12.5, a 1-px shift 31), and they were made from
    libjpeg's 1/4-scale decode (512x384), not a full decode: the resize stage is spied on to see its input."""
    seen = []
    scale = resize.scale

    def spy(pixels, geom):
        seen.append(pixels.shape)
        return scale(pixels, geom)

    monkeypatch.setattr(resize, "scale", spy)
    p = process_image_from_bytes(data, ImageSettings(size=256, mode="raw"))  # raw: no re-encode noise
    assert seen == [(384, 512, 3)], f"the resize stage got {seen}, not the 1/4-scale (draft) decode"
    assert p.shape == (256, 341, 3)
    full = cv2.resize(src, (341, 256), interpolation=cv2.INTER_AREA)
    diff = np.abs(p.data.astype(int) - full.astype(int)).mean()
    assert diff < 1.5, f"mean abs diff {diff:.2f} from an area resize of the full decode"


def test_large_jpeg_takes_the_reduced_scale_path_and_matches_full_decode(monkeypatch):
    src = _large_source()
    _check_large_jpeg(_jpeg(src), src, monkeypatch)


def _wrong_filter(interpolation):
    def scale(pixels, geom):
        h, w = geom.scaled
        return cv2.resize(pixels, (w, h), interpolation=interpolation)
    return scale


def _shifted(scale):
    return lambda pixels, geom: np.ascontiguousarray(np.roll(scale(pixels, geom), 1, axis=1))


def _top_left(scale):
    def crop(pixels, geom):  # the top-left 98 % of the picture instead of all of it
        h, w = pixels.shape[:2]
        return scale(np.ascontiguousarray(pixels[: h * 49 // 50, : w * 49 // 50]), geom)
    return crop


@pytest.mark.parametrize("wrong", ["nearest", "bilinear", "cubic", "1-px shift", "top-left crop", "draft removed"])
def test_large_jpeg_check_fails_for_a_wrong_implementation(wrong, monkeypatch):
    """Negative controls: the check above must refuse each of these."""
    from PIL import JpegImagePlugin

    src = _large_source()
    data = _jpeg(src)
    scale = resize.scale
    if wrong == "draft removed":  # JpegImageFile overrides Image.draft: patch the one the decoder calls
        monkeypatch.setattr(JpegImagePlugin.JpegImageFile, "draft", lambda self, mode, size=None: None)
    else:
        monkeypatch.setattr(resize, "scale", {
            "nearest": _wrong_filter(cv2.INTER_NEAREST),
            "bilinear": _wrong_filter(cv2.INTER_LINEAR),
            "cubic": _wrong_filter(cv2.INTER_CUBIC),
            "1-px shift": _shifted(scale),
            "top-left crop": _top_left(scale),
        }[wrong])
    with pytest.raises(AssertionError):
        _check_large_jpeg(data, src, monkeypatch)


def process_image_from_bytes(data, settings):
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".JPEG") as f:
        f.write(data)
        f.flush()
        return process_image(f.name, settings)


def test_kept_jpeg_serves_the_same_pixels_as_the_build_decoded():
    src = photo_like(7, 120, 160)
    data = _jpeg(src)
    settings = ImageSettings(size=256)  # smaller than the target, no upscale: no resize
    d = decode_source(data, "k.JPEG", settings)
    assert d.keepable
    p = process_image_from_bytes(data, settings)
    assert p.kept and p.data.tobytes() == with_restarts(data)  # its coefficients, restart markers added (C part)
    assert compiled() == (p.data.tobytes() != data)
    for dec in (decode_cv2, decode_pil):
        assert np.array_equal(dec(p.data, 3), d.pixels)


def test_too_many_pixels_is_refused_before_allocating():
    b = io.BytesIO()
    Image.new("L", (4000, 3000)).save(b, "PNG")
    with pytest.raises(ImageDecodeError) as e:
        decode_source(b.getvalue(), "bomb.png", ImageSettings(size=64, max_pixels=1_000_000))
    assert e.value.reason == "too many pixels"


# -- the shared corpus of awkward files: each has a stated outcome ---------------------------------
AWKWARD = {
    "alpha.png": None,
    "cmyk.JPEG": None,
    "empty.JPEG": "empty file",
    "exif_rot6.JPEG": None,
    "garbage.JPEG": "not an image",
    "gray.JPEG": None,
    "gray16.png": None,
    "gray16.tif": None,
    "palette.png": None,
    "png_named.JPEG": None,
    "progressive.JPEG": None,
    "q100_444.JPEG": None,
    "rgb16.png": None,
    "truncated.JPEG": "truncated",
}


@pytest.mark.corpus
@pytest.mark.parametrize("name, reason", sorted(AWKWARD.items()))
def test_awkward_corpus_file(name, reason):
    path = corpus_dir("awkward") / name
    settings = ImageSettings(size=256)
    if reason is not None:
        with pytest.raises(ImageDecodeError) as e:
            process_image(str(path), settings)
        assert e.value.reason == reason
        return
    p = process_image(str(path), settings)
    # every awkward file was derived from one ~500x334 landscape photo: upright, 3 channels, shorter side 256
    assert p.shape == (256, 383, 3)
    img = decode_cv2(p.data, 3)
    assert img.shape == p.shape
    if name == "alpha.png":
        _check_alpha_png(img)
        return
    ref = process_image(str(path.parent / "q100_444.JPEG"), settings)
    diff = np.abs(img.astype(int) - decode_cv2(ref.data, 3).astype(int)).mean()
    limit = 40 if name in ("gray.JPEG", "gray16.png", "gray16.tif") else 6  # gray differs from the colour original
    assert diff < limit, f"{name} looks unlike the original photo (mean abs diff {diff:.1f})"


def _check_alpha_png(img):
    """alpha.png against its own composite on white, computed here from its RGBA pixels and area-resized:
    the build scores 2.3 (JPEG noise), ignoring alpha 38.5, compositing on black 128. (Against the opaque
    original, as before, the right composite scored 38.4 and ignoring alpha 1.1: no limit told them apart.)"""
    rgba = np.asarray(Image.open(corpus_dir("awkward") / "alpha.png").convert("RGBA")).astype(np.float64)
    alpha = rgba[..., 3:] / 255
    composite = np.rint(rgba[..., :3] * alpha + 255 * (1 - alpha)).astype(np.uint8)
    expected = cv2.resize(composite, (img.shape[1], img.shape[0]), interpolation=cv2.INTER_AREA)
    diff = np.abs(img.astype(int) - expected.astype(int)).mean()
    assert diff < 6, f"alpha.png is not its composite on white (mean abs diff {diff:.1f})"


@pytest.mark.corpus
def test_alpha_png_check_fails_when_alpha_is_ignored(monkeypatch):
    monkeypatch.setattr(Image, "alpha_composite", lambda under, over: over)
    p = process_image(str(corpus_dir("awkward") / "alpha.png"), ImageSettings(size=256))
    with pytest.raises(AssertionError):
        _check_alpha_png(decode_cv2(p.data, 3))


def test_declared_enormous_dimensions_are_refused_from_the_header():
    import struct
    import zlib

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)

    bomb = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 60000, 60000, 8, 2, 0, 0, 0)) + chunk(b"IEND", b"")
    with pytest.raises(ImageDecodeError) as e:
        decode_source(bomb, "bomb.png", ImageSettings(size=64))  # 3.6 G pixels, 10.8 GB if decoded
    assert e.value.reason == "too many pixels"
