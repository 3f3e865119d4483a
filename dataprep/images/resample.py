"""Resampling: takes pixels (a window cut from a stored image, or the whole image) and an output size, gives
them resized into the output, antialiased when shrinking as torchvision's bilinear is; a float box resampled
exactly (`warp_into`), and the JPEG DCT scale-down a crop can be decoded at (`reduction`). The crop plans
(images/crops.py) say which box and output; this module says how its pixels are made.
"""
from __future__ import annotations

import threading

import numpy as np

INTERPOLATIONS = ("bilinear", "nearest", "bicubic")  # what a crop plan may ask for; resize_to also takes "area"

# Resampling, per axis (r: that axis's input/output ratio). Enlarging: bilinear (or bicubic). A "bilinear"
# shrink: up to 1.25 plain bilinear (PIL's antialiased filter, which torchvision's names, is barely wider
# there: within 40 dB of it on the corpus, a few dB further than INTER_AREA); up to 2.5, bilinear onto twice
# the output then 2x2 means (a supersampled triangle: as close to PIL's filter as INTER_AREA, for about half
# its cost; both axes, whichever needs it); beyond, area averaging of that axis first. Other shrinks
# ("bicubic", "area"): area averaging.
# An axis shrunk while the other is enlarged is shrunk alone first: OpenCV's INTER_AREA is an area average
# only when neither axis grows. tests/test_crops.py holds the closeness and the geometry, docs/benchmarks.md (Crops) the cost.
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
    # are vectorised, its 2x1 means take the generic (much slower) area path
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


def bilinear_window_into(pixels: np.ndarray, out: np.ndarray, interpolation: str) -> bool:
    """`pixels` (a window: a crop's integer box) resampled into `out` as `resize_into` does for a bilinear
    crop shrunk at most 2.5x (or enlarged), with warpAffine in place of resize's bilinear step: plain
    bilinear up to 1.25x; beyond, bilinear onto twice the output, then 2x2 means (INTER_AREA from exactly
    2x), into a buffer reused by the thread. False, having done nothing, for any other ratio or
    interpolation (the caller resizes). warpAffine weighs taps in 1/32 steps where resize does in 1/2048:
    within 49 dB of resize_into's pixels on the corpus for ~30 % (plain) to ~45 % (twice over) less time
    (docs/benchmarks.md, Crops). The training crops of decode="fast" take it: they differ from the
    accurate path's by more already (the fast IDCT). The window's edges are replicated, as resize does,
    so the pixels do not depend on what lies around the window."""
    import cv2

    oh, ow = out.shape[:2]
    h, w = pixels.shape[:2]
    sy, sx = h / oh, w / ow
    if interpolation != "bilinear" or sy > _SUPERSAMPLED_UP_TO or sx > _SUPERSAMPLED_UP_TO or not out.flags.c_contiguous:
        return False
    dst = out if out.ndim == pixels.ndim else out.reshape((oh, ow) if pixels.ndim == 2 else (oh, ow, -1))
    if (sy > 1 or sx > 1) and h % oh == 0 and w % ow == 0:  # whole blocks: exact means, as resize_into takes them
        res = cv2.resize(_window(pixels), (ow, oh), dst=dst, interpolation=cv2.INTER_AREA)
    elif sy <= _PLAIN_UP_TO and sx <= _PLAIN_UP_TO:
        res = _warp(pixels, dst, oh, ow)
    else:
        mid = _scratch((2 * oh, 2 * ow) + dst.shape[2:], pixels.dtype)
        mid = _warp(pixels, mid, 2 * oh, 2 * ow)  # (what OpenCV wrote: `mid` itself, unless a 1-channel layout)
        res = cv2.resize(mid, (ow, oh), dst=dst, interpolation=cv2.INTER_AREA)
    if res is not dst:  # OpenCV wrote elsewhere (a layout it does not fill in place)
        out[...] = res.reshape(out.shape)
    return True


def _warp(pixels: np.ndarray, dst: np.ndarray, oh: int, ow: int) -> np.ndarray:
    """Bilinear, output pixel centres mapped onto the window's (resize's geometry), into `dst`."""
    import cv2

    sy, sx = pixels.shape[0] / oh, pixels.shape[1] / ow
    m = np.array([[sx, 0.0, 0.5 * sx - 0.5], [0.0, sy, 0.5 * sy - 0.5]])
    return cv2.warpAffine(_window(pixels), m, (ow, oh), dst=dst, flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                          borderMode=cv2.BORDER_REPLICATE)


_SCRATCH = threading.local()  # per thread: a thread-backed fill must not share one


def _scratch(shape: tuple[int, ...], dtype) -> np.ndarray:
    """A buffer of `shape` and `dtype`, the same one each call from this thread while those hold."""
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.shape != shape or buf.dtype != dtype:
        buf = _SCRATCH.buf = np.empty(shape, dtype)
    return buf


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
