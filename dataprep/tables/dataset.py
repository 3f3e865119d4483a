"""TabularDataset: takes a table pack, gives (features, [categorical], [mask], [datetimes], target) rows and
whole batches by slicing arrays.

The split is a few contiguous arrays (features float32, categorical codes, the optional missing-value mask
and int64 datetimes, target), so a batch is one fancy-index per array instead of a `df.iloc[i]` and a tensor
per row.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from ..errors import DataprepError, PackError
from ..pack.arrays import MapGuard
from ..remote.packs import resolve
from ..serve.cache import open_split
from ..serve.request import Request, refuse_augmentation
from .field import fields_of


class TabularDataset(Dataset):
    """A table pack's split.

    Args:
        pack: The table pack's folder (or URL).
        split: The split's name.
        categorical: "separate" serves the categorical codes as their own tensor, for embedding layers;
            "features" appends them to the features as floats; "none" leaves them out.
        cache: "ram" (read into memory) or "mmap" (map the files; one copy in the page cache).

    Every access gives a tuple in one fixed order, of the fields the pack has:
        (features, categorical, mask, datetimes, target)
    features: float (F,) [+ the codes as floats with categorical="features"]; categorical: int64 codes (C,),
    with categorical="separate"; mask: uint8 (F,), 1 where a feature value was missing (stored as 0), in packs
    built with `--missing mask`; datetimes: int64 seconds since 1970 (D,), in packs built with
    `--datetime int64`; target: int64 classes or the float regression value. `dataset.fields` names the
    tuple's members; a pack with neither mask nor datetimes gives (features, [categorical], target).

    `dataset[i]` is one row; `dataset[[i, j, ...]]`, `dataset[a:b]` (or `batch`) a whole batch (rows
    stacked), `__getitems__` its rows one by one, and the fast Loader yields batches in the same order;
    `feature_stats` gives the train split's mean and std per feature for normalising on the GPU (never
    applied here).
    """

    def __init__(self, pack: str | os.PathLike, split: str = "train", categorical: str = "separate", cache: str = "ram"):
        if categorical not in ("separate", "features", "none"):
            raise DataprepError(f"categorical must be 'separate', 'features' or 'none', not {categorical!r}")
        pack, cache = resolve(pack, cache)  # a URL: a staged local directory, its files fetched with the cache
        if cache not in ("ram", "mmap"):
            raise DataprepError(f"a table pack is served with cache 'ram' or 'mmap', not {cache!r}")
        self.pack, self.split, self.categorical, self.cache = Path(pack), split, categorical, cache
        self._load()

    def _load(self) -> None:
        c = open_split(self.pack, self.split, lambda m: fields_of(m, self.pack / "manifest.json"), self.cache,
                       progress=False, kinds=("table",), modes=("ram", "mmap"))
        # mapped: one file per split as written (several shards are joined)
        self.arrays: dict[str, np.ndarray] = {k: (a.parts[0] if len(a.parts) == 1 else np.concatenate(a.parts))
                                              if hasattr(a, "parts") else a for k, a in c.arrays.items()}
        mapped = [a for a in self.arrays.values() if isinstance(a, np.memmap)]
        self._guard = MapGuard(mapped) if mapped else None
        m = self.manifest = c.manifest
        self.feature_columns: list[str] = list(m["fields"]["features"]["columns"])
        cat = m["fields"].get("categorical")
        self.categorical_columns: list[str] = list(cat["columns"]) if cat else []
        self.vocab: dict[str, list[str]] = _vocab(self.pack, cat) if cat else {}
        self.target_info: dict[str, Any] = m["fields"]["target"]
        self.fields: tuple[str, ...] = (("features",) + (("categorical",) if cat and self.categorical == "separate" else ())
                                        + tuple(k for k in ("mask", "datetimes") if k in self.arrays) + ("target",))

    def __getstate__(self):
        return {k: self.__dict__[k] for k in ("pack", "split", "categorical", "cache")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._load()

    def __len__(self) -> int:
        return len(self.arrays["target"])

    @property
    def feature_stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, std) per feature column of the train split, as float32 tensors (std 0 becomes 1)."""
        st = self.manifest["stats"]["features"]
        mean = torch.tensor([st[c]["mean"] for c in self.feature_columns], dtype=torch.float32)
        std = torch.tensor([st[c]["std"] or 1.0 for c in self.feature_columns], dtype=torch.float32)
        return mean, std

    def _rows(self, idx) -> tuple[torch.Tensor, ...]:
        """Rows idx (an int or an index array) of every field in `self.fields`, as fresh tensors."""
        if self._guard:
            self._guard.check()
        a = self.arrays
        out = {"features": torch.from_numpy(np.array(a["features"][idx]))}
        y = np.asarray(a["target"][idx])
        out["target"] = torch.from_numpy(y.astype(np.int64) if self.target_info["task"] == "classification" else np.array(y))
        if "categorical" in a and self.categorical != "none":
            out["categorical"] = torch.from_numpy(np.asarray(a["categorical"][idx]).astype(np.int64))
            if self.categorical == "features":
                out["features"] = torch.cat([out["features"], out.pop("categorical").to(out["features"].dtype)], dim=-1)
        for k in ("mask", "datetimes"):
            if k in a:
                out[k] = torch.from_numpy(np.array(a[k][idx]))
        return tuple(out[k] for k in self.fields)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.batch(np.arange(*index.indices(len(self))))
        if isinstance(index, (Sequence, np.ndarray, torch.Tensor)) and not isinstance(index, (str, bytes)):
            return self.batch(index)
        n = len(self)
        i = int(index)
        if not -n <= i < n:
            raise IndexError(f"index {i} out of range for {n} rows in {self.pack}/{self.split}")
        return self._rows(i % n)

    def batch(self, indices) -> tuple[torch.Tensor, ...]:
        """A whole batch by slicing each array once.

        Args:
            indices: The row indices (negative ones count from the end).

        Returns:
            The tuple of `fields`, rows stacked.
        """
        idx = np.asarray(indices, np.int64).reshape(-1)
        if len(idx) and (idx.min() < -len(self) or idx.max() >= len(self)):
            raise IndexError(f"an index is out of range for {len(self)} rows")
        return self._rows(idx % len(self))

    # -- the batch-fetch protocol the fast Loader uses: one buffer per member of `fields`, in its order ---
    def batch_layout(self, request: Request | None = None) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """What one row occupies in a batch: a buffer per member of `fields`.

        Args:
            request: What the pass asks for; a table serves no crop or flip.

        Returns:
            {key: (sample shape, dtype)}, one tensor of the batch per key, in order.
        """
        refuse_augmentation(request or Request(), "a table pack")
        width = len(self.feature_columns) + (len(self.categorical_columns) if self.categorical == "features" else 0)
        ydt = np.dtype(np.int64) if self.target_info["task"] == "classification" else self.arrays["target"].dtype
        spec = {"features": ((width,), self.arrays["features"].dtype),
                "categorical": ((len(self.categorical_columns),), np.dtype(np.int64)), "target": ((), ydt),
                **{k: (self.arrays[k].shape[1:], self.arrays[k].dtype) for k in ("mask", "datetimes") if k in self.arrays}}
        return {k: spec[k] for k in self.fields}

    fills_rows = True  # fill_batch takes rows= (a Mixture's members write straight into their batch rows)

    def fill_batch(self, idx: np.ndarray, out: dict[str, np.ndarray], request: Request | None = None,
                   rows: np.ndarray | None = None) -> None:
        """Write rows `idx` of the split into `out`, in place.

        Args:
            idx: The row indices.
            out: The batch's arrays by key, as `batch_layout` gives them.
            request: What the pass asks for; a table serves no crop or flip.
            rows: The batch rows to write; None is the first len(idx).
        """
        at = slice(0, len(idx)) if rows is None else rows
        for key, t in zip(self.fields, self._rows(np.asarray(idx, np.int64))):
            out[key][at] = t.numpy()

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[torch.Tensor, ...]]:
        cols = self.batch(indices)
        return list(zip(*cols))


def _vocab(pack: Path, cat: dict[str, Any]) -> dict[str, list[str]]:
    """Each categorical column's values: from the file beside the manifest, or (packs made before it) the manifest."""
    if "vocab" in cat:
        return dict(cat["vocab"])
    import json

    from ..pack.backends import open_reader

    reader = open_reader(pack)
    try:
        raw = reader.attachments().get(cat["vocab_file"])
    finally:
        reader.close()
    if raw is None:
        raise PackError(f"{pack}: {cat['vocab_file']} is missing; the categorical columns have no vocabulary")
    try:
        vocab = {c: list(v["values"]) for c, v in json.loads(raw).items()}
    except (ValueError, KeyError, TypeError) as e:
        raise PackError(f"{pack}/{cat['vocab_file']}: unreadable ({e})") from None
    if any(len(vocab.get(c, [])) != n for c, n in cat.get("sizes", {}).items()):
        raise PackError(f"{pack}/{cat['vocab_file']}: vocabulary sizes disagree with the manifest's")
    return vocab

