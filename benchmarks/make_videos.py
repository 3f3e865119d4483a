"""Test videos for the video benchmarks (issue 55): takes the corpus photos, gives H.264 files that pan
and zoom over them, laid out as class folders (OUT/<res>/train/<class>/*.mp4, the layout
`dataprep build video` reads).

Each video is a run of scenes of 2-5 s; a scene moves a crop box from one random place and zoom (1.0-1.8x
into the photo) to another, resized to the output size with cv2 (INTER_AREA when shrinking), plus a little
fixed-pattern grain so that the encoder has sensor-like noise to spend bits on, as a phone's would. Photos
are drawn from the video's class folder, the largest ones first for 720p and up (most corpus photos are
500x375, which upscaled are too smooth to be realistic).

Encoding is what phones write: H.264 (libx264), yuv420p, 30 fps, a keyframe every 250 frames (about 8 s),
and a bit rate a phone uses at that size (small ones: 0.3 Mb/s at 160x120). x264's "veryfast" preset
keeps the build of the files short; it still uses CABAC and B-frames, as a phone's High profile does.

    .venv/bin/python benchmarks/make_videos.py --out /tmp/video-bench [--per-size 3] [--seed 0]
    .venv/bin/python benchmarks/make_videos.py --out /tmp/video-bench --sizes small --per-size 8
    .venv/bin/python benchmarks/make_videos.py --out /tmp/video-long --sizes 1080p --per-size 1 --seconds 600

Writes OUT/<res>/train/<class>/<class>_<i>.mp4 for res in 480p, 720p, 1080p, small; skips files that
exist (delete them to rebuild).
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import cv2
import numpy as np

# name: (width, height, bit rate in bit/s, (shortest, longest) seconds)
SIZES = {
    "480p": (854, 480, 3_000_000, (10, 20)),
    "720p": (1280, 720, 8_000_000, (10, 20)),
    "1080p": (1920, 1080, 16_000_000, (10, 20)),
    "small": (160, 120, 300_000, (10, 20)),
}
FPS = 30
GOP = 250


def corpus_photos(corpus: Path) -> dict[str, list[Path]]:
    """The corpus's photos by class folder, each class's list sorted by pixel count, largest first."""
    out: dict[str, list[tuple[int, Path]]] = {}
    for p in sorted(corpus.glob("*/*")):
        im = cv2.imread(str(p), cv2.IMREAD_REDUCED_GRAYSCALE_8)  # the size, cheaply
        if im is None:
            continue
        out.setdefault(p.parent.name, []).append((im.shape[0] * im.shape[1], p))
    return {c: [p for _, p in sorted(v, key=lambda t: -t[0])] for c, v in out.items()}


def scene_frames(photo: np.ndarray, w: int, h: int, n: int, rng: random.Random):
    """`n` frames of w x h moving a crop box (aspect w:h) linearly between two random boxes on `photo`."""
    ph, pw = photo.shape[:2]
    full_w = min(pw, ph * w / h)  # the largest box of the output's aspect that fits

    def box() -> tuple[float, float, float]:
        bw = full_w / rng.uniform(1.0, 1.8)
        return bw, rng.uniform(0, pw - bw), rng.uniform(0, ph - bw * h / w)

    (w0, x0, y0), (w1, x1, y1) = box(), box()
    for i in range(n):
        t = i / max(1, n - 1)
        bw, x, y = w0 + (w1 - w0) * t, x0 + (x1 - x0) * t, y0 + (y1 - y0) * t
        bh = bw * h / w
        crop = photo[int(y):int(y + bh), int(x):int(x + bw)]
        interp = cv2.INTER_AREA if crop.shape[1] > w else cv2.INTER_LINEAR
        yield cv2.resize(crop, (w, h), interpolation=interp)


def make_video(path: Path, photos: list[Path], res: str, rng: random.Random, seconds: int | None = None) -> int:
    """Writes one video at `res` from scenes over `photos` (`seconds` long, else a random length of the size's
    range); returns its frame count."""
    import av

    w, h, rate, (lo, hi) = SIZES[res]
    frames_total = (seconds or rng.randint(lo, hi)) * FPS
    grain = [np.random.default_rng(rng.randrange(2**32)).integers(-3, 4, (h, w, 3), dtype=np.int16)
             for _ in range(3)]
    tmp = path.with_suffix(".part.mp4")
    with av.open(str(tmp), "w") as out:
        st = out.add_stream("libx264", rate=FPS)
        st.width, st.height, st.pix_fmt, st.bit_rate = w, h, "yuv420p", rate
        st.codec_context.gop_size = GOP
        # keyint_min stops x264 adding keyframes at scene cuts beyond what a phone would write
        st.options = {"preset": "veryfast", "keyint_min": str(GOP), "sc_threshold": "0"}
        done = 0
        while done < frames_total:
            n = min(frames_total - done, rng.randint(2, 5) * FPS)
            img = cv2.imread(str(rng.choice(photos)), cv2.IMREAD_COLOR_RGB)
            for f in scene_frames(img, w, h, n, rng):
                f = np.clip(f.astype(np.int16) + grain[done % 3], 0, 255).astype(np.uint8)
                for pkt in st.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                    out.mux(pkt)
                done += 1
        for pkt in st.encode():
            out.mux(pkt)
    tmp.rename(path)
    return frames_total


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for the videos (not the repo)")
    ap.add_argument("--corpus", type=Path, default=Path(__file__).resolve().parents[2] / "shared/corpus/images/train")
    ap.add_argument("--sizes", default="small,480p,720p,1080p", help="comma-separated of " + ", ".join(SIZES))
    ap.add_argument("--per-size", type=int, default=3, help="videos per size, spread over the classes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seconds", type=int, default=None, help="every video this long (default: 10-20 s each)")
    args = ap.parse_args(argv)
    by_class = corpus_photos(args.corpus)
    classes = sorted(by_class)
    for res in args.sizes.split(","):
        if res not in SIZES:
            sys.exit(f"--sizes: unknown size {res!r} (choose from {', '.join(SIZES)})")
        for i in range(args.per_size):
            cls = classes[i % len(classes)]
            path = args.out / res / "train" / cls / f"{cls}_{i}.mp4"
            if path.exists():
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            rng = random.Random(f"{args.seed}/{res}/{i}")
            # the big photos for HD; any photo for small and 480p
            photos = by_class[cls][:8] if SIZES[res][1] >= 720 else by_class[cls]
            t = time.perf_counter()
            n = make_video(path, photos, res, rng, args.seconds)
            print(f"{path}: {n} frames, {path.stat().st_size / 1e6:.1f} MB, {time.perf_counter() - t:.1f} s")


if __name__ == "__main__":
    main()
