"""Detection build: takes a listed split of images with boxes (sources/coco.py, sources/yolo.py) and the image
settings, gives a pack of kind "detection": the images stored as an image pack stores them (every size, resize
mode, JPEG or raw) and, beside each size, the boxes moved with the pixels (detection/boxes.py: the resize mode's
scale, crop and pad), clipped to the stored image; labels and crowd flags with them.

Per image: decoded once (images/process.py); its boxes are taken to its upright pixels (YOLO's fractions times
the decoded size; COCO's pixels as given, the image's declared width and height checked against the decoded
ones: a mismatch is a skipped image, "size mismatch", never boxes on the wrong pixels), clipped to it, and the
degenerate ones (no area left, or none once rounded to float32 as stored) skipped and counted; then through each
size's geometry, clipped again, and those a cropping resize cuts away (or shrinks below float32's resolution)
counted. A box is judged by the float32 values stored, so a pack never holds one that opening it refuses. The
counts are the split's "boxes" entry in the manifest and the summary's notes. An image that cannot be used is
skipped with its reason, or stops the build under `strict`; so is one listing more boxes than `max_boxes`
(skipped before it is decoded, rather than stored with some of its objects left out as background).
"""
from __future__ import annotations

import hashlib
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..driver import BuildSummary, build_shards, finish_shard, pack_header, prepare_output, reused_shard, task_fingerprint
from ..errors import ImageDecodeError
from ..images import build as image_build
from ..images.build import audit_arrays, audit_fields_manifest, audit_record, image_fields
from ..images.settings import ImageSettings
from ..pack.fields import StringsField
from ..pack.manifest import write_manifest
from ..settings import BuildSettings
from ..sources import FILES, FileReader, Source
from ..sources.listing import capped, read_source
from . import boxes as geometry
from .field import BoxesField, boxes_key

# An image listing more boxes is skipped ("too many boxes"): ten times COCO's most on one image (93), so a
# forged or runaway label file cannot pad every batch row to its count. options.DETECTION_OPTIONS gives the
# front door and the CLI the same default (tests/test_trust_detection.py holds them equal).
MAX_BOXES = 1000


@dataclass(frozen=True)
class DetectionShardTask:
    """Everything one worker needs to make one shard: a pure function of these fields."""

    root: str
    split_dir: str
    index: int
    paths: tuple[str, ...]
    boxes: np.ndarray  # (K, 4) float64 of the shard's images, source pixels (or fractions where `normalized`)
    box_offsets: np.ndarray  # (n + 1) int64, local
    box_labels: np.ndarray
    box_crowd: np.ndarray
    sizes: np.ndarray  # (n, 2) declared (height, width), -1 where not declared
    normalized: bool
    num_classes: int
    image: ImageSettings
    strict: bool
    resume: bool = False
    reader: Any = FILES
    fingerprints: bool = True  # the audit's fields (phash, digest) stored beside the images
    max_boxes: int = MAX_BOXES  # an image listing more is skipped, "too many boxes"

    def fingerprint(self) -> str:
        """A digest of everything the shard's bytes depend on (its inputs, their order, the settings)."""
        head = ["detection", self.index, self.image.to_dict(), self.num_classes, self.strict, self.normalized, EXIF_RULE,
                self.max_boxes]
        if self.fingerprints:  # a shard written without hashes is rebuilt, never reused without them
            head.append(audit_record())
        rows = []
        for i, rel in enumerate(self.paths):
            a, b = int(self.box_offsets[i]), int(self.box_offsets[i + 1])
            h = hashlib.sha256(np.ascontiguousarray(self.boxes[a:b], "<f8").tobytes())
            h.update(np.ascontiguousarray(self.box_labels[a:b], "<i8").tobytes())
            h.update(np.ascontiguousarray(self.box_crowd[a:b], "|u1").tobytes())
            rows.append((rel, h.hexdigest(), *self.sizes[i].tolist()))
        return task_fingerprint(head, rows)


def fields_for(image: ImageSettings, num_classes: int, max_boxes: int) -> dict[str, BoxesField]:
    """The manifest's boxes fields, one per image field ("boxes", or "boxes@R" beside "image@R")."""
    return {boxes_key(k): BoxesField.for_classes(num_classes, f.suffix, max_boxes) for k, f in image_fields(image).items()}


# How COCO boxes meet an EXIF orientation (bumped when the rule changes, so resumed shards are rebuilt)
EXIF_RULE = "coco-boxes-on-stored-pixels"


def source_orientation(levels) -> int:
    """The EXIF orientation (1-8) the decoder turned a source upright by (images/decode.py), as
    process_levels records it on every size."""
    return levels[0].orientation


def _on_source(task: DetectionShardTask, i: int, source_hw: tuple[int, int], where: str, orientation: int = 1) -> tuple[np.ndarray, bool]:
    """Image i's boxes in its decoded, upright pixels (not yet clipped), and whether they were turned with an
    EXIF orientation. YOLO's fractions are of the upright image (Ultralytics decodes with OpenCV, which applies
    EXIF). COCO's pixels are of the stored grid (torchvision's CocoDetection reads pixels with PIL, no EXIF
    turn, and the file's width and height are the stored ones): they are turned as the decoder turned the
    pixels, unless the file's width and height are the upright ones and not the stored (a rotation by 90
    degrees of a non-square image: the tool that wrote them had turned the image first)."""
    a, b = int(task.box_offsets[i]), int(task.box_offsets[i + 1])
    h, w = source_hw
    got = task.boxes[a:b].astype(np.float64)
    if task.normalized:
        return geometry.affine(got, w, 0.0, h, 0.0), False
    rh, rw = (w, h) if orientation >= 5 else (h, w)  # the stored grid
    dh, dw = (int(v) for v in task.sizes[i])

    def fits(hh: int, ww: int) -> bool:
        return (dh <= 0 or dh == hh) and (dw <= 0 or dw == ww)

    if fits(rh, rw):
        return (geometry.from_stored(got, orientation, rh, rw), True) if orientation != 1 else (got, False)
    if fits(h, w):
        return got, False
    stored = f" (stored {rw}x{rh}, EXIF orientation {orientation})" if orientation != 1 else ""
    raise ImageDecodeError(where, "size mismatch", f"the annotations say {dw}x{dh}, the image decodes to {w}x{h}{stored}")


def build_detection_shard(task: DetectionShardTask, samples=None) -> dict[str, Any]:
    """Process one shard's images and boxes and write the shard; return its record (`reused` when a resumed
    build found it finished and intact)."""
    from ..images.process import process_levels, stored_digest

    fp = task.fingerprint()
    rec = reused_shard(task, fp)
    if rec is not None:
        return rec
    if samples is None:
        samples = task.reader.open(task.root, task.paths, [None] * len(task.paths))
    img_fields = list(image_fields(task.image).values())
    box_fields = list(fields_for(task.image, task.num_classes, 0).values())
    levels = len(img_fields)
    pixels, shapes = [[] for _ in range(levels)], [[] for _ in range(levels)]
    kept_boxes, kept_labels, kept_crowd, frames = ([[] for _ in range(levels)] for _ in range(4))
    sources, skipped = [], []
    phashes: list[int] = []
    digests: list[bytes] = []
    counts: Counter = Counter()
    kept = source_bytes = 0
    files = isinstance(task.reader, FileReader)
    for i, (rel, data) in enumerate(zip(task.paths, samples, strict=True)):
        where = os.path.join(task.root, rel) if files else rel
        try:
            listed = int(task.box_offsets[i + 1] - task.box_offsets[i])
            if listed > task.max_boxes:  # before decoding: the image is not stored with some of its boxes left out
                raise ImageDecodeError(where, "too many boxes", f"{listed:,} boxes, over the cap of {task.max_boxes:,} on one image "
                                       "(--max-boxes)")
            if isinstance(data, ImageDecodeError):
                raise data
            if data is None:
                data = read_source(where)
            done = process_levels(where, task.image, data, task.fingerprints)
            orientation = 1 if task.normalized else source_orientation(done)
            on_source, turned = _on_source(task, i, done[0].geometry.source, where, orientation)
        except ImageDecodeError as e:
            if task.strict:
                raise ImageDecodeError(where, e.reason, e.detail) from None
            skipped.append({"source": rel, "reason": e.reason, "detail": e.detail})
            continue
        a, b = int(task.box_offsets[i]), int(task.box_offsets[i + 1])
        labels, crowd = task.box_labels[a:b], task.box_crowd[a:b]
        sh, sw = done[0].geometry.source
        ok = geometry.stored_positive(geometry.clip(on_source, sh, sw))
        counts["degenerate"] += int((~ok).sum())
        on_source, labels, crowd = on_source[ok], labels[ok], crowd[ok]
        for k, (p, size) in enumerate(zip(done, task.image.all_sizes)):
            oh, ow = p.geometry.out
            moved = geometry.clip(geometry.through_resize(on_source, p.geometry), oh, ow)
            inside = geometry.stored_positive(moved)
            counts[f"cut_off@{size}"] += int((~inside).sum())
            counts[f"stored@{size}"] += int(inside.sum())
            pixels[k].append(p.data)
            shapes[k].append(p.shape)
            kept_boxes[k].append(moved[inside])
            kept_labels[k].append(labels[inside])
            kept_crowd[k].append(crowd[inside])
            frames[k].append((p.shape[0], p.shape[1]))
        sources.append(rel)
        counts["exif_turned"] += turned
        if task.fingerprints:
            phashes.append(done[0].phash)
            digests.append(stored_digest(done[0]))
        kept += done[0].kept
        source_bytes += done[0].source_bytes
    arrays: dict[str, np.ndarray] = {}
    for k, (fi, fb) in enumerate(zip(img_fields, box_fields)):
        arrays.update(fi.shard_arrays(pixels[k], shapes[k]))
        arrays.update(fb.shard_arrays(kept_boxes[k], kept_labels[k], kept_crowd[k], frames[k]))
    arrays.update(StringsField().shard_arrays(sources))
    if task.fingerprints:
        arrays.update(audit_arrays(phashes, digests))
    return finish_shard(task, fp, arrays, len(sources), skipped, kept, source_bytes, counts)


def _notes(counts: Counter, image: ImageSettings, written: int) -> list[str]:
    """The summary's lines about a split's boxes."""
    size = image.all_sizes[0]
    out = [f"{counts[f'stored@{size}']:,} boxes stored over {written:,} images"
           + (f" (at {size} px; " + ", ".join(f"{counts[f'stored@{s}']:,} at {s} px" for s in image.all_sizes[1:]) + ")" if image.multires else "")]
    if counts["degenerate"]:
        out.append(f"{counts['degenerate']:,} degenerate boxes (no area inside their image once clipped to it) skipped")
    if counts["exif_turned"]:
        out.append(f"{counts['exif_turned']:,} images with an EXIF orientation: their boxes (on the stored pixels, as COCO's) "
                   "turned upright with them")
    cut = {s: counts[f"cut_off@{s}"] for s in image.all_sizes if counts[f"cut_off@{s}"]}
    if cut:
        out.append("boxes cut away by --resize " + image.resize + ": " + ", ".join(f"{n:,} at {s} px" for s, n in cut.items()))
    return out


def _stored_most(out: Path, entries: dict[str, Any], fields: dict[str, BoxesField]) -> dict[str, dict[str, int]]:
    """Per boxes field and split, the most boxes a stored sample holds, from the written shards' offsets."""
    most: dict[str, dict[str, int]] = {k: {} for k in fields}
    for split, entry in entries.items():
        for k, f in fields.items():
            top = 0
            for rec in entry["shards"]:
                offsets = np.load(out / split / rec["name"] / f"{f.name('box_offsets')}.npy", mmap_mode="r")
                top = max(top, int(np.diff(offsets).max(initial=0)))
            most[k][split] = top
    return most


def build_detection(
    source: Source,
    out: str | os.PathLike,
    settings: BuildSettings,
    image: ImageSettings,
    progress: Callable[[int], None] | None = None,
    engine=None,
    max_boxes: int = MAX_BOXES,
) -> BuildSummary:
    """Build a detection pack from `source` into `out`: the images, their boxes moved with them.

    Args:
        source: A listing whose splits are `sources.coco.BoxSplit`s (the COCO and YOLO scans give it).
        out: The pack's folder.
        settings: The shard layout and how strict the build is (workers, limit, shard_size, ...).
        image: The image stages: size, mode, quality, ...
        progress: Told `progress(n)` of n more samples done; None for no progress.
        engine: Runs the shards; None is a local pool of settings.workers processes.
        max_boxes: An image listing more boxes is skipped ("too many boxes").

    Returns:
        The build's summary: splits, counts, skipped files and their reasons.
    """
    out = Path(out)
    num_classes = len(source.classes)
    fingerprints = image_build.FINGERPRINTS
    prepare_output(out, settings.overwrite, settings.resume)
    splits = [s.limited(settings.limit) for s in source.splits]

    def make_task(split, k: int, start: int, stop: int) -> DetectionShardTask:
        a, b = int(split.box_offsets[start]), int(split.box_offsets[stop])
        return DetectionShardTask(str(source.root), str(out / split.name), k, tuple(split.paths[start:stop]), split.boxes[a:b],
                                  split.box_offsets[start : stop + 1] - a, split.box_labels[a:b], split.box_crowd[a:b],
                                  split.sizes[start:stop], split.normalized, num_classes, image, settings.strict, settings.resume,
                                  capped(split.reader, settings.max_bytes), fingerprints, max_boxes)

    summaries, entries, seconds = build_shards(out, settings, splits, make_task, build_detection_shard, progress, engine)
    most = _stored_most(out, entries, fields_for(image, num_classes, 0))
    for summ in summaries:
        c = summ.counts
        entries[summ.name]["boxes"] = {"stored": c[f"stored@{image.size}"], "degenerate": c["degenerate"],
                                       "cut_off": c[f"cut_off@{image.size}"],
                                       **({"by_size": {str(s): {"stored": c[f"stored@{s}"], "cut_off": c[f"cut_off@{s}"]}
                                                       for s in image.all_sizes}} if image.multires else {})}
        entries[summ.name]["max_boxes"] = max((m[summ.name] for m in most.values()), default=0)
        summ.notes += _notes(c, image, summ.written)
    write_manifest(out, {
        **pack_header("detection", settings, {"layout": source.layout, "root": str(source.root.resolve()), **source.details}, seconds,
                      {"image": image.to_dict(), "max_boxes": max_boxes}),
        "classes": list(source.classes),
        "class_names": source.class_names,
        **({"resolutions": sorted(image.all_sizes)} if image.multires else {}),
        "fields": {
            **{k: f.to_manifest() for k, f in image_fields(image).items()},
            **{k: BoxesField.for_classes(num_classes, f.suffix, max(most[k].values(), default=0)).to_manifest()
               for k, f in fields_for(image, num_classes, 0).items()},
            "source": StringsField().to_manifest(),
            **audit_fields_manifest(fingerprints),
        },
        "splits": entries,
        **({"audit": audit_record()} if fingerprints else {}),
    })
    return BuildSummary(out, summaries, seconds)
