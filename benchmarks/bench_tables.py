"""Tables (issue 7): batches per second of TabularDataset (batch 256, one slice per array) against the
common hand-written Dataset that builds a tensor from `df.iloc[i]` per row, same data, same run.

    .venv/bin/python benchmarks/bench_tables.py [--rows 100000] [--cols 30]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import Dataset, default_collate  # noqa: E402

from dataprep.tables.build import build_table  # noqa: E402
from dataprep.tables.columns import TableSettings  # noqa: E402
from dataprep.tables.dataset import TabularDataset  # noqa: E402

BATCH = 256


class IlocDataset(Dataset):
    """What the common advice replaces: a row of the DataFrame turned into tensors on every access."""

    def __init__(self, df, target):
        self.df, self.target = df, target
        self.features = [c for c in df.columns if c != target]

    def __len__(self):
        return len(self.df)

    def __getitem__(self, i):
        row = self.df.iloc[i]
        return torch.tensor(row[self.features].to_numpy(np.float32)), torch.tensor(int(row[self.target]))


def batches_per_s(fetch, n: int, seconds: float = 2.0) -> float:
    rng = np.random.default_rng(0)
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fetch(rng.integers(0, n, BATCH))
        done += 1
    return done / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--cols", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    df = pd.DataFrame(rng.normal(size=(a.rows, a.cols)), columns=[f"f{j}" for j in range(a.cols)])
    df["y"] = rng.integers(0, 10, a.rows)
    tmp = Path(tempfile.mkdtemp(prefix="dataprep-bench-tables-"))
    try:
        df.to_csv(tmp / "t.csv", index=False)
        build_table([str(tmp / "t.csv")], tmp / "p", TableSettings(target="y"), {})
        ds, slow = TabularDataset(tmp / "p"), IlocDataset(df, "y")
        ours = statistics.median(batches_per_s(ds.batch, a.rows) for _ in range(a.rounds))
        base = statistics.median(batches_per_s(lambda idx: default_collate([slow[int(i)] for i in idx]), a.rows) for _ in range(a.rounds))
        ratio = ours / base
        print(f"{a.rows} rows x {a.cols} float columns, batch {BATCH}, median of {a.rounds} rounds, load {os.getloadavg()[0]:.2f}:")
        print(f"  df.iloc per row + default_collate  {base:10,.1f} batches/s")
        print(f"  TabularDataset, one slice          {ours:10,.1f} batches/s")
        print(f"  ratio {ratio:,.0f}x  (target >= 100x: {'met' if ratio >= 100 else 'MISSED'})")
        return 0 if ratio >= 100 else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
