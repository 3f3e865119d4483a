"""Storage backends: where a pack's arrays live. `npy` (a directory of shard files, the default), `hdf5`
(one file) and `zarr` (a Zarr v3 group, chunked, optionally compressed).

Every backend keeps the same manifest and the same shard records; what differs is where the bytes
are. HDF5 and Zarr hold each split's arrays concatenated over shards (offsets rebased to the whole
split), which is what a user opening the file with h5py or zarr alone wants, and what the RAM cache
holds. A reader gives any shard's array exactly as the npy shard file holds it (`shard_array`), so
every loader, `verify` (whose checksums are of those npy files: header and data) and `convert` work
the same on every backend.

`BACKENDS` is the registry; the CLI's `--format` choices come from it.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import PackError

BACKENDS = ("npy", "hdf5", "zarr")
HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"

# offsets arrays and the arrays they index (before any resolution suffix "_rNNN")
OFFSETS_OF = {"offsets": "images", "source_offsets": "sources", "mask_offsets": "masks",
              "mask_source_offsets": "mask_sources", "volume_offsets": "volumes", "doc_offsets": "tokens",
              "volume_mask_offsets": "volume_masks"}


def split_suffix(name: str) -> tuple[str, str]:
    m = re.fullmatch(r"(.+?)(_r\d+)", name)
    return (m.group(1), m.group(2)) if m else (name, "")


def blob_of(name: str) -> str | None:
    """The array an offsets array indexes ("offsets_r128" -> "images_r128"), or None for other arrays."""
    base, suffix = split_suffix(name)
    return OFFSETS_OF[base] + suffix if base in OFFSETS_OF else None


def group_path(split: str, name: str) -> str:
    """Where array `name` of `split` lives inside an HDF5 file or Zarr group: split/[rNNN/]array."""
    base, suffix = split_suffix(name)
    return f"{split}/r{suffix[2:]}/{base}" if suffix else f"{split}/{name}"


@dataclass
class ArrayPlan:
    """One array of one split, over its shards, from the manifest's file records."""

    name: str
    dtype: np.dtype
    row_shape: tuple[int, ...]
    shard_rows: list[int]  # rows of each shard's file (offsets files: samples + 1)
    blob: str | None  # for offsets arrays: the array they index

    @property
    def is_offsets(self) -> bool:
        return self.blob is not None

    @property
    def starts(self) -> list[int]:
        """Global row where each shard's rows begin (offsets: each shard contributes rows - 1)."""
        out, pos = [], 0
        for r in self.shard_rows:
            out.append(pos)
            pos += r - 1 if self.is_offsets else r
        return out

    @property
    def total_rows(self) -> int:
        if self.is_offsets:
            return sum(r - 1 for r in self.shard_rows) + 1
        return sum(self.shard_rows)

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.total_rows, *self.row_shape)


def plan_arrays(manifest: dict[str, Any], split: str) -> dict[str, ArrayPlan]:
    """Every array of a split, from the shard records (the same for every backend)."""
    shards = manifest["splits"][split]["shards"]
    out: dict[str, ArrayPlan] = {}
    for s in shards:
        for fname, rec in s["files"].items():
            name = fname[:-4] if fname.endswith(".npy") else fname
            p = out.get(name)
            if p is None:
                p = out[name] = ArrayPlan(name, np.dtype(rec["dtype"]), tuple(rec["shape"][1:]), [], blob_of(name))
            p.shard_rows.append(int(rec["shape"][0]))
    for p in out.values():
        if len(p.shard_rows) != len(shards):
            raise PackError(f"split {split}: {p.name} is in {len(p.shard_rows)} of {len(shards)} shards")
    return out


def detect(path: str | os.PathLike) -> str:
    """The backend of the pack at `path`: an HDF5 file, a Zarr group directory, or an npy pack directory."""
    path = Path(path)
    if path.is_file():
        with open(path, "rb") as f:
            head = f.read(8)
        if head == HDF5_MAGIC:
            return "hdf5"
        raise PackError(f"{path}: not a pack (a file, but not HDF5; an npy pack is a directory with manifest.json)")
    if (path / "zarr.json").is_file():
        return "zarr"
    if path.is_dir() or not path.exists():
        return "npy"
    raise PackError(f"{path}: not a pack of a known backend ({', '.join(BACKENDS)})")


def open_source(path: str | os.PathLike):
    """The reader of the pack at `path`, whatever its backend; `.manifest` is its checked manifest."""
    kind = detect(path)
    if kind == "npy":
        from .npy import NpySource

        return NpySource(Path(path))
    if kind == "hdf5":
        from .hdf5 import Hdf5Source

        return Hdf5Source(Path(path))
    from .zarr import ZarrSource

    return ZarrSource(Path(path))


def read_manifest_any(path: str | os.PathLike) -> dict[str, Any]:
    """The manifest of a pack of any backend, checked."""
    kind = detect(path)
    if kind == "npy":
        from ..manifest import read_manifest_file

        return read_manifest_file(Path(path))
    source = open_source(path)
    source.close()
    return source.manifest
