"""Volume build: takes a listed source of .npy / TIFF volumes and the volume settings, gives a pack of kind
"volumes": uint8 or uint16 voxels with every volume's (D, H, W) (one (N, D, H, W) array when a target
shape is given), labels when the source has class folders, source paths; in shards, manifest last.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..driver import BuildSummary, build_shards, finish_shard, pack_header, reused_shard, task_fingerprint
from ..errors import DataprepError, ImageDecodeError, SourceError
from ..images.field import ImageField
from ..pack.fields import LabelField, StringsField
from ..pack.manifest import write_manifest
from ..settings import BuildSettings
from ..sources import Source, spread, spread_by_class
from .field import volume_field
from .read import read_volume, to_stored
from .resample import RESAMPLE_MODES, resample


@dataclass(frozen=True)
class VolumeSettings:
    """How each source volume becomes a stored sample; all of it is recorded in the manifest."""

    shape: tuple[int, int, int] | None = None  # resample every volume to (D, H, W)
    depth: int = 16
    window: tuple[float, float] | None = None  # source values mapped linearly onto the stored range
    resample: str = "linear"

    def __post_init__(self) -> None:
        if self.depth not in (8, 16):
            raise DataprepError(f"depth must be 8 or 16 bits, got {self.depth}")
        if self.shape is not None and (len(self.shape) != 3 or any(int(s) < 1 for s in self.shape)):
            raise DataprepError(f"shape must be three positive sizes (D, H, W), got {self.shape}")
        if self.window is not None and not float(self.window[0]) < float(self.window[1]):
            raise DataprepError(f"window needs LO < HI, got {self.window}")
        if self.resample not in RESAMPLE_MODES:
            raise DataprepError(f"unknown resample mode {self.resample!r}; choose one of {list(RESAMPLE_MODES)}")

    @property
    def dtype(self) -> str:
        return "<u2" if self.depth == 16 else "|u1"

    def field(self) -> ImageField:
        return volume_field(self.shape, self.dtype)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class VolumeShardTask:
    root: str
    split_dir: str
    index: int
    paths: tuple[str, ...]
    labels: np.ndarray
    label_dtype: str | None
    volume: VolumeSettings
    strict: bool
    resume: bool = False
    mask_root: str | None = None  # label volumes, paired with `paths` by `masks`
    masks: tuple[str, ...] = ()
    mask_dtype: str | None = None
    max_bytes: int | None = None  # the cap on one volume file's bytes (None: limits.VOLUME_MAX_BYTES)

    def fingerprint(self) -> str:
        return task_fingerprint(["volumes", self.index, self.volume.to_dict(), self.label_dtype, self.strict, self.mask_dtype],
                                zip(self.paths, self.labels.tolist(), self.masks or [""] * len(self.paths)))


def process_volume(path: str, settings: VolumeSettings, mask_path: str | None = None,
                   mask_dtype: str | None = None, max_bytes: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """A volume in the stored dtype and shape, and its label volume (same source shape, values kept,
    resampled nearest) when `mask_path` is given. `max_bytes`: the cap on each file's bytes (read_volume)."""
    src = read_volume(path, max_bytes)
    vol = to_stored(src, settings.depth, settings.window, path)
    vol = resample(vol, settings.shape, settings.resample) if settings.shape else vol
    if mask_path is None:
        return vol, None
    m = read_volume(mask_path, max_bytes)
    if m.shape != src.shape:
        raise ImageDecodeError(mask_path, "size mismatch", f"label volume is {m.shape}, the volume {src.shape}")
    if not (m.dtype == np.bool_ or np.issubdtype(m.dtype, np.integer)):
        raise ImageDecodeError(mask_path, "not a label volume", f"{m.dtype} values are not labels")
    lo, hi = (int(m.min()), int(m.max())) if m.size else (0, 0)
    top = int(np.iinfo(np.dtype(mask_dtype)).max)
    if lo < 0 or hi > top:
        raise ImageDecodeError(mask_path, "label out of range", f"values {lo}..{hi} do not fit {np.dtype(mask_dtype).name}")
    m = m.astype(np.dtype(mask_dtype).newbyteorder("="))
    return vol, (resample(m, settings.shape, "nearest") if settings.shape else m)


def mask_field(volume: VolumeSettings, dtype: str) -> ImageField:
    return volume_field(volume.shape, dtype, "volume_mask")


def build_volume_shard(task: VolumeShardTask) -> dict[str, Any]:
    fp = task.fingerprint()
    rec = reused_shard(task, fp)
    if rec is not None:
        return rec
    field = task.volume.field()
    vols, shapes, labels, sources, skipped, masks = [], [], [], [], [], []
    source_bytes = 0
    for k, (rel, label) in enumerate(zip(task.paths, task.labels)):
        path = os.path.join(task.root, rel)
        mpath = os.path.join(task.mask_root, task.masks[k]) if task.mask_root else None
        try:
            vol, mask = process_volume(path, task.volume, mpath, task.mask_dtype, task.max_bytes)
            source_bytes += os.path.getsize(path)
        except MemoryError:  # one volume's conversion or resampling: a skip naming it, never the build's end
            if task.strict:
                raise ImageDecodeError(path, "too large", "out of memory processing it") from None
            skipped.append({"source": rel, "reason": "too large", "detail": "out of memory processing it"})
            continue
        except ImageDecodeError as e:
            if task.strict:
                raise
            skipped.append({"source": rel, "reason": e.reason, "detail": e.detail})
            continue
        except OSError as e:
            if task.strict:
                raise ImageDecodeError(path, "unreadable", e.strerror or str(e)) from None
            skipped.append({"source": rel, "reason": "unreadable", "detail": e.strerror or str(e)})
            continue
        vols.append(vol)
        shapes.append(vol.shape)
        if mask is not None:
            masks.append(mask)
        labels.append(label)
        sources.append(rel)
    arrays = {**field.shard_arrays(vols, shapes), **StringsField().shard_arrays(sources)}
    if task.label_dtype:
        arrays.update(LabelField(dtype=task.label_dtype).shard_arrays(labels))
    if task.mask_root:
        arrays.update(mask_field(task.volume, task.mask_dtype).shard_arrays(masks, shapes))
    return finish_shard(task, fp, arrays, len(vols), skipped, 0, source_bytes)


@dataclass
class VolumeSplit:
    """A split's volumes that have a label volume, and those that do not (skipped with the reason)."""

    name: str
    paths: list[str]
    labels: np.ndarray
    masks: list[str]
    unpaired: list[dict]

    def limited(self, limit: int | None) -> "VolumeSplit":
        idx = spread_by_class(self.labels, limit) if self.labels is not None else spread(len(self.paths), limit)
        if idx is None:
            return self
        return VolumeSplit(self.name, [self.paths[i] for i in idx], self.labels[idx], [self.masks[i] for i in idx], [])

    def skipped_before(self) -> list[dict]:
        return self.unpaired


def pair_label_volumes(source: Source, mask_root: Path) -> list[VolumeSplit]:
    """Each volume's label volume: the file under `mask_root` with the same relative path and stem."""
    from .read import VOLUME_EXTENSIONS

    if not mask_root.is_dir():
        raise SourceError(f"{mask_root}: the label volume directory does not exist")
    found = {os.path.splitext(str(p.relative_to(mask_root)))[0]: str(p.relative_to(mask_root))
             for p in sorted(mask_root.rglob("*")) if p.is_file() and p.suffix.lower() in VOLUME_EXTENSIONS}
    out = []
    for s in source.splits:
        keep, masks, unpaired = [], [], []
        for k, rel in enumerate(s.paths):
            m = found.get(os.path.splitext(rel)[0])
            if m is None:
                unpaired.append({"source": rel, "reason": "no mask", "detail": f"no label volume for it under {mask_root}"})
            else:
                keep.append(k)
                masks.append(m)
        out.append(VolumeSplit(s.name, [s.paths[k] for k in keep], s.labels[keep], masks, unpaired + s.skipped_before()))
    return out


def _max_label(paths: list[str]) -> int:
    top = 0
    for p in paths:
        try:
            m = read_volume(p)
            top = max(top, int(m.max()) if m.size else 0)
        except (ImageDecodeError, ValueError, TypeError):
            pass  # reported by the build
    return top


def build_volumes(source: Source, out: str | os.PathLike, settings: BuildSettings, volume: VolumeSettings,
                  progress: Callable[[int], None] | None = None, engine=None, masks: str | os.PathLike | None = None,
                  mask_dtype: str | None = None) -> BuildSummary:
    """Build a volume pack from `source` into `out`.

    Args:
        source: The listing of the volumes, by split.
        out: The pack's folder.
        settings: The shard layout and how strict the build is (workers, limit, shard_size, ...).
        volume: The volume stages: shape, depth, window, resampling.
        progress: Told `progress(n)` of n more samples done; None for no progress.
        engine: Runs the shards; None is a local pool of settings.workers processes.
        masks: A folder of label volumes, each under the same relative path and stem as its volume; they
            are stored beside the volumes.
        mask_dtype: "uint8" or "uint16"; None chooses uint8 unless a value above 255 occurs.

    Returns:
        The build's summary: splits, counts, skipped files and their reasons.
    """
    from ..engine import LocalEngine

    out = Path(out)
    label = LabelField.for_classes(len(source.classes)) if source.classes else None
    ldt = label.dtype if label else None
    engine = engine or LocalEngine(settings.workers)
    if masks is not None:
        splits = [s.limited(settings.limit) for s in pair_label_volumes(source, Path(masks))]
        if settings.strict and any(s.unpaired for s in splits):
            u = next(u for s in splits for u in s.unpaired)
            raise SourceError(f"{u['source']}: {u['reason']} ({u['detail']})")
        if mask_dtype is None:
            paths = [os.path.join(masks, m) for s in splits for m in s.masks]
            top = max(engine.map(_max_label, [paths[i : i + 16] for i in range(0, len(paths), 16)]), default=0)
            mdt = "|u1" if top <= 255 else "<u2"
        else:
            mdt = {"uint8": "|u1", "uint16": "<u2"}[mask_dtype]
    else:
        splits, mdt = [s.limited(settings.limit) for s in source.splits], None

    def make_task(split, k: int, start: int, stop: int) -> VolumeShardTask:
        return VolumeShardTask(str(source.root), str(out / split.name), k, tuple(split.paths[start:stop]),
                               split.labels[start:stop], ldt, volume, settings.strict, settings.resume,
                               str(masks) if masks is not None else None,
                               tuple(split.masks[start:stop]) if masks is not None else (), mdt, settings.max_bytes)

    summaries, entries, seconds = build_shards(out, settings, splits, make_task, build_volume_shard, progress, engine)
    header = pack_header("volumes", settings, {"layout": source.layout, "root": str(source.root.resolve()),
                                               **({"mask_root": str(Path(masks).resolve())} if masks else {})}, seconds,
                         {"volume": volume.to_dict()})
    fields = {"volume": volume.field().to_manifest(), "source": StringsField().to_manifest()}
    if mdt:
        fields["volume_mask"] = {**mask_field(volume, mdt).to_manifest(), "resample": "nearest"}
    if label:
        fields["label"] = label.to_manifest()
    write_manifest(out, {**header, "classes": source.classes, "fields": fields, "splits": entries})
    return BuildSummary(out, summaries, seconds, "volumes")
