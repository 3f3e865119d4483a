"""Detection fields: takes manifest descriptions, gives the boxes field (every sample's boxes, their labels and
crowd flags, both directions) beside each image field, and the fields of a detection pack (`fields_of`), those a
dataset serves at one resolution (`served_fields`) and `info`'s lines (`summary`).

One boxes field per image field ("boxes" beside "image", "boxes@R" beside "image@R"): a resize mode that crops
(center-crop) may cut a box away at one size and not at another, so each size has its own boxes, in its own
stored pixels. Per shard the field stores five arrays: `boxes` float32 (K, 4) (x1, y1, x2, y2 in the stored
image's pixels, continuous coordinates: pixel k covers [k, k + 1)), `box_offsets` int64 (n + 1, in boxes: the
blob-plus-offsets layout, so every backend rebases them), `box_labels` (K,) in the smallest unsigned dtype of the
class count, `box_crowd` uint8 (K,) (COCO's iscrowd) and `box_frames` int32 (n, 2), each sample's stored (height,
width): the frame the boxes lie in, so `verify` checks them against it with this field alone. The field's
`max_boxes` (the most boxes a stored sample holds) is checked against the offsets of every shard and against the
boxes the manifest's shards list; datasets size their buffers from the offsets, never from it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import PackError
from ..images.field import ImageField, audit_fields, common_fields, resolution_key
from ..images.field import summary as image_summary
from ..pack.arrays import OFFSETS, SHAPES, LoadContext, load_blob, load_rows, rows_shape
from ..pack.fields import Field, label_dtype

BOX_DTYPE = np.dtype("<f4")
CROWD_DTYPE = np.dtype("|u1")
# generic keys (what `load` gives); stored names add the resolution's suffix
KEYS = ("boxes", "box_offsets", "box_labels", "box_crowd", "box_frames")


def boxes_key(image_key: str) -> str:
    """The boxes field beside an image field: "boxes" for "image", "boxes@R" for "image@R"."""
    return "boxes" + image_key[len("image"):]


@dataclass(frozen=True)
class BoxesField:
    """Every sample's boxes (float32 x1, y1, x2, y2 in stored pixels), labels below `num_classes` and crowd flags,
    as per-box arrays sharing one offsets array, and each sample's frame (stored height, width)."""

    num_classes: int
    label_dtype: str = "|u1"
    suffix: str = ""  # a multi-resolution pack's "_r128", as its image field's
    max_boxes: int = 0  # the most boxes a stored sample of the field holds, over the pack (0: not recorded)

    def name(self, key: str) -> str:
        return key + self.suffix

    @property
    def np_label_dtype(self) -> np.dtype:
        return np.dtype(self.label_dtype)

    @classmethod
    def for_classes(cls, num_classes: int, suffix: str = "", max_boxes: int = 0) -> "BoxesField":
        return cls(num_classes, label_dtype(max(num_classes, 1)).str, suffix, max_boxes)

    def to_manifest(self) -> dict[str, Any]:
        return {"layout": "blob", "format": "xyxy", "units": "stored pixels", "dtype": BOX_DTYPE.str, "label_dtype": self.label_dtype,
                "num_classes": self.num_classes, "suffix": self.suffix, "max_boxes": self.max_boxes,
                "arrays": [self.name(k) for k in KEYS],
                "meaning": "boxes (K, 4) x1 y1 x2 y2 in the stored image's pixels; box_offsets index them per sample; "
                           "box_labels and box_crowd one per box; box_frames each sample's (height, width)"}

    @classmethod
    def from_manifest(cls, spec: dict[str, Any], where: Path | str) -> "BoxesField":
        try:
            field = cls(int(spec["num_classes"]), np.dtype(spec["label_dtype"]).str, str(spec.get("suffix", "")), int(spec.get("max_boxes", 0)))
            arrays = [str(a) for a in spec["arrays"]]
            fmt, dtype = spec["format"], np.dtype(spec["dtype"]).str
        except (KeyError, TypeError, ValueError) as e:
            raise PackError(f"{where}: malformed boxes field description ({e})") from None
        if (fmt != "xyxy" or dtype != BOX_DTYPE.str or field.label_dtype not in ("|u1", "<u2", "<u4") or field.num_classes < 0
                or arrays != [field.name(k) for k in KEYS] or (field.suffix and not field.suffix.startswith("_r"))):
            raise PackError(f"{where}: unknown boxes field: format {fmt!r}, dtype {dtype!r}, labels {field.label_dtype!r}, "
                            f"arrays {arrays}")
        return field

    def stored(self) -> dict[str, str]:
        return {self.name(k): k for k in KEYS}

    def shard_arrays(self, boxes: Sequence[np.ndarray], labels: Sequence[np.ndarray], crowd: Sequence[np.ndarray],
                     frames: Sequence[tuple[int, int]]) -> dict[str, np.ndarray]:
        """One shard's arrays from each sample's boxes (k, 4), labels (k,), crowd flags (k,) and (height, width)."""
        offsets = np.zeros(len(boxes) + 1, OFFSETS)
        np.cumsum([len(b) for b in boxes], out=offsets[1:])
        cat = (lambda parts, shape, dt: np.concatenate(parts).astype(dt, copy=False).reshape(shape) if parts  # noqa: E731
               else np.zeros(shape, dt))
        k = int(offsets[-1])
        return {self.name("boxes"): cat([np.asarray(b, np.float64).reshape(-1, 4) for b in boxes], (k, 4), BOX_DTYPE),
                self.name("box_offsets"): offsets,
                self.name("box_labels"): cat([np.asarray(v, np.int64) for v in labels], (k,), self.np_label_dtype),
                self.name("box_crowd"): cat([np.asarray(v, np.uint8) for v in crowd], (k,), CROWD_DTYPE),
                self.name("box_frames"): np.asarray(frames, SHAPES).reshape(len(boxes), 2)}

    def _per_box(self, shards: list[dict], split_dir: Path) -> list[dict]:
        """The shard records with each one's box count as its count: what the per-box arrays hold rows of."""
        out = []
        for s in shards:
            rec = s.get("files", {}).get(f"{self.name('boxes')}.npy") if isinstance(s.get("files"), dict) else None
            if not isinstance(rec, dict) or not isinstance(rec.get("shape"), list) or len(rec["shape"]) != 2:
                raise PackError(f"{split_dir / str(s.get('name'))}: manifest lists no usable {self.name('boxes')}.npy")
            out.append({**s, "count": int(rec["shape"][0])})
        return out

    def layout(self, split_dir: Path, shards: list[dict]) -> list[tuple[str, tuple[int, ...], np.dtype]]:
        per_box = self._per_box(shards, split_dir)
        return [(self.name("box_labels"), rows_shape(per_box, ()), self.np_label_dtype),
                (self.name("box_offsets"), (rows_shape(shards, ())[0] + 1,), OFFSETS),
                (self.name("boxes"), rows_shape(per_box, (4,)), BOX_DTYPE),
                (self.name("box_crowd"), rows_shape(per_box, ()), CROWD_DTYPE),
                (self.name("box_frames"), rows_shape(shards, (2,)), SHAPES)]

    def load(self, split_dir: Path, shards: list[dict], ctx: LoadContext | None = None) -> dict[str, Any]:
        """The split's arrays by generic key: labels and offsets as a blob field's (offsets global, checked to run
        forward within each shard), boxes and crowd flags as rows of the boxes' counts, frames a row per sample."""
        ctx = ctx or LoadContext()
        per_box = self._per_box(shards, split_dir)
        labels, offsets = load_blob(split_dir, shards, self.name("box_labels"), self.name("box_offsets"), ctx, dtype=self.np_label_dtype)
        boxes = load_rows(split_dir, per_box, self.name("boxes"), BOX_DTYPE, (4,), ctx)
        crowd = load_rows(split_dir, per_box, self.name("box_crowd"), CROWD_DTYPE, (), ctx)
        frames = load_rows(split_dir, shards, self.name("box_frames"), SHAPES, (2,), ctx)
        return {"boxes": boxes, "box_offsets": offsets, "box_labels": labels, "box_crowd": crowd, "box_frames": frames}

    def count(self, arrays: dict[str, Any]) -> int:
        return len(arrays["box_frames"])

    def check(self, arrays: dict[str, Any], deep: bool = False) -> list[str]:
        """Every box finite, not inverted and inside its sample's frame; every label below the class count;
        crowd flags 0 or 1; offsets and frames agreeing with the boxes. A box of no area is no problem: a build
        before the float32 check stored boxes thinner than float32 resolves as such, and a split is never refused
        for one (`DetectionDataset` serves none: detection/dataset.py)."""
        boxes, offsets, frames = np.asarray(arrays["boxes"], np.float64), np.asarray(arrays["box_offsets"]), np.asarray(arrays["box_frames"])
        labels, crowd = np.asarray(arrays["box_labels"]), np.asarray(arrays["box_crowd"])
        name = self.name
        if len(offsets) != len(frames) + 1 or int(offsets[-1]) != len(boxes) or len(labels) != len(boxes) or len(crowd) != len(boxes):
            return [f"{name('box_offsets')}.npy: indexes {int(offsets[-1]) if len(offsets) else 0} boxes of {len(frames)} samples; "
                    f"the field holds {len(boxes)} boxes, {len(labels)} labels, {len(crowd)} crowd flags"]
        if len(frames) and np.any(frames <= 0):
            return [f"{name('box_frames')}.npy: a frame of non-positive size"]
        out = []
        if not np.all(np.isfinite(boxes)):
            k = int(np.flatnonzero(~np.isfinite(boxes).all(1))[0])
            out.append(f"{name('boxes')}.npy: box {k} (sample {_owner(offsets, k)}) is not finite")
        owner = np.repeat(np.arange(len(frames)), np.diff(offsets))
        h, w = frames[owner, 0], frames[owner, 1]
        with np.errstate(invalid="ignore"):
            bad = ~((boxes[:, 0] >= 0) & (boxes[:, 1] >= 0) & (boxes[:, 2] <= w) & (boxes[:, 3] <= h)
                    & (boxes[:, 2] >= boxes[:, 0]) & (boxes[:, 3] >= boxes[:, 1])) & np.isfinite(boxes).all(1)
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            i = int(owner[k])
            out.append(f"{name('boxes')}.npy: box {k} of sample {i}, {boxes[k].round(2).tolist()}, is inverted or outside its "
                       f"{int(frames[i, 1])}x{int(frames[i, 0])} image ({int(bad.sum())} such boxes)")
        if len(labels) and int(labels.max()) >= self.num_classes:
            out.append(f"{name('box_labels')}.npy: a label is {int(labels.max())}, but the pack has {self.num_classes} classes")
        if len(crowd) and int(crowd.max()) > 1:
            out.append(f"{name('box_crowd')}.npy: a crowd flag is {int(crowd.max())}, not 0 or 1")
        held = np.diff(offsets)
        if self.max_boxes and len(held) and int(held.max()) > self.max_boxes:
            i = int(np.argmax(held))
            out.append(f"{name('box_offsets')}.npy: sample {i} holds {int(held[i])} boxes, more boxes than the manifest's "
                       f"max_boxes ({self.max_boxes}) says any sample holds")
        return out

    def served_as(self, largest: tuple[int, ...]) -> tuple[str, tuple[int, ...], str, str | None]:
        """What a sample puts in a batch (for `dataprep plan`): up to max_boxes float32 boxes (labels beside them)."""
        return "boxes", (self.max_boxes, 4), "float32", None

    def describe(self) -> str:
        return f"float32 boxes (x1, y1, x2, y2 in stored pixels), {self.np_label_dtype.name} labels of {self.num_classes} classes, crowd flags"


def _owner(offsets: np.ndarray, k: int) -> int:
    return int(np.searchsorted(offsets, k, "right")) - 1


def _boxes_field(m: dict[str, Any], image_key: str, where: Path | str) -> BoxesField:
    key = boxes_key(image_key)
    if key not in m["fields"]:
        raise PackError(f"{where}: no {key} field beside {image_key}")
    return BoxesField.from_manifest(m["fields"][key], where)


def _listed_boxes(m: dict[str, Any], field: BoxesField) -> dict[str, int]:
    """Per split, the boxes the manifest's shard records list for the field (their boxes.npy rows); splits whose
    records are malformed are left out (the shards' own checks name them)."""
    out = {}
    for split, entry in m.get("splits", {}).items():
        try:
            out[split] = sum(int(s["files"][f"{field.name('boxes')}.npy"]["shape"][0]) for s in entry["shards"])
        except (KeyError, TypeError, ValueError, IndexError):
            continue
    return out


def max_boxes_problems(m: dict[str, Any], fields: dict[str, Any]) -> list[str]:
    """A manifest's max_boxes against the boxes its shards list: no sample holds more boxes than its split has
    (a forged 10**9 is caught here; one below what a sample holds, by each shard's `check`)."""
    out = []
    boxes = [(k, f) for k, f in fields.items() if isinstance(f, BoxesField)]
    listed = {k: _listed_boxes(m, f) for k, f in boxes}
    for k, f in boxes:
        if listed[k] and f.max_boxes > max(listed[k].values()):
            out.append(f"fields.{k}.max_boxes is {f.max_boxes}, but the pack's shards list {max(listed[k].values())} {k} "
                       "in its largest split")
    for split, entry in m.get("splits", {}).items():
        most = entry.get("max_boxes") if isinstance(entry, dict) else None
        have = [listed[k][split] for k, _ in boxes if split in listed[k]]
        if most is not None and have and not (isinstance(most, int) and not isinstance(most, bool) and 0 <= most <= max(have)):
            out.append(f"splits.{split}.max_boxes is {most!r}, but the split's shards list {max(have)} boxes in all")
    return out


def fields_of(m: dict[str, Any], where: Path | str = "manifest") -> dict[str, Field]:
    """Every field of a detection pack: each image field with its boxes field, the source paths, the audit's
    hashes (where the build stored them); a manifest whose max_boxes its shards contradict is refused."""
    out: dict[str, Field] = {}
    for key, spec in m["fields"].items():
        if key.split("@")[0] == "image":
            out[key] = ImageField.from_manifest(spec, where)
            out[boxes_key(key)] = _boxes_field(m, key, where)
    if not out:
        raise PackError(f"{where}: no image field")
    problems = max_boxes_problems(m, out)
    if problems:
        raise PackError(f"{where}: {problems[0]}")
    return {**out, **common_fields(m, where), **audit_fields(m, where)}


def served_fields(m: dict[str, Any], resolution: int | None = None, where: Path | str = "manifest") -> dict[str, Field]:
    """The image field at one resolution (first), its boxes field, the source paths."""
    key = resolution_key(m, resolution, where)
    return {key: ImageField.from_manifest(m["fields"][key], where), boxes_key(key): _boxes_field(m, key, where), **common_fields(m, where)}


def summary(m: dict[str, Any]) -> list[str]:
    """`dataprep info`: how the images were made, and the boxes each split holds."""
    spec = m["fields"][boxes_key(resolution_key(m, None, "manifest"))]
    src = m.get("source", {})
    lines = [ln for ln in image_summary(m) if not ln.startswith("labels:")]
    parts = []
    for name, sp in m["splits"].items():
        b = sp.get("boxes", {})
        parts.append(f"{name} {b.get('stored', '?'):,}" if isinstance(b.get("stored"), int) else f"{name} ?")
        dropped = [f"{b[k]:,} {what}" for k, what in (("degenerate", "degenerate (skipped)"), ("cut_off", "cut off by the resize"))
                   if b.get(k)]
        if dropped:
            parts[-1] += f" ({', '.join(dropped)})"
    lines.append(f"boxes:     {spec['num_classes']} classes from {src.get('layout', '?')}; stored x1 y1 x2 y2 float32 in stored pixels; "
                 + "; ".join(parts))
    return lines
