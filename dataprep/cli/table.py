"""`dataprep table SRC... --target COL --out DIR`: a table (CSV, Parquet, ...) becomes typed arrays once;
the work is dataprep.build.table's, whose TABLE_OPTIONS give the defaults."""
from __future__ import annotations

import math

import click

from ..build import TABLE_OPTIONS as T
from ..tables.columns import MISSING
from ..tables.read import READERS
from .config import config_option
from .engine import engine_options
from .numbers import Finite, Ranged
from .progress import progress_option
from .storage import storage_options


@click.command()
@click.argument("src", nargs=-1, required=True, type=click.Path())
@click.option("--target", required=True, help="Target column: a name, or a position (-1 = last) without a header.")
@click.option("--out", "-o", required=True, type=click.Path(), help="Pack to create: a directory (npy, zarr) or an .h5 file (hdf5).")
@click.option("--task", type=click.Choice(["auto", "classification", "regression"]), default=T["task"], show_default=True,
              help="auto: text, integer and boolean targets are classes; float targets are regression.")
@click.option("--input-format", "input_format", type=click.Choice(sorted(READERS)), default=T["input_format"],
              help="How to parse the files [default: from the file name].")
@click.option("--sep", default=T["sep"], show_default=True, help="CSV separator: a character, 'space', or 'auto' to sniff.")
@click.option("--header", default=T["header"], show_default=True, help="'infer', 'none', or the header's line number.")
@click.option("--skip-rows", type=Ranged("skip_rows"), default=T["skip_rows"], help="Lines to skip first (e.g. a line that is not column names).")
@click.option("--names", default=None, help="Comma-separated column names (the files then have no header).")
@click.option("--target-file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="The target as a one-column file of the same rows (e.g. sklearn's diabetes_target.csv.gz).")
@click.option("--missing", type=click.Choice(MISSING), default=T["missing"], show_default=True,
              help="Missing values: fail, fill with the column's train mean, with --fill-value, or 0 plus a mask array.")
@click.option("--fill-value", type=Finite(-math.inf, math.inf), default=T["fill_value"], show_default=True)
@click.option("--float-dtype", type=click.Choice(["float32", "float64", "float16"]), default=T["float_dtype"], show_default=True)
@click.option("--datetime", type=click.Choice(["parts", "int64"]), default=T["datetime"], show_default=True)
@click.option("--categorical", default=None, help="Comma-separated columns to treat as categories.")
@click.option("--numeric", default=None, help="Comma-separated columns that must be numbers.")
@click.option("--dates", default=None, help="Comma-separated columns to parse as datetimes (text that looks like dates is "
              "otherwise kept as categories, with a note).")
@click.option("--drop", default=None, help="Comma-separated columns to leave out.")
@click.option("--val-fraction", type=Finite(0, 1, below=True), default=T["val_fraction"], show_default=True)
@click.option("--split-column", default=None, help="A column naming each row's split (instead of --val-fraction).")
@click.option("--seed", type=Ranged("seed"), default=T["seed"], show_default=True)
@click.option("--max-categories", type=Ranged("max_categories"), default=T["max_categories"], show_default=True,
              help="Codes per categorical column; rarer values beyond it share the code of '<other>' (0: no limit).")
@click.option("--drop-missing-target", is_flag=True,
              help="Leave out rows whose target is missing (counted in the summary and the manifest) instead of failing.")
@click.option("--keep-ids", is_flag=True,
              help="Keep columns whose values are all distinct (IDs; left out by default) as categories or numbers.")
@click.option("--overwrite", is_flag=True)
@click.option("--workers", "-j", type=Ranged("workers"), default=T["workers"], show_default=True,
              help="Processes reading files for the local engine (one file per task), or the local Dask cluster's size.")
@progress_option
@config_option
@engine_options
@storage_options
def table(src, target, out, **kw):
    """Convert tables to typed arrays: floats, integer codes with vocabularies, statistics, splits."""
    from .. import build as front
    from .build import run_front_door

    run_front_door(front.table, src, out, target=target, **kw)
