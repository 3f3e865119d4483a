"""Resuming and sharding (issue 20): how long a restored Loader takes to serve its first batch deep into
an epoch, what `state_dict()` costs, and the Loader's throughput with rank sharding and with a mixture
against the plain Loader, all measured in this run (medians; ratios printed).

    .venv/bin/python benchmarks/bench_resume.py [--samples 1000000] [--context 64] [--workers 2]

The pack is token windows: random windows of `context` tokens over a generated text, `samples` windows
an epoch. The baselines are the same Loader's first batch at position 0 (what a fresh epoch costs) and
serving every skipped batch to reach the position (what a resume that replays the epoch costs).
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import numpy as np  # noqa: E402

from dataprep.images.crops import RandomResizedCrop  # noqa: E402
from dataprep.serve.loader import Loader  # noqa: E402
from dataprep.serve.mixture import Mixture  # noqa: E402
from dataprep.tokens.dataset import TokenDataset  # noqa: E402
from dataprep.tokens.tokenize import TokenizeSettings, tokenize  # noqa: E402

BATCH = 256


def make_pack(base: Path, name: str, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(2000)]
    text = "\n".join(" ".join(rng.choice(words, 40)) for _ in range(5000))
    (base / f"{name}.txt").write_text(text)
    tokenize([str(base / f"{name}.txt")], base / name, TokenizeSettings(), train_bpe_vocab=1000)
    return base / name


def first_batch(loader: Loader, state: dict | None) -> float:
    t0 = time.perf_counter()
    if state is not None:
        loader.load_state_dict(state)
    next(iter(loader))
    dt = time.perf_counter() - t0
    loader.close()
    return dt


def rate(make, seconds: float) -> float:
    """Samples a second over whole epochs (workers started before the clock)."""
    loader = make()
    it = iter(loader)
    next(it)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for x, _ in it:
            n += len(x)
            if time.perf_counter() - t0 >= seconds:
                break
        else:
            it = iter(loader)
    dt = time.perf_counter() - t0
    loader.close()
    return n / dt


def compare(cases: dict, seconds: float) -> None:
    rates: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(3):  # interleaved rounds, so drift in the machine's load hits every case alike
        for k, make in cases.items():
            rates[k].append(rate(make, seconds))
    plain = statistics.median(rates["plain"])
    for k, r in rates.items():
        m = statistics.median(r)
        print(f"  {k:16s} {m:12,.0f} samples/s  {m / plain:5.2f}x plain  (goal >= 0.95)")


def image_packs(base: Path) -> list:
    from dataprep.images.build import build_images
    from dataprep.images.dataset import InMemoryImageDataset
    from dataprep.images.settings import ImageSettings
    from dataprep.settings import BuildSettings
    from dataprep.sources import scan_imagenet
    from dataprep.synthetic import write_tree

    out = []
    for k in range(2):
        tree = write_tree(base / f"tree{k}", classes=4, per_class=40, sizes=((96, 128), (128, 96), (112, 112)))
        build_images(scan_imagenet(tree), base / f"img{k}", BuildSettings(shard_size=64), ImageSettings(size=64),
                     progress=False)
        out.append(InMemoryImageDataset(base / f"img{k}"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--context", type=int, default=64, help="the resume and state_dict timings' windows")
    ap.add_argument("--contexts", default="64,1024", help="token contexts the throughput comparison runs at")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3.0)
    a = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-resume-"))
    try:
        packs = [make_pack(base, "a", 0), make_pack(base, "b", 1)]
        ds = TokenDataset(packs[0], context=a.context, samples=a.samples)
        print(f"token windows: {len(ds):,} an epoch, context {a.context}, batch {BATCH}, {a.workers} workers, "
              f"load {os.getloadavg()[0]:.2f}")

        def loader(**kw):  # noqa: E306
            return Loader(ds, BATCH, shuffle=True, num_workers=a.workers, **kw)

        at = int(0.9 * a.samples) // BATCH * BATCH
        state = {**loader().state_dict(), "samples_consumed": at}
        fresh = statistics.median(first_batch(loader(), None) for _ in range(a.rounds))
        resumed = statistics.median(first_batch(loader(), state) for _ in range(a.rounds))
        print(f"first batch after load_state_dict at {at:,} of {a.samples:,}: {resumed * 1e3:.0f} ms "
              f"(a fresh epoch's first batch: {fresh * 1e3:.0f} ms; ratio {resumed / fresh:.2f}; goal < 500 ms)")
        replay = loader()
        t0 = time.perf_counter()
        for k, _ in enumerate(replay):
            if (k + 1) * BATCH >= at:
                break
        replay_s = time.perf_counter() - t0
        replay.close()
        print(f"replaying the {at // BATCH:,} skipped batches instead: {replay_s:.1f} s ({replay_s / resumed:.0f}x the resume)")

        mid = Loader(ds, BATCH, shuffle=True)
        it = iter(mid)
        for _ in range(10):
            next(it)
        times = []
        for _ in range(1000):
            t0 = time.perf_counter()
            mid.state_dict()
            times.append(time.perf_counter() - t0)
        print(f"state_dict() mid-epoch: median {statistics.median(times) * 1e6:.1f} us (goal < 1 ms)")

        for context in (int(c) for c in a.contexts.split(",")):
            one = TokenDataset(packs[0], context=context, samples=a.samples)
            mix = Mixture([one, TokenDataset(packs[1], context=context, samples=a.samples)], [0.7, 0.3])
            for workers in (0, a.workers):
                print(f"token windows of {context} (int64; a gather, the cheapest batch there is), {workers} workers:")
                compare({"plain": lambda: Loader(one, BATCH, shuffle=True, num_workers=workers),
                         "rank 0 of 2": lambda: Loader(one, BATCH, shuffle=True, num_workers=workers, rank=0, world_size=2),
                         "mixture 0.7/0.3": lambda: Loader(mix, BATCH, num_workers=workers)}, a.seconds)
        images = image_packs(base)
        crop = dict(crop=RandomResizedCrop(56), flip=True)
        imix = Mixture(images, [0.7, 0.3])
        print(f"JPEG images at 64 px, RandomResizedCrop(56) + flip, batch 64, {a.workers} workers:")
        compare({"plain": lambda: Loader(images[0], 64, shuffle=True, num_workers=a.workers, **crop),
                 "rank 0 of 2": lambda: Loader(images[0], 64, shuffle=True, num_workers=a.workers, rank=0, world_size=2, **crop),
                 "mixture 0.7/0.3": lambda: Loader(imix, 64, num_workers=a.workers, **crop)}, a.seconds)
        print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
