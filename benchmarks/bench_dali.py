"""DALI benchmark (issue 8): decoding an encoded pack from RAM with OpenCV, Pillow and DALI (CPU pipeline,
and with --gpu the mixed nvJPEG pipeline), medians of --rounds epochs, in the same run.

Every path decodes the same stored JPEGs and yields 224x224 uint8 center crops (eval) or, for DALI's
training preset, fused random-resized crops normalised to float. With --gpu the mixed pipeline's pixels
are checked against OpenCV's decode of the same bytes (mean absolute difference <= 2) and the script
exits 1 if they disagree.

    .venv/bin/python benchmarks/bench_dali.py [--corpus ../shared/corpus/images] [--images 2000] [--gpu]
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
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from dataprep.images.build import build_images  # noqa: E402
from dataprep.images.dataset import InMemoryImageDataset  # noqa: E402
from dataprep.images.settings import ImageSettings  # noqa: E402
from dataprep.serve.loader import Loader  # noqa: E402
from dataprep.settings import BuildSettings  # noqa: E402
from dataprep.sources import scan_imagenet  # noqa: E402
from dataprep.synthetic import write_tree  # noqa: E402


def rate(make, rounds: int) -> float:
    """Median images/s over `rounds` epochs of the iterable `make()` gives (made once, warmed by one epoch)."""
    it = make()
    for _ in it:
        pass
    out = []
    for _ in range(rounds):
        t0, n = time.perf_counter(), 0
        for x, _ in it:
            n += len(x)
        if x.is_cuda:
            torch.cuda.synchronize()
        out.append(n / (time.perf_counter() - t0))
    return statistics.median(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=str(HERE.parents[1] / "shared" / "corpus" / "images"))
    ap.add_argument("--images", type=int, default=1024, help="synthetic photos when the corpus is absent")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--gpu", action="store_true", help="also run the mixed (nvJPEG) pipeline and check it")
    a = ap.parse_args()
    from dataprep.images.dali import DaliAugment, DaliImageLoader, DaliNormalize

    print(f"load average at start: {os.getloadavg()[0]:.2f}; {a.workers} workers/threads, batch {a.batch}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        root = Path(a.corpus)
        if not (root / "train").is_dir():
            root = write_tree(tmp / "src", classes=8, per_class=max(1, a.images // 8), sizes=((375, 500), (480, 640), (768, 1024)))
            print(f"corpus absent: {a.images} synthetic photos")
        build_images(scan_imagenet(root), tmp / "pack", BuildSettings(workers=a.workers), ImageSettings(size=256, resize="center-crop"))
        ds = InMemoryImageDataset(tmp / "pack", decode="none")
        print(f"pack: {len(ds)} JPEGs at 256x256, {ds.nbytes / 1e6:.1f} MB in RAM")
        eval_kw = dict(augment=DaliAugment.eval(224, resize=None), normalize=DaliNormalize.pixels(), last_batch="partial")
        rows = []
        for name in ("cv2", "pil"):
            d = InMemoryImageDataset(tmp / "pack", decode=name)
            rows.append((f"{name}, dataprep.Loader, {a.workers} workers",
                         rate(lambda: Loader(d, a.batch, num_workers=a.workers, crop=(224, 224)), a.rounds)))  # noqa: B023 (rate() calls it now)
        rows.append(("DALI CPU pipeline, eval",
                     rate(lambda: DaliImageLoader(ds, a.batch, device_id=None, num_threads=a.workers, **eval_kw), a.rounds)))
        rows.append(("DALI CPU pipeline, train (random-resized crop, flip, float)",
                     rate(lambda: DaliImageLoader(ds, a.batch, "train", device_id=None, num_threads=a.workers), a.rounds)))
        ok = True
        if a.gpu:
            rows.append(("DALI mixed (nvJPEG), eval",
                         rate(lambda: DaliImageLoader(ds, a.batch, device_id=0, num_threads=a.workers, **eval_kw), a.rounds)))
            rows.append(("DALI mixed (nvJPEG), train",
                         rate(lambda: DaliImageLoader(ds, a.batch, "train", device_id=0, num_threads=a.workers), a.rounds)))
            ref = InMemoryImageDataset(tmp / "pack", decode="cv2", as_numpy=True)
            k, worst = 0, 0.0
            for x, y in DaliImageLoader(ds, a.batch, DaliAugment.eval(256, resize=None), DaliNormalize.pixels("nhwc"), device_id=0,
                                        num_threads=a.workers, last_batch="partial"):
                for j in range(len(x)):
                    want, label = ref[k]
                    worst = max(worst, float(np.abs(x[j].cpu().numpy().astype(np.int16) - want.astype(np.int16)).mean()))
                    ok &= int(y[j]) == label
                    k += 1
            ok &= worst <= 2.0 and k == len(ref)
            print(f"mixed pipeline vs OpenCV on {k} images: worst mean absolute difference {worst:.3f}, labels "
                  f"{'match' if ok else 'DIFFER'}: {'agree' if ok else 'DISAGREE'}")
        base = rows[0][1]
        for name, r in rows:
            print(f"  {name:62s} {r:10.0f} img/s  {r / base:6.2f}x cv2")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
