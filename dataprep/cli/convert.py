"""`dataprep convert PACK --to hdf5|zarr|npy --out PATH`: the same pack in another storage backend."""
from __future__ import annotations

import click

from ..errors import DataprepError
from ..pack.backends import BACKENDS
from .engine import engine_for, engine_options
from .numbers import Ranged
from .progress import progress_option, shown
from .storage import COMPRESSIONS


@click.command()
@click.argument("pack", type=click.Path())
@click.option("--to", "to", type=click.Choice(list(BACKENDS)), required=True, help="The backend to write.")
@click.option("--out", "-o", required=True, type=click.Path(), help="An .h5 file, a Zarr directory, or an npy pack directory.")
@click.option("--compress", type=click.Choice(COMPRESSIONS), default="none", show_default=True,
              help="hdf5: gzip or lzf; zarr: zstd or blosc (JPEG bytes are stored as they are). Compressed packs cannot be mapped (cache='mmap').")
@click.option("--overwrite", is_flag=True, help="Replace a pack already at --out.")
@click.option("--workers", "-j", type=Ranged("workers"), default=1, show_default=True, help="Parallel chunk writers (zarr).")
@progress_option
@engine_options
def convert(pack, to, out, compress, overwrite, workers, engine, address, scheduler_file, progress):
    """Convert a pack between backends without decoding: arrays copied, checksums checked."""
    import time

    from ..pack.convert import convert as run
    from ..remote.urls import is_url, redact

    t0 = time.perf_counter()
    try:
        with engine_for(engine, workers, address, scheduler_file) as eng:
            show = shown(progress)
            if is_url(pack) or is_url(out):
                from ..remote.convert import convert_remote

                r = convert_remote(pack, out, to, compress, eng, overwrite, progress=show)
            else:
                r = run(pack, out, to, compress, eng, overwrite, progress=show)
    except DataprepError as e:
        if not getattr(e, "hdf5_unclean", False):
            raise
        # HDF5 met a full disk mid-write: its library may crash this interpreter as it shuts down, after the
        # message; so the message, then an exit that skips HDF5's teardown (the engine is closed already)
        import os
        import sys

        click.echo(f"Error: {e}", err=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    except OSError as e:  # a full disk the layers below did not name: still one line, not a traceback
        from ..pack.convert import disk_refused, write_failure

        if not disk_refused(e):
            raise
        raise write_failure(e, getattr(e, "filename", None) or redact(str(out)),
                            "free space on that disk (or choose another --out, or DATAPREP_CACHE_DIR for a URL's copy)") from None
    click.echo(f"{redact(str(pack))} ({r['from']}) -> {redact(str(out))} ({r['to']}{', ' + compress if compress != 'none' else ''}): "
               f"{r['bytes'] / 1e6:.1f} MB in {time.perf_counter() - t0:.1f} s")
