"""Video fields: takes manifest descriptions, gives the frames field (every video's frames as an image field over
frames, with the frame index: each frame's timestamp and where each video's frames begin), and the fields of a
video pack (`fields_of`), those a dataset serves at one resolution (`served_fields`) and `info`'s lines (`summary`).

A split of a video pack stores, per shard (V videos, F frames):

- `images` |u1 (JPEG bytes of every frame, one after another), `offsets` <i8 (F + 1), `shapes` <i4 (F, 3): the
  arrays an image pack's split has, one row per frame, so the image kind's loading and region decoding serve a
  clip's frames (`_rR` after each name for every resolution of `--sizes`: field "frame@R");
- `timestamps` <f8 (F): each frame's time in seconds from its video's first frame, non-decreasing in a video;
  `video_starts` <i8 (V + 1): video v's frames are rows video_starts[v] to video_starts[v + 1] (each video has
  one at least). The manifest's "video" entry lists them as a blob and its offsets, so every backend rebases
  video_starts as it rebases offsets;
- `labels` <i8 (V) where the source has classes, `sources` / `source_offsets` (each video's path).

The shard's count is its videos; the frame rows come from its offsets file's record. `FramesField` loads the
frames and the frame index together and counts videos, so verify and the caches hold it to the shard counts.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import PackError
from ..images.field import ImageField, common_fields, resolution_key
from ..limits import VIDEO_MAX_SECONDS
from ..pack.arrays import OFFSETS, LoadContext, load_blob
from ..pack.fields import Field

TIMES = np.dtype("<f8")
TIMESTAMPS, STARTS = "timestamps", "video_starts"
VIDEO_FORMAT = 1  # the frame index's layout; a change bumps it and keeps a reader for every earlier one


def index_manifest(fps: float | None) -> dict[str, Any]:
    """The manifest's "video" entry: the frame index's arrays (a blob of timestamps, then its offsets) and the
    frame rate frames were resampled to (None: as decoded)."""
    return {"version": VIDEO_FORMAT, "layout": "blob", "dtype": TIMES.str, "arrays": [TIMESTAMPS, STARTS], "fps": fps,
            "meaning": "timestamps: each frame's seconds from its video's first frame; video_starts: each video's first frame row"}


@dataclass(frozen=True)
class FramesField:
    """Every video's frames (`image`: an image field over frames, one row each) and the frame index
    (timestamps, video_starts), loaded together; one sample per video."""

    image: ImageField

    def _frame_shards(self, split_dir: Path, shards: list[dict]) -> list[dict]:
        """The shard records with each count replaced by the shard's frames (its offsets file holds F + 1)."""
        out = []
        offs = f"{self.image.name('offsets')}.npy"
        for s in shards:
            files = s.get("files") if isinstance(s, dict) else None
            try:
                n = int(files[offs]["shape"][0]) - 1
                ts = int(files[f"{TIMESTAMPS}.npy"]["shape"][0])
            except (KeyError, TypeError, ValueError, IndexError):
                raise PackError(f"{split_dir / str(s.get('name') if isinstance(s, dict) else s)}: manifest lists no usable "
                                f"{offs} or {TIMESTAMPS}.npy") from None
            if n < 0 or ts != n:
                raise PackError(f"{split_dir / str(s.get('name'))}: {ts} timestamps for {n} frames")
            out.append({**s, "count": n})
        return out

    def to_manifest(self) -> dict[str, Any]:
        return {**self.image.to_manifest(), "rows": "frames"}

    def stored(self) -> dict[str, str]:
        return {**self.image.stored(), TIMESTAMPS: TIMESTAMPS, STARTS: STARTS}

    def layout(self, split_dir: Path, shards: list[dict]) -> list[tuple[str, tuple[int, ...], np.dtype]]:
        frames = self._frame_shards(split_dir, shards)
        videos = sum(int(s["count"]) for s in shards)
        nframes = sum(int(s["count"]) for s in frames)
        return [*self.image.layout(split_dir, frames), (TIMESTAMPS, (nframes,), TIMES), (STARTS, (videos + 1,), OFFSETS)]

    def load(self, split_dir: Path, shards: list[dict], ctx: LoadContext | None = None) -> dict[str, Any]:
        """The image field's arrays over frames (images, offsets, shapes), `timestamps` and `video_starts`."""
        ctx = ctx or LoadContext()
        arrays = self.image.load(split_dir, self._frame_shards(split_dir, shards), ctx)
        times, starts = load_blob(split_dir, shards, TIMESTAMPS, STARTS, ctx, dtype=TIMES)
        return {**arrays, TIMESTAMPS: times, STARTS: starts}

    def count(self, arrays: dict[str, Any]) -> int:
        return len(arrays[STARTS]) - 1

    def check(self, arrays: dict[str, Any], deep: bool = False) -> list[str]:
        """The frame index: every video has a frame, the index covers every frame, timestamps are finite, at
        least 0 and non-decreasing within each video."""
        starts, times = np.asarray(arrays[STARTS]), np.asarray(arrays[TIMESTAMPS])
        frames = len(arrays[self.image.keys[2]])
        if len(starts) > 1 and np.any(np.diff(starts) < 1):
            v = int(np.flatnonzero(np.diff(starts) < 1)[0])
            return [f"{STARTS}.npy: video {v} has no frames (its frames would start at {int(starts[v])} and end at {int(starts[v + 1])})"]
        if starts[0] != 0 or starts[-1] != frames or len(times) != frames:
            return [f"{STARTS}.npy: indexes frames {int(starts[0])} to {int(starts[-1])} and {TIMESTAMPS}.npy holds {len(times)}, "
                    f"but the split stores {frames} frames"]
        if not np.all(np.isfinite(times)) or (len(times) and (times.min() < 0 or times.max() > VIDEO_MAX_SECONDS)):
            return [f"{TIMESTAMPS}.npy: a timestamp is negative, past {VIDEO_MAX_SECONDS:,} s, infinite or not a number"]
        falls = np.flatnonzero(np.diff(times) < 0) + 1  # rows whose time is below the one before
        first = np.zeros(frames, bool)
        first[starts[:-1]] = True
        bad = falls[~first[falls]]
        if len(bad):
            k = int(bad[0])
            v = int(np.searchsorted(starts, k, "right")) - 1
            return [f"{TIMESTAMPS}.npy: video {v}'s frame {k - int(starts[v])} is at {times[k]:g} s, before the frame ahead of it "
                    f"({times[k - 1]:g} s)"]
        shapes = np.asarray(arrays[self.image.keys[2]])
        odd = size_changes(shapes, starts)
        if len(odd):
            k = int(odd[0])
            v = int(np.searchsorted(starts, k, "right")) - 1
            return [f"{self.image.name(self.image.keys[2])}.npy: video {v}'s frame {k - int(starts[v])} is {shapes[k].tolist()}, "
                    f"the frame before it {shapes[k - 1].tolist()}; a video's frames share one size"]
        return []

    def decode_check(self, arrays: dict[str, Any]) -> list[tuple[int, str]] | None:
        """The image field's decode check over every frame (verify --decode), each finding given to its video."""
        found = self.image.decode_check(arrays)
        if found is None:
            return None
        starts = np.asarray(arrays[STARTS])
        out = []
        for k, what in found:
            v = int(np.searchsorted(starts, k, "right")) - 1
            out.append((v, f"frame {k - int(starts[v])}: {what}"))
        return out

    def describe(self) -> str:
        return f"video frames: {self.image.describe()}, a row per frame; {TIMESTAMPS} and {STARTS} index them by video"

    @staticmethod
    def index_arrays(timestamps: Sequence[float], lengths: Sequence[int]) -> dict[str, np.ndarray]:
        """A shard's frame index: the frames' timestamps, and video_starts from each video's frame count (the
        frames themselves are the image field's arrays, one row each)."""
        if sum(lengths) != len(timestamps):
            raise ValueError(f"{len(timestamps)} timestamps for videos of {sum(lengths)} frames")
        starts = np.zeros(len(lengths) + 1, OFFSETS)
        np.cumsum(lengths, out=starts[1:])
        return {TIMESTAMPS: np.asarray(timestamps, np.float64).astype(TIMES), STARTS: starts}


def size_changes(shapes: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The frame rows whose (h, w, c) differs from the frame before them in the same video (none in a pack the
    build made: one crop box a clip needs one size a video), compared row to row, no copy of the shapes."""
    if len(shapes) < 2:
        return np.zeros(0, np.int64)
    changed = np.flatnonzero((shapes[1:] != shapes[:-1]).any(1)) + 1
    return changed[~np.isin(changed, starts[:-1])]


def frames_key(m: dict[str, Any], resolution: int | None, where: Path | str) -> str:
    """The manifest's frames field at `resolution`: "frame", or "frame@R" in a multi-resolution pack."""
    return resolution_key(m, resolution, where, base="frame")


def fields_of(m: dict[str, Any], where: Path | str = "manifest") -> dict[str, Field]:
    """Every field of a video pack: one frames field per resolution (with the frame index), labels, source paths."""
    if "video" not in m["fields"]:
        raise PackError(f"{where}: no video field (the frame index)")
    spec = m["fields"]["video"]
    if not isinstance(spec, dict) or spec.get("version") != VIDEO_FORMAT or spec.get("arrays") != [TIMESTAMPS, STARTS]:
        raise PackError(f"{where}: the video field is not frame index version {VIDEO_FORMAT} ({TIMESTAMPS}, {STARTS}); "
                        "a newer dataprep wrote it, or it is damaged")
    frames = {k: FramesField(ImageField.from_manifest(s, where)) for k, s in m["fields"].items() if k.split("@")[0] == "frame"}
    if not frames:
        raise PackError(f"{where}: no frame field")
    for f in frames.values():
        if f.image.encoding != "jpeg" or f.image.role != "image":
            raise PackError(f"{where}: video frames are stored as JPEG images, not {f.image.encoding} {f.image.role}s")
    return {**frames, **common_fields(m, where)}


def served_fields(m: dict[str, Any], resolution: int | None = None, where: Path | str = "manifest") -> dict[str, Field]:
    """The fields a dataset holds to serve one resolution: the frames field first, labels, source paths."""
    key = frames_key(m, resolution, where)
    every = fields_of(m, where)
    return {key: every[key], **{k: f for k, f in every.items() if k.split("@")[0] != "frame"}}


def summary(m: dict[str, Any]) -> list[str]:
    """What `dataprep info` says about a video pack: how its frames were made and chosen."""
    i, v = m["settings"]["image"], m["settings"].get("video", {})
    frames = sum(int(sp.get("frames", 0)) for sp in m["splits"].values())
    chosen = [f"resampled to {v['fps']:g} fps" if v.get("fps") else "every frame as decoded"]
    if v.get("max_frames"):
        chosen.append(f"at most {v['max_frames']} a video")
    if v.get("max_seconds"):
        chosen.append(f"the first {v['max_seconds']:g} s")
    out = [f"frames:    {frames:,}, stored as JPEG, quality {i['quality']}; size {', '.join(map(str, m.get('resolutions') or [i['size']]))} "
           f"({i['resize']}{', upscale' if i['upscale'] else ''}); {', '.join(chosen)}"]
    if not m.get("classes"):
        out.append("labels:    none (an unlabelled pack)")
    return out
