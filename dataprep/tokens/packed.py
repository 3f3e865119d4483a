"""Packed token rows: takes a token pack's split, a context and a packing strategy, gives rows of exactly
`context` tokens holding whole documents (longer ones in pieces that overlap by one token), each token with
its label, position in its segment and document, for attention kept within documents.

A document is the pack's ids followed by its end-of-text id. Each epoch's rows come from
tokens/packing.py's plan, a pure function of (seed, epoch, the documents' lengths), made from the split's
document offsets without reading a token; every process (worker, thread, rank) makes the same plan for an
epoch the first time it fills a row of it, and keeps the last two epochs' plans.

A row is filled with a few vectorised gathers over the whole part of a batch, straight into the Loader's
ring: `input_ids` (padding: the end-of-text id), `labels` (the next token of the same segment; -100 on a
segment's last token and on padding), `position_ids` (0 at each segment's first token, and at the start of a
row's padding, counting up by 1), `document_ids` (the document's index in the split; -1 on padding).
`finish_batch` adds `cu_seqlens` (int32: every segment's start over the flattened batch, then B * context;
padding runs and row ends are boundaries) and `max_seqlen`, as FlashAttention's varlen kernels take them.
`cu_seqlens` varies in length from batch to batch; `pad_cu_seqlens` gives it a fixed length (for
`torch.compile` with static shapes) by repeating its last value: segments of no tokens.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import DataprepError, UsageError, brief
from ..serve.request import Request, refuse_augmentation
from .attention import cu_seqlens
from .dataset import _TokenSplit
from .packing import Packing, RowPlan, ragged

KEYS = ("input_ids", "labels", "position_ids", "document_ids")
IGNORE = -100  # the label no loss counts (torch's cross_entropy ignore_index)


class PackedDocuments:
    """Rows of `context` tokens packed with whole documents, served as dicts (see the module's docstring).

    `len()` is the rows an epoch (the same in every epoch). Serve it with `dataprep.Loader` (0 workers,
    worker processes or threads; ranks; exact resume on another world size), or index it: `ds[i]` is row i
    of the epoch `set_epoch` chose.

    Args:
        pack: The token pack's folder (or URL).
        context: Tokens a row (>= 2).
        packing: "best_fit" [default], "first_fit" or "concat" (tokens/packing.py).
        split: The split's name.
        seed: The seed of the plan: the rows' order changes every epoch, and which documents share a row
            (fully with "concat"; with the fits, among documents of equal length: docs/training.md).
        cache: "ram" (the split read into memory) or "mmap" (its shard files mapped).
    """

    serves_dicts = True  # a batch is a dict: its cu_seqlens is made from the whole batch (finish_batch)
    pads_empty = True  # rows that even out the ranks' last batch are rows of padding (index -1), not rows again
    fills_in_threads = True  # fills write disjoint rows; the plans are made under a lock
    fills_rows = True  # fill_batch takes rows= (a Mixture's member fills its scattered rows of the batch)

    def __init__(self, pack: str | os.PathLike, context: int, packing: str = "best_fit", split: str = "train",
                 seed: int = 0, cache: str = "ram"):
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise UsageError(f"PackedDocuments: seed must be an integer >= 0, not {brief(seed)}")
        self.pack, self.split, self.cache = pack, split, cache
        self.context, self.strategy, self.seed = context, packing, int(seed)
        self.epoch = 0
        self._load()

    def _load(self) -> None:
        try:
            self.data = _TokenSplit(self.pack, self.split, self.cache)
        except DataprepError as e:
            raise DataprepError(f"PackedDocuments: {e}") from None
        self.packing = Packing(np.diff(self.data.doc_offsets), self.context, self.strategy)
        self.context = self.packing.context
        self._plans: dict[int, RowPlan] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {k: self.__dict__[k] for k in ("pack", "split", "cache", "context", "strategy", "seed", "epoch")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._load()

    # -- what the plan is -----------------------------------------------------------------------------
    @property
    def manifest(self) -> dict:
        """The pack's manifest (a Loader state records a digest of the split's shards)."""
        return self.data.manifest

    @property
    def eot_id(self) -> int:
        """The end-of-text id that ends every document (and pads a row)."""
        return self.data.eot_id

    @property
    def vocab_size(self) -> int:
        """The tokenizer's vocabulary size (ids are below it)."""
        return int(self.data.manifest["tokenizer"]["vocab_size"])

    @property
    def tokenizer(self):
        """The pack's copy of its tokenizer, read on first use."""
        return self.data.tokenizer

    @property
    def documents(self) -> int:
        """Documents in the split."""
        return len(self.data.doc_offsets) - 1

    @property
    def plan_key(self) -> str:
        """What a Loader state's position counts in besides the pack: a state saved over another context,
        strategy or seed is refused."""
        return f"packed rows: context {self.context}, {self.strategy}, seed {self.seed}"

    def __len__(self) -> int:
        return self.packing.rows

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch `ds[i]` indexes (a Loader passes its epoch with each request instead).

        Args:
            epoch: The epoch.
        """
        self.epoch = int(epoch)

    def plan(self, epoch: int) -> RowPlan:
        """The epoch's rows (made once in this process, the last two epochs kept).

        Args:
            epoch: The epoch.

        Returns:
            The `RowPlan` of (seed, epoch).
        """
        with self._lock:
            plan = self._plans.get(epoch)
            if plan is None:
                plan = self.packing.plan(self.seed, epoch)
                self._plans = {e: p for e, p in self._plans.items() if e == epoch - 1}
                self._plans[epoch] = plan
            return plan

    def info(self, epoch: int = 0) -> dict[str, Any]:
        """What the plan makes of the split: rows, tokens, padding and documents cut.

        Args:
            epoch: The epoch whose plan is described (all epochs have the same rows and padding).

        Returns:
            A dict of plain values.
        """
        p = self.plan(epoch)
        return {"documents": self.documents, "context": self.context, "packing": self.strategy, "rows": p.rows,
                "tokens": p.tokens, "padding_share": p.padding_share, "documents_cut": p.documents_cut}

    # -- serving --------------------------------------------------------------------------------------
    def batch_layout(self, request: Request | None = None) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Each row's fields: four (context,) int64 arrays.

        Args:
            request: What the pass asks for; crops, flips and resolutions are refused (tokens have none).

        Returns:
            key -> (shape, dtype) a sample.
        """
        if request is not None:
            refuse_augmentation(request, "packed token rows")
        return {k: ((self.context,), np.dtype(np.int64)) for k in KEYS}

    def fill_batch(self, idx, out: dict[str, np.ndarray], request: Request | None = None, rows=None) -> None:
        """Rows `idx` of the request's epoch into `out`'s first len(idx) rows (or rows `rows`).

        Args:
            idx: Row indices (an array or a range); -1 is a row of padding (the Loader's `pads_empty`).
            out: key -> (n, context) int64 arrays to fill.
            request: The pass's request (its epoch); None: the epoch `set_epoch` chose.
            rows: Where in `out` the rows go [default: the first len(idx)].
        """
        idx = np.asarray(idx, np.int64)
        if len(idx) and (idx.min() < -1 or idx.max() >= len(self)):
            raise IndexError(f"rows {idx.min()}..{idx.max()} out of range for {len(self)} rows (-1: a row of padding)")
        epoch = self.epoch if request is None else request.epoch
        target = {k: out[k][:len(idx)] if rows is None else np.empty((len(idx), self.context), np.int64) for k in KEYS}
        self._fill(self.plan(epoch), idx, target)
        if rows is not None:
            for k in KEYS:
                out[k][rows] = target[k]

    def _fill(self, plan: RowPlan, idx: np.ndarray, out: dict[str, np.ndarray]) -> None:
        if self.data.guard:
            self.data.guard.check()  # a mapped shard cut short under us: a PackError, never SIGBUS
        c, n = self.context, len(idx)
        first = plan.row_starts[idx]
        count = plan.row_starts[idx + 1] - first
        count[idx < 0] = 0  # a row of padding
        seg = ragged(first, count)
        length = plan.length[seg]
        row = np.repeat(np.arange(n, dtype=np.int64), count)
        used = np.bincount(row, length, minlength=n).astype(np.int64)  # tokens of each row before its padding
        ends = np.cumsum(length)
        dst = row * c + ends - length - np.repeat(np.cumsum(used) - used, count)
        at = ragged(dst, length)  # every document token's place in the flattened rows
        src = at + np.repeat(self.data.doc_offsets[plan.document[seg]] + plan.offset[seg] - dst, length)
        ids, labels = out["input_ids"].reshape(-1), out["labels"].reshape(-1)
        pos, docs = out["position_ids"].reshape(-1), out["document_ids"].reshape(-1)
        tokens = self.data.tokens
        ids.fill(self.eot_id)
        ids[at] = tokens[src]
        labels.fill(IGNORE)
        np.minimum(src + 1, len(tokens) - 1, out=src)  # a segment's last token is ignored below; never past the array
        labels[at] = tokens[src]
        labels[dst + length - 1] = IGNORE
        # padding counts from 0 where it starts; document tokens from their segment's first
        np.subtract(np.arange(n * c, dtype=np.int64) % c, np.repeat(used, c), out=pos)
        pos[at] = at - np.repeat(dst, length)
        docs.fill(-1)
        docs[at] = np.repeat(plan.document[seg], length)

    def finish_batch(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The batch with `cu_seqlens` and `max_seqlen` added (see the module's docstring).

        Args:
            batch: key -> tensor, as the Loader made it.

        Returns:
            The same dict's keys, then cu_seqlens (int32) and max_seqlen (int).
        """
        bounds, longest = cu_seqlens(batch)
        return {**batch, "cu_seqlens": bounds, "max_seqlen": longest}

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        """Row i of the epoch `set_epoch` chose, as (context,) int64 tensors."""
        n = len(self)
        if not -n <= int(i) < n:
            raise IndexError(f"row {i} out of range for {n} rows")
        out = {k: np.empty((1, self.context), np.int64) for k in KEYS}
        self._fill(self.plan(self.epoch), np.array([int(i) % n]), out)
        return {k: torch.from_numpy(v[0]) for k, v in out.items()}

    def __repr__(self) -> str:
        return (f"PackedDocuments({str(Path(self.pack))!r}, context={self.context}, packing={self.strategy!r}, "
                f"split={self.split!r}, seed={self.seed})")


def pad_cu_seqlens(bounds: torch.Tensor, size: int) -> torch.Tensor:
    """`cu_seqlens` made `size` long by repeating its last value (segments of no tokens), for kernels
    compiled for one shape.

    Args:
        bounds: A batch's cu_seqlens.
        size: The length wanted: at least len(bounds); B * context + 1 always suffices.

    Returns:
        int32, `size` long.
    """
    if size < len(bounds):
        raise UsageError(f"pad_cu_seqlens: size {size} is shorter than the batch's {len(bounds)} boundaries")
    out = bounds.new_full((size,), int(bounds[-1]))
    out[:len(bounds)] = bounds
    return out
