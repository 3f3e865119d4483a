"""Crop plans: take a stored image's size and the sample's key (seed, epoch, index), give the box to cut
and the output it is resized to; the Loader's workers apply them per sample, straight into the batch.

`RandomResizedCrop` is torchvision's algorithm (`RandomResizedCrop.get_params`): an area fraction
uniform in `scale`, a log aspect ratio uniform in log(`ratio`), 10 attempts, then the center crop
with the ratio clamped; it draws from serve/draws.py instead of a stateful generator, so a sample's
box depends on (seed, epoch, index) only: any worker count, and a resumed run, gives the same boxes.
`CenterCrop` is the evaluation transform: the shorter side resized to `resize`, then the center.
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from ..errors import DataprepError
from ..serve import draws

_ATTEMPTS = 10
_INTERPOLATIONS = ("bilinear", "nearest", "bicubic")


def _size(size) -> tuple[int, int]:
    hw = (int(size), int(size)) if np.isscalar(size) else tuple(int(s) for s in size)
    if len(hw) != 2 or min(hw) < 1:
        raise DataprepError(f"a crop size is one int or (height, width) of at least 1, not {size!r}")
    return hw


def _interpolation(name: str) -> str:
    if name not in _INTERPOLATIONS:
        raise DataprepError(f"interpolation must be one of {list(_INTERPOLATIONS)}, not {name!r}")
    return name


class RandomResizedCrop:
    """Cut a random box (area fraction in `scale`, aspect ratio in `ratio`) and resize it to `size`.

    "bilinear" is torchvision's antialiased bilinear (PIL's triangle filter, whose support grows with the
    shrink), approximated in fewer operations than INTER_AREA's (see `_resize`); "bicubic" enlarges bicubic
    and shrinks by area averaging; "nearest" is nearest.
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
        """The same plan with another output size (what a resolution schedule changes each epoch)."""
        return RandomResizedCrop(size, self.scale, self.ratio, self.interpolation)

    def __repr__(self) -> str:
        return f"RandomResizedCrop({self.size}, scale={self.scale}, ratio={self.ratio}, interpolation={self.interpolation!r})"

    def boxes(self, heights, widths, key: tuple[int, ...], idx, which: np.ndarray | None = None) -> np.ndarray:
        """(N, 4) int64 boxes (top, left, height, width) for images of the given sizes, drawn from
        (key, index) as torchvision's get_params draws them: up to 10 tries of an area and an aspect, the
        first that fits taken, else the whole image with its ratio clamped. Every try of every sample is
        drawn in one pass (four streams per try, the boxes of trying one after another): try by try cost
        0.2-0.4 ms a batch of up to 256, whatever its size (numpy's overhead per call), one pass 0.06-0.07 ms
        up to 64. With `which`, `key` is a list of keys and sample k's is key[which[k]] (a Mixture's members
        drawn in one pass)."""
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
    """The evaluation transform: resize the shorter side to `resize` [default: size / 0.875, the standard
    256 for 224], then cut the central `size` window."""

    def __init__(self, size, resize: int | None = None, interpolation: str = "bilinear"):
        self.size = _size(size)
        self.resize = int(resize) if resize is not None else int(round(max(self.size) / 0.875))
        if self.resize < max(self.size):
            raise DataprepError(f"CenterCrop: resize ({self.resize}) must be at least the crop size {self.size}")
        self.interpolation = _interpolation(interpolation)

    def resized(self, size: int) -> "CenterCrop":
        """The same plan at another size, its resize scaled alike (256/224 stays 256/224)."""
        return CenterCrop(size, int(round(size * self.resize / max(self.size))), self.interpolation)

    def __repr__(self) -> str:
        return f"CenterCrop({self.size}, resize={self.resize})"

    def boxes(self, heights, widths, key=None, idx=None, which=None) -> np.ndarray:
        """The whole image: CenterCrop resizes first, then crops (see `apply`)."""
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
    """Mirror one (H, W, C) batch row in place (OpenCV's flip: 30x a numpy reversed-stride copy)."""
    import cv2

    if row.shape[-1] > 4 or not row.flags.c_contiguous:  # beyond what OpenCV takes as channels
        row[...] = row[:, ::-1].copy()
        return
    cv2.flip(row, 1, dst=row)


# Resampling, per axis (r: that axis's input/output ratio). Enlarging: bilinear (or bicubic). A "bilinear"
# shrink: up to 1.25 plain bilinear (PIL's antialiased filter, which torchvision's names, is barely wider
# there: within 40 dB of it on the corpus, a few dB further than INTER_AREA); up to 2.5, bilinear onto twice
# the output then 2x2 means (a supersampled triangle: as close to PIL's filter as INTER_AREA, for about half
# its cost; both axes, whichever needs it); beyond, area averaging of that axis first. Other shrinks
# ("bicubic", "area"): area averaging.
# An axis shrunk while the other is enlarged is shrunk alone first: OpenCV's INTER_AREA is an area average
# only when neither axis grows. tests/test_crops.py holds the closeness and the geometry, README the cost.
_PLAIN_UP_TO, _SUPERSAMPLED_UP_TO = 1.25, 2.5


def _resize(src: np.ndarray, oh: int, ow: int, interpolation: str, dst: np.ndarray | None) -> np.ndarray:
    import cv2

    h, w = src.shape[:2]
    ry, rx = h / oh, w / ow
    grow = cv2.INTER_CUBIC if interpolation == "bicubic" else cv2.INTER_LINEAR
    if interpolation == "nearest":
        return cv2.resize(src, (ow, oh), dst=dst, interpolation=cv2.INTER_NEAREST)
    if ry <= 1 and rx <= 1:
        return cv2.resize(src, (ow, oh), dst=dst, interpolation=grow)
    if interpolation != "bilinear" or (h % oh == 0 and w % ow == 0):  # area averaging (exact block means if whole)
        if ry >= 1 and rx >= 1:
            return cv2.resize(src, (ow, oh), dst=dst, interpolation=cv2.INTER_AREA)
        src = cv2.resize(src, (ow, h) if rx > 1 else (w, oh), interpolation=cv2.INTER_AREA)  # the shrunk axis alone
        return cv2.resize(src, (ow, oh), dst=dst, interpolation=grow)
    if ry > _SUPERSAMPLED_UP_TO or rx > _SUPERSAMPLED_UP_TO:  # area-average the far-shrunk axes first, alone
        src = cv2.resize(src, (ow if rx > _SUPERSAMPLED_UP_TO else w, oh if ry > _SUPERSAMPLED_UP_TO else h),
                         interpolation=cv2.INTER_AREA)
        h, w = src.shape[:2]
        ry, rx = h / oh, w / ow
    if ry <= _PLAIN_UP_TO and rx <= _PLAIN_UP_TO:
        return cv2.resize(src, (ow, oh), dst=dst, interpolation=cv2.INTER_LINEAR)
    # both axes twice over, even one shrunk less (a slight blur there, >= 40 dB from PIL): OpenCV's 2x2 means
    # are vectorised, its 2x1 means take the generic area path at 8x the cost
    mid = cv2.resize(src, (2 * ow, 2 * oh), interpolation=cv2.INTER_LINEAR)
    return cv2.resize(mid, (ow, oh), dst=dst, interpolation=cv2.INTER_AREA)


def _window(pixels: np.ndarray) -> np.ndarray:
    """`pixels` as OpenCV takes it: a window of whole rows is passed as is, anything else copied."""
    item = pixels.itemsize
    rows_ok = pixels.strides[1] == item * (pixels.shape[2] if pixels.ndim == 3 else 1) and pixels.strides[-1] == item
    return pixels if rows_ok and pixels.strides[0] > 0 else np.ascontiguousarray(pixels)


def resize_to(pixels: np.ndarray, out_hw: tuple[int, int], interpolation: str) -> np.ndarray:
    """`pixels` (H, W[, C]) resized to out_hw (antialiased when shrinking, see `_resize`); channels kept.
    `interpolation="area"` shrinks by area averaging at any ratio."""
    oh, ow = out_hw
    if pixels.shape[:2] == (oh, ow):
        return pixels
    out = _resize(_window(pixels), oh, ow, interpolation, None)
    return out.reshape(oh, ow, *pixels.shape[2:])


def resize_into(pixels: np.ndarray, out: np.ndarray, interpolation: str) -> None:
    """`pixels` (H, W[, C]) resized straight into `out` (a batch row), no intermediate copy."""
    oh, ow = out.shape[:2]
    if pixels.shape[:2] == (oh, ow):
        out[...] = pixels
        return
    dst = out if out.flags.c_contiguous else None
    res = _resize(_window(pixels), oh, ow, interpolation, dst)
    if res is not dst:  # OpenCV allocated its own (a layout it does not write in place); channels broadcast
        out[...] = res.reshape(oh, ow, -1) if out.ndim == 3 else res


def reduction(box_h: float, box_w: float, out_h: int, out_w: int) -> int:
    """The largest JPEG DCT scale-down (8, 4, 2, else 1) that keeps the box at least the output size."""
    for f in (8, 4, 2):
        if box_h / f >= out_h and box_w / f >= out_w:
            return f
    return 1


def warp_into(pixels: np.ndarray, box, out: np.ndarray) -> None:
    """Resample the float box (top, left, height, width, in `pixels`' own pixel units) into `out`: each
    output pixel centre maps exactly into the box (no rounding of the box to the pixel grid). Plain
    bilinear: callers (reduced decodes, smaller stored copies) keep the residual shrink under 2x, where
    it aliases a little past 1.25x (those paths are held to 32 dB, not the full decode's 40); shrinks of 2x
    or more are area-averaged first from the box rounded to whole pixels."""
    import cv2

    oh, ow = out.shape[:2]
    t, l, bh, bw = (float(v) for v in box)
    sy, sx = bh / oh, bw / ow
    if sy >= 2 or sx >= 2:
        # area-shrink the whole pixels around the box to about 1.5x the output first (resize maps the window
        # onto the intermediate linearly, so the box's place in it is exact), then warp from there
        h, w = pixels.shape[:2]
        y0, x0 = max(0, int(np.floor(t))), max(0, int(np.floor(l)))
        y1, x1 = min(h, int(np.ceil(t + bh))), min(w, int(np.ceil(l + bw)))
        ih = max(1, int(round((y1 - y0) * 1.5 / sy))) if sy >= 2 else y1 - y0
        iw = max(1, int(round((x1 - x0) * 1.5 / sx))) if sx >= 2 else x1 - x0
        small = resize_to(pixels[y0:y1, x0:x1], (ih, iw), "area")
        ky, kx = ih / (y1 - y0), iw / (x1 - x0)
        warp_into(small, ((t - y0) * ky, (l - x0) * kx, bh * ky, bw * kx), out)
        return
    m = np.array([[sx, 0.0, l + 0.5 * sx - 0.5], [0.0, sy, t + 0.5 * sy - 0.5]])
    src = pixels if pixels.flags.c_contiguous else np.ascontiguousarray(pixels)
    res = cv2.warpAffine(src, m, (ow, oh), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP, borderMode=cv2.BORDER_REPLICATE)
    out[...] = res.reshape(out.shape)


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
