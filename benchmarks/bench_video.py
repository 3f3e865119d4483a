"""Video clips served (issue 55): clips/s of the peer baseline, a per-sample torch `DataLoader` whose
dataset opens the source file, seeks and decodes a 16-frame clip (stride 2) with PyAV, random-resized-crops
it to 112 px and flips it (one box and one flip per clip), on 480p-1080p H.264 sources and on small ones;
beside it `dataprep.Loader` over a pack built from the same files (`dataprep_loader`), and a stand-in
for the chosen storage in a plain DataLoader (--stand-in).

The peer is the usual user code, made as cheap as it fairly can be: one `av.open` a sample (a worker cannot
keep hundreds of files open), `container.seek` to the clip's start (FFmpeg goes back to the keyframe
before it and decodes forward), frames converted to RGB by `to_ndarray`, the crop box cut from the full
frame and resized with cv2 INTER_LINEAR (the fastest; an antialiased resize would cost more), a flip.
Decoder threads: FFmpeg's default (slice threads: none for x264's one-slice frames), since the loader's
workers already fill the cores. Workers persist; each round serves whole passes over the videos until
it has run `--seconds`, after one untimed batch (workers forked).

Sources come from benchmarks/make_videos.py:

    .venv/bin/python benchmarks/make_videos.py --out /tmp/video-bench
    .venv/bin/python benchmarks/bench_video.py --src /tmp/video-bench [--sets small,480p,720p,1080p] [--rounds 3] [--seconds 8]
    .venv/bin/python benchmarks/bench_video.py --src /tmp/video-bench --stand-in         # beside JPEG frames in RAM
    .venv/bin/python -m dataprep build video /tmp/video-bench/480p --size 128 --out /tmp/video-packs/480p   # each set
    .venv/bin/python benchmarks/bench_video.py --src /tmp/video-bench --dataprep /tmp/video-packs   # beside dataprep

--stand-in adds, in the same rounds, what the chosen storage gives in a plain DataLoader before dataprep
has it: every frame of every source scaled to 128 px (swscale area) and stored as a JPEG q90 with
dataprep's encoder, in one uint8 array with offsets (made before the workers fork; no Python object a
frame, so no copy-on-read), served by the same kind of dataset: 16 frames decoded whole with
cv2.imdecode, the same crop, resize and flip. It is not dataprep's figure (no region decoding, the stock
collate), only a check that the storage leaves the issue's ratios within reach.

Figures: clips served over each round's wall time, the median and range over the rounds, with the load
average at the start and the end.
"""
from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cv2  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

FRAMES, STRIDE, CROP = 16, 2, 112
SIZE = 128  # the training size (shorter side) the issue builds at


def scaled(w: int, h: int, short: int = SIZE) -> tuple[int, int]:
    """(width, height) with the shorter side `short`, both even (yuv420p needs it)."""
    if w >= h:
        return 2 * round(w * short / h / 2), short
    return short, 2 * round(h * short / w / 2)


def video_files(folder: Path) -> list[tuple[Path, int]]:
    """(path, label) of every video under folder/train/<class>/, labels by sorted class name."""
    classes = sorted(p.name for p in (folder / "train").iterdir() if p.is_dir())
    return [(p, i) for i, c in enumerate(classes) for p in sorted((folder / "train" / c).iterdir())
            if p.suffix in (".mp4", ".mkv", ".webm", ".mov", ".avi") and ".part" not in p.suffixes]


def read_clip_pyav(path: Path | str, start: int, frames: int = FRAMES, stride: int = STRIDE,
                   thread_type: str | None = None) -> np.ndarray:
    """Frames start, start+stride, ... (`frames` of them) of the file's first video stream, as uint8
    (T, H, W, 3) RGB, by seeking to the keyframe before `start` and decoding forward; a video that ends
    early repeats its last frame.

    Args:
        path: the video file.
        start: the first frame's number (0-based, at the stream's average frame rate).
        frames: frames in the clip.
        stride: frame step within the clip.
        thread_type: None for FFmpeg's default, or "AUTO" / "FRAME" / "SLICE".
    Returns:
        The clip.
    """
    import av

    with av.open(str(path)) as container:
        st = container.streams.video[0]
        if thread_type is not None:
            st.thread_type = thread_type
        fps, tb, t0 = st.average_rate, st.time_base, st.start_time or 0
        # the start's timestamp, half a frame early so that rounding cannot skip it
        container.seek(t0 + int((start - 0.5) / fps / tb), stream=st)
        out: list[np.ndarray] = []
        for f in container.decode(st):
            i = round(float((f.pts - t0) * tb * fps))
            if i < start or (i - start) % stride:
                continue
            out.append(f.to_ndarray(format="rgb24"))
            if len(out) == frames:
                break
    if not out:
        raise ValueError(f"{path}: no frame at or after {start}")
    out += [out[-1]] * (frames - len(out))
    return np.stack(out)


def frame_count(path: Path) -> int:
    """The video stream's frame count from the container (or duration x rate when it has none)."""
    import av

    with av.open(str(path)) as c:
        st = c.streams.video[0]
        if st.frames:
            return int(st.frames)
        return int(float(st.duration * st.time_base * st.average_rate))


def random_resized_box(h: int, w: int, rng: random.Random, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision's RandomResizedCrop box (y, x, height, width), with its central fallback."""
    area = h * w
    for _ in range(10):
        a = area * rng.uniform(*scale)
        r = math.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1])))
        cw, ch = round(math.sqrt(a * r)), round(math.sqrt(a / r))
        if 0 < cw <= w and 0 < ch <= h:
            return rng.randint(0, h - ch), rng.randint(0, w - cw), ch, cw
    s = min(h, w)
    return (h - s) // 2, (w - s) // 2, s, s


class RandomClips(Dataset):
    """Item i: a random clip of video i % videos (`repeat` clips a video a pass, so that a pass over a few
    videos is still several batches), one crop box and one flip for the clip; `clip` reads the frames."""

    def __init__(self, lengths: list[int], labels: list[int], seed: int, repeat: int):
        self.lengths, self.labels, self.seed, self.repeat, self.calls = lengths, labels, seed, repeat, 0

    def __len__(self) -> int:
        return len(self.lengths) * self.repeat

    def __getitem__(self, i: int):
        self.calls += 1
        rng = random.Random(f"{self.seed}/{os.getpid()}/{self.calls}/{i}")
        i %= len(self.lengths)
        span = (FRAMES - 1) * STRIDE + 1
        clip = self.clip(i, rng.randint(0, max(0, self.lengths[i] - span)))
        return crop_flip(clip, rng), self.labels[i]

    def clip(self, video: int, start: int) -> np.ndarray:
        raise NotImplementedError


class SourceClips(RandomClips):
    """The peer: each clip decoded from its source file (read_clip_pyav)."""

    def __init__(self, videos: list[tuple[Path, int]], seed: int = 0, repeat: int = 1):
        super().__init__([frame_count(p) for p, _ in videos], [label for _, label in videos], seed, repeat)
        self.paths = [p for p, _ in videos]

    def clip(self, video: int, start: int) -> np.ndarray:
        return read_clip_pyav(self.paths[video], start)


def worker_init(_: int) -> None:
    cv2.setNumThreads(1)  # each worker is one core; OpenCV's own pool would oversubscribe


def crop_flip(clip: np.ndarray, rng: random.Random) -> torch.Tensor:
    """One RandomResizedCrop box, resized to CROP x CROP (cv2 INTER_LINEAR), and one flip for the whole clip."""
    y, x, h, w = random_resized_box(clip.shape[1], clip.shape[2], rng)
    out = np.empty((len(clip), CROP, CROP, 3), np.uint8)
    for t in range(len(clip)):
        cv2.resize(clip[t, y:y + h, x:x + w], (CROP, CROP), dst=out[t], interpolation=cv2.INTER_LINEAR)
    if rng.random() < 0.5:
        out = out[:, :, ::-1]
    return torch.from_numpy(np.ascontiguousarray(out))


class JpegFrameClips(RandomClips):
    """The stand-in: every frame of the videos at 128 px (shorter side) as a JPEG q90 in one uint8 array
    (`blob`, frame k at offsets[k]:offsets[k + 1]), a clip's frames decoded whole with cv2.imdecode."""

    def __init__(self, videos: list[tuple[Path, int]], seed: int = 0, repeat: int = 1):
        import av

        from dataprep.images.codec import encode_jpeg

        parts: list[np.ndarray] = []
        first, lengths = [], []
        for path, _ in videos:
            first.append(len(parts))
            with av.open(str(path)) as c:
                st = c.streams.video[0]
                w, h = scaled(st.codec_context.width, st.codec_context.height)
                for f in c.decode(st):
                    parts.append(encode_jpeg(f.reformat(width=w, height=h, format="rgb24",
                                                        interpolation="AREA").to_ndarray(), 90))
            lengths.append(len(parts) - first[-1])
        super().__init__(lengths, [label for _, label in videos], seed, repeat)
        self.first = first
        self.offsets = np.cumsum([0] + [len(p) for p in parts])
        self.blob = np.concatenate(parts)

    def clip(self, video: int, start: int) -> np.ndarray:
        ks = [self.first[video] + min(start + STRIDE * t, self.lengths[video] - 1) for t in range(FRAMES)]
        return np.stack([cv2.imdecode(self.blob[self.offsets[k]:self.offsets[k + 1]], cv2.IMREAD_COLOR_RGB)
                         for k in ks])


def started(ds: Dataset, workers: int, batch: int) -> DataLoader:
    """A DataLoader over `ds` (shuffled, persistent workers), workers started by one untimed batch."""
    dl = DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers, persistent_workers=workers > 0,
                    worker_init_fn=worker_init, drop_last=False)
    next(iter(dl))
    return dl


def peer_loader(videos: list[tuple[Path, int]], workers: int, batch: int, seed: int) -> DataLoader:
    """The peer's DataLoader, workers started and kept; a pass is at least 2 batches."""
    return started(SourceClips(videos, seed, -(-2 * batch // len(videos))), workers, batch)


def round_rate(dl, seconds: float) -> float:
    """Clips/s over whole passes of `dl` until `seconds` have run."""
    n, t = 0, time.perf_counter()
    while time.perf_counter() - t < seconds:
        for clips, _ in dl:
            n += clips.shape[0]
    return n / (time.perf_counter() - t)


def dataprep_loader(pack: Path, workers: int, batch: int, seed: int):
    """dataprep's side: `dataprep.Loader(dataprep.VideoDataset(pack, frames=16, stride=2), crop=RandomResizedCrop(112),
    flip=True, batch_size=batch, num_workers=workers)` over a pack built from the same sources (`dataprep build
    video SRC --size 128 --out PACK`), with enough clips a video that a pass is at least 64 batches (as the
    stand-in's), workers started by one untimed batch; main() times its rounds with `round_rate`, interleaved
    with the peer's."""
    import dataprep

    videos = len(dataprep.VideoDataset(pack, frames=FRAMES, stride=STRIDE))
    t = time.perf_counter()
    ds = dataprep.VideoDataset(pack, frames=FRAMES, stride=STRIDE, clips_per_video=-(-64 * batch // videos))
    dl = dataprep.Loader(ds, batch_size=batch, shuffle=True, seed=seed, num_workers=workers,
                         crop=dataprep.RandomResizedCrop(CROP), flip=True)
    next(iter(dl))
    print(f"    dataprep: {time.perf_counter() - t:.2f} s from opening {pack} to the first batch", flush=True)
    return dl


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", type=Path, default=Path("/tmp/video-bench"), help="make_videos.py's --out")
    ap.add_argument("--sets", default="small,480p,720p,1080p", help="comma-separated sub-folders of --src")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8.0, help="length of a round")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stand-in", action="store_true", help="also time JPEG frames in RAM (see above)")
    ap.add_argument("--dataprep", type=Path, default=None,
                    help="folder of packs built from each set at 128 px (PACKS/<set>): time dataprep beside the peer")
    args = ap.parse_args(argv)
    print(f"peer: per-sample DataLoader, {args.workers} workers, batch {args.batch}, {FRAMES} frames stride "
          f"{STRIDE}, crop {CROP}; {args.rounds} rounds of {args.seconds:.0f} s; load average {os.getloadavg()}")
    for name in args.sets.split(","):
        videos = video_files(args.src / name)
        peer_dl = peer_loader(videos, args.workers, args.batch, args.seed)
        stand_dl = (started(JpegFrameClips(videos, args.seed, -(-64 * args.batch // len(videos))),
                            args.workers, args.batch) if args.stand_in else None)
        ours_dl = (dataprep_loader(args.dataprep / name, args.workers, args.batch, args.seed)
                   if args.dataprep is not None else None)
        peer, stand, ours = [], [], []
        for _ in range(args.rounds):  # interleaved, so that drift in the load hits both alike
            peer.append(round_rate(peer_dl, args.seconds))
            if stand_dl is not None:
                stand.append(round_rate(stand_dl, args.seconds))
            if ours_dl is not None:
                ours.append(round_rate(ours_dl, args.seconds))
        line = (f"{name:>6}: {len(videos)} videos, peer {statistics.median(peer):6.2f} clips/s "
                f"({min(peer):.2f}-{max(peer):.2f})")
        if stand:
            line += (f", JPEG stand-in {statistics.median(stand):.1f} ({min(stand):.1f}-{max(stand):.1f})"
                     f" = {statistics.median(stand) / statistics.median(peer):.1f}x")
        if ours:
            line += (f", dataprep {statistics.median(ours):.1f} ({min(ours):.1f}-{max(ours):.1f})"
                     f" = {statistics.median(ours) / statistics.median(peer):.1f}x")
        del peer_dl, stand_dl, ours_dl  # the workers end before the next set starts its own
        print(line + f"; load average {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
