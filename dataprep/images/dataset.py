"""InMemoryImageDataset: takes an image pack, gives (image, label[, caption]) samples and whole batches from RAM.

The split is read once into a few contiguous numpy buffers (pixels, or one JPEG blob plus int64
offsets; labels; source paths and captions as one UTF-8 blob each), never a Python list of per-image
objects, so forked DataLoader workers share it without copy-on-read growth.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from ..errors import DataprepError, PackError
from ..serve.request import Request
from . import crops
from .captions import fill_caption_ids
from .crops import CenterCrop, RandomResizedCrop
from .resize import center_crop_into
from ..pack.arrays import take_rows
from ..serve.cache import open_split
from .codec import DECODERS, decode_cv2_reduced, jpeg_header
from .field import ImageField, served_fields


class InMemoryImageDataset(Dataset):
    """An image pack's split, held in RAM.

    Args:
        pack: the pack directory.
        split: which split to serve ("train", "val", ...).
        decode: "cv2" or "pil" to decode JPEG packs, "none" for the stored bytes (a 1-D uint8 array).
            For GPU decoding with nvJPEG, serve the dataset with `DaliImageLoader` (images/dali.py), which
            decodes whole batches; `decode="dali"` says so.
            Decoded (raw) packs are served without decoding whatever this says.
        transform: called on each image (a CHW uint8 tensor, or HWC numpy with `as_numpy`).
        as_numpy: return HWC uint8 numpy arrays instead of CHW uint8 tensors.
        verify: check every shard file's sha256 against the manifest while loading.
        cache: where the split lives: "ram" (this process, shared by forked workers), "mmap" (the
            pack's files mapped: the page cache is one copy for all workers and ranks) or "shm"
            (one copy in /dev/shm per machine, shared by every process and rank); see serve/cache.py.
        progress: report loading progress on stderr [default: for splits of 1 GiB or more].
        resolution: which size of a multi-resolution pack to serve [default: the largest]; `use(R)`
            switches, and so does indexing with `(R, i)` (see serve/progressive.py). "all" holds every
            size and serves the largest: a crop plan then cuts each crop from the smallest size that
            still gives at least the output size across the crop (fewer bytes to decode).
        keep_resolutions: how many resolutions stay loaded at once (the least recent is let go).
        caption_length: for a pack whose captions were tokenized (`--tokenize`): the fast Loader's batches then
            also hold `captions`, every caption's token ids (int64, what an embedding takes) truncated or padded to
            this many with the pack's pad id (the tokenizer's own, else 0: `caption_pad_id`), and
            `caption_lengths`, int32, each caption's true length capped at it. Samples (`dataset[i]`) keep
            the caption text; `caption_ids(i)` gives sample i's ids.

    `dataset[i]` gives `(image, label)`; `dataset[[i, j, ...]]` gives one collated batch
    `(images N x C x H x W uint8 in channels-last memory, labels int64)`; `__getitems__` gives a
    list of samples for the DataLoader's default collate. `dataset.sources[i]` is sample i's
    source path relative to the build's source root.

    A pack with captions serves `(image, label, caption)` (batches: captions a list of str; `captions[i]`, a
    `Strings` like `sources`); an unlabelled one (manifest `classes` empty, no labels stored; `labelled`)
    leaves the label out. The Loader serves captions only as ids (`caption_length`): text cannot travel
    through its shared batch buffers.
    """

    kinds: tuple[str, ...] = ("images",)  # the pack kinds this class serves

    def _fields(self, manifest: dict[str, Any], resolution: int | None) -> dict[str, Any]:
        """The fields to hold for `resolution` (the image field first); subclasses add theirs."""
        return served_fields(manifest, resolution, self.pack / "manifest.json")

    def __init__(
        self,
        pack: str | os.PathLike,
        split: str = "train",
        decode: str = "cv2",
        transform: Callable[[Any], Any] | None = None,
        as_numpy: bool = False,
        verify: bool = False,
        cache: str = "ram",
        progress: bool | None = None,
        resolution: int | None = None,
        keep_resolutions: int = 1,
        caption_length: int | None = None,
    ):
        if caption_length is not None and (isinstance(caption_length, bool) or not isinstance(caption_length, (int, np.integer))
                                           or caption_length < 1):
            raise DataprepError(f"caption_length is a number of token ids (at least 1), not {caption_length!r}")
        if decode == "dali":
            raise DataprepError("DALI decodes whole batches, not single samples: make the dataset with decode='none' "
                                "and serve it with dataprep.DaliImageLoader(dataset, batch_size)")
        if decode not in DECODERS:
            raise DataprepError(f"unknown decode {decode!r}; choose one of {sorted(DECODERS)} (or DaliImageLoader for DALI)")
        self.pack = Path(pack)
        self.split = split
        self.decode = decode
        self.transform = transform
        self.as_numpy = as_numpy
        self.verify = verify
        self.cache = cache
        self.progress = progress
        self.resolution = resolution
        self.keep_resolutions = max(1, keep_resolutions)
        self.caption_length = None if caption_length is None else int(caption_length)
        self.decode_paths: dict[str, int] = {}  # how crops were decoded in this process: "full", "1/2", "full from 256 px"
        self._load()

    # -- loading -------------------------------------------------------------------------------
    def _load(self) -> None:
        try:
            self._read()
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            # The manifest parsed as JSON but its structure is not what the format says.
            raise PackError(f"{self.pack}/manifest.json: malformed ({type(e).__name__}: {e})") from None

    def _read(self) -> None:
        self._stores: dict[int | None, Any] = {}
        self._all = self.resolution == "all"
        if not self._all:
            self._switch(self.resolution)
            return
        from ..pack.backends import read_manifest

        sizes = sorted(read_manifest(self.pack).get("resolutions") or [None])
        self.keep_resolutions = max(self.keep_resolutions, len(sizes))
        for r in sizes:  # the largest last: it is served, the others are there for crops to pick from
            self._switch(r)

    def use(self, resolution: int | None) -> None:
        """Serve `resolution` of a multi-resolution pack from now on, loading it if needed; beyond
        `keep_resolutions` loaded ones, the least recently used is let go (its memory freed or unmapped)."""
        if resolution != self.resolution or resolution not in self._stores:
            try:
                self._switch(resolution)
            except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
                raise PackError(f"{self.pack}/manifest.json: malformed ({type(e).__name__}: {e})") from None

    def _switch(self, resolution: int | None) -> None:
        c = self._stores.pop(resolution, None) if resolution is not None else None
        if c is None:
            c = open_split(self.pack, self.split, lambda m: self._fields(m, resolution), self.cache, self.verify,
                           self.progress, self.kinds)
        if resolution is None:  # the largest
            resolution = max(c.manifest.get("resolutions") or [c.manifest["settings"]["image"]["size"]])
            self._stores.pop(resolution, None)
        self._stores[resolution] = c  # most recently used last
        while len(self._stores) > self.keep_resolutions:
            self._stores.pop(next(iter(self._stores)))
        self.resolution = resolution
        self.field: ImageField = next(iter(c.fields.values()))
        self._arrays = c.arrays
        self._pixels = c.arrays["images"] if self.field.fixed else None
        self._blob = None if self.field.fixed else c.arrays["images"]
        self._offsets = c.arrays.get("offsets")
        self._shapes = c.arrays["shapes"]
        self._labels = c.arrays.get("labels")
        self.sources = c.fields["source"].strings(c.arrays)
        self.captions = c.fields["caption"].strings(c.arrays) if "caption" in c.fields else None
        self.classes: list[str] = list(c.manifest.get("classes") or [])
        self.labelled = bool(self.classes) and self._labels is not None  # unlabelled: `classes` empty, no labels stored
        tokens = c.fields.get("caption_tokens")
        self.caption_pad_id: int | None = tokens.pad_id if tokens is not None else None
        self._caption_ids = c.arrays[tokens.tokens] if tokens is not None else None
        self._caption_offsets = c.arrays[tokens.offsets] if tokens is not None else None
        if self.caption_length is not None and tokens is None:
            raise DataprepError(f"{self.pack}: caption_length={self.caption_length} serves tokenized captions, but the pack "
                                + ("has no captions" if self.captions is None else "holds its captions as text only")
                                + "; build it with --tokenize TOKENIZER (from captions), or leave caption_length out")
        self.class_names: list[str] | None = c.manifest.get("class_names")
        self.manifest = c.manifest
        self.resolutions: list[int] = sorted(c.manifest.get("resolutions") or [c.manifest["settings"]["image"]["size"]])

    def __getstate__(self) -> dict[str, Any]:
        # Spawned workers get the recipe, not the cache: a few hundred bytes through the pipe.
        keys = ("pack", "split", "decode", "transform", "as_numpy", "verify", "cache", "progress", "resolution", "keep_resolutions",
                "caption_length")
        state = {k: self.__dict__[k] for k in keys}
        if self._all:
            state["resolution"] = "all"
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.decode_paths = {}
        self._load()

    # -- facts ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._shapes)

    @property
    def labels(self) -> np.ndarray | None:
        """All labels, read-only, in the pack's (smallest) dtype (None for an unlabelled pack)."""
        return self._labels

    @property
    def shapes(self) -> np.ndarray:
        """(N, 3) array of every sample's (H, W, C) once decoded."""
        return self._shapes

    @property
    def _cached(self):
        """The split as currently served (its store also keeps a shared-memory segment attached)."""
        return self._stores[self.resolution]

    @property
    def nbytes(self) -> int:
        """Bytes of this split's arrays (in RAM, shared memory or mapped files, by cache mode)."""
        return self._cached.nbytes

    @property
    def segment(self) -> str | None:
        """The shared-memory segment's path with cache="shm"."""
        return str(self._cached.segment.path) if self._cached.segment else None

    # -- serving -------------------------------------------------------------------------------
    def stored(self, i: int) -> np.ndarray:
        """Sample i as the pack stores it, a read-only view of the cache (no copy): JPEG bytes, or pixels."""
        return self.field.sample(self._arrays, self._check(i))

    def jpeg(self, i: int) -> np.ndarray:
        """Sample i's JPEG bytes (a read-only view of the cache) once its frame header agrees with the shape
        the pack records: a damaged or hostile pack must not make a 633-byte sample decode to 12000 x 12000."""
        buf = self._blob[self._offsets[i] : self._offsets[i + 1]]
        head, (h, w, _) = jpeg_header(buf), self._shapes[i]
        if head is None or head[0] != h or head[1] != w:
            said = "no JPEG frame header" if head is None else f"a {head[1]}x{head[0]} JPEG"
            raise PackError(f"{self.pack}/{self.split}: sample {i} ({self.sources[i]}) holds {said}, but the pack records "
                            f"{w}x{h}; not decoded (verify the pack, or rebuild it)")
        return buf

    def image(self, i: int) -> np.ndarray:
        """Sample i's pixels (HWC uint8, a private copy), or its stored bytes with decode="none"."""
        if self._pixels is not None:
            return np.array(self._pixels[i])
        if self.field.encoding == "raw":
            buf = self._blob[self._offsets[i] : self._offsets[i + 1]]
            return buf.view(self.field.np_dtype).reshape(self._shapes[i]).copy()
        fn = DECODERS[self.decode]
        if fn is None:
            return self._blob[self._offsets[i] : self._offsets[i + 1]].copy()
        buf = self.jpeg(i)
        img = fn(buf, self.field.channels)
        if img is None:
            raise PackError(f"{self.pack}/{self.split}: sample {i} ({self.sources[i]}) does not decode as JPEG")
        return img

    def _check(self, i) -> int:
        n = len(self._shapes)
        i = int(i)
        if not -n <= i < n:
            raise IndexError(f"index {i} out of range for {n} samples in {self.pack}/{self.split}")
        return i % n

    def _finish(self, img: np.ndarray):
        if not self.as_numpy and img.ndim == 3:
            img = torch.from_numpy(img).permute(2, 0, 1)
        return self.transform(img) if self.transform is not None else img

    def __getitem__(self, index):
        if isinstance(index, tuple) and len(index) == 2:
            # (resolution, index): what a ResolutionBatchSampler yields, so the resolution of every batch
            # travels with its indices and reaches persistent workers too
            self.use(int(index[0]))
            index = index[1]
        if isinstance(index, slice):
            return self.batch(np.arange(len(self))[index])
        if isinstance(index, (Sequence, np.ndarray, torch.Tensor)) and not isinstance(index, (str, bytes)):
            if isinstance(index, (np.ndarray, torch.Tensor)) and index.ndim == 0:
                index = int(index)
            else:
                return self.batch(index)
        i = self._check(index)
        return self._sample(self._finish(self.image(i)), i)

    def caption_ids(self, i: int) -> np.ndarray:
        """Sample i's caption as token ids (a private copy, the stored dtype); for packs built with --tokenize."""
        if self._caption_ids is None:
            raise DataprepError(f"{self.pack}: its captions are not tokenized; build it with --tokenize TOKENIZER")
        i = self._check(i)
        return np.array(self._caption_ids[self._caption_offsets[i] : self._caption_offsets[i + 1]])

    def _sample(self, image, i: int):
        """Sample i as served: the image, then its label (labelled packs), then its caption (packs with captions)."""
        out = (image,) + ((int(self._labels[i]),) if self.labelled else ()) + ((self.captions[i],) if self.captions is not None else ())
        return out if len(out) > 1 else image

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        if len(indices) and isinstance(indices[0], tuple):
            self.use(int(indices[0][0]))
            indices = [i for _, i in indices]
        idx = [self._check(i) for i in indices]
        if self._pixels is not None and self.transform is None and not self.as_numpy:
            imgs = self._gather(np.asarray(idx, np.int64))
            return [self._sample(imgs[k], i) for k, i in enumerate(idx)]
        return [self._sample(self._finish(self.image(i)), i) for i in idx]

    def _gather(self, idx: np.ndarray) -> torch.Tensor:
        out = np.empty((len(idx), *self._pixels.shape[1:]), self._pixels.dtype)
        take_rows(self._pixels, idx, out)
        return torch.from_numpy(out).permute(0, 3, 1, 2)

    # -- the batch-fetch protocol the fast Loader uses (serve/request.py) -------------------------
    def worker_init(self) -> None:
        """Run once in each Loader worker: one decoding thread per process (workers are the parallelism)."""
        import cv2

        cv2.setNumThreads(0)  # 0, not 1: see engine/local.py

    def _square_at(self, resolution: int) -> tuple[int, int, int] | None:
        """Every sample's (H, W, C) at `resolution` when the build made them all one shape."""
        from .resize import RESIZE_MODES

        image = self.manifest["settings"]["image"]
        mode = RESIZE_MODES.get(image["resize"])
        return (resolution, resolution, self.field.channels) if mode is not None and mode.square else None

    def batch_layout(self, request: Request | None = None) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """What one sample occupies in a batch buffer: {"images": ((H, W, C), dtype), "labels": ((), int64)}
        (no labels for an unlabelled pack).
        A crop plan gives its output size; (H, W) cuts each image's central window, padded where smaller;
        without a crop, every sample must have one shape at the requested resolution."""
        request = request or Request()
        res = request.resolution if request.resolution is not None else self.resolution
        crop, c = request.crop, self.field.channels
        if crop is not None and not isinstance(crop, (tuple, list)):
            if not isinstance(crop, (RandomResizedCrop, CenterCrop)):
                raise DataprepError(f"crop is (H, W), dataprep.RandomResizedCrop or dataprep.CenterCrop, not {crop!r}")
            shape = (*crop.size, c)
            self._check_upscale(crop.size, res)
        elif crop is not None:
            if len(crop) != 2 or min(int(v) for v in crop) < 1:
                raise DataprepError(f"crop=(H, W) for images, not {crop!r}")
            shape = (int(crop[0]), int(crop[1]), c)
            self._warn_padding(shape, res)
        elif res == self.resolution and self._pixels is not None:
            shape = tuple(int(v) for v in self._pixels.shape[1:])
        elif res == self.resolution:
            shapes = {tuple(s) for s in self._shapes.tolist()}
            if len(shapes) != 1:
                raise DataprepError(f"{self.pack}/{self.split}: images have {len(shapes)} sizes; pass crop=(H, W), "
                                    "dataprep.CenterCrop(size) or dataprep.RandomResizedCrop(size)")
            shape = shapes.pop()
        else:
            shape = self._square_at(res)
            if shape is None:
                raise DataprepError(f"{self.pack}/{self.split}: images of resolution {res} have several sizes; pass a crop")
        if request.flip and len(shape) != 3:
            raise DataprepError("flip applies to (H, W, C) images")
        out = {"images": (shape, self.field.np_dtype.newbyteorder("="))}
        if self.labelled:
            out["labels"] = ((), np.dtype(np.int64))
        if self.caption_length is not None:
            out["captions"] = ((self.caption_length,), np.dtype(np.int64))  # nn.Embedding refuses uint16 / uint32
            out["caption_lengths"] = ((), np.dtype(np.int32))
        return out

    def _warn_padding(self, crop_shape, res) -> None:
        """A center crop larger than stored images pads them with zeros: said once per dataset and size."""
        if res != self.resolution or getattr(self, "_warned_crop", None) == crop_shape[:2]:
            return
        small = (self._shapes[:, 0] < crop_shape[0]) | (self._shapes[:, 1] < crop_shape[1])
        if small.any():
            self._warned_crop = crop_shape[:2]
            h, w = (int(v) for v in self._shapes[small][:, :2].min(0))
            warnings.warn(f"{self.pack}/{self.split}: crop {crop_shape[0]}x{crop_shape[1]} is larger than {int(small.sum())} of "
                          f"{len(small)} stored images (the smallest {h}x{w} px): they are padded with zeros", stacklevel=4)

    def _check_upscale(self, size, res) -> None:
        """A crop plan's output larger than the stored images would upscale every sample: refused."""
        if res != self.resolution:
            return
        h, w = (int(v) for v in self._shapes[:, :2].max(0)) if len(self._shapes) else (0, 0)
        if size[0] > h or size[1] > w:
            raise DataprepError(f"{self.pack}/{self.split}: a {size[0]}x{size[1]} crop is larger than every stored image "
                                f"(at most {h}x{w} px); serve a smaller size or build the pack larger")

    def _pixels_of(self, i: int) -> np.ndarray:
        """Sample i's pixels (HWC), a read-only view for decoded packs, decoded for JPEG packs."""
        if self._pixels is not None:
            return self._pixels[i]
        if self.field.encoding == "raw":
            return self._blob[self._offsets[i] : self._offsets[i + 1]].view(self.field.np_dtype).reshape(self._shapes[i])
        return self.image(i)

    def _cut(self, plan, i: int, box, out: np.ndarray) -> None:
        """One crop of sample i into its batch row, decoding no more than it needs: from the smallest held
        resolution that gives at least the output size across the crop (resolution="all"), then at the
        largest JPEG DCT scale-down that still does; the box is resampled exactly (crops.warp_into). The
        path taken is counted in `decode_paths` (per process)."""
        oh, ow = out.shape[:2]
        h, w = (int(v) for v in self._shapes[i, :2])
        if isinstance(plan, CenterCrop):  # the box is the whole image, resized to `resize` on the shorter side
            need = plan.resize / min(h, w)
            t = lft = 0.0
            bh, bw = float(h), float(w)
        else:
            t, lft, bh, bw = (float(v) for v in box)
            need = max(oh / bh, ow / bw)
        res, scale = self.resolution, 1.0
        if self._all:
            for r in sorted(self._stores):  # the smallest that suffices
                rh = int(self._stores[r].arrays["shapes"][i, 0])
                if r < self.resolution and rh / h >= need:
                    res, scale = r, rh / h
                    break
        store = self._stores[res]
        field = next(iter(store.fields.values()))
        factor = crops.reduction(bh * scale, bw * scale, oh, ow) if not isinstance(plan, CenterCrop) else \
            next((f for f in (8, 4, 2) if min(h, w) * scale / f >= plan.resize), 1)
        if field.encoding != "jpeg":
            factor = 1
        path = ("full" if factor == 1 else f"1/{factor}") + ("" if res == self.resolution else f" from {res} px")
        self.decode_paths[path] = self.decode_paths.get(path, 0) + 1
        if res == self.resolution and factor == 1:
            crops.apply(plan, self._pixels_of(i), box, out)  # the reference path: whole pixels, integer box
            return
        pixels = self._decoded(store, field, i, factor, res)
        if isinstance(plan, CenterCrop):
            crops.apply(plan, pixels, None, out, full_hw=(h, w))
            return
        sy, sx = pixels.shape[0] / h, pixels.shape[1] / w  # exact: the stored (and reduced) image's own scale
        if factor > 1:  # libjpeg's reduced pixel k covers full pixels [k f, (k + 1) f): ceil sizes, exact origin
            ry, rx = int(store.arrays["shapes"][i, 0]), int(store.arrays["shapes"][i, 1])
            sy, sx = ry / h / factor, rx / w / factor
        crops.warp_into(pixels, (t * sy, lft * sx, bh * sy, bw * sx), out)

    def _decoded(self, store, field, i: int, factor: int, res) -> np.ndarray:
        """Sample i of a held resolution's store, decoded at 1/factor (JPEG) or as stored (raw)."""
        a = store.arrays
        shape = tuple(int(v) for v in a["shapes"][i])
        if field.fixed:
            return a["images"][i]
        buf = a["images"][a["offsets"][i] : a["offsets"][i + 1]]
        if field.encoding == "raw":
            return buf.view(field.np_dtype).reshape(shape)
        head = jpeg_header(buf)
        if head is None or head[:2] != shape[:2]:
            raise PackError(f"{self.pack}/{self.split}: sample {i} at {res} px does not hold a {shape[1]}x{shape[0]} JPEG; "
                            "not decoded (verify the pack, or rebuild it)")
        img = decode_cv2_reduced(buf, field.channels, factor)
        if img is None:
            raise PackError(f"{self.pack}/{self.split}: sample {i} ({self.sources[i]}) at {res} px does not decode as JPEG")
        return img

    def fill_batch(self, idx: np.ndarray, out: dict[str, np.ndarray], request: Request | None = None) -> None:
        """Write samples `idx` into the preallocated rows of `out` (shaped as `batch_layout` says):
        decoded packs by one gather, others one by one straight into their row, cut by the request's crop
        and flipped by its draws."""
        if self.transform is not None:
            raise DataprepError("the batch path serves uint8 pixels; apply transforms to the batch (on the GPU)")
        request = request or Request()
        if request.resolution is not None and request.resolution != self.resolution:
            self.use(request.resolution)
        images, n = out["images"], len(idx)
        idx = np.asarray(idx, np.int64)
        if "labels" in out:
            out["labels"][:n] = self._labels[idx]
        if "captions" in out:
            fill_caption_ids(self._caption_ids, self._caption_offsets, idx, self.caption_pad_id,
                             out["captions"][:n], out["caption_lengths"][:n])
        crop = request.crop
        if crop is not None and not isinstance(crop, (tuple, list)):
            boxes = crop.boxes(self._shapes[idx, 0], self._shapes[idx, 1], (request.seed, request.epoch), idx)
            for k, i in enumerate(idx):
                self._cut(crop, int(i), boxes[k], images[k])
        elif self._pixels is not None and images.shape[1:] == self._pixels.shape[1:]:
            take_rows(self._pixels, idx, images[:n])
        else:
            for k, i in enumerate(idx):
                center_crop_into(self._pixels_of(int(i)), images[k])
        if request.flip:
            for k in np.flatnonzero(crops.flips((request.seed, request.epoch), idx)):
                crops.flip_into(images[k])

    def batch(self, indices) -> Any:
        """A whole batch: images (N, C, H, W) uint8 in channels-last memory, or (N, H, W, C) numpy with
        `as_numpy`; labels int64 (labelled packs); captions, a list of str (packs with captions). Samples must
        share one shape (a fixed-shape pack, or a transform that crops)."""
        idx = np.asarray([self._check(i) for i in np.asarray(indices).reshape(-1)], np.int64)
        rest = ((torch.from_numpy(self._labels[idx].astype(np.int64)),) if self.labelled else ()) + \
            (([self.captions[i] for i in idx.tolist()],) if self.captions is not None else ())
        images = self._batch_images(idx)
        return (images, *rest) if rest else images

    def _batch_images(self, idx: np.ndarray):
        if self._pixels is not None and self.transform is None:
            imgs = self._gather(idx)
            return imgs.permute(0, 2, 3, 1).numpy() if self.as_numpy else imgs
        samples = [self._finish(self.image(i)) for i in idx]
        shapes = {tuple(s.shape) for s in samples}
        if len(shapes) > 1:
            raise DataprepError(
                f"{self.pack}/{self.split}: a batch holds images of {len(shapes)} shapes; build with "
                "--resize center-crop or pad, or pass a transform that crops to one size"
            )
        return np.stack(samples) if self.as_numpy else torch.stack(samples)
