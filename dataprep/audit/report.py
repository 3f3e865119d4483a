"""The audit's findings: takes per-sample hashes (and pixel digests) with each sample's split, index and
source, gives the pairs within the distance, their groups, the samples of each split that have a near
twin in another split (leaks), what --drop-duplicates would drop, as a JSON-ready dict and as text.

The headline figures (leaks, pair counts by split, groups, drops) are exact whatever the listing's cap:
they come from the matches held by distinct hash (index.Matches), not from the listed pairs. Only the
list of pairs is cut (`max_pairs`, pairs across splits listed first, closest first), and the summary
says so (`complete`). The pairs shown on the contact sheet and in the text are chosen apart (panels.py):
every leaking sample first, then one pair a group in turn, and the summary says what they leave off.

audit gathers what the others make in one pass of the search: samples.py (the input, checked), leaks.py
(twins across splits, leak masks, the drop rule), mirrors.py (pairs through a mirror, by class) and
printout.py (the text for people).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from .folds import Components, EdgePick, Pairs, feed, group_ids
from .hashes import HASH_NAME
from .index import CHUNK, Matches, find_matches
from .leaks import TRAIN, SplitBits, SplitJoin, drop_indices, leak_mask, twin_splits  # noqa: F401 - leak_mask: callers import it from here
from .mirrors import MirrorClasses, _mirror_classes, _unless_direct
from .panels import PANELS, Closest, Shown, check_panels, choose, closest_folds, closest_twins, mirror_closest
from .printout import text_report  # noqa: F401 - callers import it from here, where it lived before printout.py
from .samples import Samples

DEFAULT_MAX_DISTANCE = 10  # measured on the shared corpus (docs/audit.md); distances are even, so 10 = 11
MAX_PAIRS = 1_000_000  # pairs listed at most; the counts in the summary stay exact past it


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
