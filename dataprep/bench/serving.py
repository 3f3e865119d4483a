"""Serving measurements: takes a dataset and loader settings, gives samples per second over one epoch.

Also holds the baseline every serving path is compared with: `FileImageDataset`, which opens,
decodes and resizes every JPEG from disk on every epoch, as torchvision's `ImageFolder` does.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler


class FileImageDataset(Dataset):
    """The baseline: PIL open + convert + resize shorter side + center crop, every sample, every epoch."""

    def __init__(self, root: str | os.PathLike, size: int):
        root = Path(root)
        classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        self.items = [(str(f), i) for i, c in enumerate(classes) for f in sorted((root / c).rglob("*")) if f.is_file()]
        self.size = size

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        from PIL import Image

        path, label = self.items[i]
        with Image.open(path) as im:
            im = im.convert("RGB")
            w, h = im.size
            s = self.size / min(w, h)
            im = im.resize((max(self.size, round(w * s)), max(self.size, round(h * s))), Image.BILINEAR)
            w, h = im.size
            left, top = (w - self.size) // 2, (h - self.size) // 2
            im = im.crop((left, top, left + self.size, top + self.size))
            arr = np.asarray(im)
        return torch.from_numpy(arr.copy()).permute(2, 0, 1), label


def _init_worker(_: int) -> None:
    import cv2

    # 0, not 1: in a forked child whose parent already ran OpenCV's thread pool, setNumThreads(1)
    # deadlocks (measured here with opencv-python-headless 5.0); 0 switches the pool off safely.
    cv2.setNumThreads(0)


def epoch_rate(dataset: Dataset, batch_size: int = 64, num_workers: int = 0, batched: bool = True,
               seed: int = 0, max_batches: int | None = None) -> float:
    """Samples per second over one shuffled epoch through a stock DataLoader.

    batched=True hands whole index lists to the dataset (`dataset[indices]` returns a batch);
    otherwise the DataLoader fetches samples and collates them itself.
    """
    g = torch.Generator().manual_seed(seed)
    common = dict(num_workers=num_workers, worker_init_fn=_init_worker if num_workers else None,
                  persistent_workers=False, prefetch_factor=4 if num_workers else None)
    if batched:
        sampler = BatchSampler(RandomSampler(dataset, generator=g), batch_size, drop_last=False)
        loader = DataLoader(dataset, batch_size=None, sampler=sampler, **common)
    else:
        loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=g, **common)
    n = 0
    t0 = time.perf_counter()
    for b, (_, labels) in enumerate(loader):
        n += len(labels)
        if max_batches is not None and b + 1 >= max_batches:
            break
    return n / (time.perf_counter() - t0)
