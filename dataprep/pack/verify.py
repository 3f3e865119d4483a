"""Verify stage: takes a pack, gives every problem found in it, by file (manifest, checksums, headers,
offsets, shapes, label range, and optionally whether every image decodes)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import PackError
from .fields import ImageField, LoadContext, Strings, load_blob, load_rows
from .manifest import MANIFEST, read_manifest


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
    try:
        m = read_manifest(pack)
        if m["kind"] != "images":
            raise PackError(f"{pack / MANIFEST}: verify knows image packs; this is a {m['kind']!r} pack")
        images = [ImageField.from_manifest(spec, pack / MANIFEST) for key, spec in m["fields"].items() if key.split("@")[0] == "image"]
        if not images:
            raise PackError(f"{pack / MANIFEST}: no image field")
        ldt, ncls = np.dtype(m["fields"]["label"]["dtype"]), int(m["fields"]["label"]["num_classes"])
    except (PackError, KeyError, TypeError, ValueError) as e:
        rep.problems.append((str(pack / MANIFEST), str(e)))
        return rep
    for split, entry in m["splits"].items():
        split_dir = pack / split
        counted = 0
        for shard in entry.get("shards", []):
            where = split_dir / str(shard.get("name"))
            try:
                ctx = LoadContext(verify=True)
                labels = load_rows(split_dir, [shard], "labels", ldt, (), ctx)
                sources = Strings(*load_blob(split_dir, [shard], "sources", "source_offsets", ctx))
                if len(labels) and int(labels.max()) >= ncls:
                    rep.problems.append((str(where / "labels.npy"), f"label {int(labels.max())} >= {ncls} classes"))
                for img in images:
                    arrays = img.load(split_dir, [shard], ctx)
                    if len(arrays["shapes"]) != len(labels):
                        rep.problems.append((str(where / f"{img.name('shapes')}.npy"), "sample count differs from labels.npy"))
                    if decode and img.encoding == "jpeg":
                        rep.decoded += _decode_all(arrays, img.channels, sources, where / img.name("images"), rep)
            except (PackError, KeyError, TypeError, ValueError) as e:
                rep.problems.append((str(where), str(e)))
            else:
                rep.samples += len(labels)
            files = shard.get("files", {}) if isinstance(shard.get("files"), dict) else {}
            rep.shards += 1
            rep.files += len(files)
            rep.bytes += sum(int(f.get("bytes", 0)) for f in files.values() if isinstance(f, dict))
            counted += int(shard.get("count", 0))
            if progress:
                progress(1)
        if counted != entry.get("count"):
            rep.problems.append((str(pack / MANIFEST), f"split {split}: shards hold {counted} samples, the split says {entry.get('count')}"))
    return rep


def _decode_all(arrays, channels: int, sources: Strings, where: Path, rep: Report) -> int:
    from ..data.decoders import decode_cv2

    blob, offsets, shapes = arrays["images"], arrays["offsets"], arrays["shapes"]
    for k in range(len(offsets) - 1):
        img = decode_cv2(blob[offsets[k] : offsets[k + 1]], channels)
        if img is None:
            rep.problems.append((f"{where}.npy", f"sample {k} ({sources[k]}) does not decode"))
        elif tuple(img.shape) != tuple(shapes[k]):
            rep.problems.append((f"{where}.npy", f"sample {k} ({sources[k]}) decodes to {img.shape}, its shape says {tuple(shapes[k])}"))
    return len(offsets) - 1
