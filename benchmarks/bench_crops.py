"""Random-resized crops fused with decoding: dataprep.Loader(crop=RandomResizedCrop(224), flip=True) over
JPEG packs at 256 and 512 px and over a multi-resolution pack, against the stock DataLoader with a
per-sample crop measured in the same run, and beside FFCV, run in the same run through the shared harness
(../shared/peers/ffcv_bench.py, in its own venv; interleaved rounds over the photos listed --repeat
times); what each decode path costs on one core and how often each is taken; and the GPU crop over a
fixed-shape raw pack (on CPU here, on CUDA where there is one).

    .venv/bin/python benchmarks/bench_crops.py [--corpus ../shared/corpus/images] [--rounds 3] [--epochs 3]
    .venv/bin/python benchmarks/bench_crops.py --ffcv-only --rounds 3 [--ffcv /tmp/ffcv-venv/bin/python] [--repeat 4]
    .venv/bin/python benchmarks/bench_crops.py --sweep --rounds 3 --epochs 3   # the Loader at 1..cores workers
    .venv/bin/python benchmarks/bench_crops.py --threads --rounds 4             # fill_batch on threads vs processes
    .venv/bin/python benchmarks/bench_crops.py --ffcv-only --busy               # beside FFCV, under load from a second process

Rates are img/s, the median of --rounds rounds; a round is --epochs full epochs timed from the first
request to the last batch. Workers (the Loader's, and the stock DataLoader's persistent ones) are started
by one untimed epoch first. Rounds are interleaved over the cases, so drift in the machine's load hits
every case alike.
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import dataprep  # noqa: E402
from dataprep.images.build import build_images  # noqa: E402
from dataprep.images.codec import decode_cv2, decode_cv2_reduced, decode_fast  # noqa: E402
from dataprep.images.jpegseg import compiled, region_of  # noqa: E402
from dataprep.images.settings import ImageSettings  # noqa: E402
from dataprep.serve.request import Request  # noqa: E402
from dataprep.settings import BuildSettings  # noqa: E402
from dataprep.sources import scan_imagenet  # noqa: E402
from dataprep.synthetic import write_tree  # noqa: E402

BATCH, CROP = 32, 224
# Issue 34's goals against FFCV, measured beside it in the same run (side_by_side); never a quoted figure.
GOAL_VS_FFCV = {256: 1.8, 512: 1.5}
GOAL_VS_STOCK = 2.5  # issue 34: the stock DataLoader with the per-sample path and equivalent transforms


class StockCrop:
    """The stock path's augmentation, per sample: a torchvision-style random box (get_params: area fraction
    uniform in (0.08, 1), log aspect ratio uniform in log(3/4, 4/3), 10 attempts, then the center crop with
    the ratio clamped) cut from the decoded HWC image, cv2.resize INTER_AREA to 224, a flip with p = 0.5;
    gives a CHW uint8 tensor. Python's `random`, which torch seeds per DataLoader worker."""

    def __init__(self, size: int, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
        self.size, self.scale, self.log_ratio = size, scale, (math.log(ratio[0]), math.log(ratio[1]))
        self.ratio = ratio

    def box(self, h: int, w: int) -> tuple[int, int, int, int]:
        area = h * w
        for _ in range(10):
            target = area * random.uniform(*self.scale)
            aspect = math.exp(random.uniform(*self.log_ratio))
            cw, ch = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
            if 0 < cw <= w and 0 < ch <= h:
                return random.randint(0, h - ch), random.randint(0, w - cw), ch, cw
        r = w / h
        if r < self.ratio[0]:
            cw, ch = w, int(round(w / self.ratio[0]))
        elif r > self.ratio[1]:
            ch, cw = h, int(round(h * self.ratio[1]))
        else:
            cw, ch = w, h
        return (h - ch) // 2, (w - cw) // 2, ch, cw

    def __call__(self, img: np.ndarray) -> torch.Tensor:
        import cv2

        t, l, ch, cw = self.box(*img.shape[:2])
        out = cv2.resize(img[t : t + ch, l : l + cw], (self.size, self.size), interpolation=cv2.INTER_AREA)
        if random.random() < 0.5:
            out = out[:, ::-1]
        return torch.from_numpy(np.ascontiguousarray(out)).permute(2, 0, 1)


def epochs_seconds(loader, epochs: int) -> float:
    """Seconds for `epochs` full passes, from the first request to the last batch."""
    t0 = time.perf_counter()
    for _ in range(epochs):
        for _ in loader:
            pass
    return time.perf_counter() - t0


def interleaved(cases: dict, n: int, rounds: int, epochs: int) -> dict[str, float]:
    """Median img/s of each case's loader; one untimed epoch each first (workers started, pages touched)."""
    for loader in cases.values():
        epochs_seconds(loader, 1)
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(rounds):
        for k, loader in cases.items():
            times[k].append(epochs_seconds(loader, epochs))
    return {k: n * epochs / statistics.median(t) for k, t in times.items()}


def per_image(fn, items, rounds: int) -> float:
    """Median seconds an item of fn over all `items` (one core, this process)."""
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for x in items:
            fn(x)
        times.append((time.perf_counter() - t0) / len(items))
    return statistics.median(times)


def fill_cost(ds, rounds: int) -> float:
    """Median seconds an image of ds.fill_batch with a RandomResizedCrop(224) + flip request, whole batches
    of 32 over a shuffled epoch (what Loader(num_workers=0) does, without the Loader around it)."""
    plan = dataprep.RandomResizedCrop(CROP)
    times = []
    for r in range(rounds):
        req = Request(epoch=1000 + r, seed=0, crop=plan, flip=True)
        out = {k: np.empty((BATCH, *shape), dtype) for k, (shape, dtype) in ds.batch_layout(req).items()}
        order = np.random.default_rng(r).permutation(len(ds))
        t0 = time.perf_counter()
        for i in range(0, len(order), BATCH):
            idx = order[i : i + BATCH]
            ds.fill_batch(idx, {k: v[: len(idx)] for k, v in out.items()}, req)
        times.append((time.perf_counter() - t0) / len(order))
    return statistics.median(times)


def stage_costs(ds, rounds: int) -> dict[str, float]:
    """Where a crop's time goes, per image on one core (ms): fill_batch over a shuffled epoch (as
    fill_cost), its stages timed by wrapping the functions the fill calls (the header check, the decode,
    full or reduced, fast or accurate; with decode="fast", `cut`: the header check, finding the restart
    segments and cutting the box's out (jpegseg.region_of: in C where images/_jpegseg.c is built); the
    resample of the box into the batch row, the flip); `bookkeeping` is the rest of the fill (Python per
    image and per batch: boxes, paths, views). Wrappers cost ~0.3 us a call."""
    import dataprep.images.batches as batches
    import dataprep.images.codec as codec

    spent: dict[str, float] = {"header": 0.0, "cut": 0.0, "decode": 0.0, "resample": 0.0, "flip": 0.0}

    def timed(stage, fn):
        def run(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[stage] += time.perf_counter() - t0
        return run

    patches = [(batches, "jpeg_refusal", "header"), (batches, "decode_cv2_reduced", "decode"), (batches, "decode_fast", "decode"),
               (batches, "region_of", "cut"), (batches.crops, "apply", "resample"),
               (batches.resample, "warp_into", "resample"), (batches.resample, "bilinear_window_into", "resample"),
               (batches.crops, "flip_into", "flip")]
    saved = [(mod, name, getattr(mod, name)) for mod, name, _ in patches]
    whole = ds.decode  # the whole-image decoder `image(i)` calls: the dataset's own decode= value's
    saved_whole = codec.DECODERS[whole]
    try:
        for mod, name, stage in patches:
            setattr(mod, name, timed(stage, getattr(mod, name)))
        codec.DECODERS[whole] = timed("decode", saved_whole)
        totals = []
        for _ in range(rounds):
            for k in spent:
                spent[k] = 0.0
            total = fill_cost(ds, 1) * len(ds)
            totals.append((total, dict(spent)))
        total, parts = sorted(totals, key=lambda t: t[0])[len(totals) // 2]  # the median round, whole
    finally:
        for mod, name, fn in saved:
            setattr(mod, name, fn)
        codec.DECODERS[whole] = saved_whole
    n = len(ds)
    out = {k: 1e3 * v / n for k, v in parts.items()}
    out["bookkeeping"] = 1e3 * (total - sum(parts.values())) / n
    out["fill"] = 1e3 * total / n
    return out


def handoff_cost(ds, fill_ms: float, epochs: int) -> dict[str, float]:
    """What the Loader adds to a fill: per image, the wall time of Loader(num_workers=1) (one worker fills,
    the training process only receives) against the same fill in this process; the difference is the
    request, the pipe, the ring and the tensors (IPC and copies)."""
    ld = dataprep.Loader(ds, BATCH, shuffle=True, num_workers=1, crop=dataprep.RandomResizedCrop(CROP), flip=True)
    epochs_seconds(ld, 1)
    wall = statistics.median(epochs_seconds(ld, 1) for _ in range(max(epochs, 3)))
    ld.close()
    per = 1e3 * wall / len(ds)
    return {"loader_1_worker": per, "handoff": per - fill_ms}


def region_candidate(ds, rounds: int) -> dict | None:
    """The region (partial) decode candidate: nvImageCodec's libjpeg-turbo CPU decoder (pip wheels for
    Linux x86-64 and aarch64, no GPU needed) decoding only each RandomResizedCrop(224) box, against OpenCV's
    full decode of the same images, one core, interleaved; None where nvImageCodec does not import."""
    try:
        from nvidia import nvimgcodec as nv
    except Exception:  # noqa: BLE001 - any import failure means: not measurable here
        return None
    import cv2

    dec = nv.Decoder(device_id=nv.NVIMGCODEC_DEVICE_CPU_ONLY, max_num_cpu_threads=1,
                     backends=[nv.Backend(nv.BackendKind.CPU_ONLY)])
    params = nv.DecodeParams(color_spec=nv.ColorSpec.SRGB, apply_exif_orientation=False)
    bufs = [np.asarray(ds.stored(i)) for i in range(len(ds))]
    boxes = dataprep.RandomResizedCrop(CROP).boxes(ds.shapes[:, 0], ds.shapes[:, 1], (0, 0), np.arange(len(ds)))

    def region(k):
        t, l, h, w = (int(v) for v in boxes[k])
        stream = nv.CodeStream(bufs[k]).get_sub_code_stream(region=nv.Region(t, l, t + h, l + w))
        return np.asarray(dec.decode(stream, params=params).cpu())

    same = all(np.array_equal(region(k), cv2.imdecode(bufs[k], cv2.IMREAD_COLOR_RGB)[t : t + h, l : l + w])
               for k, (t, l, h, w) in enumerate(boxes[:32]))
    full, part = [], []
    for _ in range(rounds):
        full.append(per_image(lambda b: cv2.imdecode(b, cv2.IMREAD_COLOR_RGB), bufs, 1))
        part.append(per_image(region, range(len(bufs)), 1))
    return {"full_ms": 1e3 * statistics.median(full), "region_ms": 1e3 * statistics.median(part), "identical": same}


def path_shares(ds) -> dict[str, float] | None:
    """Percent of crops by decode path over one epoch of Loader(num_workers=0), from ds.decode_paths."""
    if not hasattr(ds, "decode_paths"):
        return None
    ds.decode_paths.clear()
    loader = dataprep.Loader(ds, BATCH, shuffle=True, num_workers=0, crop=dataprep.RandomResizedCrop(CROP), flip=True)
    for _ in loader:
        pass
    total = sum(ds.decode_paths.values()) or 1
    return {k: 100.0 * v / total for k, v in sorted(ds.decode_paths.items(), key=lambda kv: -kv[1])}


def gpu_module():
    """dataprep.gpu (the GPU crop); None where it cannot be imported."""
    try:
        gpu = importlib.import_module("dataprep.gpu")
    except ImportError:
        return None
    return gpu if hasattr(gpu, "RandomResizedCrop") else None


def gpu_crop(raw_pack: Path, rounds: int, threads: int) -> dict:
    """Gather + crop on the fixed-shape raw pack: Loader(indices=True) in the main process, then
    dataprep.gpu.RandomResizedCrop(224, flip=True)(images, indices, epoch), per device; median of `rounds`
    epochs after an untimed one (kernels loaded, pages touched). On CPU with `threads` torch threads."""
    gpu = gpu_module()
    if gpu is None:
        return {"missing": "dataprep.gpu.RandomResizedCrop cannot be imported here (dataprep/gpu.py)"}
    ds = dataprep.InMemoryImageDataset(raw_pack)
    try:
        loader = dataprep.Loader(ds, BATCH, shuffle=True, indices=True)
    except TypeError as e:
        return {"missing": f"Loader(indices=True) is not accepted yet: {e}"}
    crop = gpu.RandomResizedCrop(CROP, flip=True)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    res: dict = {"cpu_threads": threads}
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    for dev in devices:
        crop = crop.to(dev)
        sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
        whole, alone = [], []
        for r in range(rounds + 1):
            n, crop_s = 0, 0.0
            t0 = time.perf_counter()
            for images, _labels, indices in loader:
                images = images.to(dev, non_blocking=True)
                sync()
                t1 = time.perf_counter()
                out = crop(images, indices, loader.epoch)
                sync()
                crop_s += time.perf_counter() - t1
                n += len(images)
            if r:
                whole.append(n / (time.perf_counter() - t0))
                alone.append(n / crop_s)
        res[dev] = {"gather_crop": statistics.median(whole), "crop_only": statistics.median(alone),
                    "out": [list(out.shape[1:]), str(out.dtype)]}
    torch.set_num_threads(before)
    if not torch.cuda.is_available():
        res["cuda"] = None
    return res


def ffcv_round(python: str, src: Path, size: int, epochs: int, repeat: int, out: Path) -> dict:
    """One run of the shared FFCV harness (../shared/peers/ffcv_bench.py) in its own venv: its JSON line."""
    harness = HERE.parents[1] / "shared" / "peers" / "ffcv_bench.py"
    cmd = [python, str(harness), str(src), "--size", str(size), "--crop", "rrc", "--workers", "2", "--batch", str(BATCH),
           "--epochs", str(epochs), "--repeat", str(repeat), "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def loader_round(ds, epochs: int) -> list[float]:
    """The Loader's img/s in each of `epochs` epochs, as FFCV's harness times its own (epoch by epoch)."""
    ld = dataprep.Loader(ds, BATCH, shuffle=True, num_workers=2, crop=dataprep.RandomResizedCrop(CROP), flip=True)
    rates = []
    for _ in range(epochs):
        n, t = 0, time.perf_counter()
        for images, _labels in ld:
            n += len(images)
        rates.append(n / (time.perf_counter() - t))
    ld.close()
    return rates


def threads_against_processes(pack: Path, rounds: int, epochs: int) -> dict:
    """ds.fill_batch of RandomResizedCrop(224) + flip batches from a pool of 1..cores+1 threads, each batch
    into its own buffers (a thread-backed Loader without its bookkeeping: its ceiling), and the
    thread-backed Loader itself (Loader(threads=True), 2 threads), against Loader(num_workers=2)
    processes; interleaved rounds of `epochs` epochs, img/s."""
    from concurrent.futures import ThreadPoolExecutor

    ds = dataprep.InMemoryImageDataset(pack)
    plan = dataprep.RandomResizedCrop(CROP)
    layout = ds.batch_layout(Request(crop=plan, flip=True))
    n = len(ds) * epochs
    counts = list(range(1, (os.cpu_count() or 1) + 2))
    pools = {t: ThreadPoolExecutor(t) for t in counts}
    ld = dataprep.Loader(ds, BATCH, shuffle=True, num_workers=2, crop=plan, flip=True)
    lt = dataprep.Loader(ds, BATCH, shuffle=True, num_workers=2, crop=plan, flip=True, threads=True)

    def threaded(t: int, r: int) -> float:
        req = Request(epoch=r, crop=plan, flip=True)
        order = np.random.default_rng(r).permutation(n) % len(ds)
        bufs = [{k: np.empty((BATCH, *shape), dt) for k, (shape, dt) in layout.items()} for _ in range(2 * t)]
        t0 = time.perf_counter()
        jobs = [pools[t].submit(ds.fill_batch, order[i : i + BATCH],
                                {k: v[: len(order[i : i + BATCH])] for k, v in bufs[(i // BATCH) % len(bufs)].items()}, req)
                for i in range(0, n, BATCH)]
        for j in jobs:
            j.result()
        return n / (time.perf_counter() - t0)

    epochs_seconds(ld, 1)
    epochs_seconds(lt, 1)
    rates: dict[str, list[float]] = {f"{t} threads": [] for t in counts} | {"Loader, 2 threads": [], "Loader, 2 processes": []}
    for r in range(rounds):
        for t in counts:
            rates[f"{t} threads"].append(threaded(t, r))
        rates["Loader, 2 threads"].append(len(ds) * epochs / epochs_seconds(lt, epochs))
        rates["Loader, 2 processes"].append(len(ds) * epochs / epochs_seconds(ld, epochs))
    ld.close()
    lt.close()
    for p in pools.values():
        p.shutdown()
    print(f"\nthreads against processes, 256 px pack ({len(ds)} images x {epochs}), {rounds} interleaved rounds, "
          f"load {os.getloadavg()[0]:.2f}:")
    for k, v in rates.items():
        print(f"  {k:20s} median {statistics.median(v):7,.0f} img/s (range {min(v):,.0f}-{max(v):,.0f})")
    return {k: statistics.median(v) for k, v in rates.items()}


def worker_sweep(pack: Path, rounds: int, epochs: int) -> dict:
    """The Loader (RandomResizedCrop(224) + flip, batch 32) at 1, 2, ... cores workers over one pack,
    interleaved rounds; each against its ceiling, workers x the one-core fill rate (at most the cores)."""
    ds = dataprep.InMemoryImageDataset(pack)
    counts = list(range(1, (os.cpu_count() or 1) + 1))
    one = 1.0 / fill_cost(ds, rounds)
    cases = {f"{w} workers": dataprep.Loader(ds, BATCH, shuffle=True, num_workers=w, crop=dataprep.RandomResizedCrop(CROP), flip=True)
             for w in counts}
    rates = interleaved(cases, len(ds), rounds, epochs)
    for ld in cases.values():
        ld.close()
    cores = os.cpu_count() or 1
    print(f"\nworker sweep, 256 px pack ({len(ds)} images), median of {rounds} rounds of {epochs} epochs; one-core fill "
          f"{one:,.0f} img/s; load {os.getloadavg()[0]:.2f}:")
    out = {"one_core_fill": one, "rates": {}}
    for w in counts:
        r = rates[f"{w} workers"]
        ceiling = min(w, cores) * one
        out["rates"][w] = r
        print(f"  {w:2d} workers  {r:8,.0f} img/s  {r / w:7,.0f} per worker  {100 * r / ceiling:5.1f} % of {ceiling:,.0f}")
    return out


def side_by_side(python: str, src: Path, tmp: Path, rounds: int, epochs: int, repeat: int) -> dict:
    """FFCV and the Loader over the same photos (each listed `repeat` times), crop and flip, batch 32, 2
    threads against 2 workers, in interleaved rounds (FFCV 256, Loader 256, FFCV 512, Loader 512, Loader
    multi-res; again): each side's rate is the median of its epochs after the first (FFCV's harness starts
    its loader in the first), both sides timed the same way; the ratio is of the medians over rounds."""
    packs = repeated_packs(src, tmp, repeat)
    ds = {256: dataprep.InMemoryImageDataset(packs[256]), 512: dataprep.InMemoryImageDataset(packs[512]),
          "multi": dataprep.InMemoryImageDataset(packs["multi"], resolution="all")}
    got: dict[str, list[float]] = {k: [] for k in ("FFCV 256", "Loader 256", "FFCV 512", "Loader 512", "Loader multi-res 512")}
    loads = [os.getloadavg()[0]]
    for r in range(rounds):
        for s in (256, 512):
            f = ffcv_round(python, src, s, epochs, repeat, tmp / "ffcv")
            got[f"FFCV {s}"].append(float(f["img_s"]))
            got[f"Loader {s}"].append(statistics.median(loader_round(ds[s], epochs)[1:]))
        got["Loader multi-res 512"].append(statistics.median(loader_round(ds["multi"], epochs)[1:]))
        loads.append(os.getloadavg()[0])
        print(f"  round {r + 1}: " + ", ".join(f"{k} {v[-1]:,.0f}" for k, v in got.items()) + f" (load {loads[-1]:.2f})", flush=True)
    med = {k: statistics.median(v) for k, v in got.items()}
    return {"images": len(ds[256]), "repeat": repeat, "rounds": rounds, "epochs": epochs, "img_s": got, "median": med,
            "ratio_256": med["Loader 256"] / med["FFCV 256"],
            "ratio_512": max(med["Loader 512"], med["Loader multi-res 512"]) / med["FFCV 512"], "load": loads}


def repeated_packs(src: Path, tmp: Path, repeat: int) -> dict:
    """Packs at 256 px, 512 px and 128/256/512 px of the photos under `src` listed `repeat` times (a
    path list: epochs long enough to time), once per tmp folder."""
    from dataprep import build as front

    if (tmp / "rep256").exists():
        return {256: tmp / "rep256", 512: tmp / "rep512", "multi": tmp / "repmulti"}
    files = [p for p in sorted(src.rglob("*")) if p.is_file()]
    listing = tmp / "repeated.csv"
    listing.write_text("".join(f"{p},{p.parent.name}\n" for p in files) * repeat)
    return {256: front.list(listing, tmp / "rep256", root="/", size=256, workers=2).out,
            512: front.list(listing, tmp / "rep512", root="/", size=512, workers=2).out,
            "multi": front.list(listing, tmp / "repmulti", root="/", sizes=(128, 256, 512), workers=2).out}


def build(root: Path, out: Path, **image) -> Path:
    build_images(scan_imagenet(root), out, BuildSettings(workers=2), ImageSettings(**image), progress=False)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=str(HERE.parents[1] / "shared" / "corpus" / "images"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3, help="full epochs a round (356 images make a short epoch)")
    ap.add_argument("--json", default=str(HERE / "results" / "bench_crops.json"))
    ap.add_argument("--ffcv", default="/tmp/ffcv-venv/bin/python",
                    help="the python of FFCV's venv (bash ../shared/peers/setup.sh makes it); absent: no side-by-side run")
    ap.add_argument("--repeat", type=int, default=4,
                    help="every photo listed this many times (epochs long enough to time): beside FFCV, and against the stock DataLoader")
    ap.add_argument("--ffcv-only", action="store_true", help="run only the side-by-side rounds against FFCV")
    ap.add_argument("--no-ffcv", action="store_true", help="leave the side-by-side rounds against FFCV out")
    ap.add_argument("--threads", action="store_true",
                    help="run only threads against processes: fill_batch from a thread pool (1..cores+1 threads, batches "
                         "filled in place, no IPC: a thread-backed Loader at best) against the Loader's 2 worker processes")
    ap.add_argument("--sweep", action="store_true",
                    help="run only the worker sweep: the Loader at 1..cores workers over the 256 px pack, img/s and per worker")
    ap.add_argument("--pure", action="store_true",
                    help="without the compiled part (images/_jpegseg.c): Python region cuts, kept sources without restart markers")
    ap.add_argument("--busy", action="store_true",
                    help="under load from a second process: one more process spins a core (a Python loop) for the whole "
                         "run, and is stopped at the end")
    a = ap.parse_args()
    busy = None
    if a.busy:  # started first, so that every round, FFCV's and ours, runs beside it
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        print(f"under load: a second process (pid {busy.pid}) spins one core for the whole run")
    try:
        return run(a)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()


def run(a) -> int:
    if a.pure:
        import dataprep.images.jpegseg as jpegseg

        jpegseg._jpegseg = None  # before the packs are built: their kept sources stay as they were
    torch.set_num_threads(1)
    import cv2

    cv2.setNumThreads(0)
    load0 = os.getloadavg()
    print(f"load average at the start: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} ({os.cpu_count()} cores)")
    print("compiled part (images/_jpegseg.c): " + ("built" if compiled() else "not used: Python region cuts, kept sources without markers"))
    tmp = Path(tempfile.mkdtemp(prefix="dataprep-bench-crops-"))
    res: dict = {"load_before": load0, "compiled": compiled(), "busy": a.busy, "batch": BATCH, "crop": CROP, "rounds": a.rounds, "epochs": a.epochs}
    try:
        root = Path(a.corpus)
        if (root / "train").is_dir():
            what = f"the corpus at {root}"
        else:
            print(f"no corpus at {root} (no train/ folder): synthetic photos instead (dataprep.synthetic.write_tree)")
            root = write_tree(tmp / "src", classes=4, per_class=89)
            what = "synthetic photos"
        if a.threads:
            res["threads"] = threads_against_processes(build(root, tmp / "p256", size=256), a.rounds, max(a.epochs, 4))
            return 0
        if a.sweep:
            res["sweep"] = worker_sweep(build(root, tmp / "p256", size=256), a.rounds, a.epochs)
            if a.json:
                Path(a.json).parent.mkdir(parents=True, exist_ok=True)
                Path(a.json).with_name("bench_crops_sweep.json").write_text(json.dumps(res, indent=1, default=str))
            return 0
        if a.no_ffcv:
            pass
        elif Path(a.ffcv).exists() and (root / "train").is_dir():
            print(f"\nbeside FFCV ({a.ffcv}), {root / 'train'} listed {a.repeat} times, RandomResizedCrop({CROP}) + flip, "
                  f"batch {BATCH}, 2 threads / 2 workers, {a.rounds} interleaved rounds of {max(a.epochs, 3)} epochs:", flush=True)
            sbs = side_by_side(a.ffcv, root / "train", tmp, a.rounds, max(a.epochs, 3), a.repeat)
            res["beside_ffcv"] = sbs
            for k, v in sbs["img_s"].items():
                print(f"  {k:22s} median {sbs['median'][k]:7,.0f} img/s (range {min(v):,.0f}-{max(v):,.0f})")
            print(f"  Loader / FFCV: {sbs['ratio_256']:.2f}x at 256 px, {sbs['ratio_512']:.2f}x at 512 px (best of plain and "
                  f"multi-res); load {min(sbs['load']):.2f}-{max(sbs['load']):.2f}")
        else:
            print(f"\nnot beside FFCV: no {a.ffcv} (bash ../shared/peers/setup.sh makes it) or no {root / 'train'}")
        if a.ffcv_only:
            if a.json and "beside_ffcv" in res:
                Path(a.json).parent.mkdir(parents=True, exist_ok=True)
                Path(a.json).write_text(json.dumps(res, indent=1, default=str))
            return 0
        t0 = time.perf_counter()
        if (root / "train").is_dir() and a.repeat > 1:  # the photos listed --repeat times, as beside FFCV
            packs = repeated_packs(root / "train", tmp, a.repeat)
        else:
            packs = {256: build(root, tmp / "p256", size=256), 512: build(root, tmp / "p512", size=512),
                     "multi": build(root, tmp / "pmulti", sizes=(128, 256, 512))}
        packs["raw"] = build(root, tmp / "raw256", size=256, resize="center-crop", mode="raw")
        res["build_s"] = time.perf_counter() - t0
        ds = {256: dataprep.InMemoryImageDataset(packs[256]), 512: dataprep.InMemoryImageDataset(packs[512]),
              "multi": dataprep.InMemoryImageDataset(packs["multi"], resolution="all")}
        n = len(ds[256])
        res["images"] = n
        print(f"{n} images from {what}; packs built (JPEG q90: 256 px, 512 px, 128/256/512 px; raw 256x256) "
              f"in {res['build_s']:.0f} s")

        # -- throughput: Loader vs stock DataLoader, interleaved rounds -----------------------------
        def ours(d):
            return dataprep.Loader(d, BATCH, shuffle=True, num_workers=2, crop=dataprep.RandomResizedCrop(CROP), flip=True)

        cases = {"Loader 256": ours(ds[256]), "Loader 512": ours(ds[512]), "Loader multi-res 512": ours(ds["multi"])}
        for s in (256, 512):
            stock_ds = dataprep.InMemoryImageDataset(packs[s], as_numpy=True, transform=StockCrop(CROP))
            for w in (0, 1, 2):
                cases[f"stock {s} w{w}"] = DataLoader(stock_ds, batch_size=BATCH, shuffle=True, num_workers=w,
                                                      persistent_workers=w > 0)
        rates = interleaved(cases, n, a.rounds, a.epochs)
        for loader in cases.values():
            if hasattr(loader, "close"):
                loader.close()
        del cases
        res["rates"] = rates
        stock_best = {s: max((rates[f"stock {s} w{w}"], w) for w in (0, 1, 2)) for s in (256, 512)}
        print(f"\nRandomResizedCrop(224) + flip, batch {BATCH}, img/s, median of {a.rounds} rounds of {a.epochs} epochs:")
        for k, r in rates.items():
            print(f"  {k:24s} {r:8,.0f}")

        # -- what each decode path costs, one core, this process ------------------------------------
        big = ds[512]
        bufs = [big.stored(i) for i in range(n)]
        boxes = dataprep.RandomResizedCrop(CROP).boxes(big.shapes[:, 0], big.shapes[:, 1], (0, 0), np.arange(n))

        def box_fast(k):  # what decode="fast" decodes for a crop: the restart segments around its box (a kept source: all)
            t, l, h, w = (int(v) for v in boxes[k])
            buf = np.asarray(bufs[k])
            sub = region_of(buf, t - 2, t + h + 2, l - 2, l + w + 2)[2]
            decode_fast(buf if sub is None else sub, 3)

        cost = {"full decode": per_image(lambda b: decode_cv2(b, 3), bufs, a.rounds),
                "full decode, fast": per_image(lambda b: decode_fast(np.asarray(b), 3), bufs, a.rounds),
                "box region, fast": per_image(box_fast, range(n), a.rounds),
                "1/2 decode": per_image(lambda b: decode_cv2_reduced(b, 3, 2), bufs, a.rounds),
                "1/4 decode": per_image(lambda b: decode_cv2_reduced(b, 3, 4), bufs, a.rounds),
                "crop, 512 pack": fill_cost(big, a.rounds),
                "crop, multi-res": fill_cost(ds["multi"], a.rounds),
                "crop, 256 pack": fill_cost(ds[256], a.rounds)}
        res["per_image_ms"] = {k: 1e3 * v for k, v in cost.items()}
        shares = {"512 pack": path_shares(ds[512]), "multi-res pack": path_shares(ds["multi"]),
                  "256 pack": path_shares(ds[256])}
        res["decode_paths_pct"] = shares
        print(f"\nper image on one core (main process), over the 512 pack's {n} images, median of {a.rounds}:")
        for k, v in cost.items():
            print(f"  {k:18s} {1e3 * v:6.2f} ms  ({1 / v:6,.0f} img/s)")
        print("  (the 1/2 and 1/4 decodes and the full one are OpenCV's accurate decode; 'fast': simplejpeg's fast IDCT "
              "and upsampling; the box region: a RandomResizedCrop(224) box's restart segments, as decode='fast' crops)")
        reg = region_candidate(big, a.rounds)
        res["region_candidate"] = reg
        if reg is None:
            print("  region decode (nvImageCodec's libjpeg-turbo on CPU): not measured, nvidia-nvimgcodec-cu12 "
                  "not installed (OpenCV and Pillow have no region decode)")
        else:
            print(f"  region decode, candidate (nvImageCodec's libjpeg-turbo on CPU, only the box): {reg['region_ms']:.2f} ms "
                  f"vs OpenCV's full decode {reg['full_ms']:.2f} ms, interleaved: {reg['region_ms'] / reg['full_ms']:.2f}x "
                  f"the cost; pixels {'identical to' if reg['identical'] else 'DIFFERENT from'} the full decode's box "
                  "(not a path the Loader takes: see docs/serving.md)")
        print("\nwhere a crop's time goes, per image on one core, ms (fill_batch's stages; median round of "
              f"{a.rounds}); then what the Loader adds (1 worker filling, the training process receiving):")
        res["stages_ms"] = {}
        for name, d in (("256 pack", ds[256]), ("512 pack", big), ("multi-res pack", ds["multi"])):
            st = stage_costs(d, a.rounds)
            st.update(handoff_cost(d, st["fill"], a.epochs))
            res["stages_ms"][name] = st
            print(f"  {name:15s} fill {st['fill']:.3f} = decode {st['decode']:.3f} + resample {st['resample']:.3f} + flip "
                  f"{st['flip']:.3f} + header {st['header']:.3f} + cut {st['cut']:.3f} + "
                  f"bookkeeping {st['bookkeeping']:.3f}; Loader(1 worker) "
                  f"{st['loader_1_worker']:.3f}: handoff {st['handoff']:+.3f}")
        print("decode paths taken over one epoch of Loader(num_workers=0), % of crops:")
        for k, sh in shares.items():
            print(f"  {k:15s} " + ("(the dataset counts no decode paths)" if sh is None else
                                    ", ".join(f"{p} {v:.1f}%" for p, v in sh.items())))

        # -- GPU crop on a fixed-shape raw pack -----------------------------------------------------
        g = gpu_crop(packs["raw"], a.rounds, min(2, os.cpu_count() or 1))
        res["gpu_crop"] = g
        print(f"\nGPU crop, raw 256x256 pack: Loader(indices=True) + dataprep.gpu.RandomResizedCrop({CROP}, flip=True), "
              f"median of {a.rounds} epochs:")
        if "missing" in g:
            print(f"  not measured: {g['missing']}")
        else:
            for dev in ("cpu", "cuda"):
                if g.get(dev) is None:
                    print(f"  {dev:4s}: no CUDA device on this machine; not measured")
                    continue
                where = f"cpu, {g['cpu_threads']} torch threads" if dev == "cpu" else "cuda"
                print(f"  {where:20s}: gather + crop {g[dev]['gather_crop']:8,.0f} img/s, crop alone "
                      f"{g[dev]['crop_only']:8,.0f} img/s (a sample out: {tuple(g[dev]['out'][0])} {g[dev]['out'][1]})")

        # -- summary ----------------------------------------------------------------------------------
        load1 = os.getloadavg()
        res["load_after"] = load1
        rows = [("256 px", rates["Loader 256"], 256, cost["crop, 256 pack"]),
                ("512 px", rates["Loader 512"], 512, cost["crop, 512 pack"]),
                ("512 px multi-res", rates["Loader multi-res 512"], 512, cost["crop, multi-res"])]
        print("\nsummary (img/s; 2-core ideal: 2 x the 1-core crop rate above):")
        print(f"  {'storage':17s} {'Loader':>7s} {'2-core ideal':>13s} {'stock best':>14s} {'vs stock':>9s}")
        checks = []
        for name, r, s, c in rows:
            sb, w = stock_best[s]
            vs_stock = r / sb
            print(f"  {name:17s} {r:7,.0f} {2 / c:7,.0f} ({r * c / 2:3.0%}) {sb:8,.0f} (w{w}) {vs_stock:8.2f}x")
            checks.append((f"{name}: Loader vs stock DataLoader (best of 0/1/2 workers)", vs_stock, GOAL_VS_STOCK))
        if "beside_ffcv" in res:
            checks += [(f"{s} px: Loader vs FFCV beside it (medians of {a.rounds} interleaved rounds)", res["beside_ffcv"][f"ratio_{s}"],
                        GOAL_VS_FFCV[s]) for s in (256, 512)]
        ok = True
        for name, ratio, goal in checks:
            ok &= ratio >= goal
            print(f"  {name:68s} {ratio:5.2f}x  (goal >= {goal}x: {'met' if ratio >= goal else 'MISSED'})")
        res["checks"] = [{"name": c, "ratio": r, "goal": g_} for c, r, g_ in checks]
        print(f"load average {load0[0]:.2f} -> {load1[0]:.2f} (1 min; 5 min {load0[1]:.2f} -> {load1[1]:.2f}) "
              f"on {os.cpu_count()} cores")
        if a.json:
            Path(a.json).parent.mkdir(parents=True, exist_ok=True)
            Path(a.json).write_text(json.dumps(res, indent=1, default=str))
        return 0 if ok else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
