"""Box geometry: takes boxes (x1, y1, x2, y2, in continuous pixel coordinates: a pixel k covers [k, k + 1)) and
the geometry their pixels went through, gives the boxes where those pixels went: a build's resize mode (scale,
crop, pad: `through_resize`), a crop plan's box resized to the output (`through_crop`), a CenterCrop's resize
and window (`through_center_crop`), a fixed window cut from the centre and padded where smaller
(`through_window`), a horizontal flip (`flip`), an EXIF orientation's turn of stored pixels upright
(`from_stored`); then clipped to the output (`clip`) and kept or dropped (`kept`: at least `min_size` pixels
of width and height inside, at least `min_visibility` of the area).

Every move is one affine map per sample, X' = X * a + b (x and y each), written as the pixel stages map
their pixels: OpenCV's resize maps the whole source [0, w) onto the whole output [0, ow), so a box's edges
scale by ow / w, and a window cut at (top, left) moves them by (-left, -top). The maps are applied to every
box of a batch at once (`affine`, one row per box, each row its sample's map). The Loader's moves (`affine`,
`crop_maps`, `flip`) are images/geometry.py's, shared with pixels and masks; this module names them beside the
box-only steps. Pure numpy: no torch.
"""
from __future__ import annotations

import numpy as np

from ..images.crops import CenterCrop
from ..images.geometry import affine, center_crop_maps, crop_maps
from ..images.geometry import flip_boxes as flip  # noqa: F401  (box users read it here, beside clip and kept)
from ..images.resize import Geometry


def resize_map(geom: Geometry) -> tuple[float, float, float, float]:
    """(ax, bx, ay, by) of a build's resize mode (images/resize.py): the source scaled to `geom.scaled`, then its
    central `geom.out` window cut (top, left = (scaled - out) // 2 where larger) and centred on a padded frame
    where smaller (offset (out - kept) // 2), as `resize.crop_pad` does it."""
    (h, w), (sh, sw), (oh, ow) = geom.source, geom.scaled, geom.out
    top, left = max(0, (sh - oh) // 2), max(0, (sw - ow) // 2)
    ph, pw = min(oh, sh - top), min(ow, sw - left)
    y, x = (oh - ph) // 2, (ow - pw) // 2
    return sw / w, x - left, sh / h, y - top


def through_resize(boxes: np.ndarray, geom: Geometry) -> np.ndarray:
    """Source-pixel boxes in the stored image's pixels (not clipped)."""
    return affine(boxes, *resize_map(geom))


def through_crop(boxes: np.ndarray, crop_box, out_hw: tuple[int, int]) -> np.ndarray:
    """Boxes of a stored image in the output of a crop box (top, left, height, width) resized to out_hw."""
    maps = crop_maps(None, np.asarray([crop_box], np.float64), [0], [0], out_hw)
    return affine(boxes, *(float(m[0]) for m in maps))


def through_center_crop(boxes: np.ndarray, plan: CenterCrop, hw: tuple[int, int]) -> np.ndarray:
    """Boxes of a stored image of size hw in CenterCrop `plan`'s output."""
    maps = center_crop_maps(plan, np.array([hw[0]], np.float64), np.array([hw[1]], np.float64), *plan.size)
    return affine(boxes, *(float(m[0]) for m in maps))


def through_window(boxes: np.ndarray, hw: tuple[int, int], out_hw: tuple[int, int]) -> np.ndarray:
    """Boxes of a stored image of size hw in its central out_hw window (padded where smaller)."""
    maps = crop_maps(None, None, [hw[0]], [hw[1]], out_hw)
    return affine(boxes, *(float(m[0]) for m in maps))


# EXIF orientation -> where a stored pixel edge (x, y) of a W x H grid lands once the decoder turned the image
# upright (images/decode.py's transposes), in continuous coordinates
_UPRIGHT = {
    2: lambda x, y, w, h: (w - x, y),  # mirrored
    3: lambda x, y, w, h: (w - x, h - y),  # 180 degrees
    4: lambda x, y, w, h: (x, h - y),  # flipped
    5: lambda x, y, w, h: (y, x),  # transposed
    6: lambda x, y, w, h: (h - y, x),  # turned 90 degrees clockwise
    7: lambda x, y, w, h: (h - y, w - x),  # transversed
    8: lambda x, y, w, h: (y, w - x),  # turned 90 degrees anticlockwise
}


def from_stored(boxes: np.ndarray, orientation: int, height: int, width: int) -> np.ndarray:
    """Boxes on a stored (height, width) pixel grid, in the pixels the decoder turned upright by the EXIF
    `orientation` (1: unchanged); a new array."""
    move = _UPRIGHT.get(int(orientation))
    if move is None:
        return np.array(boxes, np.float64)
    b = np.asarray(boxes, np.float64)
    xa, ya = move(b[:, 0], b[:, 1], width, height)
    xb, yb = move(b[:, 2], b[:, 3], width, height)
    return np.stack([np.minimum(xa, xb), np.minimum(ya, yb), np.maximum(xa, xb), np.maximum(ya, yb)], 1).reshape(-1, 4)


def clip(boxes: np.ndarray, height, width) -> np.ndarray:
    """Boxes cut to the image [0, width] x [0, height] (one size for all, or one per box). In place; returns `boxes`."""
    w = np.asarray(width, np.float64)
    h = np.asarray(height, np.float64)
    np.clip(boxes[:, 0], 0, w, out=boxes[:, 0])
    np.clip(boxes[:, 2], 0, w, out=boxes[:, 2])
    np.clip(boxes[:, 1], 0, h, out=boxes[:, 1])
    np.clip(boxes[:, 3], 0, h, out=boxes[:, 3])
    return boxes


def areas(boxes: np.ndarray) -> np.ndarray:
    """Each box's area (0 where it is empty or inverted)."""
    return np.maximum(boxes[:, 2] - boxes[:, 0], 0) * np.maximum(boxes[:, 3] - boxes[:, 1], 0)


def kept(clipped: np.ndarray, whole: np.ndarray | None = None, min_size: float = 1.0, min_visibility: float = 0.0) -> np.ndarray:
    """Which boxes stay once clipped: at least `min_size` of width and of height inside (torchvision's
    SanitizeBoundingBoxes keeps ws >= min_size and hs >= min_size), and, with `min_visibility` > 0, at least that
    fraction of the unclipped box's area (`whole`) inside."""
    ok = ((clipped[:, 2] - clipped[:, 0]) >= min_size) & ((clipped[:, 3] - clipped[:, 1]) >= min_size)
    if min_visibility > 0 and whole is not None:
        full = areas(whole)
        ok &= areas(clipped) >= min_visibility * np.where(full > 0, full, np.inf)
    return ok


def positive(boxes: np.ndarray) -> np.ndarray:
    """Which boxes have a positive width and height (what a build keeps: zero-area boxes are degenerate)."""
    return (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])


def stored_positive(boxes: np.ndarray) -> np.ndarray:
    """Which boxes keep a positive width and height once stored as float32 (BoxesField's dtype): a box
    4e-7 px wide at x = 30 is positive in float64 and empty in float32, whose spacing there is 1.9e-6."""
    return positive(boxes.astype(np.float32))


def ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The concatenation of range(starts[k], starts[k] + counts[k]) over k, without a Python loop."""
    starts, counts = np.asarray(starts, np.int64), np.asarray(counts, np.int64)
    before = np.cumsum(counts) - counts
    return np.arange(int(counts.sum()), dtype=np.int64) + np.repeat(starts - before, counts)


def pad_into(boxes: np.ndarray, labels: np.ndarray, owner: np.ndarray, rows: np.ndarray, out_boxes: np.ndarray,
             out_labels: np.ndarray, counts: np.ndarray, extra: tuple[np.ndarray, np.ndarray] | None = None) -> int:
    """Kept boxes (K, 4) and labels (K,) of a batch, each box's sample `owner` (0..n-1, ascending), written into
    rows `rows` of (B, M, 4) and (B, M) outputs, padded (boxes with 0, labels with -1), `counts` set; a sample
    with more than M keeps its first M. `extra`: (values (K,), out (B, M)) padded with 0 too (crowd flags).
    Gives how many boxes did not fit."""
    m = out_boxes.shape[1]
    out_boxes[rows] = 0
    out_labels[rows] = -1
    if extra is not None:
        extra[1][rows] = 0
    n = len(rows)
    per = np.bincount(owner, minlength=n) if len(owner) else np.zeros(n, np.int64)
    pos = np.arange(len(owner)) - np.repeat(np.cumsum(per) - per, per)
    fit = pos < m
    r = rows[owner[fit]]
    out_boxes[r, pos[fit]] = boxes[fit]
    out_labels[r, pos[fit]] = labels[fit]
    if extra is not None:
        extra[1][r, pos[fit]] = extra[0][fit]
    counts[rows] = np.minimum(per, m)
    return int((~fit).sum())
