"""`dataprep bench PACK`: serving speed of the workload training runs (the Loader with a crop and flip) per
path, workers and batch size; limits; the bound; a plot; the pick and the workload it is for. Any kind:
images (decoded pixels, or JPEG per decode= value), token windows, table rows."""
from __future__ import annotations

import json
from pathlib import Path

import click

from ..options import COUNT_MAX, bounds
from ..serve.cache import CACHE_MODES
from .numbers import Finite, Ranged
from .profile import profile_option


def _ints(lo: int, hi: int):
    """A callback reading a list like 0,1,2 of integers from `lo` to `hi` (Ranged's check on each)."""
    each = Ranged(lo=lo, hi=hi)

    def read(ctx, param, value):
        return [each.convert(v, param, ctx) for v in value.split(",")] if value else None

    return read


@click.command()
@click.argument("pack", type=click.Path(exists=True))
@click.option("--workers", default=None, callback=_ints(0, bounds("workers")[1]), help="num_workers values, e.g. 0,1,2 [default: 0 up to the cores].")
@click.option("--batch-sizes", default=None, callback=_ints(1, COUNT_MAX), help="e.g. 64,256 [default: 64,256; 64 with --quick].")
@click.option("--paths", default=None, help="Serving paths: decode= values such as fast,accurate,pil for JPEG packs; pixels "
              "(decoded images) or gather (token windows, table rows) otherwise [default: the dataset's default decode and "
              "each that serves the workload differently].")
@click.option("--seconds", type=Finite(0, 3600), default=2.0, show_default=True, help="Measured time per setting, after a warm-up.")
@click.option("--crop", default=None, metavar="SPEC",
              help="The crop training uses, timed through the Loader: rrc:224 (RandomResizedCrop), center:224 (CenterCrop), "
                   "224 or HxW (a fixed center window) [default: none; variable-size packs: a window of their median shorter side].")
@click.option("--flip", is_flag=True, help="Time with the Loader's random horizontal flip (flip=True), as training uses it.")
@click.option("--cache", type=click.Choice(CACHE_MODES), default="ram", show_default=True)
@click.option("--context", type=Ranged(lo=1, hi=COUNT_MAX), default=None,
              help="Token packs: tokens per window [default: the dataset's, 1024].")
@click.option("--quick", is_flag=True, help="About a minute: batch 64, workers 0..2, short runs.")
@click.option("--out", type=click.Path(file_okay=False), default="dataprep-bench", show_default=True,
              help="Where bench.json and bench.png go.")
@click.option("--json", "as_json", is_flag=True,
              help="Print bench.json on stdout instead of the table: runs (with decode_paths), limits, verdicts, workload "
                   "{crop, flip, resolution, resize, decode}, and the pick with the workload it is for.")
@profile_option
def bench(pack, workers, batch_sizes, paths, seconds, crop, flip, cache, context, quick, out, as_json):
    """Time the Loader on the workload training runs (--crop, --flip, the dataset's default decode and the
    decodes that serve it differently), name what bounds each path (never more than 100% of it), and pick a
    setting for that workload."""
    from ..bench.plot import plot
    from ..bench.sweep import run_bench, table
    from ..bench.workload import parse_crop

    w, b = workers, batch_sizes
    warmup = 0.5
    if quick:
        w, b, seconds, warmup = w or [0, 1, 2], b or [64], min(seconds, 0.8), 0.3
    options = {"context": context} if context else {}
    rep = run_bench(pack, w, b, paths.split(",") if paths else None, seconds, warmup, parse_crop(crop), cache, options, flip)
    text = json.dumps(rep.to_dict(), indent=1)
    if as_json:
        click.echo(text)
    else:
        for line in table(rep):
            click.echo(line)
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    (d / "bench.json").write_text(text)
    plot(rep, d / "bench.png")
    click.echo(f"wrote {d / 'bench.json'} and {d / 'bench.png'}", err=as_json)
