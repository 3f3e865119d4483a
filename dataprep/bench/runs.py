"""A bench's runs: takes a dataset and one setting (serving path, num_workers, batch size, crop, flip),
gives a `Run`: the Loader timed for a bounded time after a warm-up, its samples/s and MB/s, the CPU
seconds per second of its main process and each worker (`cpu_seconds`, from /proc), their memory
(`pss_bytes`), the share of time spent waiting for a batch, the rate over equal parts of the timed run
(`window_rates`: how steady it was) and how its crops were decoded (`decode_counts`). bench/sweep.py
runs every setting through `measure`.
"""
from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass, field

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
