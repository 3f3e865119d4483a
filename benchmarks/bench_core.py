"""Core benchmark (issue 2): build throughput and DataLoader throughput on the shared corpus at size 256.

Baselines are measured in the same run on the same machine; the script prints medians and ratios
and the targets they are held to. It is not a test: machines are shared and noisy.

    .venv/bin/python benchmarks/bench_core.py [--corpus ../shared/corpus/images] [--rounds 3] [--workers 2]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from dataprep.bench.serving import FileImageDataset, epoch_rate  # noqa: E402
from dataprep.images.build import build_images  # noqa: E402
from dataprep.images.dataset import InMemoryImageDataset  # noqa: E402
from dataprep.images.settings import ImageSettings  # noqa: E402
from dataprep.settings import BuildSettings  # noqa: E402
from dataprep.sources import scan_imagenet  # noqa: E402


def pillow_one(args):
    """The plain script we compare the build with: what most people write first."""
    from PIL import Image, ImageOps

    src, dst, size = args
    with Image.open(src) as im:
        im = ImageOps.exif_transpose(im).convert("RGB")
        w, h = im.size
        s = min(1.0, size / min(w, h))
        im = im.resize((max(1, round(w * s)), max(1, round(h * s))), Image.LANCZOS)
        im.save(dst, "JPEG", quality=90)
    return 1


def pillow_build(files, out: Path, size: int, workers: int) -> float:
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(str(f), str(out / f"{i:06d}.jpg"), size) for i, f in enumerate(files)]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(workers) as pool:
        n = sum(pool.map(pillow_one, jobs, chunksize=8))
    return n / (time.perf_counter() - t0)


def ours_build(root: Path, out: Path, size: int, workers: int, **image) -> float:
    source = scan_imagenet(root)
    s = build_images(source, out, BuildSettings(workers=workers, overwrite=True), ImageSettings(size=size, **image))
    return s.written / s.seconds


def best_rate(ds, batched: bool, rounds: int) -> tuple[float, int]:
    """Median over rounds of one-epoch rates, at the best num_workers of 0, 1, 2."""
    best = (0.0, -1)
    for w in (0, 1, 2):
        med = statistics.median(epoch_rate(ds, 64, w, batched, seed=r) for r in range(rounds))
        best = max(best, (med, w))
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=str(HERE.parents[1] / "shared" / "corpus" / "images"))
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", default=str(HERE / "results" / "bench_core.json"))
    a = ap.parse_args()
    root = Path(a.corpus)
    if not (root / "train").is_dir():
        print(f"corpus not found at {root} (expected {root}/train/<class>/*.JPEG); pass --corpus", file=sys.stderr)
        return 2
    files = [Path(root, p) for p in scan_imagenet(root).splits[0].paths]
    load0 = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="dataprep-bench-"))
    res: dict = {"images": len(files), "size": a.size, "workers": a.workers, "rounds": a.rounds}
    try:
        # -- build ----------------------------------------------------------------------------
        pil, ours = [], []
        for r in range(a.rounds):  # interleaved, so drift in machine load hits both alike
            pil.append(pillow_build(files, tmp / f"pil{r}", a.size, a.workers))
            ours.append(ours_build(root, tmp / "ours", a.size, a.workers))
        res["build_pillow_img_s"] = statistics.median(pil)
        res["build_ours_img_s"] = statistics.median(ours)
        res["build_ratio"] = res["build_ours_img_s"] / res["build_pillow_img_s"]
        # -- serving --------------------------------------------------------------------------
        ours_build(root, tmp / "raw", a.size, a.workers, resize="center-crop", mode="raw")
        ours_build(root, tmp / "enc", a.size, a.workers, resize="center-crop", mode="encoded")
        base, base_w = best_rate(FileImageDataset(root / "train", a.size), False, a.rounds)
        raw, raw_w = best_rate(InMemoryImageDataset(tmp / "raw"), True, a.rounds)
        enc, enc_w = best_rate(InMemoryImageDataset(tmp / "enc", decode="cv2"), True, a.rounds)
        res.update(serve_files_img_s=base, serve_files_workers=base_w, serve_raw_img_s=raw, serve_raw_workers=raw_w,
                   serve_jpeg_cv2_img_s=enc, serve_jpeg_cv2_workers=enc_w,
                   serve_raw_ratio=raw / base, serve_jpeg_ratio=enc / base)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    res["loadavg_before"], res["loadavg_after"] = load0, os.getloadavg()
    checks = [
        ("build: ours vs Pillow script, same processes", res["build_ratio"], 1.5),
        ("serve: decoded pack vs JPEG files every epoch", res["serve_raw_ratio"], 20.0),
        ("serve: encoded pack (cv2) vs JPEG files every epoch", res["serve_jpeg_ratio"], 2.0),
    ]
    print(f"{len(files)} images, size {a.size}, {a.workers} build processes, median of {a.rounds} rounds, "
          f"load average {load0[0]:.2f} -> {res['loadavg_after'][0]:.2f}")
    print(f"  build   Pillow script {res['build_pillow_img_s']:8.0f} img/s   dataprep {res['build_ours_img_s']:8.0f} img/s")
    print(f"  serve   JPEG files    {base:8.0f} img/s (workers {base_w})")
    print(f"          decoded pack  {raw:8.0f} img/s (workers {raw_w})")
    print(f"          encoded+cv2   {enc:8.0f} img/s (workers {enc_w})")
    ok = True
    for name, ratio, target in checks:
        met = ratio >= target
        ok &= met
        print(f"  {name:55s} {ratio:7.2f}x  (target >= {target}x: {'met' if met else 'MISSED'})")
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(res, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
