"""One sample through the image stages: takes a source path and the settings, gives what the pack stores.

decode (reduced-scale, upright, converted) -> resize (mode) -> encode (JPEG or raw pixels).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ImageDecodeError
from ..sources.listing import read_source
from . import resize
from .codec import encode_jpeg
from .decode import decode_source
from .jpegseg import kept_jpeg
from .settings import ImageSettings


@dataclass
class Processed:
    data: np.ndarray  # JPEG bytes (1-D uint8) or HWC pixels (uint8, or uint16 at depth 16)
    shape: tuple[int, int, int]  # HWC of the stored image once decoded
    kept: bool  # the source JPEG is stored as it was: its bytes, or its coefficients with restart markers added
    source_bytes: int
    geometry: resize.Geometry | None = None  # how the upright source became this (a mask follows it)
    phash: int | None = None  # with process_levels(..., fingerprint=True): the sample's perceptual hash, on every size
    orientation: int = 1  # the source's EXIF orientation, which the decode turned it upright by (detection boxes follow it)


def stored_digest(done: Processed) -> bytes:
    """16 bytes of SHA-256 over a sample as stored (its JPEG bytes, or its raw pixels with their shape): equal
    digests mean equal stored samples, so equal served pixels (dataprep/audit/: "exact"). The stored bytes,
    not the decoded pixels: hashing a whole decoded image costs several times the perceptual hash."""
    from ..audit.hashes import pixel_digest

    return pixel_digest(done.data)


def process_image(path: str, settings: ImageSettings) -> Processed:
    """Read, decode, resize and encode one image; raises ImageDecodeError for a file that cannot be used."""
    return process_levels(path, settings)[0]


def process_levels(path: str, settings: ImageSettings, data: bytes | None = None, fingerprint: bool = False) -> list[Processed]:
    """One image at every size of `settings.all_sizes` (largest first), decoded once: each smaller size is
    made from the next larger one's scaled pixels with an area filter, then cropped or padded itself.
    `data`: the source's bytes when they come from elsewhere than the file `path` (a tar member, a row);
    `path` then only names the sample in errors. `fingerprint`: also the perceptual hash of the pixels of
    the smallest size, before they are encoded (`Processed.phash`, the same on every size): the size an
    audit of the pack decodes when it hashes on the fly, so stored and recomputed hashes agree up to the
    JPEG's loss, and the smallest pixels are the cheapest to hash."""
    if data is None:
        data = read_source(path)
    dec = decode_source(data, path, settings)
    h, w = dec.source_shape
    out, scaled = [], dec.pixels
    for k, size in enumerate(settings.all_sizes):
        geom = dec.geometry if k == 0 else resize.plan(h, w, size, settings.resize, settings.upscale)
        try:
            scaled = resize.scale(scaled, geom)
            pixels = resize.crop_pad(scaled, geom)
        except (cv2_error(), ValueError, MemoryError) as e:  # one sample's failure is a skip, never the build's end
            raise ImageDecodeError(path, "cannot resize", f"to {geom.out[1]}x{geom.out[0]}: {type(e).__name__}: {e}") from None
        shape = (pixels.shape[0], pixels.shape[1], pixels.shape[2])
        if settings.mode == "raw":
            out.append(Processed(pixels, shape, False, len(data), geom))
        elif settings.keep_jpeg and dec.keepable_source and geom.identity and (kept := kept_jpeg(data, *shape[:2])) is not None:
            # its coefficients as they were, with restart markers added where they can be (region decoding)
            out.append(Processed(kept, shape, True, len(data), geom))
        else:
            try:
                out.append(Processed(encode_jpeg(pixels, settings.quality), shape, False, len(data), geom))
            except (cv2_error(), ValueError, MemoryError) as e:
                raise ImageDecodeError(path, "cannot encode", f"{shape[1]}x{shape[0]} as JPEG: {type(e).__name__}: {e}") from None
    for p in out:
        p.orientation = dec.orientation
    if fingerprint:
        from ..audit.hashes import perceptual_hash

        h = int(perceptual_hash(pixels))  # `pixels`: the last (smallest) size's, as stored before encoding
        for p in out:
            p.phash = h
    return out


def cv2_error() -> type[Exception]:
    import cv2

    return cv2.error
