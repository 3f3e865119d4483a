"""Held batches (issue 35): what keeping served batches intact costs. The Loader of this tree is timed
beside the Loader of a baseline commit (the ring before the hold check), in interleaved rounds of one run:
a loop that drops each batch (the common training loop: it should cost nothing measurable) and a loop
that keeps every batch of an epoch (`list(loader)`: correct now, and its cost against the dropping loop
and against `copy=True`, what a user kept batches with before).

    .venv/bin/python benchmarks/bench_held.py [--baseline 4823a28] [--images 6000] [--rounds 9]

Packs: decoded 64 px images (a batch is a gather: where per-batch bookkeeping shows most) and 96 px JPEGs
served through RandomResizedCrop(64) and flips (decoding dominates). Batches of 64; 0 and 2 workers.
Each figure is the median img/s of `rounds` epochs, with the range; the ratio is of the medians. The
baseline's kept batches are checked too, and their wrong samples counted (what the old ring served).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import dataprep  # noqa: E402
from dataprep.images.build import build_images  # noqa: E402
from dataprep.images.settings import ImageSettings  # noqa: E402
from dataprep.serve.loader import Loader  # noqa: E402
from dataprep.settings import BuildSettings  # noqa: E402
from dataprep.sources import scan_imagenet  # noqa: E402
from dataprep.synthetic import decode_index, write_tree  # noqa: E402

BATCH = 64


def baseline_loader(rev: str, tmp: Path):
    """The Loader class of serve/loader.py at `rev`, imported beside this tree's (its relative imports
    resolve to this tree's serve/ modules, which the hold check did not change)."""
    src = subprocess.run(["git", "-C", str(HERE.parent), "show", f"{rev}:dataprep/serve/loader.py"],
                         capture_output=True, text=True, check=True).stdout
    path = tmp / "loader_baseline.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("dataprep.serve.loader_baseline", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod.Loader


def epoch(loader, keep: bool) -> tuple[float, list]:
    t0 = time.perf_counter()
    if keep:
        kept = list(loader)
    else:
        kept = []
        for _batch in loader:
            pass
    return time.perf_counter() - t0, kept


def wrong(kept) -> int:
    """Kept samples whose pixels no longer encode their index (index images encode i modulo 1024)."""
    return sum(decode_index(im.permute(1, 2, 0).numpy()) != int(i) % 1024 for x, _y, idx in kept for im, i in zip(x, idx))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", default="4823a28", help="commit whose Loader is the baseline")
    ap.add_argument("--images", type=int, default=6000)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-held-"))
    try:
        Old = baseline_loader(args.baseline, tmp)
        per = max(1, args.images // 8)
        write_tree(tmp / "idx", classes=8, per_class=per, sizes=((64, 64),), kind="index", ext=".png")
        build_images(scan_imagenet(tmp / "idx"), tmp / "raw", BuildSettings(shard_size=1000, workers=2),
                     ImageSettings(size=64, resize="center-crop", mode="raw"))
        write_tree(tmp / "ph", classes=8, per_class=per // 2, sizes=((120, 160), (160, 120)))
        build_images(scan_imagenet(tmp / "ph"), tmp / "jpeg", BuildSettings(shard_size=1000, workers=2), ImageSettings(size=96))
        raw = dataprep.InMemoryImageDataset(tmp / "raw")
        jpeg = dataprep.InMemoryImageDataset(tmp / "jpeg")
        cases = {
            "raw 64 px, 0 workers": (raw, 0, {}),
            "raw 64 px, 2 workers": (raw, 2, {}),
            "jpeg RRC 64, 2 workers": (jpeg, 2, {"crop": dataprep.RandomResizedCrop(64), "flip": True}),
        }
        print(f"# load average at start: {os.getloadavg()[0]:.2f}; baseline {args.baseline}; batch {BATCH}; "
              f"{args.rounds} interleaved rounds")
        for name, (ds, workers, kw) in cases.items():
            loaders = {"baseline": Old(ds, BATCH, shuffle=True, num_workers=workers, indices=True, **kw),
                       "this tree": Loader(ds, BATCH, shuffle=True, num_workers=workers, indices=True, **kw),
                       "copy=True": Loader(ds, BATCH, shuffle=True, num_workers=workers, indices=True, copy=True, **kw)}
            times = {(who, keep): [] for who in loaders for keep in (False, True)}
            bad = {who: 0 for who in loaders}
            for ld in loaders.values():  # warm-up: fork workers, fill the cache
                epoch(ld, False)
            for _ in range(args.rounds):
                for keep in (False, True):
                    for who, ld in loaders.items():
                        dt, kept = epoch(ld, keep)
                        times[(who, keep)].append(len(ds) / dt)
                        if keep and "RRC" not in name:
                            bad[who] = max(bad[who], wrong(kept))
                        del kept
            print(f"\n{name} ({len(ds)} images an epoch)")
            med = {k: statistics.median(v) for k, v in times.items()}
            for (who, keep), v in times.items():
                note = f", {bad[who]} wrong samples in a kept epoch" if keep and "RRC" not in name else ""
                print(f"  {who:9s} {'keeps' if keep else 'drops'} batches: {med[(who, keep)]:8.0f} img/s "
                      f"(range {min(v):.0f}-{max(v):.0f}){note}")
            print(f"  drop loop, this tree / baseline: {med[('this tree', False)] / med[('baseline', False)]:.3f}")
            print(f"  this tree, keep / drop: {med[('this tree', True)] / med[('this tree', False)]:.3f}; "
                  f"keep, this tree / copy=True: {med[('this tree', True)] / med[('copy=True', True)]:.3f}")
            for ld in loaders.values():
                ld.close()
        print(f"\n# load average at end: {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
