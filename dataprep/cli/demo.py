"""`dataprep demo`: the main job on a built-in default. Generates a small photo-like ImageNet tree, packs it
twice (JPEG and decoded pixels), serves both through a PyTorch DataLoader and prints what it measured."""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import click

from ..options import COUNT_MAX
from .numbers import Ranged


@click.command()
@click.option("--out", type=click.Path(file_okay=False), default=None, help="Keep the sample and packs here [default: a temporary directory].")
@click.option("--images", type=Ranged(lo=16, hi=COUNT_MAX), default=512, show_default=True, help="Synthetic train images to generate.")
@click.option("--size", type=click.IntRange(16, 1024), default=224, show_default=True, help="Pack size (center-crop).")
@click.option("--workers", "-j", type=Ranged("workers"), default=None, help="Build processes and loader workers [default: all cores].")
def demo(out, images, size, workers):
    """Build a sample dataset, pack it, serve it through a DataLoader, and print the measurements."""
    workers = workers or os.cpu_count() or 1
    if out is None:
        with tempfile.TemporaryDirectory(prefix="dataprep-demo-") as tmp:
            _run(Path(tmp), images, size, workers)
    else:
        _run(Path(out), images, size, workers)


def _run(base: Path, images: int, size: int, workers: int) -> None:
    from ..bench.serving import FileImageDataset, epoch_rate
    from ..images.build import build_images
    from ..images.dataset import InMemoryImageDataset
    from ..images.settings import ImageSettings
    from ..settings import BuildSettings
    from ..sources import scan_imagenet
    from ..synthetic import write_tree

    classes = 8
    src = base / "source"
    t0 = time.perf_counter()
    if not (src / "train").is_dir():
        write_tree(src, classes=classes, per_class=-(-images // classes))
    click.echo(f"sample: {src} ({images} photo-like JPEGs in {classes} classes, made in {time.perf_counter() - t0:.1f} s)")
    source = scan_imagenet(src)
    packs = {}
    for mode in ("encoded", "raw"):
        settings = BuildSettings(workers=workers, overwrite=True)
        summary = build_images(source, base / f"pack-{mode}", settings, ImageSettings(size=size, resize="center-crop", mode=mode))
        packs[mode] = base / f"pack-{mode}"
        click.echo("\n".join(summary.lines()))
    src_mb = sum(f.stat().st_size for f in (src / "train").rglob("*") if f.is_file()) / 1e6
    rows = []
    baseline = FileImageDataset(src / "train", size)
    best = lambda ds, batched: max((epoch_rate(ds, 64, w, batched), w) for w in sorted({0, min(2, workers)}))  # noqa: E731
    base_rate, base_w = best(baseline, False)
    rows.append(("JPEG files, decode+resize every epoch (ImageFolder-like)", base_rate, base_w, src_mb))
    enc = InMemoryImageDataset(packs["encoded"])
    r, w = best(enc, True)
    rows.append(("encoded pack in RAM, cv2 decode", r, w, enc.nbytes / 1e6))
    raw = InMemoryImageDataset(packs["raw"])
    r, w = best(raw, True)
    rows.append(("decoded pack in RAM, no decode", r, w, raw.nbytes / 1e6))
    fast = lambda ds: max((_loader_rate(ds, w), w) for w in sorted({0, min(2, workers)}))  # noqa: E731
    r, w = fast(enc)
    rows.append(("encoded pack, dataprep.Loader", r, w, enc.nbytes / 1e6))
    r, w = fast(raw)
    rows.append(("decoded pack, dataprep.Loader", r, w, raw.nbytes / 1e6))
    click.echo(f"\nOne shuffled epoch of {len(raw)} images at {size}x{size}, batch 64 (best of num_workers 0/{min(2, workers)}),"
               " through the stock DataLoader unless named:")
    click.echo(f"  {'path':58s} {'img/s':>9s} {'vs files':>9s} {'workers':>8s} {'MB held':>8s}")
    for name, rate, w, mb in rows:
        click.echo(f"  {name:58s} {rate:9.0f} {rate / base_rate:8.1f}x {w:8d} {mb:8.1f}")


def _loader_rate(ds, workers: int, epochs: int = 3) -> float:
    """Images/s of dataprep.Loader: the median of a few epochs (its workers persist between them)."""
    import statistics

    from ..serve.loader import Loader

    loader = Loader(ds, 64, shuffle=True, num_workers=workers)
    times = []
    try:
        for e in range(epochs):
            loader.set_epoch(e)
            t0 = time.perf_counter()
            for _ in loader:
                pass
            times.append(time.perf_counter() - t0)
    finally:
        loader.close()
    return len(ds) / statistics.median(times)
