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

from functools import lru_cache
from typing import Sequence

import numpy as np

from ..errors import DataprepError
from . import draws
from .request import Request


PERMUTATION_LIMIT = 1 << 22  # members up to this many samples keep their shuffle as an array (int64: 32 MiB)
CHUNK = 1 << 14  # positions whose apportionment is worked out at once (~200 KiB each, a few kept)


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
        idx = np.asarray(idx, np.int64)
        member, index, m_epoch = (np.empty(idx.shape, np.int64) for _ in range(3))
        for m, e, rows, ix in self._groups(idx, epoch):
            member.reshape(-1)[rows], index.reshape(-1)[rows], m_epoch.reshape(-1)[rows] = m, ix, e
        return member, index, m_epoch

    def _groups(self, idx: np.ndarray, epoch: int) -> list[tuple[int, int, np.ndarray, np.ndarray]]:
        """(member, member epoch, rows of idx, indices in the member) for positions `idx` (flattened): a run
        of positions (as the Loader asks) is sliced from the cached apportionment of its chunk(s); scattered
        positions are worked out one by one."""
        idx = np.asarray(idx, np.int64).reshape(-1)
        n = idx.size
        if not n:
            return []
        lo, hi = int(idx[0]), int(idx[-1])
        if hi - lo == n - 1 and (n == 1 or (np.diff(idx) == 1).all()):
            if lo < 0 or hi >= self.samples:
                raise IndexError(f"a position is out of range for a mixture epoch of {self.samples}")
            return self._run_groups(lo, hi + 1, epoch)
        if idx.min() < 0 or idx.max() >= self.samples:
            raise IndexError(f"a position is out of range for a mixture epoch of {self.samples}")
        c = self.counts(np.concatenate([idx, idx + 1]))
        before = c[:, :n]
        member = np.argmax(c[:, n:] - before, axis=0)
        groups = []
        for m in range(len(self.datasets)):
            rows = np.flatnonzero(member == m)
            if len(rows):
                groups += self._draws(m, rows, before[m, rows], epoch, run=False)
        return groups

    def _run_groups(self, lo: int, hi: int, epoch: int) -> list[tuple[int, int, np.ndarray, np.ndarray]]:
        groups = []
        for c in range(lo // CHUNK, (hi - 1) // CHUNK + 1):
            base = c * CHUNK
            codes, index, pairs = self._chunk(epoch, c)
            a, b = max(lo, base) - base, min(hi, base + CHUNK) - base
            off = base + a - lo  # row of the run where this chunk's share begins
            if len(pairs) == 1:
                groups.append((*pairs[0], np.arange(off, off + b - a), index[a:b]))
                continue
            cs, ix = codes[a:b], index[a:b]
            for p, (m, e) in enumerate(pairs):
                rows = np.flatnonzero(cs == p)
                if len(rows):
                    groups.append((m, e, rows + off if off else rows, ix[rows]))
        return groups

    def _chunk(self, epoch: int, c: int) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]]]:
        """Positions c * CHUNK.. of `epoch`: which (member, member epoch) pair serves each (a code into the
        pairs) and the index in the member. Worked out once per chunk in each process that serves it
        (a few of the latest kept), so a batch costs a slice, not the apportionment and the shuffles."""
        cache = self.__dict__.setdefault("_chunks", {})
        got = cache.get((epoch, c))
        if got is None:
            lo, hi = c * CHUNK, min((c + 1) * CHUNK, self.samples)
            steps = np.diff(self.counts(np.arange(lo, hi + 1)), axis=1)  # one 1 per column: who serves it
            firsts = self.counts(lo)
            codes, index, pairs = np.empty(hi - lo, np.int32), np.empty(hi - lo, np.int64), []
            for m in range(len(self.datasets)):
                rows = np.flatnonzero(steps[m])
                if len(rows):  # within a run a member's draws are consecutive
                    rank = np.arange(firsts[m], firsts[m] + len(rows), dtype=np.int64)
                    for mm, e, r, k in self._draws(m, rows, rank, epoch, run=True):
                        codes[r], index[r] = len(pairs), k
                        pairs.append((mm, e))
            while len(cache) >= 4:
                cache.pop(next(iter(cache)))
            cache[(epoch, c)] = got = (codes, index, pairs)
        return got

    def _draws(self, m: int, rows: np.ndarray, rank: np.ndarray, epoch: int, run: bool):
        """Member m's draws number `rank` (of mixture epoch `epoch`) -> groups of (member, member epoch,
        rows, index in the member): a draw past the member's length falls in its next epoch (restart)."""
        if self.exhausted == "stop":
            parts = [(int(epoch), rows, rank)]
        else:
            drawn = rank + int(epoch) * int(self._per_epoch[m])
            length = int(self.lengths[m])
            if run:  # drawn grows along the rows, so its ends bound its epochs
                e0, e1 = int(drawn[0]) // length, int(drawn[-1]) // length
            else:
                e0, e1 = int(drawn.min()) // length, int(drawn.max()) // length
            if e0 == e1:
                parts = [(e0, rows, drawn - e0 * length)]
            else:
                es = drawn // length
                parts = [(int(e), rows[es == e], drawn[es == e] - int(e) * length) for e in range(e0, e1 + 1)]
        return [(m, e, r, self._order(m, e, k) if self.shuffle else k) for e, r, k in parts if len(r)]

    def _order(self, m: int, e: int, k: np.ndarray) -> np.ndarray:
        """Position k of member m's shuffle in its epoch e: a permutation array held for members of up to
        PERMUTATION_LIMIT samples (made once per member epoch, in the process that serves it), else
        computed per position (serve/draws.permuted: no memory, a few microseconds a sample more)."""
        n = int(self.lengths[m])
        if n > PERMUTATION_LIMIT:
            return draws.permuted(n, (draws.MIXTURE, self.seed, m, e), k)
        cache = self.__dict__.setdefault("_orders", {})
        if cache.get(m, (None,))[0] != e:
            key = [w & 0xFFFFFFFFFFFFFFFF for w in (draws.MIXTURE, self.seed, m, e)]  # 3x faster than argsorting draws
            order = np.random.default_rng(key).permutation(n)
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

    fills_rows = True

    def fill_batch(self, idx: np.ndarray, out: dict[str, np.ndarray], request: Request | None = None,
                   rows: np.ndarray | None = None) -> None:
        """Each member fills its rows: a contiguous run straight into the batch; scattered rows straight
        into their places where the member can (`fills_rows`: tokens, tables, mixtures), else through a
        buffer of their own."""
        r = request or Request()
        groups = self._groups(idx, r.epoch)
        parts = [(self.datasets[m], Request(e, member_seed(r.seed, m), r.resolution, r.crop, r.flip),
                  mine if rows is None else np.asarray(rows)[mine], index) for m, e, mine, index in groups]
        together = getattr(type(self.datasets[0]), "fill_parts", None)
        if together is not None:
            together(parts, out)
            return
        for d, req, at, index in parts:
            a, b = int(at[0]), int(at[-1]) + 1
            if b - a == len(at):
                d.fill_batch(index, {k: v[a:b] for k, v in out.items()}, req)
            elif getattr(d, "fills_rows", False):
                d.fill_batch(index, out, req, rows=at)
            else:
                part = {k: np.empty((len(at), *v.shape[1:]), v.dtype) for k, v in out.items()}
                d.fill_batch(index, part, req)
                for k, v in out.items():
                    v[at] = part[k]


@lru_cache(maxsize=1024)
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
