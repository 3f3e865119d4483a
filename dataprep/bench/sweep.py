"""`dataprep bench`: takes a pack of any kind, gives how fast each way of serving it runs on this machine,
what limits it, and which setting to use.

It times the workload training runs (bench/workload.py): the Loader with the crop and flip the user
names. For every serving path that serves it differently (a JPEG pack's decode= values, the dataset's
default first: "fast" region-decodes RandomResizedCrop boxes, "accurate" decodes whole images; otherwise
one path that gathers stored samples into batches: decoded pixels, token windows, table rows), every
`num_workers` and batch size, the Loader runs for a bounded time after a warm-up, counting how its
crops were decoded. The same run measures this machine's limits for the pack: the dataset's own batch
fill on one core (a gather from the arrays it holds; for a JPEG pack under a crop plan, each path's
decode and crop), the machine's memory copy bandwidth, the single-core decode rate of each decoder on
this pack's whole images, and the file read bandwidth (a bound only when the pack is mapped,
cache="mmap"; a pack held in RAM is read once, at load).

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
    decode_paths: dict[str, int] = field(default_factory=dict)  # how the run's crops were decoded (Loader.stats())


@dataclass
class Report:
    pack: str
    paths: list[str]
    runs: list[Run] = field(default_factory=list)
    limits: dict[str, float] = field(default_factory=dict)
    verdicts: dict[str, dict[str, Any]] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    pick: dict[str, Any] = field(default_factory=dict)  # the overall pick and how sure it is (`overall_pick`)
    workload: dict[str, Any] = field(default_factory=dict)  # what every run served (Workload.to_dict, no decode)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "runs": [asdict(r) for r in self.runs]}


def _cycle(loader, passes: list[int]):
    while True:
        yield from loader
        passes[0] += 1


def sample_bytes(ds, crop) -> int:
    """Bytes one served sample occupies in a batch (every key of the dataset's batch layout)."""
    from ..serve.request import Request

    with warnings.catch_warnings():  # a crop that pads small images is said once by the tool, not per run
        warnings.simplefilter("ignore")
        layout = ds.batch_layout(Request(crop=crop))
    return sum(int(np.prod(s, dtype=np.int64)) * np.dtype(d).itemsize for s, d in layout.values())


def measure(ds, path: str, workers: int, batch: int, seconds: float, warmup: float, crop, flip: bool = False) -> Run:
    """One setting: the Loader serving `ds` with `crop` and `flip` for `seconds` after `warmup`, with the
    decode paths its crops took over the whole run."""
    from ..serve.loader import Loader

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = Loader(ds, batch, shuffle=True, num_workers=workers, crop=crop, flip=flip)
    nbytes = sample_bytes(ds, crop)
    passes = [0]
    gen = _cycle(loader, passes)
    try:
        t_end = time.perf_counter() + warmup
        while time.perf_counter() < t_end:
            next(gen)
        pids = [os.getpid(), *loader.worker_pids()]
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
        paths = decode_counts(loader, passes[0])
    finally:
        gen.close()
        loader.close()
    return Run(path, workers, batch, n / wall, n * nbytes / wall / 1e6, cpu, pss, wait / wall, window_rates(marks), paths)


def decode_counts(loader, passes: int) -> dict[str, int]:
    """How the crops of every epoch a run served (warm-up included) were decoded, summed over the workers."""
    from ..errors import DataprepError

    out: dict[str, int] = {}
    for epoch in range(passes + 1):
        try:
            counts = loader.stats(epoch).get("decode_paths") or {}
        except DataprepError:  # an epoch this loader did not serve
            continue
        for k, v in counts.items():
            out[k] = out.get(k, 0) + v
    return out


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


def fill_rate(ds, batch: int, crop, seconds: float = 0.3, flip: bool = False) -> float:
    """Samples per second one core puts into a preallocated batch through the dataset's own `fill_batch`
    (what the Loader's main process or each worker runs), from the arrays the dataset holds, with the
    workload's crop and flip: the best of several short passes after a warm-up one."""
    from ..serve.request import Request

    req = Request(crop=crop, flip=flip)
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


def limits(ds, paths: list[str], batch: int, crop, pack: Path, cores: int, flip: bool = False) -> dict[str, float]:
    """This machine's limits for this pack: for gather paths the dataset's batch fill on one core
    (samples/s) and the memory copy bandwidth of all cores (MB/s); for decode paths the single-core decode
    rate of each decoder on whole images (none under a crop plan, which decodes less: run_bench measures
    each path's own fill instead); the file read bandwidth (MB/s); bytes per stored and per served sample."""
    from ..images.codec import DECODERS
    from ..serve.cache import available_ram

    out: dict[str, float] = {"sample_bytes": float(sample_bytes(ds, crop))}
    if any(p not in DECODERS for p in paths):
        out["gather_samples_s"] = fill_rate(ds, batch, crop, flip=flip)
        out["memory_mb_s"] = copy_bandwidth(cores)
    for name in (p for p in paths if p in DECODERS and not is_plan(crop)):
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
              cache: str = "ram", options: dict[str, Any] | None = None, flip: bool = False) -> Report:
    """Bench the workload training runs (the Loader with `crop` and `flip`) on every serving path of
    `pack` that serves it differently, or on those of `paths`.

    Args:
        pack: a pack of any kind.
        workers, batches: the num_workers values [default: 0 up to the cores] and batch sizes [64, 256].
        paths: a JPEG pack's decode= values (any of the registry's), or its one gather path [default: the
            dataset's default decode first, then each that serves this workload differently].
        seconds, warmup: timed and warm-up seconds per setting.
        crop: what Loader(crop=) takes: (H, W), dataprep.RandomResizedCrop or dataprep.CenterCrop [default:
            none; a variable-size image pack: a square of its median shorter side].
        cache: the dataset's cache mode.
        options: more dataset arguments (a token pack's `context`).
        flip: the Loader's random horizontal flip.

    Returns:
        The runs, limits, verdicts and the pick, each with the workload it was timed on.
    """
    import inspect

    from ..errors import DataprepError
    from ..images.codec import DECODERS
    from ..kinds import kind_of
    from ..pack.backends import read_manifest
    from ..serve.request import Request
    from .workload import Workload, image_settings, jpeg_paths

    pack = Path(pack)
    cores = os.cpu_count() or 1
    workers = workers if workers is not None else list(range(cores + 1))
    batches = batches or [64, 256]
    m = read_manifest(pack)
    kind = kind_of(m, pack)
    served = next(iter(kind.served_fields(m, None, pack).values()))
    if (crop is not None or flip) and not hasattr(served, "shapes_name"):
        raise DataprepError(f"{pack}: a {m['kind']!r} pack takes no --crop or --flip (they cut and flip images)")
    default = None
    if getattr(served, "encoding", None) == "jpeg":
        default = inspect.signature(kind.dataset_class()).parameters["decode"].default
        takes = [d for d in DECODERS if DECODERS[d] is not None]
        avail = jpeg_paths(default, Workload(crop).training_crops)
    else:
        takes = avail = [gather_path(served)]
    if paths and any(p not in takes for p in paths):
        raise DataprepError(f"{pack}: serving paths of this pack are {', '.join(takes)}, not {', '.join(p for p in paths if p not in takes)}")
    paths = paths or avail
    base = open_dataset(pack, cache, options or {}, paths[0] if paths[0] in DECODERS else None)
    picked = False
    if crop is None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                base.batch_layout(Request())
        except DataprepError:
            if not hasattr(base, "shapes"):
                raise
            side = int(np.median(base.shapes[:, :2].min(axis=1)))  # images of many sizes: the Loader needs a crop
            crop, picked = (side, side), True
    resolution, resize = image_settings(m) if hasattr(served, "shapes_name") else (None, None)
    work = Workload(crop, flip, resolution, resize, picked, default)
    rep = Report(str(pack), paths, machine={"cores": cores, "load": os.getloadavg(), "cache": cache,
                                            "crop": work.to_dict(None)["crop"], "kind": m["kind"], "samples": len(base)},
                 workload={**work.to_dict(None), "text": work.describe(None)})
    rep.limits = limits(base, paths, max(batches), crop, pack, cores, flip)
    for path in paths:
        ds = base if path == paths[0] else open_dataset(pack, cache, options or {}, path)
        fill_key = f"fill_{path}_samples_s"
        if path in DECODERS and is_plan(crop):  # each path's decode and crop on one core: what a worker runs
            rep.limits[fill_key] = fill_rate(ds, max(batches), crop, flip=flip)
        runs = [measure(ds, path, w, b, seconds, warmup, crop, flip) for b in batches for w in workers]
        rep.runs += runs
        v = verdict(path, runs, rep.limits, cores, cache, work.loader_args())
        if v["notes"]:  # the Loader beat (or nearly beat) a limit: measure it again, now, and keep the higher
            # B023 (noqa below) does not apply: every lambda is called on the next line, in this iteration
            if fill_key in rep.limits:
                again = {fill_key: lambda: fill_rate(ds, max(batches), crop, flip=flip)}  # noqa: B023
            elif path in DECODERS:
                again = {f"decode_{path}_samples_s": lambda: decode_rate(ds, path)}  # noqa: B023
            else:
                again = {"gather_samples_s": lambda: fill_rate(ds, max(batches), crop, flip=flip),  # noqa: B023
                         "memory_mb_s": lambda: copy_bandwidth(cores)}
            rep.limits.update({k: max(rep.limits[k], f()) for k, f in again.items()})
            v = verdict(path, runs, rep.limits, cores, cache, work.loader_args())
        rep.verdicts[path] = v
    rep.machine["load_after"] = os.getloadavg()
    rep.pick = overall_pick(rep.runs, (*rep.machine["load"][:1], *rep.machine["load_after"][:1]), cores,
                            default if default in paths else None)
    if rep.pick:
        rep.pick["workload"] = work.to_dict(rep.pick["path"] if default is not None else None)
        rep.pick["for"] = work.describe(rep.pick["path"] if default is not None else None)
        rep.pick["loader"] = f"Loader(num_workers={rep.pick['workers']}, batch_size={rep.pick['batch']}{work.loader_args()})"
        if default is not None and default not in paths:
            rep.pick["why"] += f"; the default decode={default!r} was not timed (--paths), so the pick is not compared with it"
    return rep


def is_plan(crop) -> bool:
    """Whether `crop` is a crop plan (RandomResizedCrop, CenterCrop), which decodes less than the whole image."""
    from ..images.crops import CenterCrop, RandomResizedCrop

    return isinstance(crop, (RandomResizedCrop, CenterCrop))


def table(rep: Report) -> list[str]:
    """The report as the command prints it: the workload, one row per setting, how crops were decoded, the
    limits, each path's verdict and the pick with the workload it is for."""
    lines = [f"workload: {rep.workload['text']}"] if rep.workload.get("text") else []
    lines += [f"{'path':8s} {'workers':>7s} {'batch':>5s} {'samples/s':>10s} {'MB/s':>8s} {'CPU main':>8s} "
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
    have += [f"{k[5:-10]} decode and crop {v:,.0f}/s per core" for k, v in lim.items() if k.startswith("fill_")]
    if reads_files(lim, cache):
        have.append(f"read {lim['read_mb_s']:,.0f} MB/s")
    elif cache == "mmap":
        have.append(f"read {lim['read_mb_s']:,.0f} MB/s (not a bound: the mapped pack fits in the RAM available, "
                    "so its pages stay in the page cache after the first pass)")
    else:
        have.append(f"read {lim['read_mb_s']:,.0f} MB/s (not a bound: cache={cache!r} holds the pack in RAM, read once at load)")
    lines += decoded_lines(rep)
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
        loader = p.get("loader", f"Loader(num_workers={p['workers']}, batch_size={p['batch']})")
        lines.append(f"pick: {p['path']} with {loader}, {p['samples_s']:,.0f} samples/s; {p['confidence']}: {p['why']}")
        if "for" in p:
            lines.append(f"  for {p['for']}: timed on this workload only (another crop, flip or decode serves at other "
                         "rates: rerun bench with yours)")
        if "default" in p:
            d = p["default"]
            lines.append(f"  the default decode={d['path']!r} served at most {d['samples_s']:,.0f} samples/s (workers="
                         f"{d['workers']}, batch {d['batch']}): the pick is {d['speedup']:.2f}x, beyond noise")
    return lines


def decoded_lines(rep: Report) -> list[str]:
    """How each path's crops were decoded, as shares over its runs (region: the fast decode of the restart
    segments around each box; fast: the whole image, fast; otherwise accurate, at the scale named)."""
    lines = []
    for path in rep.paths:
        counts: dict[str, int] = {}
        for r in (r for r in rep.runs if r.path == path):
            for k, v in r.decode_paths.items():
                counts[k] = counts.get(k, 0) + v
        total = sum(counts.values())
        if total:
            shares = ", ".join(f"{k} {v / total:.0%}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
            lines.append(f"  {path}: {shares}")
    return ["decoded (share of crops):", *lines] if lines else []
