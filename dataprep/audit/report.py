"""The audit's findings: takes per-sample hashes (and pixel digests) with each sample's split, index and
source, gives the pairs within the distance, their groups, the samples of each split that have a near
twin in another split (leaks), what --drop-duplicates would drop, as a JSON-ready dict and as text.

The headline figures (leaks, pair counts by split, groups, drops) are exact whatever the listing's cap:
they come from the matches held by distinct hash (index.Matches), not from the listed pairs. Only the
list of pairs is cut (`max_pairs`, pairs across splits listed first, closest first), and the summary
says so (`complete`). The pairs shown on the contact sheet and in the text are chosen apart (panels.py):
every leaking sample first, then one pair a group in turn, and the summary says what they leave off.
"""
from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from ..errors import UsageError
from . import index as idx
from .folds import Components, EdgePick, Pairs, feed, group_ids, take
from .hashes import DIGEST_BYTES, HASH_NAME, as_hashes
from .index import CHUNK, Matches, find_matches
from .pairing import _parts, _spans
from .panels import PANELS, Closest, Shown, check_panels, choose, closest_folds, closest_twins, mirror_closest

DEFAULT_MAX_DISTANCE = 10  # measured on the shared corpus (docs/audit.md); distances are even, so 10 = 11
MAX_PAIRS = 1_000_000  # pairs listed at most; the counts in the summary stay exact past it
TRAIN = "train"
SPLIT_TABLE = 1 << 23  # entries (8 bytes each) of SplitJoin's table of parts by split and distinct hash, at most


@dataclass(frozen=True)
class Samples:
    """Every sample audited, in one order: its split (a code into `splits`), index in the split, source,
    hash, flipped hash (for flips) and pixel digest ((N, 16) uint8; None when the pack has none)."""

    splits: tuple[str, ...]
    split: np.ndarray
    index: np.ndarray
    source: Sequence[str]
    hashes: np.ndarray
    digests: np.ndarray | None = None
    flipped: np.ndarray | None = None

    @classmethod
    def from_splits(cls, parts: Mapping[str, Mapping[str, Any]]) -> Samples:
        """From {split: {"hashes": ..., "sources": ..., "digests": ..., "flipped": ...}} (digests and flipped
        optional, but given for every split or none); the splits keep the mapping's order. Hashes and
        flipped hashes are one unsigned integer a sample (hashes.as_hashes: floats, negatives, booleans,
        strings and 2-D arrays are refused, not cast), digests 16 bytes a sample, sources one a sample:
        anything else is a UsageError naming the split."""
        names = tuple(parts)
        if len(names) > 63:
            raise UsageError(f"at most 63 splits can be audited together, got {len(names)}")
        hs, sp, ix, src, dg, fl = [], [], [], [], [], []
        for k, name in enumerate(names):
            p = parts[name]
            h = as_hashes(p["hashes"], f"split {name!r}: hashes")
            given = p.get("sources")
            s = list(given) if given is not None and len(given) else [""] * len(h)
            if len(s) != len(h):
                raise UsageError(f"split {name!r}: {len(h)} hashes but {len(s)} sources")
            hs.append(h)
            sp.append(np.full(len(h), k, np.int64))
            ix.append(np.arange(len(h), dtype=np.int64))
            src += s
            dg.append(None if p.get("digests") is None else _digests(p["digests"], len(h), name))
            f = None if p.get("flipped") is None else as_hashes(p["flipped"], f"split {name!r}: flipped hashes")
            if f is not None and len(f) != len(h):
                raise UsageError(f"split {name!r}: {len(h)} hashes but {len(f)} flipped hashes")
            fl.append(f)
        for what, xs in (("digests", dg), ("flipped", fl)):
            if any(x is None for x in xs) and not all(x is None for x in xs):
                raise UsageError(f"{what} are given for some splits and not others")
        cat = (lambda xs, dt, *shape: np.concatenate(xs) if xs else np.zeros((0, *shape), dt))
        return cls(names, cat(sp, np.int64), cat(ix, np.int64), src, cat(hs, np.uint64),
                   None if not dg or dg[0] is None else cat(dg, np.uint8, 16),
                   None if not fl or fl[0] is None else cat(fl, np.uint64))

    def __len__(self) -> int:
        return len(self.hashes)

    def label(self, k: int) -> dict[str, Any]:
        return {"split": self.splits[int(self.split[k])], "index": int(self.index[k]), "source": str(self.source[k])}


def _digests(values, n: int, name: str) -> np.ndarray:
    """A split's pixel digests as (n, 16) uint8, or a UsageError naming the split: bytes (0..255), 16 a sample."""
    a = np.asarray(values)
    if a.dtype == np.bool_ or not np.issubdtype(a.dtype, np.integer) or (a.size and (a.min() < 0 or a.max() > 255)):
        raise UsageError(f"split {name!r}: digests must be bytes (uint8), got {a.dtype}" + (" values past 0..255" if a.dtype.kind in "iu" else ""))
    if a.size != n * DIGEST_BYTES or (a.ndim == 2 and a.shape[1] != DIGEST_BYTES) or a.ndim > 2:
        raise UsageError(f"split {name!r}: digests must be {DIGEST_BYTES} bytes for each of its {n} samples, got shape {a.shape}")
    return a.astype(np.uint8).reshape(n, DIGEST_BYTES)


# -- twins across splits, exact from the matches ------------------------------------------------------
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


# -- the report ---------------------------------------------------------------------------------------
class PairCounts:
    """A fold over the edges: exact sample-pair counts by (split, split) with the first <= the second
    (`result`), from each distinct hash's samples by split."""

    def __init__(self, samples: Samples, m: Matches):
        self.S = S = len(samples.splits)
        self.H = np.zeros((len(m.counts), S), np.int64)
        np.add.at(self.H, (m.inverse, samples.split), 1)
        self.near = np.zeros((S, S), object)  # [a, b]: pairs of a sample in split a at u and one in b at v
        self.step = max(1, CHUNK // max(S, 1))
        # float64 products are exact while a chunk's sums stay below 2**53 (at most N**2 pairs)
        self.F = self.H.astype(np.float64) if len(samples) ** 2 < 2 ** 53 else None

    def add(self, u: np.ndarray, v: np.ndarray, d: np.ndarray) -> None:
        for s in range(0, len(u), self.step):
            a, b = u[s:s + self.step], v[s:s + self.step]
            if self.F is not None:  # a matrix product of floats runs on BLAS
                self.near += np.rint(self.F[a].T @ self.F[b]).astype(np.int64).astype(object)
            else:
                self.near += (self.H[a].T @ self.H[b]).astype(object)

    def result(self) -> dict[tuple[int, int], int]:
        H, near, out = self.H, self.near, {}
        for a in range(self.S):
            for b in range(a, self.S):
                if a == b:
                    c = int((H[:, a] * (H[:, a] - 1) // 2).sum()) + int(near[a, a])
                else:
                    c = int((H[:, a] * H[:, b]).sum()) + int(near[a, b]) + int(near[b, a])
                if c:
                    out[(a, b)] = c
        return out


def audit(samples: Samples, max_distance: int = DEFAULT_MAX_DISTANCE, flips: bool = False, max_pairs: int = MAX_PAIRS,
          search: str = "auto", panels: int = PANELS) -> dict[str, Any]:
    """The audit as JSON-ready data: {"pairs": [{"a": {split, index, source}, "b": ..., "distance": d,
    "exact": bool | None, "group": g[, "flip": true]}, ...], "shown": [...], "summary": {...}}.

    Every pair within the distance is listed in "pairs" (a group of k copies gives all its k(k-1)/2
    pairs) up to `max_pairs`, pairs across splits first, each part closest first; `exact` is whether the
    pixel digests are equal (None without digests). With `flips` (and flipped hashes given), pairs that
    are near only once one side is mirrored are listed too, with "flip": true. "shown" holds the pairs
    the contact sheet and the text report show, at most `panels` (1 to panels.MAX_PANELS): one per
    leaking sample first (its closest twin in train), then one pair a group in turn (panels.py);
    `summary.shown` counts what they show and leave off.

    Args:
        samples: every sample audited.
        max_distance: the most bits two hashes may differ by to be a pair.
        flips: pair images with each other's mirror image too.
        max_pairs: pairs listed at most; the counts stay exact past it.
        search: "auto", "index" or "brute" (index.find_matches).
        panels: pairs shown at most.

    Returns:
        The report, as above.
    """
    if flips and samples.flipped is None:
        raise ValueError("flips asks for the flipped hashes, and none were given")
    if max_pairs < 0:
        raise ValueError(f"max_pairs must be >= 0, got {max_pairs}")
    panels = check_panels(panels)
    ref = _reference(samples)
    fig = _Figures(samples, samples.splits.index(ref) if ref is not None else -1, max_pairs)
    m = find_matches(samples.hashes, max_distance, search, folds=fig.direct)
    fm = find_matches(np.concatenate([samples.hashes, samples.flipped]), max_distance, search, folds=fig.flipped) if flips else None
    comp = fig.comp = Components(len(m.counts), m.label)  # groups: mirror pairs join them too
    mc = _mirror_classes(samples, fm, m.max_distance, folds=lambda pre: fig.mirrors(pre, m)) if fm is not None else None
    joined, picks, mirror_pick = fig.joined, fig.picks, fig.mirror_pick
    group = group_ids(comp.label[m.inverse])
    listed: list[tuple[Pairs, bool]] = []
    room = max_pairs
    for across, pick in zip((True, False), picks):  # only the pairs asked for are made: k equal hashes cost their listed pairs
        p = m.pairs(room, split=samples.split, across=across, picked=pick)
        listed.append((p, False))
        room -= len(p.i)
    flip_total = 0
    if mc is not None:
        flip_total = mc.total
        listed.append((mc.pairs(room, picked=mirror_pick), True))
    i, j, d = (np.concatenate([getattr(p, k) for p, _ in listed]) for k in ("i", "j", "distance"))
    flip = np.concatenate([np.full(len(p.i), f) for p, f in listed])
    pairs, exact_n = _rows(samples, i, j, d, flip, group)
    complete = all(p.complete for p, _ in listed)
    twins = twin_splits(samples, m, fm, folded=(fig.twins, fig.mirror_twins))
    t = closest_twins(samples.split, twins, fig.ref, m, mc, folded=(fig.close, fig.mirror_close)) if fig.close is not None else None
    s = choose(t, group, i, j, d, flip, panels) if t is not None else None
    shown = [] if s is None else _rows(samples, s.i, s.j, s.d, s.flip, group)[0]
    dropped = drop_indices(samples, m, fm, mc, twins=twins, joined=joined)
    summary = _summary(samples, m, group, max_distance, flips, len(pairs), complete, exact_n, flip_total, twins, fig.counts, dropped)
    summary["shown"] = _shown_counts(samples, summary, mc, s, panels, 0 if t is None else len(t.x))
    return {"pairs": pairs, "shown": shown, "summary": summary}


class _Figures:
    """What audit makes from the edges and the mirror pairs, fed to it as they are found (the folds that
    index.find_matches and _mirror_classes are given): one pass of the search for everything."""

    def __init__(self, samples: Samples, ref: int, max_pairs: int):
        self.samples, self.ref, self.max_pairs = samples, ref, max_pairs  # ref: the reference split's code, -1 for none
        self.own = np.uint64(1) << samples.split.astype(np.uint64)
        self.mirror_twins: SplitBits | None = None
        self.mirror_pick: EdgePick | None = None
        self.mirror_close: Closest | None = None
        self.comp: Components | None = None  # set before the mirror pairs: the groups of the direct pairs

    def direct(self, m: Matches) -> list[Callable[..., None]]:
        """The folds of the samples' own matches (twin splits, pair counts, the drop rule's components,
        the closest twins, the pairs to list across and within splits)."""
        s = self.samples
        self.twins, self.counts, self.joined = SplitBits(m, m.inverse, self.own), PairCounts(s, m), SplitJoin(s, m)
        self.close = closest_folds(s.split, self.ref, m)[0] if self.ref >= 0 else None
        self.picks = [m.pick(s.split, across, self.max_pairs) for across in (True, False)]
        return [self.twins.add, self.counts.add, self.joined.add, *(p.add for p in self.picks),
                *([self.close.add] if self.close is not None else [])]

    def flipped(self, fm: Matches) -> list[Callable[..., None]]:
        """The fold of the matches of hashes and flipped hashes: mirror twins' splits."""
        self.mirror_twins = SplitBits(fm, fm.inverse[len(self.samples):], self.own)
        return [self.mirror_twins.add]

    def mirrors(self, mc: MirrorClasses, m: Matches) -> list[Callable[..., None]]:
        """The folds of the pairs of mirror classes: the drop rule's and the groups' components, the
        mirror pairs to list, the closest mirror twins."""
        comp = self.comp
        assert comp is not None
        self.joined.mc = mc
        self.mirror_pick = mc.pick(self.max_pairs)
        folds = [self.joined.add_mirror, _unless_direct(self.mirror_pick.add),
                 lambda lo, hi, *_: comp.add(m.inverse[mc.first[lo]], m.inverse[mc.first[hi]])]
        if self.ref >= 0:
            self.mirror_close = mirror_closest(self.samples.split, self.ref, mc)
            folds.append(self.mirror_close.add_mirror)
        return folds


def _unless_direct(fold: Callable[[np.ndarray, np.ndarray, np.ndarray], None]) -> Callable[..., None]:
    """A fold of edges (u, v, d) fed with the pairs of mirror classes (lo, hi, d, direct) near only through a mirror."""
    return lambda lo, hi, d, direct: fold(lo[~direct], hi[~direct], d[~direct])


def _rows(samples: Samples, i: np.ndarray, j: np.ndarray, d: np.ndarray, flip: np.ndarray,
          group: np.ndarray) -> tuple[list[dict[str, Any]], int]:
    """The pairs (i, j, distance, flip) as the report lists them, and how many are exact copies."""
    ex = _exact(samples, Pairs(i, j, d, True)) & ~flip
    rows = []
    for a, b, dd, e, f in zip(i.tolist(), j.tolist(), d.tolist(), ex.tolist(), flip.tolist()):
        row = {"a": samples.label(a), "b": samples.label(b), "distance": dd,
               "exact": (bool(e) if samples.digests is not None else None), "group": int(group[a])}
        if f:
            row["flip"] = True
        rows.append(row)
    return rows, int(ex.sum())


def _reference(samples: Samples) -> str | None:
    """The split leaks are counted against: train, or the first split."""
    return TRAIN if TRAIN in samples.splits else (samples.splits[0] if samples.splits else None)


def _shown_counts(samples: Samples, summary: Mapping[str, Any], mc: MirrorClasses | None, s: Shown | None, panels: int,
                  leaking: int) -> dict[str, Any]:
    """What the shown pairs show of the leaking samples, the pairs across splits (leak pairs, mirror ones
    too) and those within a split, and what they leave off; exact whatever the listing's cap."""
    across = sum(summary["pairs_across"].values())
    within = sum(summary["pairs_within"].values())
    if mc is not None:
        across += mc.across
        within += mc.total - mc.across
    shown_leaking = 0 if s is None else s.leaking
    shown_across = 0 if s is None else int((samples.split[s.i] != samples.split[s.j]).sum())
    shown_within = 0 if s is None else len(s.i) - shown_across
    return {"panels": panels,
            "leaking_samples": {"shown": shown_leaking, "left_off": leaking - shown_leaking},
            "leak_pairs": {"shown": shown_across, "left_off": across - shown_across},
            "pairs_within": {"shown": shown_within, "left_off": within - shown_within}}


def _exact(samples: Samples, p: Pairs) -> np.ndarray:
    if samples.digests is None:
        return np.zeros(len(p.i), bool)
    return (p.distance == 0) & np.all(samples.digests[p.i] == samples.digests[p.j], axis=1)


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
        (feed it `edges()` through report._unless_direct): the first `limit + CHUNK` by (d, lo, hi)."""
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


def _groups(samples: Samples, m: Matches, mc: MirrorClasses | None) -> np.ndarray:
    """A group id per sample (connected components of the pairs, mirror pairs too with flips), made over
    the distinct hashes and the edges between them."""
    if mc is None:
        return m.groups()
    comp = Components(len(m.counts), m.label)
    feed(mc.edges(), lambda lo, hi, *_: comp.add(m.inverse[mc.first[lo]], m.inverse[mc.first[hi]]))
    return group_ids(comp.label[m.inverse])


def _summary(samples, m, group, D, flips, listed, complete, exact_n, flip_total, t, pair_counts, dropped) -> dict[str, Any]:
    names = samples.splits
    counts = {names[k]: int((samples.split == k).sum()) for k in range(len(names))}
    ref = _reference(samples)
    leaks = {}
    for k, name in enumerate(names):
        if name == ref:
            continue
        sel = samples.split == k
        in_ref = int(((t[sel] >> np.uint64(names.index(ref))) & np.uint64(1)).sum())
        anywhere = int((t[sel] != 0).sum())
        leaks[name] = {"with_twin_in": ref, "samples": in_ref, "of": counts[name],
                       "fraction": round(in_ref / counts[name], 6) if counts[name] else 0.0, "with_twin_in_any_other_split": anywhere}
    pc = pair_counts.result()
    sizes = np.bincount(group) if len(group) else np.zeros(0, np.int64)
    return {
        "hash": HASH_NAME, "max_distance": int(D), "flips": bool(flips), "samples": counts,
        "leaks": leaks,
        "pairs_across": {f"{names[a]}/{names[b]}": c for (a, b), c in pc.items() if a != b},
        "pairs_within": {names[a]: c for (a, b), c in pc.items() if a == b},
        "pairs": int(m.total) + int(flip_total), "mirror_pairs": int(flip_total),
        "pairs_listed": int(listed), "complete": bool(complete),
        "exact_pairs_listed": int(exact_n) if samples.digests is not None else None,
        "groups": int((sizes >= 2).sum()), "largest_group": int(sizes.max()) if len(sizes) else 0,
        "samples_in_groups": int(sizes[sizes >= 2].sum()),
        "drop_duplicates": {k: int(len(v)) for k, v in dropped.items()},
        "candidates_checked": int(m.candidates),
    }


def text_report(report: Mapping[str, Any], show: int | None = None) -> str:
    """The report for people: leaks first, then pair counts, groups, drops, and the pairs shown (the
    report's "shown": every leaking sample's closest twin first, then one pair a group in turn).

    Args:
        report: what `audit` gives.
        show: at most this many of the shown pairs (None: every one).

    Returns:
        The text, lines joined by newlines.
    """
    s = report["summary"]
    out = []
    for name, lk in s["leaks"].items():
        pct = 100.0 * lk["fraction"]
        out.append(f"LEAK: {lk['samples']} of {lk['of']} {printable(name)} samples ({pct:.2f} %) have a near twin in "
                   f"{printable(lk['with_twin_in'])} "
                   f"(distance <= {s['max_distance']}{', mirrors too' if s['flips'] else ''})")
    if not s["leaks"]:
        out.append("one split: no leaks to look for")
    across = ", ".join(f"{printable(k)} {v}" for k, v in s["pairs_across"].items()) or "none"
    within = ", ".join(f"{printable(k)} {v}" for k, v in s["pairs_within"].items()) or "none"
    out.append(f"pairs across splits: {across}")
    out.append(f"pairs within splits: {within}")
    if s["flips"]:
        out.append(f"pairs only as mirror images: {s['mirror_pairs']}")
    if s["exact_pairs_listed"] is not None:
        out.append(f"exact copies (identical pixels) among the listed pairs: {s['exact_pairs_listed']}")
    out.append(f"groups of near copies: {s['groups']} ({s['samples_in_groups']} samples; the largest has {s['largest_group']})")
    drops = ", ".join(f"{printable(k)} {v}" for k, v in s["drop_duplicates"].items()) or "nothing"
    out.append(f"--drop-duplicates would leave out: {drops}")
    if not s["complete"]:
        out.append(f"note: {s['pairs']} pairs, {s['pairs_listed']} listed (the cap); the counts above are exact")
    shown = report["shown"] if show is None else report["shown"][:show]
    if shown:
        out.append("pairs shown (each leaking sample's closest twin first, then one pair a group in turn):")
    for p in shown:
        tag = "exact" if p["exact"] else ("mirror" if p.get("flip") else f"d={p['distance']}")
        out.append(f"  {tag:>6}  {_where(p['a'])}  ~  {_where(p['b'])}")
    if len(shown) < len(report["shown"]):
        out.append(f"  ... {len(report['shown']) - len(shown)} more of the pairs shown on the sheet")
    left = s["shown"]
    off = [(left["leaking_samples"]["left_off"], "leaking samples"), (left["leak_pairs"]["left_off"], "pairs across splits"),
           (left["pairs_within"]["left_off"], "pairs within splits")]
    if any(k for k, _ in off):
        out.append("  not shown: " + ", ".join(f"{k} {what}" for k, what in off if k)
                   + " (more with --panels N; --json lists the pairs)")
    return "\n".join(out)


def _where(x: Mapping[str, Any], width: int = 60) -> str:
    src = x["source"] if len(x["source"]) <= width else "..." + x["source"][-(width - 3):]
    return f"{printable(x['split'])}:{x['index']} {printable(src)}".rstrip()


# a terminal acts on these instead of showing them: bidi marks, embeddings, overrides and isolates
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}


def printable(text: str) -> str:
    """`text` safe to print to a terminal: C0 and C1 controls, DEL, line and paragraph separators, bidi
    controls and lone surrogates (a file name that is not UTF-8) written as escapes (`\\n`, `\\x1b`,
    `\\u202e`), and a backslash doubled so that no name can forge an escape. A file name with a newline
    or a terminal escape sequence would otherwise add lines to the report or drive the terminal.

    Args:
        text: a file name, a split's name.

    Returns:
        The text, escaped where it must be; unchanged when nothing in it needs escaping.
    """
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(_escape(c) for c in text)


def _escape(c: str) -> str:
    if c in _SHORT:
        return _SHORT[c]
    if c not in _BIDI and unicodedata.category(c) not in ("Cc", "Cs", "Zl", "Zp"):
        return c
    k = ord(c)
    return f"\\x{k:02x}" if k < 0x100 else f"\\u{k:04x}" if k < 0x10000 else f"\\U{k:08x}"
