"""`--engine local|dask`, `--address`, `--scheduler-file`: where a command's tasks run."""
from __future__ import annotations

import click

from ..engine import ENGINES


def engine_options(f):
    """Add the engine options (one definition for build, tokenize and table)."""
    opts = [
        click.option("--engine", type=click.Choice(list(ENGINES)), default="local", show_default=True,
                     help="local: a process pool here; dask: a Dask cluster (pip install 'dataprep[dask]'), started "
                          "on 127.0.0.1 for the run unless --address or --scheduler-file names one. Same output either way."),
        click.option("--address", default=None, help="Scheduler of an existing Dask cluster, e.g. tcp://10.0.0.5:8786 (never shut down)."),
        click.option("--scheduler-file", type=click.Path(dir_okay=False), default=None,
                     help="Scheduler file of an existing Dask cluster (dask-jobqueue, `dask scheduler --scheduler-file`)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def engine_for(engine: str, workers: int, address: str | None, scheduler_file: str | None):
    """The engine, open for the command's duration; where the tasks run is said on stderr when that is
    not this machine's process pool."""
    from ..engine import open_engine

    return open_engine(engine, workers, address, scheduler_file, say=lambda line: click.echo(line, err=True))
