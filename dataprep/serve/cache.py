"""Cache stage: takes a pack's split, the fields a dataset names and a cache mode, gives their arrays in
memory, one copy per machine. It knows no pack kind: each field says what it loads and how it is checked.

- "ram":  read into this process's memory as a few contiguous buffers; forked DataLoader workers share
          them (numpy buffers have no per-object reference counts to copy on read).
- "mmap": map the pack's shard files; the OS page cache is the one copy for every worker and every rank.
          Small arrays (offsets, labels, shapes, paths) are read into RAM.
- "shm":  copy the split once into a file in /dev/shm named after the pack's identity, and map it in
          every process on the node (torchrun ranks included). Two lock files per segment: "fill" is
          held exclusively, briefly, to check for the segment and fill it if missing (a temporary
          file, published by rename); "users" is held shared by every process attached. The last user
          to leave (its exclusive try on "users", under "fill") removes the segment. A segment a
          crash left behind is complete (it was renamed only when full) and is reused; a half-filled
          temporary one is replaced. Never a FileExistsError.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..errors import DataprepError, PackError
from ..pack.arrays import LoadContext
from ..pack.backends import open_reader
from ..pack.fields import Field
from ..progress import Progress
from .shm import ShmSegment, _nbytes

CACHE_MODES = ("ram", "mmap", "shm")
PROGRESS_BYTES = 1 << 30  # show loading progress by default from 1 GiB up


@dataclass
class CachedSplit:
    """A split's arrays, wherever they live, plus the fields that describe them."""

    manifest: dict[str, Any]
    fields: dict[str, Field]  # by manifest key, in the order the dataset named them
    arrays: dict[str, Any]  # by the fields' generic keys
    segment: "ShmSegment | None" = None
    shards: "list[int] | None" = None  # the split's shards held (a partitioned cache's part), None: all

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())


def open_split(pack: str | os.PathLike, split: str, fields_of: Callable[[dict[str, Any]], dict[str, Field]],
               cache: str = "ram", verify: bool = False, progress: bool | None = None,
               kinds: tuple[str, ...] = (), modes: tuple[str, ...] = CACHE_MODES,
               part: "Callable[[list[int]], list[int]] | None" = None) -> CachedSplit:
    """Bring a split of a pack whose kind is one of `kinds` into memory according to `cache`, checking it
    on the way. `fields_of(manifest)` names the fields to load (the dataset's kind knows which); every
    one must count the split's samples (or, with `part`, the samples of the shards `part(shard counts)`
    names: a node's share of a partitioned cache), and none may report a problem."""
    if cache not in modes:
        raise DataprepError(f"unknown cache mode {cache!r}; choose one of {list(modes)}")
    pack = Path(pack)
    reader = open_reader(pack)  # opened once: its manifest, then its arrays
    m = reader.manifest
    if kinds and m["kind"] not in kinds:
        raise PackError(f"{pack}: a {m['kind']!r} pack, not {' or '.join(repr(k) for k in kinds)}")
    if split not in m["splits"]:
        raise PackError(f"{pack}: no split {split!r}; the pack has {sorted(m['splits'])}")
    fields = fields_of(m)
    shards = m["splits"][split]["shards"]
    held = None
    if part is not None:
        if hasattr(reader, "whole"):
            raise DataprepError(f"{pack}: a partitioned cache holds whole shards of npy packs (local or at a URL); "
                                f"this pack is {reader.name}: convert it with dataprep convert --to npy")
        held = part([int(s["count"]) for s in shards])
        shards = [shards[k] for k in held]
    plan = [a for f in fields.values() for a in f.layout(pack / split, shards)]
    total = sum(_nbytes(s, d) for _, s, d in plan)
    if cache == "ram":
        _check_ram(pack, total)
    report = Progress(f"loading {pack}/{split} ({cache})", total, "bytes", show=True, final=bool(progress)) \
        if (progress or (progress is None and total >= PROGRESS_BYTES)) else None  # a bar on a terminal, lines in a log
    ctx = LoadContext(verify=verify, mapped=cache == "mmap", progress=report.update if report else None, reader=reader)

    from ..remote.packs import fetch_kept, origin  # here: `dataprep --help` reads CACHE_MODES from this module

    remote, keep = origin(pack)
    needed = remote.shard_files([split], {name for name, _, _ in plan}, {s["name"] for s in shards}) if remote else []

    if remote and not keep:  # ram, shm: the files' bytes go straight into the cache, no local copy
        from ..remote.memory import MemoryFetch

        ctx.reader = reader = MemoryFetch(remote.store, pack, needed, reader)

    def load(c: LoadContext) -> dict[str, Any]:
        if remote and keep:
            fetch_kept(pack, remote, needed)
        arrays: dict[str, Any] = {}
        for f in fields.values():
            arrays.update(f.load(pack / split, shards, c))
        return arrays

    try:
        arrays, segment = _bring(pack, split, m, fields, plan, cache, verify, held, load, ctx, reader, total)
    finally:
        if remote and not keep:
            reader.close()  # its fetch threads
    if report:
        report.close()
    for a in arrays.values():
        a.setflags(write=False)  # the cache is shared: nobody may scribble on it
    n = m["splits"][split]["count"] if held is None else sum(int(s["count"]) for s in shards)
    for key, f in fields.items():
        if f.count(arrays) != n:
            raise PackError(f"{pack / split}: manifest counts {n} samples, the shards' {key} field holds {f.count(arrays)}")
        problems = f.check(arrays)
        if problems:
            raise PackError(f"{pack / split}: {key}: {problems[0]}")
    return CachedSplit(m, fields, arrays, segment, held)


def _bring(pack, split, m, fields, plan, cache, verify, held, load, ctx, reader, total):
    """The split's arrays: a shared-memory segment attached (filled by `load` if missing) or loaded."""
    segment = None
    if cache == "shm":
        what = f"{split}/{next(iter(fields))}" + ("" if held is None else f"/shards:{','.join(map(str, held))}")
        segment = ShmSegment.attach(pack, m, what, plan,  # a node's part is a segment of its own
                                    lambda alloc: load(LoadContext(verify, alloc, False, ctx.progress, reader)),
                                    verify and held is None, split)
        generic = {name: key for f in fields.values() for name, key in f.stored().items()}
        arrays = {generic.get(k, k): v for k, v in segment.arrays.items()}
    else:
        try:
            arrays = load(ctx)
        except MemoryError:
            raise DataprepError(f"{pack}/{split}: the manifest declares {total / 1e9:,.1f} GB of arrays and they do not fit in "
                                f"memory; if the pack is not that large, its manifest is damaged (run dataprep verify {pack})") from None
    return arrays, segment


def available_ram() -> int:
    """MemAvailable from /proc/meminfo (bytes), or a large number where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


def _check_ram(pack: Path, total: int) -> None:
    free = available_ram()
    if total > free:
        raise DataprepError(
            f"{pack}: loading it with cache='ram' needs {total / 1e9:.2f} GB, but only {free / 1e9:.2f} GB are "
            "available; use cache='mmap' (the page cache holds what fits and shares it) or free memory"
        )
