"""InMemoryImageDataset: takes an image pack, gives (image, label[, caption]) samples and whole batches from RAM.

The split is read once into a few contiguous numpy buffers (pixels, or one JPEG blob plus int64
offsets; labels; source paths and captions as one UTF-8 blob each), never a Python list of per-image
objects, so forked DataLoader workers share it without copy-on-read growth.

Holding the split (its stores by resolution, a partition's part, the rows exclude= keeps, the recipe a
spawned worker reloads from) is holding.py's SplitHolding, a mixin as batches.py's BatchFilling is; its
names are still served from here.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from ..errors import DataprepError, PackError
from ..pack.arrays import take_rows
from ..remote.packs import resolve
from ..serve import draws
from ..serve.partition import partition_of
from .batches import BatchFilling
from .codec import DECODERS, DecodeVariant, decode_variant
from .field import served_fields
from .holding import SplitHolding, _Rows  # noqa: F401  (_Rows: still importable from here, where it lived before)

EXCLUDE = (None, "leaks")  # what exclude= may leave out


class InMemoryImageDataset(BatchFilling, SplitHolding, Dataset):
    """An image pack's split, held in RAM.

    Args:
        pack: the pack directory, or its URL (s3://, gs://, az://, file://, ...: fetched with every
            checksum checked; see dataprep/remote/).
        split: which split to serve ("train", "val", ...).
        decode: how JPEG packs are decoded. "fast" [default]: training crops (a Loader's
            RandomResizedCrop) decode only the restart segments around each box, with libjpeg-turbo's fast
            IDCT and upsampling (simplejpeg); samples read alone (`ds[i]`), center and fixed crops decode
            accurately. "accurate" (or "cv2"): every path with OpenCV's accurate IDCT and fancy upsampling
            (the pixel cost of "fast" is in docs/benchmarks.md, "Fast decoding"). "pil": samples decoded
            by Pillow. "none": samples are the stored bytes (a 1-D uint8 array). For GPU decoding with
            nvJPEG, serve the dataset with `DaliImageLoader` (images/dali.py), which decodes whole batches;
            `decode="dali"` says so.
            Decoded (raw) packs are served without decoding whatever this says.
        transform: called on each image (a CHW uint8 tensor, or HWC numpy with `as_numpy`). A crop plan
            (`CenterCrop(256, resize=256)`) cuts the stored pixels first and gives every image one shape, so
            the stock DataLoader can stack a batch of a variable-size pack; under a ResolutionBatchSampler it
            is resized to each batch's resolution (`CenterCrop.resized`), as a Loader's schedule resizes its crop.
        as_numpy: return HWC uint8 numpy arrays instead of CHW uint8 tensors.
        verify: check every shard file's sha256 against the manifest while loading.
        cache: where the split lives: "ram" (this process, shared by forked workers), "mmap" (the
            pack's files mapped: the page cache is one copy for all workers and ranks) or "shm"
            (one copy in /dev/shm per machine, shared by every process and rank); see serve/cache.py. A pack
            at a URL: "ram" or "shm" (fetched straight into memory), or "disk:DIR" (a verified copy in DIR,
            kept for later runs, served mapped).
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
        partition: None (every shard), "node" (this node's part only, node and ranks from torchrun's
            environment) or a `dataprep.Partition`: a pack larger than one node's RAM held once across the
            nodes; the Loader shards each epoch over the node's ranks (serve/partition.py).
        exclude: None, or "leaks": serve the split without its samples that have a near twin (within the audit's
            default distance, dataprep/audit/) in another split of the pack: `len` shrinks and the samples are
            numbered 0.. len - 1 over those served, in their order; `excluded` holds the split indices left
            out. Read from the pack's stored hashes (a pack built without them is hashed once, with a note on
            stderr; a pack at a URL has every split's hashes fetched), once: a pickled dataset (a spawned
            worker's) carries the mask. `sources`, `labels`, `shapes` and `captions` are by position too,
            `sources[i]` naming the file `dataset[i]` serves; with a partition they cover every held sample.
            Crops and flips are drawn by each sample's index in the split, so a served sample gets the same
            draws with or without the exclusion.

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
        decode: str = "fast",
        transform: Callable[[Any], Any] | None = None,
        as_numpy: bool = False,
        verify: bool = False,
        cache: str = "ram",
        progress: bool | None = None,
        resolution: int | None = None,
        keep_resolutions: int = 1,
        caption_length: int | None = None,
        partition: Any = None,
        exclude: str | None = None,
    ):
        if caption_length is not None and (isinstance(caption_length, bool) or not isinstance(caption_length, (int, np.integer))
                                           or caption_length < 1):
            raise DataprepError(f"caption_length is a number of token ids (at least 1), not {caption_length!r}")
        self.variant: DecodeVariant = decode_variant(decode)  # what each path decodes with (a DALI or unknown name: refused)
        self._origin = pack  # as asked for (a URL too): exclude= audits the whole pack
        pack, cache = resolve(pack, cache)  # a URL: a staged local directory, its files fetched with the cache
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
        self.partition = partition_of(partition)  # None: every shard; else this node's part (serve/partition.py)
        if self.partition is not None and self.partition.rotate_every and cache == "ram":
            raise DataprepError("a rotating partition reloads its part every few epochs: with cache='ram' each Loader "
                                "worker would load a private copy; use cache='shm' (one copy a node) or 'mmap' / 'disk:DIR'")
        if exclude not in EXCLUDE:
            raise DataprepError(f"exclude is None or {', '.join(repr(e) for e in EXCLUDE if e)}, not {exclude!r}")
        self.exclude = exclude
        self._leaks: np.ndarray | None = None  # exclude="leaks": per sample of the split, whether it has a twin elsewhere
        self._part_epoch = 0  # the epoch whose part is held
        self._asked: int | None = None  # the resolution the last (R, i) request named: a crop plan transform follows it
        self.decode_paths: dict[str, int] = {}  # how crops were decoded in this process: "full", "1/2", "region 1/2", ...
        self._load()

    # -- facts ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        """Samples in the split; with a partition, what every node serves an epoch (its largest part's count:
        a smaller part serves its first samples again, as DistributedSampler pads)."""
        return self._length if self._global is not None else len(self._shapes)

    # -- serving -------------------------------------------------------------------------------
    def stored(self, i: int) -> np.ndarray:
        """Sample i as the pack stores it: JPEG bytes, or pixels.

        Args:
            i: The sample's index.

        Returns:
            A read-only view of the cache (no copy).
        """
        return self.field.sample(self._arrays, self._check(i))

    def jpeg(self, i: int) -> np.ndarray:
        """Sample i's JPEG bytes, once its frame header agrees with the shape the pack records.

        The header must also be within what the pack's build makes: a damaged or hostile pack must not make
        a 633-byte sample decode to 32767 x 32767 (BatchFilling._jpeg_at).

        Args:
            i: The sample's index.

        Returns:
            A read-only view of the cache.
        """
        return self._jpeg(self._check(i))

    def _jpeg(self, i: int) -> np.ndarray:
        """Held row i's JPEG bytes, its header checked (see `jpeg`)."""
        return self._jpeg_at(self._cached, i, self.resolution)

    def image(self, i: int) -> np.ndarray:
        """Sample i's pixels, or its stored bytes with decode="none".

        Args:
            i: The sample's index.

        Returns:
            HWC uint8 pixels, a private copy.
        """
        if self._pixels is not None:
            return np.array(self._pixels[i])
        if self.field.encoding == "raw":
            buf = self._blob[self._offsets[i] : self._offsets[i + 1]]
            return buf.view(self.field.np_dtype).reshape(self._shapes[i]).copy()
        fn = DECODERS[self.decode]
        if fn is None:
            return self._blob[self._offsets[i] : self._offsets[i + 1]].copy()
        buf = self._jpeg(i)
        img = fn(buf, self.field.channels)
        if img is None:
            raise PackError(f"{self.pack}/{self.split}: sample {i} ({self._sources[i]}) does not decode as JPEG")
        return img

    def _check(self, i) -> int:
        n = len(self)
        i = int(i)
        if not -n <= i < n:
            raise IndexError(f"index {i} out of range for {n} samples in {self.pack}/{self.split}")
        return self._held_row(i % n, self._part_epoch)

    def _held_row(self, i, epoch: int):
        """Position i (< len) -> the held row it serves: itself, or for a smaller part's padding positions,
        rows drawn anew each epoch (an offset from the epoch), so no sample is the one served twice every time."""
        if self._global is None:
            return i
        held = max(1, len(self._shapes) if self._kept is None else len(self._kept))
        shift = int(draws.bits((draws.PAD, int(epoch)), 0)) % held
        q = np.where(i < held, i, (i - held + shift) % held) if isinstance(i, np.ndarray) else (
            i if i < held else (i - held + shift) % held)
        return q if self._kept is None else (self._kept[q] if isinstance(q, np.ndarray) else int(self._kept[q]))

    def _finish(self, img: np.ndarray):
        t = self.transform
        if hasattr(t, "resized"):  # a crop plan cuts the stored pixels, at the resolution a sampler asked for
            img, t = (t.resized(self._asked) if self._asked is not None else t)(img), None
        if not self.as_numpy and img.ndim == 3:
            img = torch.from_numpy(img).permute(2, 0, 1)
        return t(img) if t is not None else img

    def _serve_resolution(self, resolution) -> None:
        """A ResolutionBatchSampler's request names R: serve R, and a crop plan transform at R."""
        self.use(int(resolution))
        self._asked = int(resolution)

    def __getitem__(self, index):
        if isinstance(index, tuple) and len(index) == 2:
            # (resolution, index): what a ResolutionBatchSampler yields, so the resolution of every batch
            # travels with its indices and reaches persistent workers too
            self._serve_resolution(index[0])
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
        """Sample i's caption as token ids, for packs built with --tokenize.

        Args:
            i: The sample's index.

        Returns:
            The ids in the stored dtype, a private copy.
        """
        if self._caption_ids is None:
            raise DataprepError(f"{self.pack}: its captions are not tokenized; build it with --tokenize TOKENIZER")
        i = self._check(i)
        return np.array(self._caption_ids[self._caption_offsets[i] : self._caption_offsets[i + 1]])

    def _sample(self, image, i: int):
        """Sample i as served: the image, then its label (labelled packs), then its caption (packs with captions)."""
        out = (image,) + ((int(self._labels[i]),) if self.labelled else ()) + ((self._captions[i],) if self._captions is not None else ())
        return out if len(out) > 1 else image

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        if len(indices) and isinstance(indices[0], tuple):
            self._serve_resolution(indices[0][0])
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
    def batch(self, indices) -> Any:
        """A whole batch; its samples must share one shape (a fixed-shape pack, or a transform that crops).

        Args:
            indices: The sample indices.

        Returns:
            Images (N, C, H, W) uint8 in channels-last memory, or (N, H, W, C) numpy with `as_numpy`; then
            labels int64 (labelled packs); then captions, a list of str (packs with captions).
        """
        idx = np.asarray([self._check(i) for i in np.asarray(indices).reshape(-1)], np.int64)
        rest = ((torch.from_numpy(self._labels[idx].astype(np.int64)),) if self.labelled else ()) + \
            (([self._captions[i] for i in idx.tolist()],) if self._captions is not None else ())
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
