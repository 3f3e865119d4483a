"""A video build's throughput beside ffmpeg (issue 55: "build throughput in frames/s stated beside `ffmpeg`
transcoding the same files to the same size"): takes make_videos.py's sets, gives for one source of each set the
wall time, CPU time and frames per second and per CPU-second of

- `ffmpeg -i SRC -vf scale=-2:SIZE:flags=area -q:v 2 OUT/%05d.jpg` (every frame a JPEG at the size: the same
  work as the build's, without the pack), ffmpeg's own threads;
- `dataprep build video DIR --size SIZE --workers 1` over a folder holding that one source.

Rounds interleave the two commands; each is a fresh process, timed by wall clock and by its CPU seconds
(getrusage of the children: user + system, Python's start and imports included for dataprep). Medians and
ranges over the rounds, the load average at the start and the end.

    .venv/bin/python benchmarks/make_videos.py --out /tmp/video-bench
    .venv/bin/python benchmarks/bench_video_build.py --src /tmp/video-bench [--sets 480p,720p,1080p] [--rounds 3] [--size 128]
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def timed(cmd: list[str]) -> tuple[float, float]:
    """Run `cmd` to its end; (wall seconds, CPU seconds of the child and its children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def frames_of(path: Path) -> int:
    """The frames a source holds, counted by decoding (ffprobe's -count_frames)."""
    out = subprocess.run(["ffprobe", "-v", "error", "-count_frames", "-select_streams", "v:0", "-show_entries",
                          "stream=nb_read_frames", "-of", "csv=p=0", str(path)], check=True, capture_output=True, text=True)
    return int(out.stdout.strip())


def row(name: str, frames: int, runs: list[tuple[float, float]]) -> str:
    walls, cpus = [w for w, _ in runs], [c for _, c in runs]
    w, c = statistics.median(walls), statistics.median(cpus)
    return (f"  {name:9s} wall {w:6.2f} s ({min(walls):.2f}-{max(walls):.2f})  CPU {c:6.2f} s  "
            f"{frames / w:7.1f} frames/s  {frames / c:7.1f} frames per CPU-s")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", type=Path, default=Path("/tmp/video-bench"), help="make_videos.py's --out")
    ap.add_argument("--sets", default="480p,720p,1080p", help="comma-separated sub-folders of --src")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size", type=int, default=128)
    a = ap.parse_args(argv)
    if shutil.which("ffmpeg") is None:
        sys.exit("needs the ffmpeg command (apt-get install ffmpeg)")
    print(f"one source a set, --size {a.size}, {a.rounds} interleaved rounds; load {os.getloadavg()[0]:.2f}")
    for name in a.sets.split(","):
        sources = sorted((a.src / name).rglob("*.mp4"))
        if not sources:
            sys.exit(f"{a.src / name}: no .mp4 files (run benchmarks/make_videos.py)")
        src = sources[0]
        frames = frames_of(src)
        runs: dict[str, list[tuple[float, float]]] = {"ffmpeg": [], "dataprep": []}
        with tempfile.TemporaryDirectory(prefix="bench-vidbuild-") as tmp:
            one = Path(tmp) / "src" / "c"
            one.mkdir(parents=True)
            os.symlink(src.resolve(), one / src.name)
            for r in range(a.rounds):
                jpegs, pack = Path(tmp) / f"jpegs{r}", Path(tmp) / f"pack{r}"
                jpegs.mkdir()
                runs["ffmpeg"].append(timed(["ffmpeg", "-v", "error", "-i", str(src), "-vf", f"scale=-2:{a.size}:flags=area",
                                             "-q:v", "2", str(jpegs / "%05d.jpg")]))
                runs["dataprep"].append(timed([sys.executable, "-m", "dataprep", "build", "video", str(Path(tmp) / "src"),
                                               "--size", str(a.size), "--out", str(pack), "--workers", "1", "--no-progress"]))
                stored = len(list(jpegs.glob("*.jpg")))
                if stored != frames:
                    sys.exit(f"{src}: ffmpeg wrote {stored} frames of {frames}")
                shutil.rmtree(jpegs)
                shutil.rmtree(pack)
        print(f"{name}: {src.name}, {frames} frames")
        for k, v in runs.items():
            print(row(k, frames, v))
        ratio = statistics.median(c for _, c in runs["ffmpeg"]) / statistics.median(c for _, c in runs["dataprep"])
        print(f"  dataprep's frames per CPU-s: {100 * ratio:.0f} % of ffmpeg's")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
