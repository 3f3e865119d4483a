"""Memory planner: takes what a sample holds (or a pack), batch size, workers, prefetch, cache mode and
ranks, gives the bytes each part of training input needs, and whether it fits in this machine's RAM.

The comparison columns show the same batches as they are often written (float32 images, int64
masks), which is where the saving of uint8 shows.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


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

    def lines(self) -> list[str]:
        def b(n: int) -> str:
            return f"{n:,} B ({n / 1e9:.2f} GB)" if n >= 1e8 else f"{n:,} B"

        out = ["per sample:"]
        for p in self.parts:
            shape = "x".join(map(str, p.shape)) or "scalar"
            cmp = ""
            if p.compare_dtype and p.compare_dtype != p.dtype:
                cmp = f"   as {p.compare_dtype}: {p.compare_nbytes:,} B ({p.compare_nbytes / max(p.nbytes, 1):.0f}x)"
            out.append(f"  {p.name:8s} {shape:>14s} {p.dtype:8s} {p.nbytes:>14,} B{cmp}")
        out.append(f"per batch of {self.batch_size}: {b(self.per_batch)}   as commonly written: {b(self.per_batch_compared)}")
        for p in self.parts:
            if p.compare_dtype and p.compare_dtype != p.dtype:
                out.append(f"  {p.name:8s} {p.nbytes * self.batch_size:>14,} B as {p.dtype}, "
                           f"{p.compare_nbytes * self.batch_size:,} B as {p.compare_dtype}")
        out.append(
            f"in flight: {self.ranks} rank(s) x {self.batches_in_flight} batches ({self.workers} workers x prefetch "
            f"{self.prefetch}): {b(self.in_flight)}   as commonly written: {b(self.in_flight_compared)}"
        )
        copies = f"{self.ranks} copies, one per rank" if self.cache == "ram" and self.ranks > 1 else "one copy per machine"
        out.append(f"cache ({self.cache}, {copies}): {b(self.cache_total)}")
        out.append(f"total: {b(self.total)}")
        if self.free_ram is not None:
            verdict = "fits" if self.fits else "does NOT fit"
            out.append(f"available RAM: {b(self.free_ram)}: {verdict}")
        out.extend(self.notes)
        return out


def parts_from_pack(pack: str | Path, split: str = "train") -> tuple[list[Part], int, list[str]]:
    """The served sample of a pack (its largest image or volume; its mask; its label as int64), and the
    split's size in bytes. Reads only the manifest and the shapes array, whatever the backend; the pack's
    kind names the served fields, and each field says what it puts in a batch (`served_as`)."""
    from ..errors import PackError
    from ..kinds import kind_of
    from ..pack.backends import open_reader

    reader = open_reader(pack)
    try:
        m = reader.manifest
        fields = kind_of(m, pack).served_fields(m, None, pack)
        first = next(iter(fields.values()))
        if not hasattr(first, "shapes_name"):
            raise PackError(f"{pack}: plan knows packs of images, masks and volumes; this is a {m['kind']!r} pack")
        if split not in m["splits"]:
            raise PackError(f"{pack}: no split {split!r}; the pack has {sorted(m['splits'])}")
        plans = reader.plans(split)
        name = first.shapes_name
        shapes = reader.global_slice(split, name, 0, plans[name].total_rows) if name in plans else np.zeros((0, 3), np.int32)
    finally:
        reader.close()
    notes = []
    if first.fixed:
        shape = tuple(first.shape)
    else:
        k = int(np.argmax(shapes.astype(np.int64).prod(axis=1))) if len(shapes) else 0
        shape = tuple(int(v) for v in shapes[k]) if len(shapes) else (0, 0, first.channels or 0)
        notes.append(f"{first.role}s vary in size: planned with the largest, {'x'.join(map(str, shape))}")
    parts = [Part(*f.served_as(shape)) for f in fields.values() if hasattr(f, "served_as")]
    size = sum(f["bytes"] for s in m["splits"][split]["shards"] for f in s["files"].values())
    return parts, size, notes
