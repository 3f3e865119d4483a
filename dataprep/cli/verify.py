"""`dataprep verify PACK`: prove a pack is the one that was built; exit 0 only when everything holds."""
from __future__ import annotations

import click


@click.command()
@click.argument("pack", type=click.Path())
@click.option("--decode", is_flag=True, help="Also decode every stored JPEG and check its shape.")
@click.pass_context
def verify(ctx, pack, decode):
    """Check the manifest, every shard file's sha256, headers, offsets, shapes and label range."""
    from ..verify import verify_pack

    rep = verify_pack(pack, decode=decode)
    for path, what in rep.problems:
        click.echo(f"BAD {path}: {what}")
    summary = (f"{rep.shards} shards, {rep.files} files, {rep.bytes / 1e6:.1f} MB, {rep.samples} samples"
               + (f", {rep.decoded} images decoded" if decode else ""))
    if rep.ok:
        click.echo(f"ok: {pack}: {summary}")
    else:
        click.echo(f"FAILED: {pack}: {len(rep.problems)} problem(s) in {summary}", err=True)
        ctx.exit(1)
