"""`dataprep bench PACK`: serving speed per path, workers and batch size; limits; the bound; a plot. Any kind:
images (decoded pixels, or JPEG per decoder), token windows, table rows."""
from __future__ import annotations

import json
from pathlib import Path

import click

from ..serve.cache import CACHE_MODES
from .profile import profile_option


def _ints(value):
    return [int(v) for v in value.split(",")] if value else None


@click.command()
@click.argument("pack", type=click.Path(exists=True))
@click.option("--workers", default=None, help="num_workers values, e.g. 0,1,2 [default: 0 up to the cores].")
@click.option("--batch-sizes", default=None, help="e.g. 64,256 [default: 64,256; 64 with --quick].")
@click.option("--paths", default=None, help="Serving paths: decoders such as cv2,pil for JPEG packs; pixels (decoded "
              "images) or gather (token windows, table rows) otherwise [default: all that apply].")
@click.option("--seconds", type=float, default=2.0, show_default=True, help="Measured time per setting, after a warm-up.")
@click.option("--crop", type=int, default=None, help="Square crop for variable-size packs [default: their median shorter side].")
@click.option("--cache", type=click.Choice(CACHE_MODES), default="ram", show_default=True)
@click.option("--context", type=click.IntRange(1), default=None,
              help="Token packs: tokens per window [default: the dataset's, 1024].")
@click.option("--quick", is_flag=True, help="About a minute: batch 64, workers 0..2, short runs.")
@click.option("--out", type=click.Path(file_okay=False), default="dataprep-bench", show_default=True,
              help="Where bench.json and bench.png go.")
@profile_option
def bench(pack, workers, batch_sizes, paths, seconds, crop, cache, context, quick, out):
    """Measure serving paths on this machine and name what bounds each one (never more than 100% of it)."""
    from ..bench.plot import plot
    from ..bench.sweep import run_bench, table

    w, b = _ints(workers), _ints(batch_sizes)
    warmup = 0.5
    if quick:
        w, b, seconds, warmup = w or [0, 1, 2], b or [64], min(seconds, 0.8), 0.3
    options = {"context": context} if context else {}
    rep = run_bench(pack, w, b, paths.split(",") if paths else None, seconds, warmup, (crop, crop) if crop else None, cache,
                    options)
    for line in table(rep):
        click.echo(line)
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    (d / "bench.json").write_text(json.dumps(rep.to_dict(), indent=1))
    plot(rep, d / "bench.png")
    click.echo(f"wrote {d / 'bench.json'} and {d / 'bench.png'}")
