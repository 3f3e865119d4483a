"""`--progress/--no-progress` on every long command: one option, one meaning (dataprep/progress.py)."""
from __future__ import annotations

import click

PROGRESS_HELP = ("Report progress on stderr: a bar on a terminal; elsewhere (nohup, SLURM, CI) a line every "
                 "$DATAPREP_PROGRESS_EVERY seconds (30) or tenth of the work, and a last one; none for work done "
                 "within a third of that [default: on].")

progress_option = click.option("--progress/--no-progress", default=None, help=PROGRESS_HELP)


def shown(progress: bool | None) -> bool:
    """Whether the option's value shows progress: on unless --no-progress."""
    return progress is not False
