"""Image build: takes a listed source (class folders, ImageNet) and the image settings, gives a pack of kind
"images": one task per shard on the engine, each image decoded once and stored at every size, labels (none
when the source has no classes: an unlabelled pack, `classes` empty), source paths and captions (when the
source has them) beside it; the kind-free driver in build.py does the rest. With a tokenizer (--tokenize),
each shard also encodes its captions through dataprep/text.py (what token packs use) into token ids plus
offsets (field caption_tokens), and the tokenizer file is copied beside the manifest.

Sources smaller than a size are counted per split and size in the manifest (`"undersized": {"256":
{"kept": n, "upscaled": m}}`): `kept` at their own size (center-crop pads them with black, pad frames
them on every side, shorter / longer store them smaller), or `upscaled` to the size with --upscale. The
summary names the padded ones (center-crop, pad: black pixels in every stored sample) and suggests
--upscale; with shorter / longer a small image stays small by design, so only the manifest counts it.
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from ..driver import BuildSummary, SplitSummary, build_shards, finish_shard, pack_header, prepare_output, reused_shard, task_fingerprint
from ..engine import Engine
from ..errors import DataprepError, ImageDecodeError
from ..pack.fields import LabelField, StringsField
from ..pack.manifest import attachment_record, write_attachment, write_manifest
from ..settings import BuildSettings
from ..sources import FILES, FileReader, Source
from ..sources.listing import capped
from ..text import TOKENIZER_FILE
from . import resize
from .captions import CaptionTokenizer, caption_tokenizer
from .field import CAPTION, DIGEST, PHASH, ImageField
from .settings import ImageSettings


@dataclass(frozen=True)
class ShardTask:
    """Everything one worker needs to make one shard: a pure function of these fields."""

    root: str
    split_dir: str
    index: int
    paths: tuple[str, ...]
    labels: np.ndarray
    label_dtype: str | None  # None: unlabelled (the source has no classes), no labels stored
    image: ImageSettings
    strict: bool
    resume: bool = False
    captions: tuple[str, ...] | None = None
    reader: Any = FILES  # how the samples' bytes are read (sources/listing.py); files under root by default
    locators: tuple[Any, ...] = ()  # the reader's per-sample locators (members, rows); none for files
    tokenizer: CaptionTokenizer | None = None  # --tokenize: captions also stored as token ids
    fingerprints: bool = True  # the audit's fields (phash, digest) stored beside the images

    def fingerprint(self) -> str:
        """A digest of everything the shard's bytes depend on (its inputs, their order, the settings)."""
        head = [self.index, self.image.to_dict(), self.label_dtype, self.strict]
        if self.fingerprints:  # a shard an older dataprep wrote has no hashes: rebuilt, never reused without them
            head.append(audit_record())
        if self.tokenizer is not None:  # packs without tokenized captions keep their digests
            head.append(["tokenizer", self.tokenizer.sha256, self.tokenizer.dtype, self.tokenizer.pad_id, self.tokenizer.special_tokens])
        if self.captions is not None or self.locators:  # packs of files and no captions keep their digests
            head.append(type(self.reader).__name__)
            if self.locators:  # a tar or table rewritten with the same layout (a regenerated export) is new input
                head.append(_container_stamps(self.root, self.locators))
            rows = zip(self.paths, self.labels.tolist(), self.captions or [""] * len(self.paths),
                       self.locators or [""] * len(self.paths))
        else:
            rows = zip(self.paths, self.labels.tolist())
        return task_fingerprint(head, rows)


def _container_stamps(root: str, locators) -> list:
    """(name, bytes, mtime in ns) of each container file a shard's samples come from: a locator's first
    item names its container relative to the root (a tar, a Parquet or Arrow file)."""
    out = []
    for name in sorted({str(loc[0]) for loc in locators}):
        try:
            st = os.stat(os.path.join(root, name))
            out.append([name, st.st_size, st.st_mtime_ns])
        except OSError:
            out.append([name, -1, -1])  # gone: the shard cannot be rebuilt either, and reading it says why
    return out


def build_image_shard(task: ShardTask, samples: Iterator[bytes | ImageDecodeError] | None = None) -> dict[str, Any]:
    """Process one shard's images and write the shard; return its record (`reused` when a resumed
    build found it finished and intact). `samples`: the shard's part of a unit's stream (build.run_unit),
    else the task opens its reader itself."""
    fp = task.fingerprint()
    rec = reused_shard(task, fp)
    if rec is not None:
        return rec
    if samples is None:
        samples = task.reader.open(task.root, task.paths, task.locators or [None] * len(task.paths))
    fields = image_fields(task.image)
    levels: list[list] = [[] for _ in fields]
    shapes: list[list] = [[] for _ in fields]
    labels, sources, captions, skipped = [], [], [], []
    phashes: list[int] = []
    digests: list[bytes] = []
    kept = source_bytes = 0
    counts: Counter = Counter()
    files = isinstance(task.reader, FileReader)
    for i, (rel, label, data) in enumerate(zip(task.paths, task.labels, samples, strict=True)):  # a short reader: an error
        where = os.path.join(task.root, rel) if files else rel  # what an error names: a path, or shard.tar:key
        try:
            if isinstance(data, ImageDecodeError):
                raise data
            done = _process(where, task.image, data, task.fingerprints)
        except ImageDecodeError as e:
            if task.strict:
                raise ImageDecodeError(where, e.reason, e.detail) from None
            skipped.append({"source": rel, "reason": e.reason, "detail": e.detail})
            continue  # skipped at one size is skipped at all: the sizes come from one decode
        for k, (p, size) in enumerate(zip(done, task.image.all_sizes)):
            levels[k].append(p.data)
            shapes[k].append(p.shape)
            counts[f"undersized@{size}"] += resize.undersized(p.geometry, size, task.image.resize)
            counts[f"upscaled@{size}"] += p.geometry.upscaled
        labels.append(label)
        sources.append(rel)
        if task.fingerprints:
            phashes.append(done[0].phash)
            digests.append(_digest(done[0]))
        if task.captions is not None:
            captions.append(task.captions[i])  # i: the sample (k counts sizes above)
        kept += done[0].kept
        source_bytes += done[0].source_bytes
    arrays = {}
    for k, f in enumerate(fields.values()):
        arrays.update(f.shard_arrays(levels[k], shapes[k]))
    if task.label_dtype is not None:
        arrays.update(LabelField(dtype=task.label_dtype).shard_arrays(labels))
    arrays.update(StringsField().shard_arrays(sources))
    if task.fingerprints:
        arrays.update(audit_arrays(phashes, digests))
    if task.captions is not None:
        arrays.update(CAPTION.shard_arrays(captions))
        if task.tokenizer is not None:
            arrays.update(task.tokenizer.tokens_field.shard_arrays(*task.tokenizer.encode(captions, task.split_dir)))
    return finish_shard(task, fp, arrays, len(labels), skipped, kept, source_bytes, counts)


def undersized_notes(summ: SplitSummary, image: ImageSettings) -> list[str]:
    """The summary's lines about a split's sources smaller than a size: padded ones (with the remedy),
    and enlarged ones."""
    out = []
    pads = resize.RESIZE_MODES[image.resize].square
    for size in image.all_sizes:
        at = f"at {size} px: " if image.multires else ""
        kept, up = summ.counts[f"undersized@{size}"], summ.counts[f"upscaled@{size}"]
        if kept and pads:
            how = ("on the shorter side and padded with black" if image.resize == "center-crop"
                   else "on both sides and padded on every side")
            out.append(f"{at}{kept} of {summ.written} images were smaller than {size} px {how} to {size}x{size}; "
                       "pass --upscale to enlarge them instead")
        if up:
            out.append(f"{at}{up} of {summ.written} images were smaller than {size} px and enlarged to it (--upscale)")
    return out


def _process(path: str, settings: ImageSettings, data: bytes | None = None, fingerprint: bool = False):
    from .process import process_levels

    return process_levels(path, settings, data, fingerprint)


def _digest(done) -> bytes:
    from .process import stored_digest

    return stored_digest(done)


# Whether builds store the audit's fields. Only benchmarks/bench_audit.py turns it off, to measure what the
# hashes cost a build; a pack built without them is one built before them (hashed on the fly by an audit).
FINGERPRINTS = True


def audit_record() -> dict[str, Any]:
    """The manifest's "audit" entry: which hash and digest the pack's phash and digest fields hold."""
    from ..audit.hashes import DIGEST_NAME, HASH_NAME

    return {"hash": HASH_NAME, "digest": DIGEST_NAME}


def audit_arrays(phashes: list[int], digests: list[bytes]) -> dict[str, np.ndarray]:
    """A shard's phash and digest arrays: (n,) uint64 little-endian, (n, 16) uint8."""
    return {PHASH.name: np.asarray(phashes, np.uint64).astype("<u8"),
            DIGEST.name: np.frombuffer(b"".join(digests), np.uint8).reshape(len(digests), 16).copy()}


def audit_fields_manifest(fingerprints: bool) -> dict[str, Any]:
    """The manifest's descriptions of the audit's fields (none without fingerprints)."""
    return {"phash": PHASH.to_manifest(), "digest": DIGEST.to_manifest()} if fingerprints else {}


def audit_manifest(out: Path, fingerprints: bool, drop_duplicates: bool, summaries, split_entries, fields) -> dict[str, Any]:
    """The manifest's "audit" entry (none without fingerprints); with `drop_duplicates`, the shards are first
    rewritten without the samples the audit's drop rule names, and the entry says what left
    (dataprep/audit/drop.py)."""
    if not fingerprints:
        return {}
    entry = audit_record()
    if drop_duplicates:
        from ..audit.drop import drop_duplicates as drop

        entry["drop_duplicates"] = drop(out, summaries, split_entries, fields)
    return {"audit": entry}


def image_fields(image: ImageSettings) -> dict[str, ImageField]:
    """The manifest's image fields: "image", or "image@R" for every resolution of a multi-resolution build."""
    enc = "raw" if image.mode == "raw" else "jpeg"
    if not image.multires:
        return {"image": ImageField(enc, image.fixed_shape(), image.channels, dtype=image.dtype)}
    return {f"image@{s}": ImageField(enc, image.fixed_shape(s), image.channels, f"_r{s}", image.dtype) for s in image.all_sizes}


def build_images(
    source: Source,
    out: str | os.PathLike,
    settings: BuildSettings,
    image: ImageSettings,
    progress: Callable[[int], None] | None = None,
    engine: Engine | None = None,
    tokenizer: str | os.PathLike | None = None,
    drop_duplicates: bool = False,
) -> BuildSummary:
    """Build an image pack from `source` into `out`.

    Args:
        source: The listing of the images, by split (dataprep.sources' scans give it).
        out: The pack's folder.
        settings: The shard layout and how strict the build is (workers, limit, shard_size, ...).
        image: The image stages: size, mode (raw or encoded), quality, ...
        progress: Told `progress(n)` of n more samples done; None for no progress.
        engine: Runs the shards; None is a local pool of settings.workers processes.
        tokenizer: A tokenizers JSON file. Captions are then also stored as its token ids (field
            caption_tokens), and the file is copied beside the manifest.
        drop_duplicates: Leave out the samples that the audit's drop rule names (dataprep/audit/drop.py).

    Returns:
        The build's summary: splits, counts, skipped files and their reasons.
    """
    out = Path(out)
    fingerprints = FINGERPRINTS
    if drop_duplicates and not fingerprints:
        raise DataprepError("--drop-duplicates needs the audit's hashes, and this build stores none")
    label = LabelField.for_classes(len(source.classes))
    tok = tok_bytes = tok_record = None
    if tokenizer is not None:
        if all(sp.captions is None for sp in source.splits):
            raise DataprepError(f"--tokenize {tokenizer}: the source has no captions to tokenize")
        tok, tok_bytes, tok_record = caption_tokenizer(tokenizer)  # read before --overwrite empties `out`, which may hold it
    # build_shards does too; the old manifest must go first, and a previous pack's tokenizer copy with it
    prepare_output(out, settings.overwrite, settings.resume)

    def make_task(split, k: int, start: int, stop: int) -> ShardTask:
        return ShardTask(str(source.root), str(out / split.name), k, tuple(split.paths[start:stop]),
                         split.labels[start:stop], label.dtype if source.classes else None, image, settings.strict, settings.resume,
                         None if split.captions is None else tuple(split.captions[start:stop]), capped(split.reader, settings.max_bytes),
                         () if split.locators is None else tuple(split.locators[start:stop]), tok, fingerprints)

    splits = [s.limited(settings.limit) for s in source.splits]
    summaries, split_entries, seconds = build_shards(out, settings, splits, make_task, build_image_shard, progress, engine)
    for summ in summaries:
        split_entries[summ.name]["undersized"] = {
            str(size): {"kept": summ.counts[f"undersized@{size}"], "upscaled": summ.counts[f"upscaled@{size}"]}
            for size in image.all_sizes}
        summ.notes += undersized_notes(summ, image)
    fields = {
        **{k: f.to_manifest() for k, f in image_fields(image).items()},
        **({"label": label.to_manifest()} if source.classes else {}),  # unlabelled: no classes, no labels
        "source": StringsField().to_manifest(),
        **({"caption": CAPTION.to_manifest()} if any(sp.captions is not None for sp in splits) else {}),
        **({"caption_tokens": tok.tokens_field.to_manifest()} if tok is not None else {}),
        **audit_fields_manifest(fingerprints),
    }
    audit_entry = audit_manifest(out, fingerprints, drop_duplicates, summaries, split_entries, fields)
    if tok is not None:  # written last but for the manifest, as token packs do (atomically; a full disk says what to do)
        write_attachment(out, TOKENIZER_FILE, tok_bytes)
    write_manifest(
        out,
        {
            **pack_header("images", settings, {"layout": source.layout, "root": str(source.root.resolve()),
                                               **({"val_labels": str(source.val_labels.resolve())} if source.val_labels else {}),
                                               **source.details},
                          seconds,
                          {"image": image.to_dict()}),
            "classes": source.classes,
            "class_names": source.class_names,
            **({"resolutions": sorted(image.all_sizes)} if image.multires else {}),
            "fields": fields,
            "splits": split_entries,
            **audit_entry,
            **({"tokenizer": tok_record, "attachments": {TOKENIZER_FILE: attachment_record(tok_bytes)}} if tok is not None else {}),
        },
    )
    return BuildSummary(out, summaries, seconds)
