"""TabularDataset: takes a table pack, gives (features, target) rows and whole batches by slicing arrays.

The split is a few contiguous arrays (features float32, categorical codes, target, optional mask),
so a batch is one fancy-index per array instead of a `df.iloc[i]` and a tensor per row.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from ..errors import DataprepError, PackError
from ..pack.fields import MapGuard
from ..serve.cache import open_split
from ..serve.request import Request, refuse_augmentation
from .field import fields_of


class TabularDataset(Dataset):
    """A table pack's split.

    Args:
        categorical: "separate" returns (features, categorical codes, target) for embedding layers;
            "features" appends the codes to the features as floats; "none" leaves them out.
        cache: "ram" (read into memory) or "mmap" (map the files; one copy in the page cache).

    `dataset[i]` is one row; `dataset[[i, j, ...]]` (or `batch`) a whole batch; `feature_stats`
    gives the train split's mean and std per feature for normalising on the GPU (never applied here).
    """

    def __init__(self, pack: str | os.PathLike, split: str = "train", categorical: str = "separate", cache: str = "ram"):
        if categorical not in ("separate", "features", "none"):
            raise DataprepError(f"categorical must be 'separate', 'features' or 'none', not {categorical!r}")
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
        if self._guard:
            self._guard.check()
        a = self.arrays
        feats = torch.from_numpy(np.array(a["features"][idx]))
        y = np.asarray(a["target"][idx])
        target = torch.from_numpy(y.astype(np.int64) if self.target_info["task"] == "classification" else np.array(y))
        if "categorical" in a and self.categorical != "none":
            codes = torch.from_numpy(np.asarray(a["categorical"][idx]).astype(np.int64))
            if self.categorical == "separate":
                return feats, codes, target
            feats = torch.cat([feats, codes.to(feats.dtype)], dim=-1)
        return feats, target

    def __getitem__(self, index):
        if isinstance(index, (Sequence, np.ndarray, torch.Tensor)) and not isinstance(index, (str, bytes)):
            return self.batch(index)
        n = len(self)
        i = int(index)
        if not -n <= i < n:
            raise IndexError(f"index {i} out of range for {n} rows in {self.pack}/{self.split}")
        return self._rows(i % n)

    def batch(self, indices) -> tuple[torch.Tensor, ...]:
        """A whole batch by slicing each array once."""
        idx = np.asarray(indices, np.int64).reshape(-1)
        if len(idx) and (idx.min() < -len(self) or idx.max() >= len(self)):
            raise IndexError(f"an index is out of range for {len(self)} rows")
        return self._rows(idx % len(self))

    # -- the batch-fetch protocol the fast Loader uses -------------------------------------------
    def _served(self) -> list[str]:
        keys = ["features"]
        if "categorical" in self.arrays and self.categorical == "separate":
            keys.append("categorical")
        return keys + ["target"]

    def batch_layout(self, request: Request | None = None) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        refuse_augmentation(request or Request(), "a table pack")
        width = len(self.feature_columns) + (len(self.categorical_columns) if self.categorical == "features" else 0)
        ydt = np.dtype(np.int64) if self.target_info["task"] == "classification" else self.arrays["target"].dtype
        spec = {"features": ((width,), self.arrays["features"].dtype)}
        if "categorical" in self._served():
            spec["categorical"] = ((len(self.categorical_columns),), np.dtype(np.int64))
        spec["target"] = ((), ydt)
        return spec

    def fill_batch(self, idx: np.ndarray, out: dict[str, np.ndarray], request: Request | None = None) -> None:
        for key, t in zip(self._served(), self._rows(np.asarray(idx, np.int64))):
            out[key][: len(idx)] = t.numpy()

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

