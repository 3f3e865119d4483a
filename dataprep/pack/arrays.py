"""Array loading: takes a split's shard records, gives each stored array as one contiguous buffer (read
into memory an allocator gives, or the shard files mapped: `Segments`), with the little-endian dtypes of
the format (`OFFSETS`, `SHAPES`, `BYTES`), blob-plus-offsets packing (`blob_arrays`), row gathers
(`take_rows`), a sequence of strings over one blob (`Strings`) and the guard that a mapped file is
still the one loaded (`MapGuard`). What fields (pack/fields.py) are made of; names no field and no kind.

Variable-length data (JPEG bytes, UTF-8 paths, token runs, differently sized pixels) is one blob plus
int64 offsets per shard; on load, shards are concatenated into one blob and one offsets array,
which is what lets forked DataLoader workers share the cache without copy-on-read.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import PackError
from .shard import map_npy, read_npy_into

OFFSETS = np.dtype("<i8")
SHAPES = np.dtype("<i4")
BYTES = np.dtype("|u1")


def blob_arrays(chunks: Sequence[np.ndarray], blob: str, offsets: str) -> dict[str, np.ndarray]:
    """Concatenate byte chunks into one blob plus n+1 offsets (the shard-side half of a blob field)."""
    off = np.zeros(len(chunks) + 1, OFFSETS)
    if chunks:
        np.cumsum([c.nbytes for c in chunks], out=off[1:])
    data = np.concatenate([c.reshape(-1).view(np.uint8) for c in chunks]) if chunks else np.zeros(0, BYTES)
    return {blob: data.astype(BYTES, copy=False), offsets: off}


def _shard_file(split_dir: Path, shard: dict[str, Any], name: str) -> tuple[str, dict[str, Any]]:
    """A shard file's path (a str: thousands are made per load, and pathlib is slow at it) and record."""
    fname = f"{name}.npy"
    rec = shard.get("files", {}).get(fname)
    if not isinstance(rec, dict) or not isinstance(rec.get("shape"), list) or not rec["shape"]:
        raise PackError(f"{split_dir / str(shard.get('name'))}: manifest lists no usable {fname}")
    return os.path.join(split_dir, str(shard["name"]), fname), rec


def _alloc(key: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return np.empty(shape, dtype)


class _NpyFiles:
    """Reads shard files as they lie on disk (the npy backend's reads, without a pack around them)."""

    read = staticmethod(read_npy_into)
    map = staticmethod(map_npy)


NPY_FILES = _NpyFiles()


@dataclass
class LoadContext:
    """How a split's arrays are brought in: where buffers come from (`alloc(key, shape, dtype)`: private
    RAM by default, a shared-memory segment for cache="shm"), whether a field's large data arrays are
    mapped from the shard files instead of read (`mapped`, cache="mmap"), checksum verification, progress
    in bytes, and which backend reader gives a shard file's array (npy files by default; HDF5 or Zarr
    give the same arrays)."""

    verify: bool = False
    alloc: Callable[[str, tuple[int, ...], np.dtype], np.ndarray] = _alloc
    mapped: bool = False
    progress: Callable[[int], None] | None = None
    reader: Any = None  # the pack's backend reader (pack/backends); default: npy shard files

    def __post_init__(self) -> None:
        if self.reader is None:
            self.reader = NPY_FILES

    def read(self, path: Path, rec: dict[str, Any], out: np.ndarray | None = None) -> np.ndarray:
        arr = self.reader.read(path, rec, out, self.verify)
        if self.progress:
            self.progress(arr.nbytes)
        return arr

    def map(self, path: Path, rec: dict[str, Any]) -> np.ndarray:
        arr = self.reader.map(path, rec, self.verify)
        if self.progress:
            self.progress(arr.nbytes)
        return arr


def counts(shards: list[dict]) -> list[int]:
    try:
        out = [int(s["count"]) for s in shards]
    except (KeyError, TypeError, ValueError) as e:
        raise PackError(f"malformed shard entry in the manifest ({e})") from None
    if any(n < 0 for n in out):
        raise PackError("a shard entry in the manifest has a negative count")
    return out


def blob_shapes(split_dir: Path, shards: list[dict], blob: str, offsets: str) -> tuple[tuple[int], tuple[int]]:
    """Shapes of the concatenated blob and the global offsets of a blob field."""
    size = sum(int(_shard_file(split_dir, s, blob)[1]["shape"][0]) for s in shards)
    return (size,), (sum(counts(shards)) + 1,)


def rows_shape(shards: list[dict], row_shape: tuple) -> tuple[int, ...]:
    return (sum(counts(shards)), *row_shape)


def load_blob(split_dir: Path, shards: list[dict], blob: str, offsets: str, ctx: LoadContext | None = None,
              map_data: bool = False, dtype: np.dtype = BYTES) -> tuple[np.ndarray, np.ndarray]:
    """Read every shard's blob (bytes, or items of `dtype`) and offsets into one contiguous blob (or map
    each shard's, as Segments) and one global offsets array (in items), checking both."""
    ctx = ctx or LoadContext()
    (total,), (noffs,) = blob_shapes(split_dir, shards, blob, offsets)
    for s, n in zip(shards, counts(shards)):  # every record agrees with its shard before anything is allocated
        opath, orec = _shard_file(split_dir, s, offsets)
        if orec["shape"] != [n + 1] or (orec.get("bytes") is not None and int(orec["bytes"]) < 8 * (n + 1)):
            raise PackError(f"{opath}: holds {orec['shape']} offsets ({orec.get('bytes')} bytes) for {n} samples")
        bpath, brec = _shard_file(split_dir, s, blob)
        if brec.get("bytes") is not None and int(brec["bytes"]) < int(brec["shape"][0]) * np.dtype(dtype).itemsize:
            raise PackError(f"{bpath}: its record says {brec['bytes']} bytes, too few for {brec['shape'][0]} items")
    if _whole_arrays(ctx, shards):
        return _load_blob_whole(split_dir, shards, blob, offsets, ctx, map_data, total, noffs, dtype)
    data = None if map_data else ctx.alloc(blob, (total,), dtype)
    parts = []
    offs = ctx.alloc(offsets, (noffs,), OFFSETS)
    pos = start = 0
    for s, n in zip(shards, counts(shards)):
        path, rec = _shard_file(split_dir, s, blob)
        size = int(rec["shape"][0])
        if map_data:
            parts.append(ctx.map(path, rec))
        else:
            ctx.read(path, rec, data[pos : pos + size])
        opath, orec = _shard_file(split_dir, s, offsets)
        if orec["shape"] != [n + 1]:
            raise PackError(f"{opath}: holds {orec['shape']} offsets for {n} samples")
        local = ctx.read(opath, orec)
        if local[0] != 0 or local[-1] != size or (n and np.any(np.diff(local) < 0)):
            raise PackError(f"{opath}: offsets are not monotonic within the {size}-item blob {os.path.basename(path)}")
        offs[start : start + n] = local[:-1] + pos
        pos += size
        start += n
    offs[-1] = pos
    return (Segments(parts) if map_data else data), offs


def load_rows(split_dir: Path, shards: list[dict], name: str, dtype: np.dtype, row_shape: tuple,
              ctx: LoadContext | None = None, map_data: bool = False) -> np.ndarray:
    """Read a fixed-shape array (labels, shapes, pixels) of every shard into one (N, *row_shape) array,
    or map each shard's (as Segments)."""
    ctx = ctx or LoadContext()
    whole = _whole_arrays(ctx, shards)
    files = []
    for s, n in zip(shards, counts(shards)):  # every record agrees with its shard before anything is allocated
        path, rec = _shard_file(split_dir, s, name)
        if rec["shape"] != [n, *row_shape] or rec.get("dtype") != dtype.str:
            raise PackError(f"{path}: holds {rec.get('dtype')} {rec['shape']}, expected {dtype.str} {[n, *row_shape]}")
        if rec.get("bytes") is not None and int(rec["bytes"]) < n * math.prod(row_shape) * dtype.itemsize:
            raise PackError(f"{path}: its record says {rec['bytes']} bytes, too few for {n} rows of {list(row_shape)} {dtype.str}")
        files.append((path, rec, n))
    out = None if map_data else ctx.alloc(name, rows_shape(shards, row_shape), dtype)
    parts = []
    start = 0
    for path, rec, n in files:
        if whole:
            continue
        if map_data:
            parts.append(ctx.map(path, rec))
        else:
            ctx.read(path, rec, out[start : start + n])
        start += n
    if whole:
        return _whole(ctx, split_dir.name, name, out, map_data)
    return Segments(parts) if map_data else out


def _whole_arrays(ctx: LoadContext, shards: list[dict]) -> bool:
    """Whether the backend stores the split concatenated, so each array is read in one piece (checksums,
    which cover each shard's file, are checked piece by piece instead)."""
    return bool(shards) and not ctx.verify and hasattr(ctx.reader, "whole")


def _whole(ctx: LoadContext, split: str, name: str, out: np.ndarray | None, map_data: bool):
    arr = ctx.reader.map_whole(split, name) if map_data else ctx.reader.whole(split, name, out)
    if ctx.progress:
        ctx.progress(arr.nbytes)
    return Segments([arr]) if map_data else arr  # mapped: guarded against truncation like npy shard files


def _load_blob_whole(split_dir: Path, shards: list[dict], blob: str, offsets: str, ctx: LoadContext, map_data: bool,
                     total: int, noffs: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    data = _whole(ctx, split_dir.name, blob, None if map_data else ctx.alloc(blob, (total,), dtype), map_data)
    offs = _whole(ctx, split_dir.name, offsets, ctx.alloc(offsets, (noffs,), OFFSETS), False)
    sizes = [int(_shard_file(split_dir, s, blob)[1]["shape"][0]) for s in shards]
    starts = np.concatenate([[0], np.cumsum(counts(shards))])
    ends = np.concatenate([[0], np.cumsum(sizes)])
    if len(offs) != noffs or offs[0] != 0 or offs[-1] != total or np.any(np.diff(offs) < 0) or not np.array_equal(offs[starts], ends):
        raise PackError(f"{ctx.reader.root}: {split_dir.name}/{offsets} is not monotonic within the {total}-item {blob}, "
                        "or disagrees with the shard records")
    return data, offs


class MapGuard:
    """Mapped shard files checked before they are read: a file truncated while mapped (a rebuild in place,
    a damaged disk) would kill the process with SIGBUS on the first read past its new end; a stat per
    access turns that into a PackError naming the file."""

    def __init__(self, arrays: Sequence[np.ndarray]):
        self.files = [(getattr(a, "filename", None), int(getattr(a, "offset", 0)) + a.nbytes) for a in arrays]

    def check(self, k: int | None = None) -> None:
        for path, need in (self.files if k is None else [self.files[k]]):
            if path is None:
                continue
            try:
                size = os.stat(path).st_size
            except OSError as e:
                raise PackError(f"{path}: a mapped shard file is gone ({e.strerror or e}); reopen the dataset") from None
            if size < need:
                raise PackError(f"{path}: truncated to {size} bytes while mapped ({need} needed); the pack changed on "
                                "disk under a running job: verify it, then reopen the dataset")


class Segments:
    """One logical array kept as several pieces (one per shard file, memory-mapped), addressed by
    global row; a slice must fall within one piece, which holds for samples (none spans shards). Every
    access first checks that the piece's file still holds it (`MapGuard`)."""

    def __init__(self, parts: list[np.ndarray]):
        self.parts = parts
        self.guard = MapGuard(parts)
        self.starts = np.zeros(len(parts) + 1, np.int64)
        np.cumsum([len(p) for p in parts], out=self.starts[1:])
        self.dtype = parts[0].dtype if parts else BYTES
        self.shape = (int(self.starts[-1]), *(parts[0].shape[1:] if parts else ()))
        self.nbytes = sum(p.nbytes for p in parts)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def _part(self, i: int) -> int:
        return int(np.searchsorted(self.starts, i, "right")) - 1

    def __getitem__(self, key):
        if isinstance(key, slice):
            k = self._part(key.start)
            base = self.starts[k]
            self.guard.check(k)
            return self.parts[k][key.start - base : key.stop - base]
        k = self._part(key)
        self.guard.check(k)
        return self.parts[k][key - self.starts[k]]

    def setflags(self, write: bool) -> None:
        pass  # maps are opened read-only


def take_rows(arr, idx: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Gather rows `idx` of an array or Segments into the preallocated `out`."""
    if not isinstance(arr, Segments):
        return np.take(arr, idx, axis=0, out=out)
    part = np.searchsorted(arr.starts, idx, "right") - 1
    for k in np.unique(part):
        arr.guard.check(int(k))
        sel = part == k
        out[sel] = arr.parts[k][idx[sel] - arr.starts[k]]
    return out


class Strings:
    """A read-only sequence of str over one UTF-8 blob plus offsets (no per-item Python objects held)."""

    def __init__(self, blob: np.ndarray, offsets: np.ndarray):
        self._blob, self._offsets = blob, offsets

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, i: int | slice) -> str | list[str]:
        n = len(self)
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(n))]
        if not -n <= i < n:
            raise IndexError(f"index {i} out of range for {n} items")
        i %= n
        return self._blob[self._offsets[i] : self._offsets[i + 1]].tobytes().decode("utf-8", "surrogateescape")

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __eq__(self, other) -> bool:
        """Equal by value, as a list of the same strings is: `ds.sources == other.sources` compares what the
        two packs hold, not which objects they are (and a list or tuple of str compares too)."""
        if isinstance(other, Strings):
            if len(self) != len(other):
                return False
            a, b = self._span(), other._span()
            if a is not None and b is not None:
                return bool(np.array_equal(a[1], b[1]) and np.array_equal(a[0], b[0]))
            return all(x == y for x, y in zip(self, other))
        if isinstance(other, (list, tuple)):
            return len(self) == len(other) and all(x == y for x, y in zip(self, other))
        return NotImplemented

    __hash__ = None  # equal by value, as a list is, and so unhashable as a list is

    def _span(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(the bytes of every item, offsets from 0) when both are plain arrays: equality without decoding."""
        if not (isinstance(self._blob, np.ndarray) and isinstance(self._offsets, np.ndarray)):
            return None
        offs = np.asarray(self._offsets, np.int64)
        return np.asarray(self._blob[offs[0] : offs[-1]]), offs - offs[0]

    def __repr__(self) -> str:
        head = ", ".join(repr(x) for x in self[:3])
        return f"Strings([{head}{', ...' if len(self) > 3 else ''}], {len(self)} items)"
