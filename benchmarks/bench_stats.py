"""What Loader.stats() costs (issue 38: under 1 % of throughput): one Loader's epochs with measuring on
beside its epochs with it off (its `measure` switch, what stats=False sets), in interleaved rounds of one
run, on the two packs where a per-batch cost shows most and least.

    .venv/bin/python benchmarks/bench_stats.py [--images 4096] [--rounds 9]

Packs: decoded 32 px images in batches of 32 (a batch is a small gather: per-batch bookkeeping is the
largest share it can be) and 96 px JPEGs through RandomResizedCrop(64) and flips (decoding dominates);
0 and 2 workers. Each figure is the median img/s of `rounds` epochs with the range; the cost is
1 - (median with stats / median without), and its spread is the rounds' own noise.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import dataprep  # noqa: E402
from dataprep import build  # noqa: E402
from dataprep.synthetic import write_tree  # noqa: E402


def epoch_rate(loader) -> float:
    n, t0 = 0, time.perf_counter()
    for batch in loader:
        n += len(batch[0])
    return n / (time.perf_counter() - t0)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench-stats-"))
    try:
        tree = write_tree(tmp / "tree", classes=4, per_class=a.images // 4, sizes=((96, 128), (128, 96)), kind="index", ext=".png")
        build.folder(tree / "train", tmp / "raw", size=32, resize="center-crop", mode="raw")
        build.folder(tree / "train", tmp / "jpeg", size=96)
        cases = [("decoded 32 px, batch 32", "raw", 32, {}),
                 ("JPEG 96 px, RandomResizedCrop(64) + flip, batch 64", "jpeg", 64,
                  {"crop": dataprep.RandomResizedCrop(64), "flip": True})]
        print(f"load average before: {os.getloadavg()[0]:.2f}; {os.cpu_count()} cores; {a.rounds} interleaved rounds")
        for label, pack, batch, opts in cases:
            ds = dataprep.InMemoryImageDataset(tmp / pack)
            for workers in (0, 2):
                # One Loader, measuring switched on and off between epochs: the same ring, workers and pages
                # on both sides (two Loaders differ by where their rings lie, which shows at this rate)
                ld = dataprep.Loader(ds, batch, shuffle=True, num_workers=workers, **opts)
                epoch_rate(ld)  # forks the workers, warms the caches
                rates: dict[bool, list[float]] = {True: [], False: []}
                for r in range(a.rounds):
                    for on in ((True, False) if r % 2 else (False, True)):
                        ld.measure = on
                        rates[on].append(epoch_rate(ld))
                ld.close()
                med = {on: statistics.median(v) for on, v in rates.items()}
                cost = 1 - med[True] / med[False]
                rng = {on: f"{min(v):,.0f}-{max(v):,.0f}" for on, v in rates.items()}
                print(f"{label}, {workers} workers: without stats {med[False]:,.0f} img/s ({rng[False]}), with stats "
                      f"{med[True]:,.0f} ({rng[True]}): cost {100 * cost:+.2f} %")
        print(f"load average after: {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
