"""Detection benchmark (issue 39): Loader throughput on a detection pack against the same images as a plain image
pack, both served with RandomResizedCrop(224) + flip from 256 px storage, in interleaved rounds (A, B, A, B, ...),
medians and ranges, the load average printed. The detection pack's extra work is its boxes: gathered, moved by
each sample's crop and flip, clipped, filtered and padded; the target is within 10 % of the image pack.

Images: the corpus's photos (../shared/corpus/images) when present, else generated scenes at 320 px; each image
gets `--boxes` boxes on average (COCO has about 7), written as a COCO file. The same JPEG bytes are stored in both
packs (one build of each, same settings).

    .venv/bin/python benchmarks/bench_detection.py [--rounds 5] [--workers 2] [--batch-size 64]
    .venv/bin/python benchmarks/bench_detection.py --quick          # a check that it runs (well under a minute)
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from dataprep import DetectionDataset, InMemoryImageDataset, Loader, RandomResizedCrop, build  # noqa: E402


def sources(root: Path, corpus: Path, n: int, boxes: float, seed: int = 0) -> tuple[Path, Path, Path]:
    """(image folder, COCO file, path-list CSV) of n images with about `boxes` random boxes each."""
    import cv2

    from dataprep.detection.scenes import CATEGORY_IDS, NAMES, scene

    img = root / "images"
    img.mkdir(parents=True)
    photos = sorted(corpus.rglob("*.JPEG"))[:n] if corpus.is_dir() else []
    rng = np.random.default_rng(seed)
    images, anns = [], []
    for k in range(n):
        name = f"{k:05d}.jpg"
        if photos:
            from PIL import Image, ImageOps

            with Image.open(photos[k % len(photos)]) as im:  # upright, as the build decodes it (EXIF applied)
                ImageOps.exif_transpose(im).convert("RGB").save(img / name, quality=95)
            with Image.open(img / name) as im:
                w, h = im.size
        else:
            h, w = 320, 400
            cv2.imwrite(str(img / name), cv2.cvtColor(scene(k, h, w)[0], cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 90])
        images.append({"id": k, "file_name": name, "width": w, "height": h})
        for _ in range(int(rng.poisson(boxes))):
            bw, bh = rng.uniform(0.05, 0.6) * w, rng.uniform(0.05, 0.6) * h
            x, y = rng.uniform(0, w - bw), rng.uniform(0, h - bh)
            anns.append({"id": len(anns) + 1, "image_id": k, "category_id": int(rng.choice(CATEGORY_IDS)), "bbox": [x, y, bw, bh], "iscrowd": 0})
    coco = root / "instances.json"
    coco.write_text(json.dumps({"images": images, "annotations": anns,
                                "categories": [{"id": i, "name": nm} for i, nm in zip(CATEGORY_IDS, NAMES)]}))
    listing = root / "list.csv"
    with open(listing, "w", newline="") as f:
        csv.writer(f).writerows([(f"images/{im['file_name']}", 0) for im in images])
    return img, coco, listing


def epoch(loader) -> float:
    t0, n = time.perf_counter(), 0
    for batch in loader:
        n += len(batch[0])
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default=str(HERE.parent.parent / "shared" / "corpus" / "images"))
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--boxes", type=float, default=7.0, help="boxes per image on average")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=2, help="epochs per round and pack")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--quick", action="store_true", help="128 images, 2 rounds of 1 epoch: checks that it runs")
    a = ap.parse_args()
    if a.quick:
        a.images, a.rounds, a.epochs = 128, 2, 1
    print(f"load average at start: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        img, coco, listing = sources(tmp / "src", Path(a.corpus), a.images, a.boxes)
        opts = dict(size=256, resize="shorter", workers=a.workers)
        det = build.coco(img, tmp / "det", annotations=coco, **opts)
        build.list(listing, tmp / "img", root=tmp / "src", **opts)
        print(f"{det.written} images ({'corpus photos' if Path(a.corpus).is_dir() else 'generated scenes'}), "
              f"{json.loads((tmp / 'det' / 'manifest.json').read_text())['splits']['train']['boxes']['stored']} boxes, 256 px JPEG")
        kw = dict(batch_size=a.batch_size, shuffle=True, num_workers=a.workers, crop=RandomResizedCrop(224), flip=True, drop_last=True)
        packs = {"images": InMemoryImageDataset(tmp / "img"), "detection": DetectionDataset(tmp / "det")}
        rates: dict[str, list[float]] = {k: [] for k in packs}
        with Loader(packs["images"], **kw) as li, Loader(packs["detection"], **kw) as ld:
            loaders = {"images": li, "detection": ld}
            for loader in loaders.values():  # warm: workers forked, caches touched
                next(iter(loader))
            for r in range(a.rounds):
                for name in (("images", "detection") if r % 2 == 0 else ("detection", "images")):
                    rates[name] += [epoch(loaders[name]) for _ in range(a.epochs)]
        for name, got in rates.items():
            print(f"  {name:9s}: median {statistics.median(got):7.0f} images/s, range {min(got):.0f}..{max(got):.0f} ({len(got)} epochs)")
        ratio = statistics.median(rates["detection"]) / statistics.median(rates["images"])
        print(f"detection / images: {ratio:.3f} (target >= 0.90); {a.workers} workers, batch {a.batch_size}, RandomResizedCrop(224) + flip")
    print(f"load average at end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
