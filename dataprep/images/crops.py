"""Crop plans: take a stored image's size and the sample's key (seed, epoch, index), give the box to cut
and the output it is resized to; the Loader's workers apply them per sample, straight into the batch.

`RandomResizedCrop` is torchvision's algorithm (`RandomResizedCrop.get_params`): an area fraction
uniform in `scale`, a log aspect ratio uniform in log(`ratio`), 10 attempts, then the center crop
with the ratio clamped; it draws from serve/draws.py instead of a stateful generator, so a sample's
box depends on (seed, epoch, index) only: any worker count, and a resumed run, gives the same boxes.
`CenterCrop` is the evaluation transform: the shorter side resized to `resize`, then the center.
How a box's pixels are resized into the output is images/resample.py's.
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from ..errors import DataprepError
from ..serve import draws
from .resample import INTERPOLATIONS, resize_into, resize_to

_ATTEMPTS = 10


def _size(size) -> tuple[int, int]:
    hw = (int(size), int(size)) if np.isscalar(size) else tuple(int(s) for s in size)
    if len(hw) != 2 or min(hw) < 1:
        raise DataprepError(f"a crop size is one int or (height, width) of at least 1, not {size!r}")
    return hw


def _interpolation(name: str) -> str:
    if name not in INTERPOLATIONS:
        raise DataprepError(f"interpolation must be one of {list(INTERPOLATIONS)}, not {name!r}")
    return name


class RandomResizedCrop:
    """Cut a random box and resize it to `size`.

    "bilinear" is torchvision's antialiased bilinear (PIL's triangle filter, whose support grows with the
    shrink), approximated in fewer operations than INTER_AREA's (see images/resample.py). "bicubic" enlarges
    bicubic and shrinks by area averaging. "nearest" is nearest.

    Args:
        size: The output side, or (height, width).
        scale: The box's area as a fraction of the image's: (low, high).
        ratio: The box's aspect ratio (width / height): (low, high).
        interpolation: "bilinear", "bicubic" or "nearest".
    """

    def __init__(self, size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), interpolation: str = "bilinear"):
        self.size = _size(size)
        scale, ratio = tuple(float(s) for s in scale), tuple(float(r) for r in ratio)
        if len(scale) != 2 or not 0 < scale[0] <= scale[1] <= 1:
            raise DataprepError(f"scale is (low, high) with 0 < low <= high <= 1, not {scale}")
        if len(ratio) != 2 or not 0 < ratio[0] <= ratio[1] or not all(map(math.isfinite, ratio)):
            raise DataprepError(f"ratio is (low, high) with 0 < low <= high, not {ratio}")
        self.scale, self.ratio, self.interpolation = scale, ratio, _interpolation(interpolation)

    def resized(self, size: int) -> "RandomResizedCrop":
        """The same plan with another output size (what a resolution schedule changes each epoch).

        Args:
            size: The output side.

        Returns:
            A new plan.
        """
        return RandomResizedCrop(size, self.scale, self.ratio, self.interpolation)

    def __repr__(self) -> str:
        return f"RandomResizedCrop({self.size}, scale={self.scale}, ratio={self.ratio}, interpolation={self.interpolation!r})"

    def boxes(self, heights, widths, key: tuple[int, ...], idx, which: np.ndarray | None = None) -> np.ndarray:
        """The crop boxes of images of the given sizes, drawn from (key, index).

        They are drawn as torchvision's get_params draws them: up to 10 tries of an area and an aspect, the
        first that fits taken, else the whole image with its ratio clamped. Every try of every sample is
        drawn in one pass (four streams per try, the boxes of trying one after another). Numpy's cost per
        call, not per box, is what a batch of draws pays (figures: docs/benchmarks.md, "Costs the code is
        shaped by").

        Args:
            heights: The images' heights.
            widths: The images' widths.
            key: What the draws are keyed by, such as (seed, epoch); with `which`, a list of keys.
            idx: The samples' indices.
            which: Sample k's key is key[which[k]] (a Mixture's members, drawn in one pass); None: one key.

        Returns:
            (N, 4) int64 boxes: top, left, height, width.
        """
        hh, ww = np.asarray(heights, np.int64), np.asarray(widths, np.int64)
        idx = np.asarray(idx, np.int64)
        n = len(idx)
        out = np.zeros((n, 4), np.int64)
        if not n:
            return out
        area = (hh * ww).astype(np.float64)
        lo, hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        # the 4 streams of every (try, sample) in one pass: area, aspect, then top and left of the try taken
        if which is None:
            keys = _try_keys(tuple(int(k) for k in key))[:, :, None]
        else:  # each sample its own key's streams
            keys = np.stack([_try_keys(tuple(int(w) for w in k)) for k in key], -1)[:, :, np.asarray(which)]
        u = draws.to_uniform(draws.hashed_bits(keys, idx))
        target = area * (self.scale[0] + u[0] * (self.scale[1] - self.scale[0]))
        aspect = np.exp(lo + u[1] * (hi - lo))
        w = np.round(np.sqrt(target * aspect)).astype(np.int64)
        h = np.round(np.sqrt(target / aspect)).astype(np.int64)
        fits = (w > 0) & (w <= ww) & (h > 0) & (h <= hh)
        first = fits.argmax(0)  # the first try that fits
        k = np.arange(n)
        done = fits[first, k]
        bh, bw = h[first, k], w[first, k]
        room = np.stack([hh - bh, ww - bw])  # the top and left a box may take (where it fits)
        top_left = np.minimum((u[2:, first, k] * (room + 1)).astype(np.int64), room)  # draws.to_integers' rule
        out[done] = np.stack([top_left[0], top_left[1], bh, bw], 1)[done]
        if done.all():
            return out
        rest = ~done  # the fallback: the whole image, its ratio clamped to the range
        h, w = hh[rest].copy(), ww[rest].copy()
        in_ratio = w / np.maximum(h, 1)
        narrow, wide = in_ratio < self.ratio[0], in_ratio > self.ratio[1]
        h[narrow] = np.round(w[narrow] / self.ratio[0]).astype(np.int64)
        w[wide] = np.round(h[wide] * self.ratio[1]).astype(np.int64)
        out[rest] = np.stack([(hh[rest] - h) // 2, (ww[rest] - w) // 2, h, w], 1)
        return out


@lru_cache(maxsize=256)
def _try_keys(key: tuple[int, ...]) -> np.ndarray:
    """(4, tries) hashes of RandomResizedCrop's streams under `key`: stream 4 a + j at [j, a]."""
    return draws.key_hashes((draws.CROP, *key), [4 * a + j for j in range(4) for a in range(_ATTEMPTS)]).reshape(4, _ATTEMPTS)


class CenterCrop:
    """The evaluation transform: resize the shorter side, then cut the central window.

    Args:
        size: The window's side, or (height, width).
        resize: The shorter side after resizing; None is size / 0.875 (the standard 256 for 224).
        interpolation: "bilinear", "bicubic" or "nearest", as RandomResizedCrop's.
    """

    def __init__(self, size, resize: int | None = None, interpolation: str = "bilinear"):
        self.size = _size(size)
        self.resize = int(resize) if resize is not None else int(round(max(self.size) / 0.875))
        if self.resize < max(self.size):
            raise DataprepError(f"CenterCrop: resize ({self.resize}) must be at least the crop size {self.size}")
        self.interpolation = _interpolation(interpolation)

    def resized(self, size: int) -> "CenterCrop":
        """The same plan at another size, its resize scaled alike (256/224 stays 256/224).

        Args:
            size: The window's side.

        Returns:
            A new plan.
        """
        return CenterCrop(size, int(round(size * self.resize / max(self.size))), self.interpolation)

    def __repr__(self) -> str:
        return f"CenterCrop({self.size}, resize={self.resize})"

    def __call__(self, pixels: np.ndarray) -> np.ndarray:
        """The crop of one image's H x W[ x C] pixels, for a dataset's `transform=` (which applies it to the
        stored pixels, before they become a tensor): every image one shape, so the stock DataLoader can stack
        a batch. With a ResolutionBatchSampler the dataset resizes the plan to each batch's size (`resized`)."""
        out = np.empty((*self.size, *pixels.shape[2:]), pixels.dtype)
        apply(self, np.ascontiguousarray(pixels), None, out)
        return out

    def boxes(self, heights, widths, key=None, idx=None, which=None) -> np.ndarray:
        """The whole image: CenterCrop resizes first, then crops (see `apply`).

        Args:
            heights: The images' heights.
            widths: The images' widths.
            key: Unused: nothing is drawn.
            idx: Unused.
            which: Unused.

        Returns:
            (N, 4) int64 boxes: 0, 0, height, width.
        """
        hh, ww = np.asarray(heights, np.int64), np.asarray(widths, np.int64)
        return np.stack([np.zeros_like(hh), np.zeros_like(hh), hh, ww], 1)


def flips(key: tuple[int, ...], idx, which: np.ndarray | None = None) -> np.ndarray:
    """Which samples are flipped horizontally (p = 0.5), from (key, index); with `which`, `key` is a list
    of keys and sample k's is key[which[k]]."""
    if which is None:
        return draws.bits((draws.FLIP, *key), idx) >> np.uint64(63) == 1
    hashes = np.array([draws.key_hash((draws.FLIP, *(int(w) for w in k))) for k in key], np.uint64)
    return draws.hashed_bits(hashes[np.asarray(which)], idx) >> np.uint64(63) == 1


def flip_into(row: np.ndarray) -> None:
    """Mirror one (H, W, C) batch row in place (OpenCV's flip: far cheaper than a numpy reversed-stride copy)."""
    import cv2

    if row.shape[-1] > 4 or not row.flags.c_contiguous:  # beyond what OpenCV takes as channels
        row[...] = row[:, ::-1].copy()
        return
    cv2.flip(row, 1, dst=row)


def apply(plan, pixels: np.ndarray, box, out: np.ndarray, full_hw: tuple[int, int] | None = None) -> None:
    """Cut `box` (top, left, height, width) from `pixels` (H, W, C) and write it, resized, into `out`.
    A CenterCrop's geometry comes from `full_hw`, the image's full size, when `pixels` is a reduced
    decode or a smaller stored copy of it (so the center is where the full image puts it)."""
    oh, ow = out.shape[:2]
    if isinstance(plan, CenterCrop):
        h, w = full_hw or pixels.shape[:2]  # torchvision's Resize(int): the shorter side to `resize`, the other truncated
        rh, rw = (plan.resize, int(plan.resize * w / h)) if h <= w else (int(plan.resize * h / w), plan.resize)
        small = resize_to(pixels, (rh, rw), plan.interpolation)
        top, left = int(round((rh - oh) / 2.0)), int(round((rw - ow) / 2.0))
        out[...] = small[top : top + oh, left : left + ow]
        return
    t, l, bh, bw = (int(v) for v in box)
    resize_into(pixels[t : t + bh, l : l + bw], out, plan.interpolation)
