"""Folds over a search's output: takes chunks of sample pairs (i, j, distance) or of edges between distinct
hashes (u, v, d) as the search in index.py makes them, gives what they fold into in bounded memory: pairs
listed closest first and cut at a limit (`take`), connected components (`Components`, `group_ids`), and
the edges a listing needs (`EdgePick`). None of them depends on how the chunks are cut.
"""
from __future__ import annotations

from typing import Callable, Iterable, NamedTuple

import numpy as np


class Pairs(NamedTuple):
    """Listed pairs of samples: i < j, their distance; `complete` is False when a limit cut the list."""

    i: np.ndarray
    j: np.ndarray
    distance: np.ndarray
    complete: bool


def take(chunks: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]], limit: int | None = None,
         where: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None) -> Pairs:
    """Pairs (i, j, distance) from `chunks` (each of one distance or of rising distances, the chunks in
    rising order), sorted by (distance, i, j): at most `limit`, the closest of the chunk that passes it
    (complete=False when cut); `where(i, j)`: a mask of the pairs to keep."""
    parts, n, complete = [], 0, True
    for i, j, d in chunks:
        if where is not None:
            keep = np.asarray(where(i, j), bool)
            i, j, d = i[keep], j[keep], d[keep]
        if limit is not None and n + len(i) > limit:
            # the chunk is of one distance or rising distances: keep its closest, then stop
            o = _closest(i, j, d, limit - n)
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


def _closest(i: np.ndarray, j: np.ndarray, d: np.ndarray, k: int) -> np.ndarray:
    """The positions of the first k pairs by (d, i, j), in that order (pairs distinct)."""
    if k <= 0:
        return np.zeros(0, np.int64)
    bits = max(1, int(max(int(i.max(initial=0)), int(j.max(initial=0)))).bit_length())
    if k >= len(i) or 6 + 2 * bits > 64:
        return np.lexsort((j, i, d))[:k]
    key = (d.astype(np.uint64) << np.uint64(2 * bits)) | (i.astype(np.uint64) << np.uint64(bits)) | j.astype(np.uint64)
    o = np.argpartition(key, k - 1)[:k]  # a chunk of a million pairs cut to a few: no full sort
    return o[np.argsort(key[o])]


def group_ids(label: np.ndarray) -> np.ndarray:
    """Labels (any integers, one per sample) as ids 0, 1, ... in the order of each label's first sample."""
    _, first, compact = np.unique(label, return_index=True, return_inverse=True)
    rank = np.empty(len(first), np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    return rank[compact.reshape(-1)]


class Components:
    """Connected components grown a chunk of edges at a time, in memory O(nodes): `label[x]` is the
    smallest node joined to x by the edges added so far (what `_components` gives for all of them at once)."""

    def __init__(self, n: int, label: np.ndarray | None = None):
        self.label = np.arange(n, dtype=np.int64) if label is None else np.array(label, np.int64)

    def add(self, u: np.ndarray, v: np.ndarray) -> None:
        """Join the ends of each edge (u[k], v[k])."""
        a, b = self.label[u], self.label[v]
        apart = a != b
        if not apart.any():
            return
        a, b = a[apart], b[apart]
        roots, local = np.unique(np.concatenate([a, b]), return_inverse=True)
        joined = roots[_components(len(roots), local[:len(a)], local[len(a):])]  # roots sorted: the smallest stays
        remap = np.arange(len(self.label), dtype=np.int64)
        remap[roots] = joined
        self.label = remap[self.label]


class EdgePick:
    """The edges a listing needs, picked as they come (a fold over Matches.edges: `add` each chunk, then
    `result`): those `asked(u, v)` marks (all when None), and of them the first `keep` by (d, u, v) (all
    when None). Memory: about 2 * keep + a chunk of edges, 8 bytes each, whatever the edges given."""

    def __init__(self, nodes: int, keep: int | None = None, asked: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None):
        self.keep, self.asked = keep, asked
        self.bits = max(1, int(nodes - 1).bit_length())
        self.packed = 6 + 2 * self.bits <= 64  # (d, u, v) in one uint64: d <= 32 takes 6 bits
        self.parts: list[tuple[np.ndarray, ...]] = []
        self.size = 0
        self.top: np.uint64 | None = None  # past a cut: the last key kept; a larger one never gets in

    def add(self, u: np.ndarray, v: np.ndarray, d: np.ndarray) -> None:
        key = None
        if self.packed:
            key = (d.astype(np.uint64) << np.uint64(2 * self.bits)) | (u.astype(np.uint64) << np.uint64(self.bits)) | v.astype(np.uint64)
            if self.top is not None:  # past a cut, most edges are dropped here, before `asked` looks at them
                sel = key <= self.top
                u, v, key = u[sel], v[sel], key[sel]
        if self.asked is not None:
            sel = self.asked(u, v)
            if key is None:
                u, v, d = u[sel], v[sel], d[sel]
            else:
                key = key[sel]
        part: tuple[np.ndarray, ...] = (u, v, d) if key is None else (key,)
        self.parts.append(part)
        self.size += len(part[0])
        if self.keep is not None and self.size > 2 * self.keep:
            self.parts = [self._first(ordered=False)]
            self.size = len(self.parts[0][0])

    def _first(self, ordered: bool = True) -> tuple[np.ndarray, ...]:
        """The parts joined and cut to the first `keep`, sorted when `ordered`."""
        z = [np.concatenate(x) for x in zip(*self.parts)] if self.parts else [np.zeros(0, np.uint64)] * (1 if self.packed else 3)
        if not self.packed:
            return _first_edges(z[0], z[1], z[2], self.keep)
        key = z[0]
        if self.keep is not None and len(key) > self.keep:
            key = np.partition(key, self.keep - 1)[: self.keep] if self.keep else key[:0]
            self.top = key.max(initial=np.uint64(0))
        return (np.sort(key) if ordered else key,)

    def result(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The edges picked, sorted by (d, u, v)."""
        z = self._first()
        if not self.packed:
            return z[0], z[1], z[2]
        key, mask = z[0], np.uint64((1 << self.bits) - 1)
        return ((key >> np.uint64(self.bits)) & mask).astype(np.int64), (key & mask).astype(np.int64), \
            (key >> np.uint64(2 * self.bits)).astype(np.int64)


def feed(chunks: Iterable[tuple[np.ndarray, ...]], *folds: Callable[..., None]) -> None:
    """One pass over `chunks` (Matches.edges, MirrorClasses.edges), each chunk given to every fold in turn."""
    for c in chunks:
        for f in folds:
            f(*c)


def _first_edges(u: np.ndarray, v: np.ndarray, d: np.ndarray, keep: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The edges sorted by (d, u, v), the first `keep` of them (all when None)."""
    o = np.lexsort((v, u, d))
    if keep is not None:
        o = o[:keep]
    return u[o], v[o], d[o]


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
