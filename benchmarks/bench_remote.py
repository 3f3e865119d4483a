"""Packs on object storage (issue 22): loading a pack from a local S3 server into RAM, and uploading one
after a build, against s3fs's own concurrent transfer of the same objects and against a sequential loop,
all measured in this run (medians; ratios printed).

    .venv/bin/python benchmarks/bench_remote.py [--mb 500] [--rounds 3] [--rtt-ms 20] [--stream-mbps 50]

Each comparison runs twice: on loopback (the server's own speed, which on a small machine shares its
cores with the client), and through benchmarks/netem_proxy.py, which gives every request a round trip
and every connection a bandwidth cap, as object stores across a network do (S3 serves one stream at
tens of MB/s; concurrency is what makes it fast).

The server is moto's (a separate process on 127.0.0.1, reached through s3fs like a real bucket); the
pack is decoded pixels (raw mode), so its bytes are what crosses the wire. "dataprep" is
`InMemoryImageDataset(url, cache="ram")`: fetched in parallel ranges, every sha256 checked, staged and
loaded into RAM, every field checked. The baselines only move bytes: `fs.cat(all objects)` (s3fs runs
them concurrently) and `fs.cat_file` one object after another. Upload: `upload_pack` (manifest last,
sizes checked) against `fs.put(dir, recursive=True)` and a `put_file` loop.
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", f"from moto.server import main; main(['-H', '127.0.0.1', '-p', '{port}'])"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return p
        except OSError:
            time.sleep(0.05)
    p.kill()
    raise SystemExit("moto's server did not start")


def make_pack(base: Path, mb: int) -> Path:
    from dataprep.images.build import build_images
    from dataprep.images.settings import ImageSettings
    from dataprep.settings import BuildSettings
    from dataprep.sources import scan_imagenet
    from dataprep.synthetic import write_tree

    per = 256 * 256 * 3
    n = max(8, mb * 1_000_000 // per)
    tree = write_tree(base / "tree", classes=4, per_class=-(-n // 4), sizes=((256, 256),))
    build_images(scan_imagenet(tree), base / "pack", BuildSettings(shard_size=256), ImageSettings(size=256, mode="raw"),
                 progress=False)
    shutil.rmtree(tree)
    return base / "pack"


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rtt-ms", type=float, default=20.0)
    ap.add_argument("--stream-mbps", type=float, default=50.0)
    a = ap.parse_args()
    port, proxy_port = free_port(), free_port()
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
                      AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}")
    base = Path(tempfile.mkdtemp(prefix="bench-remote-"))
    os.environ["DATAPREP_CACHE_DIR"] = str(base / "cache")
    server = start_server(port)
    proxy = subprocess.Popen([sys.executable, str(HERE / "netem_proxy.py"), str(proxy_port), str(port),
                              "--rtt-ms", str(a.rtt_ms), "--stream-mbps", str(a.stream_mbps)])
    try:
        pack = make_pack(base, a.mb)
        files = sorted(p for p in pack.rglob("*") if p.is_file())
        total = sum(p.stat().st_size for p in files)
        print(f"pack: {len(files)} files, {total / 1e6:,.0f} MB of decoded pixels; moto server on 127.0.0.1; "
              f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
        for where, endpoint in (("loopback", port), (f"through a {a.rtt_ms:g} ms round trip, {a.stream_mbps:g} MB/s a "
                                                      "connection", proxy_port)):
            os.environ["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{endpoint}"
            print(f"-- {where}")
            compare(pack, files, total, a.rounds, endpoint)
        print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    finally:
        for p in (proxy, server):
            p.terminate()
            p.wait()
        shutil.rmtree(base, ignore_errors=True)


def compare(pack: Path, files: list, total: int, rounds: int, tag: int) -> None:
    import s3fs

    from dataprep.images.dataset import InMemoryImageDataset
    from dataprep.remote.upload import upload_pack

    s3fs.S3FileSystem.clear_instance_cache()  # the endpoint changed: dataprep's store makes a new client too
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    bucket = f"bench{tag}"
    fs.mkdir(bucket)

    def ours_up(k):
        return lambda: upload_pack(pack, f"s3://{bucket}/ours{k}")

    def s3fs_up(k):
        return lambda: fs.put(str(pack) + "/", f"{bucket}/put{k}/", recursive=True)

    def loop_up(k):
        return lambda: [fs.put_file(str(p), f"{bucket}/loop{k}/{p.relative_to(pack).as_posix()}") for p in files]

    up = {"dataprep upload_pack": [], "s3fs put (concurrent)": [], "put_file loop": []}
    for k in range(rounds):  # interleaved, so drift in the machine's load hits every case alike
        up["dataprep upload_pack"].append(timed(ours_up(k)))
        up["s3fs put (concurrent)"].append(timed(s3fs_up(k)))
        up["put_file loop"].append(timed(loop_up(k)))
    report("upload after a build", up, total, "dataprep upload_pack")

    objs = [f"{bucket}/ours0/{p.relative_to(pack).as_posix()}" for p in files]

    def ours_load():
        ds = InMemoryImageDataset(f"s3://{bucket}/ours0", cache="ram", progress=False)
        assert len(ds) > 0

    down = {"dataprep ram load": [], "s3fs cat (concurrent)": [], "cat_file loop": []}
    for _ in range(rounds):
        down["dataprep ram load"].append(timed(ours_load))
        down["s3fs cat (concurrent)"].append(timed(lambda: fs.cat(objs)))
        down["cat_file loop"].append(timed(lambda: [fs.cat_file(o) for o in objs]))
    report("load into RAM (every sha256 checked; the baselines check nothing)", down, total, "dataprep ram load")


def report(what: str, cases: dict, total: int, ours: str) -> None:
    med = {k: statistics.median(v) for k, v in cases.items()}
    print(f"{what} (median of {len(next(iter(cases.values())))}):")
    for k, s in med.items():
        print(f"  {k:24s} {s:6.2f} s  {total / s / 1e6:7.1f} MB/s")
    concurrent, loop = [k for k in med if k != ours]
    print(f"  dataprep vs {concurrent}: {med[concurrent] / med[ours]:.2f}x (goal >= 0.8); "
          f"vs {loop}: {med[loop] / med[ours]:.2f}x (goal >= 2)")


if __name__ == "__main__":
    main()
