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
from ..settings import ImageSettings
from . import resize

ImageFile.LOAD_TRUNCATED_IMAGES = False  # a truncated file is an error, never a grey half-image

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
    try:
        orientation = int(im.getexif().get(0x0112, 1)) if fmt in ("JPEG", "PNG", "TIFF", "WEBP") else 1
    except Exception:
        orientation = 1  # unreadable EXIF is not worth losing the picture over
    if orientation not in _ORIENT:
        orientation = 1
    upright = (w, h) if orientation < 5 else (h, w)
    geom = resize.plan(upright[1], upright[0], settings.size, settings.resize, settings.upscale)
    drafted = False
    if fmt == "JPEG" and geom.scale < 1:
        want = (geom.scaled[1], geom.scaled[0]) if orientation < 5 else (geom.scaled[0], geom.scaled[1])
        # draft picks the largest DCT reduction (1/2, 1/4, 1/8) that keeps the image >= `want`.
        drafted = im.draft(im.mode, want) is not None
    try:
        im.load()
    except Exception as e:
        msg = str(e)
        reason = "truncated" if "truncated" in msg or "broken data stream" in msg else "corrupt data"
        raise ImageDecodeError(path, reason, f"{type(e).__name__}: {msg}") from None
    source_mode = im.mode
    for op in _ORIENT.get(orientation, ()):
        im = im.transpose(op)
    pixels = _to_uint8(im, path, settings.grayscale)
    keepable = fmt == "JPEG" and orientation == 1 and not drafted and source_mode == ("L" if settings.grayscale else "RGB")
    return Decoded(pixels, fmt, (upright[1], upright[0]), geom, keepable)


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
