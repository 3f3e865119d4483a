"""Segmentation build: takes image/mask pairs, image settings and mask settings, gives a pack of kind
"segmentation": images (JPEG or raw, as for classification) and masks (raw uint8/uint16, resized
nearest-neighbour with the image's own geometry), sample for sample, in shards.

Each image is decoded once; its geometry (scale, crop, pad) is planned from the image and applied to
the mask, which must have the image's upright size. A pair that cannot be used is skipped with a
reason ("size mismatch", "label out of range", the mask's or the image's decode error), or stops
the build under `strict`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..driver import BuildSummary, build_shards, finish_shard, pack_header, reused_shard, task_fingerprint
from ..engine import LocalEngine
from ..errors import ImageDecodeError, SourceError
from ..images import build as image_build
from ..images.build import audit_arrays, audit_fields_manifest, audit_manifest, audit_record, image_fields
from ..images.settings import ImageSettings
from ..pack.fields import StringsField
from ..pack.manifest import write_manifest
from ..settings import BuildSettings
from ..sources.listing import read_source
from .field import MASK_SOURCES, MaskField, mask_key
from .masks import LabelMap, MaskSettings, check_values, decode_mask, resize_mask
from .pairs import PairSource


@dataclass(frozen=True)
class PairShardTask:
    image_root: str
    mask_root: str
    split_dir: str
    index: int
    images: tuple[str, ...]
    masks: tuple[str, ...]
    image: ImageSettings
    mask: MaskSettings
    strict: bool
    resume: bool = False
    fingerprints: bool = True  # the audit's fields (phash, digest) stored beside the images

    def fingerprint(self) -> str:
        head = ["segmentation", self.index, self.image.to_dict(), self.mask.to_dict(), self.strict]
        if self.fingerprints:  # a shard an older dataprep wrote has no hashes: rebuilt, never reused without them
            head.append(audit_record())
        return task_fingerprint(head, zip(self.images, self.masks))


def mask_fields(mask: MaskSettings, image: ImageSettings, ignore: int | None = None) -> dict[str, MaskField]:
    """The manifest's mask fields, one per image field ("mask", or "mask@R" beside "image@R")."""
    out = {}
    for key, f in image_fields(image).items():
        shape = f.shape[:2] + (1,) if f.shape else None
        out[mask_key(key)] = MaskField("raw", shape, 1, f.suffix, mask.dtype, "mask", mask.pad_value, ignore, mask.num_classes)
    return out


def process_pair(image_path: str, mask_path: str, image: ImageSettings, mask: MaskSettings, fingerprint: bool = False):
    """One pair into what the pack stores at every size (largest first): [(the image's Processed, the mask
    HxW in the stored dtype)], each mask taken from the full-size mask through that size's geometry,
    planned from the image."""
    from ..images.process import process_levels

    ids = decode_mask(read_source(mask_path), mask_path, mask.labels.colors if mask.labels else None)
    levels = process_levels(image_path, image, fingerprint=fingerprint)
    src = levels[0].geometry.source
    if ids.shape != src:
        raise ImageDecodeError(mask_path, "size mismatch",
                               f"mask is {ids.shape[1]}x{ids.shape[0]}, image {src[1]}x{src[0]} ({os.path.basename(image_path)})")
    stored = check_values(ids, mask, mask_path)
    return [(done, resize_mask(stored, done.geometry, mask.pad_value)) for done in levels]


def build_pair_shard(task: PairShardTask) -> dict[str, Any]:
    fp = task.fingerprint()
    rec = reused_shard(task, fp)
    if rec is not None:
        return rec
    img_fields = list(image_fields(task.image).values())
    msk_fields = list(mask_fields(task.mask, task.image).values())
    images, shapes, masks, mshapes = ([[] for _ in img_fields] for _ in range(4))
    sources, msources, skipped = [], [], []
    phashes: list[int] = []
    digests: list[bytes] = []
    kept = source_bytes = 0
    for rel, mrel in zip(task.images, task.masks):
        ipath, mpath = os.path.join(task.image_root, rel), os.path.join(task.mask_root, mrel)
        try:
            levels = process_pair(ipath, mpath, task.image, task.mask, task.fingerprints)
        except ImageDecodeError as e:
            if task.strict:
                raise
            name = os.path.basename(e.path)
            skipped.append({"source": rel, "reason": e.reason, "detail": f"{name}: {e.detail}" if e.detail else name})
            continue
        for k, (done, m) in enumerate(levels):
            images[k].append(done.data)
            shapes[k].append(done.shape)
            masks[k].append(m[:, :, None])  # (H, W, 1): the field's shapes are three ints, as for images
            mshapes[k].append((m.shape[0], m.shape[1], 1))
        sources.append(rel)
        msources.append(mrel)
        if task.fingerprints:
            phashes.append(levels[0][0].phash)
            digests.append(image_build._digest(levels[0][0]))
        kept += levels[0][0].kept
        source_bytes += levels[0][0].source_bytes
    arrays = {}
    for k, (fi, fm) in enumerate(zip(img_fields, msk_fields)):
        arrays.update(fi.shard_arrays(images[k], shapes[k]))
        arrays.update(fm.shard_arrays(masks[k], mshapes[k]))
    arrays.update({**StringsField().shard_arrays(sources), **MASK_SOURCES.shard_arrays(msources)})
    if task.fingerprints:
        arrays.update(audit_arrays(phashes, digests))
    n = len(sources)
    return finish_shard(task, fp, arrays, n, skipped, kept, source_bytes)


def _header_depth(path: str) -> int:
    """Bits per value of a mask file from its header alone: 16 for 16-bit PNG/TIFF, else 8."""
    from PIL import Image

    try:
        with open(path, "rb") as f:
            head = f.read(32)
        if head.startswith(b"\x89PNG"):
            return 16 if len(head) > 24 and head[24] == 16 else 8
        with Image.open(path) as im:
            return 16 if im.mode.startswith("I") else 8
    except Exception:
        return 8  # unreadable: the build reports it with its reason


def _max_values(paths: list[str]) -> int:
    top = 0
    for p in paths:
        try:
            top = max(top, int(decode_mask(read_source(p), p).max(initial=0)))
        except ImageDecodeError:
            pass  # reported by the build
    return top


def choose_mask_dtype(source: PairSource, labels: LabelMap | None, asked: str | None, engine) -> tuple[str, dict]:
    """The masks' stored dtype and how it was chosen: asked for; from the label map's largest output; 8
    bits when every mask file is 8-bit (headers only); else the largest value of the 16-bit masks (decoded)."""
    if asked:
        return asked, {"chosen_by": "--mask-dtype"}
    if labels is not None:
        top = labels.max_value
        return ("|u1" if top <= 255 else "<u2"), {"chosen_by": "label map", "max_value": top}
    masks = [os.path.join(source.mask_root, m) for s in source.splits for m in s.masks]
    deep = [p for p in masks if _header_depth(p) == 16]
    if not deep:
        return "|u1", {"chosen_by": "8-bit mask files"}
    chunks = [deep[i : i + 64] for i in range(0, len(deep), 64)]
    top = max(engine.map(_max_values, chunks), default=0)
    return ("|u1" if top <= 255 else "<u2"), {"chosen_by": f"values of {len(deep)} 16-bit mask files", "max_value": top}


def build_segmentation(
    source: PairSource,
    out: str | os.PathLike,
    settings: BuildSettings,
    image: ImageSettings,
    labels: LabelMap | None = None,
    mask_dtype: str | None = None,
    num_classes: int | None = None,
    progress: Callable[[int], None] | None = None,
    engine=None,
    drop_duplicates: bool = False,
) -> BuildSummary:
    """Build a segmentation pack from image/mask pairs.

    Args:
        source: The pairs, by split (segmentation/pairs.py gives them).
        out: The pack's folder.
        settings: The shard layout and how strict the build is (workers, limit, shard_size, ...).
        image: The image stages; masks are resized nearest to the images' sizes.
        labels: A label map (ids to stored ids, the ignore value, class names); None keeps the masks' values.
        mask_dtype: "uint8" or "uint16"; None chooses uint8 unless a mask holds values above 255.
        num_classes: Mask values at or above it (but the ignore value) are out of range; None takes it
            from the label map.
        progress: Told `progress(n)` of n more samples done; None for no progress.
        engine: Runs the shards; None is a local pool of settings.workers processes.
        drop_duplicates: Leave out the pairs whose image the audit's drop rule names (dataprep/audit/drop.py).

    Returns:
        The build's summary: splits, counts, skipped files and their reasons.
    """
    out = Path(out)
    fingerprints = image_build.FINGERPRINTS
    unpaired = [u for s in source.splits for u in s.unpaired]
    if settings.strict and unpaired:
        u = unpaired[0]
        raise SourceError(f"{u['source']}: {u['reason']} ({u['detail']}); {len(unpaired)} file(s) have no partner "
                          "(without --strict they are skipped and listed)")
    splits = [s.limited(settings.limit) for s in source.splits]
    limited = PairSource(source.layout, source.root, source.mask_root, splits)
    engine = engine or LocalEngine(settings.workers)
    dtype, how = choose_mask_dtype(limited, labels, {"uint8": "|u1", "uint16": "<u2"}.get(mask_dtype or ""), engine)
    if num_classes is None and labels is not None and labels.classes:
        num_classes = len(labels.classes)
    pad = labels.ignore if labels is not None and labels.ignore is not None else 0
    mask = MaskSettings(dtype, pad, num_classes, labels)

    def make_task(split, k: int, start: int, stop: int) -> PairShardTask:
        return PairShardTask(str(source.root), str(source.mask_root), str(out / split.name), k, tuple(split.paths[start:stop]),
                             tuple(split.masks[start:stop]), image, mask, settings.strict, settings.resume, fingerprints)

    summaries, entries, seconds = build_shards(out, settings, splits, make_task, build_pair_shard, progress, engine)
    fields = {
        **{k: f.to_manifest() for k, f in image_fields(image).items()},
        **{k: f.to_manifest() for k, f in mask_fields(mask, image, labels.ignore if labels else None).items()},
        "source": StringsField().to_manifest(),
        "mask_source": MASK_SOURCES.to_manifest(),
        **audit_fields_manifest(fingerprints),
    }
    audit_entry = audit_manifest(out, fingerprints, drop_duplicates, summaries, entries, fields)
    write_manifest(out, {
        **pack_header("segmentation", settings, {"layout": source.layout, "root": str(source.root.resolve()),
                                                 "mask_root": str(source.mask_root.resolve())}, seconds,
                      {"image": image.to_dict()}),
        "mask": {**mask.to_dict(), **how},
        "classes": list(labels.classes) if labels is not None and labels.classes else None,
        **({"resolutions": sorted(image.all_sizes)} if image.multires else {}),
        "fields": fields,
        "splits": entries,
        **audit_entry,
    })
    return BuildSummary(out, summaries, seconds, "pairs")
