"""Dask benchmark (issue 10): build throughput of the local engine against Dask on this machine, in the
same run: a local cluster dataprep starts and stops, and an existing scheduler with workers reached by
address. Same inputs, same settings, same number of processes; medians of --rounds. The outputs are
checked to be byte-identical.

    .venv/bin/python benchmarks/bench_dask.py [--corpus ../shared/corpus/images] [--workers 2] [--rounds 3]
"""
from __future__ import annotations

import argparse
import filecmp
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from dataprep.engine import LocalEngine  # noqa: E402
from dataprep.engine.dask import DaskEngine  # noqa: E402
from dataprep.images.build import build_images  # noqa: E402
from dataprep.images.settings import ImageSettings  # noqa: E402
from dataprep.settings import BuildSettings  # noqa: E402
from dataprep.sources import scan_imagenet  # noqa: E402


def same_shards(a: Path, b: Path) -> bool:
    files = [p.relative_to(a) for p in a.rglob("*.npy")]
    return bool(files) and all(filecmp.cmp(a / f, b / f, shallow=False) for f in files)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=str(HERE.parents[1] / "shared" / "corpus" / "images"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size", type=int, default=256)
    a = ap.parse_args()
    source = scan_imagenet(a.corpus)
    settings, image = BuildSettings(workers=a.workers, overwrite=True, shard_size=16), ImageSettings(size=a.size)
    print(f"load average at start: {os.getloadavg()[0]:.2f}; {source.planned()} images at {a.size} px, "
          f"{a.workers} processes, shards of 16")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sched = tmp / "scheduler.json"
        procs = [subprocess.Popen([sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port", "0",
                                   "--no-dashboard", "--scheduler-file", str(sched)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
        while not sched.exists():
            time.sleep(0.1)
        time.sleep(0.3)
        address = json.loads(sched.read_text())["address"]
        procs += [subprocess.Popen([sys.executable, "-m", "dask", "worker", address, "--nthreads", "1", "--nworkers", str(a.workers),
                                    "--host", "127.0.0.1", "--no-dashboard"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
        try:
            rates: dict[str, list[float]] = {"local process pool": [], "dask, local cluster (started per build)": [],
                                              "dask, existing scheduler + workers": []}
            for _ in range(a.rounds):
                s = build_images(source, tmp / "local", settings, image, engine=LocalEngine(a.workers))
                rates["local process pool"].append(s.written / s.seconds)
                t0 = time.perf_counter()
                with DaskEngine(workers=a.workers) as eng:
                    s = build_images(source, tmp / "dask_local", settings, image, engine=eng)
                rates["dask, local cluster (started per build)"].append(s.written / (time.perf_counter() - t0))
                with DaskEngine(address=address) as eng:
                    eng.client.wait_for_workers(a.workers, timeout=60)
                    s = build_images(source, tmp / "dask_remote", settings, image, engine=eng)
                rates["dask, existing scheduler + workers"].append(s.written / s.seconds)
            ok = same_shards(tmp / "local", tmp / "dask_local") and same_shards(tmp / "local", tmp / "dask_remote")
            base = statistics.median(rates["local process pool"])
            for name, rs in rates.items():
                m = statistics.median(rs)
                print(f"  {name:45s} {m:8.0f} img/s  {m / base:5.2f}x local")
            print(f"  outputs byte-identical: {'yes' if ok else 'NO'}")
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                p.wait(timeout=30)
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
