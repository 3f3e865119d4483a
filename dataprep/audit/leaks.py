"""Twins across splits and the drop rule: takes the audited Samples and their Matches (with flips, those of
hashes and flipped hashes, and the mirror pairs by class), gives per sample the splits other than its own
that hold a near twin (`twin_splits`), a split's leak mask (`leak_mask`), and per split the indices a
--drop-duplicates build leaves out (`drop_indices`), exact from the matches, never from listed pairs.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .folds import Components, feed
from .index import Matches
from .mirrors import MirrorClasses, _mirror_classes
from .pairing import _parts
from .samples import Samples

TRAIN = "train"
SPLIT_TABLE = 1 << 23  # entries (8 bytes each) of SplitJoin's table of parts by split and distinct hash, at most


# Everything below that is made from the edges between distinct hashes is a fold: an object fed the edges
# a chunk at a time (folds.feed), so that audit feeds them all in one pass, and edges that are not held
# (index.MAX_EDGES) cost one search again, not one for each figure.
class SplitBits:
    """A fold over a Matches' edges: per distinct hash, the splits with a sample there (`bits`, from the
    samples `at` it), OR-ed with those of every distinct hash within the distance (`near`)."""

    def __init__(self, m: Matches, at: np.ndarray, own: np.ndarray):
        self.bits = np.zeros(len(m.counts), np.uint64)
        np.bitwise_or.at(self.bits, at, own)
        self.near = self.bits.copy()

    def add(self, u: np.ndarray, v: np.ndarray, d: np.ndarray) -> None:
        np.bitwise_or.at(self.near, u, self.bits[v])
        np.bitwise_or.at(self.near, v, self.bits[u])


def twin_folds(samples: Samples, m: Matches, flips: Matches | None = None) -> tuple[SplitBits, SplitBits | None]:
    """The folds `twin_splits` needs fed: the first with `m.edges()`, the second with `flips.edges()`."""
    n = len(samples)
    own = np.uint64(1) << samples.split.astype(np.uint64)
    # a mirror twin of x: a sample y whose flipped hash (flips' [n, 2n)) is near x's hash
    return SplitBits(m, m.inverse, own), (None if flips is None else SplitBits(flips, flips.inverse[n:], own))


def twin_splits(samples: Samples, m: Matches, flips: Matches | None = None,
                folded: tuple[SplitBits, SplitBits | None] | None = None) -> np.ndarray:
    """Per sample: a bit per split other than its own that holds a sample within the distance of it (with
    `flips`, the matches of hashes [0, n) and flipped hashes [n, 2n): a mirror twin counts too).
    `folded`: `twin_folds(samples, m, flips)` fed already; else the edges are passed over here."""
    n = len(samples)
    if folded is None:
        folded = twin_folds(samples, m, flips)
        feed(m.edges(), folded[0].add)
        if flips is not None and folded[1] is not None:
            feed(flips.edges(), folded[1].add)
    direct, mirror = folded
    out = direct.near[m.inverse]
    if flips is not None and mirror is not None:
        out |= mirror.near[flips.inverse[:n]]
    return out & ~(np.uint64(1) << samples.split.astype(np.uint64))


def leak_mask(samples: Samples, m: Matches, split: str, against: Sequence[str] | None = None,
              flips: Matches | None = None) -> np.ndarray:
    """For the samples of `split` (in their order): whether each has a near twin in another split
    (`against`: only those splits). What `exclude="leaks"` serves without."""
    if split not in samples.splits:
        raise ValueError(f"no split {split!r}; the audit holds {list(samples.splits)}")
    k = samples.splits.index(split)
    others = [s for s in samples.splits if s != split] if against is None else list(against)
    want = np.uint64(sum(1 << samples.splits.index(s) for s in others if s in samples.splits and s != split))
    t = twin_splits(samples, m, flips)
    return (t[samples.split == k] & want) != 0


class SplitJoin:
    """A fold: the samples of each split joined by chains of pairs inside that split (the drop rule's
    groups), made over the parts (a distinct hash's samples in one split, which are joined already) and
    the edges between them, never over the pairs: k equal hashes cost O(k), not k(k-1)/2. `add` takes
    the edges of the samples' Matches, `add_mirror` those of `mc` (MirrorClasses.edges)."""

    def __init__(self, samples: Samples, m: Matches, mc: MirrorClasses | None = None):
        members, _, counts, value, code = _parts(m.inverse, samples.split)
        self.part = np.empty(len(samples), np.int64)
        self.part[members] = np.repeat(np.arange(len(counts)), counts)
        self.S = S = len(samples.splits)
        self.key = value * S + code  # the parts' keys, sorted
        self.table = None  # [split, distinct hash]: its part there (-1: none), where small enough to hold
        if len(m.counts) * S <= SPLIT_TABLE:
            self.table = np.full((S, len(m.counts)), -1, np.int64)
            self.table[code, value] = np.arange(len(counts))
        self.comp = Components(len(counts))
        self.mc = mc

    def add(self, u: np.ndarray, v: np.ndarray, d: np.ndarray) -> None:
        key = self.key
        for k in range(self.S):  # the near distinct hashes that both have samples in split k
            if self.table is not None:
                ia, ib = self.table[k, u], self.table[k, v]
                ok = (ia >= 0) & (ib >= 0)
            else:
                a_, b_ = u * self.S + k, v * self.S + k
                ia, ib = np.searchsorted(key, a_), np.searchsorted(key, b_)
                ia, ib = np.minimum(ia, len(key) - 1), np.minimum(ib, len(key) - 1)
                ok = (key[ia] == a_) & (key[ib] == b_)
            self.comp.add(ia[ok], ib[ok])

    def add_mirror(self, lo: np.ndarray, hi: np.ndarray, d: np.ndarray, direct: np.ndarray) -> None:
        mc = self.mc
        assert mc is not None
        same = mc.split[lo] == mc.split[hi]  # mirror twins within one split
        self.comp.add(self.part[mc.first[lo[same]]], self.part[mc.first[hi[same]]])

    def later_copies(self) -> np.ndarray:
        """Per sample: whether a lower sample of its split is joined to it (the smallest of each stays)."""
        n = len(self.part)
        label = self.comp.label[self.part]
        lowest = np.full(len(self.comp.label), n, np.int64)
        np.minimum.at(lowest, label, np.arange(n, dtype=np.int64))
        return lowest[label] != np.arange(n)


def drop_indices(samples: Samples, m: Matches, flips: Matches | None = None, mirrors: MirrorClasses | None = None,
                 twins: np.ndarray | None = None, joined: SplitJoin | None = None) -> dict[str, np.ndarray]:
    """Per split, the indices a --drop-duplicates build leaves out. The rule: splits are ranked train
    first, then in their order; a sample with a near twin in a split ranked before its own is dropped (a
    val or test sample with a twin in train leaves val or test; train keeps it); within a split, of each
    group of samples joined by chains of pairs inside that split, the first (lowest index) is kept and the
    rest are dropped. A dropped sample is thus within the distance of a kept one, or linked to one by a
    chain of such near copies. `mirrors`: `flips`' mirror pairs by class, when made already; `twins`:
    `twin_splits(samples, m, flips)`, and `joined`: a SplitJoin fed with the edges, when made already.
    Memory: O(samples) and a chunk of edges (SplitJoin), whatever the pairs."""
    order = sorted(range(len(samples.splits)), key=lambda k: (samples.splits[k] != TRAIN, k))
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    t = twin_splits(samples, m, flips) if twins is None else twins
    earlier_bits = np.zeros(len(samples.splits), np.uint64)
    for k in range(len(samples.splits)):
        earlier_bits[k] = np.uint64(sum(1 << j for j in range(len(samples.splits)) if rank[j] < rank[k]))
    leak = (t & earlier_bits[samples.split]) != 0
    if joined is None:
        mc = None if flips is None else mirrors if mirrors is not None else _mirror_classes(samples, flips, m.max_distance)
        joined = SplitJoin(samples, m, mc)
        feed(m.edges(), joined.add)
        if mc is not None:
            feed(mc.edges(), joined.add_mirror)
    dup = joined.later_copies()
    out = {}
    for k, name in enumerate(samples.splits):
        sel = samples.split == k
        out[name] = samples.index[sel & (leak | dup)]
    return out
