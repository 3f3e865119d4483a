"""COCO listing: takes an image folder and a COCO instances JSON, gives one split of images with their boxes
(`BoxSplit`: every box of the split in one (K, 4) float64 array plus int64 offsets per image, labels, crowd
flags, each image's declared size) and the classes (category names in id order). What the detection build
takes; `sources/yolo.py` gives the same from YOLO text files.

COCO's `info`, `licenses` and each annotation's `segmentation` and `area` are optional and unread. Category
ids map to contiguous labels in id order (ids 1, 3, 7 become labels 0, 1, 2), their names are the classes;
`iscrowd` is kept as a flag per box; an image with no annotation is kept with no boxes. Boxes stay as the file
gives them here, [x, y, w, h] turned into (x1, y1, x2, y2) in the source image's pixels: the build clips them to
the decoded image and counts and skips the degenerate ones (no area left). A malformed file (not JSON, a
missing or mistyped key, a box that is not four finite numbers (a 400-digit integer is none), a width or height
that is not a positive integer below 2**31, a category id past 64 bits, an id that names no image or category,
nesting past the recursion limit) is a SourceError naming the file and the entry; so is a file over
ANNOTATIONS_MAX_BYTES or one that is no regular file, refused before a byte of it is read. An image entry whose
file is missing or leaves the root (`..`, an absolute path; a symlink out of it is refused when the build reads
it) is skipped with its reason (or refused with `strict`).
"""
from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ImageDecodeError, SourceError
from .listing import FileReader, Skips, Source, SplitSource, read_source, skip


@dataclass
class BoxSplit(SplitSource):
    """A split of images with boxes: `boxes` (K, 4) float64 x1, y1, x2, y2 (source pixels, or fractions of the
    image's width and height where `normalized`), `box_offsets` (n + 1) int64 into them per image, `box_labels`
    (K,) int64, `box_crowd` (K,) uint8, `sizes` (n, 2) int64 each image's declared (height, width), -1 where the
    source declares none."""

    boxes: np.ndarray | None = None
    box_offsets: np.ndarray | None = None
    box_labels: np.ndarray | None = None
    box_crowd: np.ndarray | None = None
    sizes: np.ndarray | None = None
    normalized: bool = False

    def take(self, idx: np.ndarray) -> "BoxSplit":
        """Images `idx` (in order) of this split, with their boxes."""
        idx = np.asarray(idx, np.int64)
        out = super().take(idx)
        counts = np.diff(self.box_offsets)[idx]
        before = np.cumsum(counts) - counts
        sel = np.arange(int(counts.sum()), dtype=np.int64) + np.repeat(self.box_offsets[:-1][idx] - before, counts)
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        return replace(out, boxes=self.boxes[sel], box_offsets=offsets, box_labels=self.box_labels[sel], box_crowd=self.box_crowd[sel],
                       sizes=self.sizes[idx])

    def box_counts(self) -> np.ndarray:
        return np.diff(self.box_offsets)


def box_split(name: str, paths: list[str], per_image: list[list[tuple]], sizes: list[tuple[int, int]], normalized: bool,
              skipped: list[dict], reader: Any, notes: list[str] | None = None) -> BoxSplit:
    """A BoxSplit from each image's boxes as (x1, y1, x2, y2, label, crowd) tuples."""
    counts = np.array([len(b) for b in per_image], np.int64)
    rows = [r for b in per_image for r in b]
    arr = np.array([r[:4] for r in rows], np.float64).reshape(-1, 4)
    return BoxSplit(name, paths, np.zeros(len(paths), np.int64), reader=reader, skipped=skipped, notes=notes or [],
                    boxes=arr, box_offsets=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                    box_labels=np.array([r[4] for r in rows], np.int64), box_crowd=np.array([r[5] for r in rows], np.uint8),
                    sizes=np.array(sizes, np.int64).reshape(-1, 2), normalized=normalized)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v) -> bool:
    """A finite number a float holds (a JSON integer of 400 digits is none: float() of it overflows)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


# An image's declared side: below 2**31 (an int32 frame; the decoder's pixel cap, max_pixels, is far smaller), so
# the declared sizes are an int64 array and a mismatch with the decoded image is a "size mismatch" skip.
MAX_SIDE = 2 ** 31 - 1
# Category ids: 64-bit integers (the manifest's category_ids are read back into int64 arrays)
ID_RANGE = (-(2 ** 63), 2 ** 63 - 1)
# The largest annotations file read (COCO's train2017 file is 448 MB): json parses a file into Python objects
# several times its size, so a larger one is refused before it is read.
ANNOTATIONS_MAX_BYTES = 2 << 30


def safe_relative(name: str) -> bool:
    """Whether a listed file name stays under its root (relative, no `..`)."""
    p = Path(name)
    return bool(name) and not p.is_absolute() and ".." not in p.parts and "\0" not in name


def _entries(doc: dict, key: str, path: Path, required: bool) -> list:
    if key not in doc:
        if required:
            raise SourceError(f"{path}: no {key!r} list (a COCO instances file has images, annotations and categories)")
        return []
    if not isinstance(doc[key], list):
        raise SourceError(f"{path}: {key!r} is a {type(doc[key]).__name__}, not a list")
    return doc[key]


def _annotations_bytes(path: Path) -> bytes:
    """The annotations file's bytes: a regular file (a FIFO would block, /dev/zero never end) of at most
    ANNOTATIONS_MAX_BYTES, its size checked before a byte is read."""
    try:
        size = os.stat(path).st_size
    except OSError as e:
        raise SourceError(f"{path}: cannot read the annotations file ({e.strerror or e})") from None
    if size > ANNOTATIONS_MAX_BYTES:
        raise SourceError(f"{path}: the annotations file is {size:,} bytes, over the {ANNOTATIONS_MAX_BYTES:,}-byte cap on one "
                          "(dataprep.sources.coco.ANNOTATIONS_MAX_BYTES): parsed, it would take several times that in memory")
    try:
        return read_source(str(path), ANNOTATIONS_MAX_BYTES)
    except ImageDecodeError as e:
        raise SourceError(f"{path}: cannot read the annotations file: {e.reason} ({e.detail})") from None


def read_coco(path: Path) -> tuple[list[dict], list[dict], list[dict]]:
    """The images, annotations and categories of a COCO file, each entry checked for the keys the build reads."""
    data = _annotations_bytes(path)
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise SourceError(f"{path}: not a JSON file ({e})") from None
    except RecursionError:
        raise SourceError(f"{path}: nested too deep to be a COCO instances file (arrays or objects inside each other past "
                          f"Python's recursion limit, {sys.getrecursionlimit()})") from None
    if not isinstance(doc, dict):
        raise SourceError(f"{path}: the top level is a {type(doc).__name__}, not a COCO object with images and annotations")
    images = _entries(doc, "images", path, True)
    annotations = _entries(doc, "annotations", path, False)
    categories = _entries(doc, "categories", path, bool(annotations))
    for k, c in enumerate(categories):
        where = f"{path}: categories[{k}]"
        if not isinstance(c, dict) or not _is_int(c.get("id")) or not isinstance(c.get("name"), str):
            raise SourceError(f"{where}: a category is an object with an integer 'id' and a string 'name', not {_short(c)}")
        if not ID_RANGE[0] <= c["id"] <= ID_RANGE[1]:
            raise SourceError(f"{where}: category id {_short(c['id'])} is not a 64-bit integer")
    for k, im in enumerate(images):
        where = f"{path}: images[{k}]"
        if not isinstance(im, dict) or not _is_int(im.get("id")) or not isinstance(im.get("file_name"), str):
            raise SourceError(f"{where}: an image is an object with an integer 'id' and a string 'file_name', not {_short(im)}")
        for side in ("width", "height"):
            if side in im and not (_is_int(im[side]) and 0 < im[side] <= MAX_SIDE):
                raise SourceError(f"{where} (id {_short(im['id'])}): {side} is {_short(im[side])}, not a positive integer below 2**31")
    for k, a in enumerate(annotations):
        where = f"{path}: annotations[{k}]" + (f" (id {_short(a['id'])})" if isinstance(a, dict) and "id" in a else "")
        if not isinstance(a, dict):
            raise SourceError(f"{where}: an annotation is an object, not {_short(a)}")
        for key in ("image_id", "category_id"):
            if not _is_int(a.get(key)):
                raise SourceError(f"{where}: {key} is {_short(a.get(key))}, not an integer")
        box = a.get("bbox")
        if not isinstance(box, list) or len(box) != 4 or not all(_number(v) for v in box):
            raise SourceError(f"{where}: bbox is {_short(box)}, not [x, y, width, height] of four finite numbers")
        crowd = a.get("iscrowd", 0)
        if crowd not in (0, 1):  # True and False compare equal to 1 and 0
            raise SourceError(f"{where}: iscrowd is {crowd!r}, not 0 or 1")
    return images, annotations, categories


def _short(v) -> str:
    """A JSON value for a message, cut to 80 characters (its type's name where even that cannot be written:
    an integer past Python's digit limit, nesting past the recursion limit)."""
    try:
        text = json.dumps(v) if not isinstance(v, str) else repr(v)
    except (ValueError, RecursionError):
        return f"a {type(v).__name__}"
    return text if len(text) <= 80 else text[:77] + "..."


def scan_coco(images: str | os.PathLike, annotations: str | os.PathLike, split: str = "train", strict: bool = False,
              max_bytes: int | None = None) -> Source:
    """One split of the images a COCO instances file lists (in the file's order), under the folder `images`, with
    their boxes; classes: the category names in id order. `details` records the annotations file and the
    category ids behind the labels (label k is category_ids[k])."""
    root, path = Path(images), Path(annotations)
    if not root.is_dir():
        raise SourceError(f"{root}: the image folder does not exist or is not a directory")
    image_list, anns, cats = read_coco(path)
    ids = sorted(c["id"] for c in cats)
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        k = next(k for k, c in enumerate(cats) if c["id"] == dup)
        raise SourceError(f"{path}: categories[{k}]: category id {dup} is listed twice")
    label_of = {cid: k for k, cid in enumerate(ids)}
    names = {c["id"]: c["name"] for c in cats}
    at: dict[int, int] = {}
    for k, im in enumerate(image_list):
        if im["id"] in at:
            raise SourceError(f"{path}: images[{k}]: image id {im['id']} is listed twice (first at images[{at[im['id']]}])")
        at[im["id"]] = k
    per_image: list[list[tuple]] = [[] for _ in image_list]
    for k, a in enumerate(anns):
        where = f"{path}: annotations[{k}]" + (f" (id {_short(a['id'])})" if "id" in a else "")
        if a["image_id"] not in at:
            raise SourceError(f"{where}: image_id {a['image_id']} names no image of the file")
        if a["category_id"] not in label_of:
            raise SourceError(f"{where}: category_id {a['category_id']} names no category of the file (ids {_ids(ids)})")
        x, y, w, h = (float(v) for v in a["bbox"])
        per_image[at[a["image_id"]]].append((x, y, x + w, y + h, label_of[a["category_id"]], int(a.get("iscrowd", 0))))
    skipped: Skips = Skips()
    paths, boxes, sizes = [], [], []
    for k, im in enumerate(image_list):
        name = im["file_name"]
        if not safe_relative(name):
            skip(skipped, {"source": name, "reason": "outside the root", "detail": f"images[{k}] (id {im['id']}): not a path under {root}"},
                 strict)
            continue
        if not os.path.isfile(root / name):
            skip(skipped, {"source": name, "reason": "no such file", "detail": f"images[{k}] (id {im['id']}) names it"}, strict)
            continue
        paths.append(name)
        boxes.append(per_image[k])
        sizes.append((int(im.get("height", -1)), int(im.get("width", -1))))
    if not paths:
        raise SourceError(f"{path}: no image of the file is under {root}" + (f" (skipped: {skipped[0]['source']}: {skipped[0]['reason']})"
                                                                            if skipped else " (the file lists none)"))
    s = box_split(split, paths, boxes, sizes, False, skipped, FileReader(max_bytes=max_bytes, confine=True))
    details = {"annotations": str(path.resolve()), "category_ids": ids, "format": "coco"}
    return Source("coco", root, [names[i] for i in ids], None, [s], details=details)


def _ids(ids: list[int]) -> str:
    return ", ".join(map(str, ids[:10])) + (", ..." if len(ids) > 10 else "") if ids else "none"
