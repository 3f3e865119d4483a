"""Fields: each owns both directions of one column of a pack, how a shard's arrays are written and how
a split is read back into a few contiguous RAM buffers, and describes itself in the manifest (the
`Field` protocol). This module names no pack kind: it holds the protocol, the fields every kind shares
(`StringsField` for paths, `LabelField`, `RowsField` for fixed-shape columns, `IdsField` for runs of token ids) and the loading
machinery the kinds' own fields (images/field.py, tokens/field.py, ...) are made of.

Variable-length data (JPEG bytes, UTF-8 paths, token runs, differently sized pixels) is one blob plus
int64 offsets per shard; on load, shards are concatenated into one blob and one offsets array,
which is what lets forked DataLoader workers share the cache without copy-on-read.

In the manifest every field lists its stored arrays (`"arrays"`). A field whose `layout` is not
"fixed" and that lists two or more arrays stores a blob and its offsets first (then any per-sample
arrays): that rule, `offsets_in`, is how the storage backends learn which arrays are offsets and
rebase them, without knowing any kind (it holds for every pack of format version 1).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

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


# -- the Field protocol and the fields every kind shares ----------------------------------------------
class Field(Protocol):
    """One column of a pack, both directions, as ffcv's Field: which arrays a shard stores (written by the
    kind's build through its own `shard_arrays`), how the field describes itself in the manifest, and
    how a split's arrays come back. Loaded arrays are keyed by the field's generic keys, distinct across
    the fields of one split, so a split's fields load into one flat dict."""

    def to_manifest(self) -> dict[str, Any]:
        """The field's manifest description; it lists its stored arrays under "arrays"."""

    def stored(self) -> dict[str, str]:
        """Stored array name -> the generic key `load` gives it under."""

    def layout(self, split_dir: Path, shards: list[dict]) -> list[tuple[str, tuple[int, ...], np.dtype]]:
        """Every array `load` allocates: (stored name, shape, dtype), in load order."""

    def load(self, split_dir: Path, shards: list[dict], ctx: LoadContext | None = None) -> dict[str, Any]:
        """The arrays of `layout`, by generic key, checked against each other."""

    def count(self, arrays: dict[str, Any]) -> int:
        """How many samples the loaded arrays hold."""

    def check(self, arrays: dict[str, Any], deep: bool = False) -> list[str]:
        """What is wrong with loaded arrays (values out of range, ...); `deep` also decodes what is
        encoded (verify --decode). Empty when all is well."""

    def describe(self) -> str:
        """One line for `dataprep info`."""


def offsets_in(manifest: dict[str, Any]) -> dict[str, str]:
    """Offsets array -> the array it indexes, for every field of the manifest (the rule in the module
    docstring: a field not of "fixed" layout that lists two or more arrays stores a blob, then its offsets)."""
    out = {}
    for spec in manifest.get("fields", {}).values():
        arrays = spec.get("arrays") if isinstance(spec, dict) else None
        if isinstance(arrays, list) and len(arrays) >= 2 and spec.get("layout") != "fixed":
            out[str(arrays[1])] = str(arrays[0])
    return out


def encoded_arrays(manifest: dict[str, Any]) -> set[str]:
    """Arrays that hold already-compressed bytes (JPEG), which a compressing backend stores as they are."""
    return {str(spec["arrays"][0]) for spec in manifest.get("fields", {}).values()
            if isinstance(spec, dict) and spec.get("encoding") in COMPRESSED_ENCODINGS and spec.get("arrays")}


COMPRESSED_ENCODINGS = ("jpeg",)


@dataclass(frozen=True)
class StringsField:
    """A UTF-8 string per sample (source paths), as one byte blob plus offsets; served as `Strings`."""

    key: str = "source"  # the manifest's field name
    blob: str = "sources"
    offsets: str = "source_offsets"
    relative_to: str = "source.root"

    def to_manifest(self) -> dict[str, Any]:
        return {"encoding": "utf-8", "relative_to": self.relative_to, "arrays": [self.blob, self.offsets]}

    @classmethod
    def from_manifest(cls, key: str, spec: dict[str, Any], where: Path | str) -> "StringsField":
        try:
            blob, offsets = (str(a) for a in spec["arrays"])
            return cls(key, blob, offsets, str(spec.get("relative_to", "")))
        except (KeyError, TypeError, ValueError) as e:
            raise PackError(f"{where}: malformed {key} field description ({e})") from None

    def shard_arrays(self, items: Sequence[str]) -> dict[str, np.ndarray]:
        chunks = [np.frombuffer(s.encode("utf-8", "surrogateescape"), np.uint8) for s in items]
        return blob_arrays(chunks, self.blob, self.offsets)

    def stored(self) -> dict[str, str]:
        return {self.blob: self.blob, self.offsets: self.offsets}

    def layout(self, split_dir: Path, shards: list[dict]) -> list[tuple[str, tuple[int, ...], np.dtype]]:
        blob, offs = blob_shapes(split_dir, shards, self.blob, self.offsets)
        return [(self.blob, blob, BYTES), (self.offsets, offs, OFFSETS)]

    def load(self, split_dir: Path, shards: list[dict], ctx: LoadContext | None = None) -> dict[str, Any]:
        blob, offsets = load_blob(split_dir, shards, self.blob, self.offsets, ctx)
        return {self.blob: blob, self.offsets: offsets}

    def count(self, arrays: dict[str, Any]) -> int:
        return len(arrays[self.offsets]) - 1

    def check(self, arrays: dict[str, Any], deep: bool = False) -> list[str]:
        return []

    def strings(self, arrays: dict[str, Any]) -> "Strings":
        return Strings(arrays[self.blob], arrays[self.offsets])

    def describe(self) -> str:
        return f"UTF-8 strings, relative to {self.relative_to}"


@dataclass(frozen=True)
class IdsField:
    """A run of integer ids per sample (token ids: a document, a caption): one array of `dtype` (uint16 or
    uint32) per shard plus int64 offsets into it, in ids; every id below `vocab_size` (`check`)."""

    dtype: str
    vocab_size: int = 0
    tokens: str = "tokens"
    offsets: str = "offsets"

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(self.dtype)

    def shard_arrays(self, ids: np.ndarray, lengths: Sequence[int]) -> dict[str, np.ndarray]:
        offsets = np.zeros(len(lengths) + 1, OFFSETS)
        np.cumsum(lengths, out=offsets[1:])
        return {self.tokens: ids.astype(self.np_dtype, copy=False), self.offsets: offsets}

    def stored(self) -> dict[str, str]:
        return {self.tokens: self.tokens, self.offsets: self.offsets}

    def layout(self, split_dir: Path, shards: list[dict]) -> list[tuple[str, tuple[int, ...], np.dtype]]:
        toks, offs = blob_shapes(split_dir, shards, self.tokens, self.offsets)
        return [(self.tokens, toks, self.np_dtype), (self.offsets, offs, OFFSETS)]

    def load(self, split_dir: Path, shards: list[dict], ctx: LoadContext | None = None) -> dict[str, Any]:
        """The split's ids as one array in RAM and the offsets into it (checked to run forward in each shard)."""
        ids, offsets = load_blob(split_dir, shards, self.tokens, self.offsets, ctx, dtype=self.np_dtype)
        return {self.tokens: ids, self.offsets: offsets}

    def count(self, arrays: dict[str, Any]) -> int:
        return len(arrays[self.offsets]) - 1

    def check(self, arrays: dict[str, Any], deep: bool = False) -> list[str]:
        top = int(np.asarray(arrays[self.tokens]).max(initial=0))
        return [f"{self.tokens}.npy: a token id is beyond the vocabulary of {self.vocab_size}"] if top >= self.vocab_size else []


@dataclass(frozen=True)
class RowsField:
    """A fixed-shape row per sample (table columns, class labels): one (N, *row_shape) array of `dtype`,
    mapped with cache="mmap" when `mappable`."""

    name: str
    dtype: str
    row_shape: tuple[int, ...] = ()
    mappable: bool = True

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(self.dtype)

    def to_manifest(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "arrays": [self.name]}

    def stored(self) -> dict[str, str]:
        return {self.name: self.name}

    def layout(self, split_dir: Path, shards: list[dict]) -> list[tuple[str, tuple[int, ...], np.dtype]]:
        return [(self.name, rows_shape(shards, self.row_shape), self.np_dtype)]

    def load(self, split_dir: Path, shards: list[dict], ctx: LoadContext | None = None) -> dict[str, Any]:
        ctx = ctx or LoadContext()
        return {self.name: load_rows(split_dir, shards, self.name, self.np_dtype, self.row_shape, ctx,
                                     map_data=ctx.mapped and self.mappable)}

    def count(self, arrays: dict[str, Any]) -> int:
        return len(arrays[self.name])

    def check(self, arrays: dict[str, Any], deep: bool = False) -> list[str]:
        return []

    def describe(self) -> str:
        return f"{self.np_dtype.name} rows of shape {self.row_shape or 'scalar'}"


@dataclass(frozen=True)
class LabelField(RowsField):
    """A class index per sample in the smallest dtype that holds `num_classes` (`label_dtype`)."""

    name: str = "labels"
    dtype: str = "|u1"
    row_shape: tuple[int, ...] = ()
    mappable: bool = False  # small: read into RAM even with cache="mmap"
    num_classes: int = 0

    @classmethod
    def for_classes(cls, num_classes: int) -> "LabelField":
        return cls(dtype=label_dtype(num_classes).str, num_classes=num_classes)

    @classmethod
    def from_manifest(cls, spec: dict[str, Any], where: Path | str) -> "LabelField":
        try:
            return cls(str(spec.get("arrays", ["labels"])[0]), np.dtype(spec["dtype"]).str, num_classes=int(spec["num_classes"]))
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise PackError(f"{where}: malformed label field description ({e})") from None

    def to_manifest(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "num_classes": self.num_classes, "arrays": [self.name]}

    def shard_arrays(self, labels: Sequence[int]) -> dict[str, np.ndarray]:
        return {self.name: np.asarray(labels, np.int64).astype(self.np_dtype)}

    def served_as(self, largest: tuple[int, ...]) -> tuple[str, tuple[int, ...], str, str | None]:
        return "label", (), "int64", None  # batches carry int64 labels

    def check(self, arrays: dict[str, Any], deep: bool = False) -> list[str]:
        labels = arrays[self.name]
        if not len(labels):
            return []
        lo, hi = int(labels.min()), int(labels.max())  # a manifest may declare a signed dtype: below 0 is out too
        if lo < 0 or hi >= self.num_classes:
            return [f"{self.name}.npy: a label is {lo if lo < 0 else hi}, but the pack has {self.num_classes} classes "
                    f"(0 to {self.num_classes - 1})"]
        return []

    def describe(self) -> str:
        return f"{self.np_dtype.name} class labels, {self.num_classes} classes"

