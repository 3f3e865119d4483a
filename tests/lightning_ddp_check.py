"""Run by tests/test_lightning.py as a script: a real Trainer with strategy="ddp", devices=2 on CPU (gloo),
which starts rank 1 by running this script again; each rank writes the sample indices it trained on per
epoch to OUT/rank<r>.json."""
import json
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch

from dataprep.lightning import PackDataModule
from dataprep.synthetic import decode_index


class Recorder(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.seen: dict[int, list[int]] = {}

    def training_step(self, batch, i):
        x, _ = batch
        self.seen.setdefault(self.current_epoch, []).extend(decode_index(im.permute(1, 2, 0).numpy()) for im in x)
        return self.lin(x.float().mean((2, 3))).sum()

    def validation_step(self, batch, i):
        pass

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), 0.01)


if __name__ == "__main__":
    pack, out = sys.argv[1], Path(sys.argv[2])
    model = Recorder()
    trainer = pl.Trainer(strategy="ddp", devices=2, accelerator="cpu", max_epochs=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(model, PackDataModule(pack, batch_size=3, num_workers=0, normalize=None))
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps({str(k): v for k, v in model.seen.items()}))
