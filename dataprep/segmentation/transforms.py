"""Joint transforms: take an image (HWC) and its mask (HW), give both moved by the same geometric
operation, so they stay aligned pixel for pixel.

Randomness comes from torch's generator, which DataLoader seeds per worker (and `torch.manual_seed`
seeds in the main process), so runs repeat and workers do not draw the same crops.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

Pair = tuple[np.ndarray, np.ndarray]


def _size(size: int | Sequence[int]) -> tuple[int, int]:
    return (int(size), int(size)) if isinstance(size, int) else (int(size[0]), int(size[1]))


def _pad_to(image: np.ndarray, mask: np.ndarray, h: int, w: int, fill: int, mask_fill: int) -> Pair:
    ih, iw = image.shape[:2]
    if ih >= h and iw >= w:
        return image, mask
    ph, pw = max(h, ih), max(w, iw)
    img = np.full((ph, pw, *image.shape[2:]), fill, image.dtype)
    msk = np.full((ph, pw), mask_fill, mask.dtype)
    img[:ih, :iw], msk[:ih, :iw] = image, mask
    return img, msk


class RandomCrop:
    """A random (h, w) window of both; inputs smaller than it are padded first (image with `fill`, mask
    with `mask_fill`, which should be the pack's ignore value)."""

    def __init__(self, size: int | Sequence[int], fill: int = 0, mask_fill: int = 0):
        self.size, self.fill, self.mask_fill = _size(size), fill, mask_fill

    def __call__(self, image: np.ndarray, mask: np.ndarray) -> Pair:
        h, w = self.size
        image, mask = _pad_to(image, mask, h, w, self.fill, self.mask_fill)
        top = int(torch.randint(0, image.shape[0] - h + 1, ()))
        left = int(torch.randint(0, image.shape[1] - w + 1, ()))
        return image[top : top + h, left : left + w], mask[top : top + h, left : left + w]


class CenterCrop(RandomCrop):
    """The central (h, w) window of both (padded where smaller)."""

    def __call__(self, image: np.ndarray, mask: np.ndarray) -> Pair:
        h, w = self.size
        image, mask = _pad_to(image, mask, h, w, self.fill, self.mask_fill)
        top, left = (image.shape[0] - h) // 2, (image.shape[1] - w) // 2
        return image[top : top + h, left : left + w], mask[top : top + h, left : left + w]


class RandomHorizontalFlip:
    def __init__(self, p: float = 0.5):
        self.p = p

    def __call__(self, image: np.ndarray, mask: np.ndarray) -> Pair:
        if float(torch.rand(())) < self.p:
            return image[:, ::-1], mask[:, ::-1]
        return image, mask


class RandomVerticalFlip(RandomHorizontalFlip):
    def __call__(self, image: np.ndarray, mask: np.ndarray) -> Pair:
        if float(torch.rand(())) < self.p:
            return image[::-1], mask[::-1]
        return image, mask


class Compose:
    def __init__(self, transforms: Sequence[Callable[[np.ndarray, np.ndarray], Pair]]):
        self.transforms = list(transforms)

    def __call__(self, image: np.ndarray, mask: np.ndarray) -> Pair:
        for t in self.transforms:
            image, mask = t(image, mask)
        return image, mask
