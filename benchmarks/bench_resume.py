"""Resuming and sharding (issue 20): how long a restored Loader takes to serve its first batch deep into
an epoch, what `state_dict()` costs, and the Loader's throughput with rank sharding and with a mixture
against the plain Loader, all measured in this run (medians; ratios printed).

    .venv/bin/python benchmarks/bench_resume.py [--samples 1000000] [--tokens 24000000] [--workers 2]

The packs are token windows (random windows over a generated text, `samples` windows an epoch) and JPEG
images (4,000 generated photos at 160 px). The plain Loader reads one pack of the whole; the mixture
reads two packs of its halves, so both read the same amount of data (a mixture of two whole-size packs
would also pay for twice the data: random windows over 96 MB instead of 48 miss the CPU's caches and TLB
more, ~10 % of a batch here, which is the data's cost, not the mixture's). The text is large enough (by
default 48 MB of uint16 ids) that no pack fits this machine's last-level cache, as a real corpus does
not. The Loader as rank 0 of 2 is compared with the whole Loader, a mixture with one pack served alike
(sharded: with the sharded Loader of one pack, so that what sharding costs short epochs is not put on
the mixture).

The resume baselines are the same Loader's first batch at position 0 (what a fresh epoch costs) and
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


def make_packs(base: Path, tokens: int) -> dict[str, Path]:
    """Packs "whole" (a generated text of about `tokens` ids), "half0" and "half1" (its two halves), one
    tokenizer trained on a sample of it."""
    rng = np.random.default_rng(0)
    words = np.array([f"w{i}" for i in range(2000)])
    lines = [" ".join(row) for row in words[rng.integers(0, 2000, (max(2, tokens // 105), 40))]]  # ~105 ids a line
    texts = {"sample": lines[:5000], "whole": lines, "half0": lines[: len(lines) // 2], "half1": lines[len(lines) // 2 :]}
    for name, part in texts.items():
        (base / f"{name}.txt").write_text("\n".join(part))
    tokenize([str(base / "sample.txt")], base / "sample", TokenizeSettings(), train_bpe_vocab=1000)
    tok = str(base / "sample" / "tokenizer.json")
    for name in ("whole", "half0", "half1"):
        tokenize([str(base / f"{name}.txt")], base / name, TokenizeSettings(), tokenizer=tok)
        (base / f"{name}.txt").unlink()
    return {name: base / name for name in ("whole", "half0", "half1")}


def last_level_cache() -> str:
    """The largest CPU cache's size as Linux reports it (e.g. "32768K"), or "unknown"."""
    sizes = sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"))
    return sizes[-1].read_text().strip() if sizes else "unknown"


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


BASELINE = {"rank 0 of 2": "plain", "mixture 0.7/0.3": "plain", "mixture, rank 0/2": "rank 0 of 2"}


def compare(cases: dict, seconds: float, rounds: int) -> None:
    """Each case's rate against its baseline's (BASELINE: a mixture against one pack, served alike), the
    case measured between two runs of its baseline and its ratio taken against their mean, every round,
    so the machine's drift (2x here, within seconds) hits both sides of a ratio alike; each case's rate
    as a median, its ratio as the median of the rounds' ratios (with their range)."""
    rates: dict[str, list[float]] = {k: [] for k in cases}
    ratios: dict[str, list[float]] = {k: [] for k in BASELINE}
    for _ in range(rounds):
        last = None  # (case, rate) of the latest run, reused as the next case's first baseline run
        for k, base in BASELINE.items():
            if last and last[0] == base:
                before = last[1]
            else:
                before = rate(cases[base], seconds)
                rates[base].append(before)
            got, after = rate(cases[k], seconds), rate(cases[base], seconds)
            rates[k].append(got)
            rates[base].append(after)
            ratios[k].append(got / ((before + after) / 2))
            last = (base, after)
    print(f"  {'plain':18s} {statistics.median(rates['plain']):12,.0f} samples/s")
    for k, r in ratios.items():
        print(f"  {k:18s} {statistics.median(rates[k]):12,.0f} samples/s  {statistics.median(r):5.2f}x {BASELINE[k]} "
              f"(rounds {min(r):.2f}-{max(r):.2f}; goal >= 0.95)")


def image_packs(base: Path, photos: int = 4000) -> tuple:
    """An image pack of `photos` generated photos ("whole") and two packs of its halves, as the token packs
    are: each half holds every other photo of each class, so both hold photos alike (the mixture serves
    one more often than the other: halves of different photos would time their decoding, not the
    mixture) and together the very photos the plain Loader reads."""
    from dataprep.images.build import build_images
    from dataprep.images.dataset import InMemoryImageDataset
    from dataprep.images.settings import ImageSettings
    from dataprep.settings import BuildSettings
    from dataprep.sources import scan_imagenet
    from dataprep.synthetic import write_tree

    # 4,000 photos: epochs of 63 batches of 64 (a rank's half epoch 32), so an epoch's start (each worker's
    # first batch of it draws new shuffles and crop keys: ~0.3 ms more for a mixture of two than for one
    # pack) and its short last batch weigh little, if more than in a real dataset; 160 px, where FFCV's
    # ImageNet recipe starts its resolution ramp (at 64 px a decode costs so little that a batch's fixed
    # costs, paid once per member, are what is measured)
    tree = write_tree(base / "tree", classes=4, per_class=photos // 4, sizes=((192, 256), (256, 192), (224, 224)))
    photos = sorted((tree / "train").glob("*/*.JPEG"))
    packs = {}
    for name, part in (("whole", photos), ("half0", photos[0::2]), ("half1", photos[1::2])):
        root = base / f"{name}-tree"
        for photo in part:
            (root / "train" / photo.parent.name).mkdir(parents=True, exist_ok=True)
            (root / "train" / photo.parent.name / photo.name).symlink_to(photo)
        build_images(scan_imagenet(root), base / f"img-{name}", BuildSettings(shard_size=256), ImageSettings(size=160),
                     progress=False)
        packs[name] = InMemoryImageDataset(base / f"img-{name}")
    return packs["whole"], [packs["half0"], packs["half1"]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--tokens", type=int, default=24_000_000, help="ids in the whole text (uint16: 2 bytes each)")
    ap.add_argument("--context", type=int, default=64, help="the resume and state_dict timings' windows")
    ap.add_argument("--contexts", default="64,1024", help="token contexts the throughput comparison runs at")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=0.5, help="per case and round of the throughput comparison")
    ap.add_argument("--compare-rounds", type=int, default=15, help="many short rounds: this machine drifts by 2x")
    a = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-resume-"))
    try:
        t0 = time.perf_counter()
        packs = make_packs(base, a.tokens)
        ds = TokenDataset(packs["whole"], context=a.context, samples=a.samples)
        halves = [len(TokenDataset(packs[h]).data.tokens) for h in ("half0", "half1")]
        l3 = last_level_cache()
        print(f"packs made in {time.perf_counter() - t0:.0f} s: whole {len(ds.data.tokens):,} ids "
              f"({ds.data.tokens.nbytes / 2**20:.0f} MiB), halves {halves[0]:,} + {halves[1]:,}; "
              f"last-level cache {l3}")
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
            one = TokenDataset(packs["whole"], context=context, samples=a.samples)
            mix = Mixture([TokenDataset(packs[h], context=context, samples=a.samples) for h in ("half0", "half1")],
                          [0.7, 0.3])
            for workers in (0, a.workers):
                print(f"token windows of {context} (int64; a gather, the cheapest batch there is), {workers} workers:")
                # B023 (noqa below) does not apply: compare() calls every lambda before this iteration ends
                compare({"plain": lambda: Loader(one, BATCH, shuffle=True, num_workers=workers),  # noqa: B023
                         "rank 0 of 2": lambda: Loader(one, BATCH, shuffle=True, num_workers=workers, rank=0, world_size=2),  # noqa: B023
                         "mixture 0.7/0.3": lambda: Loader(mix, BATCH, num_workers=workers),  # noqa: B023
                         "mixture, rank 0/2": lambda: Loader(mix, BATCH, num_workers=workers, rank=0, world_size=2)},  # noqa: B023
                        a.seconds, a.compare_rounds)
        whole, halves = image_packs(base)
        crop = dict(crop=RandomResizedCrop(128), flip=True)
        imix = Mixture(halves, [0.7, 0.3])
        print(f"JPEG images at 160 px, RandomResizedCrop(128) + flip, batch 64, {a.workers} workers:")
        compare({"plain": lambda: Loader(whole, 64, shuffle=True, num_workers=a.workers, **crop),
                 "rank 0 of 2": lambda: Loader(whole, 64, shuffle=True, num_workers=a.workers, rank=0, world_size=2, **crop),
                 "mixture 0.7/0.3": lambda: Loader(imix, 64, num_workers=a.workers, **crop),
                 "mixture, rank 0/2": lambda: Loader(imix, 64, num_workers=a.workers, rank=0, world_size=2, **crop)},
                a.seconds, a.compare_rounds)
        print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
