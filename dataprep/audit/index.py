"""Near-duplicate search: takes uint64 hashes (one per sample) and a maximum Hamming distance D, gives
every pair of samples (i < j) within D, held compactly (`Matches`) and listed in bounded chunks.

No all-pairs loop. Equal hashes are grouped first (`np.unique`): a group of k equal hashes is k(k-1)/2
pairs at distance 0 that are counted and listed without being searched, so exact duplicates and blank
images cost nothing however many there are. The distinct hashes are then searched with multi-index
hashing under the generalised pigeonhole principle: the 64 bits are cut into m blocks and each block i
gets a radius t_i >= -1 with sum(t_i) = D - m + 1; a pair within D then lies within t_i on some block i
(if it lay beyond on every block it would differ in at least D + 1 bits). With t_i = 0 for all (m = D + 1)
this is plain exact-block matching, but 64 bits in D + 1 blocks are blocks of 7 bits at D = 8, which
pair every hash with a hundredth of the others; fewer, longer blocks probed at a small radius (every
key within t_i bits of a hash's block looked up in a table of the block's values) make far fewer
candidates, so m is chosen by a cost model of probes against candidates (`plan`). Every candidate's
full distance is checked, and a pair is kept only by the first block whose radius it falls within, so
no pair is listed twice. A pair of block keys p bits apart is probed from one side only: from the hash
whose key has the lowest bit of p clear.

Memory stays bounded: block tables have at most 2**24 entries, and candidates, like listed pairs, are
made in chunks of at most `CHUNK` (a group larger than that is cut into pieces). Time is bounded by the
candidates, which for random hashes are a few hundred per hash at N = 1.28 M and D = 8; hashes that agree
on whole blocks without being near (strongly skewed bits) make more, and `Matches.candidates` says how
many were checked.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations
from math import comb
from typing import Callable, Iterator, NamedTuple

import numpy as np

HASH_BITS = 64
CHUNK = 1 << 20  # candidates or listed pairs made at once
MAX_TABLE_BITS = 24  # the longest block a lookup table is made for (2**24 int32 entries: 64 MiB)
SEARCHES = ("auto", "index", "brute")
MAX_DISTANCE = 32  # past this a 64-bit perceptual hash pairs unrelated images; refused as a usage error


class Pairs(NamedTuple):
    """Listed pairs of samples: i < j, their distance; `complete` is False when a limit cut the list."""

    i: np.ndarray
    j: np.ndarray
    distance: np.ndarray
    complete: bool


@dataclass(frozen=True)
class Block:
    """Bits [lo, lo + bits) of a hash, searched within `radius` bits (-1: not searched)."""

    lo: int
    bits: int
    radius: int

    @property
    def mask(self) -> np.uint64:
        return np.uint64(((1 << self.bits) - 1) << self.lo)

    def keys(self, h: np.ndarray) -> np.ndarray:
        return ((h >> np.uint64(self.lo)) & np.uint64((1 << self.bits) - 1)).astype(np.int64)

    @property
    def probes(self) -> int:
        return sum(comb(self.bits, k) for k in range(self.radius + 1))


def plan(n: int, max_distance: int, search: str = "auto") -> list[Block] | None:
    """The blocks to search `n` distinct hashes within `max_distance` with, or None when comparing all
    against all costs less (search="auto"; "index" always gives blocks, "brute" never). Cost: one unit
    per (hash, probe) and three per candidate, candidates counted as for uniformly random hashes (each
    probe of a b-bit block matches n / 2**b others)."""
    if max_distance == 0 or n < 2:
        return []  # distinct hashes are never within distance 0 of each other
    if search not in SEARCHES:
        raise ValueError(f"unknown search {search!r}; choose one of {list(SEARCHES)}")
    if search == "brute":
        return None
    best, best_cost = None, (float("inf") if search == "index" else 0.5 * n * n)  # all against all: one unit per pair
    for m in range(3, 17):
        sizes = [HASH_BITS // m + (1 if k < HASH_BITS % m else 0) for k in range(m)]
        if max(sizes) > MAX_TABLE_BITS:
            continue
        total = max_distance - m + 1  # sum of the radii, each >= -1
        if total < -m:
            break
        base, extra = divmod(total + m, m)  # radii + 1 spread evenly, the larger ones on the longer blocks
        radii = [base - 1 + (1 if k < extra else 0) for k in range(m)]
        blocks, lo = [], 0
        for b, r in zip(sizes, radii):
            blocks.append(Block(lo, b, r))
            lo += b
        probes = sum(bl.probes for bl in blocks if bl.radius >= 0)
        cands = sum(0.5 * n * n * bl.probes / 2.0 ** bl.bits for bl in blocks if bl.radius >= 0)
        cost = 0.5 * n * probes + 3.0 * cands + sum(2.0 ** bl.bits for bl in blocks if bl.radius >= 0)
        if cost < best_cost:
            best, best_cost = blocks, cost
    return best


@dataclass(frozen=True)
class Matches:
    """Every pair of samples within `max_distance`, held by distinct hash: `inverse` maps each sample to
    its distinct hash, `counts` says how many samples share each, and (u, v, d) are the distinct hashes
    within the distance of each other (u < v, d >= 1). Sample pairs come from `pairs()`."""

    max_distance: int
    hashes: np.ndarray  # the distinct hashes, sorted
    inverse: np.ndarray
    counts: np.ndarray
    u: np.ndarray
    v: np.ndarray
    d: np.ndarray
    candidates: int = 0  # candidate pairs of distinct hashes whose distance was checked
    _members: np.ndarray = field(default=None, repr=False)  # samples ordered by distinct hash, in sample order
    _starts: np.ndarray = field(default=None, repr=False)

    @property
    def size(self) -> int:
        return len(self.inverse)

    @property
    def exact_hash_pairs(self) -> int:
        """Pairs of samples with equal hashes."""
        c = self.counts.astype(np.int64)
        return int((c * (c - 1) // 2).sum())

    @property
    def total(self) -> int:
        """Every pair of samples within the distance (what `pairs()` lists without a limit)."""
        return self.exact_hash_pairs + int((self.counts[self.u].astype(np.int64) * self.counts[self.v]).sum())

    def chunks(self, chunk: int = CHUNK, split: np.ndarray | None = None,
               across: bool = False) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Every pair of samples as (i, j, distance) chunks of at most `chunk`: equal hashes first, then
        pairs of distinct hashes by rising distance, so any prefix holds the closest pairs. With `split` (a
        code per sample), only the pairs whose ends lie in different splits (`across`) or in one split (not
        `across`) are made: the samples of each distinct hash are kept apart by split, and pairs are made
        between those parts alone, so the pairs not asked for cost nothing (k equal hashes in train make no
        work when pairs across splits are asked for)."""
        if split is None:
            if across:
                return
            members, starts, counts = self._members, self._starts[:-1], self.counts.astype(np.int64)
            value, code = np.arange(len(counts), dtype=np.int64), np.zeros(len(counts), np.int64)
        else:
            members, starts, counts, value, code = _parts(self.inverse, np.asarray(split, np.int64))
        nv = len(self.counts)
        first = np.searchsorted(value, np.arange(nv))  # each distinct hash's parts: first .. first + many - 1
        many = np.bincount(value, minlength=nv)
        # equal hashes: within one part (triangles), or between two parts of one distinct hash
        if not across:
            full = np.flatnonzero(counts >= 2)
            tri = counts[full] * (counts[full] - 1) // 2
            for gid, local in _spans(tri, chunk):
                a, b = _triangle(local)
                s = starts[full[gid]]
                yield members[s + a], members[s + b], np.zeros(len(local), np.int64)
            g1 = g2 = np.zeros(0, np.int64)
        else:
            pa, pb = [], []
            for a in range(int(many.max(initial=0))):
                for b in range(a + 1, int(many.max(initial=0))):
                    x = np.flatnonzero(many > b)
                    pa.append(first[x] + a)
                    pb.append(first[x] + b)
            g1, g2 = (np.concatenate(z) if z else np.zeros(0, np.int64) for z in (pa, pb))
            o = np.argsort(g1, kind="stable")
            g1, g2 = g1[o], g2[o]
        d0 = np.zeros(len(g1), np.int64)
        # distinct hashes within the distance: between a part of each, by rising distance
        order = np.argsort(self.d, kind="stable")
        u, v, d = self.u[order], self.v[order], self.d[order]
        if split is None:
            e1, e2, ed = u, v, d
        else:
            ea, eb, rank = [], [], []
            top = int(many.max(initial=0))
            for a in range(top):
                for b in range(top):
                    x = np.flatnonzero((many[u] > a) & (many[v] > b))
                    p, q = first[u[x]] + a, first[v[x]] + b
                    keep = (code[p] != code[q]) == across
                    ea.append(p[keep])
                    eb.append(q[keep])
                    rank.append(x[keep])
            e1, e2, r = (np.concatenate(z) if z else np.zeros(0, np.int64) for z in (ea, eb, rank))
            o = np.argsort(r, kind="stable")
            e1, e2, ed = e1[o], e2[o], d[r[o]]
        g1, g2 = np.concatenate([g1, e1]), np.concatenate([g2, e2])
        gd = np.concatenate([d0, np.asarray(ed, np.int64)])
        c2 = counts[g2]
        for gid, local in _spans(counts[g1] * c2, chunk):
            a, b = np.divmod(local, c2[gid])
            x, y = members[starts[g1[gid]] + a], members[starts[g2[gid]] + b]
            yield np.minimum(x, y), np.maximum(x, y), gd[gid]

    def pairs(self, limit: int | None = None, where: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
              split: np.ndarray | None = None, across: bool = False) -> Pairs:
        """The sample pairs, sorted by (distance, i, j). `split`, `across`: as for `chunks` (only the pairs
        across splits, or only those within one, are made). `where(i, j)`: a boolean mask of the pairs to
        keep, applied to those made. `limit`: at most that many, the closest (complete=False when cut)."""
        parts, n, complete = [], 0, True
        for i, j, d in self.chunks(split=split, across=across):
            if where is not None:
                keep = np.asarray(where(i, j), bool)
                i, j, d = i[keep], j[keep], d[keep]
            if limit is not None and n + len(i) > limit:
                # the chunk is of one distance or rising distances: keep its closest, then stop
                o = np.lexsort((j, i, d))[: limit - n]
                parts.append((i[o], j[o], d[o]))
                complete = False
                break
            parts.append((i, j, d))
            n += len(i)
        if not parts:
            e = np.zeros(0, np.int64)
            return Pairs(e, e.copy(), e.copy(), complete)
        i, j, d = (np.concatenate(x) for x in zip(*parts))
        o = np.lexsort((j, i, d))
        return Pairs(i[o], j[o], d[o], complete)

    def groups(self) -> np.ndarray:
        """A group id per sample: samples joined by a chain of pairs share one (connected components);
        ids are 0, 1, ... in the order of each group's first sample."""
        label = _components(len(self.counts), self.u, self.v)
        per_sample = label[self.inverse]
        _, first, compact = np.unique(per_sample, return_index=True, return_inverse=True)
        rank = np.empty(len(first), np.int64)
        rank[np.argsort(first, kind="stable")] = np.arange(len(first))
        return rank[compact]


def find_matches(hashes, max_distance: int, search: str = "auto") -> Matches:
    """Every pair of samples whose hashes are within `max_distance` bits (0 <= D <= 32). `search`: "auto"
    (the cost model picks), "index" (multi-index hashing always) or "brute" (all against all)."""
    h = np.asarray(hashes)
    if h.ndim != 1:
        raise ValueError(f"hashes must be one uint64 per sample, got shape {h.shape}")
    if h.dtype != np.uint64:
        if not np.issubdtype(h.dtype, np.integer) and len(h):
            raise ValueError(f"hashes must be integers (uint64), got {h.dtype}")
        h = h.astype(np.uint64)
    if isinstance(max_distance, bool) or not isinstance(max_distance, (int, np.integer)) or not 0 <= max_distance <= MAX_DISTANCE:
        raise ValueError(f"max_distance must be an integer from 0 to {MAX_DISTANCE}, got {max_distance!r}")
    D = int(max_distance)
    uniq, inverse, counts = np.unique(h, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1).astype(np.int64)
    u, v, d, checked = _near_distinct(uniq, D, search)
    members = np.argsort(inverse, kind="stable")
    starts = np.zeros(len(uniq) + 1, np.int64)
    np.cumsum(counts, out=starts[1:])
    return Matches(D, uniq, inverse, counts.astype(np.int64), u, v, d, checked, members, starts)


def near_pairs(hashes, max_distance: int, limit: int | None = None) -> Pairs:
    """Every pair (i < j) of samples within `max_distance`, sorted by (distance, i, j)."""
    return find_matches(hashes, max_distance).pairs(limit)


def cross_pairs(queries, references, max_distance: int, limit: int | None = None) -> Pairs:
    """Every (query i, reference j) within `max_distance` (i indexes `queries`, j `references`)."""
    q, r = np.asarray(queries, np.uint64), np.asarray(references, np.uint64)
    nq = len(q)
    side = (np.arange(nq + len(r)) >= nq).astype(np.int64)  # 0: a query, 1: a reference; i < j puts the query first
    p = find_matches(np.concatenate([q, r]), max_distance).pairs(limit, split=side, across=True)
    return Pairs(p.i, p.j - nq, p.distance, p.complete)


def brute_force_pairs(hashes, max_distance: int, rows: int = 256) -> Pairs:
    """The reference: every pair compared (in bands of `rows`), sorted by (distance, i, j). O(N^2)."""
    h = np.asarray(hashes, np.uint64)
    out = []
    for s in range(0, len(h), rows):
        dist = np.bitwise_count(h[s:s + rows, None] ^ h[None, :])
        ii, jj = np.nonzero(dist <= max_distance)
        ii = ii + s
        keep = ii < jj
        out.append((ii[keep], jj[keep], dist[ii[keep] - s, jj[keep]].astype(np.int64)))
    if not out:
        e = np.zeros(0, np.int64)
        return Pairs(e, e.copy(), e.copy(), True)
    i, j, d = (np.concatenate(x).astype(np.int64) for x in zip(*out))
    o = np.lexsort((j, i, d))
    return Pairs(i[o], j[o], d[o], True)


# -- the search over distinct hashes ---------------------------------------------------------------
def _near_distinct(h: np.ndarray, D: int, search: str):
    """Pairs (u < v) of distinct sorted hashes within D, their distances, and the candidates checked."""
    n = len(h)
    e = np.zeros(0, np.int64)
    blocks = plan(n, D, search)
    if blocks == []:
        return e, e.copy(), e.copy(), 0
    if blocks is None:
        p = brute_force_pairs(h, D)
        return p.i, p.j, p.distance, n * (n - 1) // 2
    out, checked = [], 0
    for k, bl in enumerate(blocks):
        if bl.radius < 0:
            continue
        earlier = [b for b in blocks[:k] if b.radius >= 0]
        for x, y in _block_candidates(h, bl):
            checked += len(x)
            x, y = np.minimum(x, y), np.maximum(x, y)
            xor = h[x] ^ h[y]
            dist = np.bitwise_count(xor)
            keep = dist <= D
            for b in earlier:  # found there already
                keep &= np.bitwise_count(xor & b.mask) > b.radius
            out.append((x[keep], y[keep], dist[keep].astype(np.int64)))
    if not out:
        return e, e.copy(), e.copy(), checked
    u, v, d = (np.concatenate(z) for z in zip(*out))
    o = np.lexsort((v, u))
    return u[o], v[o], d[o], checked


def _block_candidates(h: np.ndarray, bl: Block) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Pairs of hash indices whose keys on block `bl` are within its radius, each unordered pair once,
    in chunks."""
    keys = bl.keys(h)
    order = np.argsort(keys, kind="stable")
    start = np.zeros((1 << bl.bits) + 1, np.int64 if len(h) >= 2**31 else np.int32)
    np.cumsum(np.bincount(keys, minlength=1 << bl.bits), out=start[1:])
    # radius 0: the pairs within each bucket of equal keys
    sizes = np.diff(start).astype(np.int64)
    full = np.flatnonzero(sizes >= 2)
    tri = sizes[full] * (sizes[full] - 1) // 2
    for gid, local in _spans(tri, CHUNK):
        a, b = _triangle(local)
        s = start[full[gid]].astype(np.int64)
        yield order[s + a], order[s + b]
    # radius r >= 1: every pattern of 1..r bits, probed from the hashes whose key has its lowest bit clear
    for low in range(bl.bits):
        side = np.flatnonzero(((keys >> low) & 1) == 0)
        if not len(side):
            continue
        side_keys = keys[side]
        for r in range(1, bl.radius + 1):
            for rest in combinations(range(low + 1, bl.bits), r - 1):
                p = (1 << low) | sum(1 << q for q in rest)
                target = side_keys ^ p
                s, c = start[target].astype(np.int64), (start[target + 1] - start[target]).astype(np.int64)
                hit = np.flatnonzero(c)
                if not len(hit):
                    continue
                for gid, local in _spans(c[hit], CHUNK):
                    yield side[hit[gid]], order[s[hit[gid]] + local]


def _parts(inverse: np.ndarray, split: np.ndarray):
    """The samples of each distinct hash cut by split: (members: samples ordered by (distinct hash, split,
    sample); each part's start in members, size, distinct hash and split code), parts in (hash, split) order."""
    if len(split) != len(inverse):
        raise ValueError(f"split has {len(split)} codes for {len(inverse)} samples")
    S = int(split.max(initial=0)) + 1
    key = inverse * S + split
    members = np.argsort(key, kind="stable")
    keys, starts, counts = np.unique(key[members], return_index=True, return_counts=True)
    return members, starts.astype(np.int64), counts.astype(np.int64), keys // S, keys % S


def _spans(sizes: np.ndarray, chunk: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(group, local index) for every item of groups of the given sizes, in chunks of about `chunk`:
    whole groups together while they fit, a larger group cut into pieces of `chunk`."""
    sizes = np.asarray(sizes, np.int64)
    if not len(sizes):
        return
    cum = np.cumsum(sizes)
    g, n = 0, len(sizes)
    while g < n:
        base = int(cum[g - 1]) if g else 0
        g1 = int(np.searchsorted(cum, base + chunk, side="right"))
        if g1 <= g:  # one group larger than a chunk
            size = int(sizes[g])
            for lo in range(0, size, chunk):
                local = np.arange(lo, min(size, lo + chunk), dtype=np.int64)
                yield np.full(len(local), g, np.int64), local
            g += 1
            continue
        sz = sizes[g:g1]
        total = int(cum[g1 - 1]) - base
        if total:
            gid = np.repeat(np.arange(g, g1, dtype=np.int64), sz)
            firsts = np.repeat(cum[g:g1] - sz - base, sz)
            yield gid, np.arange(total, dtype=np.int64) - firsts
        g = g1


def _triangle(t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The t-th pair (a < b) in the order (0,1), (0,2), (1,2), (0,3), ...: b(b-1)/2 + a = t."""
    b = ((1 + np.sqrt(1 + 8 * t.astype(np.float64))) // 2).astype(np.int64)
    b -= (b * (b - 1) // 2) > t  # float rounding, either way
    b += ((b + 1) * b // 2) <= t
    return t - b * (b - 1) // 2, b


def _components(n: int, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Connected components of n nodes and edges (u, v): the smallest node of each, per node."""
    label = np.arange(n, dtype=np.int64)
    if not len(u):
        return label
    while True:
        lo = np.minimum(label[u], label[v])
        before = label.copy()
        np.minimum.at(label, u, lo)
        np.minimum.at(label, v, lo)
        while True:  # pointer jumping: every node straight to its root
            nxt = label[label]
            if np.array_equal(nxt, label):
                break
            label = nxt
        if np.array_equal(label, before):
            return label
