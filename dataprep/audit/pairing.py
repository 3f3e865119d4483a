"""Pair arithmetic: takes group sizes, or each sample's distinct hash and split code, gives the index
arithmetic that lists pairs in bounded chunks with no loop per pair: (group, local index) spans of a
chunk's size (`_spans`), the t-th pair of a triangle (`_triangle`), a distinct hash's samples cut by split
(`_parts`) and the pairs of parts an edge between two distinct hashes makes (`_part_pairs`).
"""
from __future__ import annotations

from typing import Iterator

import numpy as np


def _part_pairs(u: np.ndarray, v: np.ndarray, first: np.ndarray, many: np.ndarray, code: np.ndarray,
                across: bool, ordered: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For edges (u, v) between distinct hashes: the pairs of parts (p, q: a part of u, a part of v) whose
    splits differ (`across`) or agree (not `across`), and the edge each comes from (r); `ordered`: by
    edge, then part of u, then part of v. Parts as _parts gives them: a distinct hash's are first .. first
    + many - 1."""
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
    if not ordered:
        return e1, e2, r
    o = np.argsort(r, kind="stable")
    return e1[o], e2[o], r[o]


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
