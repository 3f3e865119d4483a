"""Generated detection scenes: takes a seed and a size, gives images whose pixels say where every box is (solid
rectangles, one colour per class, on a background of a colour no class uses) with their true boxes, written as a
COCO instances file and as a YOLO tree over the same images; and the check that served boxes hold their class's
colour and that every pixel of a class's colour lies inside a box of that class (`colour_check`).

What the tests, the example and the benchmark build packs from: a box moved unlike its pixels (not flipped, not
clipped, off by a crop's offset) fails the check, whatever the crop.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

PALETTE = np.array([[230, 40, 40], [40, 200, 60], [50, 80, 230], [240, 220, 30], [200, 60, 220]], np.uint8)
BACKGROUND = np.array([128, 128, 128], np.uint8)  # grey: at least 88 from every class colour in some channel
CATEGORY_IDS = (1, 3, 7, 8, 12)  # COCO ids with gaps (labels 0..4 in id order)
NAMES = ("red", "green", "blue", "yellow", "magenta")


def scene(seed: int, h: int, w: int, objects: int = 5, gap: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(image HWC uint8, boxes (k, 4) float64 x1 y1 x2 y2 on pixel edges, labels (k,)): up to `objects`
    rectangles at least `gap` pixels apart, some touching the border."""
    rng = np.random.default_rng(seed)
    img = np.empty((h, w, 3), np.uint8)
    img[:] = BACKGROUND
    boxes, labels = [], []
    for _ in range(objects * 20):
        if len(boxes) == objects:
            break
        bw, bh = int(rng.integers(max(4, w // 10), w // 2)), int(rng.integers(max(4, h // 10), h // 2))
        x1 = int(rng.choice([0, w - bw])) if rng.random() < 0.2 else int(rng.integers(0, w - bw + 1))
        y1 = int(rng.integers(0, h - bh + 1))
        box = (x1, y1, x1 + bw, y1 + bh)
        if any(box[0] < b[2] + gap and b[0] < box[2] + gap and box[1] < b[3] + gap and b[1] < box[3] + gap for b in boxes):
            continue
        c = int(rng.integers(0, len(PALETTE)))
        img[box[1] : box[3], box[0] : box[2]] = PALETTE[c]
        boxes.append(box)
        labels.append(c)
    return img, np.array(boxes, np.float64).reshape(-1, 4), np.array(labels, np.int64)


def write_scenes(root: str | Path, n: int = 12, sizes: tuple[tuple[int, int], ...] = ((96, 128), (120, 90), (100, 100)),
                 ext: str = ".png", quality: int = 95, seed: int = 0) -> dict:
    """Write generated detection scenes with their boxes as COCO and YOLO files.

    The images are root/images/scene_NNNN{ext}. root/instances.json is their COCO file (CATEGORY_IDS, their
    NAMES); root/labels/*.txt and root/classes.txt are the YOLO tree over the same images.

    Args:
        root: The folder to write into (made if absent).
        n: How many scenes.
        sizes: The (height, width) of the scenes, in turn.
        ext: The images' extension: ".png", or ".jpg" / ".jpeg".
        quality: The JPEG quality.
        seed: The first scene's seed; scene k uses seed + k.

    Returns:
        {"images": the images' folder, "coco": the COCO file, "yolo": root, "truth": {file name: (boxes,
        labels)}}.
    """
    import cv2

    root = Path(root)
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "labels").mkdir(exist_ok=True)
    images, annotations, truth = [], [], {}
    for k in range(n):
        h, w = sizes[k % len(sizes)]
        img, boxes, labels = scene(seed + k, h, w)
        name = f"scene_{k:04d}{ext}"
        params = [cv2.IMWRITE_JPEG_QUALITY, quality] if ext in (".jpg", ".jpeg") else []
        if not cv2.imwrite(str(root / "images" / name), cv2.cvtColor(img, cv2.COLOR_RGB2BGR), params):
            raise OSError(f"could not write {root / 'images' / name}")
        images.append({"id": 100 + k, "file_name": name, "width": w, "height": h})
        lines = []
        for b, c in zip(boxes.tolist(), labels.tolist()):
            annotations.append({"id": len(annotations) + 1, "image_id": 100 + k, "category_id": CATEGORY_IDS[c], "iscrowd": 0,
                                "bbox": [b[0], b[1], b[2] - b[0], b[3] - b[1]], "area": (b[2] - b[0]) * (b[3] - b[1])})
            lines.append(f"{c} {(b[0] + b[2]) / 2 / w:.12f} {(b[1] + b[3]) / 2 / h:.12f} {(b[2] - b[0]) / w:.12f} {(b[3] - b[1]) / h:.12f}")
        (root / "labels" / f"scene_{k:04d}.txt").write_text("\n".join(lines) + ("\n" if lines else ""))
        truth[name] = (boxes, labels)
    coco = {"info": {"description": "dataprep scenes"}, "images": images, "annotations": annotations,
            "categories": [{"id": i, "name": nm, "supercategory": "colour"} for i, nm in zip(CATEGORY_IDS, NAMES)]}
    (root / "instances.json").write_text(json.dumps(coco))
    (root / "classes.txt").write_text("\n".join(NAMES) + "\n")
    return {"images": root / "images", "coco": root / "instances.json", "yolo": root, "truth": truth}


def colour_check(image: np.ndarray, boxes: np.ndarray, labels: np.ndarray, tol: int = 40, margin: float = 1.0,
                 inner: float = 0.85, slack: float = 0.5, cover_tol: int | None = None,
                 dropped: tuple[np.ndarray, np.ndarray] | None = None, dropped_slack: float = 1.0) -> list[str]:
    """What is wrong with a served sample (image HWC uint8, its boxes in output pixels and labels) of a scene:
    a box outside the image or empty; a box whose inner pixels (centres at least `margin` inside it, the part
    outside the image counting as wrong) hold its class's colour (within `tol` in every channel) less than
    `inner` of the time; a pixel of a class's colour (within `cover_tol`, default `tol`) whose centre lies in no
    box of that class grown by `slack`. JPEG bleeds colour a pixel or two past an edge: a tighter `cover_tol`
    counts only the pixels that are the class's colour, not a tint of it. `dropped`: (boxes, labels) the
    sanitiser left out (under min_size of width or height inside the output, as clipped): their sliver may
    still colour the pixels it overlaps, so a class's colour within `dropped_slack` of a dropped box of that
    class is no problem. Only those boxes: a box moved unlike its pixels is dropped in the wrong place too."""
    h, w = image.shape[:2]
    out = []
    close = np.abs(image[:, :, None, :].astype(np.int16) - PALETTE[None, None].astype(np.int16)).max(-1) <= tol  # (h, w, classes)
    ys, xs = np.arange(h) + 0.5, np.arange(w) + 0.5
    for k, (b, c) in enumerate(zip(np.asarray(boxes, np.float64), np.asarray(labels))):
        if not (b[0] >= -1e-3 and b[1] >= -1e-3 and b[2] <= w + 1e-3 and b[3] <= h + 1e-3 and b[2] > b[0] and b[3] > b[1]):
            out.append(f"box {k} {b.round(2).tolist()} is empty or outside the {w}x{h} image")
            continue
        x1, y1, x2, y2 = b[0] + margin, b[1] + margin, b[2] - margin, b[3] - margin
        gx = np.arange(np.floor(x1), np.ceil(x2)) + 0.5
        gy = np.arange(np.floor(y1), np.ceil(y2)) + 0.5
        gx, gy = gx[(gx >= x1) & (gx <= x2)], gy[(gy >= y1) & (gy <= y2)]
        if not len(gx) or not len(gy):
            continue  # too small to hold inner pixels
        ix, iy = (gx - 0.5).astype(np.int64), (gy - 0.5).astype(np.int64)
        ix, iy = ix[(ix >= 0) & (ix < w)], iy[(iy >= 0) & (iy < h)]
        hit = int(close[np.ix_(iy, ix)][:, :, int(c)].sum()) if len(ix) and len(iy) else 0
        if hit < inner * len(gx) * len(gy):
            out.append(f"box {k} {b.round(2).tolist()} (class {int(c)}): {hit} of {len(gx) * len(gy)} inner pixels hold its colour")
    if cover_tol is not None:
        close = np.abs(image[:, :, None, :].astype(np.int16) - PALETTE[None, None].astype(np.int16)).max(-1) <= cover_tol
    for c in range(len(PALETTE)):
        mine = close[:, :, c].copy()
        grown = [(b, slack) for b, lab in zip(np.asarray(boxes, np.float64), np.asarray(labels)) if int(lab) == c]
        if dropped is not None:
            grown += [(b, dropped_slack) for b, lab in zip(np.asarray(dropped[0], np.float64).reshape(-1, 4), np.asarray(dropped[1]))
                      if int(lab) == c]
        for b, s in grown:
            mine[np.ix_((ys >= b[1] - s) & (ys <= b[3] + s), (xs >= b[0] - s) & (xs <= b[2] + s))] = False
        if mine.any():
            y, x = np.argwhere(mine)[0]
            out.append(f"{int(mine.sum())} pixels of class {c}'s colour lie in no box of class {c} (the first at x={x}, y={y})")
    return out
