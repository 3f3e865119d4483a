"""Multi-resolution export (issue 4): 4 sizes in one pass against 4 separate single-size builds of the
same sizes, same processes, same run; and how alike the sizes are (PSNR of the largest, area-downscaled,
against each stored smaller size).

    .venv/bin/python benchmarks/bench_multires.py [--corpus ../shared/corpus/images] [--sizes 128,192,256,512] [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import cv2  # noqa: E402
import numpy as np  # noqa: E402

from dataprep.images.build import build_images  # noqa: E402
from dataprep.images.dataset import InMemoryImageDataset  # noqa: E402
from dataprep.images.settings import ImageSettings  # noqa: E402
from dataprep.settings import BuildSettings  # noqa: E402
from dataprep.sources import scan_imagenet  # noqa: E402


def build(source, out: Path, workers: int, **image) -> float:
    return build_images(source, out, BuildSettings(workers=workers, overwrite=True), ImageSettings(**image)).seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=str(HERE.parents[1] / "shared" / "corpus" / "images"))
    ap.add_argument("--sizes", default="128,192,256,512")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", default=str(HERE / "results" / "bench_multires.json"))
    a = ap.parse_args()
    root = Path(a.corpus)
    if not (root / "train").is_dir():
        print(f"corpus not found at {root}; pass --corpus", file=sys.stderr)
        return 2
    sizes = tuple(int(s) for s in a.sizes.split(","))
    source = scan_imagenet(root)
    tmp = Path(tempfile.mkdtemp(prefix="dataprep-bench-mr-"))
    load0 = os.getloadavg()
    try:
        one, separate = [], []
        for _ in range(a.rounds):
            one.append(build(source, tmp / "one", a.workers, sizes=sizes))
            separate.append(sum(build(source, tmp / f"s{s}", a.workers, size=s) for s in sizes))
        t1, t4 = statistics.median(one), statistics.median(separate)
        n = len(source.splits[0].paths)
        print(f"{n} images, sizes {sizes}, {a.workers} processes, median of {a.rounds} rounds, load {load0[0]:.2f}:")
        print(f"  one pass, {len(sizes)} sizes        {t1:6.2f} s  ({n / t1:5.0f} img/s)")
        print(f"  {len(sizes)} separate builds        {t4:6.2f} s  ({n / t4:5.0f} img/s)")
        ratio = t4 / t1
        big = InMemoryImageDataset(tmp / "one", resolution=max(sizes), as_numpy=True)
        res = {"images": n, "sizes": sizes, "one_pass_s": t1, "separate_s": t4, "ratio": ratio, "psnr": {}}
        for s in sorted(sizes)[:-1]:
            small = InMemoryImageDataset(tmp / "one", resolution=s, as_numpy=True)
            vals = []
            for i in range(len(big)):
                b, sm = big.image(i), small.image(i)
                down = cv2.resize(b, (sm.shape[1], sm.shape[0]), interpolation=cv2.INTER_AREA).reshape(sm.shape)
                mse = np.mean((down.astype(np.float64) - sm) ** 2)
                vals.append(99.0 if mse == 0 else 10 * np.log10(255.0**2 / mse))
            res["psnr"][s] = {"mean": float(np.mean(vals)), "min": float(np.min(vals))}
            print(f"  PSNR of {max(sizes)} downscaled vs stored {s}: mean {np.mean(vals):.1f} dB, worst {np.min(vals):.1f} dB")
        res["load"] = [load0, os.getloadavg()]
        print(f"  one pass vs separate builds {ratio:.2f}x  (target >= 2.0x: {'met' if ratio >= 2 else 'MISSED'})")
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(res, indent=1))
        return 0 if ratio >= 2 else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
