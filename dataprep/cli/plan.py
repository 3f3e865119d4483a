"""`dataprep plan`: how much RAM a training-input configuration needs, before starting it."""
from __future__ import annotations

import click

from ..serve.cache import CACHE_MODES


def _shape(ctx, param, value):
    if value is None:
        return None
    try:
        return tuple(int(v) for v in value.lower().split("x"))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a shape like 512x512x3", ctx, param) from None


@click.command()
@click.argument("pack", type=click.Path(exists=True), required=False)
@click.option("--split", default="train", show_default=True)
@click.option("--shape", callback=_shape, help="Image shape per sample, e.g. 512x512x3 (instead of a PACK).")
@click.option("--dtype", default="uint8", show_default=True, help="Image dtype as served.")
@click.option("--mask-shape", callback=_shape, help="Mask shape per sample, e.g. 512x512.")
@click.option("--mask-dtype", default="uint8", show_default=True, help="Mask dtype as served.")
@click.option("--samples", type=click.IntRange(0), default=0, help="Samples in the cache (with --shape).")
@click.option("--batch-size", "-b", type=click.IntRange(1), default=32, show_default=True)
@click.option("--workers", "-w", type=click.IntRange(0), default=8, show_default=True)
@click.option("--prefetch", type=click.IntRange(1), default=2, show_default=True, help="DataLoader prefetch_factor.")
@click.option("--cache", type=click.Choice(CACHE_MODES), default="ram", show_default=True)
@click.option("--ranks", type=click.IntRange(1), default=1, show_default=True, help="Training processes on this machine.")
def plan(pack, split, shape, dtype, mask_shape, mask_dtype, samples, batch_size, workers, prefetch, cache, ranks):
    """Bytes per sample and batch, in flight across workers, the cache, the total, and whether it fits."""
    from ..bench.plan import MemoryPlan, Part, parts_from_pack
    from ..serve.cache import available_ram

    notes: list[str] = []
    if pack:
        parts, cache_bytes, notes = parts_from_pack(pack, split)
    elif shape:
        parts = [Part("image", shape, dtype, "float32")]
        cache_bytes = parts[0].nbytes * samples
    else:
        raise click.UsageError("give a PACK, or --shape (with --samples for the cache)")
    if mask_shape:
        mask = Part("mask", mask_shape, mask_dtype, "int64")
        parts.append(mask)
        if not pack:
            cache_bytes += mask.nbytes * samples
    p = MemoryPlan(parts, batch_size, workers, prefetch, cache, cache_bytes, ranks, available_ram(), notes)
    for line in p.lines():
        click.echo(line)
