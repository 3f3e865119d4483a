"""Resample stage for volumes: takes a (D, H, W) array and a target shape, gives the array at that shape.

Linear for intensities: an area average when no axis grows (no aliasing when shrinking, as the image
path's area filter), else trilinear with voxel centres aligned (align_corners=False): the filters of
torch's `interpolate` "area" and "trilinear" modes, computed in numpy (float32, one axis at a time, so
building needs no torch) and rounded back to the stored dtype. Nearest (by voxel centres, exact integer
arithmetic, the rule of 2-D masks) for label volumes, whose values must never be blended.
"""
from __future__ import annotations

import numpy as np

from ..images.resize import nearest_index

RESAMPLE_MODES = ("linear", "nearest")


def resample(vol: np.ndarray, shape: tuple[int, int, int], mode: str = "linear") -> np.ndarray:
    if tuple(vol.shape) == tuple(shape):
        return vol
    if mode == "nearest":
        d, h, w = (nearest_index(n, m) for n, m in zip(shape, vol.shape))
        return np.ascontiguousarray(vol[d][:, h][:, :, w])
    x = np.asarray(vol, np.float32)
    size = tuple(int(s) for s in shape)
    shrink = all(n <= m for n, m in zip(size, vol.shape))
    # both filters are separable: one axis at a time, the one that shrinks most first (less data after it)
    for axis in sorted(range(3), key=lambda a: size[a] / vol.shape[a]):
        x = _area(x, axis, size[axis]) if shrink else _linear(x, axis, size[axis])
    top = np.iinfo(vol.dtype).max
    return np.rint(x).clip(0, top).astype(vol.dtype)


def _along(x: np.ndarray, axis: int, weights: np.ndarray) -> np.ndarray:
    """Apply an (n, m) weight matrix along `axis` (m inputs -> n outputs), as one matrix product."""
    moved = np.moveaxis(x, axis, -1)
    return np.moveaxis(moved @ weights.T, -1, axis)


def _area(x: np.ndarray, axis: int, n: int) -> np.ndarray:
    """Adaptive average along `axis` to n samples: output i averages inputs [floor(i m / n), ceil((i + 1) m / n)),
    the windows of torch's adaptive_avg_pool (its "area" interpolation)."""
    m = x.shape[axis]
    if n == m:
        return x
    if m % n == 0:  # whole windows of m / n: a reshape and a mean (the same windows)
        return x.reshape(*x.shape[:axis], n, m // n, *x.shape[axis + 1:]).mean(axis=axis + 1)
    i = np.arange(n, dtype=np.int64)
    start, end = (i * m) // n, -((-(i + 1) * m) // n)
    j = np.arange(m)
    inside = (j >= start[:, None]) & (j < end[:, None])
    return _along(x, axis, (inside / (end - start)[:, None]).astype(np.float32))


def _linear(x: np.ndarray, axis: int, n: int) -> np.ndarray:
    """Linear interpolation along `axis` to n samples with voxel centres aligned (align_corners=False): output
    i samples input position (i + 1/2) m / n - 1/2, clamped at the edges, as torch's trilinear mode does."""
    m = x.shape[axis]
    if n == m:
        return x
    src = np.maximum((np.arange(n) + 0.5) * (m / n) - 0.5, 0.0)
    i0 = np.minimum(np.floor(src).astype(np.int64), m - 1)
    i1 = np.minimum(i0 + 1, m - 1)
    lam = src - i0
    w = np.zeros((n, m))
    np.add.at(w, (np.arange(n), i0), 1 - lam)
    np.add.at(w, (np.arange(n), i1), lam)
    return _along(x, axis, w.astype(np.float32))
