"""Segmentation benchmark (issue 12): build and serving throughput of image/mask pairs, with baselines
measured in the same run.

Pairs: the corpus's real photos with masks made from them (luminance quantised into 6 classes: real
region boundaries, several classes). Build baseline: the Pillow script most people write (image
LANCZOS to JPEG, mask NEAREST to PNG), 2 processes. Serving baseline: files decoded and resized
every epoch, images as float32 and masks as int64 (as commonly written), against SegmentationDataset
through dataprep.Loader (uint8 images and masks, 224 center crops). Medians of --rounds.

    .venv/bin/python benchmarks/bench_segmentation.py [--corpus ../shared/corpus/images] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from dataprep.images.settings import ImageSettings  # noqa: E402
from dataprep.segmentation.build import build_segmentation  # noqa: E402
from dataprep.segmentation.dataset import SegmentationDataset  # noqa: E402
from dataprep.segmentation.pairs import pair_by_stem  # noqa: E402
from dataprep.serve.loader import Loader  # noqa: E402
from dataprep.settings import BuildSettings  # noqa: E402


def make_pairs(corpus: Path, root: Path) -> tuple[Path, Path]:
    from PIL import Image, ImageOps

    ids = np.array([0, 1, 2, 7, 11, 20], np.uint8)
    (root / "img").mkdir(parents=True)
    (root / "msk").mkdir()
    for k, p in enumerate(sorted(corpus.rglob("*.JPEG"))):
        with Image.open(p) as im:
            im = ImageOps.exif_transpose(im)
            im.convert("RGB").save(root / "img" / f"{k:05d}.jpg", quality=95)
            lum = np.asarray(im.convert("L"))
        Image.fromarray(ids[np.minimum(lum // 43, 5)]).save(root / "msk" / f"{k:05d}.png")
    return root / "img", root / "msk"


def pillow_pair(args) -> int:
    from PIL import Image

    img, msk, out, size = args
    with Image.open(img) as im, Image.open(msk) as m:
        w, h = im.size
        s = min(1.0, size / min(w, h))
        wh = (max(1, round(w * s)), max(1, round(h * s)))
        im.convert("RGB").resize(wh, Image.LANCZOS).save(out + ".jpg", quality=90)
        m.resize(wh, Image.NEAREST).save(out + ".png")
    return 1


class FilePairs:
    """Decoded and resized every epoch; float32 images and int64 masks, as commonly written."""

    def __init__(self, imgs, msks, size=256, crop=224):
        self.imgs, self.msks, self.size, self.crop = imgs, msks, size, crop

    def __len__(self):
        return len(self.imgs)

    def __getitem__(self, i):
        import torch
        from PIL import Image

        with Image.open(self.imgs[i]) as im, Image.open(self.msks[i]) as m:
            w, h = im.size
            s = self.size / min(w, h)
            wh = (max(self.crop, round(w * s)), max(self.crop, round(h * s)))
            im = np.asarray(im.convert("RGB").resize(wh, Image.BILINEAR), np.float32) / 255
            m = np.asarray(m.resize(wh, Image.NEAREST)).astype(np.int64)
        t, l = (wh[1] - self.crop) // 2, (wh[0] - self.crop) // 2
        c = self.crop
        return torch.from_numpy(im[t : t + c, l : l + c].transpose(2, 0, 1).copy()), torch.from_numpy(m[t : t + c, l : l + c].copy())


def epoch(loader) -> float:
    t0, n = time.perf_counter(), 0
    for x, _ in loader:
        n += len(x)
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default=str(HERE.parent.parent / "shared" / "corpus" / "images"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    import torch

    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        img, msk = make_pairs(Path(a.corpus), tmp / "src")
        n = len(list(img.iterdir()))
        base, ours = [], []
        for r in range(a.rounds):
            (tmp / f"pil{r}").mkdir()
            jobs = [(str(img / f"{k:05d}.jpg"), str(msk / f"{k:05d}.png"), str(tmp / f"pil{r}" / f"{k:05d}"), 256) for k in range(n)]
            t0 = time.perf_counter()
            with ProcessPoolExecutor(a.workers) as pool:
                sum(pool.map(pillow_pair, jobs, chunksize=8))
            base.append(n / (time.perf_counter() - t0))
            s = build_segmentation(pair_by_stem(img, msk), tmp / "pack", BuildSettings(workers=a.workers, overwrite=True),
                                   ImageSettings(size=256, resize="shorter", mode="encoded"))
            ours.append(s.written / s.seconds)
        b, o = statistics.median(base), statistics.median(ours)
        print(f"build {n} pairs at 256 px, {a.workers} processes: Pillow script {b:.0f} pairs/s, dataprep {o:.0f} pairs/s: {o / b:.2f}x")

        files = FilePairs(sorted(img.iterdir()), sorted(msk.iterdir()))
        ds = SegmentationDataset(tmp / "pack")
        fb, fo = [], []
        for _ in range(a.rounds):
            fb.append(epoch(torch.utils.data.DataLoader(files, batch_size=32, num_workers=a.workers)))
            with Loader(ds, batch_size=32, num_workers=a.workers, crop=(224, 224)) as loader:
                fo.append(epoch(loader))
        b, o = statistics.median(fb), statistics.median(fo)
        per_b = 32 * 224 * 224 * (3 * 4 + 8)
        per_o = 32 * 224 * 224 * (3 + 1)
        print(f"serve one epoch, batch 32, 224x224 crops, {a.workers} workers: files every epoch {b:.0f} pairs/s, "
              f"pack + Loader {o:.0f} pairs/s: {o / b:.1f}x")
        print(f"bytes per batch: float32 images + int64 masks {per_b:,} B; uint8 + uint8 {per_o:,} B ({per_b / per_o:.0f}x less)")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
