"""Geometry drawn once, applied to every target: takes a request's crop and flip, the sample's key (seed,
epoch, index) and its stored size, gives `Draws` (each sample's crop box, flip and the output size) and
moves pixels, boxes and masks by them.

torchvision v2 draws a transform's parameters once (`make_params`) and applies them to each input; here
the draw is keyed by (seed, epoch, index) instead of a generator (images/crops.py), and the apply step
has one home per target: pixels are cut by the image kind's paths (images/batches.py: region decode and
reduced scales take the drawn box, never draw again) and flipped by `flip_into`; boxes go through one
affine map per sample (`box_maps`, `boxes_through`); masks take the same box, resized nearest by pixel
centres (`mask_into`), and the same flip. Pure numpy (OpenCV for the flip).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from . import crops
from .crops import CenterCrop
from .resize import center_crop_into, nearest_index


def plan_of(crop: Any) -> Any:
    """The crop plan a request's crop is (RandomResizedCrop, CenterCrop), or None for (H, W) and no crop."""
    return None if crop is None or isinstance(crop, (tuple, list)) else crop


@dataclass(frozen=True)
class Draws:
    """One part of a batch's geometry, drawn once for every target.

    crop: the request's crop (a plan, (H, W) or None). out_hw: the output's (H, W). heights, widths: the
    samples' stored sizes (None where no target needs them). boxes: (N, 4) int64 (top, left, height, width)
    of a crop plan in stored pixels, else None. flipped: (N,) bool, or None without flip.
    """

    crop: Any
    out_hw: tuple[int, int]
    heights: np.ndarray | None
    widths: np.ndarray | None
    boxes: np.ndarray | None
    flipped: np.ndarray | None

    def part(self, start: int, stop: int) -> "Draws":
        """Samples start..stop of these draws (one dataset's share of a mixed batch)."""
        cut = lambda a: None if a is None else a[start:stop]  # noqa: E731
        return replace(self, heights=cut(self.heights), widths=cut(self.widths), boxes=cut(self.boxes), flipped=cut(self.flipped))


def draw(crop: Any, flip: bool, key, index, out_hw: tuple[int, int], heights=None, widths=None,
         which: np.ndarray | None = None) -> Draws:
    """Every sample's crop box and flip, in one pass each (numpy's cost is per call, not per sample).

    Args:
        crop: the request's crop: a crop plan draws boxes (it needs `heights` and `widths`); (H, W) or None none.
        flip: draw a horizontal flip per sample (p = 0.5).
        key: (seed, epoch), or a list of keys with `which` (sample k's is key[which[k]]: a Mixture's members).
        index: what each sample's draws are keyed by (its index in the split).
        out_hw: the output's (H, W).
        heights, widths: the stored sizes.

    Returns:
        The Draws, the same for any worker count and after a resume.
    """
    plan = plan_of(crop)
    hh = None if heights is None else np.asarray(heights, np.int64)
    ww = None if widths is None else np.asarray(widths, np.int64)
    boxes = None
    if plan is not None:
        boxes = plan.boxes(hh, ww, key, index) if which is None else plan.boxes(hh, ww, key, index, which)
    flipped = crops.flips(key, index, which) if flip else None
    return Draws(crop, (int(out_hw[0]), int(out_hw[1])), hh, ww, boxes, flipped)


# -- pixels ---------------------------------------------------------------------------------------------------------

def flip_into(drawn: Draws, batch: np.ndarray, rows) -> None:
    """Mirror the flipped samples' batch rows (pixels (H, W, C) or masks (H, W)) in place; `rows[k]` is sample k's."""
    if drawn.flipped is None:
        return
    for k in np.flatnonzero(drawn.flipped):
        crops.flip_into(batch[rows[k]])


# -- boxes (x1, y1, x2, y2 in continuous pixel coordinates: a pixel k covers [k, k + 1)) ---------------------------

def affine(boxes: np.ndarray, ax, bx, ay, by) -> np.ndarray:
    """Boxes (K, 4) moved by X' = X * ax + bx, Y' = Y * ay + by; the four may be scalars or one value per box."""
    out = np.empty(boxes.shape, np.float64)
    out[:, 0] = boxes[:, 0] * ax + bx
    out[:, 2] = boxes[:, 2] * ax + bx
    out[:, 1] = boxes[:, 1] * ay + by
    out[:, 3] = boxes[:, 3] * ay + by
    return out


def flip_boxes(boxes: np.ndarray, width, which: np.ndarray | None = None) -> np.ndarray:
    """Boxes mirrored in an image `width` wide (x -> width - x, so x1 and x2 swap roles); with `which` (one
    bool per box), only those rows. In place; returns `boxes`."""
    rows = slice(None) if which is None else which
    w = width if np.isscalar(width) else np.asarray(width)[rows]
    x1 = boxes[rows, 0].copy()
    boxes[rows, 0] = w - boxes[rows, 2]
    boxes[rows, 2] = w - x1
    return boxes


def crop_maps(crop, boxes_drawn: np.ndarray | None, heights, widths, out_hw: tuple[int, int]) -> tuple[np.ndarray, ...]:
    """(ax, bx, ay, by), one value per sample, of what the Loader does to the stored pixels: a crop plan's box
    (top, left, height, width) resized to the output (RandomResizedCrop), CenterCrop's resize and central cut,
    or, for crop=(H, W) or no crop, the central window padded where smaller (resize.center_crop_into).

    OpenCV's resize maps the whole source [0, w) onto the whole output [0, ow), so an edge scales by ow / w,
    and a window cut at (top, left) moves it by (-left, -top)."""
    hh, ww = np.asarray(heights, np.float64), np.asarray(widths, np.float64)
    oh, ow = out_hw
    if isinstance(crop, CenterCrop):
        return center_crop_maps(crop, hh, ww, oh, ow)
    if boxes_drawn is not None:
        t, l, bh, bw = (np.asarray(boxes_drawn[:, k], np.float64) for k in range(4))
        ax, ay = ow / bw, oh / bh
        return ax, -l * ax, ay, -t * ay
    hi, wi = hh.astype(np.int64), ww.astype(np.int64)
    top, left = np.maximum(0, (hi - oh) // 2), np.maximum(0, (wi - ow) // 2)
    ph, pw = np.minimum(oh, hi - top), np.minimum(ow, wi - left)
    y, x = (oh - ph) // 2, (ow - pw) // 2
    one = np.ones(len(hh))
    return one, (x - left).astype(np.float64), one, (y - top).astype(np.float64)


def center_crop_maps(plan: CenterCrop, hh: np.ndarray, ww: np.ndarray, oh: int, ow: int) -> tuple[np.ndarray, ...]:
    """CenterCrop as images/crops.apply does it: the shorter side resized to `plan.resize` (the other truncated,
    torchvision's Resize(int)), then the window at round((resized - out) / 2) (half to even, as Python's round)."""
    tall = hh > ww
    rh = np.where(tall, np.floor(plan.resize * hh / ww), plan.resize)
    rw = np.where(tall, plan.resize, np.floor(plan.resize * ww / hh))
    top, left = np.round((rh - oh) / 2.0), np.round((rw - ow) / 2.0)
    return rw / ww, -left, rh / hh, -top


def box_maps(drawn: Draws) -> tuple[np.ndarray, ...]:
    """crop_maps of the draws: each sample's (ax, bx, ay, by) from its stored pixels to the output's."""
    return crop_maps(plan_of(drawn.crop), drawn.boxes, drawn.heights, drawn.widths, drawn.out_hw)


def boxes_through(drawn: Draws, stored: np.ndarray, owner: np.ndarray) -> np.ndarray:
    """Stored boxes (K, 4) moved as their samples' pixels were (`owner[j]`: box j's sample): the crop's map,
    then the flip; a new float64 array, not clipped."""
    whole = affine(np.asarray(stored, np.float64).reshape(-1, 4), *(m[owner] for m in box_maps(drawn)))
    if drawn.flipped is not None:
        flip_boxes(whole, drawn.out_hw[1], drawn.flipped[owner])
    return whole


# -- masks (label ids: resized nearest, never blended) ------------------------------------------------------------

def mask_into(drawn: Draws, k: int, mask: np.ndarray, out: np.ndarray, fill: int = 0) -> None:
    """Sample k's mask (H, W) cut as its pixels were, into `out` (its batch row, (oh, ow)), unflipped (flip_into
    mirrors it with the images): a crop plan's box or CenterCrop's resize, nearest by output pixel centres
    (images/resize.nearest_index, exact integers: the pixel under the centre the image's resample centres on);
    crop=(H, W) or no crop, the central window, `fill` where smaller."""
    oh, ow = out.shape[:2]
    plan = plan_of(drawn.crop)
    if isinstance(plan, CenterCrop):
        h, w = mask.shape[:2]  # as crops.apply: the shorter side to `resize`, the other truncated, then the center
        rh, rw = (plan.resize, int(plan.resize * w / h)) if h <= w else (int(plan.resize * h / w), plan.resize)
        top, left = int(round((rh - oh) / 2.0)), int(round((rw - ow) / 2.0))
        ys, xs = nearest_index(rh, h)[top : top + oh], nearest_index(rw, w)[left : left + ow]
    elif plan is not None:
        t, lft, bh, bw = (int(v) for v in drawn.boxes[k])
        ys, xs = t + nearest_index(oh, bh), lft + nearest_index(ow, bw)
    else:
        center_crop_into(mask[:, :, None], out[:, :, None], fill)
        return
    out[...] = mask[ys[:, None], xs[None, :]]
