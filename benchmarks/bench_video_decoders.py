"""Measurements that choose the video kind's decoder and storage (issue 55): takes make_videos.py's H.264
sources, gives, per source size:

- seek: ms to open the file, seek and decode a random 16-frame clip (stride 2) to RGB with PyAV, FFmpeg's
  default threading (slice threads) beside thread_type="AUTO" (frame threads), with the CPU time it took;
- sequential: frames/s of decoding a whole file in order with PyAV (what a build does), decode only and
  decode + scale to 128 px (shorter side) RGB with swscale, default beside AUTO threading;
- ffmpeg: frames/s of the `ffmpeg` command transcoding the same file to 128 px: JPEG frames, a short-GOP
  H.264 file, and raw RGB thrown away (decode + scale alone);
- storage (--storage): for a 16-frame clip (stride 2) at 128 px, the cost to decode it on one core from
  (a) 16 JPEGs at quality 90 (dataprep's encoder, with restart markers) with cv2.imdecode and simplejpeg,
  (b) an H.264 stream of the same frames with a keyframe every 16 or 32 frames (and 250, as a phone
  writes), decoded with PyAV from the keyframe before a random start, (c) raw uint8; with the bytes a
  frame of each and its PSNR against the raw frames.

torchcodec is tried from a side folder (--torchcodec PATH, from `pip install --target PATH torchcodec`,
with `apt-get install ffmpeg` for its libraries); where it does not load, the reason is printed.

    .venv/bin/python benchmarks/make_videos.py --out /tmp/video-bench
    .venv/bin/python benchmarks/bench_video_decoders.py --src /tmp/video-bench [--sets small,480p,720p,1080p] [--clips 24]
    .venv/bin/python benchmarks/bench_video_decoders.py --src /tmp/video-bench --only storage [--storage-from 1080p]

Figures are medians over interleaved variants (each clip start is timed with every variant in turn), with
the load average; CPU figures are process (or child) CPU seconds, which a busy machine inflates less than
wall time.
"""
from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import cv2
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_video import FRAMES, SIZE, STRIDE, frame_count, read_clip_pyav, scaled, video_files  # noqa: E402

SPAN = (FRAMES - 1) * STRIDE + 1


def timed(fn, *args):
    """(wall seconds, CPU seconds of this process, result) of fn(*args)."""
    w, c = time.perf_counter(), time.process_time()
    r = fn(*args)
    return time.perf_counter() - w, time.process_time() - c, r


def seek_bench(videos: list[Path], clips: int, rng: random.Random, torchcodec: bool) -> None:
    """Random clips read from the files with each decoder variant, interleaved."""
    lengths = [frame_count(p) for p in videos]
    variants = {"pyav default": lambda p, s: read_clip_pyav(p, s),
                "pyav AUTO": lambda p, s: read_clip_pyav(p, s, thread_type="AUTO")}
    if torchcodec:
        variants["torchcodec"] = read_clip_torchcodec
    wall: dict[str, list[float]] = {k: [] for k in variants}
    cpu: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(clips):
        i = rng.randrange(len(videos))
        start = rng.randint(0, max(0, lengths[i] - SPAN))
        for k, fn in variants.items():
            w, c, clip = timed(fn, videos[i], start)
            assert clip.shape[0] == FRAMES
            wall[k].append(w)
            cpu[k].append(c)
    for k in variants:
        print(f"    seek+decode {k:>13}: {1e3 * statistics.median(wall[k]):7.1f} ms/clip (mean "
              f"{1e3 * statistics.mean(wall[k]):.1f}), {len(wall[k]) / sum(wall[k]):5.1f} clips/s, "
              f"CPU {1e3 * statistics.mean(cpu[k]):.1f} ms/clip")


def read_clip_torchcodec(path: Path, start: int) -> np.ndarray:
    """The clip as read_clip_pyav reads it, by torchcodec's VideoDecoder (exact seek mode, one thread)."""
    from torchcodec.decoders import VideoDecoder

    dec = VideoDecoder(str(path), dimension_order="NHWC", num_ffmpeg_threads=1)
    idx = [min(start + STRIDE * t, len(dec) - 1) for t in range(FRAMES)]
    return dec.get_frames_at(indices=idx).data.numpy()


def sequential_bench(path: Path, max_frames: int) -> None:
    """A whole file decoded in order (up to max_frames): frames/s by wall and by CPU; decode only, then
    decode + scale to 128 px RGB three ways (swscale's area and bilinear filters, or full-size RGB from
    swscale and cv2.resize INTER_AREA), with FFmpeg's default threading and with AUTO."""
    import av

    def run(thread_type: str | None, scale: str) -> int:
        with av.open(str(path)) as c:
            st = c.streams.video[0]
            if thread_type:
                st.thread_type = thread_type
            w, h = scaled(st.codec_context.width, st.codec_context.height)
            n = 0
            for f in c.decode(st):
                if scale == "cv2 INTER_AREA":
                    cv2.resize(f.to_ndarray(format="rgb24"), (w, h), interpolation=cv2.INTER_AREA)
                elif scale:
                    f.reformat(width=w, height=h, format="rgb24", interpolation=scale).to_ndarray()
                n += 1
                if n == max_frames:
                    break
        return n

    cv2.setNumThreads(1)
    for scale in ("", "AREA", "BILINEAR", "cv2 INTER_AREA"):
        for tt in (None, "AUTO"):
            w, c, n = timed(run, tt, scale)
            what = f"+ scale {scale}" if scale else "decode only"
            print(f"    sequential {what:>22}, {tt or 'default':>7}: {n / w:6.0f} frames/s, "
                  f"{n / c:6.0f} frames per CPU-s ({n} frames)")


def ffmpeg_bench(path: Path, max_frames: int) -> None:
    """The ffmpeg command transcoding the file (up to max_frames) to 128 px (shorter side)."""
    scale = f"scale='if(gte(iw,ih),-2,{SIZE})':'if(gte(iw,ih),{SIZE},-2)':flags=area"
    with tempfile.TemporaryDirectory(prefix="vb-ffmpeg-") as tmp:
        jobs = {
            "JPEG frames (-q:v 2)": [f"{tmp}/%05d.jpg", "-q:v", "2"],
            "H.264 GOP 32 (x264 fast)": ["-c:v", "libx264", "-preset", "fast", "-g", "32", "-bf", "0",
                                         f"{tmp}/out.mp4"],
            "raw RGB to /dev/null": ["-f", "rawvideo", "-pix_fmt", "rgb24", "/dev/null"],
        }
        for what, tail in jobs.items():
            cmd = ["ffmpeg", "-v", "error", "-y", "-i", str(path), "-frames:v", str(max_frames), "-vf", scale, *tail]
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t = time.perf_counter()
            subprocess.run(cmd, check=True)
            w = time.perf_counter() - t
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            c = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
            n = min(max_frames, frame_count(path))
            print(f"    ffmpeg {what:>26}: {n / w:6.0f} frames/s, {n / c:6.0f} frames per CPU-s")


def frames_at_size(path: Path, n: int) -> np.ndarray:
    """The first n frames of the file at 128 px (shorter side), RGB uint8 (n, H, W, 3)."""
    import av

    out = []
    with av.open(str(path)) as c:
        st = c.streams.video[0]
        w, h = scaled(st.codec_context.width, st.codec_context.height)
        for f in c.decode(st):
            out.append(f.reformat(width=w, height=h, format="rgb24", interpolation="AREA").to_ndarray())
            if len(out) == n:
                break
    return np.stack(out)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float32) - b.astype(np.float32)) ** 2))
    return 10 * np.log10(255**2 / mse) if mse else float("inf")


def h264_encode(frames: np.ndarray, gop: int, crf: int) -> list[bytes]:
    """The frames as an H.264 stream of one packet a frame (no B-frames, so decode order is frame order;
    SPS/PPS repeated at each keyframe, so decoding may start at any keyframe), a keyframe every `gop`."""
    import av

    enc = av.CodecContext.create("libx264", "w")
    enc.width, enc.height, enc.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
    enc.time_base, enc.framerate, enc.gop_size = Fraction(1, 30), 30, gop
    enc.options = {"preset": "fast", "crf": str(crf), "bf": "0", "keyint_min": str(gop), "sc_threshold": "0"}
    pkts: list[bytes] = []
    for i, fr in enumerate(frames):
        vf = av.VideoFrame.from_ndarray(fr, format="rgb24")
        vf.pts = i
        pkts += [bytes(p) for p in enc.encode(vf)]
    pkts += [bytes(p) for p in enc.encode(None)]
    assert len(pkts) == len(frames), (len(pkts), len(frames))
    return pkts


class H264Clips:
    """Clips from h264_encode's packets: decode from the keyframe at or before the start, keep every
    STRIDE-th frame from the start; one decoder (one thread), flushed between clips, as a worker would."""

    def __init__(self, pkts: list[bytes], gop: int):
        import av

        self.pkts, self.gop, self.av = pkts, gop, av
        self.dec = av.CodecContext.create("h264", "r")
        self.dec.thread_count = 1

    def clip(self, start: int) -> np.ndarray:
        key = start // self.gop * self.gop
        out: list[np.ndarray] = []
        i = key
        self.dec.flush_buffers()
        for p in self.pkts[key:start + SPAN]:
            for f in self.dec.decode(self.av.Packet(p)):
                if i >= start and (i - start) % STRIDE == 0:
                    out.append(f.to_ndarray(format="rgb24"))
                i += 1
        for f in self.dec.decode(None):  # no frames are held back without B-frames; a guard all the same
            if i >= start and (i - start) % STRIDE == 0 and len(out) < FRAMES:
                out.append(f.to_ndarray(format="rgb24"))
            i += 1
        assert len(out) == FRAMES, (start, len(out))
        return np.stack(out)


def storage_bench(path: Path, n: int, clips: int, rng: random.Random) -> None:
    """Decode cost of a clip at 128 px from each storage, one core."""
    import simplejpeg

    from dataprep.images.codec import encode_jpeg

    frames = frames_at_size(path, n)
    n = len(frames)
    raw_frame = frames[0].nbytes
    print(f"  storage: {n} frames of {path.name} at {frames.shape[2]}x{frames.shape[1]}, clip {FRAMES} frames "
          f"stride {STRIDE}; load average {os.getloadavg()[0]:.2f}")
    jpegs = [encode_jpeg(f, 90).tobytes() for f in frames]
    plain = [cv2.imencode(".jpg", cv2.cvtColor(f, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes()
             for f in frames]
    jpeg_psnr = statistics.mean(psnr(cv2.imdecode(np.frombuffer(j, np.uint8), cv2.IMREAD_COLOR_RGB), f)
                                for j, f in zip(jpegs, frames))
    h264 = {}
    for gop, crf in ((16, 12), (16, 18), (16, 23), (32, 18), (32, 23), (250, 18)):
        pkts = h264_encode(frames, gop, crf)
        c = H264Clips(pkts, gop)
        dec = np.concatenate([c.clip(s) for s in range(0, n - SPAN + 1, SPAN)])  # quality, on served frames
        ref = np.concatenate([frames[s:s + SPAN:STRIDE] for s in range(0, n - SPAN + 1, SPAN)])
        h264[(gop, crf)] = (c, sum(map(len, pkts)) / n, psnr(dec, ref))
    buf = np.empty((FRAMES, *frames.shape[1:]), np.uint8)

    def jpeg_cv2(s: int) -> None:
        for t in range(FRAMES):
            cv2.imdecode(np.frombuffer(jpegs[s + STRIDE * t], np.uint8), cv2.IMREAD_COLOR_RGB)

    def jpeg_simple(s: int, fast: bool = False) -> None:
        for t in range(FRAMES):
            simplejpeg.decode_jpeg(jpegs[s + STRIDE * t], colorspace="RGB", buffer=buf[t],
                                   fastdct=fast, fastupsample=fast)

    variants = {
        f"JPEG q90 cv2.imdecode     ({statistics.mean(map(len, jpegs)) / 1e3:5.1f} kB/frame, "
        f"{jpeg_psnr:.1f} dB; without restarts "
        f"{statistics.mean(map(len, plain)) / 1e3:.1f} kB)": jpeg_cv2,
        "JPEG q90 simplejpeg": jpeg_simple,
        "JPEG q90 simplejpeg fastdct+fastupsample": lambda s: jpeg_simple(s, True),
        f"raw uint8                 ({raw_frame / 1e3:5.1f} kB/frame)":
            lambda s: np.take(frames, np.arange(s, s + SPAN, STRIDE), axis=0, out=buf),
    }
    for (gop, crf), (c, size, q) in h264.items():
        variants[f"H.264 GOP {gop:>3} crf {crf} PyAV ({size / 1e3:5.1f} kB/frame, {q:.1f} dB)"] = c.clip
    cv2.setNumThreads(1)
    wall: dict[str, list[float]] = {k: [] for k in variants}
    cpu: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(clips):
        s = rng.randint(0, n - SPAN)
        for k, fn in variants.items():
            w, c, _ = timed(fn, s)
            wall[k].append(w)
            cpu[k].append(c)
    base = statistics.median(cpu[next(iter(variants))])
    for k in variants:  # CPU time: on a shared machine it is the per-core cost; wall time adds the waits
        m = statistics.median(cpu[k])
        print(f"    {k}: CPU {1e3 * m:6.2f} ms/clip = {1 / m:6.0f} clips/s per core, {m / base:5.2f}x JPEG cv2"
              f" (wall {1e3 * statistics.median(wall[k]):.2f} ms)")
    print(f"    load average {os.getloadavg()[0]:.2f}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", type=Path, default=Path("/tmp/video-bench"), help="make_videos.py's --out")
    ap.add_argument("--sets", default="small,480p,720p,1080p")
    ap.add_argument("--only", choices=("seek", "sequential", "ffmpeg", "storage"), default=None)
    ap.add_argument("--clips", type=int, default=24, help="random clips timed a set (each with every variant)")
    ap.add_argument("--seq-frames", type=int, default=300, help="frames decoded by the sequential and ffmpeg runs")
    ap.add_argument("--storage-from", default="1080p,small", help="sets whose first video feeds the storage run")
    ap.add_argument("--storage-frames", type=int, default=240)
    ap.add_argument("--torchcodec", type=Path, default=None, help="folder torchcodec was pip-installed into (--target)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    use_tc = False
    if args.torchcodec is not None:
        sys.path.insert(0, str(args.torchcodec))
        try:
            from torchcodec.decoders import VideoDecoder  # noqa: F401
            use_tc = True
        except Exception as e:  # noqa: BLE001 - any failure to load is the finding, printed
            print(f"torchcodec from {args.torchcodec} does not load: {type(e).__name__}: "
                  f"{str(e).splitlines()[0]} (cause: {e.__cause__})")
    import av

    print(f"PyAV {av.__version__} (FFmpeg libavcodec {'.'.join(map(str, av.library_versions['libavcodec']))}); "
          f"load average {os.getloadavg()}")
    for name in args.sets.split(",") if args.only != "storage" else ():
        videos = [p for p, _ in video_files(args.src / name)]
        with av.open(str(videos[0])) as c:
            cc = c.streams.video[0].codec_context
            print(f"{name}: {len(videos)} videos, {cc.width}x{cc.height}; load average {os.getloadavg()[0]:.2f}")
        if args.only in (None, "seek"):
            seek_bench(videos, args.clips, rng, use_tc)
        if args.only in (None, "sequential"):
            sequential_bench(videos[0], args.seq_frames)
        if args.only in (None, "ffmpeg"):
            ffmpeg_bench(videos[0], args.seq_frames)
    if args.only in (None, "storage"):
        for name in args.storage_from.split(","):
            storage_bench(video_files(args.src / name)[0][0], args.storage_frames, args.clips * 4, rng)


if __name__ == "__main__":
    main()
