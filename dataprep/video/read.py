"""Video decoding: takes a source video file and the video settings, gives its frames one at a time as upright
RGB uint8 pixels with their timestamps (seconds from the video's first frame), or a `VideoDecodeError` naming the
file and the reason. The only module that imports PyAV (the `video` extra: `pip install 'dataprep[video]'`; its
wheels bundle FFmpeg).

Timestamps come from each frame's pts, so a variable frame rate is kept as it is. `fps` resamples by them: the
frame shown at k / fps (the last one at or before it) is given for every k, so frames repeat when upsampling and
are dropped when downsampling. Rotation metadata (the display matrix) is applied. A caller that knows the stored
size (`scaled`) has each frame shrunk by FFmpeg's swscale (area filter) in its conversion to RGB, as ffmpeg
scales, rather than converted at full size and resized after (docs/benchmarks.md, "Video: decoders and storage");
frames are turned upright after scaling. What a file may cost is bounded
before a frame is decoded where the container says it: its bytes (`max_bytes`), each frame's pixels
(`max_pixels`), its declared frame count (`limits.VIDEO_MAX_FRAMES`, unless `max_frames` or `max_seconds` bound
what is read); and while decoding, the frame count again (a container that declares none, or lies). Frames are
given as they are decoded: a video is never held whole.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from ..errors import DataprepError, VideoDecodeError
from ..limits import VIDEO_MAX_BYTES, VIDEO_MAX_FRAMES, VIDEO_MAX_SECONDS
from ..sources.listing import open_source

VIDEO_EXTENSIONS = frozenset({".mp4", ".mkv", ".webm", ".avi", ".mov"})
EPSILON = 1e-6  # seconds: a grid time this close to a frame's is its time (k / fps and pts * time_base round apart)
INSTALL = "PyAV is not installed: pip install 'dataprep[video]' (PyAV's wheels bundle FFmpeg)"


@dataclass(frozen=True)
class VideoSettings:
    """Which frames of each source video are stored; all of it is recorded in the manifest."""

    fps: float | None = None  # resample to this frame rate by the timestamps; None keeps every frame
    max_frames: int | None = None  # store at most this many frames a video (the first ones)
    max_seconds: float | None = None  # store only frames before this many seconds

    def __post_init__(self) -> None:
        if self.fps is not None and not (isinstance(self.fps, (int, float)) and 0 < self.fps <= 1000):
            raise DataprepError(f"fps must be a number above 0 and at most 1000, got {self.fps!r}")
        if self.max_frames is not None and (isinstance(self.max_frames, bool) or not isinstance(self.max_frames, int)
                                            or self.max_frames < 1):
            raise DataprepError(f"max_frames must be a positive integer, got {self.max_frames!r}")
        if self.max_seconds is not None and not (isinstance(self.max_seconds, (int, float)) and 0 < self.max_seconds < float("inf")):
            raise DataprepError(f"max_seconds must be a positive finite number, got {self.max_seconds!r}")
        for k in ("fps", "max_seconds"):  # 5 and 5.0 are one setting: one fingerprint, one manifest
            if getattr(self, k) is not None:
                object.__setattr__(self, k, float(getattr(self, k)))

    @property
    def bounded(self) -> bool:
        """Whether max_frames or max_seconds bounds what is read of a video, whatever its length."""
        return self.max_frames is not None or self.max_seconds is not None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _av():
    try:
        import av
    except ImportError:
        raise DataprepError(INSTALL) from None
    return av


def _stream_info(path: str, stream, max_pixels: int, settings: VideoSettings) -> None:
    """Refuse a stream from what the container declares, before anything is decoded."""
    cc = stream.codec_context
    if cc is None:  # a codec FFmpeg does not know (a damaged or foreign stream header)
        raise VideoDecodeError(path, "unreadable", "its video stream's codec is one FFmpeg cannot decode")
    w, h = int(cc.width or 0), int(cc.height or 0)
    if w * h > max_pixels:
        raise VideoDecodeError(path, "too large", f"{w}x{h} frames, over the {max_pixels:,}-pixel cap on one frame")
    declared = int(stream.frames or 0)
    if not declared and stream.duration and stream.time_base and stream.average_rate:
        declared = int(float(stream.duration * stream.time_base) * float(stream.average_rate))
    if declared > VIDEO_MAX_FRAMES and not settings.bounded:
        raise VideoDecodeError(path, "too many frames", f"declares {declared:,} frames, over the {VIDEO_MAX_FRAMES:,} one video "
                               "may give (pass --max-frames or --max-seconds to keep its start)")


Scaled = Callable[[int, int], tuple[int, int]]  # an upright frame's (height, width) -> the (height, width) to give


def _rgb(frame, scaled: Scaled | None) -> np.ndarray:
    """One decoded frame as upright RGB pixels, shrunk in the conversion where `scaled` asks for fewer pixels
    (enlarging is left to the caller's resize). The display matrix's quarter turns are applied after scaling:
    `rotation` is FFmpeg's counter-clockwise angle in degrees."""
    k = int(round(float(frame.rotation or 0) / 90.0)) % 4
    w, h = frame.width, frame.height
    uh, uw = (w, h) if k % 2 else (h, w)
    th, tw = scaled(uh, uw) if scaled is not None else (uh, uw)
    if th * tw < uh * uw:  # in the frame's own orientation: a quarter turn swaps the target's sides
        fw, fh = (th, tw) if k % 2 else (tw, th)
        # the area filter, with chroma interpolated to full width before the RGB conversion: area alone shifts
        # a flat colour about a level further from the source than a full-size conversion does
        from av.video.reformatter import Interpolation

        flags = Interpolation.AREA | Interpolation.FULL_CHR_H_INT
        pixels = frame.reformat(width=fw, height=fh, format="rgb24", interpolation=flags).to_ndarray()
    else:
        pixels = frame.to_ndarray(format="rgb24")
    return np.ascontiguousarray(np.rot90(pixels, k)) if k else pixels


def _decoded(path: str, container, stream, max_pixels: int, scaled: Scaled | None = None,
             until: float | None = None) -> Iterator[tuple[np.ndarray, float, float | None]]:
    """Every decoded frame: upright RGB pixels (scaled as `_rgb` says), its time in seconds from the first frame
    (refused past limits.VIDEO_MAX_SECONDS, unless at or after `until`, --max-seconds, where the reader stops),
    and its duration in seconds where the stream gives one."""
    av = _av()
    first = None
    last_t = 0.0
    rate = float(stream.average_rate) if stream.average_rate else None
    n = 0
    try:
        for frame in container.decode(stream):
            n += 1
            if n > VIDEO_MAX_FRAMES:
                raise VideoDecodeError(path, "too many frames", f"more than the {VIDEO_MAX_FRAMES:,} frames one video may give "
                                       "(pass --max-frames or --max-seconds to keep its start)")
            if frame.width * frame.height > max_pixels:
                raise VideoDecodeError(path, "too large", f"a {frame.width}x{frame.height} frame, over the {max_pixels:,}-pixel cap")
            if frame.pts is None or frame.time_base is None:  # no pts: one frame period after the last
                t = last_t + (1.0 / rate if rate and n > 1 else 0.0)
            else:
                at = float(frame.pts * frame.time_base)
                first = at if first is None else first
                t = at - first
            t = max(t, last_t)  # a stream whose pts run backwards keeps its times non-decreasing
            if t > VIDEO_MAX_SECONDS and (until is None or t < until):  # past --max-seconds the reader stops first
                raise VideoDecodeError(path, "too long", f"frame {n} is stamped {t:,.0f} s after the first, past the "
                                       f"{VIDEO_MAX_SECONDS:,} s one video may span (a forged timestamp?)")
            last_t = t
            dur = float(frame.duration * frame.time_base) if frame.duration and frame.time_base else (1.0 / rate if rate else None)
            yield _rgb(frame, scaled), t, dur
    except av.FFmpegError as e:
        raise VideoDecodeError(path, "truncated" if n else "unreadable", f"decoding frame {n}: {e}") from None


def read_frames(path: str, settings: VideoSettings = VideoSettings(), max_bytes: int | None = None,
                max_pixels: int = 178_956_970, scaled: Scaled | None = None, root: str | None = None) -> Iterator[tuple[np.ndarray, float]]:
    """The frames a build stores of one video, as they are decoded.

    Args:
        path: The video file.
        settings: fps, max_frames, max_seconds.
        max_bytes: The cap on the file's bytes (None: `limits.VIDEO_MAX_BYTES`).
        max_pixels: The cap on one frame's pixels (the decoded frame's, before any scaling).
        scaled: Given an upright frame's (height, width), the (height, width) to give it at: a smaller size is
            made by swscale's area filter as the frame is converted to RGB; a larger one is ignored (the frame
            is given at its own size). None: every frame at its own size.
        root: Where the file opened must be (a CSV list's root: checked on the descriptor, as images are); None:
            anywhere. A FIFO, device or directory is refused at once, wherever it is.

    Returns:
        An iterator of (pixels, seconds): upright HWC RGB uint8 pixels and their time from the first frame,
        non-decreasing. The same pixels object is given again for a frame `fps` repeats. A file that gives no
        frame raises `VideoDecodeError` (path, reason: empty file, too large, unreadable, no video stream,
        too many frames, truncated, no frames).
    """
    av = _av()
    fd, st = open_source(path, VIDEO_MAX_BYTES if max_bytes is None else max_bytes, root, VideoDecodeError)
    with os.fdopen(fd, "rb") as f:
        if st.st_size == 0:
            raise VideoDecodeError(path, "empty file", "0 bytes")
        try:
            container = av.open(f, "r")
        except (av.FFmpegError, ValueError, OSError) as e:
            raise VideoDecodeError(path, "unreadable", f"not a video FFmpeg reads: {e}") from None
        with container:
            if not container.streams.video:
                what = "audio only" if container.streams.audio else "no streams FFmpeg decodes"
                raise VideoDecodeError(path, "no video stream", what)
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            _stream_info(path, stream, max_pixels, settings)
            n = 0
            for pixels, t in _resampled(_decoded(path, container, stream, max_pixels, scaled, settings.max_seconds), settings.fps):
                if settings.max_seconds is not None and t >= settings.max_seconds:
                    break
                n += 1
                if n > VIDEO_MAX_FRAMES:  # --fps repeats frames: a forged jump in the timestamps would never end
                    raise VideoDecodeError(path, "too many frames", f"more than the {VIDEO_MAX_FRAMES:,} frames one video may give "
                                           f"(at {settings.fps or 0:g} fps its timestamps reach {t:,.0f} s; pass --max-frames or "
                                           "--max-seconds to keep its start)")
                yield pixels, t
                if settings.max_frames is not None and n >= settings.max_frames:
                    break
            if not n:
                raise VideoDecodeError(path, "no frames", "its video stream decodes to no frame")


def _resampled(frames: Iterator[tuple[np.ndarray, float, float | None]], fps: float | None) -> Iterator[tuple[np.ndarray, float]]:
    """`frames` as they come (fps None), or at the times k / fps: the frame shown then (the last one at or
    before it), stamped with it. The last frame lasts its duration (else the gap before it)."""
    if fps is None:
        for pixels, t, _ in frames:
            yield pixels, t
        return
    k = 0
    prev: tuple[np.ndarray, float, float | None] | None = None
    gap = None
    for cur in frames:
        if prev is not None:
            gap = cur[1] - prev[1]
            while k / fps < cur[1] - EPSILON:
                yield prev[0], k / fps
                k += 1
        prev = cur
    if prev is None:
        return
    end = prev[1] + (prev[2] or gap or 1.0 / fps)
    while k / fps < end - EPSILON or k == 0:
        yield prev[0], k / fps
        k += 1
