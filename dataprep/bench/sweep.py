"""`dataprep bench`: takes a pack, gives how fast each way of serving it runs on this machine, what limits
it, and which setting to use.

For every serving path that applies (decoded pixels; JPEG decoded by each decoder in the registry),
every `num_workers` and batch size, the fast Loader runs for a bounded time after a warm-up; the
same run measures this machine's limits (gather bandwidth, single-core decode rate of each decoder
on this pack's images, file read bandwidth) and names the bound of each path's best setting.
"""
from __future__ import annotations

import os
import statistics
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


@dataclass
class Report:
    pack: str
    paths: list[str]
    runs: list[Run] = field(default_factory=list)
    limits: dict[str, float] = field(default_factory=dict)
    verdicts: dict[str, dict[str, Any]] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "runs": [asdict(r) for r in self.runs]}


def _cycle(loader):
    while True:
        yield from loader


def measure(ds, path: str, workers: int, batch: int, seconds: float, warmup: float, crop) -> Run:
    from ..serve.loader import Loader

    with warnings.catch_warnings():  # a crop that pads small images is said once by the tool, not per run
        warnings.simplefilter("ignore")
        loader = Loader(ds, batch, shuffle=True, num_workers=workers, crop=crop)
        sample_bytes = sum(int(np.prod(s)) * d.itemsize for s, d in loader._layout(loader.request(0)).values())
    gen = _cycle(loader)
    try:
        t_end = time.perf_counter() + warmup
        while time.perf_counter() < t_end:
            next(gen)
        pids = [os.getpid(), *(p.pid for p in loader._procs)]
        cpu0 = [cpu_seconds(p) for p in pids]
        n, wait = 0, 0.0
        t0 = time.perf_counter()
        while True:
            tw = time.perf_counter()
            b = next(gen)
            wait += time.perf_counter() - tw
            n += len(b[-1])
            if time.perf_counter() - t0 >= seconds:
                break
        wall = time.perf_counter() - t0
        cpu = {("main" if i == 0 else f"worker{i - 1}"): (cpu_seconds(p) - c0) / wall for i, (p, c0) in enumerate(zip(pids, cpu0))}
        pss = sum(pss_bytes(p) for p in pids)
    finally:
        gen.close()
        loader.close()
    return Run(path, workers, batch, n / wall, n * sample_bytes / wall / 1e6, cpu, pss, wait / wall)


def limits(ds, decoders: list[str], batch: int, crop, pack: Path) -> dict[str, float]:
    """This machine's limits for this pack: gather (samples/s into a preallocated batch, one core),
    single-core decode rate per decoder, and file read bandwidth (MB/s)."""
    from ..images.codec import DECODERS

    out: dict[str, float] = {}
    from ..serve.request import Request

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = ds.batch_layout(Request(crop=crop))
    shape = spec["images"][0]
    src = np.random.default_rng(0).integers(0, 255, (max(batch * 4, 256), *shape), dtype=np.uint8)
    dst = np.empty((batch, *shape), np.uint8)
    rates = []
    for _ in range(5):
        idx = np.random.default_rng(len(rates)).integers(0, len(src), batch)
        t0 = time.perf_counter()
        for _ in range(20):
            np.take(src, idx, axis=0, out=dst)
        rates.append(20 * batch / (time.perf_counter() - t0))
    out["gather_samples_s"] = statistics.median(rates)
    if ds.field.encoding == "jpeg":
        k = min(len(ds), 200)
        bufs = [ds._blob[ds._offsets[i] : ds._offsets[i + 1]] for i in range(k)]
        for name in decoders:
            fn = DECODERS[name]
            passes = []
            for _ in range(4):  # the first pass warms caches and is dropped
                t0 = time.perf_counter()
                for b in bufs:
                    fn(b, ds.field.channels)
                passes.append(k / (time.perf_counter() - t0))
            out[f"decode_{name}_samples_s"] = statistics.median(passes[1:])
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
    return out


def verdict(path: str, runs: list[Run], lim: dict[str, float], cores: int) -> dict[str, Any]:
    """Name what bounds a path's best setting, and the setting to use."""
    best = max(runs, key=lambda r: r.samples_s)
    by_w = {r.workers: r.samples_s for r in runs if r.batch == best.batch}
    procs = max(1, best.workers)
    io_limit = lim["read_mb_s"] * 1e6 / max(lim["stored_bytes_per_sample"], 1)
    if path == "pixels":
        limit, kind = lim["gather_samples_s"] * procs, "copy-bound"
    else:
        limit, kind = lim[f"decode_{path}_samples_s"] * procs, "decode-bound"
    more = [w for w in by_w if w > best.workers]
    if best.samples_s >= 0.6 * io_limit and io_limit < limit:
        bound, limit = "I/O-bound", io_limit
    elif best.samples_s >= 0.6 * limit:
        bound = kind
    elif best.workers < cores and not more:
        bound = "worker-starved"
    else:
        bound = "loader overhead"
    rec = f"Loader(num_workers={best.workers}, batch_size={best.batch})" + ("" if path == "pixels" else f" with decode={path!r}")
    if bound == "worker-starved":
        rec += f"; try num_workers={best.workers + 1} and more"
    elif bound == "decode-bound" and best.workers < cores:
        rec += f"; up to {cores} workers (one per core) raise the limit"
    return {"bound": bound, "best_samples_s": best.samples_s, "limit_samples_s": limit,
            "fraction_of_limit": best.samples_s / limit if limit else 0.0, "recommend": rec}


def run_bench(pack: str | os.PathLike, workers: list[int] | None = None, batches: list[int] | None = None,
              paths: list[str] | None = None, seconds: float = 2.0, warmup: float = 0.5, crop=None,
              cache: str = "ram") -> Report:
    from ..images.codec import DECODERS
    from ..images.dataset import InMemoryImageDataset

    pack = Path(pack)
    cores = os.cpu_count() or 1
    workers = workers if workers is not None else list(range(cores + 1))
    batches = batches or [64, 256]
    base = InMemoryImageDataset(pack, cache=cache, progress=False)
    if base.field.encoding == "raw":
        avail = ["pixels"]
    else:
        avail = [d for d in DECODERS if DECODERS[d] is not None]
    paths = [p for p in (paths or avail) if p in avail or p in DECODERS]
    if crop is None and base._pixels is None and len({tuple(s) for s in base.shapes.tolist()}) > 1:
        side = int(np.median(base.shapes[:, :2].min(axis=1)))
        crop = (side, side)
    rep = Report(str(pack), paths, machine={"cores": cores, "load": os.getloadavg(), "cache": cache, "crop": crop})
    rep.limits = limits(base, [p for p in paths if p != "pixels"], max(batches), crop, pack)
    for path in paths:
        ds = base if path == "pixels" else InMemoryImageDataset(pack, decode=path, cache=cache, progress=False)
        runs = [measure(ds, path, w, b, seconds, warmup, crop) for b in batches for w in workers]
        rep.runs += runs
        rep.verdicts[path] = verdict(path, runs, rep.limits, cores)
    rep.machine["load_after"] = os.getloadavg()
    return rep


def table(rep: Report) -> list[str]:
    lines = [f"{'path':8s} {'workers':>7s} {'batch':>5s} {'samples/s':>10s} {'MB/s':>8s} {'CPU main':>8s} "
             f"{'CPU wkrs':>8s} {'PSS MB':>7s} {'waiting':>7s}"]
    for r in rep.runs:
        wk = sum(v for k, v in r.cpu.items() if k != "main")
        lines.append(f"{r.path:8s} {r.workers:7d} {r.batch:5d} {r.samples_s:10,.0f} {r.mb_s:8,.0f} {r.cpu['main']:8.2f} "
                     f"{wk:8.2f} {r.pss_bytes / 1e6:7,.0f} {r.wait_fraction:7.0%}")
    lim = rep.limits
    lines.append(f"limits: gather {lim['gather_samples_s']:,.0f} samples/s per core; read {lim['read_mb_s']:,.0f} MB/s"
                 + "".join(f"; {k[7:-10]} decode {v:,.0f}/s per core" for k, v in lim.items() if k.startswith("decode_")))
    for path, v in rep.verdicts.items():
        lines.append(f"{path}: best {v['best_samples_s']:,.0f} samples/s = {v['fraction_of_limit']:.0%} of its limit "
                     f"({v['limit_samples_s']:,.0f}): {v['bound']}. Use {v['recommend']}")
    return lines
