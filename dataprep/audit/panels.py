"""Which pairs the contact sheet and the text report show: takes the audit's matches, each sample's twin
splits and group, and the listed pairs; gives at most `panels` pairs, in the order they are shown.

The budget is spent in two steps. First one pair per leaking sample (a sample of another split with a
twin in the reference split, train): its closest twin there, found from the matches themselves, so every
leak has its panel whatever the listing's cap and however many pairs one group holds. Then the listed
pairs left (further leak pairs, pairs within a split, mirror pairs) in turns: each group (a cluster of
near copies) gives one pair a turn, in the listing's order (across splits first, closest first). So 80
copies of one photo take one panel a turn instead of the sheet. Leaking samples take turns by group too,
which matters only when they are more than the budget.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from ..errors import UsageError
from .index import Matches

if TYPE_CHECKING:
    from .report import MirrorClasses

PANELS = 100  # panels of the sheet and lines of the text report, by default
MAX_PANELS = 1000  # a sheet of 1000 panels is 1,384 x 64,000 px (265 MB while drawn)
NONE = np.iinfo(np.int64).max


class Twins(NamedTuple):
    """Each leaking sample `x` with its closest twin `y` in the reference split, their distance `d`, and
    `flip`: whether they are twins through a mirror only."""

    x: np.ndarray
    y: np.ndarray
    d: np.ndarray
    flip: np.ndarray


@dataclass(frozen=True)
class Shown:
    """The pairs shown, in order (i < j, distance, flip), and how many of them are the leaking samples'
    (the first `leaking` pairs)."""

    i: np.ndarray
    j: np.ndarray
    d: np.ndarray
    flip: np.ndarray
    leaking: int


def check_panels(panels) -> int:
    """`panels` as an int from 1 to MAX_PANELS; a UsageError naming it otherwise."""
    if isinstance(panels, bool) or not isinstance(panels, (int, np.integer)) or not 1 <= panels <= MAX_PANELS:
        raise UsageError(f"panels must be an integer from 1 to {MAX_PANELS}, got {panels!r}")
    return int(panels)


def closest_twins(split: np.ndarray, twins: np.ndarray, ref: int, m: Matches, mc: MirrorClasses | None = None) -> Twins:
    """The leaking samples: those outside split `ref` whose bits in `twins` (report.twin_splits) hold
    `ref`, each with its closest twin in `ref` (the lowest sample at the smallest distance; a direct twin
    before a mirror one at equal distance). Made over the distinct hashes (and mirror classes) and the
    edges between them: k equal hashes cost O(k)."""
    n = len(split)
    is_ref = split == ref
    lowest = np.full(len(m.counts), n, np.int64)  # per distinct hash: its lowest sample in ref (n: none)
    np.minimum.at(lowest, m.inverse[is_ref], np.flatnonzero(is_ref))
    best_d = np.where(lowest < n, 0, NONE)
    best_y = lowest.copy()
    _closer(best_d, best_y, np.concatenate([m.u, m.v]), np.concatenate([m.v, m.u]), np.concatenate([m.d, m.d]), lowest, n)
    d, y = best_d[m.inverse], best_y[m.inverse]
    flip = np.zeros(n, bool)
    if mc is not None:  # twins only through a mirror: pairs of classes, a class's lowest sample standing for it
        k = len(mc.size)
        keep = ~mc.direct
        cd, cy = np.full(k, NONE), np.full(k, n, np.int64)
        ref_first = np.where(mc.split == ref, mc.first, n)
        lo, hi = mc.lo[keep], mc.hi[keep]
        _closer(cd, cy, np.concatenate([lo, hi]), np.concatenate([hi, lo]), np.concatenate([mc.d[keep]] * 2), ref_first, n)
        cls = np.empty(n, np.int64)
        cls[mc.members] = np.repeat(np.arange(k), mc.size)
        better = cd[cls] < d  # strictly: a direct twin wins a tie
        d, y, flip = np.where(better, cd[cls], d), np.where(better, cy[cls], y), better
    x = np.flatnonzero(~is_ref & ((twins >> np.uint64(ref)) & np.uint64(1) != 0) & (y < n))
    return Twins(x, y[x], d[x], flip[x])


def _closer(best_d: np.ndarray, best_y: np.ndarray, x: np.ndarray, y: np.ndarray, d: np.ndarray, lowest: np.ndarray, n: int) -> None:
    """Per node x, through the edges (x, y, d): the closest y holding a reference sample (`lowest[y]` <
    n), the lowest sample at equal distance, where closer than `best_d[x]` already; in place."""
    ok = lowest[y] < n
    x, d, cand = x[ok], d[ok], lowest[y[ok]]
    o = np.lexsort((cand, d, x))
    x, d, cand = x[o], d[o], cand[o]
    first = np.ones(len(x), bool)
    first[1:] = x[1:] != x[:-1]
    x, d, cand = x[first], d[first], cand[first]
    upd = d < best_d[x]
    best_d[x[upd]] = d[upd]
    best_y[x[upd]] = cand[upd]


def choose(t: Twins, group: np.ndarray, i: np.ndarray, j: np.ndarray, d: np.ndarray, flip: np.ndarray, panels: int) -> Shown:
    """At most `panels` pairs: one per leaking sample of `t` first (closest first, groups in turn), then
    the listed pairs (i, j, d, flip, in the listing's order) not shown yet, one a group in turn."""
    n = len(group)
    a, b = np.minimum(t.x, t.y), np.maximum(t.x, t.y)
    o = _turns(group[a], np.lexsort((a, t.d)))[:panels]
    a, b, td, tf = a[o], b[o], t.d[o], t.flip[o]
    room = panels - len(o)
    rest = np.zeros(0, np.int64)
    if room > 0 and len(i):
        key = i.astype(np.uint64) * np.uint64(n) + j.astype(np.uint64)  # n < 2**32 samples
        taken = a.astype(np.uint64) * np.uint64(n) + b.astype(np.uint64)
        left = np.flatnonzero(~(np.isin(key, taken[~tf]) & ~flip) & ~(np.isin(key, taken[tf]) & flip))
        rest = left[_turns(group[i[left]], np.arange(len(left)))[:room]]
    cat = np.concatenate
    return Shown(cat([a, i[rest]]), cat([b, j[rest]]), cat([td, d[rest]]), cat([tf, flip[rest]]), len(o))


def _turns(group: np.ndarray, order: np.ndarray) -> np.ndarray:
    """`order` (positions, best first) rearranged in turns: each group's best, then each group's second,
    ...; within a turn in the order given."""
    if not len(order):
        return order
    g = group[order]
    by = np.argsort(g, kind="stable")
    gs = g[by]
    start = np.ones(len(gs), bool)
    start[1:] = gs[1:] != gs[:-1]
    begin = np.maximum.accumulate(np.where(start, np.arange(len(gs)), 0))
    turn = np.empty(len(order), np.int64)
    turn[by] = np.arange(len(gs)) - begin
    return order[np.lexsort((np.arange(len(order)), turn))]
