"""Audit benchmarks: the hash's cost beside an image build's, its robustness on the shared corpus (and on
generated photos), and the search on 1.28 M synthetic hashes with planted near twins (time, peak RSS,
equality with brute force on a 20 k subset).

    .venv/bin/python benchmarks/bench_audit.py hash          # us per image at 256 px, beside process_levels
    .venv/bin/python benchmarks/bench_audit.py robustness    # recall per transform and false positives per distance
    .venv/bin/python benchmarks/bench_audit.py index --runs 3 --n 1280000 --distance 8
    .venv/bin/python benchmarks/bench_audit.py overhead --rounds 5   # a 256 px build with the hashes on vs off

Each index run is a fresh process, so its peak RSS (ru_maxrss) is its own. Medians over runs; the load
average is printed beside them, since the machine is shared.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

CORPUS = os.environ.get("DATAPREP_CORPUS_TRAIN", str(Path(__file__).resolve().parents[2] / "shared" / "corpus" / "images" / "train"))


def load_corpus(limit=None):
    import cv2

    paths = sorted(glob.glob(os.path.join(CORPUS, "*", "*.JPEG")))[:limit]
    images, folders, kept = [], [], []
    for p in paths:
        im = cv2.imread(p, cv2.IMREAD_COLOR)
        if im is None:
            continue
        h, w = im.shape[:2]
        s = 256 / min(h, w)
        images.append(np.ascontiguousarray(cv2.resize(im[:, :, ::-1], (max(1, round(w * s)), max(1, round(h * s))), interpolation=cv2.INTER_AREA)))
        folders.append(p.split(os.sep)[-2])
        kept.append(p)
    return images, np.array(folders), kept


# -- hash cost -------------------------------------------------------------------------------------
def bench_hash(args):
    import cv2

    cv2.setNumThreads(0)  # as in a build's workers
    from dataprep.audit import hashes as H
    from dataprep.images.process import process_levels
    from dataprep.images.settings import ImageSettings

    if not os.path.isdir(CORPUS):
        sys.exit(f"no corpus at {CORPUS}")
    # photos of ImageNet's sizes (shorter side up to 600 px): what a 256 px build decodes
    paths = [p for p in sorted(glob.glob(os.path.join(CORPUS, "*", "*.JPEG"))) if min(cv2.imread(p).shape[:2]) <= 600][:80]
    st = ImageSettings(size=256)

    def per_image(f, items):
        for x in items[:5]:
            f(x)
        runs = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            for x in items:
                f(x)
            runs.append((time.perf_counter() - t) / len(items) * 1e6)
        return statistics.median(runs)

    build = per_image(lambda p: process_levels(p, st), paths)
    done = [process_levels(p, st)[0] for p in paths]
    pixels = [cv2.imdecode(d.data, cv2.IMREAD_COLOR)[:, :, ::-1].copy() for d in done]
    stored = [d.data for d in done]
    per_image(H.perceptual_hash, pixels)  # a pass to warm up: the first timed function was read slow otherwise
    rows = {
        "build (decode, resize, encode) per image": build,
        "perceptual_hash": per_image(H.perceptual_hash, pixels),
        "hash_and_flipped": per_image(H.hash_and_flipped, pixels),
        "pixel_digest of the pixels": per_image(H.pixel_digest, pixels),
        "pixel_digest of the stored JPEG bytes": per_image(H.pixel_digest, stored),
    }
    print(f"{len(paths)} photos at 256 px (shorter side), median of {args.repeats} passes; load average {os.getloadavg()}")
    for k, v in rows.items():
        print(f"  {k:42s} {v:8.1f} us  {100 * v / build:5.2f} % of the build")


# -- build overhead ---------------------------------------------------------------------------------
def bench_overhead(args):
    """The same 256 px build of the corpus photos with the audit's fields stored and without, side by side:
    rounds interleaved (on, off, off, on, ...) so drift in the machine's load falls on both alike."""
    import tempfile

    from dataprep import build
    from dataprep.images import build as image_build

    if not os.path.isdir(CORPUS):
        sys.exit(f"no corpus at {CORPUS}")
    times = {True: [], False: []}
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.rounds + 1):  # round 0 warms the page cache and the imports: not counted
            for on in ((True, False) if r % 2 else (False, True)):
                image_build.FINGERPRINTS = on
                out = os.path.join(d, f"p{int(on)}")
                t = time.perf_counter()
                s = build.folder(CORPUS, out, size=256, workers=args.workers, overwrite=True)
                dt = time.perf_counter() - t
                if r:
                    times[on].append(dt)
                print(f"  round {r} hashes {'on ' if on else 'off'}: {dt:.2f} s, {s.written} images; load average {os.getloadavg()}")
    image_build.FINGERPRINTS = True
    on, off = statistics.median(times[True]), statistics.median(times[False])
    print(f"256 px build of {s.written} corpus photos, {args.workers or 'default'} worker(s), {args.rounds} interleaved rounds each")
    print(f"  hashes on:  median {on:.3f} s (range {min(times[True]):.3f}-{max(times[True]):.3f})")
    print(f"  hashes off: median {off:.3f} s (range {min(times[False]):.3f}-{max(times[False]):.3f})")
    print(f"  overhead: {100 * (on - off) / off:+.2f} % of the build (medians); per round pairs: "
          + ", ".join(f"{100 * (a - b) / b:+.1f}" for a, b in zip(times[True], times[False])) + f" %; load average {os.getloadavg()}")


# -- robustness ------------------------------------------------------------------------------------
def transforms():
    import cv2

    def jpeg(im):
        return cv2.imdecode(cv2.imencode(".jpg", im[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, 40])[1], cv2.IMREAD_COLOR)[:, :, ::-1]

    def scale(im):
        h, w = im.shape[:2]
        return cv2.resize(im, (max(1, round(w * 0.6)), max(1, round(h * 0.6))), interpolation=cv2.INTER_AREA)

    def crop(im):
        h, w = im.shape[:2]
        dy, dx = round(h * 0.04), round(w * 0.04)
        return im[dy:h - dy, dx:w - dx]

    def gain(f):
        return lambda im: np.clip(im.astype(np.float32) * f, 0, 255).astype(np.uint8)

    return {"jpeg q40": jpeg, "resize 60%": scale, "crop 4%": crop, "brightness +10%": gain(1.1), "brightness -10%": gain(0.9),
            "flip": lambda im: np.ascontiguousarray(im[:, ::-1])}


def control_hashes():
    """The chosen hash beside what it was chosen against, and two hashes that ignore the image."""
    import cv2

    from dataprep.audit import hashes as H

    def bits(v):
        return np.packbits(v > np.median(v), bitorder="little").view("<u8")[0]

    def plain_phash(im):  # pHash without the window (imagehash's phash)
        g = cv2.cvtColor(cv2.resize(im, (32, 32), interpolation=cv2.INTER_AREA), cv2.COLOR_RGB2GRAY).astype(np.float32)
        return bits(cv2.dct(g)[:8, :8].ravel())

    def dhash(im):
        g = cv2.cvtColor(cv2.resize(im, (9, 8), interpolation=cv2.INTER_AREA), cv2.COLOR_RGB2GRAY).astype(np.int16)
        return np.packbits((g[:, :-1] > g[:, 1:]).ravel(), bitorder="little").view("<u8")[0]

    rng = np.random.default_rng(0)
    return {"dct-sine-8x8 (chosen)": H.perceptual_hash, "plain pHash": plain_phash, "dHash": dhash,
            "constant (control)": lambda im: np.uint64(0), "random (control)": lambda im: rng.integers(0, 2**63, dtype=np.uint64)}


def bench_robustness(args):
    import cv2

    cv2.setNumThreads(0)
    from dataprep.audit.hashes import flipped_hash, hamming, perceptual_hash
    from dataprep.audit.report import DEFAULT_MAX_DISTANCE

    sets = {}
    if os.path.isdir(CORPUS):
        images, folders, _ = load_corpus()
        sets["corpus"] = (images, folders)
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from test_audit_core import generated_photos

    gen = generated_photos(args.generated)
    sets["generated"] = (gen, np.arange(len(gen)).astype(str))
    T = transforms()
    for set_name, (images, folders) in sets.items():
        print(f"\n{set_name}: {len(images)} photos at 256 px; recall % per transform; FP % = photos with another photo within D"
              f" (cross = from another folder); load average {os.getloadavg()}")
        for hname, f in control_hashes().items():
            base = np.array([f(im) for im in images], np.uint64)
            dist = {t: hamming(base, np.array([f(tf(im)) for im in images], np.uint64)) for t, tf in T.items()}
            d = hamming(base[:, None], base[None, :])
            np.fill_diagonal(d, 99)
            cross = np.where(folders[:, None] != folders[None, :], d, 99)
            for D in args.distances:
                rec = "  ".join(f"{t}={(dist[t] <= D).mean() * 100:5.1f}" for t in T)
                mark = " <- default" if D == DEFAULT_MAX_DISTANCE and "chosen" in hname else ""
                print(f"  {hname:22s} D={D:2d}  FP any={(d.min(1) <= D).mean() * 100:5.1f}  cross={(cross.min(1) <= D).mean() * 100:5.1f}  "
                      f"{rec}{mark}")
        # --flips: each photo's flipped hash against the hash of its mirror; FP: another photo near a mirror
        base = np.array([perceptual_hash(im) for im in images], np.uint64)
        fl = np.array([flipped_hash(im) for im in images], np.uint64)
        mirrored = np.array([perceptual_hash(np.ascontiguousarray(im[:, ::-1])) for im in images], np.uint64)
        d = hamming(fl[:, None], base[None, :])
        np.fill_diagonal(d, 99)
        both = np.minimum(d, hamming(base[:, None], base[None, :]) + np.eye(len(base), dtype=np.int64) * 99)
        for D in args.distances:
            print(f"  with --flips           D={D:2d}  flip={(hamming(fl, mirrored) <= D).mean() * 100:5.1f}  "
                  f"FP any (direct or mirrored)={(both.min(1) <= D).mean() * 100:5.1f}  "
                  f"cross={(np.where(folders[:, None] != folders[None, :], both, 99).min(1) <= D).mean() * 100:5.1f}")


# -- the search at scale ---------------------------------------------------------------------------
def planted(n, D, seed=0, frac=0.02, ends=False):
    """n random hashes, `frac` of them replaced by a copy of another with 0..D bits flipped (with `ends`,
    also the indices of each planted copy and its original)."""
    rng = np.random.default_rng(seed)
    h = rng.integers(0, 2**64 - 1, size=n, dtype=np.uint64, endpoint=True)
    k = int(n * frac)
    src, dst = rng.choice(n, k, replace=False), rng.choice(n, k, replace=False)
    flip = np.zeros(k, np.uint64)
    nb = rng.integers(0, D + 1, size=k)
    for t in range(D):
        flip ^= np.where(t < nb, np.uint64(1) << rng.integers(0, 64, k).astype(np.uint64), np.uint64(0))
    h[dst] = h[src] ^ flip
    return (h, src, dst) if ends else h


def one_index_run(n, D, seed):
    from dataprep.audit.index import find_matches

    h = planted(n, D, seed)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    m = find_matches(h, D)
    p = m.pairs()
    groups = m.groups()
    dt = time.perf_counter() - t
    print(json.dumps({"seconds": dt, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "rss_before_mb": base / 1024, "pairs": int(m.total), "listed": len(p.i),
                      "groups_of_2_or_more": int((np.bincount(groups) >= 2).sum()) if n else 0,
                      "candidates": int(m.candidates)}))


def bench_index(args):
    from dataprep.audit.index import brute_force_pairs, find_matches, plan

    print(f"{args.n} hashes, 2 % planted twins at 0..{args.distance} bits, D={args.distance}; "
          f"blocks (bits, radius): {[(b.bits, b.radius) for b in plan(args.n, args.distance)]}")
    runs = []
    for r in range(args.runs):
        out = subprocess.run([sys.executable, __file__, "_index_run", str(args.n), str(args.distance), str(r)],
                             capture_output=True, text=True, check=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"  run {r}: {runs[-1]}  load average {os.getloadavg()}")
    if runs:
        print(f"median: {statistics.median(x['seconds'] for x in runs):.1f} s, peak RSS {statistics.median(x['peak_rss_mb'] for x in runs):.0f} MB "
              f"(hashes alone: {args.n * 8 / 2**20:.0f} MB); load average {os.getloadavg()}")
    # the subset: both ends of planted twins (a quarter of it), the rest drawn at random, so brute force has pairs to find
    full, src, dst = planted(args.n, args.distance, 0, ends=True)
    rng = np.random.default_rng(1)
    pick = np.unique(np.concatenate([src[: args.subset // 8], dst[: args.subset // 8]]))
    rest = np.setdiff1d(rng.choice(args.n, args.subset, replace=False), pick)[: args.subset - len(pick)]
    h = full[np.sort(np.concatenate([pick, rest]))]
    t = time.perf_counter()
    got = find_matches(h, args.distance, search="index").pairs()
    t_index = time.perf_counter() - t
    t = time.perf_counter()
    want = brute_force_pairs(h, args.distance)
    t_brute = time.perf_counter() - t
    equal = all(np.array_equal(a, b) for a, b in zip(got[:3], want[:3]))
    print(f"subset of {args.subset}: index {len(got.i)} pairs in {t_index:.2f} s, brute force {len(want.i)} pairs in {t_brute:.2f} s, "
          f"equal: {equal}")
    if not equal:
        sys.exit(1)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "_index_run":
        one_index_run(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["hash", "robustness", "index", "overhead"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workers", type=int, default=None, help="build processes [default: the build's own, one a core]")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--n", type=int, default=1_280_000)
    ap.add_argument("--distance", type=int, default=8)
    ap.add_argument("--subset", type=int, default=20_000)
    ap.add_argument("--generated", type=int, default=200)
    ap.add_argument("--distances", type=int, nargs="+", default=[6, 8, 10, 12])
    args = ap.parse_args()
    {"hash": bench_hash, "robustness": bench_robustness, "index": bench_index, "overhead": bench_overhead}[args.what](args)


if __name__ == "__main__":
    main()
