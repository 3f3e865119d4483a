"""DetectionDataset: takes a detection pack, gives (image, boxes, labels) samples and, through dataprep.Loader, batches
(images, boxes, labels, counts) whose boxes moved exactly as their pixels did.

Pixels are served as InMemoryImageDataset serves them (its crop plans cut each one, JPEG decoded at the scale the
crop allows); the boxes of each sample go through the same crop box, output size and flip, drawn once for both
from the request's (seed, epoch) and the sample's index (images/geometry.py), then clipped to the output and kept
when at least `min_size` pixels of width and height (and `min_visibility` of the area) stay inside
(detection/boxes.py). A batch holds boxes (B, M, 4) float32 in output pixels, labels (B, M) int64 padded with -1
and counts (B,) int64. The Loader's buffers hold the most boxes any held sample has stored (counted from the
box offsets, never read from the manifest), or `max_boxes`; what it serves is cut to the batch's own largest
count (at least 1) through the serving contract's `finish_batch` (views of the buffers, so a held batch never
changes), unless `max_boxes` is given: then every batch has M = max_boxes (one shape, for compiled models).
`trim(batch)` cuts a fixed-M batch the same way; `collate` (dataprep.detection_collate) lays samples out as such a
batch for the stock DataLoader.
"""
from __future__ import annotations

import inspect
import os
import threading
from typing import Any, Sequence

import numpy as np
import torch

from ..errors import DataprepError, PackError
from ..images import geometry as shared
from ..images.dataset import InMemoryImageDataset
from ..serve.request import Request
from . import boxes as geometry
from .field import boxes_key, served_fields

CROWD_MODES = ("keep", "drop", "flag")
# the image kind's default decode (what its crop paths are tuned for), so pixels decode here as they do there
_COUNTING = threading.Lock()  # boxes_cut, added to by fills that may run in threads at once
_DECODE = inspect.signature(InMemoryImageDataset.__init__).parameters["decode"].default


class DetectionDataset(InMemoryImageDataset):
    """A detection pack's split, held in RAM (one copy for every worker, as InMemoryImageDataset).

    Args:
        pack, split, decode, as_numpy, verify, cache, progress, resolution, keep_resolutions, partition: as for
            InMemoryImageDataset (a multi-resolution pack has boxes at every size, served with its images).
        max_boxes: M, the boxes a batch row holds, every batch that shape [default: the buffers hold the most any
            held sample has stored, and each batch is served cut to its own largest count]. A sample
            left with more keeps its first M (counted in `boxes_cut`, per process). Members of a Mixture need
            one M: pass the same to each (and trim=True to keep cutting batches to their largest count).
        trim: cut each batch's boxes, labels (and crowd flags) to the batch's largest count [default: when
            max_boxes is not given].
        min_size: a box is served when at least this many pixels of its width and of its height stay inside
            the output (torchvision's SanitizeBoundingBoxes, min_size=1).
        min_visibility: and at least this fraction of its area (in output pixels) [default 0: any].
        crowd: "keep" serves crowd boxes (COCO's iscrowd) like any other, "drop" never serves them, "flag" serves
            them and adds `crowd` (B, M) bool to each batch (and a fourth element to each sample).

    `dataset[i]` gives `(image C x H x W uint8, boxes (k, 4) float32 in stored pixels, labels (k,) int64)`;
    `dataset[[i, j]]` a list of such samples. `classes` names the labels; `category_ids` (COCO packs) the
    category id behind each label.
    """

    kinds = ("detection",)

    def __init__(self, pack: str | os.PathLike, split: str = "train", decode: str = _DECODE, as_numpy: bool = False,
                 verify: bool = False, cache: str = "ram", progress: bool | None = None, resolution: int | None = None,
                 keep_resolutions: int = 1, partition: Any = None, max_boxes: int | None = None, min_size: float = 1.0,
                 min_visibility: float = 0.0, crowd: str = "keep", trim: bool | None = None):
        if max_boxes is not None and (isinstance(max_boxes, bool) or not isinstance(max_boxes, (int, np.integer)) or max_boxes < 1):
            raise DataprepError(f"max_boxes is a number of boxes (at least 1), not {max_boxes!r}")
        if not (np.isscalar(min_size) and np.isfinite(min_size) and min_size >= 0):
            raise DataprepError(f"min_size is a number of pixels (0 or more), not {min_size!r}")
        if not (np.isscalar(min_visibility) and 0 <= float(min_visibility) <= 1):
            raise DataprepError(f"min_visibility is a fraction from 0 to 1, not {min_visibility!r}")
        if crowd not in CROWD_MODES:
            raise DataprepError(f"crowd is one of {', '.join(CROWD_MODES)}, not {crowd!r}")
        if trim not in (None, True, False):
            raise DataprepError(f"trim is True, False or None (cut batches when max_boxes is not given), not {trim!r}")
        self.max_boxes_asked = None if max_boxes is None else int(max_boxes)
        self.trim = (max_boxes is None) if trim is None else bool(trim)
        self.min_size, self.min_visibility, self.crowd = float(min_size), float(min_visibility), crowd
        self.boxes_cut = 0
        super().__init__(pack, split, decode, None, as_numpy, verify, cache, progress, resolution, keep_resolutions, None, partition)

    def _fields(self, manifest: dict[str, Any], resolution: int | None) -> dict[str, Any]:
        return served_fields(manifest, resolution, self.pack / "manifest.json")

    def _switch(self, resolution: int | None) -> None:
        super()._switch(resolution)
        c = self._cached
        a = c.arrays
        self.boxes_field = c.fields[boxes_key(next(iter(c.fields)))]
        self._boxes, self._box_offsets = a["boxes"], a["box_offsets"]
        self._box_labels, self._box_crowd = a["box_labels"], a["box_crowd"]
        if len(self._shapes) and not np.array_equal(np.asarray(a["box_frames"]), np.asarray(self._shapes)[:, :2]):
            raise PackError(f"{self.pack / self.split}: the boxes' frames and the images' sizes differ")
        self.category_ids: list[int] | None = c.manifest.get("source", {}).get("category_ids")
        # the buffers' width: the most boxes a held row holds, from the offsets themselves; the manifest's
        # max_boxes is never trusted for it (a forged 10**9 would be 16 GB a row; verify refuses one)
        most = int(np.diff(np.asarray(self._box_offsets)).max(initial=0))
        self.max_boxes = self.max_boxes_asked or max(1, most)

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "max_boxes_asked": self.max_boxes_asked, "min_size": self.min_size,
                "min_visibility": self.min_visibility, "crowd": self.crowd, "trim": self.trim}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.boxes_cut = 0
        super().__setstate__(state)

    # -- samples --------------------------------------------------------------------------------
    def objects(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sample i's boxes, labels and crowd flags; crowd boxes are left out with crowd="drop".

        Args:
            i: The sample's index.

        Returns:
            Boxes (k, 4) float32 in stored pixels, labels (k,) int64, crowd flags (k,) bool: private copies.
        """
        return self._objects_at(self._check(i))

    def _objects_at(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        a, b = int(self._box_offsets[i]), int(self._box_offsets[i + 1])
        boxes = np.array(self._boxes[a:b], np.float32)
        labels = np.asarray(self._box_labels[a:b]).astype(np.int64)
        crowd = np.asarray(self._box_crowd[a:b]).astype(bool)
        keep = geometry.positive(boxes)  # a box of no area (an older build's float32 rounding) is never served
        if self.crowd == "drop":
            keep &= ~crowd
        if not keep.all():
            boxes, labels, crowd = boxes[keep], labels[keep], crowd[keep]
        return boxes, labels, crowd

    def _detection_sample(self, i: int):
        i = self._check(i)
        image = self._finish(self.image(i))
        boxes, labels, crowd = self._objects_at(i)
        if not self.as_numpy:
            boxes, labels, crowd = torch.from_numpy(boxes), torch.from_numpy(labels), torch.from_numpy(crowd)
        return (image, boxes, labels, crowd) if self.crowd == "flag" else (image, boxes, labels)

    def __getitem__(self, index):
        if isinstance(index, tuple) and len(index) == 2:  # (resolution, index) from a ResolutionBatchSampler
            self.use(int(index[0]))
            index = index[1]
        if isinstance(index, slice):
            return [self._detection_sample(i) for i in np.arange(len(self))[index]]
        if isinstance(index, (Sequence, np.ndarray, torch.Tensor)) and not isinstance(index, (str, bytes)):
            if not (isinstance(index, (np.ndarray, torch.Tensor)) and index.ndim == 0):
                return [self._detection_sample(int(i)) for i in np.asarray(index).reshape(-1)]
        return self._detection_sample(int(index))

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        if len(indices) and isinstance(indices[0], tuple):
            self.use(int(indices[0][0]))
            indices = [i for _, i in indices]
        return [self._detection_sample(int(i)) for i in indices]

    def batch(self, indices) -> tuple[torch.Tensor, ...]:
        """A whole batch as the Loader serves one without a crop; every sample must have one shape.

        Args:
            indices: The sample indices.

        Returns:
            Images (N, C, H, W) uint8, boxes (N, M, 4) float32, labels (N, M) int64 padded with -1, counts
            (N,) int64 (M as the Loader's).
        """
        idx = np.asarray([self._check(i) for i in np.asarray(indices).reshape(-1)], np.int64)
        req = Request()
        out = {k: np.empty((len(idx), *shape), dt) for k, (shape, dt) in self.batch_layout(req).items()}
        self.fill_batch(idx, out, req)
        got = {k: torch.from_numpy(v) for k, v in out.items()}
        got["images"] = got["images"].permute(0, 3, 1, 2)
        return tuple(self.finish_batch(got).values())

    # -- the Loader's protocol (serve/contract.py) --------------------------------------------------
    def batch_layout(self, request: Request | None = None) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """What one sample occupies in a batch: its image, and room for `max_boxes` boxes.

        Args:
            request: What the pass asks for: crop, flip, resolution; None is a plain request.

        Returns:
            {"images": ((H, W, C), dtype), "boxes": ((M, 4), float32), "labels": ((M,), int64), "counts":
            ((), int64)} and, with crowd="flag", "crowd": ((M,), bool).
        """
        images = super().batch_layout(request)["images"]
        m = self.max_boxes
        out = {"images": images, "boxes": ((m, 4), np.dtype(np.float32)), "labels": ((m,), np.dtype(np.int64)),
               "counts": ((), np.dtype(np.int64))}
        if self.crowd == "flag":
            out["crowd"] = ((m,), np.dtype(bool))
        return out

    def finish_batch(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Cut the Loader's batch to its largest box count (at least 1), where `trim` (contract.FinishesBatch).

        Args:
            batch: The batch's tensors by key.

        Returns:
            The batch with boxes, labels and crowd flags cut: views, never copies or writes.
        """
        if not self.trim:
            return batch
        counts = batch["counts"]
        m = max(1, int(counts.max())) if len(counts) else 1
        return {k: (v[:, :m] if k in ("boxes", "labels", "crowd") else v) for k, v in batch.items()}

    fills_rows = True  # fill_batch takes rows= (a Mixture writes each member's share straight into the batch)
    # Loader(threads=True): the image kind's fills are safe in threads (tests/test_threads_loader.py); the
    # boxes are cut into the call's own rows, and the one shared count (`boxes_cut`) is added under a lock
    fills_in_threads = True
    fill_parts = None  # the image kind's fills pixels only: a Mixture fills members one by one, boxes too

    def fill_batch(self, idx, out: dict[str, np.ndarray], request: Request | None = None, rows=None) -> None:
        """Write samples `idx` into `out`, in place, each sample's boxes moved with its pixels.

        Pixels are cut by the request's crop and flipped by its draws, as the image kind cuts them. Each
        sample's boxes go through the same crop box, output size and flip, then are clipped, filtered and
        padded.

        Args:
            idx: The sample indices.
            out: The batch's arrays by key, as `batch_layout` gives them.
            request: What the pass asks for: epoch, seed, crop, flip.
            rows: The batch rows to write; None is the first len(idx).
        """
        req = request or Request()
        images = out["images"]
        held, keys, at, row = self._place(idx, {"images": images}, req, rows)  # part, resolution; pixels only
        heights, widths = self._shapes[held, 0], self._shapes[held, 1]
        drawn = shared.draw(req.crop, req.flip, (req.seed, req.epoch), keys, images.shape[1:3], heights, widths)
        self._pixels_into(held, images, at, row, req.crop, drawn.boxes)
        shared.flip_into(drawn, images, row)
        self._boxes_into(held, out, np.asarray(list(row), np.int64), drawn)

    def _boxes_into(self, held: np.ndarray, out: dict[str, np.ndarray], rows: np.ndarray, drawn: shared.Draws) -> None:
        """The samples' boxes moved as their pixels were (images/geometry.py: the same draws' affine map and
        flip), clipped to the output, kept by min_size / min_visibility (crowd dropped with crowd="drop"),
        padded into their rows."""
        starts = np.asarray(self._box_offsets[held], np.int64)
        n_boxes = np.asarray(self._box_offsets[held + 1], np.int64) - starts
        sel = geometry.ranges(starts, n_boxes)
        owner = np.repeat(np.arange(len(held)), n_boxes)
        oh, ow = drawn.out_hw
        stored = np.asarray(self._boxes[sel], np.float64).reshape(-1, 4)
        whole = shared.boxes_through(drawn, stored, owner)
        clipped = geometry.clip(whole.copy(), oh, ow)
        keep = geometry.kept(clipped, whole, self.min_size, self.min_visibility) & geometry.positive(stored)
        crowd = np.asarray(self._box_crowd[sel]).astype(bool)
        if self.crowd == "drop":
            keep &= ~crowd
        labels = np.asarray(self._box_labels[sel]).astype(np.int64)
        extra = (crowd[keep], out["crowd"]) if "crowd" in out else None
        cut = geometry.pad_into(clipped[keep].astype(np.float32), labels[keep], owner[keep], rows, out["boxes"],
                                out["labels"], out["counts"], extra)
        if cut:
            with _COUNTING:  # `+=` on an attribute is a read and a write: two threads could lose one's count
                self.boxes_cut += cut


def trim(batch: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """A fixed-M Loader batch (images, boxes, labels, counts[, crowd]: served with max_boxes, or trim=False) with
    its boxes, labels (and crowd flags) cut to the batch's own largest count (at least 1): views of the served
    tensors, so the Loader's rule that a held batch never changes holds for them too."""
    images, boxes, labels, counts, *rest = batch
    m = max(1, int(counts.max())) if len(counts) else 1
    return (images, boxes[:, :m], labels[:, :m], counts, *(r[:, :m] for r in rest))


def collate(samples: Sequence[Sequence[Any]]) -> tuple[Any, ...]:
    """The stock DataLoader's `collate_fn` for a DetectionDataset (`dataprep.detection_collate`).

    Args:
        samples: the dataset's samples, (image, boxes (k, 4), labels (k,)[, crowd (k,)]) each, tensors or
            numpy (as_numpy).

    Returns:
        One batch laid out as the Loader serves one: images stacked (B, C, H, W) where they share a shape (a
        pack of one shape), else a list of the B images; boxes (B, M, 4) float32 padded with 0, labels (B, M)
        int64 padded with -1, counts (B,) int64 [, crowd (B, M) bool padded with False]; M the batch's largest
        count (at least 1). Boxes stay in stored pixels, as `dataset[i]` gives them. (The default collate
        cannot stack a batch's boxes: each image has its own count.)
    """
    if not samples:
        raise DataprepError("detection collate: no samples to collate")
    images = [torch.as_tensor(s[0]) for s in samples]
    objects = [[torch.as_tensor(x) for x in s[1:]] for s in samples]
    counts = torch.tensor([len(o[0]) for o in objects], dtype=torch.int64)
    b, m = len(samples), max(1, int(counts.max()))
    boxes = torch.zeros((b, m, 4), dtype=torch.float32)
    labels = torch.full((b, m), -1, dtype=torch.int64)
    crowd = torch.zeros((b, m), dtype=torch.bool) if len(objects[0]) > 2 else None
    for k, (o, n) in enumerate(zip(objects, counts.tolist())):
        boxes[k, :n] = o[0].reshape(n, 4)
        labels[k, :n] = o[1]
        if crowd is not None:
            crowd[k, :n] = o[2]
    same = len({tuple(im.shape) for im in images}) == 1
    return (torch.stack(images) if same else images, boxes, labels, counts) + ((crowd,) if crowd is not None else ())
