"""Fields: each owns both directions of one column of a pack, how a shard's arrays are written and how
a split is read back into a few contiguous RAM buffers, and describes itself in the manifest.

Variable-length data (JPEG bytes, UTF-8 paths, differently sized pixels) is one uint8 blob plus
int64 offsets per shard; on load, shards are concatenated into one blob and one offsets array,
which is what lets forked DataLoader workers share the cache without copy-on-read.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import PackError
from .shard import read_npy_into

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


def _shard_file(split_dir: Path, shard: dict[str, Any], name: str) -> tuple[Path, dict[str, Any]]:
    fname = f"{name}.npy"
    rec = shard.get("files", {}).get(fname)
    if rec is None:
        raise PackError(f"{split_dir / shard['name']}: manifest lists no {fname}")
    return split_dir / shard["name"] / fname, rec


def load_blob(split_dir: Path, shards: list[dict], blob: str, offsets: str, verify: bool) -> tuple[np.ndarray, np.ndarray]:
    """Read every shard's blob and offsets into one contiguous blob and one global offsets array, checking both."""
    sizes = [_shard_file(split_dir, s, blob)[1]["shape"][0] for s in shards]
    counts = [int(s["count"]) for s in shards]
    data = np.empty(sum(sizes), BYTES)
    offs = np.empty(sum(counts) + 1, OFFSETS)
    pos = start = 0
    for s, size, n in zip(shards, sizes, counts):
        path, rec = _shard_file(split_dir, s, blob)
        read_npy_into(path, rec, data[pos : pos + size], verify)
        opath, orec = _shard_file(split_dir, s, offsets)
        if orec["shape"] != [n + 1]:
            raise PackError(f"{opath}: holds {orec['shape']} offsets for {n} samples")
        local = read_npy_into(opath, orec, verify=verify)
        if local[0] != 0 or local[-1] != size or (n and np.any(np.diff(local) < 0)):
            raise PackError(f"{opath}: offsets are not monotonic within the {size}-byte blob {path.name}")
        offs[start : start + n] = local[:-1] + pos
        pos += size
        start += n
    offs[-1] = pos
    return data, offs


def load_rows(split_dir: Path, shards: list[dict], name: str, dtype: np.dtype, row_shape: tuple, verify: bool) -> np.ndarray:
    """Read a fixed-shape array (labels, shapes, pixels) of every shard into one (N, *row_shape) array."""
    counts = [int(s["count"]) for s in shards]
    out = np.empty((sum(counts), *row_shape), dtype)
    start = 0
    for s, n in zip(shards, counts):
        path, rec = _shard_file(split_dir, s, name)
        if rec["shape"] != [n, *row_shape] or np.dtype(rec["dtype"]) != dtype:
            raise PackError(f"{path}: holds {rec['dtype']} {rec['shape']}, expected {dtype.str} {[n, *row_shape]}")
        read_npy_into(path, rec, out[start : start + n], verify)
        start += n
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


@dataclass(frozen=True)
class ImageField:
    """Images, stored as JPEG bytes (`jpeg`) or decoded uint8 pixels (`raw`); pixels of one fixed shape are
    one (N, H, W, C) array, anything else a blob plus offsets, with every sample's (H, W, C) in `shapes`."""

    encoding: str  # "jpeg" | "raw"
    shape: tuple[int, int, int] | None  # fixed (H, W, C) of raw pixels, else None
    channels: int

    @property
    def fixed(self) -> bool:
        return self.encoding == "raw" and self.shape is not None

    def to_manifest(self) -> dict[str, Any]:
        return {
            "encoding": self.encoding,
            "layout": "fixed" if self.fixed else "blob",
            "dtype": BYTES.str,
            "shape": list(self.shape) if self.fixed else [None, None, self.channels],
            "channels": self.channels,
            "arrays": ["images", "shapes"] if self.fixed else ["images", "offsets", "shapes"],
        }

    @classmethod
    def from_manifest(cls, spec: dict[str, Any], where: Path) -> "ImageField":
        try:
            enc, channels = spec["encoding"], int(spec["channels"])
            shape = tuple(int(x) for x in spec["shape"]) if spec["layout"] == "fixed" else None
        except (KeyError, TypeError, ValueError) as e:
            raise PackError(f"{where}: malformed image field description ({e})") from None
        if enc not in ("jpeg", "raw") or channels not in (1, 3):
            raise PackError(f"{where}: unknown image encoding {enc!r} or channel count {channels}")
        return cls(enc, shape, channels)

    def shard_arrays(self, items: Sequence[np.ndarray], shapes: Sequence[tuple[int, int, int]]) -> dict[str, np.ndarray]:
        shp = np.asarray(shapes, SHAPES).reshape(len(shapes), 3)
        if self.fixed:
            pix = np.stack(items) if items else np.zeros((0, *self.shape), BYTES)
            return {"images": pix.astype(BYTES, copy=False), "shapes": shp}
        return {**blob_arrays(items, "images", "offsets"), "shapes": shp}

    def load(self, split_dir: Path, shards: list[dict], verify: bool) -> dict[str, np.ndarray]:
        shapes = load_rows(split_dir, shards, "shapes", SHAPES, (3,), verify)
        if self.fixed:
            pixels = load_rows(split_dir, shards, "images", BYTES, self.shape, verify)
            return {"pixels": pixels, "shapes": shapes}
        blob, offsets = load_blob(split_dir, shards, "images", "offsets", verify)
        if len(shapes) and (np.any(shapes <= 0) or np.any(shapes[:, 2] != self.channels)):
            raise PackError(f"{split_dir}: shapes.npy holds non-positive sizes or a channel count other than {self.channels}")
        if self.encoding == "raw" and not np.array_equal(np.diff(offsets), shapes.prod(axis=1)):
            raise PackError(f"{split_dir}: raw image sizes disagree with their shapes")
        return {"blob": blob, "offsets": offsets, "shapes": shapes}
