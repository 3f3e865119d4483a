"""JPEG both ways: `encode_jpeg` takes HWC uint8 pixels and gives the bytes a pack stores; the serving-time
decoders take a sample's stored JPEG bytes (a uint8 view of the RAM cache) and give HWC uint8 pixels.

`DECODERS` is the registry the datasets' `decode=` argument is checked against.
"""
from __future__ import annotations

import io
from typing import Callable

import numpy as np


def encode_jpeg(pixels: np.ndarray, quality: int) -> np.ndarray:
    """JPEG-encode RGB or L pixels with OpenCV (4:2:0, as Pillow's default); returns a uint8 byte array."""
    import cv2

    img = pixels[:, :, 0] if pixels.shape[2] == 1 else cv2.cvtColor(pixels, cv2.COLOR_RGB2BGR)
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, int(quality)])
    if not ok:  # pragma: no cover - OpenCV only fails here on invalid input shapes
        raise ValueError(f"OpenCV could not encode a {pixels.shape} image")
    return buf.reshape(-1)


_SOF = frozenset((0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF))


def jpeg_header(buf) -> tuple[int, int, int] | None:
    """(height, width, components) from a JPEG's frame header (its first SOF segment), read by walking the
    marker segments without decoding anything; None when the bytes are not a JPEG or end before a frame."""
    b = memoryview(buf).cast("B") if not isinstance(buf, (bytes, bytearray)) else buf
    n = len(b)
    if n < 4 or b[0] != 0xFF or b[1] != 0xD8:
        return None
    i = 2
    while i + 3 < n:
        if b[i] != 0xFF:
            return None
        marker = b[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if 0xD0 <= marker <= 0xD7 or marker == 0x01:  # standalone markers carry no length
            i += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image, or scan data before any frame header
            return None
        length = (b[i + 2] << 8) | b[i + 3]
        if marker in _SOF:
            if i + 9 >= n or length < 8:
                return None
            return (b[i + 5] << 8) | b[i + 6], (b[i + 7] << 8) | b[i + 8], b[i + 9]
        if length < 2:
            return None
        i += 2 + length
    return None


def decode_cv2(buf: np.ndarray, channels: int) -> np.ndarray | None:
    import cv2

    # The pack's JPEGs are upright already; ignoring EXIF keeps served pixels equal to the built ones.
    flags = (cv2.IMREAD_GRAYSCALE if channels == 1 else cv2.IMREAD_COLOR_RGB) | cv2.IMREAD_IGNORE_ORIENTATION
    img = cv2.imdecode(buf, flags)
    if img is None:
        return None
    return img[:, :, None] if img.ndim == 2 else img


def decode_cv2_reduced(buf: np.ndarray, channels: int, factor: int) -> np.ndarray | None:
    """Decode at 1/factor scale (1, 2, 4 or 8) in the DCT domain (libjpeg's scaled IDCT, far less work
    than a full decode and a resize): ceil(H / factor) x ceil(W / factor) pixels, pixel i covering the
    full-size pixels [i * factor, (i + 1) * factor)."""
    import cv2

    if factor == 1:
        return decode_cv2(buf, channels)
    reduced = {2: cv2.IMREAD_REDUCED_GRAYSCALE_2, 4: cv2.IMREAD_REDUCED_GRAYSCALE_4, 8: cv2.IMREAD_REDUCED_GRAYSCALE_8}[factor]
    flags = reduced | (cv2.IMREAD_COLOR_RGB if channels == 3 else 0) | cv2.IMREAD_IGNORE_ORIENTATION
    img = cv2.imdecode(buf, flags)
    if img is None:
        return None
    return img[:, :, None] if img.ndim == 2 else img


def decode_pil(buf: np.ndarray, channels: int) -> np.ndarray | None:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(buf.tobytes())) as im:
            img = np.array(im.convert("L" if channels == 1 else "RGB"))  # writable, unlike asarray
    except Exception:
        return None
    return img[:, :, None] if img.ndim == 2 else img


DECODERS: dict[str, Callable[[np.ndarray, int], np.ndarray | None] | None] = {
    "cv2": decode_cv2,
    "pil": decode_pil,
    "none": None,  # serve the stored bytes themselves
}
