"""Memory planner: takes what a sample holds (or a pack of any kind: images, masks, volumes, token
windows, table rows), batch size, workers, prefetch, cache mode and ranks, gives the bytes each part of
training input needs, and whether it fits in this machine's RAM.

The comparison columns show the same batches as they are often written (float32 images, int64
masks), which is where the saving of uint8 shows.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import PackError


@dataclass(frozen=True)
class Part:
    """One tensor of a sample as served, and the dtype it is commonly held in for comparison."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    compare_dtype: str | None = None

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    @property
    def compare_nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.compare_dtype or self.dtype).itemsize


@dataclass
class MemoryPlan:
    parts: list[Part]
    batch_size: int
    workers: int
    prefetch: int
    cache: str = "ram"
    cache_bytes: int = 0
    ranks: int = 1
    free_ram: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def per_sample(self) -> int:
        return sum(p.nbytes for p in self.parts)

    @property
    def per_batch(self) -> int:
        return self.per_sample * self.batch_size

    @property
    def per_batch_compared(self) -> int:
        return sum(p.compare_nbytes for p in self.parts) * self.batch_size

    @property
    def batches_in_flight(self) -> int:
        """Per rank: each worker keeps `prefetch` batches outstanding; with no workers, one batch."""
        return self.workers * self.prefetch if self.workers else 1

    @property
    def in_flight(self) -> int:
        return self.per_batch * self.batches_in_flight * self.ranks

    @property
    def in_flight_compared(self) -> int:
        return self.per_batch_compared * self.batches_in_flight * self.ranks

    @property
    def cache_total(self) -> int:
        """ram: one copy per rank (workers share it by fork); mmap and shm: one copy per machine."""
        return self.cache_bytes * (self.ranks if self.cache == "ram" else 1)

    @property
    def total(self) -> int:
        return self.cache_total + self.in_flight

    @property
    def fits(self) -> bool | None:
        return None if self.free_ram is None else self.total <= self.free_ram

    def to_dict(self) -> dict[str, Any]:
        """Every figure in exact bytes, for scripts (`dataprep plan --json`)."""
        return {"parts": [{"name": p.name, "shape": list(p.shape), "dtype": p.dtype, "bytes": p.nbytes,
                           "compare_dtype": p.compare_dtype, "compare_bytes": p.compare_nbytes} for p in self.parts],
                "batch_size": self.batch_size, "workers": self.workers, "prefetch": self.prefetch, "ranks": self.ranks,
                "cache": self.cache, "per_sample": self.per_sample, "per_batch": self.per_batch,
                "per_batch_compared": self.per_batch_compared, "batches_in_flight": self.batches_in_flight,
                "in_flight": self.in_flight, "in_flight_compared": self.in_flight_compared,
                "cache_bytes": self.cache_total, "total": self.total, "available_ram": self.free_ram, "fits": self.fits,
                "notes": self.notes}

    def lines(self) -> list[str]:
        b = human
        out = list(self.notes) + ["per sample:"]
        for p in self.parts:
            shape = "x".join(map(str, p.shape)) or "scalar"
            cmp = ""
            if p.compare_dtype and p.compare_dtype != p.dtype:
                cmp = f"   as {p.compare_dtype}: {b(p.compare_nbytes)} ({p.compare_nbytes / max(p.nbytes, 1):.0f}x)"
            out.append(f"  {p.name:11s} {shape:>14s} {p.dtype:8s} {b(p.nbytes):>10s}{cmp}")
        def common(mine: int, theirs: int) -> str:
            return f"   as commonly written: {b(theirs)}" if theirs != mine else ""

        out.append(f"per batch of {self.batch_size}: {b(self.per_batch)}{common(self.per_batch, self.per_batch_compared)}")
        for p in self.parts:
            if p.compare_dtype and p.compare_dtype != p.dtype:
                out.append(f"  {p.name:11s} {b(p.nbytes * self.batch_size):>10s} as {p.dtype}, "
                           f"{b(p.compare_nbytes * self.batch_size)} as {p.compare_dtype}")
        out.append(
            f"in flight: {self.ranks} rank(s) x {self.batches_in_flight} batches ({self.workers} workers x prefetch "
            f"{self.prefetch}): {b(self.in_flight)}{common(self.in_flight, self.in_flight_compared)}"
        )
        copies = f"{self.ranks} copies, one per rank" if self.cache == "ram" and self.ranks > 1 else "one copy per machine"
        out.append(f"cache ({self.cache}, {copies}): {b(self.cache_total)}")
        out.append(f"total: {b(self.total)}")
        if self.free_ram is not None:
            verdict = "fits" if self.fits else "does NOT fit"
            out.append(f"available RAM: {b(self.free_ram)}: {verdict}")
        return out


def human(n: int) -> str:
    """Bytes in binary units with one decimal (KiB, MiB, GiB, TiB); exact below 1 KiB."""
    if n < 1024:
        return f"{n} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"
    raise AssertionError("unreachable")


# what the datasets serve when made with their defaults (TokenDataset's context and dtype="int64";
# TabularDataset's categorical="separate"); tests/test_tools.py holds these to the datasets' batch layouts
DEFAULT_CONTEXT = 1024


def parts_from_pack(pack: str | Path, split: str = "train", crop: tuple[int, int] | None = None,
                    resolution: int | None = None, context: int | None = None) -> tuple[list[Part], int, list[str]]:
    """What one served sample of a pack puts in a batch, the bytes the dataset holds for the split (its
    served fields' files), and notes saying what the plan assumed. Reads the manifest and, for a
    variable-size image pack, the shapes array, whatever the backend; the pack's kind names the fields.

    Images, masks, volumes: at `crop` (H, W) when given (what `Loader(crop=...)` serves), else at the stored
    shape when every sample has one, else at a square of the median shorter side (as `dataprep bench`
    serves such a pack); `resolution` picks one size of a multi-resolution pack. Token packs: x and y
    windows of `context` tokens, int64. Table packs: a row's features, categorical codes (int64) and target."""
    from ..kinds import kind_of
    from ..pack.backends import open_reader

    reader = open_reader(pack)
    try:
        m = reader.manifest
        if split not in m["splits"]:
            raise PackError(f"{pack}: no split {split!r}; the pack has {sorted(m['splits'])}")
        fields = kind_of(m, pack).served_fields(m, resolution, pack)
        first = next(iter(fields.values()))
        shapes = None
        if hasattr(first, "shapes_name") and not first.fixed and crop is None:
            plans = reader.plans(split)
            name = first.shapes_name
            shapes = reader.global_slice(split, name, 0, plans[name].total_rows) if name in plans else np.zeros((0, 3), np.int32)
    finally:
        reader.close()
    stored = {f"{name}.npy" for f in fields.values() for name in f.stored()}
    size = sum(rec["bytes"] for s in m["splits"][split]["shards"] for fn, rec in s["files"].items() if fn in stored)
    if (crop is not None or context is not None) and not hasattr(first, "shapes_name" if crop is not None else "vocab_size"):
        raise PackError(f"{pack}: a {m['kind']!r} pack takes no {'--crop' if crop is not None else '--context'}")
    if hasattr(first, "shapes_name"):
        parts, notes = _pixel_parts(fields, first, crop, shapes)
    elif hasattr(first, "vocab_size"):
        n = context or DEFAULT_CONTEXT
        dt = "int64"
        parts = [Part("x", (n,), dt), Part("y", (n,), dt)]
        notes = [f"planned at: windows of {n} tokens" + ("" if context else " (TokenDataset's default; --context to change)")
                 + f", served as int64; TokenDataset(dtype='stored') serves them as {first.np_dtype.name}"]
    else:
        parts, notes = _row_parts(fields, m)
    if m.get("resolutions"):
        have = sorted(m["resolutions"])
        notes.append(f"resolution: {resolution or max(have)} of {', '.join(map(str, have))}"
                     + ("" if resolution else " (the largest; --resolution for another)"))
    return parts, size, notes


def _pixel_parts(fields: dict, first, crop, shapes) -> tuple[list[Part], list[str]]:
    role = first.role
    if crop is not None:
        if role.startswith("volume"):
            raise PackError("a crop (H, W) applies to images; volumes are served whole")
        shape = (int(crop[0]), int(crop[1]), first.channels)
        note = f"planned at: a {crop[0]}x{crop[1]} crop (--crop), as Loader(crop=...) serves it"
    elif first.fixed:
        shape = tuple(first.shape)
        note = f"planned at: the stored shape {'x'.join(map(str, shape))}, which every {role} has"
    elif shapes is None or not len(shapes):
        shape = (0, 0, first.channels or 0)
        note = f"planned at: no {role}s in this split"
    elif role.startswith("volume"):
        k = int(np.argmax(shapes.astype(np.int64).prod(axis=1)))
        shape = tuple(int(v) for v in shapes[k])
        note = f"planned at: the largest {role}, {'x'.join(map(str, shape))} ({role}s vary in size)"
    else:
        side = int(np.median(shapes[:, :2].min(axis=1)))
        shape = (side, side, first.channels)
        lo, hi = shapes[:, :2].min(0), shapes[:, :2].max(0)
        note = (f"planned at: a {side}x{side} crop, the median shorter side, as `dataprep bench` serves it ({role}s vary "
                f"in size, heights {lo[0]}..{hi[0]}, widths {lo[1]}..{hi[1]}, and the Loader serves them cropped: pass --crop for yours)")
    return [Part(*f.served_as(shape)) for f in fields.values() if hasattr(f, "served_as")], [note]


def _row_parts(fields: dict, m: dict) -> tuple[list[Part], list[str]]:
    """A table row as TabularDataset (categorical="separate") serves it: (features, categorical codes as
    int64, mask, datetimes, target: int64 classes or the stored regression value), of the fields the pack has."""
    served = {"features": None, "categorical": "int64", "mask": None, "datetimes": None,
              "target": "int64" if m["fields"]["target"].get("task") == "classification" else None}
    parts = [Part(name, fields[name].row_shape, dt or fields[name].np_dtype.name) for name, dt in served.items() if name in fields]
    return parts, [f"planned at: one row ({', '.join(p.name for p in parts)}), as TabularDataset serves it"]


def nodes_needed(manifest: dict[str, Any], split: str, cache_bytes: int, budget: int, in_flight: int,
                 seed: int = 0) -> tuple[int | None, int]:
    """The fewest nodes whose partitioned cache (serve/partition.py: shards dealt into parts of nearly
    equal samples) keeps the largest part plus `in_flight` within `budget` bytes a node, and that part's
    bytes (cache bytes in proportion to its samples). (None, bytes at one shard a node) when no count does."""
    from ..serve.partition import Partition

    counts = [int(s["count"]) for s in manifest["splits"][split]["shards"]]
    total = max(sum(counts), 1)
    part = cache_bytes
    for n in range(1, len(counts) + 1):
        part = -(-cache_bytes * Partition(n, 0, seed).length(counts) // total)
        if part + in_flight <= budget:
            return n, part
    return None, part
