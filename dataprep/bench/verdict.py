"""A bench's verdicts: takes the runs of each serving path and the machine's limits, gives what bounds a
path's best setting (decode, gather, memory bandwidth, I/O, too few workers, or the loader itself) and the
setting to use (`verdict`), and the fastest setting over every path with how sure the run is of it
(`overall_pick`: clear, or the settings within noise of it named; the default decode kept unless another
path beat it beyond noise). A limit is an upper bound: one the Loader beat is set aside with a note.
"""
from __future__ import annotations

from typing import Any

from .runs import Run


def overall_pick(runs: list[Run], load: tuple[float, ...], cores: int, default: str | None = None) -> dict[str, Any]:
    """The fastest setting over every path, and how sure the run is of it. Each setting's rate has a
    range (the slowest and fastest of its timed windows); the pick is "clear" when its slowest window beat
    every other setting's fastest, else the settings whose ranges overlap its own are named as ties (a
    rerun may order them either way). A busy machine (load above half its cores) is said too: other
    work moves every figure.

    `default`: the path a user gets without choosing (the dataset's default decode). Another path is
    picked only when it beat every setting of the default beyond noise (its slowest window above their
    fastest); else the default's fastest setting is the pick. Either way the workload is the one timed,
    so a pick is never slower on it than the default, as far as the run can tell."""
    if not runs:
        return {}
    ranked = sorted(runs, key=lambda r: r.samples_s, reverse=True)
    best = ranked[0]
    lo = min(best.window_rates or [best.samples_s])
    theirs = None if default is None or best.path == default else \
        next((r for r in ranked if r.path == default), None)  # the default's fastest setting
    kept = None
    if theirs is not None and max(theirs.window_rates or [theirs.samples_s]) >= lo:  # the default is within noise
        kept, best = best, theirs
        ranked = [best] + [r for r in ranked if r is not best]
        lo = min(best.window_rates or [best.samples_s])
    ties = [r for r in ranked[1:] if max(r.window_rates or [r.samples_s]) >= lo]
    busy = max(load) > cores / 2 if load else False
    if not ties:
        confidence = "clear"
        why = (f"its slowest timed window ({lo:,.0f} samples/s) beat every other setting's fastest"
               + (f" (next: {describe(ranked[1])}, {ranked[1].samples_s:,.0f})" if len(ranked) > 1 else ""))
    else:
        confidence = "within noise"
        why = (f"{len(ties)} other setting(s) reached its range ({lo:,.0f}-{max(best.window_rates or [best.samples_s]):,.0f}"
               f" samples/s): " + ", ".join(f"{describe(r)} {r.samples_s:,.0f}" for r in ties[:3])
               + (" ..." if len(ties) > 3 else "") + "; a rerun may order them differently")
    if kept is not None:
        why += f"; {describe(kept)} served {kept.samples_s:,.0f}, within noise of the default {default!r}: the default kept"
    if busy:
        why += f"; the machine was busy (load {max(load):.1f} on {cores} cores): rerun on a quiet machine to be sure"
    out = {"path": best.path, "workers": best.workers, "batch": best.batch, "samples_s": best.samples_s,
           "confidence": confidence, "why": why, "ties": [describe(r) for r in ties], "busy": busy}
    if theirs is not None and kept is None:  # another path, faster than every setting of the default beyond noise
        out["default"] = {"path": default, "workers": theirs.workers, "batch": theirs.batch, "samples_s": theirs.samples_s,
                          "speedup": best.samples_s / max(theirs.samples_s, 1e-9)}
    return out


def describe(r: Run) -> str:
    """One setting, as the pick names it."""
    return f"{r.path} workers={r.workers} batch={r.batch}"


# A limit measured up to this much below a rate the Loader reached is taken as that rate (the two
# measurements ran at different moments of a shared machine); further below, it was not this path's bound.
NOISE = 1.15


def reads_files(lim: dict[str, float], cache: str) -> bool:
    """Whether serving reads the pack's files: only a mapped pack (ram and shm hold it in RAM) that is larger
    than the RAM available (else its pages stay in the page cache after the first pass)."""
    return cache == "mmap" and lim.get("stored_bytes", 0) > lim.get("available_ram", float("inf"))


def bounds(path: str, procs: int, lim: dict[str, float], cache: str) -> dict[str, tuple[str, float]]:
    """Each limit that can bound `path` with `procs` processes filling batches: bound -> (what, samples/s)."""
    out: dict[str, tuple[str, float]] = {}
    if f"fill_{path}_samples_s" in lim:  # a crop plan: the path's decode and crop, as a worker runs them
        out["decode-bound"] = (f"{path} decode and crop x {procs} core(s)", lim[f"fill_{path}_samples_s"] * procs)
    elif f"decode_{path}_samples_s" in lim:
        out["decode-bound"] = (f"{path} decode x {procs} core(s)", lim[f"decode_{path}_samples_s"] * procs)
    else:
        out["gather-bound"] = (f"gather x {procs} core(s)", lim["gather_samples_s"] * procs)
        if lim.get("memory_mb_s") and lim.get("sample_bytes"):
            out["memory-bandwidth-bound"] = (f"memory bandwidth {lim['memory_mb_s']:,.0f} MB/s",
                                             lim["memory_mb_s"] * 1e6 / lim["sample_bytes"])
    if reads_files(lim, cache):
        out["I/O-bound"] = (f"file read {lim['read_mb_s']:,.0f} MB/s",
                            lim["read_mb_s"] * 1e6 / max(lim["stored_bytes_per_sample"], 1))
    return out


def verdict(path: str, runs: list[Run], lim: dict[str, float], cores: int, cache: str = "ram",
            loader_args: str = "") -> dict[str, Any]:
    """Name what bounds a path's best setting, and the setting to use (`loader_args`: the workload's crop
    and flip, as Workload.loader_args writes them). The bound named is the tightest limit at or above the
    best rate; a limit the Loader beat (beyond measurement noise) is set aside with a note."""
    best = max(runs, key=lambda r: r.samples_s)
    rate = best.samples_s
    by_w = {r.workers: r.samples_s for r in runs if r.batch == best.batch}
    procs = min(max(1, best.workers), cores)
    cands = bounds(path, procs, lim, cache)
    held = {k: v for k, v in cands.items() if v[1] * NOISE >= rate}
    notes = [f"{what} would allow {v:,.0f} samples/s, but {rate:,.0f} were served: not this path's bound"
             for k, (what, v) in cands.items() if k not in held]
    if held:
        kind, (what, limit) = min(held.items(), key=lambda kv: kv[1][1])
        if limit < rate:
            notes.append(f"{what} measured {limit:,.0f} samples/s, within noise of the {rate:,.0f} served: taken as {rate:,.0f}")
            limit = rate
    else:
        kind, what, limit = "unknown", "the best rate itself (every measured limit is below it)", rate
    more = [w for w in by_w if w > best.workers]
    if kind == "unknown" or rate >= 0.6 * limit:
        bound = kind
    elif best.workers < cores and not more:
        bound = "worker-starved"
    else:
        bound = "loader overhead"
    rec = f"Loader(num_workers={best.workers}, batch_size={best.batch}{loader_args})" + \
        (f" with decode={path!r}" if "decode-bound" in cands else "")
    if bound == "worker-starved":
        rec += f"; try num_workers={best.workers + 1} and more"
    elif bound in ("decode-bound", "gather-bound") and best.workers < cores:
        rec += f"; up to {cores} workers (one per core) raise the limit"
    return {"bound": bound, "best_samples_s": rate, "limit_samples_s": limit, "limit_what": what,
            "fraction_of_limit": rate / limit if limit else 0.0, "recommend": rec, "notes": notes}
