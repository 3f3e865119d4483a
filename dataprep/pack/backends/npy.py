"""npy backend: a directory of shard directories of .npy files (the default layout, written by builds)."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import PackError
from ..manifest import MANIFEST, read_manifest_file, write_manifest
from ..names import check_name, inside
from ..shard import map_npy, read_npy_into, write_shard
from .layout import ArrayPlan, plan_arrays


class NpyReader:
    """Reads an npy pack: each shard's arrays are its own .npy files."""

    name = "npy"

    def __init__(self, root: Path):
        self.root = root
        self.manifest = read_manifest_file(root)  # its names are checked: none holds "/" or ".."
        for split, entry in self.manifest["splits"].items():  # and no symlink leads outside the pack
            inside(root, root / split, "split directory")
            for s in entry["shards"]:
                inside(root, root / split / str(s["name"]), "shard directory")
        self._plans: dict[str, dict[str, ArrayPlan]] = {}

    def plans(self, split: str) -> dict[str, ArrayPlan]:
        if split not in self._plans:
            self._plans[split] = plan_arrays(self.manifest, split)
        return self._plans[split]

    # the hooks LoadContext calls with a shard file's path and record
    read = staticmethod(read_npy_into)
    map = staticmethod(map_npy)

    def _shard(self, split: str, k: int) -> tuple[Path, dict[str, Any]]:
        s = self.manifest["splits"][split]["shards"][k]
        return self.root / split / str(s["name"]), s

    def shard_array(self, split: str, k: int, name: str, verify: bool = False) -> np.ndarray:
        """Shard k's array `name`, as its file holds it."""
        d, s = self._shard(split, k)
        return read_npy_into(d / f"{name}.npy", s["files"][f"{name}.npy"], None, verify)

    def attachments(self) -> dict[str, bytes]:
        """Files a pack keeps beside its shards (a tokenizer trained for it), by name."""
        # regular files only, not hidden ones (.DS_Store, a manifest being written) nor links out of the pack
        return {p.name: p.read_bytes() for p in sorted(self.root.iterdir())
                if p.name != MANIFEST and not p.name.startswith(".") and not p.is_symlink() and p.is_file()}

    def shard_meta(self, split: str, k: int) -> dict[str, Any]:
        """What shard k's shard.json holds besides its file records (the build's fingerprint and counts)."""
        import json

        d, s = self._shard(split, k)
        try:
            rec = json.loads((d / "shard.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            rec = {key: v for key, v in s.items() if key != "name"}
        return {key: v for key, v in rec.items() if key != "files"}

    def global_slice(self, split: str, name: str, a: int, b: int) -> np.ndarray:
        """Rows [a, b) of the split's concatenated array (offsets rebased to the whole split)."""
        p = self.plans(split)[name]
        out = np.empty((max(0, b - a), *p.row_shape), p.dtype)
        bases = self.plans(split)[p.blob].starts if p.is_offsets else None
        for k, (start, rows) in enumerate(zip(p.starts, p.shard_rows)):
            n = rows - 1 if p.is_offsets else rows
            lo, hi = max(a, start), min(b, start + n)
            if lo >= hi:
                continue
            d, s = self._shard(split, k)
            part = map_npy(d / f"{name}.npy", s["files"][f"{name}.npy"])[lo - start : hi - start]
            out[lo - a : hi - a] = part + bases[k] if p.is_offsets else part
        if p.is_offsets and a <= p.total_rows - 1 < b:
            blob = self.plans(split)[p.blob]
            out[p.total_rows - 1 - a] = blob.total_rows
        return out

    def reopen(self) -> "NpyReader":
        return NpyReader(self.root)

    def __reduce__(self):
        return (NpyReader, (self.root,))

    def close(self) -> None:
        pass


def write_npy(reader, out: Path, manifest: dict[str, Any], compression: str = "none", engine=None) -> None:
    """Write every shard of `reader` (any backend's) as npy shard files under `out`, each checked against
    the manifest's checksum, then the attachments and the manifest (last)."""
    if compression != "none":
        raise PackError("npy packs are not compressed: drop --compress, or choose --to hdf5 or zarr")
    out.mkdir(parents=True)
    try:
        for split, entry in manifest["splits"].items():
            for k, s in enumerate(entry["shards"]):
                arrays = {f[:-4]: reader.shard_array(split, k, f[:-4]) for f in s["files"]}
                files = write_shard(out / split, str(s["name"]), arrays, reader.shard_meta(split, k))
                for f, rec in s["files"].items():
                    if files[f]["sha256"] != rec["sha256"]:
                        raise PackError(f"{out / split / str(s['name']) / f}: converted bytes differ from the manifest's checksum")
        for name, data in reader.attachments().items():
            (out / check_name(name, "attached file", str(reader.root), PackError)).write_bytes(data)
        write_manifest(out, manifest)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
