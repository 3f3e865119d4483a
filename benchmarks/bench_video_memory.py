"""Peak memory of building one long video (issue 55: "a build's memory stays bounded"): takes video lengths in
seconds, gives the peak RSS of a fresh process building each (frame-coded 640x360 mpeg4 at 30 fps from
dataprep.synthetic.write_video, stored at --size), beside what the video's decoded frames and its stored JPEGs
weigh; or takes video files (`--videos`, such as make_videos.py --seconds 600 writes) and does the same for each.
Each build runs in its own process (the video written by another); it prints its peak RSS (VmHWM) before and
after `build.video`, and the largest peak of its child processes (the build's workers, if any). The goal is a
peak that does not grow with the video: the decoder's frames are encoded as they come and written to the shard
as they are encoded (video/build.py: FrameSink), so only a few bytes a frame of index are held.

    .venv/bin/python benchmarks/bench_video_memory.py [--seconds 20,120] [--size 64]
    .venv/bin/python benchmarks/bench_video_memory.py --videos /tmp/video-long/1080p/train/*/*.mp4 --size 128
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

H, W, FPS = 360, 640, 30


def peak_mb() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def child(mode: str, root: str, seconds: float, size: int) -> None:
    if mode == "link":  # a given video as the source's one file
        (Path(root) / "src" / "c").mkdir(parents=True, exist_ok=True)
        os.symlink(os.environ["VIDEO"], Path(root) / "src" / "c" / "long.mp4")
        return
    if mode == "write":
        from dataprep.synthetic import write_video

        (Path(root) / "src" / "c").mkdir(parents=True, exist_ok=True)
        write_video(Path(root) / "src" / "c" / "long.mp4", frames=round(seconds * FPS), h=H, w=W, fps=FPS)
        return
    from dataprep import build

    before = peak_mb()
    build.video(Path(root) / "src", Path(root) / "pack", size=size, workers=1)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024
    print(json.dumps({"before": before, "peak": peak_mb(), "children": kids}))


def probe(video: str) -> tuple[int, int]:
    """A video's frame size (h, w)."""
    import av

    with av.open(video) as f:
        st = f.streams.video[0]
        return st.codec_context.height, st.codec_context.width


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", default="20,120")
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--videos", nargs="*", default=None, help="video files to build instead of generated ones")
    ap.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        mode, root = a.child
        child(mode, root, float(os.environ["SECONDS_LONG"]), a.size)
        return
    if a.videos:
        print(f"each video built alone at --size {a.size}, one worker; load {os.getloadavg()[0]:.2f}")
    else:
        print(f"one {W}x{H} video at {FPS} fps built at --size {a.size}, one worker; load {os.getloadavg()[0]:.2f}")
    print(f"{'seconds':>7s} {'frames':>7s} {'file MB':>8s} {'decoded MB':>11s} {'JPEGs MB':>9s} {'RSS before':>11s} "
          f"{'peak RSS':>9s} {'children':>9s} {'build s':>8s}")
    runs = [(None, str(Path(v).resolve())) for v in a.videos] if a.videos else [(float(x), "") for x in a.seconds.split(",")]
    for s, video in runs:
        with tempfile.TemporaryDirectory(prefix="bench-vidmem-") as tmp:
            env = {**os.environ, "SECONDS_LONG": str(s or 0), "VIDEO": video}
            cmd = [sys.executable, __file__, "--size", str(a.size), "--child"]
            subprocess.run([*cmd, "link" if video else "write", tmp], env=env, check=True)
            t = time.perf_counter()
            r = json.loads(subprocess.run([*cmd, "build", tmp], env=env, capture_output=True, text=True, check=True).stdout.split("\n")[-2])
            took = time.perf_counter() - t
            m = json.loads((Path(tmp) / "pack" / "manifest.json").read_text())
            frames = m["splits"]["train"]["frames"]
            jpegs = sum(f.stat().st_size for f in (Path(tmp) / "pack" / "train").rglob("images*.npy"))
            h, w = probe(video) if video else (H, W)
            if s is None:
                s = frames / FPS
            else:
                assert frames == round(s * FPS), (s, frames)
            print(f"{s:7.0f} {frames:7,d} {os.path.getsize(Path(tmp) / 'src' / 'c' / 'long.mp4') / 1e6:8.1f} "
                  f"{frames * h * w * 3 / 1e6:11,.0f} {jpegs / 1e6:9.1f} {r['before']:8,d} MB {r['peak']:6,d} MB {r['children']:6,d} MB "
                  f"{took:8.1f}")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
