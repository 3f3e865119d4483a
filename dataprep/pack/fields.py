"""Fields: each owns both directions of one column of a pack, how a shard's arrays are written and how
a split is read back into a few contiguous RAM buffers, and describes itself in the manifest.

Variable-length data (JPEG bytes, UTF-8 paths, differently sized pixels) is one uint8 blob plus
int64 offsets per shard; on load, shards are concatenated into one blob and one offsets array,
which is what lets forked DataLoader workers share the cache without copy-on-read.
"""
from __future__ import annotations

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


def label_dtype(num_classes: int) -> np.dtype:
    """The smallest integer dtype that holds every label (little-endian)."""
    for dt in ("|u1", "<u2", "<u4"):
        if num_classes - 1 <= np.iinfo(np.dtype(dt)).max:
            return np.dtype(dt)
    raise PackError(f"{num_classes} classes do not fit in 32 bits")


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
    RAM by default, a shared-memory segment for cache="shm"), whether the big image arrays are mapped
    from the shard files instead of read (cache="mmap"), checksum verification, progress in bytes, and
    which backend reads a shard file's array (npy files by default; HDF5 or Zarr give the same arrays)."""

    verify: bool = False
    alloc: Callable[[str, tuple[int, ...], np.dtype], np.ndarray] = _alloc
    map_images: bool = False
    progress: Callable[[int], None] | None = None
    source: Any = None  # the pack's backend reader (pack/backends); default: npy shard files

    def __post_init__(self) -> None:
        if self.source is None:
            self.source = NPY_FILES

    def read(self, path: Path, rec: dict[str, Any], out: np.ndarray | None = None) -> np.ndarray:
        arr = self.source.read(path, rec, out, self.verify)
        if self.progress:
            self.progress(arr.nbytes)
        return arr

    def map(self, path: Path, rec: dict[str, Any]) -> np.ndarray:
        arr = self.source.map(path, rec, self.verify)
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
              map_data: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Read every shard's blob and offsets into one contiguous blob (or map each shard's, as Segments)
    and one global offsets array, checking both."""
    ctx = ctx or LoadContext()
    (total,), (noffs,) = blob_shapes(split_dir, shards, blob, offsets)
    if _whole_arrays(ctx, shards):
        return _load_blob_whole(split_dir, shards, blob, offsets, ctx, map_data, total, noffs)
    data = None if map_data else ctx.alloc(blob, (total,), BYTES)
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
            raise PackError(f"{opath}: offsets are not monotonic within the {size}-byte blob {os.path.basename(path)}")
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
    out = None if map_data else ctx.alloc(name, rows_shape(shards, row_shape), dtype)
    parts = []
    start = 0
    for s, n in zip(shards, counts(shards)):
        path, rec = _shard_file(split_dir, s, name)
        if rec["shape"] != [n, *row_shape] or rec.get("dtype") != dtype.str:
            raise PackError(f"{path}: holds {rec.get('dtype')} {rec['shape']}, expected {dtype.str} {[n, *row_shape]}")
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
    return bool(shards) and not ctx.verify and hasattr(ctx.source, "whole")


def _whole(ctx: LoadContext, split: str, name: str, out: np.ndarray | None, map_data: bool) -> np.ndarray:
    arr = ctx.source.map_whole(split, name) if map_data else ctx.source.whole(split, name, out)
    if ctx.progress:
        ctx.progress(arr.nbytes)
    return arr


def _load_blob_whole(split_dir: Path, shards: list[dict], blob: str, offsets: str, ctx: LoadContext, map_data: bool,
                     total: int, noffs: int) -> tuple[np.ndarray, np.ndarray]:
    data = _whole(ctx, split_dir.name, blob, None if map_data else ctx.alloc(blob, (total,), BYTES), map_data)
    offs = _whole(ctx, split_dir.name, offsets, ctx.alloc(offsets, (noffs,), OFFSETS), False)
    sizes = [int(_shard_file(split_dir, s, blob)[1]["shape"][0]) for s in shards]
    starts = np.concatenate([[0], np.cumsum(counts(shards))])
    ends = np.concatenate([[0], np.cumsum(sizes)])
    if len(offs) != noffs or offs[0] != 0 or offs[-1] != total or np.any(np.diff(offs) < 0) or not np.array_equal(offs[starts], ends):
        raise PackError(f"{ctx.source.root}: {split_dir.name}/{offsets} is not monotonic within the {total}-byte {blob}, "
                        "or disagrees with the shard records")
    return data, offs


class Segments:
    """One logical array kept as several pieces (one per shard file, memory-mapped), addressed by
    global row; a slice must fall within one piece, which holds for samples (none spans shards)."""

    def __init__(self, parts: list[np.ndarray]):
        self.parts = parts
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
            return self.parts[k][key.start - base : key.stop - base]
        k = self._part(key)
        return self.parts[k][key - self.starts[k]]

    def setflags(self, write: bool) -> None:
        pass  # maps are opened read-only


def take_rows(arr, idx: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Gather rows `idx` of an array or Segments into the preallocated `out`."""
    if not isinstance(arr, Segments):
        return np.take(arr, idx, axis=0, out=out)
    part = np.searchsorted(arr.starts, idx, "right") - 1
    for k in np.unique(part):
        sel = part == k
        out[sel] = arr.parts[k][idx[sel] - arr.starts[k]]
    return out


class Strings:
    """A read-only sequence of str over one UTF-8 blob plus offsets (no per-item Python objects held)."""

    def __init__(self, blob: np.ndarray, offsets: np.ndarray):
        self._blob, self._offsets = blob, offsets

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, i: int) -> str:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"index {i} out of range for {n} items")
        i %= n
        return self._blob[self._offsets[i] : self._offsets[i + 1]].tobytes().decode("utf-8", "surrogateescape")

    def __iter__(self):
        return (self[i] for i in range(len(self)))
