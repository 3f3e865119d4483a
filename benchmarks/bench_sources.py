"""Building from where the data already is (issue 23): the same photos built from class folders, from
WebDataset tars and from Parquet, with the same workers and options; images/s (medians of interleaved
rounds), each source's ratio to `build folder` (goal >= 0.90), and the peak RSS of each build, the driver
and its largest worker, for one big tar and one big row group (and a gzip tar) against the same unit at a
quarter of its size (goal: bounded, no growth with the unit).

    .venv/bin/python benchmarks/bench_sources.py [--corpus ../shared/corpus/images] [--repeat 4] [--workers 2]
        [--rounds 3] [--size 256] [--small 64] [--gzip] [--limit N]

The photos are the corpus's train JPEGs (each listed `--repeat` times, under other names, to make the big
tar and row group larger than the build's own memory), the first `--limit` of them for a smoke run.
Every build runs in a fresh process, so its peak RSS is its own: the driver's VmHWM from /proc, and
RUSAGE_CHILDREN's ru_maxrss for the largest worker it waited for (forked workers count the pages they
share with the driver; a build of one task runs in the driver and has no worker). Its time is the listing
and the build, what a user waits for (the process start and imports excluded). The sources are written
once to a temporary folder before the clock: folders as links to the corpus files; tars by tarfile, .jpg +
.cls members; Parquet by pyarrow, an image bytes column and a label column, with pyarrow's defaults and,
for the big row group, also with plain pages (see write_sources). Every round reads them from the page
cache alike. The big units are in the rate table too: a gzip tar or a row group is read by one task, so
one big unit is one worker's work, however many workers there are.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def photos(corpus: Path, repeat: int, limit: int | None) -> list[tuple[str, Path]]:
    """[(class, file)] of the corpus's train photos in class-folder order, each `repeat` times."""
    train = corpus / "train"
    files = [(c.name, f) for c in sorted(p for p in train.iterdir() if p.is_dir())
             for f in sorted(c.iterdir()) if f.suffix.lower() in (".jpeg", ".jpg")]
    files = [x for x in files for _ in range(repeat)]
    return files[:limit] if limit else files


def write_sources(base: Path, items: list[tuple[str, Path]], small: int, gzip: bool) -> dict[str, dict]:
    """Every source of the same photos, in the same order: {name: spec for the child}."""
    classes = sorted({c for c, _ in items})
    names, seen = [], {}
    for c, f in items:  # a repeated photo gets another name: r1, r2, ...
        k = seen.get((c, f.name), 0)
        seen[(c, f.name)] = k + 1
        names.append(f"{c}/{f.stem.replace('.', '_')}" + (f"-r{k}" if k else ""))  # no dot: a WebDataset key ends at one
    tree = base / "folders"
    for (c, f), name in zip(items, names):
        (tree / c).mkdir(parents=True, exist_ok=True)
        (tree / f"{name}.JPEG").symlink_to(f.resolve())
    specs = {"folder": {"kind": "folder", "path": str(tree)}}

    def tar(path: Path, part, gz: bool = False) -> None:
        with tarfile.open(path, "w:gz" if gz else "w") as tf:
            for (c, f), name in part:
                for ext, data in (("jpg", f.read_bytes()), ("cls", str(classes.index(c)).encode())):
                    ti = tarfile.TarInfo(f"{name}.{ext}")
                    ti.size = len(data)
                    tf.addfile(ti, io.BytesIO(data))

    pairs = list(zip(items, names))
    quarter = pairs[: max(1, len(pairs) // 4)]  # the big units at a quarter of their size: peak RSS only
    chunks = [pairs[i: i + small] for i in range(0, len(pairs), small)]
    (base / "tars").mkdir()
    for k, part in enumerate(chunks):
        tar(base / "tars" / f"small-{k:06d}.tar", part)
    tar(base / "tars" / "big.tar", pairs)
    tar(base / "tars" / "quarter.tar", quarter)
    specs[f"tars of {small}"] = {"kind": "webdataset", "path": str(base / "tars" / f"small-{{000000..{len(chunks) - 1:06d}}}.tar")}
    specs["one big tar"] = {"kind": "webdataset", "path": str(base / "tars" / "big.tar"), "big": "tar"}
    specs["quarter tar"] = {"kind": "webdataset", "path": str(base / "tars" / "quarter.tar"), "big": "tar", "quarter": True}
    if gzip:
        (base / "tgz").mkdir()
        for k, part in enumerate(chunks):
            tar(base / "tgz" / f"small-{k:06d}.tar.gz", part, gz=True)
        tar(base / "tgz" / "big.tar.gz", pairs, gz=True)
        tar(base / "tgz" / "quarter.tar.gz", quarter, gz=True)
        specs[f"gzip tars of {small}"] = {"kind": "webdataset", "path": str(base / "tgz" / f"small-{{000000..{len(chunks) - 1:06d}}}.tar.gz")}
        specs["one big gzip tar"] = {"kind": "webdataset", "path": str(base / "tgz" / "big.tar.gz"), "big": "gzip tar"}
        specs["quarter gzip tar"] = {"kind": "webdataset", "path": str(base / "tgz" / "quarter.tar.gz"), "big": "gzip tar", "quarter": True}
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        print("pyarrow is not installed: no Parquet sources (pip install pyarrow, or the parquet extra)", file=sys.stderr)
        return specs

    def table(part):
        return pa.table({"image": pa.array([f.read_bytes() for (_, f), _ in part], pa.binary()),
                         "label": pa.array([classes.index(c) for (c, _), _ in part], pa.int64())})

    (base / "parquet").mkdir()
    whole, some = table(pairs), table(quarter)
    pq.write_table(whole, base / "parquet" / "small.parquet", row_group_size=small)
    specs[f"row groups of {small}"] = {"kind": "parquet", "path": str(base / "parquet" / "small.parquet")}
    # pyarrow's writer dictionary-encodes a binary column by default: the first write batch of a column
    # chunk (1024 rows: 100 MB of 100 KB photos) lands in one dictionary page, which a reader must hold
    # whole. Plain pages (use_dictionary=False) show the reader's own bound.
    for label, dictionary in (("row group", True), ("row group, plain", False)):
        stem = "big" if dictionary else "plain"
        pq.write_table(whole, base / "parquet" / f"{stem}.parquet", row_group_size=len(pairs), use_dictionary=dictionary)
        pq.write_table(some, base / "parquet" / f"{stem}-quarter.parquet", row_group_size=len(quarter), use_dictionary=dictionary)
        specs[f"one big {label}"] = {"kind": "parquet", "path": str(base / "parquet" / f"{stem}.parquet"), "big": label}
        specs[f"quarter {label}"] = {"kind": "parquet", "path": str(base / "parquet" / f"{stem}-quarter.parquet"),
                                     "big": label, "quarter": True}
    return specs


def child(spec: dict) -> None:
    """One build in this (fresh) process; prints a JSON line: seconds, images written, peak RSS (KiB)."""
    import resource
    import time

    from dataprep.images.build import build_images
    from dataprep.images.settings import ImageSettings
    from dataprep.settings import BuildSettings

    t0 = time.perf_counter()
    if spec["kind"] == "folder":
        from dataprep.sources import scan_folder

        source = scan_folder(spec["path"])
    elif spec["kind"] == "webdataset":
        from dataprep.sources.webdataset import scan_webdataset

        source = scan_webdataset([spec["path"]])
    else:
        from dataprep.sources.parquet import scan_parquet

        source = scan_parquet([spec["path"]], label_column="label")
    listed = time.perf_counter() - t0
    summary = build_images(source, spec["out"], BuildSettings(workers=spec["workers"]),
                           ImageSettings(size=spec["size"], mode=spec["mode"]))
    seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "listed": listed, "written": summary.written, "driver_kib": peak_rss_kib(),
                      "worker_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))


def peak_rss_kib() -> int:
    """This process's peak RSS: VmHWM, which exec resets (RUSAGE_SELF's ru_maxrss keeps the peak of the
    process that was exec'ed over, here the benchmark's parent holding the Parquet table it wrote)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def measure(spec: dict, out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    p = subprocess.run([sys.executable, __file__, "--child", json.dumps({**spec, "out": str(out)})],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"the build of {spec['path']} failed:\n{p.stderr[-3000:]}")
    shutil.rmtree(out, ignore_errors=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", default=str(HERE.parents[1] / "shared" / "corpus" / "images"))
    ap.add_argument("--repeat", type=int, default=4, help="list every photo this many times (bigger units)")
    ap.add_argument("--limit", type=int, default=None, help="only the first N photos (a smoke run)")
    ap.add_argument("--small", type=int, default=64, help="photos per small tar and rows per small row group")
    ap.add_argument("--gzip", action="store_true", help="also gzip tars (read in one pass per tar)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--mode", default="encoded", choices=("encoded", "raw"))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(json.loads(a.child))
        return
    corpus = Path(a.corpus)
    if not (corpus / "train").is_dir():
        print(f"corpus not found at {corpus} (expected {corpus}/train/<class>/*.JPEG); pass --corpus", file=sys.stderr)
        raise SystemExit(2)
    items = photos(corpus, a.repeat, a.limit)
    base = Path(tempfile.mkdtemp(prefix="bench-sources-"))
    try:
        specs = write_sources(base, items, a.small, a.gzip)
        total = sum(f.stat().st_size for _, f in items)
        quarter_bytes = sum(f.stat().st_size for _, f in items[: max(1, len(items) // 4)])  # write_sources' quarter units
        print(f"{len(items)} photos ({total / 1e6:.0f} MB of JPEG; {len(items) // a.repeat if a.repeat else 0} files x {a.repeat}), "
              f"size {a.size} {a.mode}, {a.workers} workers, {a.rounds} rounds interleaved; {os.cpu_count()} cores, "
              f"load {os.getloadavg()[0]:.2f}")
        runs: dict[str, list[dict]] = {k: [] for k in specs}
        for r in range(a.rounds):  # interleaved, so drift in the machine's load hits every source alike
            for name, spec in specs.items():
                if spec.get("quarter") and r:  # measured for its peak RSS only: once
                    continue
                runs[name].append(measure({**spec, "workers": a.workers, "size": a.size, "mode": a.mode}, base / "pack"))
        med = {k: {f: statistics.median(r[f] for r in v) for f in ("seconds", "listed", "driver_kib", "worker_kib")}
               for k, v in runs.items()}
        peak = {k: max(m["driver_kib"], m["worker_kib"]) / 1024 for k, m in med.items()}
        folder = len(items) / med["folder"]["seconds"]
        print(f"{'source':<22} {'images/s':>9} {'vs folder':>9} {'listing s':>9} {'driver MB':>9} {'worker MB':>9}")
        for k, m in med.items():
            if specs[k].get("quarter"):
                continue
            written = sorted({x["written"] for x in runs[k]})
            rate = len(items) / m["seconds"]
            print(f"{k:<22} {rate:9.0f} {rate / folder:9.2f} {m['listed']:9.2f} {m['driver_kib'] / 1024:9.0f} "
                  f"{m['worker_kib'] / 1024:9.0f}" + ("" if written == [len(items)] else f"   written {written}"))
        print("goal: every source >= 0.90 of build folder at the same workers and options (a big gzip tar or row "
              "group is one task: one worker)")
        small_peak = max(peak.get(f"tars of {a.small}", 0), peak.get(f"row groups of {a.small}", 0))
        print(f"peak RSS (the larger of driver and worker) of one unit of {len(items)} photos ({total / 1e6:.0f} MB) "
              f"against the same unit of a quarter of them; goal: no growth with the unit (small units: "
              f"{small_peak:.0f} MB at the most):")
        for k, spec in specs.items():
            if spec.get("big") and not spec.get("quarter"):
                q = f"quarter {spec['big']}"
                grow = (peak[k] - peak[q]) / ((total - quarter_bytes) / 2**20)
                print(f"  {spec['big']:<18} {peak[q]:6.0f} MB -> {peak[k]:6.0f} MB  ({grow * 100:+.0f} MB per 100 MB more in the unit)")
        print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
