"""The classifier of train_classifier.py, through PyTorch Lightning: dataprep.lightning.PackDataModule
gives the Trainer Loaders sharded by rank, following its epochs, saved in its checkpoints and restored on
`fit(ckpt_path=...)`, with batches normalised on the device.

    python examples/prepare.py images runs/demo-src --out packs/demo          # a small pack, once
    python examples/lightning_classifier.py packs/demo --epochs 2
    python examples/lightning_classifier.py /fast/imagenet-256 --size 224 --devices 8 --precision bf16-mixed
    python examples/lightning_classifier.py PACK --checkpoint runs/l.ckpt --checkpoint-every 20
    python examples/lightning_classifier.py PACK --checkpoint runs/l.ckpt --checkpoint-every 20 --resume   # after a stop

Needs `pip install 'dataprep[lightning]'`.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lightning.pytorch as pl  # noqa: E402
from train_classifier import ResNet  # noqa: E402  (the same network)

import dataprep  # noqa: E402
from dataprep.lightning import PackDataModule  # noqa: E402


class Classifier(pl.LightningModule):
    def __init__(self, classes: int, channels: int, lr: float):
        super().__init__()
        self.net = ResNet(classes, channels).to(memory_format=torch.channels_last)
        self.lr = lr
        self.correct = self.seen = 0
        self.images, self.started = 0, None

    def training_step(self, batch, i):
        x, y = batch  # normalised floats on the device already (PackDataModule.on_after_batch_transfer)
        if self.started is None:
            self.started = time.perf_counter()
        else:
            self.images += len(y)
        loss = F.cross_entropy(self.net(x), y)
        self.log("loss", loss, prog_bar=True)
        return loss

    def on_validation_epoch_start(self):
        self.correct = self.seen = 0

    def validation_step(self, batch, i):
        x, y = batch
        self.correct += int((self.net(x).argmax(1) == y).sum())
        self.seen += len(y)

    def on_validation_epoch_end(self):
        if self.seen:
            acc = self.correct / self.seen
            self.log("val_acc", acc)
            print(f"epoch {self.current_epoch}: val accuracy {100 * acc:.1f}% ({self.seen} images)", flush=True)

    def on_train_end(self):
        if self.started is not None and self.images:
            print(f"train: {self.images / (time.perf_counter() - self.started):,.0f} img/s over the whole step", flush=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), self.lr, momentum=0.9, nesterov=True, weight_decay=5e-5)


class SaveEvery(pl.Callback):
    """A checkpoint every N steps, taken inside the epoch (a checkpoint taken after `fit` returns marks the
    epoch finished): model, optimizer, the loops' progress and the train Loader's state."""

    def __init__(self, path: str, every: int):
        self.path, self.every = path, every

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step % self.every == 0:
            trainer.save_checkpoint(self.path)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("pack", help="an image pack with a train split (and a val split, for validation): examples/prepare.py "
                                 "images, dataprep build ...")
    ap.add_argument("--size", type=int, default=64, help="crop side in pixels (train: random-resized crops; val: centre crops)")
    ap.add_argument("--batch-size", type=int, default=64, help="images per batch on each device")
    ap.add_argument("--workers", type=int, default=2, help="Loader worker processes per device (0: decode in the trainer)")
    ap.add_argument("--epochs", type=int, default=2, help="epochs to train")
    ap.add_argument("--max-steps", type=int, default=-1, help="stop after this many steps (-1: no limit)")
    ap.add_argument("--lr", type=float, default=0.1, help="SGD learning rate")
    ap.add_argument("--devices", type=int, default=1, help="devices to train on (more than 1: DDP)")
    ap.add_argument("--precision", default=None, help="Lightning precision; None picks bf16-mixed on a GPU, 32-true on the CPU")
    ap.add_argument("--checkpoint", metavar="FILE", help="save the run here (model, optimizer, loop and Loader states)")
    ap.add_argument("--checkpoint-every", type=int, default=100, help="steps between checkpoints")
    ap.add_argument("--resume", action="store_true", help="continue the run saved in --checkpoint")
    a = ap.parse_args(argv)
    pack = Path(a.pack)
    if not dataprep.is_pack(pack):
        sys.exit(f"{pack}: no pack there; make one first: python examples/prepare.py images DIR --out {pack}")
    dm = PackDataModule(pack, batch_size=a.batch_size, num_workers=a.workers, crop=dataprep.RandomResizedCrop(a.size),
                        flip=True, val_crop=dataprep.CenterCrop(a.size), drop_last=True)
    manifest = dm.manifest
    channels = 1 if manifest["settings"]["image"]["grayscale"] else 3
    model = Classifier(len(manifest["classes"]), channels, a.lr)
    gpu = torch.cuda.is_available()
    trainer = pl.Trainer(accelerator="gpu" if gpu else "cpu", devices=a.devices, strategy="ddp" if a.devices > 1 else "auto",
                         precision=a.precision or ("bf16-mixed" if gpu else "32-true"), max_epochs=a.epochs,
                         max_steps=a.max_steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0,
                         callbacks=[SaveEvery(a.checkpoint, a.checkpoint_every)] if a.checkpoint else [])
    resume = a.checkpoint if a.resume and Path(a.checkpoint).exists() else None
    trainer.fit(model, dm, ckpt_path=resume)
    state = trainer.fit_loop.state_dict()["state_dict"].get("combined_loader", [{}])[0]
    print(f"stopped at step {trainer.global_step}: Loader at epoch {state.get('epoch')}, "
          f"{state.get('samples_consumed')} samples of it consumed" + (f" (resumed from {resume})" if resume else ""), flush=True)


if __name__ == "__main__":
    main()
