"""`dataprep bench`: takes a pack of any kind, gives how fast each way of serving it runs on this machine,
what limits it, and which setting to use.

For every serving path that applies (JPEG decoded by each decoder in the registry; otherwise one path
that gathers stored samples into batches: decoded pixels, token windows, table rows), every
`num_workers` and batch size, the fast Loader runs for a bounded time after a warm-up. The same run
measures this machine's limits for the pack: the dataset's own batch fill on one core (a gather from
the arrays it holds), the machine's memory copy bandwidth, the single-core decode rate of each decoder
on this pack's images, and the file read bandwidth (a bound only when the pack is mapped, cache="mmap";
a pack held in RAM is read once, at load).

A limit is an upper bound: a measured rate above one proves that limit was not this path's bound, so the
verdict names the tightest limit the measurements leave standing, and a rate is never more than 100% of
the bound it names.
"""
from __future__ import annotations

import os
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return (int(parts[11]) + int(parts[12])) / TICK
    except (OSError, IndexError, ValueError):
        return 0.0


def pss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@dataclass
class Run:
    path: str
    workers: int
    batch: int
    samples_s: float
    mb_s: float
    cpu: dict[str, float]  # process -> CPU seconds per second
    pss_bytes: int
    wait_fraction: float  # of the main process's time, spent waiting for the next batch
    window_rates: list[float] = field(default_factory=list)  # samples/s in each of WINDOWS equal parts of the timed run


@dataclass
class Report:
    pack: str
    paths: list[str]
    runs: list[Run] = field(default_factory=list)
    limits: dict[str, float] = field(default_factory=dict)
    verdicts: dict[str, dict[str, Any]] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    pick: dict[str, Any] = field(default_factory=dict)  # the overall pick and how sure it is (`overall_pick`)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "runs": [asdict(r) for r in self.runs]}


def _cycle(loader):
    while True:
        yield from loader


def sample_bytes(ds, crop) -> int:
    """Bytes one served sample occupies in a batch (every key of the dataset's batch layout)."""
    from ..serve.request import Request

    with warnings.catch_warnings():  # a crop that pads small images is said once by the tool, not per run
        warnings.simplefilter("ignore")
        layout = ds.batch_layout(Request(crop=crop))
    return sum(int(np.prod(s, dtype=np.int64)) * np.dtype(d).itemsize for s, d in layout.values())


def measure(ds, path: str, workers: int, batch: int, seconds: float, warmup: float, crop) -> Run:
    from ..serve.loader import Loader

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = Loader(ds, batch, shuffle=True, num_workers=workers, crop=crop)
    nbytes = sample_bytes(ds, crop)
    gen = _cycle(loader)
    try:
        t_end = time.perf_counter() + warmup
        while time.perf_counter() < t_end:
            next(gen)
        pids = [os.getpid(), *(p.pid for p in loader._procs)]
        cpu0 = [cpu_seconds(p) for p in pids]
        n, wait = 0, 0.0
        marks = []  # (time, samples so far) after each batch: the spread of the rate within the run
        t0 = time.perf_counter()
        while True:
            tw = time.perf_counter()
            b = next(gen)
            wait += time.perf_counter() - tw
            n += len(b[-1])
            marks.append((time.perf_counter() - t0, n))
            if marks[-1][0] >= seconds:
                break
        wall = time.perf_counter() - t0
        cpu = {("main" if i == 0 else f"worker{i - 1}"): (cpu_seconds(p) - c0) / wall for i, (p, c0) in enumerate(zip(pids, cpu0))}
        pss = sum(pss_bytes(p) for p in pids)
    finally:
        gen.close()
        loader.close()
    return Run(path, workers, batch, n / wall, n * nbytes / wall / 1e6, cpu, pss, wait / wall, window_rates(marks))


WINDOWS = 5  # parts of a timed run whose rates give its spread


def window_rates(marks: list[tuple[float, int]]) -> list[float]:
    """Samples/s over each of WINDOWS consecutive parts of a run, cut at the batch ends nearest to equal
    times (fewer parts when the run served fewer batches): how steady the rate was while it was timed."""
    if not marks:
        return []
    times = np.asarray([0.0] + [t for t, _ in marks])
    counts = np.asarray([0] + [c for _, c in marks])
    cuts = np.unique(np.searchsorted(times, np.linspace(0, times[-1], WINDOWS + 1)[1:], side="left"))
    edges = [0, *cuts.tolist()]
    return [float((counts[b] - counts[a]) / (times[b] - times[a])) for a, b in zip(edges[:-1], edges[1:]) if times[b] > times[a]]


def overall_pick(runs: list[Run], load: tuple[float, ...], cores: int) -> dict[str, Any]:
    """The fastest setting over every path, and how sure the run is of it. Each setting's rate has a
    range (the slowest and fastest of its timed windows); the pick is "clear" when its slowest window beat
    every other setting's fastest, else the settings whose ranges overlap its own are named as ties (a
    rerun may order them either way). A busy machine (load above half its cores) is said too: other
    work moves every figure."""
    if not runs:
        return {}
    ranked = sorted(runs, key=lambda r: r.samples_s, reverse=True)
    best = ranked[0]
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
    if busy:
        why += f"; the machine was busy (load {max(load):.1f} on {cores} cores): rerun on a quiet machine to be sure"
    return {"path": best.path, "workers": best.workers, "batch": best.batch, "samples_s": best.samples_s,
            "confidence": confidence, "why": why, "ties": [describe(r) for r in ties], "busy": busy}


def describe(r: Run) -> str:
    """One setting, as the pick names it."""
    return f"{r.path} workers={r.workers} batch={r.batch}"


def fill_rate(ds, batch: int, crop, seconds: float = 0.3) -> float:
    """Samples per second one core puts into a preallocated batch through the dataset's own `fill_batch`
    (what the Loader's main process or each worker runs), from the arrays the dataset holds: the best
    of several short passes after a warm-up one."""
    from ..serve.request import Request

    req = Request(crop=crop)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        layout = ds.batch_layout(req)
        out = {k: np.empty((batch, *shape), dt) for k, (shape, dt) in layout.items()}
        rng = np.random.default_rng(0)
        rates = []
        for _ in range(6):
            idx = rng.integers(0, len(ds), batch)
            n, t0 = 0, time.perf_counter()
            while True:
                ds.fill_batch(idx, out, req)
                n += batch
                if time.perf_counter() - t0 >= seconds / 6:
                    break
            rates.append(n / (time.perf_counter() - t0))
    return max(rates[1:])


def copy_bandwidth(threads: int, seconds: float = 0.2) -> float:
    """This machine's memory copy bandwidth in MB/s (bytes copied: each read once and written once), with
    `threads` copies at once (numpy releases the GIL while copying), from buffers larger than the caches."""
    from concurrent.futures import ThreadPoolExecutor

    size = max(4 << 20, (128 << 20) // threads)
    src = [np.ones(size, np.uint8) for _ in range(threads)]
    dst = [np.empty(size, np.uint8) for _ in range(threads)]

    def copy(k: int) -> int:
        n, t_end = 0, time.perf_counter() + seconds
        while time.perf_counter() < t_end or n < 2:
            np.copyto(dst[k], src[k])
            n += 1
        return n

    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(lambda k: np.copyto(dst[k], src[k]), range(threads)))  # touch every page first
        t0 = time.perf_counter()
        copies = sum(ex.map(copy, range(threads)))
        wall = time.perf_counter() - t0
    return copies * size / wall / 1e6


def decode_rate(ds, name: str) -> float:
    """Images per second decoder `name` decodes on one core, from this pack's first 200 stored JPEGs: the
    best of three passes after a warm-up one."""
    from ..images.codec import DECODERS

    fn, k = DECODERS[name], min(len(ds), 200)
    bufs = [ds._blob[ds._offsets[i] : ds._offsets[i + 1]] for i in range(k)]
    passes = []
    for _ in range(4):
        t0 = time.perf_counter()
        for b in bufs:
            fn(b, ds.field.channels)
        passes.append(k / (time.perf_counter() - t0))
    return max(passes[1:])


def limits(ds, paths: list[str], batch: int, crop, pack: Path, cores: int) -> dict[str, float]:
    """This machine's limits for this pack: for gather paths the dataset's batch fill on one core
    (samples/s) and the memory copy bandwidth of all cores (MB/s); for decode paths the single-core decode
    rate of each decoder; the file read bandwidth (MB/s); bytes per stored and per served sample."""
    from ..images.codec import DECODERS
    from ..serve.cache import available_ram

    out: dict[str, float] = {"sample_bytes": float(sample_bytes(ds, crop))}
    if any(p not in DECODERS for p in paths):
        out["gather_samples_s"] = fill_rate(ds, batch, crop)
        out["memory_mb_s"] = copy_bandwidth(cores)
    for name in (p for p in paths if p in DECODERS):
        out[f"decode_{name}_samples_s"] = decode_rate(ds, name)
    # the pack's files: shard .npy files, one HDF5 file, or a Zarr group's chunk files
    files = [pack] if pack.is_file() else [p for p in pack.rglob("*") if p.is_file() and p.suffix != ".json"]
    total = sum(p.stat().st_size for p in files)
    buf = bytearray(1 << 22)
    t0 = time.perf_counter()
    for p in files:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass
    out["read_mb_s"] = total / 1e6 / max(time.perf_counter() - t0, 1e-9)
    out["stored_bytes_per_sample"] = total / max(len(ds), 1)
    out["stored_bytes"], out["available_ram"] = float(total), float(available_ram())
    return out


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
    if f"decode_{path}_samples_s" in lim:
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


def verdict(path: str, runs: list[Run], lim: dict[str, float], cores: int, cache: str = "ram") -> dict[str, Any]:
    """Name what bounds a path's best setting, and the setting to use. The bound named is the tightest limit
    at or above the best rate; a limit the Loader beat (beyond measurement noise) is set aside with a note."""
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
    rec = f"Loader(num_workers={best.workers}, batch_size={best.batch})" + (f" with decode={path!r}" if "decode-bound" in cands else "")
    if bound == "worker-starved":
        rec += f"; try num_workers={best.workers + 1} and more"
    elif bound in ("decode-bound", "gather-bound") and best.workers < cores:
        rec += f"; up to {cores} workers (one per core) raise the limit"
    return {"bound": bound, "best_samples_s": rate, "limit_samples_s": limit, "limit_what": what,
            "fraction_of_limit": rate / limit if limit else 0.0, "recommend": rec, "notes": notes}


def gather_path(field) -> str:
    """The name of the path that gathers stored samples: decoded pixels, or whatever else a pack holds."""
    return "pixels" if getattr(field, "encoding", None) == "raw" else "gather"


def open_dataset(pack: Path, cache: str, options: dict[str, Any], decode: str | None = None):
    """The pack's dataset (its kind's class) with `options` (e.g. a token pack's context) and, for a
    decode path, `decode`; an option the class does not take is a DataprepError naming it."""
    import inspect

    from ..errors import DataprepError
    from ..kinds import kind_of
    from ..pack.backends import read_manifest

    cls = kind_of(read_manifest(pack), pack).dataset_class()
    takes = inspect.signature(cls).parameters
    kwargs = {"cache": cache, **options, **({"decode": decode} if decode else {})}
    if "progress" in takes:
        kwargs["progress"] = False
    wrong = sorted(k for k in kwargs if k not in takes)
    if wrong:
        raise DataprepError(f"{pack}: a {cls.__name__} takes no {', '.join(wrong)}")
    return cls(pack, **kwargs)


def run_bench(pack: str | os.PathLike, workers: list[int] | None = None, batches: list[int] | None = None,
              paths: list[str] | None = None, seconds: float = 2.0, warmup: float = 0.5, crop=None,
              cache: str = "ram", options: dict[str, Any] | None = None) -> Report:
    """Bench every serving path of `pack` that applies (or those of `paths`). `options` go to the
    dataset (a token pack's `context`); `crop` (H, W) serves a variable-size image pack [default: a
    square of its median shorter side]."""
    from ..errors import DataprepError
    from ..images.codec import DECODERS, SAME_SAMPLES_AS
    from ..kinds import kind_of
    from ..pack.backends import read_manifest
    from ..serve.request import Request

    pack = Path(pack)
    cores = os.cpu_count() or 1
    workers = workers if workers is not None else list(range(cores + 1))
    batches = batches or [64, 256]
    m = read_manifest(pack)
    served = next(iter(kind_of(m, pack).served_fields(m, None, pack).values()))
    if getattr(served, "encoding", None) == "jpeg":
        avail = [d for d in DECODERS if DECODERS[d] is not None and d not in SAME_SAMPLES_AS]
    else:
        avail = [gather_path(served)]
    if paths and any(p not in avail for p in paths):
        raise DataprepError(f"{pack}: serving paths of this pack are {', '.join(avail)}, not {', '.join(p for p in paths if p not in avail)}")
    paths = paths or avail
    base = open_dataset(pack, cache, options or {}, paths[0] if paths[0] in DECODERS else None)
    if crop is None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                base.batch_layout(Request())
        except DataprepError:
            if not hasattr(base, "shapes"):
                raise
            side = int(np.median(base.shapes[:, :2].min(axis=1)))  # images of many sizes: the Loader needs a crop
            crop = (side, side)
    rep = Report(str(pack), paths, machine={"cores": cores, "load": os.getloadavg(), "cache": cache, "crop": crop,
                                            "kind": m["kind"], "samples": len(base)})
    rep.limits = limits(base, paths, max(batches), crop, pack, cores)
    for path in paths:
        ds = base if path == paths[0] else open_dataset(pack, cache, options or {}, path)
        runs = [measure(ds, path, w, b, seconds, warmup, crop) for b in batches for w in workers]
        rep.runs += runs
        v = verdict(path, runs, rep.limits, cores, cache)
        if v["notes"]:  # the Loader beat (or nearly beat) a limit: measure it again, now, and keep the higher
            # B023 (noqa below) does not apply: every lambda is called on the next line, in this iteration
            again = {f"decode_{path}_samples_s": lambda: decode_rate(ds, path)} if path in DECODERS else \
                {"gather_samples_s": lambda: fill_rate(ds, max(batches), crop), "memory_mb_s": lambda: copy_bandwidth(cores)}  # noqa: B023
            rep.limits.update({k: max(rep.limits[k], f()) for k, f in again.items()})
            v = verdict(path, runs, rep.limits, cores, cache)
        rep.verdicts[path] = v
    rep.machine["load_after"] = os.getloadavg()
    rep.pick = overall_pick(rep.runs, (*rep.machine["load"][:1], *rep.machine["load_after"][:1]), cores)
    return rep


def table(rep: Report) -> list[str]:
    lines = [f"{'path':8s} {'workers':>7s} {'batch':>5s} {'samples/s':>10s} {'MB/s':>8s} {'CPU main':>8s} "
             f"{'CPU wkrs':>8s} {'PSS MB':>7s} {'waiting':>7s}"]
    for r in rep.runs:
        wk = sum(v for k, v in r.cpu.items() if k != "main")
        lines.append(f"{r.path:8s} {r.workers:7d} {r.batch:5d} {r.samples_s:10,.0f} {r.mb_s:8,.0f} {r.cpu['main']:8.2f} "
                     f"{wk:8.2f} {r.pss_bytes / 1e6:7,.0f} {r.wait_fraction:7.0%}")
    lim, cache = rep.limits, rep.machine.get("cache", "ram")
    have = []
    if "gather_samples_s" in lim:
        have.append(f"gather {lim['gather_samples_s']:,.0f} samples/s per core")
        have.append(f"memory bandwidth {lim['memory_mb_s']:,.0f} MB/s ({lim['sample_bytes']:,.0f} B a sample)")
    have += [f"{k[7:-10]} decode {v:,.0f}/s per core" for k, v in lim.items() if k.startswith("decode_")]
    if reads_files(lim, cache):
        have.append(f"read {lim['read_mb_s']:,.0f} MB/s")
    elif cache == "mmap":
        have.append(f"read {lim['read_mb_s']:,.0f} MB/s (not a bound: the mapped pack fits in the RAM available, "
                    "so its pages stay in the page cache after the first pass)")
    else:
        have.append(f"read {lim['read_mb_s']:,.0f} MB/s (not a bound: cache={cache!r} holds the pack in RAM, read once at load)")
    lines.append("limits: " + "; ".join(have))
    for path, v in rep.verdicts.items():
        if v["bound"] == "unknown":
            lines.append(f"{path}: best {v['best_samples_s']:,.0f} samples/s, above every limit this run measured: unknown. "
                         f"Use {v['recommend']}")
        else:
            lines.append(f"{path}: best {v['best_samples_s']:,.0f} samples/s = {v['fraction_of_limit']:.0%} of its limit, "
                         f"{v['limit_what']} ({v['limit_samples_s']:,.0f}): {v['bound']}. Use {v['recommend']}")
        lines += [f"  {n}" for n in v.get("notes", [])]
    p = rep.pick
    if p:
        lines.append(f"pick: {p['path']} with Loader(num_workers={p['workers']}, batch_size={p['batch']}), "
                     f"{p['samples_s']:,.0f} samples/s; {p['confidence']}: {p['why']}")
    return lines
