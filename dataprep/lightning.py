"""PyTorch Lightning: takes a pack and the Loader's options, gives a LightningDataModule whose loaders
are sharded by the trainer's rank and world size, follow the trainer's epoch, go into its checkpoints
(`state_dict`) and come back from them on `fit(ckpt_path=...)`, and turn image batches into normalised
floats on the device (`on_after_batch_transfer`), so the CPU never touches a float.

Lightning calls `set_epoch` only on DataLoader samplers and adds a DistributedSampler only to torch
DataLoaders; the loaders made here need neither. Install with `pip install 'dataprep[lightning]'`;
nothing else in dataprep imports Lightning.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

try:
    import lightning.pytorch as pl
except ImportError as e:  # pragma: no cover - the extra is installed by `make test`
    raise ImportError("dataprep.lightning needs PyTorch Lightning: pip install 'dataprep[lightning]'") from e

import torch

from .errors import DataprepError, UsageError
from .kinds import kind_of
from .pack.backends import read_manifest
from .serve.loader import Loader
from .serve.resume import epoch_left
from .serve.transfer import IMAGENET_MEAN, IMAGENET_STD, Normalize

IMAGE_KINDS = ("images", "segmentation")  # batches normalised on the device
FRAME_KINDS = (*IMAGE_KINDS, "video")  # a crop plan and flip apply (video: one box and one flip a clip)


class _TrainerLoader(Loader):
    """A Loader whose next epoch is the trainer's (unless a restored state says where to go on)."""

    trainer = None

    def load_state_dict(self, state) -> None:
        """As Loader's, but a world-size change in the middle of an epoch is refused: Lightning counts the
        restored epoch's steps against a length it read before the restore, so the epoch would end early
        (and samples go untrained) or late. Resume mid-epoch on as many devices, or from an epoch's end."""
        if isinstance(state, dict) and state.get("format") == "dataprep.Loader" and epoch_left(state, self.drop_last) \
                and int(state.get("world_size", 1)) != self.world_size:
            raise DataprepError(f"this checkpoint was taken mid-epoch on {state['world_size']} rank(s); resuming it on "
                                f"{self.world_size} would skip or repeat samples under Lightning: resume on "
                                f"{state['world_size']} device(s), or from a checkpoint taken at an epoch's end")
        super().load_state_dict(state)

    def _starting(self) -> None:  # at the epoch's first batch, when current_epoch is the one to serve
        if self.cursor.restored is None and self.trainer is not None:
            self.set_epoch(int(self.trainer.current_epoch))


class PackDataModule(pl.LightningDataModule):
    """Train and validation loaders over one pack, of any kind (read from its manifest).

    Args:
        pack: the pack directory.
        train_split, val_split: split names (a missing val split means no validation loader).
        batch_size, num_workers, seed: as the Loader's (per rank: the global batch is batch_size x ranks).
        crop, flip: the train loader's crop plan (e.g. dataprep.RandomResizedCrop(224)) and flip.
        val_crop: the validation loader's (e.g. dataprep.CenterCrop(224)); image and video packs only.
        schedule: a resolution Schedule over epochs (the train loader's).
        cache: where the split lives [default: "shm" for images and video, "ram" otherwise].
        normalize: for image packs (video clips stay uint8, (B, T, 3, H, W)), "imagenet" (the default),
            (mean, std) in 0-255 units, or None to keep
            the batch uint8; the conversion runs on the device after the transfer, channels-last.
        dtype: the normalised batch's dtype.
        dataset_kwargs: passed to the kind's dataset class (e.g. context=1024 for tokens).
        packed: for token packs, rows of whole documents instead of windows: PackedDocuments' arguments
            (`dict(context=2048, packing="best_fit")`, and its plan's seed [default: `seed`]; the split and
            cache are the module's). Batches are
            dicts (input_ids, labels, position_ids, document_ids, cu_seqlens, max_seqlen).
    """

    def __init__(self, pack: str | os.PathLike, train_split: str = "train", val_split: str | None = "val",
                 batch_size: int = 256, num_workers: int = 8, seed: int = 0, crop: Any = None, val_crop: Any = None,
                 flip: bool = False, schedule=None, cache: str | None = None, normalize: Any = "imagenet",
                 dtype: torch.dtype = torch.float32, drop_last: bool = False, dataset_kwargs: dict | None = None,
                 packed: dict | None = None):
        super().__init__()
        self.pack = Path(pack)
        self.manifest = read_manifest(self.pack)
        self.kind = kind_of(self.manifest, self.pack / "manifest.json").name
        if packed is not None and (self.kind != "tokens" or dataset_kwargs):
            raise UsageError(f"PackDataModule: packed= takes the place of dataset_kwargs and serves token packs; {self.pack} "
                             f"is a {self.kind!r} pack" + (" and dataset_kwargs is given" if dataset_kwargs else ""))
        if packed is not None:
            if not isinstance(packed, dict) or "context" not in packed or set(packed) - {"context", "packing", "seed"}:
                raise UsageError(f"PackDataModule: packed= is a dict of PackedDocuments' context (required), packing and "
                                 f"seed, not {packed!r}: the split and cache come from the module's own arguments")
        self.packed = None if packed is None else {"seed": seed, **packed}
        images = self.kind in IMAGE_KINDS
        if self.kind not in FRAME_KINDS and (crop is not None or val_crop is not None or flip):
            raise DataprepError(f"crop and flip apply to image packs and video packs; {self.pack} is a {self.kind!r} pack")
        splits = self.manifest.get("splits", {})
        if train_split not in splits:
            raise DataprepError(f"{self.pack}: no split {train_split!r} (it has {sorted(splits)})")
        self.train_split = train_split
        self.val_split = val_split if val_split in splits else None
        self.batch_size, self.num_workers, self.seed, self.drop_last = batch_size, num_workers, seed, drop_last
        self.crop, self.val_crop, self.flip, self.schedule = crop, val_crop, flip, schedule
        self.cache = cache or ("shm" if self.kind in FRAME_KINDS else "ram")
        self.dataset_kwargs = dict(dataset_kwargs or {})
        if normalize == "imagenet":  # a grayscale pack gets the channels' averages
            gray = images and bool(self.manifest.get("settings", {}).get("image", {}).get("grayscale"))
            normalize = ((sum(IMAGENET_MEAN) / 3,), (sum(IMAGENET_STD) / 3,)) if gray else (IMAGENET_MEAN, IMAGENET_STD)
        self.normalize = normalize if images else None
        self.dtype = dtype
        self._norm: Normalize | None = None
        self.train_set = self.val_set = None
        self._loaders: dict[str, Loader] = {}

    # -- the kinds that take other arguments --------------------------------------------------------
    @classmethod
    def tokens(cls, pack, context: int, batch_size: int, samples: int | None = None, mode: str = "random", **kw) -> "PackDataModule":
        """A token pack: windows of `context` tokens (TokenDataset)."""
        return cls(pack, batch_size=batch_size, dataset_kwargs={"context": context, "samples": samples, "mode": mode,
                                                                 **kw.pop("dataset_kwargs", {})}, **kw)

    @classmethod
    def table(cls, pack, batch_size: int, categorical: str = "separate", **kw) -> "PackDataModule":
        """A table pack: rows (TabularDataset)."""
        return cls(pack, batch_size=batch_size, dataset_kwargs={"categorical": categorical, **kw.pop("dataset_kwargs", {})}, **kw)

    @classmethod
    def video(cls, pack, batch_size: int, frames: int = 16, stride: int | None = None, clips_per_video: int = 1,
              fps: float | None = None, **kw) -> "PackDataModule":
        """A video pack: clips of `frames` frames `stride` stored frames apart, or `fps` a second by the timestamps
        (VideoDataset's; neither: stride 2), uint8 (B, T, 3, H, W)."""
        clips = {"frames": frames, "stride": stride, "clips_per_video": clips_per_video, "fps": fps}
        return cls(pack, batch_size=batch_size, dataset_kwargs={**clips, **kw.pop("dataset_kwargs", {})}, **kw)

    # -- LightningDataModule --------------------------------------------------------------------------
    def _dataset(self, split: str):
        if self.packed is not None:
            from .tokens.packed import PackedDocuments

            return PackedDocuments(self.pack, split=split, cache=self.cache, **self.packed)
        cls = kind_of(self.manifest).dataset_class()
        return cls(self.pack, split=split, cache=self.cache, **self.dataset_kwargs)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is None and stage in (None, "fit"):
            self.train_set = self._dataset(self.train_split)
        if self.val_set is None and self.val_split is not None and stage in (None, "fit", "validate"):
            self.val_set = self._dataset(self.val_split)

    def _ranks(self) -> dict[str, int]:
        t = self.trainer
        return {"rank": int(t.global_rank), "world_size": int(t.world_size)} if t is not None else {}

    def train_dataloader(self) -> Loader:
        self.setup("fit")
        loader = _TrainerLoader(self.train_set, self.batch_size, shuffle=True, seed=self.seed, num_workers=self.num_workers,
                                drop_last=self.drop_last, crop=self.crop, flip=self.flip, schedule=self.schedule, **self._ranks())
        loader.trainer = self.trainer
        self._keep("train", loader)
        return loader

    def val_dataloader(self) -> Loader | Sequence:
        self.setup("validate")
        if self.val_set is None:
            return []
        loader = Loader(self.val_set, self.batch_size, num_workers=self.num_workers, crop=self.val_crop, **self._ranks())
        self._keep("val", loader)
        return loader

    def _keep(self, role: str, loader: Loader) -> None:
        """One live loader per role: a reloaded one (reload_dataloaders_every_n_epochs) stops the one before."""
        old = self._loaders.pop(role, None)
        if old is not None:
            old.close()
        self._loaders[role] = loader

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        """Image batches become normalised floats here, on the device, channels-last."""
        if self.normalize is None or not isinstance(batch, (tuple, list)) or not len(batch):
            return batch
        images = batch[0]
        if self._norm is None or self._norm.scale.device != images.device:
            mean, std = self.normalize
            self._norm = Normalize(mean, std, device=images.device, dtype=self.dtype, channels_last=True)
        return (self._norm(images), *batch[1:])

    def teardown(self, stage: str | None = None) -> None:
        for loader in self._loaders.values():
            loader.close()
        self._loaders = {}


class DataWaitMonitor(pl.Callback):
    """Logs how long training waits for data, through the Trainer's loggers: `data/wait_fraction` (the share
    of the epoch's wall time spent waiting for the next batch) and `data/worker_busy` (the workers' mean
    share spent filling batches), at each training epoch's end and, with `every_n_steps`, every N steps
    (the epoch so far); warns once when an epoch waits more than `threshold`, naming what would help.

    With a dataprep Loader (PackDataModule's, or your own) the figures are its `stats()`. With another
    loader the wait is timed around the Trainer's fetch (from one batch's end to the next one's start: the
    fetch, the transfer and Lightning's hooks) and worker_busy is not available.
    """

    def __init__(self, every_n_steps: int | None = None, threshold: float | None = None, warn: bool = True):
        from .serve.stats import DATA_BOUND

        if every_n_steps is not None and every_n_steps < 1:
            raise DataprepError(f"every_n_steps must be >= 1 (or None), not {every_n_steps}")
        self.every_n_steps, self.threshold, self.warn = every_n_steps, DATA_BOUND if threshold is None else threshold, warn
        self._warned = False
        self._started = self._last_end = None
        self._waited, self._batches, self._first = 0.0, 0, None
        self._logged_step: int | None = None  # the global step last logged at: one row a step, never two
        self.last: dict[str, Any] | None = None  # the figures last logged

    @staticmethod
    def _loader(trainer):
        """The first train loader that measures (a dataprep Loader), among those the Trainer serves: one, or
        a list or dict of them (Lightning's CombinedLoader flattens them)."""
        combined = getattr(getattr(trainer, "fit_loop", None), "_combined_loader", None)
        seen = [getattr(trainer, "train_dataloader", None), *(getattr(combined, "flattened", None) or [])]
        return next((d for d in seen if isinstance(d, Loader) and d.measure), None)

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        import time

        self._started = self._last_end = time.perf_counter()
        self._waited, self._batches, self._first = 0.0, 0, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        import time

        if self._last_end is not None:
            waited = time.perf_counter() - self._last_end
            self._waited += waited
            if self._first is None:
                self._first = waited  # the fetch of the epoch's first batch: its workers start there

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        import time

        self._last_end = time.perf_counter()
        self._batches += 1
        if self.every_n_steps and self._batches % self.every_n_steps == 0:  # batches: global_step stalls under accumulation
            self._log(trainer)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        figures = self._log(trainer)
        if figures is not None and self.warn and not self._warned and figures["steady_wait_fraction"] > self.threshold:
            from lightning.pytorch.utilities import rank_zero_warn

            self._warned = True
            rank_zero_warn(f"epoch {trainer.current_epoch}: {figures['verdict']} (dataprep.lightning.DataWaitMonitor)")

    def _figures(self, trainer) -> dict[str, Any] | None:
        import time

        from .serve.stats import steady_state, verdict

        loader = self._loader(trainer)
        if loader is not None:
            try:
                return loader.stats(threshold=self.threshold)
            except DataprepError:
                return None  # no epoch served yet
        if self._started is None:
            return None
        wall = time.perf_counter() - self._started
        fraction = min(self._waited / wall, 1.0) if wall > 0 else 0.0
        startup, steady = steady_state(self._first, self._waited, self._batches, wall, fraction)
        return {"batches": self._batches, "wall_s": wall, "wait_s": self._waited, "wait_fraction": fraction,
                "startup_s": startup, "steady_wait_fraction": steady,
                "worker_busy": None, "verdict": verdict(steady, None, None, self.threshold)}

    def _log(self, trainer) -> dict[str, Any] | None:
        figures = self._figures(trainer)
        if figures is None:
            return None
        self.last = figures
        if trainer.global_step == self._logged_step:
            return figures  # at the step just logged (an epoch's last, every N steps): one row a step
        self._logged_step = trainer.global_step
        metrics = {"data/wait_fraction": float(figures["wait_fraction"]),
                   "data/steady_wait_fraction": float(figures["steady_wait_fraction"]),
                   "data/startup_s": float(figures["startup_s"])}
        if figures.get("worker_busy"):
            metrics["data/worker_busy"] = float(sum(figures["worker_busy"]) / len(figures["worker_busy"]))
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
        return figures
