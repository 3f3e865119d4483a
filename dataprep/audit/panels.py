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
from .folds import feed
from .index import Matches

if TYPE_CHECKING:
    from .mirrors import MirrorClasses

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


class Closest:
    """A fold over edges between nodes (distinct hashes, or mirror classes): per node, its closest reference
    sample through one edge (`lowest[y]`: node y's lowest sample in the reference split, n for none), the
    lowest at equal distance; with `own`, a node holding a reference sample is at distance 0 from it.
    Each node keeps (distance, sample) as one integer, distance * (n + 1) + sample, and the smallest wins."""

    def __init__(self, lowest: np.ndarray, n: int, own: bool):
        self.lowest, self.n = lowest, n
        self.best = np.where(lowest < n, lowest, NONE) if own else np.full(len(lowest), NONE)

    def add(self, u: np.ndarray, v: np.ndarray, d: np.ndarray) -> None:
        for x, y in ((u, v), (v, u)):
            ok = self.lowest[y] < self.n
            np.minimum.at(self.best, x[ok], d[ok] * (self.n + 1) + self.lowest[y[ok]])

    def add_mirror(self, lo: np.ndarray, hi: np.ndarray, d: np.ndarray, direct: np.ndarray) -> None:
        """Pairs of mirror classes (MirrorClasses.edges): those near only through a mirror."""
        self.add(lo[~direct], hi[~direct], d[~direct])

    @property
    def d(self) -> np.ndarray:
        """Per node: the distance to its closest reference sample (NONE: none)."""
        return np.where(self.best < NONE, self.best // (self.n + 1), NONE)

    @property
    def y(self) -> np.ndarray:
        """Per node: that sample (n: none)."""
        return np.where(self.best < NONE, self.best % (self.n + 1), self.n)


def closest_folds(split: np.ndarray, ref: int, m: Matches, mc: MirrorClasses | None = None) -> tuple[Closest, Closest | None]:
    """The folds `closest_twins` needs fed: the first with `m.edges()` (`add`), the second with
    `mc.edges()` (`add_mirror`; None without mirror classes)."""
    n = len(split)
    is_ref = split == ref
    lowest = np.full(len(m.counts), n, np.int64)  # per distinct hash: its lowest sample in ref (n: none)
    np.minimum.at(lowest, m.inverse[is_ref], np.flatnonzero(is_ref))
    return Closest(lowest, n, own=True), None if mc is None else mirror_closest(split, ref, mc)


def mirror_closest(split: np.ndarray, ref: int, mc: MirrorClasses) -> Closest:
    """closest_folds' second: over pairs of mirror classes, a class's lowest sample standing for it."""
    n = len(split)
    return Closest(np.where(mc.split == ref, mc.first, n), n, own=False)


def closest_twins(split: np.ndarray, twins: np.ndarray, ref: int, m: Matches, mc: MirrorClasses | None = None,
                  folded: tuple[Closest, Closest | None] | None = None) -> Twins:
    """The leaking samples: those outside split `ref` whose bits in `twins` (report.twin_splits) hold
    `ref`, each with its closest twin in `ref` (the lowest sample at the smallest distance; a direct twin
    before a mirror one at equal distance). Made over the distinct hashes (and mirror classes) and the
    edges between them: k equal hashes cost O(k). `folded`: `closest_folds(split, ref, m, mc)` fed with
    the edges already (by a pass that feeds others too); else a pass over them is made here."""
    n = len(split)
    if folded is None:
        folded = closest_folds(split, ref, m, mc)
        feed(m.edges(), folded[0].add)
        if mc is not None and folded[1] is not None:
            feed(mc.edges(), folded[1].add_mirror)
    near, mirror = folded
    d, y = near.d[m.inverse], near.y[m.inverse]
    flip = np.zeros(n, bool)
    if mc is not None and mirror is not None:
        k = len(mc.size)
        cls = np.empty(n, np.int64)
        cls[mc.members] = np.repeat(np.arange(k), mc.size)
        better = mirror.d[cls] < d  # strictly: a direct twin wins a tie
        d, y, flip = np.where(better, mirror.d[cls], d), np.where(better, mirror.y[cls], y), better
    is_ref = split == ref
    x = np.flatnonzero(~is_ref & ((twins >> np.uint64(ref)) & np.uint64(1) != 0) & (y < n))
    return Twins(x, y[x], d[x], flip[x])


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
