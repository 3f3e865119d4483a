"""One sample through the image stages: takes a source path and the settings, gives what the pack stores.

decode (reduced-scale, upright, converted) -> resize (mode) -> encode (JPEG or raw pixels).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ImageDecodeError
from ..settings import ImageSettings
from . import resize
from .decode import decode_source
from .encode import encode_jpeg


@dataclass
class Processed:
    data: np.ndarray  # uint8: JPEG bytes (1-D) or HWC pixels
    shape: tuple[int, int, int]  # HWC of the stored image once decoded
    kept: bool  # the source JPEG's bytes are stored unchanged
    source_bytes: int


def read_source(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except IsADirectoryError:
        raise ImageDecodeError(path, "unreadable", "is a directory") from None
    except OSError as e:
        raise ImageDecodeError(path, "unreadable", e.strerror or str(e)) from None


def process_image(path: str, settings: ImageSettings) -> Processed:
    """Read, decode, resize and encode one image; raises ImageDecodeError for a file that cannot be used."""
    data = read_source(path)
    dec = decode_source(data, path, settings)
    pixels = resize.apply(dec.pixels, dec.geometry)
    shape = (pixels.shape[0], pixels.shape[1], pixels.shape[2])
    if settings.mode == "raw":
        return Processed(pixels, shape, False, len(data))
    if settings.keep_jpeg and dec.keepable:
        return Processed(np.frombuffer(data, np.uint8), shape, True, len(data))
    return Processed(encode_jpeg(pixels, settings.quality), shape, False, len(data))
