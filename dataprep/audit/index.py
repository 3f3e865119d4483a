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

Memory stays bounded whatever the hashes: block tables have at most 2**24 entries, and candidates, like
listed pairs, are made in chunks of at most `CHUNK` (a group larger than that is cut into pieces). The
pairs of distinct hashes found (edges) are held only while they are few (`MAX_EDGES`); past that, as
thousands of video frames a few bits apart give (every frame near every other: n(n-1)/2 edges), nothing
is held but what the search folds into per-hash arrays as it goes (the pair count, the connected
components), and whoever needs the edges again (`Matches.edges`) gets them from the same search run again,
chunk by chunk; a listing cut at a limit keeps the closest edges it needs, never all of them. Time is
bounded by the candidates, which for random hashes are a few hundred per hash at N = 1.28 M and D = 8;
hashes that agree on whole blocks without being near (strongly skewed bits) make more, and
`Matches.candidates` says how many were checked.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import combinations
from math import comb
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from .folds import Components, EdgePick, Pairs, group_ids, take
from .hashes import as_hashes
from .pairing import _part_pairs, _parts, _spans, _triangle

HASH_BITS = 64
CHUNK = 1 << 20  # candidates or listed pairs made at once
MAX_EDGES = 1 << 21  # pairs of distinct hashes held by Matches at most (24 bytes each); past it they are searched again
FOLD = 1 << 18  # edges given to the folds at once: what their temporaries grow with
MAX_TABLE_BITS = 24  # the longest block a lookup table is made for (2**24 int32 entries: 64 MiB)
SEARCHES = ("auto", "index", "brute")
MAX_DISTANCE = 32  # past this a 64-bit perceptual hash pairs unrelated images; refused as a usage error


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
    its distinct hash, `counts` says how many samples share each, and the pairs of distinct hashes within
    the distance of each other (u < v, d >= 1: the edges) come from `edges()`. Sample pairs come from
    `pairs()`, connected components from `groups()`."""

    max_distance: int
    hashes: np.ndarray  # the distinct hashes, sorted
    inverse: np.ndarray
    counts: np.ndarray
    edge_count: int  # pairs of distinct hashes within the distance
    near_total: int  # pairs of samples whose hashes differ and are within the distance
    label: np.ndarray  # per distinct hash: the smallest distinct hash joined to it by a chain of edges
    candidates: int = 0  # candidate pairs of distinct hashes whose distance was checked
    search: str = "auto"  # how the edges were found, and are found again when not held
    _held: tuple[np.ndarray, np.ndarray, np.ndarray] | None = field(default=None, repr=False)  # the edges by (u, v)
    _members: np.ndarray = field(default=None, repr=False)  # samples ordered by distinct hash, in sample order
    _starts: np.ndarray = field(default=None, repr=False)

    @property
    def size(self) -> int:
        return len(self.inverse)

    @property
    def held(self) -> bool:
        """Whether the edges are held (at most MAX_EDGES), rather than found again by each `edges()`."""
        return self._held is not None

    @property
    def exact_hash_pairs(self) -> int:
        """Pairs of samples with equal hashes."""
        c = self.counts.astype(np.int64)
        return int((c * (c - 1) // 2).sum())

    @property
    def total(self) -> int:
        """Every pair of samples within the distance (what `pairs()` lists without a limit)."""
        return self.exact_hash_pairs + self.near_total

    def edges(self, chunk: int | None = None) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The pairs of distinct hashes within the distance as (u, v, d) chunks (indices into `hashes`, u <
        v, d >= 1) of `chunk` [FOLD] at most: the held edges, or, past MAX_EDGES, the search run again (each
        call a pass of the search, in bounded memory). Whatever folds them must not depend on the chunking."""
        chunk = FOLD if chunk is None else chunk
        if self._held is not None:
            u, v, d = self._held
            for s in range(0, len(u), chunk):
                yield u[s:s + chunk], v[s:s + chunk], d[s:s + chunk]
            return
        for u, v, d in _batched(_search(self.hashes, self.max_distance, self.search), chunk):
            yield u, v, d

    def chunks(self, chunk: int = CHUNK, split: np.ndarray | None = None, across: bool = False,
               limit: int | None = None, picked: EdgePick | None = None) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Every pair of samples as (i, j, distance) chunks of at most `chunk`: equal hashes first, then
        pairs of distinct hashes by rising distance, so any prefix holds the closest pairs. With `split` (a
        code per sample), only the pairs whose ends lie in different splits (`across`) or in one split (not
        `across`) are made: the samples of each distinct hash are kept apart by split, and pairs are made
        between those parts alone, so the pairs not asked for cost nothing (k equal hashes in train make no
        work when pairs across splits are asked for). `limit`: the caller reads no further than the chunk
        that passes that many pairs, so only the edges those chunks need are kept (`pick`). `picked`: the
        edges picked already (`pick(split, across, limit, chunk)` fed by a pass over `edges()`)."""
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
        if picked is None:
            picked = self.pick(split, across, limit, chunk)
            for u, v, d in self.edges():
                picked.add(u, v, d)
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
        u, v, d = picked.result()
        if split is None:
            e1, e2, ed = u, v, d
        else:
            e1, e2, r = _part_pairs(u, v, first, many, code, across)
            ed = d[r]
        g1, g2 = np.concatenate([g1, e1]), np.concatenate([g2, e2])
        gd = np.concatenate([d0, np.asarray(ed, np.int64)])
        c2 = counts[g2]
        for gid, local in _spans(counts[g1] * c2, chunk):
            a, b = np.divmod(local, c2[gid])
            x, y = members[starts[g1[gid]] + a], members[starts[g2[gid]] + b]
            yield np.minimum(x, y), np.maximum(x, y), gd[gid]

    def pick(self, split: np.ndarray | None = None, across: bool = False, limit: int | None = None,
             chunk: int = CHUNK) -> EdgePick:
        """A fold that picks, from the edges given to its `add`, those `chunks(chunk, split, across, limit)`
        needs: the edges that make a pair asked for (across splits, or within one, with `split`), and with a
        `limit` only the first `limit + chunk` of them by (d, u, v), the most that the chunks up to the one
        passing the limit can hold (each edge makes a pair at least). Memory: O(limit + chunk) edges."""
        asked = None
        split = None if split is None else np.asarray(split, np.int64)
        if split is not None and int(split.max(initial=0)) < 64:  # each distinct hash's splits as bits
            bits = np.zeros(len(self.counts), np.uint64)
            np.bitwise_or.at(bits, self.inverse, np.uint64(1) << split.astype(np.uint64))
            alone = np.bitwise_count(bits) == 1
            if across:  # unless both lie in one split, the same
                asked = (lambda u, v: ~(alone[u] & alone[v] & (bits[u] == bits[v])))
            else:  # a split that holds both
                asked = (lambda u, v: (bits[u] & bits[v]) != 0)
        elif split is not None:
            _, _, _, value, code = _parts(self.inverse, split)
            first = np.searchsorted(value, np.arange(len(self.counts)))
            many = np.bincount(value, minlength=len(self.counts))

            def asked(u, v):
                wanted = np.zeros(len(u), bool)
                wanted[_part_pairs(u, v, first, many, code, across, ordered=False)[2]] = True
                return wanted

        return EdgePick(len(self.counts), None if limit is None else limit + chunk, asked)

    def pairs(self, limit: int | None = None, where: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
              split: np.ndarray | None = None, across: bool = False, picked: EdgePick | None = None) -> Pairs:
        """The sample pairs, sorted by (distance, i, j). `split`, `across`: as for `chunks` (only the pairs
        across splits, or only those within one, are made). `where(i, j)`: a boolean mask of the pairs to
        keep, applied to those made. `limit`: at most that many, the closest (complete=False when cut).
        `picked`: as for `chunks`, made with the same split, across and limit (no `where`)."""
        return take(self.chunks(split=split, across=across, limit=limit if where is None else None, picked=picked), limit, where)

    def groups(self) -> np.ndarray:
        """A group id per sample: samples joined by a chain of pairs share one (connected components);
        ids are 0, 1, ... in the order of each group's first sample."""
        return group_ids(self.label[self.inverse])


def find_matches(hashes, max_distance: int, search: str = "auto",
                 folds: Callable[[Matches], Sequence[Callable[..., None]]] | None = None) -> Matches:
    """Every pair of samples whose hashes are within `max_distance` bits (0 <= D <= 32).

    Args:
        hashes: one per sample (integers, uint64).
        max_distance: the most bits two hashes of a pair differ by.
        search: "auto" (the cost model picks), "index" (multi-index hashing always) or "brute" (all
            against all).
        folds: given the matches before the search (their distinct hashes, inverse and counts; nothing
            the search finds), the folds to feed with each chunk of edges as the search finds them: what
            they make costs no pass of its own (report.audit makes every figure so).

    Returns:
        The matches. Memory is O(N) plus at most MAX_EDGES edges, whatever the hashes (Matches.edges).
    """
    h = as_hashes(hashes)
    if isinstance(max_distance, bool) or not isinstance(max_distance, (int, np.integer)) or not 0 <= max_distance <= MAX_DISTANCE:
        raise ValueError(f"max_distance must be an integer from 0 to {MAX_DISTANCE}, got {max_distance!r}")
    if search not in SEARCHES:
        raise ValueError(f"unknown search {search!r}; choose one of {list(SEARCHES)}")
    D = int(max_distance)
    uniq, inverse, counts = np.unique(h, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1).astype(np.int64)
    counts = counts.astype(np.int64)
    members = np.argsort(inverse, kind="stable")
    starts = np.zeros(len(uniq) + 1, np.int64)
    np.cumsum(counts, out=starts[1:])
    before = Matches(D, uniq, inverse, counts, 0, 0, np.arange(len(uniq), dtype=np.int64), 0, search, None, members, starts)
    extra = list(folds(before)) if folds is not None else []
    checked = [0]
    comp = Components(len(uniq))
    held: list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None = []
    n_edges = near = 0
    for u, v, d in _batched(_search(uniq, D, search, checked)):  # folded as they come: nothing O(edges) kept
        for f in extra:
            f(u, v, d)
        comp.add(u, v)
        n_edges += len(u)
        near += int((counts[u] * counts[v]).sum())
        if held is not None and n_edges <= MAX_EDGES:
            held.append((u, v, d))
        else:
            held = None
    kept = None
    if held is not None:
        e = np.zeros(0, np.int64)
        u, v, d = (np.concatenate(z) for z in zip(*held)) if held else (e, e.copy(), e.copy())
        o = np.lexsort((v, u))
        kept = (u[o], v[o], d[o])
    return replace(before, edge_count=n_edges, near_total=near, label=comp.label, candidates=checked[0], _held=kept)


def near_pairs(hashes, max_distance: int, limit: int | None = None) -> Pairs:
    """Every pair (i < j) of samples within `max_distance`, sorted by (distance, i, j)."""
    return find_matches(hashes, max_distance).pairs(limit)


def cross_pairs(queries, references, max_distance: int, limit: int | None = None) -> Pairs:
    """Every (query i, reference j) within `max_distance` (i indexes `queries`, j `references`)."""
    q, r = as_hashes(queries, "queries"), as_hashes(references, "references")
    nq = len(q)
    side = (np.arange(nq + len(r)) >= nq).astype(np.int64)  # 0: a query, 1: a reference; i < j puts the query first
    p = find_matches(np.concatenate([q, r]), max_distance).pairs(limit, split=side, across=True)
    return Pairs(p.i, p.j - nq, p.distance, p.complete)


def brute_force_pairs(hashes, max_distance: int, rows: int = 256) -> Pairs:
    """The reference: every pair compared (in bands of `rows`), sorted by (distance, i, j). O(N^2)."""
    h = as_hashes(hashes)
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
def _search(h: np.ndarray, D: int, search: str, checked: list[int] | None = None
            ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Pairs (u < v) of distinct sorted hashes within D and their distances, in chunks of at most CHUNK,
    each pair once; `checked[0]` grows by the candidates checked. The same input gives the same chunks."""
    blocks = _choose(h, D, search)
    if blocks == []:
        return
    if blocks is None:
        yield from _brute(h, D, checked)
        return
    for k, bl in enumerate(blocks):
        if bl.radius < 0:
            continue
        earlier = [b for b in blocks[:k] if b.radius >= 0]
        for x, y in _block_candidates(h, bl):
            if checked is not None:
                checked[0] += len(x)
            x, y = np.minimum(x, y), np.maximum(x, y)
            xor = h[x] ^ h[y]
            dist = np.bitwise_count(xor)
            keep = dist <= D
            for b in earlier:  # found there already
                keep &= np.bitwise_count(xor & b.mask) > b.radius
            if keep.any():
                yield x[keep].astype(np.int64), y[keep].astype(np.int64), dist[keep].astype(np.int64)


SAMPLE = 256  # hashes whose candidates are counted to check the plan (_choose)


def _choose(h: np.ndarray, D: int, search: str) -> list[Block] | None:
    """`plan`'s blocks for the distinct sorted hashes `h`, or None (all against all). With search="auto"
    the plan's candidates are also counted on a sample of the hashes: the plan assumes random hashes, and
    hashes that agree on most bits (frames of one video, a few bits apart) put most of them in one bucket
    of every block, so each pair is a candidate of several blocks; where the count says the blocks cost
    more than twice comparing all against all, all against all it is."""
    n = len(h)
    blocks = plan(n, D, search)
    if search != "auto" or not blocks:
        return blocks
    pick = np.unique((np.arange(min(n, SAMPLE), dtype=np.int64) * n) // min(n, SAMPLE))
    found = 0
    for bl in blocks:
        if bl.radius < 0:
            continue
        keys = np.sort(bl.keys(h))
        flips = np.array([sum(1 << q for q in c) for r in range(bl.radius + 1) for c in combinations(range(bl.bits), r)], np.int64)
        target = (bl.keys(h[pick])[:, None] ^ flips[None, :]).ravel()
        found += int((np.searchsorted(keys, target, "right") - np.searchsorted(keys, target, "left")).sum()) - len(pick)
    candidates = found / len(pick) * n / 2  # each pair is found from both of its ends
    probes = sum(bl.probes for bl in blocks if bl.radius >= 0)
    return None if 0.5 * n * probes + 3.0 * candidates > n * n else blocks


def _brute(h: np.ndarray, D: int, checked: list[int] | None = None) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Every pair of distinct hashes compared, in bands of rows that make at most about CHUNK comparisons."""
    n = len(h)
    if checked is not None:
        checked[0] += n * (n - 1) // 2
    rows = max(1, min(256, CHUNK // max(n, 1)))
    for s in range(0, n - 1, rows):
        top = min(n, s + rows)
        dist = np.bitwise_count(h[s:top, None] ^ h[None, s:])  # against the hashes from s on: j > i below
        ii, jj = np.nonzero(dist <= D)
        up = jj > ii
        ii, jj = ii[up], jj[up]
        if len(ii):
            yield ii + s, jj + s, dist[ii, jj].astype(np.int64)


def _batched(chunks: Iterable[tuple[np.ndarray, ...]], size: int | None = None) -> Iterator[tuple[np.ndarray, ...]]:
    """The chunks cut and joined into chunks of `size` [FOLD] (the last may be smaller), in order: what
    folds them does work per chunk, the search makes many small ones, and all against all large ones."""
    size = FOLD if size is None else size
    buf: list[tuple[np.ndarray, ...]] = []
    n = 0
    for c in chunks:
        while len(c[0]):
            take = min(size - n, len(c[0]))
            buf.append(tuple(x[:take] for x in c))
            c = tuple(x[take:] for x in c)
            n += take
            if n == size:
                yield tuple(np.concatenate(z) for z in zip(*buf)) if len(buf) > 1 else buf[0]
                buf, n = [], 0
    if buf:
        yield tuple(np.concatenate(z) for z in zip(*buf)) if len(buf) > 1 else buf[0]


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


