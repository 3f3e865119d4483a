"""`dataprep plan`: how much RAM a training-input configuration needs, before starting it."""
from __future__ import annotations

import json

import click

from ..errors import brief
from ..options import COUNT_MAX
from ..serve.cache import CACHE_MODES
from .numbers import Ranged


def _shape(ctx, param, value):
    if value is None:
        return None
    try:
        shape = tuple(int(v) for v in value.lower().split("x"))
    except ValueError:
        shape = ()
    if not shape or any(not 0 <= s <= COUNT_MAX for s in shape):
        raise click.BadParameter(f"{brief(value)} is not a shape like 512x512x3 (each side from 0 to {COUNT_MAX})", ctx, param)
    return shape


def _crop(ctx, param, value):
    shape = _shape(ctx, param, value)
    if shape is None:
        return None
    if len(shape) == 1:
        shape = shape * 2
    if len(shape) != 2 or min(shape) < 1:
        raise click.BadParameter(f"{value!r} is not a crop like 224 or 224x192", ctx, param)
    return shape


@click.command()
@click.argument("pack", required=False)
@click.option("--split", default="train", show_default=True)
@click.option("--crop", callback=_crop, help="Image packs: plan at the crop the Loader serves, e.g. 224 or 224x192 "
              "[default: the stored shape; a variable-size pack at its median shorter side].")
@click.option("--resolution", type=Ranged(lo=1, hi=COUNT_MAX), default=None,
              help="A multi-resolution image pack: plan at this size [default: the largest].")
@click.option("--context", type=Ranged(lo=1, hi=COUNT_MAX), default=None, help="Token packs: tokens per window [default: 1024].")
@click.option("--shape", callback=_shape, help="Image shape per sample, e.g. 512x512x3 (instead of a PACK).")
@click.option("--dtype", default="uint8", show_default=True, help="Image dtype as served.")
@click.option("--mask-shape", callback=_shape, help="Mask shape per sample, e.g. 512x512.")
@click.option("--mask-dtype", default="uint8", show_default=True, help="Mask dtype as served.")
@click.option("--samples", type=Ranged(lo=0, hi=COUNT_MAX), default=0, help="Samples in the cache (with --shape).")
@click.option("--batch-size", "-b", type=Ranged(lo=1, hi=COUNT_MAX), default=32, show_default=True)
@click.option("--workers", "-w", type=Ranged(lo=0, hi=COUNT_MAX), default=8, show_default=True)
@click.option("--prefetch", type=Ranged(lo=1, hi=COUNT_MAX), default=2, show_default=True, help="DataLoader prefetch_factor.")
@click.option("--cache", type=click.Choice(CACHE_MODES), default="ram", show_default=True)
@click.option("--ranks", type=Ranged(lo=1, hi=COUNT_MAX), default=1, show_default=True, help="Training processes on this machine.")
@click.option("--ram-per-node", callback=lambda c, p, v: None if v is None else _bytes(c, p, v),
              help="A node's RAM budget (e.g. 256G): say how many nodes a partitioned cache "
                   "(partition='node') needs to hold the PACK, each node its part.")
@click.option("--json", "as_json", is_flag=True, help="Print every figure in exact bytes, as JSON.")
def plan(pack, split, crop, resolution, context, shape, dtype, mask_shape, mask_dtype, samples, batch_size, workers,
         prefetch, cache, ranks, ram_per_node, as_json):
    """Bytes per sample and batch, in flight across workers, the cache, the total, and whether it fits: for
    image, mask and volume packs, token packs (windows) and table packs (rows), or a --shape."""
    from ..bench.plan import MemoryPlan, Part, parts_from_pack
    from ..serve.cache import available_ram

    notes: list[str] = []
    from ..remote.urls import is_url

    if pack and is_url(pack):  # the manifest and the (small) shapes arrays, fetched into a temporary copy
        from ..remote.packs import local_copy

        def shapes(rel: str) -> bool:
            return rel.startswith(f"{split}/") and rel.rsplit("/", 1)[-1].startswith("shapes")

        with local_copy(pack, which=shapes) as (rp, local, _):
            parts, cache_bytes, notes = parts_from_pack(local, split, crop, resolution, context)
        pack_for_nodes = rp.manifest
    elif pack:
        parts, cache_bytes, notes = parts_from_pack(pack, split, crop, resolution, context)
    elif shape:
        if crop or resolution or context:
            raise click.UsageError("--crop, --resolution and --context plan a PACK; with --shape, give the shape served")
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
    nodes = None
    if ram_per_node is not None:
        if not pack:
            raise click.UsageError("--ram-per-node parts a PACK's shards over nodes: give the PACK")
        from ..bench.plan import human, nodes_needed
        from ..pack.backends import read_manifest

        in_flight = p.in_flight + (p.cache_total - p.cache_bytes)  # ram: the other ranks' copies
        manifest = pack_for_nodes if is_url(pack) else read_manifest(pack)
        n, part = nodes_needed(manifest, split, cache_bytes, ram_per_node, in_flight)
        nodes = {"ram_per_node": ram_per_node, "nodes": n, "largest_part": part}
        line = (f"nodes at {human(ram_per_node)} a node: {n} (partition='node': the largest part {human(part)} + "
                f"{human(in_flight)} in flight a node)" if n else
                f"nodes at {human(ram_per_node)} a node: none suffices (one shard a node still needs {human(part)} + "
                f"{human(in_flight)} in flight): rebuild with a smaller --shard-size")
    if as_json:
        click.echo(json.dumps({**p.to_dict(), **({"partition": nodes} if nodes else {})}, indent=1))
        return
    for line_ in p.lines():
        click.echo(line_)
    if nodes:
        click.echo(line)


def _bytes(ctx, param, value: str) -> int:
    """"256G", "512M", "1.5T", or a number of bytes (limits.parse_bytes: inf, nan and 1e400 refused)."""
    from ..errors import DataprepError
    from ..limits import parse_bytes

    try:
        return parse_bytes(value)
    except DataprepError as e:
        raise click.BadParameter(str(e), ctx, param) from None
