"""Train a small ResNet on an image pack, served from RAM by dataprep.Loader.

    python examples/prepare.py images runs/demo-src --out packs/demo            # a small pack, once
    python examples/train_classifier.py packs/demo
    python examples/train_classifier.py /fast/imagenet-256 --size 224 --workers 8 --epochs 16 --progressive
    python examples/train_classifier.py PACK --checkpoint ckpt.pt --checkpoint-every 500
    python examples/train_classifier.py PACK --checkpoint ckpt.pt --checkpoint-every 500 --resume   # after a stop

What it shows:
- the Loader crops, flips and batches uint8 images in its workers; the float conversion and the
  normalisation happen on the device (dataprep.Normalize), where they are cheap;
- a checkpoint holds the model, the optimizer, the step and `train_loader.state_dict()`, so `--resume`
  continues mid-epoch with exactly the batches the uninterrupted run would have trained on;
- which side bounds the run: the time spent waiting for the next batch against the whole step.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import math
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

import dataprep
from dataprep import CenterCrop, Loader, Normalize, RandomResizedCrop, Schedule, to_device

DATA_BOUND = 0.10  # waiting for data more than this share of the step: the data path is the bottleneck


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("pack", help="an image pack (examples/prepare.py images, dataprep build ...)")
    p.add_argument("--val-split", default="val", help="the split evaluated after every epoch (skipped if absent)")
    p.add_argument("--size", type=int, default=64, help="training crop size in pixels")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2, help="Loader worker processes (0: the main process fills batches)")
    p.add_argument("--epochs", type=int, default=8, help="epochs planned: the learning-rate schedule spans them")
    p.add_argument("--steps", type=int, default=None, help="stop after this many optimizer steps in all (a quick run, or a test)")
    p.add_argument("--lr", type=float, default=0.2, help="peak learning rate (SGD, Nesterov momentum)")
    p.add_argument("--seed", type=int, default=0, help="model initialisation and the Loader's order, crops and flips")
    p.add_argument("--checkpoint", metavar="FILE", help="save model, optimizer, step and loader position here")
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="N", help="also save every N steps (and always at the end)")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint (if it exists) exactly where it stopped")
    p.add_argument("--progressive", action="store_true", help="ramp the crop size from 0.75 x --size up to --size over the epochs")
    p.add_argument("--device", default="auto", help="auto (cuda when there is one), cpu, cuda, cuda:1, ...")
    p.add_argument("--log-every", type=int, default=50, help="print the figures every N steps (and after every epoch)")
    p.add_argument("--log-batches", metavar="FILE", help="write one digest per step of the batch trained on (to compare runs)")
    args = p.parse_args(argv)
    if args.resume and not args.checkpoint:
        p.error("--resume needs --checkpoint FILE")
    return args


# -- the model -------------------------------------------------------------------------------------
class Block(nn.Module):
    """A ResNet basic block: two 3x3 convolutions and a shortcut (a 1x1 projection when the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity() if stride == 1 and cin == cout else \
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ResNet(nn.Sequential):
    """A small ResNet: a strided stem, one block per stage, global average pooling (so any input size
    works: what progressive resizing needs), a linear classifier."""

    def __init__(self, classes: int, channels: int = 3, widths: tuple[int, ...] = (32, 64, 128)):
        layers: list[nn.Module] = [nn.Conv2d(channels, widths[0], 3, 2, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU()]
        for i, w in enumerate(widths):
            layers.append(Block(widths[max(i - 1, 0)], w, 1 if i == 0 else 2))
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(widths[-1], classes)]
        super().__init__(*layers)


# -- data ------------------------------------------------------------------------------------------
def make_loaders(args) -> tuple[Loader, Loader | None, int, int]:
    """The train and val Loaders, the number of classes and of channels."""
    train_ds = dataprep.InMemoryImageDataset(args.pack, split="train")
    schedule = None
    if args.progressive:
        # Each epoch's crop size from 0.75 x size up to size, reached two epochs before the end (the last
        # epochs train at the size the model is evaluated at); multiples of 8 keep the shapes few.
        low = max(8, 8 * round(0.75 * args.size / 8))
        schedule = Schedule.ramp(range(low, args.size + 1, 8), start=low, end=args.size,
                                 first_epoch=0, last_epoch=max(0, args.epochs - 2))
    # drop_last: every step sees a full batch (batch norm statistics, and one shape for torch.compile)
    train = Loader(train_ds, args.batch_size, shuffle=True, seed=args.seed, num_workers=args.workers,
                   crop=RandomResizedCrop(args.size), flip=True, schedule=schedule, drop_last=True)
    if not len(train):
        sys.exit(f"{args.pack}: {len(train_ds)} train images, fewer than one batch of {args.batch_size}")
    val = None
    if args.val_split in dataprep.read_manifest(args.pack)["splits"]:
        val_ds = dataprep.InMemoryImageDataset(args.pack, split=args.val_split)
        val = Loader(val_ds, args.batch_size, num_workers=args.workers, crop=CenterCrop(args.size))
    else:
        print(f"no {args.val_split!r} split in {args.pack}: no validation", flush=True)
    return train, val, len(train_ds.classes), train_ds.field.channels


def batch_digest(*tensors: torch.Tensor) -> str:
    """A short hash of a batch's shapes and bytes: two runs trained on the same data log the same lines."""
    h = hashlib.sha1()
    for t in tensors:
        h.update(str(tuple(t.shape)).encode())
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


class Meter:
    """The wall time of training steps, split into waiting for the next batch (the data path) and the
    rest (copy, forward, backward, update). Figures are read after a device sync, so queued GPU work is
    counted where it ran."""

    def __init__(self, device: torch.device):
        self.device = device
        self.totals = [0, 0.0, 0.0]  # images, waiting, wall over every reported window
        self.restart()

    def restart(self) -> None:
        """Start a new window (after evaluation, or after the untimed first step)."""
        self.images, self.steps, self.wait, self.loss = 0, 0, 0.0, torch.zeros((), device=self.device)
        self.start = time.perf_counter()

    def batches(self, loader: Loader):
        """Iterate `loader`, timing every wait for a batch."""
        it = iter(loader)
        try:
            while True:
                t = time.perf_counter()
                try:
                    batch = next(it)
                except StopIteration:
                    return
                self.wait += time.perf_counter() - t
                yield batch
        finally:
            it.close()  # leaving early (--steps): the Loader waits for the parts in flight before reusing slots

    def step(self, images: int, loss: torch.Tensor) -> None:
        self.images, self.steps = self.images + images, self.steps + 1
        self.loss += loss.detach().float()  # summed on the device: no sync per step

    def report(self, label: str) -> None:
        if not self.steps:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        wall = time.perf_counter() - self.start
        for i, v in enumerate((self.images, self.wait, wall)):
            self.totals[i] += v
        print(f"{label}  loss {self.loss.item() / self.steps:.4f}  {figures(self.images, self.wait, wall)}", flush=True)
        self.restart()

    def summary(self) -> str:
        images, wait, wall = self.totals
        return figures(images, wait, wall) if images else "too few steps to time (the first one is not timed)"


def figures(images: int, wait: float, wall: float) -> str:
    """Images/s of the data path alone and of the whole step, and which of the two bounds the run.

    The data path's rate is images over the time the step waited for them: what serving costs the
    trainer. When the workers keep up, batches are ready before they are asked for and this rate is far
    above what the workers could make flat out (`dataprep bench PACK` measures that); the share of the
    step spent waiting is what says which side to speed up."""
    share = wait / wall if wall > 0 else 0.0
    bound = "data-bound" if share > DATA_BOUND else "compute-bound"
    data_rate = f"{images / wait:,.0f}" if wait > 0 else "inf"
    return (f"data path {data_rate} img/s, whole step {images / wall:,.0f} img/s: {bound} "
            f"(waiting for data {100 * share:.1f}% of the step)")


# -- training --------------------------------------------------------------------------------------
def learning_rate(step: int, total: int, peak: float) -> float:
    """Linear warm-up, then a cosine to zero at `total`. A function of the step alone, so a resumed run
    needs no scheduler state; `total` comes from --epochs, never from --steps, so a run cut short by
    --steps and resumed follows the same schedule as one that was never stopped."""
    warmup = max(1, min(100, total // 10))
    if step < warmup:
        return peak * (step + 1) / warmup
    return 0.5 * peak * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))


def save_checkpoint(path: str, model: nn.Module, opt: torch.optim.Optimizer, step: int, loader: Loader) -> None:
    """Written to a temporary file and renamed into place: a stop while saving keeps the previous one."""
    state = {"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "loader": loader.state_dict()}
    torch.save(state, f"{path}.tmp")
    os.replace(f"{path}.tmp", path)
    print(f"checkpoint: {path} (step {step})", flush=True)


def resume(path: str, model: nn.Module, opt: torch.optim.Optimizer, loader: Loader) -> int:
    """Restore a checkpoint and return its step; the loader's next iter() serves the rest of its epoch.
    No checkpoint yet is a fresh start: one command line serves the first run and every restart."""
    if not os.path.exists(path):
        print(f"no checkpoint at {path} yet: starting from step 0", flush=True)
        return 0
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    loader.load_state_dict(state["loader"])
    print(f"resumed from {path}: step {state['step']}, epoch {loader.epoch}, "
          f"{state['loader']['samples_consumed']} samples of it already trained on", flush=True)
    return int(state["step"])


def evaluate(model: nn.Module, val: Loader, norm: Normalize, device: torch.device, autocast) -> float:
    model.eval()  # batch norm uses its running statistics and updates none
    correct = total = 0
    with torch.no_grad(), autocast():
        for images, labels in val:
            images, labels = to_device((images, labels), device)
            correct += int((model(norm(images)).argmax(1) == labels).sum())
            total += len(labels)
    model.train()
    return correct / max(total, 1)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def batch_log(path: str | None, append: bool):
    """The --log-batches file (appended to by a resumed run), or nothing. Line-buffered: a killed run's
    log holds every step it trained on."""
    return open(path, "a" if append else "w", buffering=1) if path else contextlib.nullcontext()


def train_step(net: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, labels: torch.Tensor, lr: float, autocast) -> torch.Tensor:
    for group in opt.param_groups:
        group["lr"] = lr
    with autocast():
        loss = F.cross_entropy(net(x), labels, label_smoothing=0.1)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


def main(argv=None) -> None:
    args = parse_args(argv)
    if not dataprep.is_pack(args.pack):
        sys.exit(f"{args.pack}: no pack there; make one first: python examples/prepare.py images DIR --out {args.pack}")
    device = pick_device(args.device)
    cuda = device.type == "cuda"
    torch.backends.cudnn.benchmark = cuda  # picks the fastest convolution algorithms for each input shape
    torch.manual_seed(args.seed)
    train, val, classes, channels = make_loaders(args)
    # uint8 in, float out, on the device: ImageNet's mean and std (0-255 units) for colour packs
    norm = Normalize(*(() if channels == 3 else ((127.5,), (64.0,))), device=device, channels_last=True)
    model = ResNet(classes, channels).to(device, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, nesterov=True, weight_decay=5e-5)
    step = resume(args.checkpoint, model, opt, train) if args.resume else 0
    # Mixed precision and compilation pay off on a GPU; on the CPU they would only slow this example down.
    amp = cuda and torch.cuda.is_bf16_supported()  # bfloat16 needs no loss scaling (Ampere or newer)
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if amp else contextlib.nullcontext
    net = torch.compile(model) if cuda else model  # `model` keeps the weights; checkpoints save it, not the wrapper
    total = args.epochs * len(train)
    stop = min(total, args.steps) if args.steps is not None else total
    print(f"{len(train.dataset)} train images, {classes} classes, {len(train)} steps an epoch of {args.batch_size}; "
          f"training on {device} to step {stop} (workers: {args.workers})", flush=True)
    meter, untimed = Meter(device), step + 1  # the first step forks the workers and warms up (or compiles)
    with batch_log(args.log_batches, args.resume) as log:
        while step < stop:
            epoch = train.epoch  # after a resume, the interrupted epoch: its rest comes first
            if train.schedule is not None:  # --progressive: say the crop size this epoch trains at
                print(f"epoch {epoch}: crops of {train.schedule(epoch)} px (progressive, up to {args.size} px)", flush=True)
            for images, labels in meter.batches(train):
                if log:
                    log.write(f"{step + 1} {batch_digest(images, labels)}\n")
                images, labels = to_device((images, labels), device)
                loss = train_step(net, opt, norm(images), labels, learning_rate(step, total, args.lr), autocast)
                step += 1
                meter.step(len(labels), loss)
                if step == untimed:
                    meter.restart()
                if args.checkpoint and args.checkpoint_every and step % args.checkpoint_every == 0 and step < stop:
                    save_checkpoint(args.checkpoint, model, opt, step, train)
                if step % args.log_every == 0:
                    meter.report(f"epoch {epoch} step {step}")
                if step >= stop:  # stop before asking for another batch: the loader's position is this step's
                    break
            meter.report(f"epoch {epoch} step {step}")
            print(f"epoch {epoch}: Loader.stats(): {train.stats()['verdict']}", flush=True)  # the Loader's own figure
            if val is not None:
                print(f"epoch {epoch}: val accuracy {100 * evaluate(net, val, norm, device, autocast):.1f}% "
                      f"({len(val.dataset)} images at {args.size} px)", flush=True)
            meter.restart()
    if args.checkpoint:
        save_checkpoint(args.checkpoint, model, opt, step, train)
    print(f"done: {step} steps; {meter.summary()}", flush=True)
    train.close()
    if val is not None:
        val.close()


if __name__ == "__main__":
    sys.exit(main())
