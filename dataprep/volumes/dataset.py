"""VolumeDataset: takes a volume pack, gives (D, H, W) uint8/uint16 volumes (with labels when the pack has
them) from RAM, one copy shared by every worker (one blob plus offsets, or one (N, D, H, W) array)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import Dataset

from ..errors import DataprepError, PackError
from ..pack.arrays import take_rows
from ..remote.packs import resolve
from ..serve.cache import open_split
from ..serve.request import Request
from .field import fields_of, same_shapes
from .transforms import center_into


class VolumeDataset(Dataset):
    """A volume pack's split, held in RAM.

    Args:
        pack, split, verify, cache, progress: as for InMemoryImageDataset.
        transform: called on each volume (a (D, H, W) numpy array; see `RandomCrop3d`, `RandomFlip3d`).
        as_numpy: return numpy arrays instead of tensors.

    `dataset[i]` gives the volume, then its label volume when the pack has them (`--masks`), then its
    label when the pack has class folders: `volume`, `(volume, mask)`, `(volume, label)` or
    `(volume, mask, label)`. Volumes are uint8 or uint16 (D, H, W); label volumes uint8 or uint16, never
    interpolated. With label volumes, `transform(volume, mask)` is called jointly (RandomCrop3d and
    RandomFlip3d take both). Convert to float on the GPU.
    """

    def __init__(self, pack: str | os.PathLike, split: str = "train", transform: Callable[[np.ndarray], np.ndarray] | None = None,
                 as_numpy: bool = False, verify: bool = False, cache: str = "ram", progress: bool | None = None):
        pack, cache = resolve(pack, cache)  # a URL: a staged local directory, its files fetched with the cache
        self.pack, self.split, self.transform, self.as_numpy = Path(pack), split, transform, as_numpy
        self.verify, self.cache, self.progress = verify, cache, progress
        self._load()

    def _load(self) -> None:
        try:
            c = open_split(self.pack, self.split, lambda m: fields_of(m, self.pack / "manifest.json"), self.cache,
                           self.verify, self.progress, kinds=("volumes",))
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            raise PackError(f"{self.pack}/manifest.json: malformed ({type(e).__name__}: {e})") from None
        if not same_shapes(c.arrays):
            raise PackError(f"{self.pack / self.split}: masks and volumes differ in size")
        self._store = c  # keeps a shared-memory segment attached
        self.field = c.fields["volume"]
        self.mask_field = c.fields.get("volume_mask")
        self._arrays = c.arrays
        self._labels = c.arrays.get("labels")
        self.sources = c.fields["source"].strings(c.arrays)
        self.classes: list[str] = list(c.manifest.get("classes") or [])
        self.manifest = c.manifest

    def __getstate__(self) -> dict[str, Any]:
        keys = ("pack", "split", "transform", "as_numpy", "verify", "cache", "progress")
        return {k: self.__dict__[k] for k in keys}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._load()

    def __len__(self) -> int:
        return len(self._arrays["volume_shapes"])

    @property
    def labelled(self) -> bool:
        """Whether the pack stores a class label per volume (then served under "labels")."""
        return self._labels is not None

    @property
    def shapes(self) -> np.ndarray:
        """(N, 3): every volume's (D, H, W)."""
        return self._arrays["volume_shapes"]

    @property
    def labels(self) -> np.ndarray | None:
        """Each volume's class label as stored, or None where the pack has no class folders."""
        return self._labels

    @property
    def dtype(self) -> np.dtype:
        """The volumes' dtype: uint8 or uint16."""
        return self.field.np_dtype.newbyteorder("=")

    def volume(self, i: int) -> np.ndarray:
        """Volume i as stored.

        Args:
            i: The sample's index.

        Returns:
            A (D, H, W) private copy.
        """
        return np.array(self.field.sample(self._arrays, i), self.dtype)

    def mask(self, i: int) -> np.ndarray:
        """Volume i's label volume, for a pack built with `--masks`.

        Args:
            i: The sample's index.

        Returns:
            A (D, H, W) private copy.
        """
        if self.mask_field is None:
            raise DataprepError(f"{self.pack}: the pack has no label volumes (build with --masks)")
        return np.array(self.mask_field.sample(self._arrays, i), self.mask_field.np_dtype.newbyteorder("="))

    def _check(self, i) -> int:
        n = len(self)
        i = int(i)
        if not -n <= i < n:
            raise IndexError(f"index {i} out of range for {n} volumes in {self.pack}/{self.split}")
        return i % n

    def __getitem__(self, index):
        i = self._check(index)
        out = [self.volume(i)] + ([self.mask(i)] if self.mask_field is not None else [])
        if self.transform is not None:
            t = self.transform(*out)
            out = list(t) if isinstance(t, tuple) else [t]
        out = [np.ascontiguousarray(a) if self.as_numpy else torch.from_numpy(np.ascontiguousarray(a)) for a in out]
        if self._labels is not None:
            out.append(int(self._labels[i]))
        return out[0] if len(out) == 1 else tuple(out)

    # -- the batch-fetch protocol of the fast Loader ---------------------------------------------
    def batch_layout(self, request: Request | None = None) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """What one volume occupies in a batch; packs of several shapes need crop=(D, H, W).

        Args:
            request: What the pass asks for: crop=(D, H, W) or none; volumes serve no flip.

        Returns:
            {"volumes": ((D, H, W), dtype)}, plus masks and labels where the pack has them.
        """
        request = request or Request()
        crop = request.crop
        if (crop is not None and (not isinstance(crop, (tuple, list)) or len(crop) != 3)) or request.flip:
            raise DataprepError(f"volumes are served center-cropped with crop=(D, H, W); not {crop!r}"
                                + (" and no flip" if request.flip else ""))
        if crop is not None:
            shape = tuple(int(c) for c in crop)
        else:
            shapes = {tuple(s) for s in np.asarray(self.shapes).tolist()}
            if len(shapes) != 1:
                raise DataprepError(f"{self.pack}/{self.split}: volumes have {len(shapes)} shapes; pass crop=(D, H, W)")
            shape = shapes.pop()
        out = {"volumes": (shape, self.dtype)}
        if self.mask_field is not None:
            out["masks"] = (shape, self.mask_field.np_dtype.newbyteorder("="))
        if self._labels is not None:
            out["labels"] = ((), np.dtype(np.int64))
        return out

    def fill_batch(self, idx: np.ndarray, out: dict[str, np.ndarray], request: Request | None = None) -> None:
        """Write volumes `idx` (and their masks and labels) into the first rows of `out`, in place.

        Args:
            idx: The sample indices.
            out: The batch's arrays by key, as `batch_layout` gives them.
            request: What the pass asks for; a volume pack serves no crop or flip.
        """
        if self.transform is not None:
            raise DataprepError("the batch path serves stored volumes; transform the batch on the GPU")
        vols, n = out["volumes"], len(idx)
        if "labels" in out:
            out["labels"][:n] = self._labels[idx]
        pairs = [(self.field, vols)] + ([(self.mask_field, out["masks"])] if self.mask_field is not None else [])
        for field, dst in pairs:
            data = self._arrays[field.keys[0]]
            if field.fixed and dst.shape[1:] == data.shape[1:]:
                take_rows(data, idx, dst[:n])
                continue
            for k, i in enumerate(idx):
                center_into(field.sample(self._arrays, int(i)), dst[k])
