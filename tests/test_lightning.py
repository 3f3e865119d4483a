"""dataprep.lightning.PackDataModule under a real lightning.Trainer on CPU: a model learns from it, DDP
ranks see disjoint halves of every epoch, and a run stopped mid-epoch resumes from its checkpoint with
exactly the batches it had not trained on, packed token rows (`packed=`) included."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

pl = pytest.importorskip("lightning.pytorch", reason="needs the lightning extra (pip install 'dataprep[lightning]')")

import dataprep  # noqa: E402
from dataprep.errors import DataprepError  # noqa: E402
from dataprep.images.build import build_images  # noqa: E402
from dataprep.images.settings import ImageSettings  # noqa: E402
from dataprep.lightning import PackDataModule  # noqa: E402
from dataprep.settings import BuildSettings  # noqa: E402
from dataprep.sources import scan_imagenet  # noqa: E402
from dataprep.synthetic import decode_index  # noqa: E402
from tests.test_packed_documents import CONTEXT, coded, served_targets, targets  # noqa: E402,F401 - coded: the unique-id token pack

ROOT = Path(__file__).resolve().parents[1]
# Lightning's own advice (few workers, a small batch) and its dependencies' deprecations are not under test
pytestmark = [pytest.mark.filterwarnings("ignore::FutureWarning"), pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::lightning.fabric.utilities.warnings.PossibleUserWarning")]
COLOURS = [(200, 40, 40), (40, 200, 40), (40, 40, 200)]


def trainer(**kw):
    opts = dict(accelerator="cpu", max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                enable_model_summary=False, num_sanity_val_steps=0)
    return pl.Trainer(**{**opts, **kw})


@pytest.fixture(scope="module")
def colour_pack(tmp_path_factory):
    """3 classes whose colour is the class, under heavy noise: a model must learn, not look up."""
    base = tmp_path_factory.mktemp("colours")
    rng = np.random.default_rng(0)
    for split, n in (("train", 40), ("val", 12)):
        for c, colour in enumerate(COLOURS):
            d = base / "src" / split / f"n{c:08d}"
            d.mkdir(parents=True)
            for j in range(n):
                img = np.clip(np.array(colour) + rng.normal(0, 60, (40, 48, 3)), 0, 255).astype(np.uint8)
                cv2.imwrite(str(d / f"{j}.png"), img[:, :, ::-1])
    build_images(scan_imagenet(base / "src"), base / "p", BuildSettings(), ImageSettings(size=32, mode="raw"))
    return base / "p"


@pytest.fixture(scope="module")
def index_pack(index_tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("lt-index") / "p"
    build_images(scan_imagenet(index_tree), out, BuildSettings(shard_size=5), ImageSettings(size=32, resize="center-crop", mode="raw"))
    return out


class Classifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                       torch.nn.Flatten(), torch.nn.Linear(8, 3))
        self.correct = self.total = 0
        self.dtypes: set = set()

    def training_step(self, batch, i):
        x, y = batch
        self.dtypes.add((x.dtype, x.is_contiguous(memory_format=torch.channels_last)))
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, i):
        x, y = batch
        self.correct += int((self.net(x).argmax(1) == y).sum())
        self.total += len(y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), 0.02)


def test_a_trainer_learns_from_a_pack_normalised_on_the_device(colour_pack):
    torch.manual_seed(0)  # the training run is deterministic on CPU: no lucky or unlucky initialisation
    model = Classifier()
    dm = PackDataModule(colour_pack, batch_size=16, num_workers=2, crop=dataprep.RandomResizedCrop(24, scale=(0.5, 1.0)),
                        flip=True, val_crop=dataprep.CenterCrop(24, resize=28))
    t = trainer(max_epochs=2)
    t.fit(model, dm)
    assert model.dtypes == {(torch.float32, True)}  # floats made after the transfer, channels-last
    model.correct = model.total = 0
    t.validate(model, dm, verbose=False)
    assert model.total == 36 and model.correct / model.total > 0.7  # chance is 1/3
    untrained = Classifier()  # negative control: the margin comes from training; without it the model
    torch.nn.init.zeros_(untrained.net[-1].weight)  # predicts one class (a random initialisation can be lucky)
    torch.nn.init.zeros_(untrained.net[-1].bias)
    t.validate(untrained, dm, verbose=False)
    assert untrained.correct / untrained.total < 0.6


class Recorder(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.seen: list[list[int]] = []

    def training_step(self, batch, i):
        x, _ = batch
        self.seen.append([decode_index(im.permute(1, 2, 0).numpy()) for im in x])
        return self.lin(x.float().mean((2, 3))).sum()

    def validation_step(self, batch, i):
        pass

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), 0.01)


class StopMidEpoch(pl.Callback):
    def __init__(self, epoch: int, batch: int, path: Path):
        self.epoch, self.batch, self.path = epoch, batch, path

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.current_epoch == self.epoch and batch_idx == self.batch:
            trainer.save_checkpoint(self.path)
            trainer.should_stop = True


@pytest.mark.parametrize("workers", [0, 2])
def test_a_run_stopped_mid_epoch_resumes_with_exactly_the_remaining_batches(index_pack, tmp_path, workers):
    def run(callbacks=(), ckpt=None, epochs=3):
        model = Recorder()
        trainer(max_epochs=epochs, limit_val_batches=0, callbacks=list(callbacks)).fit(
            model, PackDataModule(index_pack, batch_size=4, num_workers=workers, normalize=None), ckpt_path=ckpt)
        return model.seen

    whole = run()
    per_epoch = [sorted(i for b in whole[k * 5 : (k + 1) * 5] for i in b) for k in range(3)]
    assert all(e == list(range(18)) for e in per_epoch)  # 5 batches an epoch, every sample once
    assert whole[:5] != whole[5:10]  # the trainer's epochs are new orders
    head = run([StopMidEpoch(1, 2, tmp_path / "mid.ckpt")])
    assert head == whole[:8]
    state = torch.load(tmp_path / "mid.ckpt", weights_only=False)["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]
    assert (state["epoch"], state["samples_consumed"]) == (1, 12)  # the loader's state went into the checkpoint
    rest = run(ckpt=tmp_path / "mid.ckpt")
    assert head + rest == whole  # the remaining 2 batches of epoch 1, then epoch 2: nothing lost or repeated


@pytest.mark.slow
def test_ddp_ranks_see_disjoint_halves_of_each_epoch(index_pack, tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "lightning_ddp_check.py"), str(index_pack), str(tmp_path)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{k}.json").read_text()) for k in (0, 1)]
    for epoch in ("0", "1"):
        a, b = ranks[0][epoch], ranks[1][epoch]
        assert len(a) == len(b) == 9 and not set(a) & set(b) and sorted(a + b) == list(range(18))
    assert ranks[0]["0"] != ranks[0]["1"]


def test_token_and_table_packs(tmp_path):
    from dataprep.tables.build import build_table
    from dataprep.tables.columns import TableSettings
    from dataprep.tokens.tokenize import TokenizeSettings, tokenize

    (tmp_path / "t.txt").write_text("some words to tokenize here and there " * 100)
    tokenize([str(tmp_path / "t.txt")], tmp_path / "tok", TokenizeSettings(), train_bpe_vocab=280)
    dm = PackDataModule.tokens(tmp_path / "tok", context=8, batch_size=5, samples=20, num_workers=0)
    dm.setup("fit")
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (5, 8) and torch.equal(x[:, 1:], y[:, :-1])
    assert dm.val_dataloader() == []  # no val split in this pack: no validation
    rng = np.random.default_rng(0)
    import pandas as pd

    pd.DataFrame({"a": rng.normal(size=30), "y": rng.integers(0, 2, 30)}).to_csv(tmp_path / "t.csv", index=False)
    build_table([str(tmp_path / "t.csv")], tmp_path / "tab", TableSettings(target="y", val_fraction=0.2), {})
    tab = PackDataModule.table(tmp_path / "tab", batch_size=4, num_workers=0)
    tab.setup("fit")
    feats, target = next(iter(tab.train_dataloader()))
    assert feats.shape == (4, 1) and target.dtype == torch.int64
    assert tab.on_after_batch_transfer((feats, target), 0)[0] is feats  # nothing to normalise
    with pytest.raises(DataprepError, match="apply to image packs"):
        PackDataModule(tmp_path / "tok", crop=dataprep.RandomResizedCrop(8))


@pytest.mark.slow
def test_the_lightning_example_trains_stops_and_resumes(tmp_path):
    script = ROOT / "examples" / "lightning_classifier.py"
    common = [str(tmp_path / "pack"), "--size", "32", "--batch-size", "32", "--workers", "0", "--checkpoint", str(tmp_path / "l.ckpt"),
              "--checkpoint-every", "20"]
    prepare = [sys.executable, str(ROOT / "examples" / "prepare.py"), "images", str(tmp_path / "src"), "--out", str(tmp_path / "pack"),
               "--size", "32", "--images", "512"]
    prepared = subprocess.run(prepare, capture_output=True, text=True, timeout=300)
    assert prepared.returncode == 0, prepared.stderr[-3000:]
    first = subprocess.run([sys.executable, str(script), *common, "--max-steps", "20"], capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "val accuracy" in first.stdout and "img/s" in first.stdout
    assert "step 20: Loader at epoch 1, 128 samples of it consumed" in first.stdout  # 16 steps an epoch
    again = subprocess.run([sys.executable, str(script), *common, "--resume", "--max-steps", "22"], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "step 22: Loader at epoch 1, 192 samples of it consumed (resumed from" in again.stdout  # on from step 20


@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")
def test_a_run_resumed_from_an_end_of_epoch_checkpoint_serves_the_next_epoch(index_pack, tmp_path):
    """Lightning restores no loader state from a checkpoint taken at an epoch's end, and makes (and drops)
    an iterator while setting up: the epoch must still be the trainer's, not a repeat of the last one."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    def run(ckpt=None, callbacks=()):
        model = Recorder()
        trainer(max_epochs=3, limit_val_batches=0, callbacks=list(callbacks), enable_checkpointing=bool(callbacks)).fit(
            model, PackDataModule(index_pack, batch_size=4, num_workers=0, normalize=None), ckpt_path=ckpt)
        return model.seen

    def saver(d):
        return ModelCheckpoint(dirpath=tmp_path / d, filename="e{epoch}", save_top_k=-1, save_on_train_epoch_end=True)

    whole = run(callbacks=[saver("a")])
    rest = run(ckpt=next((tmp_path / "a").glob("e*0.ckpt")), callbacks=[saver("a")])
    assert rest == whole[5:] and rest[:5] != whole[:5]  # epochs 1 and 2, not epoch 0 again


def test_a_plain_loader_under_lightning_serves_the_trainers_epochs(index_pack):
    class Plain(pl.LightningDataModule):
        def train_dataloader(self):
            return dataprep.Loader(dataprep.InMemoryImageDataset(index_pack), 4, shuffle=True)

    model = Recorder()
    trainer(max_epochs=2, limit_val_batches=0).fit(model, Plain())
    expect = dataprep.Loader(dataprep.InMemoryImageDataset(index_pack), 4, shuffle=True)
    orders = [expect.epoch_order(e).tolist() for e in (0, 1)]
    assert [i for b in model.seen for i in b] == orders[0] + orders[1]  # epoch 0 first: the set-up iterator used none


def test_a_mid_epoch_world_size_change_is_refused_under_lightning(index_pack):
    from dataprep.lightning import _TrainerLoader

    ds = dataprep.InMemoryImageDataset(index_pack)
    one = dataprep.Loader(ds, 2, shuffle=True)
    it = iter(one)
    next(it)
    with pytest.raises(DataprepError, match="mid-epoch on 1 rank"):
        _TrainerLoader(ds, 2, shuffle=True, rank=0, world_size=2).load_state_dict(one.state_dict())
    list(it)  # at the epoch's end a new world size is fine
    _TrainerLoader(ds, 2, shuffle=True, rank=0, world_size=2).load_state_dict(one.state_dict())


class RowRecorder(pl.LightningModule):
    """Records each packed batch's rows (dicts pass Lightning's transfer as they are)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(1, 1)
        self.seen: list[dict] = []

    def training_step(self, batch, i):
        assert batch["cu_seqlens"].dtype == torch.int32 and batch["input_ids"].shape[1] == CONTEXT
        self.seen.append({k: batch[k].clone() for k in ("input_ids", "labels")})
        return self.lin(batch["input_ids"].float().mean(1, keepdim=True)).sum()

    def validation_step(self, batch, i):
        pass

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), 0.01)


@pytest.mark.parametrize("workers", [0, 2])
def test_packed_rows_of_a_token_pack_serve_every_target_an_epoch_and_resume_mid_epoch(coded, tmp_path, workers):  # noqa: F811
    pack, docs = coded

    def run(callbacks=(), ckpt=None):
        model = RowRecorder()
        dm = PackDataModule(pack, batch_size=4, num_workers=workers, seed=3, packed=dict(context=CONTEXT, packing="first_fit"))
        trainer(max_epochs=2, limit_val_batches=0, callbacks=list(callbacks)).fit(model, dm, ckpt_path=ckpt)
        return model.seen

    whole = run()
    steps = len(whole) // 2
    for e in range(2):
        assert served_targets(whole[e * steps : (e + 1) * steps]) == targets(docs)  # every target once an epoch
    head = run([StopMidEpoch(1, 2, tmp_path / "mid.ckpt")])
    rest = run(ckpt=tmp_path / "mid.ckpt")
    assert len(head) == steps + 3 and len(head) + len(rest) == len(whole)
    assert all(torch.equal(a[k], b[k]) for a, b in zip(head + rest, whole) for k in a)  # nothing lost or repeated
    with pytest.raises(DataprepError, match="token packs"):
        PackDataModule(pack, packed=dict(context=CONTEXT), dataset_kwargs=dict(context=CONTEXT))
