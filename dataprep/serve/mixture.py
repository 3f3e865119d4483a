"""Mixtures: take datasets of one kind and their weights, give one dataset whose samples interleave
them deterministically in those proportions, resumable at any position like any other dataset.

Which member serves mixture position j is fixed by an apportionment that never lags: the first c
positions hold A_m(c) samples of member m, A_m(c) = c * w_m to within a sample or two for every c
(a binary tree of roundings, each floor(c * q + 1/2), so every A_m grows by at most one per position
and exactly one member grows at each). Any window of N positions therefore holds N * w_m samples of
member m to within a few samples, and position j maps to (member, its A_m(j)-th draw) in O(log M)
arithmetic: no table is built, however long the epoch. A member's draws run through its own
permutations, epoch after epoch (serve/draws.py, keyed by seed, member and member epoch).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import DataprepError
from . import draws
from .request import Request


class Mixture:
    """Datasets of one kind served as one, in proportion to `weights`.

    Args:
        datasets: two or more datasets whose batch layouts match (token packs of one context, image
            packs of one size or served with one crop, ...).
        weights: positive numbers, normalised to sum to 1.
        seed: the key of each member's shuffles.
        samples: positions in one mixture epoch [default: with exhausted="stop", until the first member
            runs out; with "restart", the members' total length].
        exhausted: "restart" (a member that runs out continues with its next epoch, newly shuffled) or
            "stop" (the mixture epoch ends when its first member would run out; no sample repeats).
        shuffle: each member's samples in a new order every member epoch (else in index order).

    `passes` gives each member's epochs per mixture epoch. The Loader serves it with shuffle=False (the
    order is the mixture's own), sharded, resumed and scheduled like any dataset.
    """

    ordered = True  # the Loader must not shuffle it: the interleaving is the point

    def __init__(self, datasets: Sequence, weights: Sequence[float], seed: int = 0, samples: int | None = None,
                 exhausted: str = "restart", shuffle: bool = True):
        self.datasets = list(datasets)
        if len(self.datasets) < 1:
            raise DataprepError("a Mixture needs at least one dataset")
        w = np.asarray(weights, np.float64)
        if w.shape != (len(self.datasets),) or not np.all(np.isfinite(w)) or (w <= 0).any():
            raise DataprepError(f"weights: one positive number per dataset ({len(self.datasets)}), not {list(weights)}")
        if exhausted not in ("restart", "stop"):
            raise DataprepError(f"exhausted is 'restart' or 'stop', not {exhausted!r}")
        for d in self.datasets:
            if not (hasattr(d, "batch_layout") and hasattr(d, "fill_batch")):
                raise DataprepError(f"a Mixture mixes dataprep datasets; a {type(d).__name__} cannot fill batches")
            if getattr(d, "transform", None) is not None:
                raise DataprepError("a Mixture's members must have no per-sample transform (the Loader crops and flips)")
            if len(d) == 0:
                raise DataprepError("a Mixture member is empty")
        kinds = {type(d).__name__ for d in self.datasets}
        if len(kinds) > 1:
            raise DataprepError(f"a Mixture mixes datasets of one kind, not {sorted(kinds)}")
        self.weights = w / w.sum()
        self.seed, self.exhausted, self.shuffle = int(seed), exhausted, shuffle
        self.lengths = np.array([len(d) for d in self.datasets], np.int64)
        self._tree = _tree(list(range(len(self.datasets))), self.weights)
        if exhausted == "stop":
            longest = self._longest_without_repeat()
            self.samples = min(int(samples), longest) if samples is not None else longest
        else:
            self.samples = int(samples) if samples is not None else int(self.lengths.sum())
        if self.samples < 1:
            raise DataprepError("a Mixture epoch of no samples (a member is too small for its weight?)")
        self._per_epoch = self.counts(self.samples)
        self.epoch = 0

    # -- the apportionment --------------------------------------------------------------------------
    def counts(self, c) -> np.ndarray:
        """(members, *shape of c): how many of the first c positions each member holds."""
        c = np.asarray(c, np.int64)
        out = np.zeros((len(self.datasets), *c.shape), np.int64)
        _fill(self._tree, c, out)
        return out

    def _longest_without_repeat(self) -> int:
        guess = int(np.floor(np.min(self.lengths / self.weights)))
        cand = np.arange(max(1, guess - 4 * len(self.datasets) - 64), guess + 2, dtype=np.int64)
        ok = (self.counts(cand) <= self.lengths[:, None]).all(0)
        return int(cand[ok].max()) if ok.any() else 0

    @property
    def passes(self) -> list[float]:
        """Each member's epochs per mixture epoch (samples drawn / its length)."""
        return (self._per_epoch / self.lengths).tolist()

    def locate(self, idx, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Positions `idx` of mixture epoch `epoch` -> (member, index in the member, the member's epoch)."""
        idx = np.asarray(idx, np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self.samples):
            raise IndexError(f"a position is out of range for a mixture epoch of {self.samples}")
        before, after = self.counts(idx), self.counts(idx + 1)
        member = np.argmax(after - before, axis=0)
        rank = np.take_along_axis(before, member[None], 0)[0]
        drawn = rank + (int(epoch) * self._per_epoch[member] if self.exhausted == "restart" else 0)
        length = self.lengths[member]
        m_epoch = drawn // length if self.exhausted == "restart" else np.full_like(drawn, int(epoch))
        k = drawn % length
        index = k.copy()
        if self.shuffle:
            for m in np.unique(member):
                for e in np.unique(m_epoch[member == m]):
                    sel = (member == m) & (m_epoch == e)
                    index[sel] = draws.permuted(int(self.lengths[m]), (self.seed, int(m), int(e)), k[sel])
        return member, index, m_epoch

    # -- a dataset ------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.samples

    def set_epoch(self, epoch: int) -> None:
        """The epoch `mixture[i]` serves (the Loader passes its own epoch with every batch)."""
        self.epoch = int(epoch)

    def __getitem__(self, i):
        if not -self.samples <= int(i) < self.samples:
            raise IndexError(f"index {i} out of range for a mixture epoch of {self.samples}")
        member, index, m_epoch = self.locate([int(i) % self.samples], self.epoch)
        d = self.datasets[int(member[0])]
        if hasattr(d, "set_epoch"):
            d.set_epoch(int(m_epoch[0]))
        return d[int(index[0])]

    def batch_layout(self, request: Request | None = None):
        request = request or Request()
        layouts = [d.batch_layout(request) for d in self.datasets]
        first = {k: (tuple(s), np.dtype(t)) for k, (s, t) in layouts[0].items()}
        for lay in layouts[1:]:
            if {k: (tuple(s), np.dtype(t)) for k, (s, t) in lay.items()} != first:
                raise DataprepError(f"a Mixture's members serve different batches ({first} vs {lay}): one context, "
                                    "one image size (or one crop), one dtype")
        return layouts[0]

    def fill_batch(self, idx: np.ndarray, out: dict[str, np.ndarray], request: Request | None = None) -> None:
        """Each member fills its rows: runs of one member straight into the batch, scattered rows through
        a buffer of their own."""
        request = request or Request()
        member, index, m_epoch = self.locate(idx, request.epoch)
        n = len(member)
        cut = np.flatnonzero((np.diff(member) != 0) | (np.diff(m_epoch) != 0)) + 1
        starts, ends = np.r_[0, cut], np.r_[cut, n]
        if len(starts) <= 2 * len(self.datasets) + 2:  # the Loader's own order: a few runs per batch
            for a, b in zip(starts, ends):
                d = self.datasets[int(member[a])]
                d.fill_batch(index[a:b], {k: v[a:b] for k, v in out.items()}, request.but(epoch=int(m_epoch[a])))
            return
        for m in np.unique(member):
            for e in np.unique(m_epoch[member == m]):
                rows = np.flatnonzero((member == m) & (m_epoch == e))
                part = {k: np.empty((len(rows), *v.shape[1:]), v.dtype) for k, v in out.items()}
                self.datasets[int(m)].fill_batch(index[rows], part, request.but(epoch=int(e)))
                for k, v in out.items():
                    v[rows] = part[k]


def _tree(members: list[int], weights: np.ndarray):
    """A balanced binary tree over the members: (left, right, left's share of the node's weight)."""
    if len(members) == 1:
        return members[0]
    half = len(members) // 2
    left, right = members[:half], members[half:]
    wl = float(weights[left].sum())
    return (_tree(left, weights), _tree(right, weights), wl / (wl + float(weights[right].sum())))


def _fill(node, c: np.ndarray, out: np.ndarray) -> None:
    if isinstance(node, int):
        out[node] = c
        return
    left, right, share = node
    cl = np.floor(c * share + 0.5).astype(np.int64)
    _fill(left, cl, out)
    _fill(right, c - cl, out)
