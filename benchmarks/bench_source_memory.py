"""Peak memory of reading one big unit (issue 23): a Parquet row group, a plain tar and a gzip tar of N
cells of `--kb` KB each, read whole through dataprep's readers (sources/parquet.py TableReader,
sources/webdataset.py TarReader), for several N. Each read runs in a fresh process (the file written by
another), which prints its peak RSS (VmHWM) before and after the read; the goal is a peak that stops
growing with the unit.

    .venv/bin/python benchmarks/bench_source_memory.py [--rows 1000,3000,9000] [--kb 100]

A Parquet reader holds at least one data page, and writers close a page only every 1,024 values (pyarrow's
write_batch_size), so a row group of big cells costs about a page of 1,024 cells however many rows it has.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def status(*keys: str) -> dict[str, int]:
    out = {}
    for line in open("/proc/self/status"):
        k, _, v = line.partition(":")
        if k in keys:
            out[k] = int(v.split()[0]) // 1024
    return out


def write(kind: str, path: str, rows: int, kb: int) -> None:
    import io
    import tarfile

    import numpy as np

    rng = np.random.default_rng(0)
    cells = (rng.integers(0, 256, kb * 1000, dtype=np.uint8).tobytes() for _ in range(rows))
    if kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        cells = list(cells)
        table = pa.table({"image": pa.array(cells, pa.binary()), "label": pa.array([i % 5 for i in range(rows)])})
        pq.write_table(table, path, row_group_size=rows, use_dictionary=False)
        return
    with tarfile.open(path, "w:gz" if kind == "gzip tar" else "w") as tf:
        for i, data in enumerate(cells):
            for ext, b in (("jpg", data), ("cls", str(i % 5).encode())):
                ti = tarfile.TarInfo(f"{i:07d}.{ext}")
                ti.size = len(b)
                tf.addfile(ti, io.BytesIO(b))


def read(kind: str, path: str) -> None:
    if kind == "parquet":
        from dataprep.sources.parquet import scan_parquet

        src = scan_parquet([path], image_column="image", label_column="label")
    else:
        from dataprep.sources.webdataset import scan_webdataset

        src = scan_webdataset([path])
    sp = src.splits[0]
    before = status("VmHWM")["VmHWM"]
    n = sum(len(d) for d in sp.reader.open(str(src.root), sp.paths, sp.locators))
    print(before, status("VmHWM")["VmHWM"], n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="1000,3000,9000")
    ap.add_argument("--kb", type=int, default=100)
    ap.add_argument("--child", nargs=3, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        mode, kind, path = a.child
        (write(kind, path, int(os.environ["ROWS"]), a.kb) if mode == "write" else read(kind, path))
        return
    print(f"one unit of N cells of {a.kb} KB read whole, peak RSS of a fresh process; load {os.getloadavg()[0]:.2f}")
    print(f"{'unit':10s} {'rows':>6s} {'unit MB':>8s} {'RSS before':>11s} {'peak RSS':>9s}")
    with tempfile.TemporaryDirectory(prefix="bench-srcmem-") as tmp:
        for kind in ("parquet", "tar", "gzip tar"):
            for rows in (int(r) for r in a.rows.split(",")):
                path = os.path.join(tmp, "unit.parquet" if kind == "parquet" else "unit.tar")
                env = {**os.environ, "ROWS": str(rows)}
                subprocess.run([sys.executable, __file__, "--kb", str(a.kb), "--child", "write", kind, path], env=env, check=True)
                out = subprocess.run([sys.executable, __file__, "--kb", str(a.kb), "--child", "read", kind, path],
                                     capture_output=True, text=True, check=True).stdout.split()
                before, peak, n = int(out[0]), int(out[1]), int(out[2])
                assert n == rows * a.kb * 1000, (kind, rows, n)
                print(f"{kind:10s} {rows:6,d} {os.path.getsize(path) / 1e6:8,.0f} {before:9,d} MB {peak:7,d} MB")
                os.remove(path)
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
