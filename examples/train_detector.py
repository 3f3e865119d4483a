"""Train a small one-stage detector on a detection pack, its boxes moved with every crop and flip by dataprep.Loader.

    python examples/train_detector.py prepare runs/scenes --out packs/scenes      # generated scenes, a pack, once
    python examples/train_detector.py train packs/scenes --steps 200
    python examples/train_detector.py train /fast/coco-512 --size 384 --workers 8 --max-boxes 100

What it shows:
- the Loader serves (images, boxes, labels, counts): boxes (B, M, 4) float32 in the crop's pixels, labels padded
  with -1; the crop, resize and flip the pixels went through were applied to the boxes in the same workers;
- M is the batch's own largest count (or `--max-boxes`, one shape for every batch);
- the head (FCOS-like: at every cell a class and the distances to the four sides of the box whose centre region
  holds it) is a few convolutions, so any CPU runs a few steps; swap in torchvision's detectors for real work.
"""
from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from torch import nn

STRIDE = 8


def prepare(src: str, out: str, n: int, size: int) -> None:
    """Generated scenes (solid rectangles, one colour per class) written as COCO, built into a detection pack."""
    from dataprep import build, write_scenes

    scenes = write_scenes(src, n=n, sizes=((size, size + size // 3), (size + size // 4, size)))
    summary = build.coco(scenes["images"], out, annotations=scenes["coco"], size=size, overwrite=True)
    print("\n".join(summary.lines()))


class Head(nn.Module):
    """A small backbone at stride 8 and two outputs per cell: class logits and log distances (l, t, r, b)."""

    def __init__(self, classes: int, width: int = 48):
        super().__init__()
        layers, c = [], 3
        for _ in range(3):
            layers += [nn.Conv2d(c, width, 3, stride=2, padding=1), nn.BatchNorm2d(width), nn.ReLU(inplace=True)]
            c = width
        layers += [nn.Conv2d(width, width, 3, padding=1), nn.ReLU(inplace=True)]
        self.body = nn.Sequential(*layers)
        self.cls = nn.Conv2d(width, classes, 1)
        self.box = nn.Conv2d(width, 4, 1)

    def forward(self, x):
        f = self.body(x)
        return self.cls(f), self.box(f)


def targets(boxes: torch.Tensor, labels: torch.Tensor, counts: torch.Tensor, h: int, w: int):
    """Per cell: the class of the smallest box whose centre region (half its size) holds the cell's centre (-1:
    background) and its distances to that box's sides."""
    ys = (torch.arange(h // STRIDE, device=boxes.device) + 0.5) * STRIDE
    xs = (torch.arange(w // STRIDE, device=boxes.device) + 0.5) * STRIDE
    cy, cx = torch.meshgrid(ys, xs, indexing="ij")
    cx, cy = cx[None, :, :, None], cy[None, :, :, None]
    x1, y1, x2, y2 = (boxes[:, None, None, :, k] for k in range(4))
    mx, my, hw, hh = (x1 + x2) / 2, (y1 + y2) / 2, (x2 - x1) / 4 + STRIDE / 2, (y2 - y1) / 4 + STRIDE / 2
    valid = (torch.arange(boxes.shape[1], device=boxes.device)[None, :] < counts[:, None])[:, None, None, :]
    inside = valid & ((cx - mx).abs() <= hw) & ((cy - my).abs() <= hh)
    area = torch.where(inside, (x2 - x1) * (y2 - y1), torch.full_like(x1.expand_as(inside), float("inf")))
    best = area.argmin(-1, keepdim=True)
    has = inside.any(-1)
    cls = torch.where(has, labels[:, None, None, :].expand_as(inside).gather(-1, best)[..., 0], torch.full_like(has, -1, dtype=torch.long))
    sides = torch.stack([cx - x1, cy - y1, x2 - cx, y2 - cy], -1).expand(*inside.shape, 4)
    dist = sides.gather(-2, best[..., None].expand(*best.shape, 4))[..., 0, :]
    return cls, dist.clamp(min=1.0)


def train(pack: str, steps: int, size: int, batch: int, workers: int, max_boxes: int | None, lr: float) -> float:
    from dataprep import DetectionDataset, Loader, Normalize, RandomResizedCrop

    ds = DetectionDataset(pack, max_boxes=max_boxes)
    loader = Loader(ds, batch_size=batch, shuffle=True, num_workers=workers, crop=RandomResizedCrop(size, scale=(0.3, 1.0)), flip=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = Head(len(ds.classes)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    norm = Normalize(device=device)
    step, loss = 0, torch.tensor(0.0)
    while step < steps:
        for batch_ in loader:
            images, boxes, labels, counts = (t.to(device, non_blocking=True) for t in batch_)
            x = norm(images)
            cls, dist = targets(boxes, labels, counts, x.shape[2], x.shape[3])
            logits, box = model(x)
            logits, box = logits.permute(0, 2, 3, 1), box.permute(0, 2, 3, 1)
            onehot = F.one_hot(cls.clamp(min=0), logits.shape[-1]).float() * (cls >= 0)[..., None]
            loss_cls = F.binary_cross_entropy_with_logits(logits, onehot, reduction="sum") / max(1, int((cls >= 0).sum()))
            pos = cls >= 0
            loss_box = F.l1_loss(box[pos], dist[pos].log()) if pos.any() else box.sum() * 0
            loss = loss_cls + loss_box
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            if step % 10 == 0 or step == steps:
                print(f"step {step}: loss {loss.item():.3f} (classes {loss_cls.item():.3f}, boxes {loss_box.item():.3f}; "
                      f"{int(counts.sum())} boxes in the batch)", flush=True)
            if step >= steps:
                break
    loader.close()
    return loss.item()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    pr = sub.add_parser("prepare", help="write generated scenes to SRC and build a detection pack from them")
    pr.add_argument("src")
    pr.add_argument("--out", required=True)
    pr.add_argument("--images", type=int, default=64)
    pr.add_argument("--size", type=int, default=96)
    tr = sub.add_parser("train", help="train the head a few steps on a detection pack")
    tr.add_argument("pack")
    tr.add_argument("--steps", type=int, default=100)
    tr.add_argument("--size", type=int, default=64, help="training crop size (a multiple of 8)")
    tr.add_argument("--batch-size", type=int, default=16)
    tr.add_argument("--workers", type=int, default=2)
    tr.add_argument("--max-boxes", type=int, default=None)
    tr.add_argument("--lr", type=float, default=3e-3)
    a = p.parse_args(argv)
    if a.command == "prepare":
        prepare(a.src, a.out, a.images, a.size)
    else:
        from dataprep import is_pack

        if not is_pack(a.pack):
            sys.exit(f"{a.pack}: no pack there; make one first: python examples/train_detector.py prepare DIR --out {a.pack}")
        train(a.pack, a.steps, a.size, a.batch_size, a.workers, a.max_boxes, a.lr)


if __name__ == "__main__":
    main()
