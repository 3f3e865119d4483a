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


PERMUTATION_LIMIT = 1 << 22  # members up to this many samples keep their shuffle as an array (16 MiB)


class Mixture:
    """Datasets of one kind served as one, in proportion to `weights`.

    Args:
        datasets: datasets whose batch layouts match (token packs of one context, image
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
        member, index, m_epoch, _ = self._locate(idx, epoch)
        return member, index, m_epoch

    def _locate(self, idx, epoch: int):
        idx = np.asarray(idx, np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self.samples):
            raise IndexError(f"a position is out of range for a mixture epoch of {self.samples}")
        before, after = self.counts(idx), self.counts(idx + 1)
        member = np.argmax(after - before, axis=0)
        rank = np.take_along_axis(before, member[None], 0)[0]
        if self.exhausted == "restart":
            drawn = rank + int(epoch) * self._per_epoch[member]
            length = self.lengths[member]
            m_epoch, k = drawn // length, drawn % length
        else:
            m_epoch, k = np.full_like(rank, int(epoch)), rank
        groups = []  # (member, member epoch, rows): usually one per member
        for m in range(len(self.datasets)):
            rows = np.flatnonzero(member == m)
            if not len(rows):
                continue
            es = m_epoch[rows]
            if es.min() == es.max():
                groups.append((m, int(es[0]), rows))
            else:
                groups += [(m, int(e), rows[es == e]) for e in np.unique(es)]
        index = k
        if self.shuffle:
            index = np.empty_like(k)
            for m, e, rows in groups:
                index[rows] = self._order(m, e, k[rows])
        return member, index, m_epoch, groups

    def _order(self, m: int, e: int, k: np.ndarray) -> np.ndarray:
        """Position k of member m's shuffle in its epoch e: a permutation array held for members of up to
        PERMUTATION_LIMIT samples (made once per member epoch, in the process that serves it), else
        computed per position (serve/draws.permuted: no memory, a few microseconds a sample more)."""
        n = int(self.lengths[m])
        if n > PERMUTATION_LIMIT:
            return draws.permuted(n, (draws.MIXTURE, self.seed, m, e), k)
        cache = self.__dict__.setdefault("_orders", {})
        if cache.get(m, (None,))[0] != e:
            order = np.argsort(draws.bits((draws.MIXTURE, self.seed, m, e), np.arange(n)), kind="stable").astype(np.int32 if n < 2**31 else np.int64)
            cache[m] = (e, order)
        return cache[m][1][k]

    # -- a dataset ------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.samples

    def set_epoch(self, epoch: int) -> None:
        """The epoch `mixture[i]` serves (the Loader passes its own epoch with every batch)."""
        self.epoch = int(epoch)

    def __getitem__(self, i):
        """Position i of `set_epoch`'s epoch, as the Loader (seed 0) serves it: a tuple of tensors, one per
        key of the members' batch layout (a label is a 0-d tensor)."""
        import torch

        if not -self.samples <= int(i) < self.samples:
            raise IndexError(f"index {i} out of range for a mixture epoch of {self.samples}")
        req = Request(epoch=self.epoch)
        out = {k: np.empty((1, *shape), np.dtype(dt)) for k, (shape, dt) in self.batch_layout(req).items()}
        self.fill_batch(np.array([int(i) % self.samples]), out, req)
        return tuple(torch.from_numpy(v[0]) for v in out.values())

    def worker_init(self) -> None:
        for d in self.datasets:
            if hasattr(d, "worker_init"):
                d.worker_init()

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
        """Each member fills its rows: a contiguous run straight into the batch, scattered rows through a
        buffer of their own."""
        r = request or Request()
        _, index, _, groups = self._locate(idx, r.epoch)
        for m, e, rows in groups:
            req = Request(e, member_seed(r.seed, m), r.resolution, r.crop, r.flip)
            a, b = int(rows[0]), int(rows[-1]) + 1
            if b - a == len(rows):
                self.datasets[m].fill_batch(index[a:b], {k: v[a:b] for k, v in out.items()}, req)
                continue
            part = {k: np.empty((len(rows), *v.shape[1:]), v.dtype) for k, v in out.items()}
            self.datasets[m].fill_batch(index[rows], part, req)
            for k, v in out.items():
                v[rows] = part[k]


def member_seed(seed: int, member: int) -> int:
    """Member m's own seed for its per-sample draws (crops, flips, windows): sample i of two members in one
    member epoch must not get one box."""
    return int(draws.bits((draws.MIXTURE, int(seed), int(member)), 0)) >> 1


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
