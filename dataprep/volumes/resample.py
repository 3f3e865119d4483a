"""Resample stage for volumes: takes a (D, H, W) array and a target shape, gives the array at that shape.

Linear for intensities: an area average when no axis grows (no aliasing when shrinking, as the image
path's area filter), else trilinear with voxel centres aligned (align_corners=False); computed in
float32 through torch and rounded back to the stored dtype. Nearest (by voxel centres, exact integer
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
    import torch
    import torch.nn.functional as F

    x = torch.from_numpy(np.ascontiguousarray(vol).astype(np.float32))[None, None]
    size = tuple(int(s) for s in shape)
    if all(n <= m for n, m in zip(size, vol.shape)):
        y = F.interpolate(x, size=size, mode="area")[0, 0]
    else:
        y = F.interpolate(x, size=size, mode="trilinear", align_corners=False)[0, 0]
    top = np.iinfo(vol.dtype).max
    return np.rint(y.numpy()).clip(0, top).astype(vol.dtype)
