"""The `dataprep` command line: a thin layer that parses, builds settings objects and calls the library.

Subcommands are imported only when invoked, so `dataprep --help` never imports torch or OpenCV.
Exit codes: 0 success, 1 a DataprepError (message names the file and the reason), 2 a usage error
(click's, or a dataprep.UsageError), 130 interrupted.
"""
from __future__ import annotations

import importlib

import click

from ..errors import DataprepError, UsageError, spelled_as_flags


class LazyGroup(click.Group):
    """A group whose subcommands live in modules loaded on first use."""

    def __init__(self, *args, lazy: dict[str, tuple[str, str]] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx):
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx, name):
        if name in self.lazy:
            mod, attr = self.lazy[name]
            return getattr(importlib.import_module(mod), attr)
        return super().get_command(ctx, name)

    def invoke(self, ctx):
        try:
            with spelled_as_flags():  # a message that says what to pass names the flag (--overwrite, not overwrite=True)
                return super().invoke(ctx)
        except UsageError as e:  # an option value the front door refused: exit 2, as click's own checks do
            raise click.UsageError(str(e)) from None
        except DataprepError as e:
            raise click.ClickException(str(e)) from None


@click.group(
    cls=LazyGroup,
    lazy={
        "build": ("dataprep.cli.build", "build"),
        "info": ("dataprep.cli.info", "info"),
        "demo": ("dataprep.cli.demo", "demo"),
        "verify": ("dataprep.cli.verify", "verify"),
        "plan": ("dataprep.cli.plan", "plan"),
        "table": ("dataprep.cli.table", "table"),
        "bench": ("dataprep.cli.bench", "bench"),
        "tokenize": ("dataprep.cli.tokenize", "tokenize"),
        "convert": ("dataprep.cli.convert", "convert"),
        "cache": ("dataprep.cli.cache", "cache"),
        "audit": ("dataprep.cli.audit", "audit"),
    },
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(package_name="dataprep", message="%(prog)s %(version)s")
def main() -> None:
    """Preprocess datasets once, offline, and serve them to PyTorch from RAM."""
