"""Encode stage: takes HWC uint8 pixels, gives the bytes stored in the pack (JPEG, or the pixels themselves)."""
from __future__ import annotations

import numpy as np


def encode_jpeg(pixels: np.ndarray, quality: int) -> np.ndarray:
    """JPEG-encode RGB or L pixels with OpenCV (4:2:0, as Pillow's default); returns a uint8 byte array."""
    import cv2

    img = pixels[:, :, 0] if pixels.shape[2] == 1 else cv2.cvtColor(pixels, cv2.COLOR_RGB2BGR)
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, int(quality)])
    if not ok:  # pragma: no cover - OpenCV only fails here on invalid input shapes
        raise ValueError(f"OpenCV could not encode a {pixels.shape} image")
    return buf.reshape(-1)
