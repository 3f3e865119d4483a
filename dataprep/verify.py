"""Verify stage: takes a pack, gives every problem found in it, by file (manifest, checksums, headers,
offsets, shapes, label range, and optionally whether every image decodes)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from .errors import PackError
from .images.field import ImageField
from .pack.fields import LoadContext, Strings, load_blob, load_rows
from .pack.manifest import MANIFEST


@dataclass
class Report:
    problems: list[tuple[str, str]] = field(default_factory=list)  # (path, what is wrong)
    shards: int = 0
    files: int = 0
    bytes: int = 0
    samples: int = 0
    decoded: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_pack(pack: str | os.PathLike, decode: bool = False, progress: Callable[[int], None] | None = None) -> Report:
    """Check everything about a pack and report every problem rather than stopping at the first."""
    pack = Path(pack)
    rep = Report()
    where = pack / MANIFEST if pack.is_dir() and not (pack / "zarr.json").exists() else pack
    try:
        from .pack.backends import open_source

        source = open_source(pack)
        m = source.manifest
        if m["kind"] not in ("images", "segmentation", "volumes"):
            return _verify_arrays(pack, source, rep, progress)
        fields = [ImageField.from_manifest(spec, pack / MANIFEST) for key, spec in m["fields"].items()
                  if key.split("@")[0] in ("image", "mask", "volume", "volume_mask")]
        if not fields:
            raise PackError(f"{pack / MANIFEST}: no image, mask or volume field")
        label = m["fields"].get("label")
        ldt, ncls = (np.dtype(label["dtype"]), int(label["num_classes"])) if label else (None, 0)
        mask_spec = next((spec for key, spec in m["fields"].items() if key.split("@")[0] == "mask"), {})
    except (PackError, KeyError, TypeError, ValueError) as e:
        rep.problems.append((str(where), str(e)))
        return rep
    for split, entry in m["splits"].items():
        split_dir = pack / split
        counted = 0
        for shard in entry.get("shards", []):
            where = split_dir / str(shard.get("name"))
            n = None
            try:
                ctx = LoadContext(verify=True, source=source)
                sources = Strings(*load_blob(split_dir, [shard], "sources", "source_offsets", ctx))
                n = len(sources)
                if ldt is not None:
                    labels = load_rows(split_dir, [shard], "labels", ldt, (), ctx)
                    if len(labels) != n:
                        rep.problems.append((str(where / "labels.npy"), "sample count differs from sources.npy"))
                    if len(labels) and int(labels.max()) >= ncls:
                        rep.problems.append((str(where / "labels.npy"), f"label {int(labels.max())} >= {ncls} classes"))
                for f in fields:
                    arrays = f.load(split_dir, [shard], ctx)
                    if len(arrays[f.keys[2]]) != n:
                        rep.problems.append((str(where / f"{f.name(f.keys[2])}.npy"), "sample count differs from sources.npy"))
                    if decode and f.encoding == "jpeg":
                        rep.decoded += _decode_all(arrays, f.channels, sources, where / f.name("images"), rep)
                    if f.role == "mask" and mask_spec.get("num_classes") and len(arrays["masks"]):
                        _check_mask_values(np.asarray(arrays["masks"]), int(mask_spec["num_classes"]), mask_spec.get("ignore"),
                                           where / f"{f.name('masks')}.npy", rep)
            except (PackError, KeyError, TypeError, ValueError) as e:
                rep.problems.append((str(where), str(e)))
            else:
                rep.samples += n
            files = shard.get("files", {}) if isinstance(shard.get("files"), dict) else {}
            rep.shards += 1
            rep.files += len(files)
            rep.bytes += sum(int(f.get("bytes", 0)) for f in files.values() if isinstance(f, dict))
            counted += int(shard.get("count", 0))
            if progress:
                progress(1)
        if counted != entry.get("count"):
            rep.problems.append((str(where), f"split {split}: shards hold {counted} samples, the split says {entry.get('count')}"))
    return rep


def _verify_arrays(pack: Path, source, rep: Report, progress) -> Report:
    """Token and table packs: every shard array's checksum and the sample counts."""
    m = source.manifest
    for split, entry in m["splits"].items():
        for k, shard in enumerate(entry.get("shards", [])):
            where = f"{pack}/{split}/{shard.get('name')}"
            try:
                for fname, rec in shard["files"].items():
                    source.shard_array(split, k, fname[:-4], verify=True)
                    rep.files += 1
                    rep.bytes += int(rec.get("bytes", 0))
                rep.samples += int(shard["count"])
            except (PackError, KeyError, TypeError, ValueError) as e:
                rep.problems.append((where, str(e)))
            rep.shards += 1
            if progress:
                progress(1)
    return rep


def _check_mask_values(data: np.ndarray, num_classes: int, ignore: int | None, where: Path, rep: Report) -> None:
    values = np.unique(data.view(data.dtype.newbyteorder("=")) if data.dtype.byteorder not in "=|" else data)
    bad = values[(values >= num_classes) & (values != (-1 if ignore is None else ignore))]
    if len(bad):
        rep.problems.append((str(where), f"mask values {bad[:8].tolist()} are neither below {num_classes} classes nor the ignore value"))


def _decode_all(arrays, channels: int, sources: Strings, where: Path, rep: Report) -> int:
    from .images.codec import decode_cv2

    blob, offsets, shapes = arrays["images"], arrays["offsets"], arrays["shapes"]
    for k in range(len(offsets) - 1):
        img = decode_cv2(blob[offsets[k] : offsets[k + 1]], channels)
        if img is None:
            rep.problems.append((f"{where}.npy", f"sample {k} ({sources[k]}) does not decode"))
        elif tuple(img.shape) != tuple(shapes[k]):
            rep.problems.append((f"{where}.npy", f"sample {k} ({sources[k]}) decodes to {img.shape}, its shape says {tuple(shapes[k])}"))
    return len(offsets) - 1
