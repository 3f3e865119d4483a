"""This machine's limits for a pack: takes a dataset, its serving paths, a batch size and the workload's
crop and flip, gives what each path could serve at most: the dataset's own batch fill on one core
(`fill_rate`), the memory copy bandwidth of all cores (`copy_bandwidth`), each decoder's single-core rate
on the pack's whole images (`decode_rate`), the file read bandwidth, and bytes per stored and per served
sample (`limits`). bench/verdict.py weighs the runs against them.
"""
from __future__ import annotations

import time
import warnings
from pathlib import Path

import numpy as np

from .runs import sample_bytes


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


def is_plan(crop) -> bool:
    """Whether `crop` is a crop plan (RandomResizedCrop, CenterCrop), which decodes less than the whole image."""
    from ..images.crops import CenterCrop, RandomResizedCrop

    return isinstance(crop, (RandomResizedCrop, CenterCrop))
