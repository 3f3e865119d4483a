"""Fields: each owns both directions of one column of a pack, how a shard's arrays are written and how
a split is read back into a few contiguous RAM buffers, and describes itself in the manifest (the
`Field` protocol). This module names no pack kind: it holds the protocol, the fields every kind shares
(`StringsField` for paths, `LabelField`, `RowsField` for fixed-shape columns, `IdsField` for runs of token ids),
built from the loading stage in pack/arrays.py, as the kinds' own fields (images/field.py, tokens/field.py,
...) are.

In the manifest every field lists its stored arrays (`"arrays"`). A field whose `layout` is not
"fixed" and that lists two or more arrays stores a blob and its offsets first (then any per-sample
arrays): that rule, `offsets_in`, is how the storage backends learn which arrays are offsets and
rebase them, without knowing any kind (it holds for every pack of format version 1).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Sequence

import numpy as np

from ..errors import PackError
from .arrays import BYTES, OFFSETS, LoadContext, Strings, blob_arrays, blob_shapes, load_blob, load_rows, rows_shape


def label_dtype(num_classes: int) -> np.dtype:
    """The smallest integer dtype that holds every label (little-endian)."""
    for dt in ("|u1", "<u2", "<u4"):
        if num_classes - 1 <= np.iinfo(np.dtype(dt)).max:
            return np.dtype(dt)
    raise PackError(f"{num_classes} classes do not fit in 32 bits")


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

