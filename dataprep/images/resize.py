"""Resize stage: takes HWC uint8 or uint16 pixels and the settings, gives the pixels in the pack's geometry.

Each resize mode is a `ResizeMode` in `RESIZE_MODES`; the CLI's `--resize` choices come from it.
A mode first scales (shrink only unless `upscale`), then optionally center-crops and pads to a
size x size square, so square modes give every sample one shape.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class Geometry:
    """Where a source of (h, w) goes: scaled to `scaled`, then cropped/padded to `out`."""

    source: tuple[int, int]
    scaled: tuple[int, int]
    out: tuple[int, int]

    @property
    def identity(self) -> bool:
        return self.source == self.scaled == self.out

    @property
    def scale(self) -> float:
        return self.scaled[0] / self.source[0]

    @property
    def upscaled(self) -> bool:
        """The source was enlarged (only with `upscale`)."""
        return self.scaled[0] > self.source[0] or self.scaled[1] > self.source[1]


@dataclass(frozen=True)
class ResizeMode:
    name: str
    side: Callable[[int, int], int]  # the side that is brought to `size`
    square: bool  # crop/pad the result to size x size
    help: str


RESIZE_MODES: dict[str, ResizeMode] = {
    m.name: m
    for m in (
        ResizeMode("shorter", min, False, "shorter side to SIZE, aspect kept (default)"),
        ResizeMode("longer", max, False, "longer side to SIZE, aspect kept"),
        ResizeMode("center-crop", min, True, "shorter side to SIZE, then the central SIZE x SIZE square"),
        ResizeMode("pad", max, True, "longer side to SIZE, then padded with black to SIZE x SIZE"),
    )
}


def plan(h: int, w: int, size: int, mode: str, upscale: bool = False) -> Geometry:
    """Compute the geometry for a source of h x w pixels; pure arithmetic, no pixels touched."""
    m = RESIZE_MODES[mode]
    s = size / m.side(h, w)
    if s > 1 and not upscale:
        s = 1.0
    scaled = (max(1, round(h * s)), max(1, round(w * s)))
    if s == 1.0:
        scaled = (h, w)
    out = (size, size) if m.square else scaled
    return Geometry((h, w), scaled, out)


def undersized(geom: Geometry, size: int, mode: str) -> bool:
    """Whether the side `mode` brings to `size` stayed below it: a source smaller than `size`, not enlarged.
    center-crop pads such a sample with black (to size x size), pad frames it on every side, and
    shorter / longer store it smaller than `size`."""
    return RESIZE_MODES[mode].side(*geom.scaled) < size


def apply(pixels: np.ndarray, geom: Geometry) -> np.ndarray:
    """Resize (area filter when shrinking, cubic when enlarging), then center-crop and pad to `geom.out`."""
    return crop_pad(scale(pixels, geom), geom)


def scale(pixels: np.ndarray, geom: Geometry) -> np.ndarray:
    """Bring pixels of any size to `geom.scaled` (area filter when shrinking, cubic when enlarging)."""
    return to_size(pixels, geom.scaled)


def to_size(pixels: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Pixels of any size at (h, w) `size` (area filter when shrinking, cubic when enlarging)."""
    import cv2

    h, w = size
    if pixels.shape[:2] == (h, w):
        return pixels
    shrinking = h * w < pixels.shape[0] * pixels.shape[1]
    channels = pixels.shape[2]
    out = cv2.resize(pixels, (w, h), interpolation=cv2.INTER_AREA if shrinking else cv2.INTER_CUBIC)
    return out.reshape(h, w, channels) if out.ndim == 2 else out


def crop_pad(pixels: np.ndarray, geom: Geometry, fill: int = 0) -> np.ndarray:
    """Center-crop and pad scaled pixels to `geom.out` (padding with `fill`)."""
    h, w = pixels.shape[:2]
    oh, ow = geom.out
    if (oh, ow) == (h, w):
        return np.ascontiguousarray(pixels)
    top, left = max(0, (h - oh) // 2), max(0, (w - ow) // 2)
    pixels = pixels[top : top + oh, left : left + ow]
    ph, pw = pixels.shape[:2]
    if (ph, pw) == (oh, ow):
        return np.ascontiguousarray(pixels)
    out = np.full((oh, ow, pixels.shape[2]), fill, pixels.dtype)
    y, x = (oh - ph) // 2, (ow - pw) // 2
    out[y : y + ph, x : x + pw] = pixels
    return out


def center_crop_into(pixels: np.ndarray, out: np.ndarray, fill: int = 0) -> None:
    """Write the central out.shape[:2] window of `pixels` into `out` (`fill` borders where it is smaller)."""
    oh, ow = out.shape[:2]
    h, w = pixels.shape[:2]
    top, left = max(0, (h - oh) // 2), max(0, (w - ow) // 2)
    src = pixels[top : top + oh, left : left + ow]
    sh, sw = src.shape[:2]
    if (sh, sw) == (oh, ow):
        out[...] = src
        return
    out[...] = fill
    y, x = (oh - sh) // 2, (ow - sw) // 2
    out[y : y + sh, x : x + sw] = src


def nearest_index(n_out: int, n_in: int) -> np.ndarray:
    """Source index of each output pixel: the source pixel under the output pixel's centre,
    floor((i + 1/2) n_in / n_out), in exact integer arithmetic (ties are never decided by rounding error)."""
    return ((2 * np.arange(n_out, dtype=np.int64) + 1) * n_in) // (2 * n_out)
