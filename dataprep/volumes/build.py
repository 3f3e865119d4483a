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

from ..build import BuildSummary, build_shards, pack_header, task_fingerprint
from ..errors import DataprepError, ImageDecodeError
from ..pack.fields import ImageField, blob_arrays, label_dtype
from ..pack.manifest import write_manifest
from ..pack.shard import reusable_shard, shard_name, write_shard
from ..sources import Source
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
        return ImageField("raw", tuple(self.shape) if self.shape else None, None, dtype=self.dtype, role="volume")

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

    def fingerprint(self) -> str:
        return task_fingerprint(["volumes", self.index, self.volume.to_dict(), self.label_dtype, self.strict],
                                zip(self.paths, self.labels.tolist()))


def process_volume(path: str, settings: VolumeSettings) -> np.ndarray:
    vol = to_stored(read_volume(path), settings.depth, settings.window, path)
    return resample(vol, settings.shape, settings.resample) if settings.shape else vol


def build_volume_shard(task: VolumeShardTask) -> dict[str, Any]:
    fp = task.fingerprint()
    if task.resume:
        rec = reusable_shard(Path(task.split_dir), task.index, fp)
        if rec is not None:
            return {"name": shard_name(task.index), "files": rec["files"],
                    **{k: rec[k] for k in ("count", "skipped", "kept_jpeg", "source_bytes")}, "reused": True}
    field = task.volume.field()
    vols, shapes, labels, sources, skipped = [], [], [], [], []
    source_bytes = 0
    for rel, label in zip(task.paths, task.labels):
        path = os.path.join(task.root, rel)
        try:
            vol = process_volume(path, task.volume)
            source_bytes += os.path.getsize(path)
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
        labels.append(label)
        sources.append(np.frombuffer(rel.encode("utf-8", "surrogateescape"), np.uint8))
    arrays = {**field.shard_arrays(vols, shapes), **blob_arrays(sources, "sources", "source_offsets")}
    if task.label_dtype:
        arrays["labels"] = np.asarray(labels, np.int64).astype(task.label_dtype)
    meta = {"count": len(vols), "skipped": skipped, "kept_jpeg": 0, "source_bytes": source_bytes}
    files = write_shard(Path(task.split_dir), task.index, arrays, {"fingerprint": fp, **meta})
    return {"name": shard_name(task.index), "files": files, **meta, "reused": False}


def build_volumes(source: Source, out: str | os.PathLike, settings, volume: VolumeSettings,
                  progress: Callable[[int], None] | None = None, engine=None) -> BuildSummary:
    """Build a volume pack; `settings` is a BuildSettings (its image part is not used)."""
    out = Path(out)
    ldt = label_dtype(len(source.classes)).str if source.classes else None

    def make_task(split, k: int, start: int, stop: int) -> VolumeShardTask:
        return VolumeShardTask(str(source.root), str(out / split.name), k, tuple(split.paths[start:stop]),
                               split.labels[start:stop], ldt, volume, settings.strict, settings.resume)

    splits = [s.limited(settings.limit) for s in source.splits]
    summaries, entries, seconds = build_shards(out, settings, splits, make_task, build_volume_shard, progress, engine)
    header = pack_header("volumes", settings, {"layout": source.layout, "root": str(source.root.resolve())}, seconds)
    header["settings"] = {**{k: v for k, v in header["settings"].items() if k != "image"}, "volume": volume.to_dict()}
    fields = {"volume": volume.field().to_manifest(),
              "source": {"encoding": "utf-8", "relative_to": "source.root", "arrays": ["sources", "source_offsets"]}}
    if ldt:
        fields["label"] = {"dtype": ldt, "num_classes": len(source.classes), "arrays": ["labels"]}
    write_manifest(out, {**header, "classes": source.classes, "fields": fields, "splits": entries})
    return BuildSummary(out, summaries, seconds, "volumes")
