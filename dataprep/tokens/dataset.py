"""Token datasets: take a token pack, give context windows (x, y shifted by one) or whole documents.

A split is one contiguous token array (read into RAM, or the shard files mapped) plus int64
document offsets: the memory does not grow with the number of workers.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from ..errors import DataprepError
from ..pack.arrays import MapGuard
from ..remote.packs import resolve
from ..serve import draws
from ..serve.cache import open_split
from ..serve.request import Request, refuse_augmentation
from .field import fields_of, read_tokenizer


class _TokenSplit:
    def __init__(self, pack: str | os.PathLike, split: str, cache: str):
        pack, cache = resolve(pack, cache)  # a URL: a staged local directory, its files fetched with the cache
        if cache not in ("ram", "mmap"):
            raise DataprepError(f"a token pack is served with cache 'ram' or 'mmap', not {cache!r}")
        self.pack, self.split = Path(pack), split
        c = open_split(self.pack, split, lambda m: fields_of(m, self.pack / "manifest.json"), cache, progress=False,
                       kinds=("tokens",), modes=("ram", "mmap"))
        field = c.fields["tokens"]
        self.tokens, self.doc_offsets = c.arrays[field.tokens], c.arrays[field.offsets]
        self.guard = MapGuard([self.tokens]) if isinstance(self.tokens, np.memmap) else None
        self.manifest = c.manifest
        self.eot_id = int(c.manifest["tokenizer"]["eot_id"])
        self._tokenizer = None

    @property
    def tokenizer(self):
        """The pack's copy of its tokenizer, read on first use (workers that never decode never pay for it)."""
        if self._tokenizer is None:
            self._tokenizer = read_tokenizer(self.pack, self.manifest)
        return self._tokenizer


class TokenDataset(Dataset):
    """(x, y) windows of `context` tokens, y shifted by one, over the split's concatenated documents.

    `dataset[[i, j, ...]]` and `__getitems__` gather a whole batch with one vectorised index.

    Args:
        pack: The token pack's folder (or URL).
        context: Tokens a window.
        split: The split's name.
        mode: "sequential" (non-overlapping windows in order) or "random". In "random" each window's start
            is drawn from (seed, epoch, index): the Loader's epoch, or `set_epoch`'s for indexing.
        seed: The seed of the random starts.
        samples: Windows an epoch in "random" mode; None is as many as fit without overlap.
        dtype: "int64" for embedding lookups, or "stored" (uint16/uint32) to convert on the GPU.
        cache: "ram" (read into memory) or "mmap" (map the files; one copy in the page cache).
    """

    def __init__(self, pack, context: int = 1024, split: str = "train", mode: str = "random", seed: int = 0,
                 samples: int | None = None, dtype: str = "int64", cache: str = "ram"):
        if mode not in ("random", "sequential") or dtype not in ("int64", "stored") or context < 1:
            raise DataprepError("mode is 'random' or 'sequential', dtype 'int64' or 'stored', context >= 1")
        self.pack, self.split, self.context, self.mode, self.seed, self.samples = pack, split, context, mode, seed, samples
        self.dtype, self.cache = dtype, cache
        self._load()

    def _load(self):
        self.data = _TokenSplit(self.pack, self.split, self.cache)
        n = len(self.data.tokens)
        if n < self.context + 1:
            raise DataprepError(f"{self.pack}/{self.split}: {n} tokens, fewer than one window of {self.context} + 1")
        # every window of context + 1 tokens as rows of one strided view (no copy): a batch is one row gather,
        # far cheaper than indexing with a (batch, context + 1) array of positions (docs/benchmarks.md)
        self._all_windows = np.lib.stride_tricks.sliding_window_view(self.data.tokens, self.context + 1)
        self.epoch = getattr(self, "epoch", 0)

    def __getstate__(self):
        return {k: self.__dict__[k] for k in ("pack", "split", "context", "mode", "seed", "samples", "dtype", "cache", "epoch")}

    def __setstate__(self, state):
        epoch = state.pop("epoch")
        self.__dict__.update(state)
        self._load()
        self.set_epoch(epoch)

    def set_epoch(self, epoch: int) -> None:
        """Pick the epoch whose windows `dataset[i]` serves; the Loader passes its own with every batch.

        Args:
            epoch: The epoch.
        """
        self.epoch = int(epoch)

    @property
    def vocab_size(self) -> int:
        """The tokenizer's vocabulary size (ids are below it)."""
        return int(self.data.manifest["tokenizer"]["vocab_size"])

    @property
    def eot_id(self) -> int:
        """The end-of-text id that follows every document in the pack."""
        return self.data.eot_id

    @property
    def tokenizer(self):
        """The `tokenizers.Tokenizer` the pack was made with (padding and truncation off), loaded from the
        pack's copy on first use and checked against the manifest's sha256. A PackError for a pack made
        before packs carried the copy (one tokenized with a tokenizer file; trained ones always had it)."""
        return self.data.tokenizer

    def __len__(self) -> int:
        n = len(self.data.tokens)
        if self.mode == "sequential":
            return (n - 1) // self.context
        return int(self.samples or (n - 1) // self.context)

    def starts(self, idx, epoch: int | None = None, seed: int = 0) -> np.ndarray:
        """Where the windows of samples `idx` start in `epoch`.

        Sequential windows are in order. Random starts are drawn from (the dataset's seed, the Loader's
        `seed`, epoch, index), so any worker, batch or resumed run draws the same. Indexing the dataset
        draws as a Loader of seed 0 does.

        Args:
            idx: The sample indices.
            epoch: The epoch; None is set_epoch's.
            seed: The Loader's seed.

        Returns:
            The token offsets, int64.
        """
        idx = np.asarray(idx, np.int64) % len(self)
        if self.mode == "sequential":
            return idx * self.context
        epoch = self.epoch if epoch is None else epoch
        return draws.integers(self._draw_key(epoch, seed), idx, self._highest_start)

    def _draw_key(self, epoch: int, seed: int) -> tuple[int, ...]:
        return (draws.TOKENS, self.seed, int(seed), int(epoch))

    @property
    def _highest_start(self) -> int:
        return len(self.data.tokens) - self.context

    def _gather(self, idx, epoch: int | None = None, seed: int = 0) -> np.ndarray:
        starts = self.starts(idx, epoch, seed)
        w = self.read_addresses(starts)
        return w.copy() if starts.ndim == 0 else w  # one window is a view of the tokens; a batch is a copy

    def _windows(self, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        w = self._gather(idx)
        if self.dtype == "int64":
            w = w.astype(np.int64)
        elif w.dtype == np.uint32:
            w = w.astype(np.int64)  # torch has no uint32 arithmetic worth the name; uint16 stays as is
        t = torch.from_numpy(np.ascontiguousarray(w))
        return t[..., :-1], t[..., 1:]

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self._windows(np.arange(len(self))[index])
        if isinstance(index, (Sequence, np.ndarray, torch.Tensor)) and not isinstance(index, (str, bytes)):
            return self._windows(np.asarray(index, np.int64) % len(self))
        i = int(index)
        if not -len(self) <= i < len(self):
            raise IndexError(f"index {i} out of range for {len(self)} windows")
        return self._windows(np.int64(i % len(self)))

    def __getitems__(self, indices: Sequence[int]):
        x, y = self._windows(np.asarray(indices, np.int64) % len(self))
        return list(zip(x, y))

    # -- the batch-fetch protocol the fast Loader uses (serve/request.py) -------------------------
    def batch_layout(self, request: Request | None = None) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """What one window occupies in a batch: x and y, `context` tokens each.

        Args:
            request: What the pass asks for; tokens serve no crop or flip.

        Returns:
            {key: (sample shape, dtype)}, one tensor of the batch per key, in order.
        """
        refuse_augmentation(request or Request(), "a token pack")
        dt = np.dtype(np.int64) if self.dtype == "int64" or self.data.tokens.dtype == np.uint32 else self.data.tokens.dtype
        return {"x": ((self.context,), dt), "y": ((self.context,), dt)}

    fills_rows = True  # fill_batch takes rows= (a Mixture's members write straight into their batch rows)

    def fill_batch(self, idx: np.ndarray, out: dict[str, np.ndarray], request: Request | None = None,
                   rows: np.ndarray | None = None) -> None:
        """Write the windows of samples `idx` in the request's epoch into `out`, in place.

        Args:
            idx: The sample indices.
            out: The batch's arrays by key, as `batch_layout` gives them.
            request: What the pass asks for: epoch and seed.
            rows: The batch rows to write (a slice or row numbers); None is the first ones.
        """
        request = request or Request()
        self.fill_addresses(self.starts(idx, request.epoch, request.seed), out, rows)

    @property
    def independent_samples(self) -> bool:
        """Random windows are independent draws keyed by (epoch, index): asked for in index order, they are
        as random as shuffled (a Mixture draws no shuffle for them). Sequential windows are not."""
        return self.mode == "random"

    def addresses(self, idx: np.ndarray, epoch: int, seed: int) -> np.ndarray:
        """Where samples `idx` lie in the pack (their window starts) for a Loader of `seed` in `epoch`.

        A Mixture works them out for a whole chunk of its positions at once, then fills batches from them.

        Args:
            idx: The sample indices.
            epoch: The epoch.
            seed: The Loader's seed.

        Returns:
            The window starts.
        """
        return self.starts(idx, epoch, seed)

    def fill_addresses(self, starts: np.ndarray, out: dict[str, np.ndarray], rows=None) -> None:
        """Write the windows at `starts` into `out`, in place.

        Args:
            starts: The window starts, as `addresses` gives them.
            out: The batch's arrays by key.
            rows: The batch rows to write (a slice or row numbers); None is the first ones.
        """
        self.fill_raw(self.read_addresses(starts), out, rows)

    def windows(self) -> np.ndarray:
        """Every window of context + 1 ids as stored: rows of one strided view of the tokens.

        Row k starts at id k. A mapped pack is checked to still hold them first. `read_addresses` gathers
        from this view, and a Mixture joins its members' views into one (serve/mixture.py).

        Returns:
            The (windows, context + 1) view.
        """
        if self.data.guard:
            self.data.guard.check()
        return self._all_windows

    def read_addresses(self, starts: np.ndarray) -> np.ndarray:
        """The windows at `starts`, as stored.

        Args:
            starts: The window starts.

        Returns:
            The windows, (len(starts), context + 1); a copy for an array of starts.
        """
        return self.windows()[starts]

    def fill_raw(self, w: np.ndarray, out: dict[str, np.ndarray], rows=None) -> None:
        """Write windows into `out` as x and y, converted to the batch's dtype, in place.

        Args:
            w: Windows as `read_addresses` gives them (rows of `windows()`).
            out: The batch's arrays by key.
            rows: The batch rows to write (a slice or row numbers); None is the first ones.
        """
        at = slice(0, len(w)) if rows is None else rows
        out["x"][at] = w[:, :-1]
        out["y"][at] = w[:, 1:]


class DocumentDataset(Dataset):
    """One document's token ids per item, int64.

    The end-of-text id that follows each document in the pack is left out.

    Args:
        pack: The token pack's folder.
        split: The split's name.
        cache: "ram" (read into memory) or "mmap" (map the files; one copy in the page cache).
    """

    def __init__(self, pack, split: str = "train", cache: str = "ram"):
        self.pack, self.split, self.cache = pack, split, cache
        self.data = _TokenSplit(pack, split, cache)

    def __getstate__(self):
        return {k: self.__dict__[k] for k in ("pack", "split", "cache")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.data = _TokenSplit(self.pack, self.split, self.cache)

    def __len__(self) -> int:
        return len(self.data.doc_offsets) - 1

    def __getitem__(self, i: int) -> torch.Tensor:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"index {i} out of range for {n} documents")
        i %= n
        a, b = self.data.doc_offsets[i], self.data.doc_offsets[i + 1] - 1
        if self.data.guard:
            self.data.guard.check()
        return torch.from_numpy(np.asarray(self.data.tokens[a:b]).astype(np.int64))
