"""SegmentationDataset: takes a segmentation pack, gives (image, mask) samples and whole batches from RAM.

Images are served as InMemoryImageDataset serves them (JPEG decoded on the fly, or raw pixels);
masks are raw uint8 (or uint16) arrays in the same few contiguous buffers, never interpolated.
Convert to float and long on the GPU: `Normalize` for images, `mask.long()` for the loss.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..errors import DataprepError, PackError
from ..images import geometry
from ..images.dataset import InMemoryImageDataset
from ..pack.arrays import take_rows
from ..serve.request import Request
from .field import mask_key, served_fields


class SegmentationDataset(InMemoryImageDataset):
    """A segmentation pack's split, held in RAM (one copy for every worker, as InMemoryImageDataset).

    Args:
        pack, split, decode, as_numpy, verify, cache, progress, resolution, keep_resolutions, exclude: as for
            InMemoryImageDataset (a multi-resolution pack has masks at every size, served with the images).
        transform: a joint transform `(image HWC, mask HW) -> (image, mask)` (see segmentation/transforms.py), applied
            before conversion to tensors, so crops and flips keep the two aligned.

    `dataset[i]` gives `(image C x H x W uint8, mask H x W uint8 or uint16)`; `dataset[[i, j]]` a batch
    `(N x C x H x W, N x H x W)`; `ignore_index`, `num_classes` and `classes` come from the manifest.
    """

    kinds = ("segmentation",)

    def __init__(self, pack: str | os.PathLike, split: str = "train", decode: str = "fast",
                 transform: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None,
                 as_numpy: bool = False, verify: bool = False, cache: str = "ram", progress: bool | None = None,
                 resolution: int | None = None, keep_resolutions: int = 1, exclude: str | None = None):
        self.joint = transform
        super().__init__(pack, split, decode, None, as_numpy, verify, cache, progress, resolution, keep_resolutions,
                         partition=None, exclude=exclude)

    def _fields(self, manifest: dict[str, Any], resolution: int | None) -> dict[str, Any]:
        return served_fields(manifest, resolution, self.pack / "manifest.json")

    def _switch(self, resolution: int | None) -> None:
        super()._switch(resolution)
        c = self._cached
        key = next(iter(c.fields))
        self.mask_field = c.fields[mask_key(key)]
        self._mask_arrays = c.arrays
        if len(self) and not np.array_equal(np.asarray(c.arrays["mask_shapes"])[:, :2], np.asarray(c.arrays["shapes"])[:, :2]):
            raise PackError(f"{self.pack / self.split}: masks and images differ in size")
        self._mask_sources = c.fields["mask_source"].strings(c.arrays)  # by held row; `mask_sources`: by position
        self.ignore_index: int | None = self.mask_field.ignore
        self.num_classes: int | None = self.mask_field.num_classes

    @property
    def mask_sources(self):
        """Every served sample's mask path, by position (as `sources`)."""
        return self._positional("mask_sources", self._mask_sources)

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "joint": self.joint}

    @property
    def mask_dtype(self) -> np.dtype:
        """The masks' dtype: uint8 or uint16."""
        return self.mask_field.np_dtype.newbyteorder("=")

    def mask(self, i: int) -> np.ndarray:
        """Sample i's mask.

        Args:
            i: The sample's index.

        Returns:
            (H, W), a private copy.
        """
        return np.array(self.mask_field.sample(self._mask_arrays, i)[..., 0], self.mask_dtype)

    def _pair(self, i: int) -> tuple[Any, Any]:
        img, msk = self.image(i), self.mask(i)
        if self.joint is not None:
            img, msk = self.joint(img, msk)
        if self.as_numpy:
            return np.ascontiguousarray(img), np.ascontiguousarray(msk)
        return torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1), torch.from_numpy(np.ascontiguousarray(msk))

    def __getitem__(self, index):
        if isinstance(index, tuple) and len(index) == 2:  # (resolution, index) from a ResolutionBatchSampler
            self.use(int(index[0]))
            index = index[1]
        if isinstance(index, slice):
            return self.batch(np.arange(len(self))[index])
        if isinstance(index, (Sequence, np.ndarray, torch.Tensor)) and not isinstance(index, (str, bytes)):
            if not (isinstance(index, (np.ndarray, torch.Tensor)) and index.ndim == 0):
                return self.batch(index)
        return self._pair(self._check(index))

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[Any, Any]]:
        if len(indices) and isinstance(indices[0], tuple):
            self.use(int(indices[0][0]))
            indices = [i for _, i in indices]
        return [self._pair(self._check(i)) for i in indices]

    def batch(self, indices) -> tuple[Any, Any]:
        """A whole batch of images and their masks.

        Args:
            indices: The sample indices.

        Returns:
            Images (N, C, H, W) and masks (N, H, W), or numpy (N, H, W, C) and (N, H, W) with `as_numpy`.
        """
        pairs = [self._pair(self._check(i)) for i in np.asarray(indices).reshape(-1)]
        if len({tuple(p[0].shape) for p in pairs}) > 1:
            raise DataprepError(f"{self.pack}/{self.split}: a batch holds images of several sizes; build with "
                                "--resize center-crop or pad, or pass a transform that crops to one size")
        stack = np.stack if self.as_numpy else torch.stack
        return stack([p[0] for p in pairs]), stack([p[1] for p in pairs])

    # -- the batch-fetch protocol of the fast Loader ---------------------------------------------
    def batch_layout(self, request: Request | None = None) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """What one pair occupies in a batch: the images' layout, and masks of the same (H, W).

        Args:
            request: What the pass asks for: crop, flip, resolution; None is a plain request.
            A variable-size pack needs a crop plan or crop=(H, W).

        Returns:
            {"images": ((H, W, C), dtype), "masks": ((H, W), mask dtype)}.
        """
        images = super().batch_layout(request)["images"]
        return {"images": images, "masks": (images[0][:2], self.mask_dtype)}

    fills_rows = False  # fill_batch writes out's first rows only (a Mixture gives it a buffer of its own)
    # Loader(threads=True): each fill writes only its own rows from per-call buffers; a resolution switch
    # happens in a pass's first fill, which the Loader runs alone (tests/test_threads_loader.py)
    fills_in_threads = True
    fill_parts = None  # the image kind's fills images only: a Mixture fills pairs member by member, masks too

    def fill_batch(self, idx: np.ndarray, out: dict[str, np.ndarray], request: Request | None = None) -> None:
        """Write samples `idx` into `out`'s first rows, in place, image and mask through the same draws.

        Images are cut as the image kind cuts them (a crop plan's box, or the central window padded black).
        Each mask goes through the same draws (images/geometry.py): the same box, resized nearest, or the
        same window padded with the ignore value or 0. Then both are flipped together.

        Args:
            idx: The sample indices.
            out: The batch's arrays by key, as `batch_layout` gives them.
            request: What the pass asks for: epoch, seed, crop, flip.
        """
        if self.joint is not None:
            raise DataprepError("the batch path serves the stored pairs; crop or flip the batch on the GPU")
        req = request or Request()
        images, masks = out["images"], out["masks"]
        held, keys, at, row = self._place(idx, {"images": images}, req, None)  # resolution, held rows, draw keys
        plan = geometry.plan_of(req.crop)
        heights, widths = (self._shapes[held, 0], self._shapes[held, 1]) if plan is not None else (None, None)
        drawn = geometry.draw(req.crop, req.flip, (req.seed, req.epoch), keys, images.shape[1:3], heights, widths)
        self._pixels_into(held, images, at, row, req.crop, drawn.boxes)
        data = self._mask_arrays["masks"]
        if plan is None and self._pixels is not None and images.shape[1:] == self._pixels.shape[1:]:
            take_rows(data, held, masks[at, :, :, None] if data.ndim == 4 else masks[at])
        else:
            fill = self.ignore_index or 0
            for k, i in enumerate(held.tolist()):
                geometry.mask_into(drawn, k, self._mask_at(i), masks[row[k]], fill)
        geometry.flip_into(drawn, images, row)
        geometry.flip_into(drawn, masks, row)

    def _mask_at(self, i: int) -> np.ndarray:
        """Held row i's mask (H, W): a view where the pack stores masks raw, as every segmentation pack does."""
        return self.mask_field.sample(self._mask_arrays, i)[..., 0]
