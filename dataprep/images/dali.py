"""DALI loader: takes an encoded (JPEG) pack held in RAM, gives decoded, cropped, normalised batches as torch
tensors on the GPU (nvJPEG, and the hardware JPEG decoder where the GPU has one), or on the CPU without one.

DALI's own readers read files; here the JPEG bytes already in the RAM cache are handed to the pipeline
through `fn.external_source` in batch mode, as zero-copy views of the cache (`no_copy=True`: the
cache outlives every batch), so neither the disk nor Python-side decoding is in the loop. DALI decodes
whole batches, which is why this is a loader over a dataset and not an `InMemoryImageDataset(decode=...)`.

Only this module imports DALI, and only when a loader is made: `pip install 'dataprep[dali]'`.
"""
from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import torch

from ..errors import DataprepError
from ..serve.transfer import IMAGENET_MEAN, IMAGENET_STD

INSTALL = ("DALI is not installed: pip install 'dataprep[dali]' (the CUDA 12 wheel, nvidia-dali-cuda120; "
           "for CUDA 13 drivers: pip install nvidia-dali-cuda130)")
PRESETS = ("train", "eval")
LAST_BATCH = ("drop", "pad", "partial")
_DTYPES = {torch.float32: "FLOAT", torch.float16: "FLOAT16", torch.uint8: "UINT8"}


def _dali():
    try:
        import nvidia.dali as dali  # noqa: F401
        import nvidia.dali.fn  # noqa: F401
        import nvidia.dali.types  # noqa: F401
        from nvidia.dali.plugin import pytorch  # noqa: F401
    except ImportError as e:
        raise DataprepError(f"{INSTALL} ({e})") from None
    return dali


def gpu_count() -> int:
    """CUDA devices DALI can use (0 without a GPU or a driver)."""
    _dali()
    from nvidia.dali import backend

    try:
        return int(backend.GetCUDADeviceCount())
    except Exception:
        return 0


@dataclass(frozen=True)
class DaliAugment:
    """What the pipeline does between decoding and the batch.

    Preset "train" fuses decoding with a random-resized crop (`decoders.image_random_crop`, ROI decoding:
    only the crop is decoded), resizes it to `size` and flips it at random. Preset "eval" decodes,
    resizes the shorter side to `resize` and cuts the central `size` window.

    Args:
        preset: "train" or "eval".
        size: The output side, or (height, width).
        resize: The shorter side before an eval crop: "auto" is size * 256 / 224; None does not resize.
        area: The train crop's area as a fraction of the image's: (low, high).
        aspect_ratio: The train crop's aspect ratio: (low, high).
    """

    preset: str = "train"
    size: int | tuple[int, int] = 224
    resize: int | None | str = "auto"
    area: tuple[float, float] = (0.08, 1.0)
    aspect_ratio: tuple[float, float] = (3 / 4, 4 / 3)

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise DataprepError(f"unknown preset {self.preset!r}; choose one of {list(PRESETS)}")

    @classmethod
    def train(cls, size: int | tuple[int, int] = 224, area: tuple[float, float] = (0.08, 1.0),
              aspect_ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> "DaliAugment":
        """The training preset: a random-resized crop, decoded alone, and a random flip.

        Args:
            size: The output side, or (height, width).
            area: The crop's area as a fraction of the image's: (low, high).
            aspect_ratio: The crop's aspect ratio: (low, high).

        Returns:
            The augmentation.
        """
        return cls("train", size, "auto", area, aspect_ratio)

    @classmethod
    def eval(cls, size: int | tuple[int, int] = 224, resize: int | None | str = "auto") -> "DaliAugment":
        """The evaluation preset: resize the shorter side, then cut the central window.

        Args:
            size: The window's side, or (height, width).
            resize: The shorter side: "auto" is size * 256 / 224; None does not resize.

        Returns:
            The augmentation.
        """
        return cls("eval", size, resize)

    @property
    def hw(self) -> tuple[int, int]:
        """The output size as (height, width)."""
        return (int(self.size), int(self.size)) if isinstance(self.size, int) else (int(self.size[0]), int(self.size[1]))

    @property
    def shorter(self) -> int | None:
        """eval's shorter side before the crop (None: no resize)."""
        return round(self.hw[0] * 256 / 224) if self.resize == "auto" else self.resize


@dataclass(frozen=True)
class DaliNormalize:
    """The end of the pipeline (`crop_mirror_normalize`): (x - mean) / std per channel, in 0-255 units.

    Args:
        mean: One value a channel (one for grayscale packs); ImageNet's by default, averaged for grayscale.
        std: One value a channel, as `mean`.
        dtype: torch.float32, torch.float16, or torch.uint8 (with mean 0 and std 1: the pixels themselves).
        layout: "nchw" or "nhwc".
    """

    mean: Sequence[float] = IMAGENET_MEAN
    std: Sequence[float] = IMAGENET_STD
    dtype: torch.dtype = torch.float32
    layout: str = "nchw"

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise DataprepError(f"dtype must be one of {list(_DTYPES)}, got {self.dtype}")
        if self.layout not in ("nchw", "nhwc"):
            raise DataprepError(f"layout must be 'nchw' or 'nhwc', got {self.layout!r}")

    @classmethod
    def pixels(cls, layout: str = "nchw") -> "DaliNormalize":
        """uint8 pixels as decoded (mean 0, std 1).

        Args:
            layout: "nchw" or "nhwc".

        Returns:
            The normalisation.
        """
        return cls((0.0, 0.0, 0.0), (1.0, 1.0, 1.0), torch.uint8, layout)

    def for_channels(self, channels: int) -> "DaliNormalize":
        """Mean and std with one value per channel of the pack (ImageNet's averaged for grayscale).

        Args:
            channels: The pack's channels: 1 or 3.

        Returns:
            The normalisation for that many channels.
        """
        mean, std = tuple(float(v) for v in self.mean), tuple(float(v) for v in self.std)
        if len(mean) == len(std) == channels:
            return DaliNormalize(mean, std, self.dtype, self.layout)
        if channels == 1 and len(mean) == len(std) == 3 and len(set(mean)) == len(set(std)) == 1:
            return DaliNormalize(mean[:1], std[:1], self.dtype, self.layout)
        if channels == 1 and tuple(self.mean) == IMAGENET_MEAN and tuple(self.std) == IMAGENET_STD:
            return DaliNormalize((float(np.mean(mean)),), (float(np.mean(std)),), self.dtype, self.layout)
        raise DataprepError(f"mean and std need {channels} value(s) for this pack")


class DaliImageLoader:
    """Batches of an encoded pack, decoded by DALI.

    Args:
        dataset: an InMemoryImageDataset of an encoded pack (or a pack path; `split` and `cache` then apply).
        batch_size: samples per batch (per rank).
        augment: a `DaliAugment` (or "train" / "eval" for the presets at 224 px).
        normalize: a `DaliNormalize` [default: ImageNet's mean and std, float32, NCHW].
        device_id: the GPU; None (or no GPU present: a warning) runs the same pipeline on the CPU.
        shuffle: a new order every epoch from `seed` and the epoch number [default: for "train"].
        seed: the shuffle's seed.
        shard_id, num_shards: this rank's part of every epoch (rank k takes order[k::num_shards]: disjoint,
            and together every sample once).
        last_batch: "drop" an incomplete last batch; "pad" it to full size by repeating this epoch's first
            samples; "partial": yield it smaller. With "drop" and "pad" every rank gets the same number of
            batches; with "partial" ranks can differ by one.
        num_threads, prefetch: DALI's CPU threads and prefetch queue depth.
        split, cache: the split and cache mode when `dataset` is a pack path, as for InMemoryImageDataset.

    Iterating gives `(images, labels)`: images (N, C, H, W) (or NHWC) of the normalisation's dtype on the
    device, labels int64 (N,). `len(loader)` is batches per epoch; `samples_per_epoch` the samples a rank sees.
    The dataset is read through its public `jpeg(i)` (a view of the cached JPEG bytes, its header checked
    against the recorded shape) and `labels`.
    """

    def __init__(self, dataset, batch_size: int, augment: DaliAugment | str = "train",
                 normalize: DaliNormalize | None = None, device_id: int | None = 0, shuffle: bool | None = None,
                 seed: int = 0, shard_id: int = 0, num_shards: int = 1, last_batch: str = "drop",
                 num_threads: int | None = None, prefetch: int = 2, split: str = "train", cache: str = "ram"):
        _dali()
        from .dataset import InMemoryImageDataset

        if not isinstance(dataset, InMemoryImageDataset):
            dataset = InMemoryImageDataset(dataset, split, decode="none", cache=cache)
        if dataset.field.encoding != "jpeg":
            raise DataprepError(f"{dataset.pack}: DALI decodes JPEG packs; this one holds decoded pixels: serve it with dataprep.Loader")
        if last_batch not in LAST_BATCH:
            raise DataprepError(f"unknown last_batch {last_batch!r}; choose one of {list(LAST_BATCH)}")
        if not 0 <= shard_id < num_shards:
            raise DataprepError(f"shard_id must be in [0, {num_shards}), got {shard_id}")
        self.augment = DaliAugment(augment) if isinstance(augment, str) else augment
        self.channels = dataset.field.channels
        self.normalize = (normalize or DaliNormalize()).for_channels(self.channels)
        self.dataset, self.batch_size = dataset, int(batch_size)
        self.shuffle = self.augment.preset == "train" if shuffle is None else shuffle
        self.seed, self.shard_id, self.num_shards, self.last_batch = seed, shard_id, num_shards, last_batch
        if device_id is not None and gpu_count() == 0:
            warnings.warn("DaliImageLoader: no CUDA device; running the DALI pipeline on the CPU", RuntimeWarning, stacklevel=2)
            device_id = None
        self.device_id = device_id
        if not getattr(dataset, "labelled", True):
            raise DataprepError(f"{dataset.pack}: DaliImageLoader serves (images, labels), and this pack has no labels "
                                "(its source had none); serve it with dataprep.Loader")
        self._labels = np.ascontiguousarray(dataset.labels, np.int64)
        self._base = 0  # epoch number = _base + DALI's epoch index (set_epoch moves _base)
        self._passes = 0  # full epochs DALI has run
        self._pipe = self._build(num_threads or min(8, os.cpu_count() or 1), prefetch)
        self._iter = None

    # -- what an epoch holds ------------------------------------------------------------------
    @property
    def samples_per_epoch(self) -> int:
        """Samples this rank yields per epoch, padding repeats included."""
        n = len(self) * self.batch_size
        if self.last_batch == "partial":
            return self._shard_len(self.shard_id)
        return n

    def _shard_len(self, k: int) -> int:
        n = len(self._labels)
        return n // self.num_shards + (1 if k < n % self.num_shards else 0)

    def __len__(self) -> int:
        sizes = [self._shard_len(k) for k in range(self.num_shards)]
        if self.last_batch == "drop":
            return min(sizes) // self.batch_size
        if self.last_batch == "pad":
            return math.ceil(max(sizes) / self.batch_size)
        return math.ceil(sizes[self.shard_id] / self.batch_size)

    def epoch_order(self, epoch: int) -> np.ndarray:
        """This rank's sample indices for `epoch`, in order, padding included (what the epoch yields).

        Args:
            epoch: The epoch.

        Returns:
            The indices.
        """
        n = len(self._labels)
        order = np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle else np.arange(n)
        mine = order[self.shard_id :: self.num_shards]
        want = len(self) * self.batch_size
        if self.last_batch == "drop":
            return mine[:want]
        if self.last_batch == "pad" and len(mine) < want:
            return np.concatenate([mine, np.resize(order, want - len(mine))])
        return mine

    # -- the pipeline ------------------------------------------------------------------------
    def _source(self, info) -> tuple[list[np.ndarray], list[np.ndarray]]:
        epoch = self._base + info.epoch_idx
        order = self._orders.get(epoch)
        if order is None:
            self._orders = {epoch: self.epoch_order(epoch)}
            order = self._orders[epoch]
        start = info.iteration * self.batch_size
        if start >= len(order) or info.iteration >= len(self):
            raise StopIteration
        idx = order[start : start + self.batch_size]
        jpegs = [self.dataset.jpeg(int(i)) for i in idx]  # views of the RAM cache (headers checked): no copy
        return jpegs, [self._labels[i : i + 1] for i in idx]

    def _build(self, num_threads: int, prefetch: int):
        from nvidia.dali import fn, pipeline_def, types

        self._orders: dict[int, np.ndarray] = {}
        gpu = self.device_id is not None
        decoder_device = "mixed" if gpu else "cpu"
        out_type = types.GRAY if self.channels == 1 else types.RGB
        aug, norm = self.augment, self.normalize
        h, w = aug.hw

        @pipeline_def(batch_size=self.batch_size, num_threads=num_threads, device_id=self.device_id,
                      prefetch_queue_depth=prefetch, seed=self.seed)
        def pipeline():
            jpegs, labels = fn.external_source(source=self._source, num_outputs=2, batch=True, batch_info=True,
                                               dtype=[types.UINT8, types.INT64], no_copy=True)
            if aug.preset == "train":
                images = fn.decoders.image_random_crop(jpegs, device=decoder_device, output_type=out_type,
                                                       random_area=list(aug.area),
                                                       random_aspect_ratio=list(aug.aspect_ratio),
                                                       adjust_orientation=False)
                images = fn.resize(images, resize_x=w, resize_y=h)
                mirror = fn.random.coin_flip(probability=0.5)
            else:
                images = fn.decoders.image(jpegs, device=decoder_device, output_type=out_type, adjust_orientation=False)
                if aug.shorter:
                    images = fn.resize(images, resize_shorter=aug.shorter)
                mirror = 0
            images = fn.crop_mirror_normalize(
                images, crop=(h, w), mirror=mirror, mean=list(norm.mean), std=list(norm.std),
                dtype=getattr(types, _DTYPES[norm.dtype]), output_layout="CHW" if norm.layout == "nchw" else "HWC",
                pad_output=False, out_of_bounds_policy="pad")
            return images, (labels.gpu() if gpu else labels)

        pipe = pipeline()
        try:
            pipe.build()
        except Exception as e:
            where = f"GPU {self.device_id}" if gpu else "the CPU"
            raise DataprepError(f"{self.dataset.pack}: the DALI pipeline could not be built on {where} ({type(e).__name__}: {e})") from None
        return pipe

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        if self._iter is None:
            self._iter = DALIGenericIterator(self._pipe, ["images", "labels"], last_batch_policy=LastBatchPolicy.PARTIAL,
                                             auto_reset=True, prepare_first_batch=False)
        for out in self._iter:
            yield out[0]["images"], out[0]["labels"].reshape(-1)
        self._passes += 1

    def set_epoch(self, epoch: int) -> None:
        """Make the next epoch's order that of `epoch`, as DistributedSampler.set_epoch does.

        Without it, epochs count 0, 1, 2, ...

        Args:
            epoch: The epoch.
        """
        self._base = int(epoch) - self._passes

    def close(self) -> None:
        """Release the DALI pipeline; a `with` block calls it."""
        self._iter = None
        self._pipe = None

    def __enter__(self) -> "DaliImageLoader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
