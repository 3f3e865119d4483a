"""Pairs through a mirror: takes the audited Samples and the matches of their hashes and flipped hashes,
gives the pairs near only once one side is mirrored, held by class (`MirrorClasses`: samples sharing a
hash, a flipped hash and a split), their counts, and the pairs of samples they stand for, closest first.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Iterator, Sequence

import numpy as np

from . import index as idx
from .folds import EdgePick, Pairs, feed, take
from .index import CHUNK, Matches
from .pairing import _spans
from .samples import Samples


@dataclass(frozen=True)
class MirrorClasses:
    """The pairs found through a mirror, held by class: a class is the samples that share a hash, a flipped
    hash and a split (so any two of them are a direct pair, at distance 0); `edges()` gives the pairs of
    classes (lo < hi) with one's hash within the distance of the other's flipped hash, `d` the closer of
    the two ways, `direct` whether their unmirrored hashes are near as well. A pair of classes stands for
    size[lo] * size[hi] pairs of samples, so k equal images make one class and no pairs to hold; the pairs
    of classes themselves are held only up to index.MAX_EDGES, and made again from the matches past it."""

    members: np.ndarray  # samples ordered by class
    start: np.ndarray  # each class's first position in members
    size: np.ndarray
    split: np.ndarray  # each class's split code
    count: int  # pairs of classes
    total: int  # pairs of samples near only through a mirror
    across: int  # ... of them with their ends in different splits
    _make: Callable[[], Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]] = field(repr=False)
    _held: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = field(default=None, repr=False)

    @property
    def first(self) -> np.ndarray:
        """Each class's lowest sample."""
        return self.members[self.start]

    def edges(self) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """The pairs of classes as (lo, hi, d, direct) chunks: the held ones by (lo, hi), or made again."""
        if self._held is None:
            yield from self._make()
            return
        lo, hi, d, direct = self._held
        for s in range(0, len(lo), idx.FOLD):
            yield lo[s:s + idx.FOLD], hi[s:s + idx.FOLD], d[s:s + idx.FOLD], direct[s:s + idx.FOLD]

    def pick(self, limit: int | None = None) -> EdgePick:
        """A fold picking what `pairs(limit)` needs from the pairs of classes near only through a mirror
        (feed it `edges()` through _unless_direct): the first `limit + CHUNK` by (d, lo, hi)."""
        return EdgePick(len(self.size), None if limit is None else limit + CHUNK)

    def pairs(self, limit: int | None = None, picked: EdgePick | None = None) -> Pairs:
        """The pairs of samples near only through a mirror, sorted by (distance, i, j), the closest
        `limit` of them (complete=False when cut), cut as Matches.pairs cuts. `picked`: `pick(limit)`
        fed already."""
        if picked is None:
            picked = self.pick(limit)
            feed(self.edges(), _unless_direct(picked.add))
        lo, hi, d = picked.result()
        n = self.size[lo] * self.size[hi]

        def chunks():
            for gid, local in _spans(n, CHUNK):
                a, b = np.divmod(local, self.size[hi[gid]])
                x = self.members[self.start[lo[gid]] + a]
                y = self.members[self.start[hi[gid]] + b]
                yield np.minimum(x, y), np.maximum(x, y), d[gid]

        return take(chunks(), limit)


def _mirror_classes(samples: Samples, fm: Matches, D: int,
                    folds: Callable[[MirrorClasses], Sequence[Callable[..., None]]] | None = None) -> MirrorClasses:
    """The mirror pairs of `fm` (the matches of hashes [0, n) and flipped hashes [n, 2n)) by class.
    `folds`: given the classes before their pairs are made, the folds to feed with the pairs as they are
    made (as index.find_matches' folds)."""
    n = len(samples)
    h, f, sp = samples.hashes, samples.flipped, samples.split
    members = np.lexsort((np.arange(n), sp, f, h))
    hs, fs, ss = h[members], f[members], sp[members]
    new = np.ones(n, bool)
    new[1:] = (hs[1:] != hs[:-1]) | (fs[1:] != fs[:-1]) | (ss[1:] != ss[:-1])
    start = np.flatnonzero(new).astype(np.int64)
    size = np.diff(np.append(start, n)).astype(np.int64)
    first = members[start]
    ch, cf = h[first], f[first]  # each class's hash and flipped hash
    V = len(fm.counts)
    xh, xf = fm.inverse[:n][first], fm.inverse[n:][first]  # ... as fm's distinct ones
    by_h, by_f = np.argsort(xh, kind="stable"), np.argsort(xf, kind="stable")
    nh, nf = np.bincount(xh, minlength=V), np.bincount(xf, minlength=V)
    sh, sf = np.concatenate([[0], np.cumsum(nh)]), np.concatenate([[0], np.cumsum(nf)])

    def ways() -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """(hash side, flipped side) pairs of distinct values: equal, or near either way, a chunk at a time."""
        ident = np.arange(V, dtype=np.int64)
        yield ident, ident, np.zeros(V, np.int64)
        for u, v, d in fm.edges():
            yield u, v, d
            yield v, u, d

    def make() -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        for vx, vy, vd in ways():
            cnt = nh[vx] * nf[vy]
            ok = np.flatnonzero(cnt)
            vx, vy, vd, cnt = vx[ok], vy[ok], vd[ok], cnt[ok]
            for gid, local in _spans(cnt, idx.FOLD):
                a, b = np.divmod(local, nf[vy[gid]])
                c1, c2, d = by_h[sh[vx[gid]] + a], by_f[sf[vy[gid]] + b], vd[gid]
                # a pair of classes is found from each way within the distance: kept from the closer (c1 < c2 on a tie)
                d2 = np.bitwise_count(ch[c2] ^ cf[c1])
                keep = (c1 != c2) & ((d2 > D) | (d < d2) | ((d == d2) & (c1 < c2)))  # c1 == c2: direct pairs
                c1, c2, d = c1[keep], c2[keep], d[keep]
                lo, hi = np.minimum(c1, c2), np.maximum(c1, c2)
                yield lo, hi, d.astype(np.int64), np.bitwise_count(ch[lo] ^ ch[hi]) <= D

    split = ss[start]
    before = MirrorClasses(members, start, size, split, 0, 0, 0, make, None)
    extra = list(folds(before)) if folds is not None else []
    held: list[tuple[np.ndarray, ...]] | None = []
    count = total = across = 0
    for lo, hi, d, direct in make():
        for fold in extra:
            fold(lo, hi, d, direct)
        count += len(lo)
        lo_, hi_ = lo[~direct], hi[~direct]
        pairs = size[lo_] * size[hi_]
        total += int(pairs.sum())
        across += int(pairs[split[lo_] != split[hi_]].sum())
        if held is not None and count <= idx.MAX_EDGES:
            held.append((lo, hi, d, direct))
        else:
            held = None
    kept = None
    if held is not None:
        e = np.zeros(0, np.int64)
        lo, hi, d, direct = (np.concatenate(z) for z in zip(*held)) if held else (e, e, e, np.zeros(0, bool))
        o = np.lexsort((hi, lo))
        kept = (lo[o], hi[o], d[o], direct[o])
    return replace(before, count=count, total=total, across=across, _held=kept)


def _unless_direct(fold: Callable[[np.ndarray, np.ndarray, np.ndarray], None]) -> Callable[..., None]:
    """A fold of edges (u, v, d) fed with the pairs of mirror classes (lo, hi, d, direct) near only through a mirror."""
    return lambda lo, hi, d, direct: fold(lo[~direct], hi[~direct], d[~direct])
