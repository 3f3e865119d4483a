"""Video build: takes a listed source of video files (class folders, a CSV list) with the image and video settings,
gives a pack of kind "video": every kept frame stored as a JPEG at the training size (shorter side to --size, as
images; restart markers, as the image build encodes them), the frame index (timestamps, video_starts), labels
and source paths; one task per shard on the engine, the manifest last.

Storage: every frame a JPEG at the training size, so that a clip's crop is served by the image path's region
decoding (a few restart segments of each frame, never a seek and a GOP's decode). The decoder shrinks each frame
to the largest stored size as it converts it to RGB (read.py); the image stages do the rest. Frames are encoded as they
are decoded and written to the shard as they are encoded (FrameSink): a build holds a few bytes a frame of index,
never a video's frames, whatever its length. A video that cannot be read (empty, not a
video, truncated, audio only, over a cap: read.py) is skipped with its reason and counted.
"""
from __future__ import annotations

import contextlib
import os
from array import array
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..driver import BuildSummary, build_shards, finish_shard, pack_header, reused_shard, task_fingerprint
from ..engine import Engine
from ..errors import DataprepError, ImageDecodeError, SourceError
from ..images import resize
from ..images.codec import encode_jpeg
from ..images.field import ImageField
from ..images.settings import ImageSettings
from ..pack.arrays import OFFSETS, SHAPES
from ..pack.fields import LabelField, StringsField
from ..pack.manifest import write_manifest
from ..pack.shard import ShardWriter
from ..settings import BuildSettings
from ..sources import SPLIT_NAMES, Source, scan_class_folders
from .field import FramesField, index_manifest
from .read import VIDEO_EXTENSIONS, VideoSettings, read_frames

LABELS = "<i8"  # a label per video, int64


@dataclass(frozen=True)
class VideoShardTask:
    """Everything one worker needs to make one shard: a pure function of these fields."""

    root: str
    split_dir: str
    index: int
    paths: tuple[str, ...]
    labels: np.ndarray
    labelled: bool
    image: ImageSettings
    video: VideoSettings
    strict: bool
    resume: bool = False
    max_bytes: int | None = None  # the cap on one video file's bytes (None: limits.VIDEO_MAX_BYTES)
    confine: bool = False  # the file opened must be under root (a CSV list's rows, as images' are)

    @property
    def confined(self) -> str | None:
        """The folder every file opened must be under, or None."""
        return self.root if self.confine else None

    def fingerprint(self) -> str:
        """A digest of everything the shard's bytes depend on (its inputs, their order, the settings)."""
        return task_fingerprint(["video", self.index, self.image.to_dict(), self.video.to_dict(), self.labelled, self.strict,
                                 self.max_bytes, self.confine], zip(self.paths, self.labels.tolist()))


def frame_fields(image: ImageSettings) -> dict[str, FramesField]:
    """The manifest's frames fields: "frame", or "frame@R" for every resolution of a multi-resolution build."""
    if not image.multires:
        return {"frame": FramesField(ImageField("jpeg", None, image.channels))}
    return {f"frame@{s}": FramesField(ImageField("jpeg", None, image.channels, f"_r{s}")) for s in image.all_sizes}


def encode_frame(pixels: np.ndarray, image: ImageSettings) -> list[tuple[np.ndarray, tuple[int, int, int]]]:
    """One frame at every size (largest first), each smaller size made from the next larger one's pixels
    (the image build's stages: resize.plan, scale, crop_pad, encode_jpeg): (JPEG bytes, stored shape) each."""
    h, w = pixels.shape[:2]
    out, scaled = [], pixels
    for size in image.all_sizes:
        geom = resize.plan(h, w, size, image.resize, image.upscale)
        scaled = resize.scale(scaled, geom)
        stored = resize.crop_pad(scaled, geom)
        out.append((encode_jpeg(stored, image.quality), (stored.shape[0], stored.shape[1], stored.shape[2])))
    return out


class FrameSink:
    """One resolution's frames of a shard as the build makes them: each frame's JPEG appended to the shard's blob
    as it is encoded, so only the offsets and shapes are held (a few bytes a frame, whatever a video's length);
    `mark` and `rewind` drop what a video that failed half-way appended; `arrays` gives the offsets and shapes."""

    def __init__(self, field: FramesField, shard: ShardWriter):
        data, self._offsets, self._shapes = (field.image.name(k) for k in field.image.keys)
        self.blob = shard.blob(data)
        self.ends = array("q", [0])  # where each frame ends in the blob, after a 0
        self.shapes = array("i")  # (h, w, c) a frame, flat

    def add(self, jpeg: np.ndarray, shape: tuple[int, int, int]) -> None:
        self.blob.append(jpeg)
        self.ends.append(self.blob.n)
        self.shapes.extend(shape)

    def mark(self) -> int:
        """Frames so far."""
        return len(self.ends) - 1

    def rewind(self, frames: int) -> None:
        """Keep the first `frames` frames only."""
        del self.ends[frames + 1:]
        del self.shapes[3 * frames:]
        self.blob.rewind(self.ends[frames])

    def arrays(self) -> dict[str, np.ndarray]:
        return {self._offsets: np.asarray(self.ends, OFFSETS), self._shapes: np.asarray(self.shapes, SHAPES).reshape(-1, 3)}


def encode_video(path: str, task: VideoShardTask, sinks: list[FrameSink], times: array) -> int:
    """Every kept frame of one video, encoded as it is decoded and appended to `sinks` (one per size, largest
    first), its timestamp to `times`; a frame the frame rate repeats is encoded once. A frame whose size differs
    from the video's first (a stream that changes resolution mid-way) is resized to the first's, as ffmpeg scales
    every frame to one output size: a video's frames share one size. Returns the frames kept."""
    last: Any = None
    done: list = []
    image = task.image
    n = 0

    def largest(h: int, w: int) -> tuple[int, int]:  # the decoder shrinks to the largest stored size as it converts
        return resize.plan(h, w, image.all_sizes[0], image.resize, image.upscale).scaled

    first: tuple[int, int] | None = None
    for pixels, t in read_frames(path, task.video, task.max_bytes, image.max_pixels, scaled=largest, root=task.confined):
        if pixels is not last:
            last = pixels
            first = first or pixels.shape[:2]
            if pixels.shape[:2] != first:  # the stream changed size: one box a clip needs one frame size a video
                pixels = resize.to_size(pixels, first)
            try:
                done = encode_frame(pixels, task.image)
            except (ValueError, MemoryError) as e:
                raise ImageDecodeError(path, "cannot encode", f"frame {n}: {type(e).__name__}: {e}") from None
        for sink, (jpeg, shape) in zip(sinks, done):
            sink.add(jpeg, shape)
        times.append(t)
        n += 1
    return n


def build_video_shard(task: VideoShardTask) -> dict[str, Any]:
    """Decode, resize and encode one shard's videos and write the shard, its frames streamed to disk as they are
    encoded; return its record (`reused` when a resumed build found it finished and intact)."""
    fp = task.fingerprint()
    rec = reused_shard(task, fp)
    if rec is not None:
        return rec
    with ShardWriter(Path(task.split_dir), task.index) as shard:
        sinks = [FrameSink(f, shard) for f in frame_fields(task.image).values()]
        times = array("d")
        lengths, labels, sources, skipped = [], [], [], []
        source_bytes = 0
        counts: Counter = Counter()
        for rel, label in zip(task.paths, task.labels.tolist()):
            path = os.path.join(task.root, rel)
            mark = sinks[0].mark()
            try:
                n = encode_video(path, task, sinks, times)
            except ImageDecodeError as e:
                if task.strict:
                    raise ImageDecodeError(path, e.reason, e.detail) from None
                for sink in sinks:  # what the video appended before it failed leaves the shard
                    sink.rewind(mark)
                del times[mark:]
                skipped.append({"source": rel, "reason": e.reason, "detail": e.detail})
                continue
            lengths.append(n)
            labels.append(label)
            sources.append(rel)
            counts["frames"] += n
            with contextlib.suppress(OSError):  # a figure for the summary: a file removed since it was read counts 0
                source_bytes += os.path.getsize(path)
        arrays: dict[str, np.ndarray] = FramesField.index_arrays(times, lengths)
        for sink in sinks:
            arrays.update(sink.arrays())
        if task.labelled:
            arrays.update(LabelField(dtype=LABELS).shard_arrays(labels))
        arrays.update(StringsField().shard_arrays(sources))
        return finish_shard(task, fp, arrays, len(sources), skipped, 0, source_bytes, counts, shard)


def scan_videos(src: str | os.PathLike, split: str = "train", root: str | os.PathLike | None = None, strict: bool = False) -> Source:
    """The videos of `src`: split folders of class folders (`SRC/train/<class>/*.mp4`, labels from train's
    sorted folders), class folders (one split, `split`), or a CSV of path,label rows (paths relative to `root`,
    the CSV's folder by default).

    Args:
        src: A folder, or a .csv file.
        split: The split's name for class folders without split folders, or for a CSV.
        root: A CSV's root.
        strict: A CSV row the listing would skip refuses the list instead.

    Returns:
        The listing; a `SourceError` naming `src` where it holds no video.
    """
    from ..sources.pathlist import scan_list

    path = Path(src)
    if path.is_file():
        return scan_list(path, root, split, strict=strict)
    if not path.is_dir():
        raise SourceError(f"{path}: no such folder or CSV file")
    splits = sorted((d.name for d in path.iterdir() if d.is_dir() and d.name.lower() in SPLIT_NAMES),
                    key=lambda n: (n != "train", n))
    if not splits:
        classes, one = scan_class_folders(path, split, path, extensions=VIDEO_EXTENSIONS)
        return Source("folder", path, classes, None, [one])
    classes, first = scan_class_folders(path / splits[0], splits[0], path, extensions=VIDEO_EXTENSIONS)
    listed = [first] + [scan_class_folders(path / s, s, path, classes, extensions=VIDEO_EXTENSIONS)[1] for s in splits[1:]]
    return Source("splits", path, classes, None, listed)


def build_video(source: Source, out: str | os.PathLike, settings: BuildSettings, image: ImageSettings, video: VideoSettings,
                progress: Callable[[int], None] | None = None, engine: Engine | None = None) -> BuildSummary:
    """Build a video pack from `source` into `out`.

    Args:
        source: The listing of the videos, by split (class folders or a CSV list).
        out: The pack's folder.
        settings: The shard layout and how strict the build is (workers, limit, shard_size, max_bytes, ...).
        image: How each frame is stored: size(s), resize mode, JPEG quality (mode "encoded" only).
        video: Which frames are stored: fps, max_frames, max_seconds.
        progress: Told `progress(n)` of n more videos done; None for no progress.
        engine: Runs the shards; None is a local pool of settings.workers processes.

    Returns:
        The build's summary: splits, counts (frames among them), skipped files and their reasons.
    """
    if image.mode != "encoded" or image.depth != 8:
        raise DataprepError(f"video frames are stored as 8-bit JPEGs, not mode {image.mode!r} at depth {image.depth}")
    out = Path(out)
    labelled = bool(source.classes)

    def make_task(split, k: int, start: int, stop: int) -> VideoShardTask:
        return VideoShardTask(str(source.root), str(out / split.name), k, tuple(split.paths[start:stop]), split.labels[start:stop],
                              labelled, image, video, settings.strict, settings.resume, settings.max_bytes,
                              bool(getattr(split.reader, "confine", False)))

    splits = [s.limited(settings.limit) for s in source.splits]
    summaries, split_entries, seconds = build_shards(out, settings, splits, make_task, build_video_shard, progress, engine)
    for summ in summaries:
        split_entries[summ.name]["frames"] = summ.counts["frames"]
        summ.notes.append(f"{summ.counts['frames']:,} frames stored")
    fields = {
        **{k: f.to_manifest() for k, f in frame_fields(image).items()},
        "video": index_manifest(video.fps),
        **({"label": LabelField(dtype=LABELS, num_classes=len(source.classes)).to_manifest()} if labelled else {}),
        "source": StringsField().to_manifest(),
    }
    write_manifest(out, {
        **pack_header("video", settings, {"layout": source.layout, "root": str(source.root.resolve()), **source.details}, seconds,
                      {"image": image.to_dict(), "video": video.to_dict()}),
        "classes": source.classes,
        "class_names": source.class_names,
        **({"resolutions": sorted(image.all_sizes)} if image.multires else {}),
        "fields": fields,
        "splits": split_entries,
    })
    return BuildSummary(out, summaries, seconds, "videos")
