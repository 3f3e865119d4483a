"""Batches for the Loader: takes an image dataset's cached split and a request (epoch, seed, resolution,
crop, flip), gives its batch layout and fills batch rows: decoded packs by one gather, JPEG packs decoded
one by one straight into their row (at a reduced DCT scale where the crop allows), cut by the crop plan
and flipped by the request's draws (images/geometry.py, which moves boxes and masks by the same). A mixin
of InMemoryImageDataset (images/dataset.py), which holds the arrays.
"""
from __future__ import annotations

import math
import warnings

import numpy as np

from ..errors import DataprepError, PackError
from ..pack.arrays import take_rows
from ..serve.request import Request
from . import crops, geometry, resample
from .captions import fill_caption_ids
from .codec import decode_cv2_reduced, decode_fast, fast_decoding
from .crops import CenterCrop, RandomResizedCrop
from .field import jpeg_refusal
from .jpegseg import region_of
from .resize import RESIZE_MODES, center_crop_into

_FAST = fast_decoding()  # simplejpeg imports (it is a dependency): else every crop decodes accurately


class BatchFilling:
    """What InMemoryImageDataset offers the Loader: serve/contract.py's `Servable` (`batch_layout`,
    `fill_batch`; `__len__` is the dataset's) and its hooks `WorkerInit`, `FillsRows` and `FillsParts`.
    A mixin rather than a member object: the methods read the dataset's own arrays and settings, which
    SegmentationDataset extends by overriding them."""

    def worker_init(self) -> None:
        """Run once in each Loader worker: one decoding thread per process (workers are the parallelism)."""
        import cv2

        cv2.setNumThreads(0)  # 0, not 1: see engine/local.py

    def _square_at(self, resolution: int) -> tuple[int, int, int] | None:
        """Every sample's (H, W, C) at `resolution` when the build made them all one shape."""
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

    def _cut(self, plan, i: int, box, out: np.ndarray, hw: tuple[int, int] | None = None) -> None:
        """One crop of sample i into its batch row, decoding no more than it needs: from the smallest held
        resolution that gives at least the output size across the crop (resolution="all"), then at the
        largest JPEG DCT scale-down that still does; the box is resampled exactly (resample.warp_into).
        Training crops (RandomResizedCrop) of a JPEG pack decode only the restart segments around the box,
        with the fast IDCT and upsampling (`_cut_fast`), where the dataset's decode variant says so
        (`region_crops`: decode="fast", codec.DECODE_VARIANTS); every other crop decodes
        the whole image accurately. The path taken is counted in `decode_paths` (per process): the scale
        ("full", "1/2", "full from 256 px"), prefixed "region " or "fast " where the fast decode ran. `hw`:
        sample i's stored (height, width), where the caller has read it already (a batch's, in one gather)."""
        oh, ow = out.shape[:2]
        h, w = hw if hw is not None else (int(v) for v in self._shapes[i, :2])
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
        factor = resample.reduction(bh * scale, bw * scale, oh, ow) if not isinstance(plan, CenterCrop) else \
            next((f for f in (8, 4, 2) if min(h, w) * scale / f >= plan.resize), 1)
        if field.encoding != "jpeg":
            factor = 1
        path = ("full" if factor == 1 else f"1/{factor}") + ("" if res == self.resolution else f" from {res} px")
        fast = None
        if field.encoding == "jpeg" and not field.fixed and self.variant.region_crops and isinstance(plan, RandomResizedCrop) and _FAST:
            fast = self._cut_fast(plan, store, field, i, factor, res, (t, lft, bh, bw), (h, w), out)
        if fast:  # "region 1/2", "fast full": counted apart, so stats() and `dataprep bench` show which decode ran
            path = f"{fast} {path}"
        self.decode_paths[path] = self.decode_paths.get(path, 0) + 1
        if fast:
            return
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
        resample.warp_into(pixels, (t * sy, lft * sx, bh * sy, bw * sx), out)

    def _cut_fast(self, plan, store, field, i: int, factor: int, res, box, hw, out: np.ndarray) -> str | None:
        """`_cut` for a training crop whose decode variant has `region_crops` (decode="fast"): the restart segments covering the box (plus the
        pixels bilinear sampling reads around it) cut out as a JPEG of their own (jpegseg.region_of),
        decoded with the fast IDCT and upsampling at 1/factor, then resampled as the whole image would be
        (the same box, the same arithmetic). A JPEG without restart segments (a kept source the build
        could not give markers: progressive, or no compiled part; a pack built before them) is decoded
        whole, fast. Gives "region" (segments decoded) or "fast" (the whole image decoded fast); None,
        having done nothing, where the fast decoder cannot read the bytes (CMYK, damage): the caller's
        accurate path decides."""
        a = store.arrays
        buf = self._jpeg_at(store, i, res)
        (h, w), (t, lft, bh, bw) = hw, box
        sh, sw = (h, w) if res == self.resolution else (int(v) for v in a["shapes"][i, :2])
        ry, rx = sh / h, sw / w  # the store's pixels per the pack's (1 at the main resolution)
        margin = 2 * factor  # bilinear taps and the area step's rounding, in the store's full pixels
        y0, x0 = int(t * ry) - margin, int(lft * rx) - margin
        y1, x1 = math.ceil((t + bh) * ry) + margin, math.ceil((lft + bw) * rx) + margin
        cut = region_of(buf, y0, y1, x0, x1)
        if cut is None or cut[:2] != (sh, sw):  # the C walk reads the header jpeg_problem read (tests/test_jpegseg.py)
            raise PackError(f"{self.pack}/{self.split}: sample {i} ({self._sources[i]}) at {res} px: the region cut reads "
                            f"another frame header than {sw}x{sh}; not decoded (verify the pack, or rebuild it)")
        _, _, sub, top, left = cut
        how = "fast" if sub is None else "region"
        pixels = decode_fast(buf if sub is None else sub, field.channels, factor)
        if pixels is None:
            return None
        if factor == 1 and res == self.resolution:  # integer box, whole pixels: as crops.apply cuts it
            y, x = int(t) - top, int(lft) - left
            if not resample.bilinear_window_into(pixels[y : y + int(bh), x : x + int(bw)], out, plan.interpolation):
                crops.apply(plan, pixels, (t - top, lft - left, bh, bw), out)
            return how
        ky, kx = ry / factor, rx / factor  # reduced pixel k covers the store's pixels [k f, (k + 1) f)
        resample.warp_into(pixels, ((t * ry - top) / factor, (lft * rx - left) / factor, bh * ky, bw * kx), out)
        return how

    def _jpeg_at(self, store, i: int, res) -> np.ndarray:
        """Sample i's JPEG bytes in a held resolution's store (a view), once every serving path may decode them
        (field.jpeg_refusal: its frame header, its bytes and the pack's caps). Read from the header before a
        decoder allocates: a damaged or forged pack must not make a 633-byte sample decode to gigabytes,
        whatever its shapes say. The held bytes never change, so a sample is checked once per process and
        store (`_passed`), not every epoch."""
        a = store.arrays
        buf = a["images"][a["offsets"][i] : a["offsets"][i + 1]]
        passed = self._passed_in(store)
        if passed[i]:
            return buf
        h, w = (int(v) for v in a["shapes"][i, :2])
        why = jpeg_refusal(buf, h, w, self.manifest, res)
        if why is not None:
            raise PackError(f"{self.pack}/{self.split}: sample {i} ({self._sources[i]}) at {res} px {why}; "
                            "not decoded (verify the pack, or rebuild it)")
        passed[i] = True  # threads may race here: each writes True for a sample it checked
        return buf

    def _passed_in(self, store) -> np.ndarray:
        """The samples of `store` whose JPEG header passed in this process (one byte each), made at first use.
        Keyed by the store object, which the entry keeps alive so its id is never reused while listed."""
        held = self.__dict__.setdefault("_passed", {})
        entry = held.get(id(store))
        if entry is None or entry[0] is not store:
            if len(held) > 8:  # stores switched away from (resolutions, partition parts): let them go
                held.clear()
            entry = held[id(store)] = (store, np.zeros(len(store.arrays["offsets"]) - 1, bool))
        return entry[1]

    def _decoded(self, store, field, i: int, factor: int, res) -> np.ndarray:
        """Sample i of a held resolution's store, decoded at 1/factor (JPEG) or as stored (raw)."""
        a = store.arrays
        if field.fixed:
            return a["images"][i]
        if field.encoding == "raw":
            shape = tuple(int(v) for v in a["shapes"][i])
            return a["images"][a["offsets"][i] : a["offsets"][i + 1]].view(field.np_dtype).reshape(shape)
        img = decode_cv2_reduced(self._jpeg_at(store, i, res), field.channels, factor)
        if img is None:
            raise PackError(f"{self.pack}/{self.split}: sample {i} ({self._sources[i]}) at {res} px does not decode as JPEG")
        return img

    fills_rows = True  # fill_batch takes rows= (a Mixture's members write straight into their batch rows)
    # Loader(threads=True): fills of disjoint rows may run at once (per-call buffers, thread-local scratch;
    # decode_paths may then miss a count); a resolution or partition switch happens in a pass's first fill
    fills_in_threads = True

    def settle(self, request: Request) -> None:
        """Hold the resolution `request` asks for (the contract's `settle`: what a fill does first).

        Args:
            request: What the pass asks for; its resolution, None for the one held.
        """
        if request.resolution is not None and request.resolution != self.resolution:
            self.use(request.resolution)

    def fill_batch(self, idx: np.ndarray, out: dict[str, np.ndarray], request: Request | None = None,
                   rows: np.ndarray | None = None) -> None:
        """Write samples `idx` into the preallocated rows of `out` (shaped as `batch_layout` says), its first
        rows or rows `rows`: decoded packs by one gather, others one by one straight into their row, cut by
        the request's crop and flipped by its draws."""
        self.fill_parts([(self, idx, rows, request or Request())], out)

    @staticmethod
    def fill_parts(parts, out: dict[str, np.ndarray]) -> None:
        """Image datasets' samples into their rows of one batch: parts of (dataset, idx, rows, request), as
        each dataset's fill_batch fills them (a Mixture's members, one request each: its epoch and seed,
        one crop and flip for all), with every part's crop boxes and flips drawn in one pass (geometry.draw):
        a draw costs numpy's overhead per call, so it is paid once a batch, not once per member in it."""
        crop, flip = parts[0][3].crop, parts[0][3].flip
        placed = [d._place(idx, out, req, rows) for d, idx, rows, req in parts]  # (idx, keys, at, row)
        plan = geometry.plan_of(crop) is not None
        drawn = None
        if plan or flip:
            keys = [(req.seed, req.epoch) for *_, req in parts]
            which = np.repeat(np.arange(len(parts)), [len(p[0]) for p in placed]) if len(parts) > 1 else None
            heights = widths = None
            if plan:
                heights = np.concatenate([d._shapes[p[0], 0] for (d, *_), p in zip(parts, placed)])
                widths = np.concatenate([d._shapes[p[0], 1] for (d, *_), p in zip(parts, placed)])
            drawn = geometry.draw(crop, flip, keys if which is not None else keys[0], np.concatenate([p[1] for p in placed]),
                                  out["images"].shape[1:3], heights, widths, which)
        start = 0
        for (d, *_), (idx, _, at, row) in zip(parts, placed):
            part = drawn.part(start, start + len(idx)) if drawn is not None else None
            d._pixels_into(idx, out["images"], at, row, crop, part.boxes if part is not None else None)
            if part is not None:
                geometry.flip_into(part, out["images"], row)
            start += len(idx)

    def _place(self, idx, out: dict[str, np.ndarray], request: Request, rows):
        """fill_batch's bookkeeping for samples `idx`: the request's part and resolution held, labels and
        captions written; gives (rows of the split, what each sample's crop and flip are drawn from: its
        index in the split, the batch rows (a slice or an array) and each sample's batch row)."""
        if self.transform is not None:
            raise DataprepError("the batch path serves uint8 pixels; apply transforms to the batch (on the GPU)")
        if self.partition is not None:
            self._hold_part(request.epoch)
        self.settle(request)
        n = len(idx)
        if rows is None or isinstance(rows, slice):
            at = slice(0, n) if rows is None else rows
            row = range(at.start, at.start + n)
        else:
            at = np.asarray(rows, np.int64)
            row = at.tolist()
        idx = np.asarray(idx, np.int64)
        keys = idx
        if self._global is not None:
            idx = self._held_row(idx, request.epoch)
            keys = self._global[idx]
        if "labels" in out:
            out["labels"][at] = self._labels[idx]
        if "captions" in out:
            if isinstance(at, slice):  # a slice of out is a view: filled in place
                ids, lengths = out["captions"][at], out["caption_lengths"][at]
            else:
                ids, lengths = np.empty((n, *out["captions"].shape[1:]), out["captions"].dtype), np.empty(n, out["caption_lengths"].dtype)
            fill_caption_ids(self._caption_ids, self._caption_offsets, idx, self.caption_pad_id, ids, lengths)
            if not isinstance(at, slice):
                out["captions"][at], out["caption_lengths"][at] = ids, lengths
        return idx, keys, at, row

    def _pixels_into(self, idx: np.ndarray, images: np.ndarray, at, row, crop, boxes) -> None:
        """Samples `idx` into their batch rows: cut by a crop plan's boxes, a decoded pack's rows gathered,
        or each center-cropped."""
        if boxes is not None:  # Python ints and one gather a batch: per-image numpy scalars cost more than the cut
            for i, box, r, hw in zip(idx.tolist(), boxes.tolist(), row, self._shapes[idx, :2].tolist()):
                self._cut(crop, i, box, images[r], hw)
        elif self._pixels is not None and images.shape[1:] == self._pixels.shape[1:]:
            if isinstance(at, slice):
                take_rows(self._pixels, idx, images[at])
            else:
                images[at] = take_rows(self._pixels, idx, np.empty((len(idx), *images.shape[1:]), images.dtype))
        else:
            for k, i in enumerate(idx):
                center_crop_into(self._pixels_of(int(i)), images[row[k]])
            self._count_whole(len(idx))

    def _count_whole(self, n: int) -> None:
        """n whole images decoded (no crop plan): counted as "full" for a JPEG pack, so stats() knows the pack is
        stored encoded (its advice names a decoded pack only then)."""
        if self.field.encoding == "jpeg" and self._pixels is None:
            self.decode_paths["full"] = self.decode_paths.get("full", 0) + n
