"""One copy in RAM (issue 3): total PSS of the training input's processes over a full epoch, per cache mode.

Builds a decoded pack of flat-colour synthetic images (default 5,000 at 512x512x3: 3.9 GB), then for
each cache mode runs a DataLoader epoch with 2 forked workers while sampling the summed proportional
set size (PSS, /proc/PID/smaps_rollup) of the main process and its workers. Compares with the
"list of bytes" Dataset that the common advice writes, and runs two torchrun ranks with 2 workers
each over shm and mmap. Also times loading into RAM against reading the same files plainly.

    .venv/bin/python benchmarks/bench_cache.py [--images 5000] [--size 512] [--keep DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from dataprep.bench.runs import pss_bytes as pss  # noqa: E402


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


class PeakPss:
    """Samples the summed PSS of a process tree every 0.1 s in a thread; `.peak` is the largest sum."""

    def __init__(self, root: int, exclude_root: bool = False):
        self.root, self.exclude_root, self.peak, self._stop = root, exclude_root, 0, threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            pids = descendants(self.root)
            if self.exclude_root:
                pids = pids[1:]
            self.peak = max(self.peak, sum(pss(p) for p in pids))
            time.sleep(0.1)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


class Blank(Dataset):
    """The loader's own cost: interpreter, torch, workers and batches in flight, with no data held."""

    def __init__(self, n, shape):
        self.n, self.shape = n, shape

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.zeros(self.shape, dtype=torch.uint8), 0


class ListOfBytes(Dataset):
    """The common advice: every sample's bytes appended to a Python list, decoded per item."""

    def __init__(self, ds):
        self.items = [ds.image(i).tobytes() for i in range(len(ds))]
        self.shape = tuple(ds.shapes[0])
        self.labels = [int(x) for x in ds.labels]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return torch.frombuffer(bytearray(self.items[i]), dtype=torch.uint8).view(self.shape).permute(2, 0, 1), self.labels[i]


def epoch_peak(ds, epochs: int = 1) -> tuple[int, float]:
    loader = DataLoader(ds, batch_size=64, shuffle=True, num_workers=2, multiprocessing_context="fork")
    t0 = time.perf_counter()
    with PeakPss(os.getpid()) as m:
        for _ in range(epochs):
            for _ in loader:
                pass
    return m.peak, time.perf_counter() - t0


DDP = """
import sys, torch, torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from dataprep.images.dataset import InMemoryImageDataset

class Blank(Dataset):  # the loader's own cost, no data held
    def __init__(self, like):
        self.n, self.shape = len(like), tuple(int(v) for v in like.shapes[0][[2, 0, 1]])
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        return torch.zeros(self.shape, dtype=torch.uint8), 0

dist.init_process_group("gloo")
mode = sys.argv[2]
ds = InMemoryImageDataset(sys.argv[1], cache="mmap" if mode == "blank" else mode, progress=False)
if mode == "blank":
    ds = Blank(ds)
s = DistributedSampler(ds, seed=0)
for _ in DataLoader(ds, batch_size=64, sampler=s, num_workers=2):
    pass
dist.barrier()
dist.destroy_process_group()
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=5000)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3, help="torchrun runs per mode (median reported)")
    ap.add_argument("--keep", default=None, help="Build (or reuse) the pack here instead of a temporary directory.")
    ap.add_argument("--json", default=str(HERE / "results" / "bench_cache.json"))
    a = ap.parse_args()

    from dataprep.images.build import build_images
    from dataprep.images.dataset import InMemoryImageDataset
    from dataprep.images.settings import ImageSettings
    from dataprep.pack.backends import is_pack
    from dataprep.settings import BuildSettings
    from dataprep.sources import scan_imagenet
    from dataprep.synthetic import write_tree

    base = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="dataprep-bench-cache-"))
    pack = base / "pack"
    try:
        if not is_pack(pack):
            src = base / "src"
            if not src.exists():
                write_tree(src, classes=10, per_class=a.images // 10, sizes=((a.size, a.size),), kind="index", ext=".png")
            s = build_images(scan_imagenet(src), pack, BuildSettings(workers=2, overwrite=True),
                             ImageSettings(size=a.size, resize="center-crop", mode="raw"))
            print(f"built {s.written} images in {s.seconds:.1f} s")
        files = [p for p in pack.rglob("*.npy")]
        size = sum(p.stat().st_size for p in files)
        res: dict = {"pack_bytes": size, "images": a.images, "size": a.size, "load_before": os.getloadavg()}
        print(f"pack: {size / 1e9:.2f} GB in {len(files)} files; machine load {os.getloadavg()[0]:.2f}")

        # load speed: into RAM vs plainly reading the same files (both from the page cache, warmed first)
        for p in files:
            p.read_bytes()
        t0 = time.perf_counter()
        buf = bytearray(1 << 24)
        for p in files:
            with open(p, "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass
        plain = time.perf_counter() - t0
        fresh = []  # the same files read into one new buffer of the pack's size: what any RAM cache must do
        for _ in range(3):
            t0 = time.perf_counter()
            whole = np.empty(size, np.uint8)
            mv, pos = memoryview(whole), 0
            for p in files:
                with open(p, "rb", buffering=0) as f:
                    while n := f.readinto(mv[pos:]):
                        pos += n
            fresh.append(time.perf_counter() - t0)
            del whole, mv
        fresh_read = sorted(fresh)[1]
        # The first touch of fresh memory on this VM costs far more than later ones (the hypervisor backs
        # pages on demand): one warm-up load, then the median of three, each into a fresh allocation.
        times = []
        for _ in range(4):
            t0 = time.perf_counter()
            ds = InMemoryImageDataset(pack, cache="ram", progress=False)
            times.append(time.perf_counter() - t0)
            del ds
        load = sorted(times[1:])[1]
        res.update(plain_read_s=plain, fresh_read_s=fresh_read, ram_load_s=load, ram_load_first_s=times[0],
                   load_vs_fresh_read=fresh_read / load)
        print(f"load into RAM {size / load / 1e9:.2f} GB/s (first, cold memory: {size / times[0] / 1e9:.2f} GB/s); "
              f"plain read into one new buffer {size / fresh_read / 1e9:.2f} GB/s ({fresh_read / load:.0%} of it); "
              f"plain read through a reused 16 MB buffer {size / plain / 1e9:.2f} GB/s")

        print("one epoch, batch 64, 2 forked workers; peak total PSS of main + workers:")
        peak, _ = epoch_peak(Blank(len(InMemoryImageDataset(pack, cache="mmap", progress=False)), (3, a.size, a.size)))
        res["pss_no_data"] = peak
        print(f"  the same loader serving blank tensors (its own cost): {peak / 1e9:.2f} GB")
        for mode in ("ram", "mmap", "shm"):
            ds = InMemoryImageDataset(pack, cache=mode, progress=False)
            peak, secs = epoch_peak(ds)
            res[f"pss_{mode}"] = peak
            print(f"  {mode:5s} {peak / 1e9:6.2f} GB = {peak / size:.3f}x the pack, {(peak - res['pss_no_data']) / size:.3f}x "
                  f"net of the loader's own cost  ({len(ds) / secs:,.0f} img/s)")
            del ds
        lob = ListOfBytes(InMemoryImageDataset(pack, cache="mmap", progress=False))
        peak, secs = epoch_peak(lob)
        res["pss_list_of_bytes"] = peak
        print(f"  list of bytes {peak / 1e9:6.2f} GB = {peak / size:.3f}x the pack  ({len(lob) / secs:,.0f} img/s)")
        del lob

        print("two torchrun ranks x 2 workers each; peak total PSS of the ranks and their workers (launcher excluded):")
        script = base / "ddp_epoch.py"
        script.write_text(DDP)
        for mode in ("blank", "shm", "mmap"):
            peaks = []
            for r in range(a.rounds):
                cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
                       "127.0.0.1", "--master_port", str(29533 + r), str(script), str(pack), mode]
                p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                with PeakPss(p.pid, exclude_root=True) as m:
                    _, err = p.communicate()
                if p.returncode:
                    print(err[-2000:])
                    return 1
                peaks.append(m.peak)
            peak = sorted(peaks)[len(peaks) // 2]
            res[f"pss_ddp_{mode}"] = peak
            if mode == "blank":
                print(f"  the same two ranks serving blank tensors (their own cost): {peak / 1e9:.2f} GB")
            else:
                print(f"  {mode:5s} {peak / 1e9:6.2f} GB = {peak / size:.3f}x the pack, "
                      f"{(peak - res['pss_ddp_blank']) / size:.3f}x net of their own cost  (median of {a.rounds}: "
                      + ", ".join(f"{x / size:.3f}" for x in peaks) + ")")
        res["load_after"] = os.getloadavg()
        checks = [(f"PSS {k} <= 1.15x pack", res[f"pss_{k}"] / size, 1.15) for k in ("ram", "mmap", "shm")]
        checks += [(f"PSS 2 ranks {k} <= 1.25x pack", res[f"pss_ddp_{k}"] / size, 1.25) for k in ("shm", "mmap")]
        ok = True
        for name, ratio, limit in checks:
            ok &= ratio <= limit
            print(f"  {name:34s} {ratio:.3f}x  ({'met' if ratio <= limit else 'MISSED'})")
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(res, indent=1))
        return 0 if ok else 1
    finally:
        if not a.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
