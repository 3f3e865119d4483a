"""`dataprep verify PACK`: prove a pack is the one that was built; exit 0 only when everything holds."""
from __future__ import annotations

import click

from .progress import progress_option, shown


@click.command()
@click.argument("pack", type=click.Path())
@click.option("--decode", is_flag=True,
              help="Also decode every stored JPEG (OpenCV) and check that it decodes to the shape recorded for it: "
                   "proof that the stored bytes are whole, decodable JPEGs. It cannot prove a source image was intact: "
                   "a damaged source that decoded at build time (e.g. a corrupt file that came out half black) was "
                   "stored as that picture, a valid JPEG, and nothing in the pack can tell. Damage the build's decoder "
                   "reports (truncated files, corrupt data) is caught at build time, where the file is skipped with its "
                   "reason (dataprep info --skipped). Packs of decoded pixels hold no JPEG to decode.")
@progress_option
@click.pass_context
def verify(ctx, pack, decode, progress):
    """Check the manifest, every shard file's sha256, headers, offsets, shapes and label range: that the pack
    holds exactly the bytes its build wrote. The source files are not read: whether a source was intact is
    checked at build time, not here."""
    from ..remote.urls import is_url
    from ..verify import verify_pack

    try:
        if is_url(pack):
            from ..verify import verify_remote

            rep, pack = verify_remote(pack, decode=decode, progress=shown(progress))
        else:
            rep = verify_pack(pack, decode=decode, progress=shown(progress))
    except OSError as e:  # the local copy of a URL met a full disk the fetch did not name: one line still
        from ..pack.convert import disk_refused, write_failure
        from ..remote.cachedir import cache_root

        if not disk_refused(e):
            raise
        raise write_failure(e, getattr(e, "filename", None) or cache_root(create=False),
                            "free space there, or set DATAPREP_CACHE_DIR to a disk with room for the copy") from None
    for path, what in rep.problems:
        click.echo(f"BAD {path}: {what}")
    summary = (f"{rep.shards} shards, {rep.files} files, {rep.bytes / 1e6:.1f} MB, {rep.samples} samples"
               + (f", {rep.decoded} images decoded" if decode else ""))
    if rep.copy_of is not None:  # a disk: cache copy: what it holds is checked, what it does not hold is said
        summary += (f"; a partial copy of {rep.copy_of}: {rep.left_out} files of the pack are not held here (a load "
                    "fetches them when it needs them) and were not checked" if rep.left_out else
                    f"; a copy of {rep.copy_of}, every file of the pack held")
    if rep.ok:
        click.echo(f"ok: {pack}: {summary}")
    else:
        click.echo(f"FAILED: {pack}: {len(rep.problems)} problem(s) in {summary}", err=True)
        ctx.exit(1)
