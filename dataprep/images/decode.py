"""Decode stage: takes a source file's bytes, gives HWC uint8 pixels upright, in RGB or L.

Every real-world case is handled here and nowhere else: the format is sniffed from the content
(a PNG named .JPEG is a PNG), EXIF orientation is applied, CMYK / palette / alpha / 16-bit /
grayscale sources are converted, and large JPEGs are decoded at a reduced scale (libjpeg's DCT
scaling through Pillow's `draft`) when the target is small enough. A file that cannot be decoded
raises `ImageDecodeError` with a short reason tag that the build counts.
"""
from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageFile

from ..errors import ImageDecodeError
from . import resize
from .settings import ImageSettings

# EXIF orientation -> Pillow transpose applied to make the image upright.
_ORIENT = {
    2: (Image.Transpose.FLIP_LEFT_RIGHT,),
    3: (Image.Transpose.ROTATE_180,),
    4: (Image.Transpose.FLIP_TOP_BOTTOM,),
    5: (Image.Transpose.TRANSPOSE,),
    6: (Image.Transpose.ROTATE_270,),
    7: (Image.Transpose.TRANSVERSE,),
    8: (Image.Transpose.ROTATE_90,),
}

_MAGIC = (
    (b"\xff\xd8\xff", "JPEG"),
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"BM", "BMP"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
)


def sniff(data: bytes) -> str | None:
    """The image format named by the file's first bytes, or None."""
    for magic, fmt in _MAGIC:
        if data.startswith(magic):
            return fmt
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    if len(data) > 2 and data[0:1] == b"P" and data[1:2] in b"123456":
        return "PPM"
    return None


@dataclass
class Decoded:
    pixels: np.ndarray  # HWC uint8, C = 1 or 3, upright
    source_format: str  # what the content is, whatever the name says
    source_shape: tuple[int, int]  # upright (h, w) at full scale
    geometry: resize.Geometry  # planned from the full-scale upright shape
    keepable_source: bool  # the source bytes decode to exactly `pixels` (a plain upright JPEG, full scale)
    orientation: int = 1  # the EXIF orientation (1-8) the pixels were turned upright by

    @property
    def keepable(self) -> bool:
        """The source bytes may be stored as they are: they decode to `pixels` and need no resize."""
        return self.keepable_source and self.geometry.identity


def decode_source(data: bytes, path: str, settings: ImageSettings) -> Decoded:
    """Decode one source file for the build; raise ImageDecodeError(path, reason) when it cannot be."""
    if not data:
        raise ImageDecodeError(path, "empty file")
    fmt = sniff(data)
    if fmt is None:
        raise ImageDecodeError(path, "not an image", "unrecognised header")
    try:
        with warnings.catch_warnings():
            # Our own limit (settings.max_pixels, checked below) decides; Pillow's global stays untouched.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as e:
        raise ImageDecodeError(path, "too many pixels", str(e)) from None
    except Exception as e:  # Pillow raises many types for bad headers
        raise ImageDecodeError(path, "corrupt header", f"{type(e).__name__}: {e}") from None
    w, h = im.size
    if w * h > settings.max_pixels:
        raise ImageDecodeError(path, "too many pixels", f"{w}x{h} exceeds max_pixels={settings.max_pixels}")
    if fmt == "JPEG":
        # A JPEG's EXIF is in its APP1 segment: read before any pixel is decoded, so the orientation can
        # size the reduced-scale decode (draft).
        orientation = _orientation(im)
        upright = (w, h) if orientation < 5 else (h, w)
        geom = plan_output(upright, settings, path)
        drafted = False
        if geom.scale < 1:
            want = (geom.scaled[1], geom.scaled[0]) if orientation < 5 else (geom.scaled[0], geom.scaled[1])
            # draft picks the largest DCT reduction (1/2, 1/4, 1/8) that keeps the image >= `want`.
            drafted = im.draft(im.mode, want) is not None
        _load(im, path)
    else:
        # Other formats may keep EXIF after the pixel data (PNG's eXIf chunk): reading it first would load
        # the pixels inside getexif, where a decode failure is hidden, and a second load() would then
        # return the partial picture. Load first, so every failure is raised here.
        _load(im, path)
        orientation = _orientation(im) if fmt in ("PNG", "TIFF", "WEBP") else 1
        upright = (w, h) if orientation < 5 else (h, w)
        geom = plan_output(upright, settings, path)
        drafted = False
    source_mode = im.mode
    if is_deep(im, fmt, data):
        # 16 bits per channel: Pillow would cut RGB to 8 bits, so OpenCV decodes these
        pixels = to_depth(_decode_deep(data, path, settings.grayscale, orientation), settings.depth)
        return Decoded(pixels, fmt, (upright[1], upright[0]), geom, False, orientation)
    for op in _ORIENT.get(orientation, ()):
        im = im.transpose(op)
    pixels = to_depth(_to_uint8(im, path, settings.grayscale), settings.depth)
    keepable = (fmt == "JPEG" and orientation == 1 and not drafted and settings.depth == 8
                and source_mode == ("L" if settings.grayscale else "RGB"))
    return Decoded(pixels, fmt, (upright[1], upright[0]), geom, keepable, orientation)


def _load(im: Image.Image, path: str) -> None:
    """Decode the pixels; any failure is an ImageDecodeError, whatever Pillow's global LOAD_TRUNCATED_IMAGES
    says (a user may have set it for their own code; for a pack, a truncated file is never a half-image)."""
    lenient = ImageFile.LOAD_TRUNCATED_IMAGES
    try:
        if lenient:  # only then is the global touched, and it is put back at once
            ImageFile.LOAD_TRUNCATED_IMAGES = False
        im.load()
    except Exception as e:
        msg = str(e)
        reason = "truncated" if "truncated" in msg or "broken data stream" in msg else "corrupt data"
        raise ImageDecodeError(path, reason, f"{type(e).__name__}: {msg}") from None
    finally:
        if lenient:
            ImageFile.LOAD_TRUNCATED_IMAGES = lenient


def _orientation(im: Image.Image) -> int:
    try:
        orientation = int(im.getexif().get(0x0112, 1))
    except Exception:
        orientation = 1  # unreadable EXIF is not worth losing the picture over
    return orientation if orientation in _ORIENT else 1


JPEG_MAX_SIDE = 65500  # libjpeg's JPEG_MAX_DIMENSION (the format's 16-bit sides, less a margin)


def plan_output(upright: tuple[int, int], settings: ImageSettings, path: str) -> resize.Geometry:
    """The geometry of the stored image for an upright (w, h) source, refused (an ImageDecodeError, so the
    sample is skipped with its reason) when what would be made is too large: more pixels than the sources
    may have, or a side JPEG cannot hold."""
    geom = resize.plan(upright[1], upright[0], settings.size, settings.resize, settings.upscale)
    for what, (gh, gw) in (("resized", geom.scaled), ("stored", geom.out)):
        if gh * gw > settings.max_pixels:
            raise ImageDecodeError(path, "too many pixels", f"the {what} image would be {gw}x{gh}, more than max_pixels={settings.max_pixels}")
    if settings.mode == "encoded" and max(geom.out) > JPEG_MAX_SIDE:
        raise ImageDecodeError(path, "too large for JPEG", f"the stored image would be {geom.out[1]}x{geom.out[0]}; "
                               f"JPEG sides end at {JPEG_MAX_SIDE} (use --mode raw, or another --resize)")
    return geom


def is_deep(im: Image.Image, fmt: str, data: bytes) -> bool:
    """Whether a source holds 16 bits per channel (from its header; no pixels decoded)."""
    if im.mode.startswith("I;16") or im.mode == "I":
        return True
    if fmt == "PNG":
        return len(data) > 24 and data[24] == 16  # IHDR bit depth
    if fmt == "TIFF":
        try:
            bits = im.tag_v2.get(258, (8,))
            return 16 in (bits if isinstance(bits, tuple) else (bits,))
        except Exception:
            return False
    return False


def to_depth(pixels: np.ndarray, depth: int) -> np.ndarray:
    """Bring uint8 or uint16 pixels to `depth` bits by scaling, never truncating: 16 -> 8 is
    round(x / 257) (= (255 x + 32767) // 65535), 8 -> 16 is x * 257 (255 -> 65535 exactly)."""
    if depth == 16:
        return pixels if pixels.dtype == np.uint16 else pixels.astype(np.uint16) * 257
    if pixels.dtype == np.uint8:
        return pixels
    return ((pixels.astype(np.uint32) * 255 + 32767) // 65535).astype(np.uint8)


# EXIF orientation as array operations on HWC pixels (the same as _ORIENT's Pillow transposes).
_ORIENT_NP = {
    2: lambda a: a[:, ::-1],
    3: lambda a: a[::-1, ::-1],
    4: lambda a: a[::-1],
    5: lambda a: a.transpose(1, 0, 2),
    6: lambda a: np.rot90(a, -1),
    7: lambda a: np.rot90(a, 2).transpose(1, 0, 2),
    8: lambda a: np.rot90(a, 1),
}


def upright(arr: np.ndarray, orientation: int) -> np.ndarray:
    """HWC pixels turned upright by their EXIF orientation (1-8; anything else leaves them as they are)."""
    return _ORIENT_NP[orientation](arr) if orientation in _ORIENT_NP else arr


def _decode_deep(data: bytes, path: str, grayscale: bool, orientation: int) -> np.ndarray:
    """A 16-bit PNG or TIFF as HWC uint16, RGB or L, upright; alpha composited onto white as for 8 bits."""
    import cv2

    arr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    if arr is None:
        raise ImageDecodeError(path, "corrupt data", "OpenCV could not decode the 16-bit image")
    if arr.dtype == np.uint8:
        arr = arr.astype(np.uint16) * 257
    elif arr.dtype != np.uint16:
        raise ImageDecodeError(path, "unsupported mode", f"{arr.dtype} pixels have no defined 8- or 16-bit scale")
    if arr.ndim == 2:
        arr = arr[:, :, None]
    c = arr.shape[2]
    if c in (2, 4):  # gray+alpha or BGRA: composite onto white
        alpha = arr[:, :, -1:].astype(np.float64) / 65535.0
        arr = np.rint(arr[:, :, :-1] * alpha + 65535.0 * (1.0 - alpha)).astype(np.uint16)
        c -= 1
    if c == 3:
        arr = arr[:, :, ::-1]  # BGR -> RGB
        if grayscale:  # ITU-R 601-2 luma, as Pillow's "L"
            arr = np.rint(arr.astype(np.float64) @ np.array([0.299, 0.587, 0.114]))[:, :, None].clip(0, 65535).astype(np.uint16)
    elif not grayscale:
        arr = np.repeat(arr, 3, axis=2)
    return np.ascontiguousarray(upright(arr, orientation))


def _to_uint8(im: Image.Image, path: str, grayscale: bool) -> np.ndarray:
    """Convert any Pillow mode to HWC uint8 with 1 (grayscale) or 3 channels."""
    mode = im.mode
    if mode.startswith("I") or mode == "F":
        arr = np.asarray(im)
        if mode == "F":
            raise ImageDecodeError(path, "unsupported mode", "32-bit float pixels have no defined 8-bit scale")
        # 16-bit sources: scale 0..65535 onto 0..255 with rounding (x / 257), never truncate.
        arr = np.clip((arr.astype(np.uint32) * 255 + 32767) // 65535, 0, 255).astype(np.uint8)
        im = Image.fromarray(arr, "L")
        mode = "L"
    if mode == "P":
        im = im.convert("RGBA" if "transparency" in im.info else "RGB")
        mode = im.mode
    if mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        # Transparent areas become white, as a viewer shows them, rather than whatever colour they hide.
        im = im.convert("RGBA")
        white = Image.new("RGBA", im.size, (255, 255, 255, 255))
        im = Image.alpha_composite(white, im).convert("RGB")
        mode = "RGB"
    target = "L" if grayscale else "RGB"
    if mode != target:
        im = im.convert(target)
    arr = np.asarray(im)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    return arr
