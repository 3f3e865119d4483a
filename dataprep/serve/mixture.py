"""Mixtures: take datasets of one kind and their weights, give one dataset whose samples interleave
them deterministically in those proportions, resumable at any position like any other dataset.

Which member serves mixture position j is fixed by an apportionment that never lags: the first c
positions hold A_m(c) samples of member m, A_m(c) = c * w_m to within a sample or two for every c
(a binary tree of roundings, each floor(c * q + 1/2), so every A_m grows by at most one per position
and exactly one member grows at each). Any window of N positions therefore holds N * w_m samples of
member m to within a few samples, and position j maps to (member, its A_m(j)-th draw) in O(log M)
arithmetic: no table is built, however long the epoch. A member's draws run through its own
permutations, epoch after epoch (serve/draws.py, keyed by seed, member and member epoch), or in index
order for members whose samples are independent draws already (random token windows).

The Loader asks for runs of positions (as ranges). A run is served from its chunk's plan: which member
serves each position, worked out for 8,192 positions at once, and for token members the window starts,
drawn 1,024 at a time; the members' windows are read into one buffer in position order and converted
into the batch in one pass. benchmarks/bench_resume.py compares a mixture's batches with one pack's.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np

from ..errors import DataprepError
from . import draws
from .request import Request


PERMUTATION_LIMIT = 1 << 22  # members up to this many samples keep their shuffle as an array (int32: 16 MiB)
# Positions whose plan is worked out at once (a few chunks kept). Arrays of 8,192 int64 stay under
# malloc's 128 KiB mmap threshold: numpy's arithmetic on them costs ~8 ns an element, on 16,384 ~30.
CHUNK = 1 << 13
ADDRESS_BLOCK = 1 << 10  # a pair's addresses are drawn this many at a time, when first needed


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
        shuffle: each member's samples in a new order every member epoch (else in index order). Members
            whose samples are independent random draws keyed by (epoch, index), as a token pack's random
            windows are (`independent_samples`), are served in index order either way: in order, their
            samples are as random as shuffled, and no shuffle is drawn for them.

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
        shares: list = [None] * len(self.datasets)
        _shares(self._tree, np.asarray(c, np.int64), shares)
        return np.stack(shares)

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
        of positions (as the Loader asks) is sliced from the cached plan of its chunk(s); scattered
        positions are worked out one by one."""
        idx = np.asarray(idx, np.int64).reshape(-1)
        n = idx.size
        if not n:
            return []
        run = self._run(idx)
        if run is not None:
            return [(m, e, np.arange(n)[rows], index) for m, e, rows, index, _ in self._run_parts(*run, epoch)]
        return self._scattered(idx, epoch)

    def _scattered(self, idx: np.ndarray, epoch: int) -> list[tuple[int, int, np.ndarray, np.ndarray]]:
        """`_groups` for positions that are no run, worked out one by one."""
        n = idx.size
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

    def _run(self, idx: np.ndarray) -> tuple[int, int] | None:
        """(lo, hi) if positions `idx` are the run lo..hi-1, else None."""
        n = idx.size
        lo = int(idx[0])
        hi = lo + n
        if int(idx[-1]) != hi - 1 or (n > 2 and not (idx - lo == _ramp(n)).all()):
            return None
        if lo < 0 or hi > self.samples:
            raise IndexError(f"a position is out of range for a mixture epoch of {self.samples}")
        return lo, hi

    def _run_parts(self, lo: int, hi: int, epoch: int, seed: int | None = None):
        """Positions lo..hi-1 of `epoch` as parts of (member, member epoch, rows of the run (a slice where
        they are contiguous), indices in the member, the member's addresses of them under Loader seed
        `seed` (None: not asked, or the member has none)). Each part is two lookups and slices of its
        chunk's plan: no apportionment, shuffle or draw is worked out per batch."""
        parts = []
        for c in range(lo // CHUNK, (hi - 1) // CHUNK + 1):
            base = c * CHUNK
            a, b = max(lo - base, 0), min(hi - base, CHUNK)
            shift = lo - base  # chunk position - run row
            for m, e, pos, before, index, got in (self._chunk(epoch, c) if seed is None else self._plan(epoch, c, seed)):
                i0, i1 = int(before[a]), int(before[b])
                if i1 == i0:
                    continue
                rows = slice(a - shift, b - shift) if i1 - i0 == b - a else pos[i0:i1] - shift
                parts.append((m, e, rows, index[i0:i1], None if got is None else self._addresses(got, e, index, i0, i1)))
        return parts

    def _chunk(self, epoch: int, c: int) -> list[tuple[int, int, np.ndarray, np.ndarray, np.ndarray, None]]:
        """The plan of positions c * CHUNK.. of `epoch`: for each (member, member epoch) pair that serves
        some, the positions it serves (relative to the chunk, ascending), how many of them come before
        each position (so a batch finds its share by two lookups), their indices in the member, and None
        (`_plan` adds the addresses). Worked out once per chunk in each process that serves it (a few of
        the latest kept), so a batch costs slices, not the apportionment and the shuffles."""
        cache = self.__dict__.setdefault("_chunks", {})
        got = cache.get((epoch, c))
        if got is None:
            lo, hi = c * CHUNK, min((c + 1) * CHUNK, self.samples)
            shares: list = [None] * len(self.datasets)
            _shares(self._tree, np.arange(lo, hi + 1, dtype=np.int64), shares)
            got = []
            for m, held in enumerate(shares):
                rows = np.flatnonzero(held[1:] != held[:-1])  # member m serves the positions its count grows at
                if len(rows):  # within a run a member's draws are consecutive
                    rank = np.arange(held[0], held[0] + len(rows), dtype=np.int64)
                    for mm, e, r, k in self._draws(m, rows, rank, epoch, run=True):
                        before = np.zeros(hi - lo + 1, np.int32)  # the pair's positions before each position
                        before[r + 1] = 1
                        got.append((mm, e, r, np.cumsum(before, out=before), k, None))
            while len(cache) >= 4:
                cache.pop(next(iter(cache)))
            cache[(epoch, c)] = got
        return got

    def _plan(self, epoch: int, c: int, seed: int) -> list:
        """`_chunk` with room for each pair's addresses under a Loader of `seed` (`addresses` of members
        that have it: a token pack's window starts): an array per pair and which of its blocks of
        ADDRESS_BLOCK entries are drawn. `_addresses` draws a block when a batch first needs it, so a rank
        or worker that serves a few of a chunk's positions draws little more than those."""
        cache = self.__dict__.setdefault("_plans", {})
        got = cache.get((epoch, c, seed))
        if got is None:
            got = []
            for m, e, pos, before, index, _ in self._chunk(epoch, c):
                d = self.datasets[m]
                has = hasattr(d, "addresses") and hasattr(d, "fill_addresses")
                room = (np.empty(len(index), np.int64), np.zeros(-(-len(index) // ADDRESS_BLOCK), bool),
                        d, member_seed(seed, m)) if has else None
                got.append((m, e, pos, before, index, room))
            while len(cache) >= 4:
                cache.pop(next(iter(cache)))
            cache[(epoch, c, seed)] = got
        return got

    @staticmethod
    def _addresses(room, e: int, index: np.ndarray, i0: int, i1: int) -> np.ndarray:
        """Entries i0..i1-1 of a pair's addresses, drawing the blocks not drawn yet (blocks: a draw of a
        thousand costs about what one of a batch's few hundred does; numpy's overhead is per call)."""
        out, drawn, d, seed = room
        for k in range(i0 // ADDRESS_BLOCK, (i1 - 1) // ADDRESS_BLOCK + 1):
            if not drawn[k]:
                lo, hi = k * ADDRESS_BLOCK, min((k + 1) * ADDRESS_BLOCK, len(out))
                out[lo:hi] = d.addresses(index[lo:hi], e, seed)
                drawn[k] = True
        return out[i0:i1]

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
        shuffled = self.shuffle and not getattr(self.datasets[m], "independent_samples", False)
        return [(m, e, r, self._order(m, e, k) if shuffled else k) for e, r, k in parts if len(r)]

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
            order = np.arange(n, dtype=np.int32)  # the permutation Generator.permutation(n) gives, 1.4x faster
            np.random.default_rng(key).shuffle(order)
            cache[m] = (e, order)
        return cache[m][1][k]

    def __getstate__(self):
        """Without the caches (worked out again where needed)."""
        return {k: v for k, v in self.__dict__.items() if k not in ("_chunks", "_plans", "_orders", "_raw_buffer", "_raw_layout")}

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
    fills_runs = True  # the Loader passes a run of positions as a range (serve/request.py)

    def fill_batch(self, idx, out: dict[str, np.ndarray], request: Request | None = None,
                   rows: np.ndarray | None = None) -> None:
        """Each member fills its rows of the batch (or of `rows`): a member with addresses (token packs)
        from its chunk's precomputed ones; the others through `fill_batch`, a contiguous share straight
        into the batch, scattered rows in place where the member can (`fills_rows`: tokens, tables,
        mixtures), else through a buffer of their own. `idx`: positions, or a range of them."""
        r = request or Request()
        if isinstance(idx, range) and idx.step == 1:
            if not len(idx):
                return
            if idx.start < 0 or idx.stop > self.samples:
                raise IndexError(f"a position is out of range for a mixture epoch of {self.samples}")
            idx, run = None, (idx.start, idx.stop)
        else:
            idx = np.asarray(idx, np.int64).reshape(-1)
            if not idx.size:
                return
            run = self._run(idx)
        if run is not None:
            parts = self._run_parts(*run, r.epoch, r.seed)
            if len(parts) > 1 and self._raw is not None and all(p[4] is not None for p in parts):
                self._fill_raw(parts, run[1] - run[0], out, rows)
                return
        else:
            parts = [(m, e, mine, index, None) for m, e, mine, index in self._scattered(idx, r.epoch)]
        for m, e, mine, index, addresses in parts:
            d = self.datasets[m]
            at = mine if rows is None else np.asarray(rows)[mine]
            if addresses is not None:
                d.fill_addresses(addresses, out, at)
                continue
            req = Request(e, member_seed(r.seed, m), r.resolution, r.crop, r.flip)
            if isinstance(at, slice):
                d.fill_batch(index, {k: v[at] for k, v in out.items()}, req)
                continue
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

    def _fill_raw(self, parts, n: int, out: dict[str, np.ndarray], rows) -> None:
        """Members that store samples alike (`raw_layout`: token packs of one context and dtype) read
        theirs into one buffer in position order, then it is converted into the batch in one pass."""
        shape, dt = self._raw
        buf = self.__dict__.get("_raw_buffer")
        if buf is None or len(buf) < n:
            buf = self.__dict__["_raw_buffer"] = np.empty((n, *shape), dt)
        raw = buf[:n]
        for m, _, at, _, addresses in parts:
            raw[at] = self.datasets[m].read_addresses(addresses)
        self.datasets[parts[0][0]].fill_raw(raw, out, rows)

    @property
    def _raw(self) -> tuple[tuple[int, ...], np.dtype] | None:
        """The members' common `raw_layout`, or None (one has none, or they differ)."""
        got = self.__dict__.get("_raw_layout", False)
        if got is False:
            lays = [d.raw_layout if hasattr(d, "read_addresses") and hasattr(d, "fill_raw") else None for d in self.datasets]
            same = lays[0] is not None and all(lay == lays[0] for lay in lays) and len({type(d) for d in self.datasets}) == 1
            got = self.__dict__["_raw_layout"] = lays[0] if same else None
        return got


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


_RAMP = np.arange(0, dtype=np.int64)


def _ramp(n: int) -> np.ndarray:
    """0..n-1, sliced from one array kept per process (a run check is then one comparison)."""
    global _RAMP
    if len(_RAMP) < n:
        _RAMP = np.arange(max(n, 2 * len(_RAMP)), dtype=np.int64)
    return _RAMP[:n]


def _shares(node, c: np.ndarray, out: list) -> None:
    """Each member's count of the first c positions into out[member]: the tree's roundings, one per node
    (a list of arrays, so a chunk's counts are arrays under 128 KiB each)."""
    if isinstance(node, int):
        out[node] = c
        return
    left, right, share = node
    cl = np.floor(c * share + 0.5).astype(np.int64)
    _shares(left, cl, out)
    _shares(right, c - cl, out)
