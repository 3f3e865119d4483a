"""Volume transforms: take (D, H, W) volumes (and their label volumes), give them cropped or flipped together,
so they stay aligned voxel for voxel; and the central window the batch path uses."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch


def center_into(src: np.ndarray, out: np.ndarray) -> None:
    """The central out.shape window of src (zeros where src is smaller), on every axis."""
    out[...] = 0
    s_sl, o_sl = [], []
    for s, o in zip(src.shape, out.shape):
        a = max(0, (s - o) // 2)
        n = min(s, o)
        b = (o - n) // 2
        s_sl.append(slice(a, a + n))
        o_sl.append(slice(b, b + n))
    out[tuple(o_sl)] = src[tuple(s_sl)]


class RandomCrop3d:
    """A random (d, h, w) window of a volume (or of several aligned ones: `t(vol, labels)`), zero-padded
    where smaller."""

    def __init__(self, size: Sequence[int]):
        self.size = tuple(int(s) for s in size)

    def __call__(self, *vols: np.ndarray):
        shape = vols[0].shape
        starts = [int(torch.randint(0, max(s - c, 0) + 1, ())) for s, c in zip(shape, self.size)]
        out = []
        for v in vols:
            o = np.zeros(self.size, v.dtype)
            src = v[tuple(slice(a, a + c) for a, c in zip(starts, self.size))]
            o[tuple(slice(0, n) for n in src.shape)] = src
            out.append(o)
        return out[0] if len(out) == 1 else tuple(out)


class RandomFlip3d:
    """Flip along each of `axes` with probability p (the same flips for every volume passed together)."""

    def __init__(self, axes: Sequence[int] = (0, 1, 2), p: float = 0.5):
        self.axes, self.p = tuple(axes), p

    def __call__(self, *vols: np.ndarray):
        flip = tuple(a for a in self.axes if float(torch.rand(())) < self.p)
        out = [np.flip(v, flip) if flip else v for v in vols]
        return out[0] if len(out) == 1 else tuple(out)
