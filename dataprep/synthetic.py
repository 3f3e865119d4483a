"""Synthetic sources: takes a count and a directory, gives an ImageNet-layout tree of generated images.

Two kinds: photo-like JPEGs (gradients, shapes, noise; for the demo and throughput runs) and
index images whose pixels encode their own index, so a round trip through a pack can be checked
exactly. Nothing here needs a network or `../shared`.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np


def photo_like(seed: int, h: int, w: int) -> np.ndarray:
    """An RGB uint8 image with smooth gradients, a few filled shapes and sensor-like noise."""
    import cv2

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = rng.uniform(0, 255, 3).astype(np.float32)
    slope = rng.uniform(-0.3, 0.3, (3, 2)).astype(np.float32)
    img = np.stack([base[c] + slope[c, 0] * y + slope[c, 1] * x for c in range(3)], axis=2)
    img = np.clip(img, 0, 255).astype(np.uint8)
    for _ in range(int(rng.integers(3, 9))):
        color = tuple(int(v) for v in rng.integers(0, 256, 3))
        cx, cy = int(rng.integers(0, w)), int(rng.integers(0, h))
        if rng.random() < 0.5:
            axes = (int(rng.integers(w // 20 + 1, w // 3 + 2)), int(rng.integers(h // 20 + 1, h // 3 + 2)))
            cv2.ellipse(img, (cx, cy), axes, float(rng.uniform(0, 180)), 0, 360, color, -1)
        else:
            cv2.rectangle(img, (cx, cy), (cx + int(rng.integers(10, w // 2 + 11)), cy + int(rng.integers(10, h // 2 + 11))), color, -1)
    noise = rng.normal(0, 6, img.shape).astype(np.float32)
    return np.clip(img.astype(np.float32) + noise, 0, 255).astype(np.uint8)


def index_colour(i: int) -> np.ndarray:
    """The RGB colour of index image i (i < 1024): levels 8 apart, so JPEG's small errors cannot change the index."""
    lo, hi = 8 * (i % 32) + 4, 8 * ((i // 32) % 32) + 4
    return np.array([lo, hi, 255 - lo], np.uint8)


def index_image(i: int, h: int, w: int) -> np.ndarray:
    """A flat RGB image whose colour encodes i."""
    return np.broadcast_to(index_colour(i), (h, w, 3)).copy()


def decode_index(img: np.ndarray) -> int:
    """Read back the index from the central pixels of a colour index image."""
    h, w = img.shape[:2]
    c = img[h // 4 : 3 * h // 4 + 1, w // 4 : 3 * w // 4 + 1].reshape(-1, img.shape[2]).astype(np.float64).mean(0)
    return int(c[0] // 8) + 32 * int(c[1] // 8)


def write_tree(
    root: str | Path,
    classes: int = 4,
    per_class: int = 32,
    val_per_class: int = 0,
    sizes: tuple[tuple[int, int], ...] = ((375, 500), (480, 640), (768, 1024), (333, 500)),
    kind: str = "photo",
    ext: str = ".JPEG",
    quality: int = 90,
) -> Path:
    """Write root/train/<class>/*.JPEG (and root/val/<class>/ when val_per_class) and return root.

    With kind="index", image number k (counted over train then val, in sorted order) encodes k.
    """
    import cv2

    root = Path(root)
    k = 0
    for split, n in (("train", per_class), ("val", val_per_class)):
        for c in range(classes):
            d = root / split / f"n{c:08d}"
            if n:
                d.mkdir(parents=True, exist_ok=True)
            for j in range(n):
                h, w = sizes[(c * n + j) % len(sizes)]
                img = photo_like(k, h, w) if kind == "photo" else index_image(k, h, w)
                params = [cv2.IMWRITE_JPEG_QUALITY, quality] if ext.lower() in (".jpeg", ".jpg") else []
                if not cv2.imwrite(str(d / f"img_{j:05d}{ext}"), cv2.cvtColor(img, cv2.COLOR_RGB2BGR), params):
                    raise OSError(f"could not write {d / f'img_{j:05d}{ext}'}")
                k += 1
    return root
