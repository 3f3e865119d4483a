"""Train a small 3-D conv net on a video pack, served as clips from RAM by dataprep.Loader.

    python examples/prepare.py videos runs/demo-videos --out packs/demo-videos    # a small pack, once
    python examples/train_video.py packs/demo-videos
    python examples/train_video.py PACK --frames 16 --stride 2 --size 112 --model r3d_18    # torchvision's, if installed
    python examples/train_video.py PACK --checkpoint ckpt.pt --checkpoint-every 100 --resume  # after a stop

What it shows:
- `dataprep.VideoDataset` serves clips of `--frames` frames `--stride` apart, one RandomResizedCrop box and one
  flip a clip, uint8 (B, 3, T, H, W) (`layout="cthw"`, what 3-D convolutions take), converted to float on
  the device;
- a checkpoint holds the model, the optimizer, the step and `train_loader.state_dict()`, so `--resume`
  continues mid-epoch with exactly the clips the uninterrupted run would have trained on (the same
  starts, crops and flips: they are drawn from the seed, the epoch and the clip).
"""
from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from torch import nn
from train_classifier import batch_digest, batch_log, learning_rate, pick_device, resume, save_checkpoint

import dataprep
from dataprep import CenterCrop, Loader, RandomResizedCrop, to_device


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("pack", help="a video pack (examples/prepare.py videos, dataprep build video ...)")
    p.add_argument("--val-split", default="val", help="the split evaluated after every epoch (skipped if absent)")
    p.add_argument("--frames", type=int, default=8, help="frames a clip")
    p.add_argument("--stride", type=int, default=2, help="stored frames between a clip's consecutive frames")
    p.add_argument("--size", type=int, default=64, help="training crop size in pixels")
    p.add_argument("--model", choices=("small", "r3d_18"), default="small", help="r3d_18 needs torchvision")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--workers", type=int, default=2, help="Loader worker processes (0: the main process fills batches)")
    p.add_argument("--epochs", type=int, default=8, help="epochs planned: the learning-rate schedule spans them")
    p.add_argument("--steps", type=int, default=None, help="stop after this many optimizer steps in all (a quick run, or a test)")
    p.add_argument("--lr", type=float, default=0.05, help="peak learning rate (SGD, Nesterov momentum)")
    p.add_argument("--seed", type=int, default=0, help="model initialisation and the Loader's order, starts, crops and flips")
    p.add_argument("--checkpoint", metavar="FILE", help="save model, optimizer, step and loader position here")
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="N", help="also save every N steps (and always at the end)")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint (if it exists) exactly where it stopped")
    p.add_argument("--device", default="auto", help="auto (cuda when there is one), cpu, cuda, cuda:1, ...")
    p.add_argument("--log-every", type=int, default=10, help="print the loss every N steps (and after every epoch)")
    p.add_argument("--log-batches", metavar="FILE", help="write one digest per step of the clips trained on (to compare runs)")
    args = p.parse_args(argv)
    if args.resume and not args.checkpoint:
        p.error("--resume needs --checkpoint FILE")
    return args


# -- the model -------------------------------------------------------------------------------------
def unit(cin: int, cout: int, stride: tuple[int, int, int]) -> list[nn.Module]:
    return [nn.Conv3d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm3d(cout), nn.ReLU()]


class SmallVideoNet(nn.Sequential):
    """Four 3x3x3 convolutions (the first keeps the time axis, the rest halve every axis), global average
    pooling over time and space (so any clip length and size works), a linear classifier. Takes uint8 or
    float clips (B, 3, T, H, W)."""

    def __init__(self, classes: int, widths: tuple[int, ...] = (16, 32, 64, 96)):
        layers = unit(3, widths[0], (1, 2, 2))
        for cin, cout in zip(widths, widths[1:]):
            layers += unit(cin, cout, (2, 2, 2))
        super().__init__(*layers, nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(widths[-1], classes))


def make_model(name: str, classes: int) -> nn.Module:
    if name == "small":
        return SmallVideoNet(classes)
    try:
        from torchvision.models.video import r3d_18
    except ImportError:
        sys.exit("--model r3d_18 needs torchvision (pip install torchvision); --model small needs nothing more")
    return r3d_18(num_classes=classes)


def scaled(clips: torch.Tensor) -> torch.Tensor:
    """uint8 clips to float around zero, on the device they are already on."""
    return clips.float().div_(127.5).sub_(1.0)


# -- data ------------------------------------------------------------------------------------------
def make_loaders(args) -> tuple[Loader, Loader | None, int]:
    """The train and val Loaders of clips (B, 3, T, H, W), and the number of classes."""
    clips = {"frames": args.frames, "stride": args.stride, "layout": "cthw"}
    train_ds = dataprep.VideoDataset(args.pack, split="train", **clips)
    # drop_last: every step sees a full batch (batch norm statistics)
    train = Loader(train_ds, args.batch_size, shuffle=True, seed=args.seed, num_workers=args.workers,
                   crop=RandomResizedCrop(args.size), flip=True, drop_last=True)
    if not len(train):
        sys.exit(f"{args.pack}: {len(train_ds)} train clips, fewer than one batch of {args.batch_size}")
    val = None
    if args.val_split in dataprep.read_manifest(args.pack)["splits"]:
        val_ds = dataprep.VideoDataset(args.pack, split=args.val_split, **clips)
        val = Loader(val_ds, args.batch_size, num_workers=args.workers, crop=CenterCrop(args.size))
    else:
        print(f"no {args.val_split!r} split in {args.pack}: no validation", flush=True)
    return train, val, len(train_ds.classes)


def evaluate(model: nn.Module, val: Loader, device: torch.device) -> float:
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for clips, labels in val:
            clips, labels = to_device((clips, labels), device)
            correct += int((model(scaled(clips)).argmax(1) == labels).sum())
            total += len(labels)
    model.train()
    return correct / max(total, 1)


# -- training --------------------------------------------------------------------------------------
def main(argv=None) -> None:
    args = parse_args(argv)
    if not dataprep.is_pack(args.pack):
        sys.exit(f"{args.pack}: no pack there; make one first: python examples/prepare.py videos DIR --out {args.pack}")
    device = pick_device(args.device)
    torch.manual_seed(args.seed)
    train, val, classes = make_loaders(args)
    model = make_model(args.model, classes).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, nesterov=True, weight_decay=5e-5)
    step = resume(args.checkpoint, model, opt, train) if args.resume else 0
    total = args.epochs * len(train)
    stop = min(total, args.steps) if args.steps is not None else total
    print(f"{len(train.dataset)} train clips ({train.dataset.videos} videos), {classes} classes, {len(train)} steps an "
          f"epoch of {args.batch_size} clips of {args.frames} frames; training on {device} to step {stop}", flush=True)
    losses: list[float] = []
    with batch_log(args.log_batches, args.resume) as log:
        while step < stop:
            epoch = train.epoch  # after a resume, the interrupted epoch: its rest comes first
            for clips, labels in train:
                if log:
                    log.write(f"{step + 1} {batch_digest(clips, labels)}\n")
                clips, labels = to_device((clips, labels), device)
                for group in opt.param_groups:
                    group["lr"] = learning_rate(step, total, args.lr)
                loss = F.cross_entropy(model(scaled(clips)), labels)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                step += 1
                losses.append(loss.item())
                if args.checkpoint and args.checkpoint_every and step % args.checkpoint_every == 0 and step < stop:
                    save_checkpoint(args.checkpoint, model, opt, step, train)
                if step % args.log_every == 0:
                    print(f"epoch {epoch} step {step}  loss {sum(losses) / len(losses):.4f}", flush=True)
                    losses.clear()
                if step >= stop:  # stop before asking for another batch: the loader's position is this step's
                    break
            print(f"epoch {epoch}: Loader.stats(): {train.stats()['verdict']}", flush=True)
            if val is not None:
                print(f"epoch {epoch}: val accuracy {100 * evaluate(model, val, device):.1f}% "
                      f"({len(val.dataset)} clips at {args.size} px)", flush=True)
    if args.checkpoint:
        save_checkpoint(args.checkpoint, model, opt, step, train)
    print(f"done: {step} steps", flush=True)
    train.close()
    if val is not None:
        val.close()


if __name__ == "__main__":
    sys.exit(main())
