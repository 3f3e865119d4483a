"""Array plans: what a split's arrays are over its shards (dtype, rows per shard, which are offsets into
which blob), from the manifest alone, and where each lives inside an HDF5 file or Zarr group. What every
backend's reader and writer share."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import PackError
from ..fields import offsets_in


def split_suffix(name: str) -> tuple[str, str]:
    m = re.fullmatch(r"(.+?)(_r\d+)", name)
    return (m.group(1), m.group(2)) if m else (name, "")


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
    """Every array of a split, from the shard records (the same for every backend); which arrays are
    offsets, and of what, the manifest's field descriptions say (`offsets_in`)."""
    shards = manifest["splits"][split]["shards"]
    offsets = offsets_in(manifest)
    out: dict[str, ArrayPlan] = {}
    for s in shards:
        for fname, rec in s["files"].items():
            name = fname[:-4] if fname.endswith(".npy") else fname
            p = out.get(name)
            if p is None:
                p = out[name] = ArrayPlan(name, np.dtype(rec["dtype"]), tuple(rec["shape"][1:]), [], offsets.get(name))
            p.shard_rows.append(int(rec["shape"][0]))
    for p in out.values():
        if len(p.shard_rows) != len(shards):
            raise PackError(f"split {split}: {p.name} is in {len(p.shard_rows)} of {len(shards)} shards")
    return out
