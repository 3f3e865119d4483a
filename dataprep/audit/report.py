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
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from .hashes import DIGEST_BYTES, HASH_NAME
from .index import Matches, Pairs, _components, _parts, _spans, find_matches
from .panels import PANELS, Shown, check_panels, choose, closest_twins

DEFAULT_MAX_DISTANCE = 10  # measured on the shared corpus (docs/audit.md); distances are even, so 10 = 11
MAX_PAIRS = 1_000_000  # pairs listed at most; the counts in the summary stay exact past it
TRAIN = "train"


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
        optional, but given for every split or none); the splits keep the mapping's order."""
        names = tuple(parts)
        if len(names) > 63:
            raise ValueError(f"at most 63 splits can be audited together, got {len(names)}")
        hs, sp, ix, src, dg, fl = [], [], [], [], [], []
        for k, name in enumerate(names):
            p = parts[name]
            h = np.asarray(p["hashes"], np.uint64).reshape(-1)
            s = list(p.get("sources") or [""] * len(h))
            if len(s) != len(h):
                raise ValueError(f"split {name!r}: {len(h)} hashes but {len(s)} sources")
            hs.append(h)
            sp.append(np.full(len(h), k, np.int64))
            ix.append(np.arange(len(h), dtype=np.int64))
            src += s
            dg.append(None if p.get("digests") is None else np.asarray(p["digests"], np.uint8).reshape(len(h), DIGEST_BYTES))
            fl.append(None if p.get("flipped") is None else np.asarray(p["flipped"], np.uint64).reshape(-1))
        for what, xs in (("digests", dg), ("flipped", fl)):
            if any(x is None for x in xs) and not all(x is None for x in xs):
                raise ValueError(f"{what} are given for some splits and not others")
        cat = (lambda xs, dt, *shape: np.concatenate(xs) if xs else np.zeros((0, *shape), dt))
        return cls(names, cat(sp, np.int64), cat(ix, np.int64), src, cat(hs, np.uint64),
                   None if not dg or dg[0] is None else cat(dg, np.uint8, 16),
                   None if not fl or fl[0] is None else cat(fl, np.uint64))

    def __len__(self) -> int:
        return len(self.hashes)

    def label(self, k: int) -> dict[str, Any]:
        return {"split": self.splits[int(self.split[k])], "index": int(self.index[k]), "source": str(self.source[k])}


# -- twins across splits, exact from the matches ------------------------------------------------------
def twin_splits(samples: Samples, m: Matches, flips: Matches | None = None) -> np.ndarray:
    """Per sample: a bit per split other than its own that holds a sample within the distance of it (with
    `flips`, the matches of hashes [0, n) and flipped hashes [n, 2n): a mirror twin counts too)."""
    n = len(samples)
    own = np.uint64(1) << samples.split.astype(np.uint64)
    bits = np.zeros(len(m.counts), np.uint64)  # per distinct hash: the splits with a sample there
    np.bitwise_or.at(bits, m.inverse, own)
    near = bits.copy()
    np.bitwise_or.at(near, m.u, bits[m.v])
    np.bitwise_or.at(near, m.v, bits[m.u])
    out = near[m.inverse]
    if flips is not None:  # a mirror twin of x: a sample y whose flipped hash is near x's hash
        fbits = np.zeros(len(flips.counts), np.uint64)
        np.bitwise_or.at(fbits, flips.inverse[n:], own)
        fnear = fbits.copy()
        np.bitwise_or.at(fnear, flips.u, fbits[flips.v])
        np.bitwise_or.at(fnear, flips.v, fbits[flips.u])
        out |= fnear[flips.inverse[:n]]
    return out & ~own


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


def drop_indices(samples: Samples, m: Matches, flips: Matches | None = None, mirrors: MirrorClasses | None = None) -> dict[str, np.ndarray]:
    """Per split, the indices a --drop-duplicates build leaves out. The rule: splits are ranked train
    first, then in their order; a sample with a near twin in a split ranked before its own is dropped (a
    val or test sample with a twin in train leaves val or test; train keeps it); within a split, of each
    group of samples joined by chains of pairs inside that split, the first (lowest index) is kept and the
    rest are dropped. A dropped sample is thus within the distance of a kept one, or linked to one by a
    chain of such near copies. `mirrors`: `flips`' mirror pairs by class, when made already.

    Made over the parts (a distinct hash's samples in one split, which are joined already) and the edges
    between them, never over the pairs: k equal hashes cost O(k), not k(k-1)/2."""
    order = sorted(range(len(samples.splits)), key=lambda k: (samples.splits[k] != TRAIN, k))
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    t = twin_splits(samples, m, flips)
    earlier_bits = np.zeros(len(samples.splits), np.uint64)
    for k in range(len(samples.splits)):
        earlier_bits[k] = np.uint64(sum(1 << j for j in range(len(samples.splits)) if rank[j] < rank[k]))
    leak = (t & earlier_bits[samples.split]) != 0
    # within a split: components of the pairs whose ends share a split
    members, starts, counts, value, code = _parts(m.inverse, samples.split)
    part = np.empty(len(samples), np.int64)
    part[members] = np.repeat(np.arange(len(counts)), counts)
    S = len(samples.splits)
    eu, ev = [], []
    if len(m.u):
        key = value * S + code  # the parts' keys, sorted
        for k in range(S):  # the near distinct hashes that both have samples in split k
            a_, b_ = m.u * S + k, m.v * S + k
            ia, ib = np.searchsorted(key, a_), np.searchsorted(key, b_)
            ia, ib = np.minimum(ia, len(key) - 1), np.minimum(ib, len(key) - 1)
            ok = (key[ia] == a_) & (key[ib] == b_)
            eu.append(ia[ok])
            ev.append(ib[ok])
    if flips is not None:
        mc = mirrors if mirrors is not None else _mirror_classes(samples, flips, m.max_distance)
        same = mc.split[mc.lo] == mc.split[mc.hi]  # mirror twins within one split
        eu.append(part[mc.first[mc.lo[same]]])
        ev.append(part[mc.first[mc.hi[same]]])
    cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int64))
    label = _components(len(counts), cat(eu), cat(ev))[part]
    # the smallest sample of each component is kept
    lowest = np.full(len(counts), len(samples), np.int64)
    np.minimum.at(lowest, label, np.arange(len(samples), dtype=np.int64))
    dup = lowest[label] != np.arange(len(samples))
    out = {}
    for k, name in enumerate(samples.splits):
        sel = samples.split == k
        out[name] = samples.index[sel & (leak | dup)]
    return out


# -- the report ---------------------------------------------------------------------------------------
def _pair_counts(samples: Samples, m: Matches) -> dict[tuple[int, int], int]:
    """Exact sample-pair counts by (split, split) with the first <= the second, from the matches."""
    S = len(samples.splits)
    H = np.zeros((len(m.counts), S), np.int64)
    np.add.at(H, (m.inverse, samples.split), 1)
    out = {}
    for a in range(S):
        for b in range(a, S):
            if a == b:
                c = int((H[:, a] * (H[:, a] - 1) // 2).sum() + (H[m.u, a] * H[m.v, a]).sum())
            else:
                c = int((H[:, a] * H[:, b]).sum() + (H[m.u, a] * H[m.v, b]).sum() + (H[m.u, b] * H[m.v, a]).sum())
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
    m = find_matches(samples.hashes, max_distance, search)
    fm = find_matches(np.concatenate([samples.hashes, samples.flipped]), max_distance, search) if flips else None
    mc = _mirror_classes(samples, fm, m.max_distance) if fm is not None else None
    group = _groups(samples, m, mc)
    listed: list[tuple[Pairs, bool]] = []
    room = max_pairs
    for across in (True, False):  # only the pairs asked for are made: k equal hashes cost their listed pairs
        p = m.pairs(room, split=samples.split, across=across)
        listed.append((p, False))
        room -= len(p.i)
    flip_total = 0
    if mc is not None:
        flip_total = mc.total
        listed.append((mc.pairs(room), True))
    i, j, d = (np.concatenate([getattr(p, k) for p, _ in listed]) for k in ("i", "j", "distance"))
    flip = np.concatenate([np.full(len(p.i), f) for p, f in listed])
    pairs, exact_n = _rows(samples, i, j, d, flip, group)
    complete = all(p.complete for p, _ in listed)
    twins = twin_splits(samples, m, fm)
    ref = _reference(samples)
    t = closest_twins(samples.split, twins, samples.splits.index(ref), m, mc) if ref is not None else None
    s = choose(t, group, i, j, d, flip, panels) if t is not None else None
    shown = [] if s is None else _rows(samples, s.i, s.j, s.d, s.flip, group)[0]
    summary = _summary(samples, m, fm, mc, group, max_distance, flips, len(pairs), complete, exact_n, flip_total, twins)
    summary["shown"] = _shown_counts(samples, summary, mc, s, panels, 0 if t is None else len(t.x))
    return {"pairs": pairs, "shown": shown, "summary": summary}


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
        keep = ~mc.direct
        n = mc.size[mc.lo[keep]] * mc.size[mc.hi[keep]]
        cross = mc.split[mc.lo[keep]] != mc.split[mc.hi[keep]]
        across += int(n[cross].sum())
        within += int(n[~cross].sum())
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
    hash and a split (so any two of them are a direct pair, at distance 0); (lo, hi) are the pairs of classes
    (lo < hi) with one's hash within the distance of the other's flipped hash, `d` the closer of the two ways,
    `direct` whether their unmirrored hashes are near as well. A pair of classes stands for size[lo] *
    size[hi] pairs of samples, so k equal images make one class and no pairs to hold."""

    members: np.ndarray  # samples ordered by class
    start: np.ndarray  # each class's first position in members
    size: np.ndarray
    split: np.ndarray  # each class's split code
    lo: np.ndarray
    hi: np.ndarray
    d: np.ndarray
    direct: np.ndarray

    @property
    def first(self) -> np.ndarray:
        """Each class's lowest sample."""
        return self.members[self.start]

    @property
    def total(self) -> int:
        """Pairs of samples near only through a mirror."""
        keep = ~self.direct
        return int((self.size[self.lo[keep]] * self.size[self.hi[keep]]).sum())

    def pairs(self, limit: int | None = None) -> Pairs:
        """The pairs of samples near only through a mirror, sorted by (distance, i, j), the closest
        `limit` of them (complete=False when cut)."""
        keep = np.flatnonzero(~self.direct)
        o = keep[np.argsort(self.d[keep], kind="stable")]
        n = self.size[self.lo[o]] * self.size[self.hi[o]]
        complete = limit is None or int(n.sum()) <= limit
        if not complete:
            cum = np.cumsum(n)
            o = o[: int(np.searchsorted(cum, limit, side="left")) + 1]
            n = n[: len(o)]
        parts = []
        for gid, local in _spans(n, 1 << 20):
            a, b = np.divmod(local, self.size[self.hi[o[gid]]])
            x = self.members[self.start[self.lo[o[gid]]] + a]
            y = self.members[self.start[self.hi[o[gid]]] + b]
            parts.append((np.minimum(x, y), np.maximum(x, y), self.d[o[gid]]))
        if not parts:
            e = np.zeros(0, np.int64)
            return Pairs(e, e.copy(), e.copy(), complete)
        i, j, d = (np.concatenate(z) for z in zip(*parts))
        r = np.lexsort((j, i, d))[:limit]
        return Pairs(i[r], j[r], d[r].astype(np.int64), complete)


def _mirror_classes(samples: Samples, fm: Matches, D: int) -> MirrorClasses:
    """The mirror pairs of `fm` (the matches of hashes [0, n) and flipped hashes [n, 2n)) by class."""
    n = len(samples)
    h, f, sp = samples.hashes, samples.flipped, samples.split
    members = np.lexsort((np.arange(n), sp, f, h))
    hs, fs, ss = h[members], f[members], sp[members]
    new = np.ones(n, bool)
    new[1:] = (hs[1:] != hs[:-1]) | (fs[1:] != fs[:-1]) | (ss[1:] != ss[:-1])
    start = np.flatnonzero(new).astype(np.int64)
    size = np.diff(np.append(start, n)).astype(np.int64)
    first = members[start]
    V = len(fm.counts)
    xh, xf = fm.inverse[:n][first], fm.inverse[n:][first]  # each class's hash and flipped hash, as fm's distinct ones
    by_h, by_f = np.argsort(xh, kind="stable"), np.argsort(xf, kind="stable")
    nh, nf = np.bincount(xh, minlength=V), np.bincount(xf, minlength=V)
    sh, sf = np.concatenate([[0], np.cumsum(nh)]), np.concatenate([[0], np.cumsum(nf)])
    # (hash side, flipped side) pairs of distinct values: equal, or near either way
    vx = np.concatenate([np.arange(V), fm.u, fm.v])
    vy = np.concatenate([np.arange(V), fm.v, fm.u])
    vd = np.concatenate([np.zeros(V, np.int64), fm.d, fm.d])
    cnt = nh[vx] * nf[vy]
    ok = np.flatnonzero(cnt)
    vx, vy, vd, cnt = vx[ok], vy[ok], vd[ok], cnt[ok]
    gid = np.repeat(np.arange(len(cnt)), cnt)
    local = np.arange(int(cnt.sum()), dtype=np.int64) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    a, b = np.divmod(local, nf[vy][gid])
    c1, c2, d = by_h[sh[vx][gid] + a], by_f[sf[vy][gid] + b], vd[gid]
    keep = c1 != c2  # a class with itself: direct pairs (equal hashes)
    c1, c2, d = c1[keep], c2[keep], d[keep]
    lo, hi = np.minimum(c1, c2), np.maximum(c1, c2)
    o = np.lexsort((d, hi, lo))
    lo, hi, d = lo[o], hi[o], d[o]
    one = np.ones(len(lo), bool)
    one[1:] = (lo[1:] != lo[:-1]) | (hi[1:] != hi[:-1])  # found both ways: the closer
    lo, hi, d = lo[one], hi[one], d[one]
    direct = np.bitwise_count(h[first[lo]] ^ h[first[hi]]) <= D
    return MirrorClasses(members, start, size, ss[start], lo, hi, d.astype(np.int64), direct)


def _groups(samples: Samples, m: Matches, mc: MirrorClasses | None) -> np.ndarray:
    """A group id per sample (connected components of the pairs, mirror pairs too with flips), made over
    the distinct hashes and the edges between them."""
    if mc is None:
        return m.groups()
    first = mc.first
    u = np.concatenate([m.u, m.inverse[first[mc.lo]]])
    v = np.concatenate([m.v, m.inverse[first[mc.hi]]])
    label = _components(len(m.counts), u, v)[m.inverse]
    _, firsts, compact = np.unique(label, return_index=True, return_inverse=True)
    rank = np.empty(len(firsts), np.int64)
    rank[np.argsort(firsts, kind="stable")] = np.arange(len(firsts))
    return rank[compact.reshape(-1)]


def _summary(samples, m, fm, mc, group, D, flips, listed, complete, exact_n, flip_total, t) -> dict[str, Any]:
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
    pc = _pair_counts(samples, m)
    sizes = np.bincount(group) if len(group) else np.zeros(0, np.int64)
    dropped = drop_indices(samples, m, fm, mc)
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
