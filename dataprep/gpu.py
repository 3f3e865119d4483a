"""Random-resized crops of a whole batch on the device: takes a uint8 batch of one fixed shape as the
Loader gathered it (at memory speed, no decoding) and its sample indices, gives every sample cropped
with its own box, resized, flipped and normalised, in one batched call.

The boxes are those of images/crops.RandomResizedCrop for the same (seed, epoch, index): the same
crops as the CPU path, on any device. Each output pixel averages s x s bilinear samples of its
footprint (s = the box-to-output ratio, rounded up, at most 4), so shrinking is antialiased as an area
filter would be; `torch.nn.functional.grid_sample` does the sampling for the whole batch at once.

This is the work dataprep does on the device; moving batches there and normalising them is
serve/transfer.py's (`Normalize`, `to_device`).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .images.crops import RandomResizedCrop as CropPlan
from .images.crops import flips


class RandomResizedCrop(torch.nn.Module):
    """`crop(images, indices, epoch)`: images uint8 (N, C, H, W) (any memory format, any device), indices
    the batch's sample indices (`Loader(..., indices=True)` yields them); returns (N, C, size, size) in
    `dtype`, channels-last, normalised with (mean, std) in the input's units when given, else scaled to
    [0, 1] from the input's range (0-255 for uint8, 0-65535 for uint16).
    """

    def __init__(self, size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), flip: bool = False, seed: int = 0,
                 mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
                 dtype: torch.dtype = torch.float32, max_supersample: int = 4, chunk: int = 64):
        super().__init__()
        self.plan = CropPlan(size, scale, ratio)
        self.flip, self.seed, self.dtype = flip, int(seed), dtype
        self.max_supersample, self.chunk = max(1, int(max_supersample)), max(1, int(chunk))
        self.normalize = mean is not None or std is not None
        mean = torch.tensor(mean if mean is not None else [0.0], dtype=torch.float32).view(1, -1, 1, 1)
        std = torch.tensor(std if std is not None else [1.0], dtype=torch.float32).view(1, -1, 1, 1)
        self.register_buffer("scale_", 1.0 / std, persistent=False)
        self.register_buffer("shift_", -mean / std, persistent=False)

    def boxes(self, n: int, h: int, w: int, indices, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        idx = np.asarray(indices.cpu() if isinstance(indices, torch.Tensor) else indices, np.int64).reshape(-1)
        if len(idx) != n:
            raise ValueError(f"{n} images but {len(idx)} indices")
        key = (self.seed, int(epoch))
        flipped = flips(key, idx) if self.flip else np.zeros(n, bool)
        return self.plan.boxes(np.full(n, h), np.full(n, w), key, idx), flipped

    def forward(self, images: torch.Tensor, indices, epoch: int = 0) -> torch.Tensor:
        if images.dim() != 4:
            raise ValueError(f"a batch (N, C, H, W), not {tuple(images.shape)}")
        n, c, h, w = images.shape
        boxes, flipped = self.boxes(n, h, w, indices, epoch)
        oh, ow = self.plan.size
        dev = images.device
        t, lft, bh, bw = (torch.from_numpy(boxes[:, k].astype(np.float64)) for k in range(4))
        # output pixel centres (align_corners=False) map exactly into each box; a flip mirrors about its centre
        sx = bw / w * torch.from_numpy(np.where(flipped, -1.0, 1.0))
        theta = torch.zeros(n, 2, 3, dtype=torch.float64)
        theta[:, 0, 0], theta[:, 0, 2] = sx, (2 * lft + bw) / w - 1
        theta[:, 1, 1], theta[:, 1, 2] = bh / h, (2 * t + bh) / h - 1
        s = int(min(self.max_supersample, max(1, math.ceil(float(max((bh / oh).max(), (bw / ow).max()))))))
        work = torch.float16 if dev.type == "cuda" and self.dtype == torch.float16 else torch.float32
        out = torch.empty((n, c, oh, ow), dtype=self.dtype, device=dev).contiguous(memory_format=torch.channels_last)
        scale, shift = self.scale_.to(dev, work), self.shift_.to(dev, work)
        if not self.normalize:  # to [0, 1] from the input's own range (uint8 or uint16 packs)
            scale = scale / (65535.0 if images.dtype == torch.uint16 else 255.0)
        elif scale.shape[1] not in (1, c):
            raise ValueError(f"mean/std have {scale.shape[1]} values for a batch of {c} channels")
        for a in range(0, n, self.chunk):
            b = min(n, a + self.chunk)
            x = images[a:b].to(work)
            grid = F.affine_grid(theta[a:b].to(dev, work), [b - a, c, oh * s, ow * s], align_corners=False)
            y = F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
            if s > 1:
                y = F.avg_pool2d(y, s)
            out[a:b] = (y * scale + shift).to(self.dtype)
        return out
