"""`--format npy|hdf5|zarr` and `--compress` on every build command: builds write npy shards (parallel,
atomic, resumable), and a pack of another backend is converted from them at the end."""
from __future__ import annotations

import contextlib
from typing import Iterator

import click

from ..output import COMPRESSIONS
from ..output import staged_output as _staged
from ..pack.backends import BACKENDS


def storage_options(f=None, *, dest: str = "fmt"):
    """Add `--format` (passed as `dest`) and `--compress`; `@storage_options` or `@storage_options(dest=...)`."""
    if f is None:
        return lambda g: storage_options(g, dest=dest)
    opts = [
        click.option("--format", dest, type=click.Choice(list(BACKENDS)), default="npy", show_default=True,
                     help="; ".join(f"{b.name}: {b.help}" for b in BACKENDS.values()) + ". Any of them serves the same samples."),
        click.option("--compress", type=click.Choice(COMPRESSIONS), default="none", show_default=True,
                     help="; ".join(f"{b.name}: {' or '.join(b.compressions[1:])}" for b in BACKENDS.values() if len(b.compressions) > 1)
                          + " (JPEG bytes stay as they are); compressed packs cannot be mapped."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


@contextlib.contextmanager
def staged_output(out, fmt: str, compress: str, overwrite: bool, engine=None, resume: bool = False,
                  progress: bool | None = None) -> Iterator:
    """dataprep/output.py's staged_output for a command: what the conversion or upload did is printed after it."""
    said: list[str] = []
    with _staged(out, fmt, compress, overwrite, engine, resume, progress, said) as target:
        yield target
    for line in said:
        click.echo(line)
