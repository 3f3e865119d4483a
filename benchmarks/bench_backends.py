"""Backends benchmark (issue 5): time to load a pack's split into RAM from npy, HDF5 and Zarr, next to
reading the same bytes with plain file reads in the same run (the backend's own files: its .h5 file,
its npy shards, its Zarr chunks; and, for reference, the npy shard files), and each backend's size on
disk with and without compression.

Files are read warm (from the page cache, as a second epoch or a second job on the node sees them),
for every path alike. Target: uncompressed backends load at >= 70% of the plain-read speed of their
own files.

    .venv/bin/python benchmarks/bench_backends.py [--images 3000] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from dataprep.images.build import build_images  # noqa: E402
from dataprep.images.settings import ImageSettings  # noqa: E402
from dataprep.pack.convert import convert  # noqa: E402
from dataprep.serve.cache import open_split  # noqa: E402
from dataprep.settings import BuildSettings  # noqa: E402
from dataprep.sources import scan_imagenet  # noqa: E402
from dataprep.synthetic import write_tree  # noqa: E402

VARIANTS = [("npy", "none"), ("hdf5", "none"), ("hdf5", "gzip"), ("zarr", "none"), ("zarr", "zstd"), ("zarr", "blosc")]


def disk_bytes(p: Path) -> int:
    return p.stat().st_size if p.is_file() else sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def data_files(p: Path) -> list[Path]:
    """The files that hold a pack's bytes: its one HDF5 file, its npy shard files, or its Zarr chunk files."""
    if p.is_file():
        return [p]
    return sorted(f for f in p.rglob("*") if f.is_file() and f.suffix != ".json")


def plain_read(files: list[Path], total: int) -> float:
    """Read every file's bytes into one preallocated buffer with readinto: the speed the disk/page cache gives."""
    buf = np.empty(total, np.uint8)
    view = memoryview(buf)
    t0, pos = time.perf_counter(), 0
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while True:
                n = fh.readinto(view[pos : pos + (16 << 20)])
                if not n:
                    break
                pos += n
    return time.perf_counter() - t0


def load(pack: Path) -> tuple[float, int]:
    t0 = time.perf_counter()
    c = open_split(pack, "train", cache="ram", progress=False)
    return time.perf_counter() - t0, c.nbytes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        src = write_tree(tmp / "src", classes=10, per_class=a.images // 10, sizes=((300, 400), (256, 340), (420, 300)))
        for kind, image in (("raw 256x256x3", dict(size=256, resize="center-crop", mode="raw")),
                            ("JPEG q90", dict(size=256, resize="center-crop", mode="encoded"))):
            base = tmp / kind.split()[0]
            build_images(scan_imagenet(src), base / "npy", BuildSettings(workers=2), ImageSettings(**image))
            packs = {"npy/none": base / "npy"}
            for fmt, comp in VARIANTS[1:]:
                out = base / f"{fmt}-{comp}{'.h5' if fmt == 'hdf5' else '.zarr'}"
                convert(base / "npy", out, fmt, comp, None)
                packs[f"{fmt}/{comp}"] = out
            npy_files = sorted((base / "npy").rglob("*.npy"))
            npy_total = sum(f.stat().st_size for f in npy_files)
            plain_read(npy_files, npy_total)  # warm
            print(f"\n{kind}: {a.images} images, {npy_total / 1e6:.0f} MB of npy shard files")
            print(f"  {'backend':14s} {'on disk':>10s} {'load s':>8s} {'GB/s':>6s} {'own files s':>12s} {'vs own':>7s} {'vs npy files':>13s}")
            for name, p in packs.items():
                files = data_files(p)
                total = sum(f.stat().st_size for f in files)
                load(p)  # warm the page cache for this backend's files
                loads, plains, npys = [], [], []
                for _ in range(a.rounds):
                    plains.append(plain_read(files, total))
                    npys.append(plain_read(npy_files, npy_total))
                    s, nbytes = load(p)
                    loads.append(s)
                ls, ps, ns = statistics.median(loads), statistics.median(plains), statistics.median(npys)
                frac = ps / ls
                target = ("  (>= 0.70: met)" if frac >= 0.7 else "  (>= 0.70: MISSED)") if name.endswith("/none") else ""
                ok &= not target.endswith("MISSED)")
                print(f"  {name:14s} {disk_bytes(p) / 1e6:8.1f} MB {ls:8.3f} {nbytes / ls / 1e9:6.2f} {ps:12.3f} {frac:6.2f}x "
                      f"{ns / ls:12.2f}x{target}")
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
