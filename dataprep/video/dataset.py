"""VideoDataset: takes a video pack, gives clips (T frames at a stride or a frame rate, one crop box and one flip for the whole clip)
and whole batches of them from RAM, through the image kind's per-frame crop paths.

A clip is one sample. Its frames are rows of the pack's frames field (an image field over frames), so the image
kind's loading, caches and cuts serve them: a crop plan's box is drawn once per clip from (seed, epoch, clip) on
the video's frame size (images/geometry.py: `draw`), and each of the T frames is cut by that box (images/batches.py:
`_cut`, which decodes only a training crop's restart segments), then the clip is flipped as one. The clip's first
frame is drawn from (seed, epoch, clip) too, on a stream of its own, so any number of workers, threads or a resumed
run serve the same clips.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np
import torch

from ..errors import DataprepError, PackError
from ..images import geometry
from ..images.dataset import InMemoryImageDataset
from ..images.resize import center_crop_into
from ..serve import draws
from ..serve.request import Request
from .field import STARTS, TIMESTAMPS, FramesField, served_fields, size_changes

# bounds on what a clip request may ask: a clip's rows, their frame arithmetic (int64) and an epoch's length stay
# far from overflow and from buffers no machine holds
MAX_FRAMES, MAX_STRIDE, MAX_CLIPS_PER_VIDEO = 1 << 16, 1 << 31, 1 << 16
LAYOUTS = ("tchw", "cthw")  # a clip's axes as served: frames first, or channels first (torchvision's video models)
# How far past an instant a stored frame's timestamp may be and still be "at or before" it: an instant is a sum of
# floats (0.7 + 0.1 < 0.8), far below any frame interval.
EPS = 1e-6


class VideoDataset(InMemoryImageDataset):
    """A video pack's split, held in RAM (one copy for every worker, as InMemoryImageDataset), served as clips.

    An epoch serves `clips_per_video` clips of every video (`len` = videos x clips_per_video; clip j is one of
    video j // clips_per_video's). A clip is `frames` frames `stride` stored frames apart, or, with `fps`, the
    frames shown at `frames` instants 1/fps seconds apart (by the pack's timestamps: each instant served by the
    stored frame at or before it, so a variable frame rate or a pack built without `--fps` still gives clips at
    a real rate). Its first frame is drawn anew every epoch from (seed, epoch, j) among those where the whole
    clip fits (with `fps`: whose time leaves (frames - 1) / fps seconds before the video's last frame). A video
    shorter than a clip starts at its first frame and repeats its last frame to fill the clip.

    Served by `dataprep.Loader`: batches `(clips, labels)` (no labels for an unlabelled pack), clips uint8
    (B, T, 3, H, W) (a channels-first view of the (B, T, H, W, 3) rows the workers fill, as images are served;
    `layout="cthw"` gives (B, 3, T, H, W); the Loader's `layout="nhwc"` keeps channels last, (B, T, H, W, 3)),
    labels int64. `Loader(crop=RandomResizedCrop(...) | CenterCrop(...) | (H, W), flip=True)`: one box and one
    flip a clip, on all its frames. Without a crop every frame of the split must have one size (the frames of a
    video always do: the build keeps one size a video); a pack whose videos differ in size is refused then: pass a
    crop.

    A `Mixture` mixes VideoDatasets (of one `frames`; each its own pack, stride and clips_per_video) as it mixes
    image packs: a clip is one position, its start, box and flip drawn in its member's epoch with its member's
    seed; not with image datasets (one kind a Mixture), nor in threads (a Mixture does not fill in threads).
    A Loader's `schedule=` serves each epoch's clips at its size: a multi-resolution pack's stored frames of that
    size, or a crop plan's output. `loader.stats()` counts clips: `samples` is clips served, `decode_paths` one
    count a frame cut by a crop plan (a clip adds `frames`, a repeated last frame included; nothing without a
    crop plan, as for images).

    Args:
        pack: the pack directory, or its URL (as InMemoryImageDataset).
        frames: frames a clip (T).
        stride: frames between a clip's consecutive frames, in stored frames (the build's `--fps` sets their rate)
            [default: 2, unless `fps` is given].
        fps: a clip's frame rate, in frames a second of the video's timestamps, instead of a stride (not both).
        split: which split to serve.
        clips_per_video: clips of each video an epoch.
        seed: mixed into the clip starts' draws with the Loader's seed (two datasets over one pack, one Loader
            seed, start their clips apart); crops and flips are the Loader's seed's alone, as for images.
        decode: as InMemoryImageDataset's ("fast": training crops decode only the restart segments around the box).
        cache: "ram", "mmap" or "shm" (as InMemoryImageDataset's).
        layout: "tchw" (clips (B, T, 3, H, W)) or "cthw" ((B, 3, T, H, W)).
        verify, progress, resolution, keep_resolutions: as InMemoryImageDataset's.

    `dataset[j]` gives clip j of the epoch `set_epoch` last named (the Loader's seed 0, no crop):
    `(clip uint8 (T, 3, H, W) or (3, T, H, W), label)`. `frame_rows(j)` gives its frames' rows in the split;
    `sources[v]`, `labels[v]`, `video_starts`, `timestamps` are per video and per frame.
    """

    kinds = ("video",)
    fills_rows = False  # fill_batch writes out's first rows only (a Mixture gives it a buffer of its own)
    fill_parts = None  # the image kind's fills images, not clips: a Mixture fills member by member
    fills_in_threads = True  # per-call buffers; a resolution switch happens in a pass's first fill, run alone

    def __init__(self, pack: str | os.PathLike, frames: int = 16, stride: int | None = None, split: str = "train",
                 clips_per_video: int = 1, seed: int = 0, decode: str = "fast", cache: str = "ram", layout: str = "tchw",
                 verify: bool = False, progress: bool | None = None, resolution: int | None = None, keep_resolutions: int = 1,
                 fps: float | None = None):
        if fps is not None and stride is not None:
            raise DataprepError(f"VideoDataset: stride={stride!r} counts stored frames, fps={fps!r} seconds: pass one of them")
        if fps is not None and (isinstance(fps, bool) or not isinstance(fps, (int, float, np.number))
                                or not 1e-3 <= fps <= 1000):
            raise DataprepError(f"VideoDataset: fps is a number of frames a second from 0.001 to 1000, not {fps!r}")
        stride = 2 if stride is None and fps is None else stride
        for name, v, most in (("frames", frames, MAX_FRAMES), ("stride", 1 if stride is None else stride, MAX_STRIDE),
                              ("clips_per_video", clips_per_video, MAX_CLIPS_PER_VIDEO)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 1 <= v <= most:
                raise DataprepError(f"VideoDataset: {name} is a whole number from 1 to {most:,}, not {v!r}")
        if layout not in LAYOUTS:
            raise DataprepError(f"VideoDataset: layout is one of {', '.join(map(repr, LAYOUTS))}, not {layout!r}")
        self.frames, self.clips_per_video = int(frames), int(clips_per_video)
        self.stride: int | None = None if stride is None else int(stride)
        self.fps: float | None = None if fps is None else float(fps)
        self.seed, self.layout, self._epoch = int(seed), layout, 0
        super().__init__(pack, split, decode, verify=verify, cache=cache, progress=progress, resolution=resolution,
                         keep_resolutions=keep_resolutions)

    def _fields(self, manifest: dict[str, Any], resolution: int | None) -> dict[str, Any]:
        fields = served_fields(manifest, resolution, self.pack / "manifest.json")
        return {k: _ServedFrames(f.image) if isinstance(f, FramesField) else f for k, f in fields.items()}

    def _switch(self, resolution: int | None) -> None:
        super()._switch(resolution)
        a = self._cached.arrays
        self.video_starts: np.ndarray = a[STARTS]
        self.timestamps: np.ndarray = a[TIMESTAMPS]
        self._videos = self._sources  # by video; the image kind's error messages name frame rows: see _FrameNames
        self._sources = _FrameNames(self._videos, self.video_starts)
        counts = np.diff(self.video_starts)
        if len(counts) and counts.min() < 1:
            raise PackError(f"{self.pack}/{self.split}: video {int(np.argmin(counts))} has no frames (verify the pack)")
        odd = size_changes(self._shapes, self.video_starts)
        if len(odd):  # one crop box a clip needs one frame size a video (the build makes them so)
            k = int(odd[0])
            raise PackError(f"{self.pack}/{self.split}: frame row {k} of {self._sources[k]} is {self._shapes[k].tolist()}, "
                            f"the frame before it {self._shapes[k - 1].tolist()}; a video's frames share one size (rebuild the pack)")
        self._clock = self._clock_of(counts) if self.fps is not None else np.empty(0)  # only fps reads it

    def _clock_of(self, counts: np.ndarray) -> np.ndarray:
        """Every frame's time on one clock for the whole split: video v's timestamps moved past the videos before it
        (by their last frame's time and a second more), so one searchsorted finds the frame at or before any
        instant of any video."""
        ts = np.asarray(self.timestamps, np.float64)
        last = ts[self.video_starts[1:] - 1] if len(counts) else ts[:0]
        base = np.concatenate([[0.0], np.cumsum(last + 1.0)])[:len(counts)]
        return ts + np.repeat(base, counts)

    def __getstate__(self) -> dict[str, Any]:
        keys = ("frames", "stride", "fps", "clips_per_video", "seed", "layout", "_epoch")
        return {**super().__getstate__(), **{k: self.__dict__[k] for k in keys}}

    # -- facts ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        """Clips an epoch: videos x clips_per_video."""
        return self.videos * self.clips_per_video

    @property
    def videos(self) -> int:
        """Videos in the split."""
        return len(self.video_starts) - 1

    @property
    def sources(self):
        """Every video's source path relative to the build's source root (a `Strings`)."""
        return self._videos

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose clips `dataset[j]` gives (the Loader's requests carry their own).

        Args:
            epoch: The epoch.
        """
        self._epoch = int(epoch)

    def frame_rows(self, clips, epoch: int | None = None, seed: int = 0) -> np.ndarray:
        """Which frame rows of the split each clip serves.

        Args:
            clips: clip indices (0 <= j < len).
            epoch: the epoch [default: the one `set_epoch` named].
            seed: the Loader's seed.

        Returns:
            (len(clips), frames) int64 rows: a first frame drawn from (seed, dataset seed, epoch, clip) among those
            where the clip fits in its video, then every `stride`-th, or with `fps` the frame at or before each
            1/fps seconds later; the video's last repeated past its end.
        """
        j = np.asarray(clips, np.int64).reshape(-1)
        v = j // self.clips_per_video
        start, count = self.video_starts[v], self.video_starts[v + 1] - self.video_starts[v]
        key = (draws.CLIP, int(seed), self.seed, self._epoch if epoch is None else int(epoch))
        if self.fps is not None:
            return self._timed_rows(j, key, start, start + count - 1, self.fps)
        stride = self.stride
        assert stride is not None  # __init__ sets fps or stride
        room = np.maximum(count - (self.frames - 1) * stride, 1)  # first frames where the whole clip fits
        first = draws.integers(key, j, room)
        at = first[:, None] + stride * np.arange(self.frames, dtype=np.int64)[None, :]
        return start[:, None] + np.minimum(at, count[:, None] - 1)

    def _timed_rows(self, j: np.ndarray, key: tuple[int, ...], start: np.ndarray, last: np.ndarray, fps: float) -> np.ndarray:
        """frame_rows with `fps`: the first frame drawn among those at least the clip's span before the video's last
        frame, then the frame at or before each instant (1/fps apart) on the split's one clock (`_clock_of`)."""
        clock, offsets = self._clock, np.arange(self.frames, dtype=np.float64) / fps
        fits = np.searchsorted(clock, clock[last] - offsets[-1] + EPS, "right")  # past the last first frame that fits
        first = start + draws.integers(key, j, np.maximum(fits - start, 1))
        rows = np.searchsorted(clock, (clock[first][:, None] + offsets[None, :]) + EPS, "right") - 1
        return np.clip(rows, first[:, None], last[:, None])  # past the video's end: its last frame

    # -- serving -------------------------------------------------------------------------------
    def stored(self, k: int) -> np.ndarray:
        """Frame row k as the pack stores it (JPEG bytes): a read-only view.

        Args:
            k: The frame row in the split.

        Returns:
            The bytes.
        """
        return self.field.sample(self._arrays, self._frame(k))

    def jpeg(self, k: int) -> np.ndarray:
        """Frame row k's JPEG bytes, once its frame header agrees with the shape the pack records.

        Args:
            k: The frame row in the split.

        Returns:
            A read-only view of the cache.
        """
        return self._jpeg(self._frame(k))

    def _frame(self, k) -> int:
        n = len(self._shapes)
        if not 0 <= int(k) < n:
            raise IndexError(f"frame row {k} out of range for {n} frames in {self.pack}/{self.split}")
        return int(k)

    def _clip_of(self, j) -> int:
        n = len(self)
        j = int(j)
        if not -n <= j < n:
            raise IndexError(f"clip {j} out of range for {n} clips in {self.pack}/{self.split}")
        return j % n

    def __getitem__(self, index):
        if isinstance(index, (Sequence, np.ndarray, torch.Tensor, slice)) and not isinstance(index, (str, bytes)):
            raise DataprepError("VideoDataset gives one clip a call (dataset[j]); serve batches with dataprep.Loader")
        j = self._clip_of(index)
        rows = self.frame_rows([j])[0]
        h, w, c = (int(s) for s in self._shapes[rows[0]])
        clip = np.empty((self.frames, h, w, c), self.field.np_dtype.newbyteorder("="))
        for t, k in enumerate(rows.tolist()):
            clip[t] = self._pixels_of(k)
        out = torch.from_numpy(clip).permute(*((3, 0, 1, 2) if self.layout == "cthw" else (0, 3, 1, 2)))
        return (out, int(self._labels[j // self.clips_per_video])) if self.labelled else out

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        return [self[j] for j in indices]

    def batch_layout(self, request: Request | None = None) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """What one clip occupies in a batch buffer: {"images": ((T, H, W, C), uint8), "labels": ((), int64)}.

        Args:
            request: What the pass asks for: crop, flip, resolution; None is a plain request. A crop plan gives its
                output size, (H, W) the central window of every frame (padded where smaller); without a crop every
                frame of the split must have one size.

        Returns:
            The layout, by key (no labels for an unlabelled pack).
        """
        request = request or Request()
        res = request.resolution if request.resolution is not None else self.resolution
        if request.crop is None and res == self.resolution and len({tuple(s) for s in self._shapes.tolist()}) > 1:
            sizes = {tuple(s) for s in self._shapes[self.video_starts[:-1], :2].tolist()}
            raise DataprepError(f"{self.pack}/{self.split}: its videos' frames have {len(sizes)} sizes; a batch of clips "
                                "needs one: pass crop=(H, W), dataprep.CenterCrop(size) or dataprep.RandomResizedCrop(size)")
        out = super().batch_layout(request)
        shape, dtype = out["images"]
        return {**out, "images": ((self.frames, *shape), dtype)}

    def fill_batch(self, idx: np.ndarray, out: dict[str, np.ndarray], request: Request | None = None) -> None:
        """Write clips `idx` into the first rows of `out`, in place: each clip's frames cut by one crop box and
        flipped by one flip, both drawn from (seed, epoch, clip) on its video's frame size.

        Args:
            idx: The clip indices.
            out: The batch's arrays by key, as `batch_layout` gives them.
            request: What the pass asks for: epoch, seed, resolution, crop, flip.
        """
        req = request or Request()
        self.settle(req)
        idx = np.asarray(idx, np.int64)
        n = len(idx)
        clips = out["images"]
        rows = self.frame_rows(idx, req.epoch, req.seed)
        if "labels" in out:
            out["labels"][:n] = self._labels[idx // self.clips_per_video]
        plan = geometry.plan_of(req.crop)
        hw = self._shapes[rows[:, 0], :2]  # the clip's frame size (a video's frames share it)
        heights, widths = (hw[:, 0], hw[:, 1]) if plan is not None else (None, None)
        drawn = geometry.draw(req.crop, req.flip, (req.seed, req.epoch), idx, clips.shape[2:4], heights, widths)
        for k, (frames, size) in enumerate(zip(rows.tolist(), hw.tolist())):
            box = drawn.boxes[k].tolist() if drawn.boxes is not None else None
            for t, row in enumerate(frames):  # the one box on every frame
                if box is not None:
                    self._cut(req.crop, row, box, clips[k, t], size)
                else:
                    center_crop_into(self._pixels_of(row), clips[k, t])
            if box is None:
                self._count_whole(len(frames))
        _, _, h, w, c = clips.shape
        geometry.flip_into(drawn, clips[:n].reshape(n, self.frames * h, w, c), range(n))  # a clip's frames stacked: one flip

    def finish_batch(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """layout="cthw": the clips' channel axis moved before the frames, where the Loader served them channels-first.

        Args:
            batch: The batch's tensors by key, clips (B, T, 3, H, W) under the Loader's layout="nchw".

        Returns:
            The batch, its clips (B, 3, T, H, W) for layout="cthw" (a view, nothing copied), else as given.
        """
        clips = batch["images"]
        c = self.field.channels
        if self.layout == "cthw" and clips.dim() == 5 and clips.shape[2] == c and clips.stride(2) == 1:
            batch = {**batch, "images": clips.transpose(1, 2)}
        return batch


class _ServedFrames(FramesField):
    """The frames field as the image kind's serving paths read it (`fixed`, `encoding`, `channels`, `sample`, ...: its
    image field's), loading frames and frame index together as FramesField does."""

    def __getattr__(self, name: str):
        if name == "image":  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.image, name)


class _FrameNames:
    """Each frame row's name for messages ("SOURCE frame K"), from the videos' sources and where their frames start."""

    def __init__(self, videos, starts: np.ndarray):
        self._videos, self._starts = videos, starts

    def __getitem__(self, k: int) -> str:
        v = int(np.searchsorted(self._starts, int(k), "right")) - 1
        return f"{self._videos[v]} frame {int(k) - int(self._starts[v])}"
