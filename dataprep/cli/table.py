"""`dataprep table SRC... --target COL --out DIR`: a table (CSV, Parquet, ...) becomes typed arrays once."""
from __future__ import annotations

import click

from ..tables.columns import MISSING
from ..tables.read import READERS
from .config import config_option
from .engine import engine_for, engine_options
from .progress import progress_option, shown
from .storage import staged_output, storage_options


def _list(value) -> tuple[str, ...]:
    return tuple(v.strip() for v in (value or "").split(",") if v.strip())


@click.command()
@click.argument("src", nargs=-1, required=True, type=click.Path())
@click.option("--target", required=True, help="Target column: a name, or a position (-1 = last) without a header.")
@click.option("--out", "-o", required=True, type=click.Path(), help="Pack to create: a directory (npy, zarr) or an .h5 file (hdf5).")
@click.option("--task", type=click.Choice(["auto", "classification", "regression"]), default="auto", show_default=True,
              help="auto: text, integer and boolean targets are classes; float targets are regression.")
@click.option("--input-format", "fmt", type=click.Choice(sorted(READERS)), default=None,
              help="How to parse the files [default: from the file name].")
@click.option("--sep", default="auto", show_default=True, help="CSV separator: a character, 'space', or 'auto' to sniff.")
@click.option("--header", default="infer", show_default=True, help="'infer', 'none', or the header's line number.")
@click.option("--skip-rows", type=click.IntRange(0), default=0, help="Lines to skip first (e.g. a line that is not column names).")
@click.option("--names", default=None, help="Comma-separated column names (the files then have no header).")
@click.option("--target-file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="The target as a one-column file of the same rows (e.g. sklearn's diabetes_target.csv.gz).")
@click.option("--missing", type=click.Choice(MISSING), default="error", show_default=True,
              help="Missing values: fail, fill with the column's train mean, with --fill-value, or 0 plus a mask array.")
@click.option("--fill-value", type=float, default=0.0, show_default=True)
@click.option("--float-dtype", type=click.Choice(["float32", "float64", "float16"]), default="float32", show_default=True)
@click.option("--datetime", "dt", type=click.Choice(["parts", "int64"]), default="parts", show_default=True)
@click.option("--categorical", default=None, help="Comma-separated columns to treat as categories.")
@click.option("--numeric", default=None, help="Comma-separated columns that must be numbers.")
@click.option("--dates", default=None, help="Comma-separated columns to parse as datetimes (text that looks like dates is "
              "otherwise kept as categories, with a note).")
@click.option("--drop", default=None, help="Comma-separated columns to leave out.")
@click.option("--val-fraction", type=click.FloatRange(0, 1, max_open=True), default=0.0, show_default=True)
@click.option("--split-column", default=None, help="A column naming each row's split (instead of --val-fraction).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--max-categories", type=click.IntRange(0), default=10_000, show_default=True,
              help="Codes per categorical column; rarer values beyond it share the code of '<other>' (0: no limit).")
@click.option("--drop-missing-target", is_flag=True,
              help="Leave out rows whose target is missing (counted in the summary and the manifest) instead of failing.")
@click.option("--keep-ids", is_flag=True,
              help="Keep columns whose values are all distinct (IDs; left out by default) as categories or numbers.")
@click.option("--overwrite", is_flag=True)
@click.option("--workers", "-j", type=click.IntRange(1), default=1, show_default=True,
              help="Processes reading files for the local engine (one file per task), or the local Dask cluster's size.")
@progress_option
@config_option
@engine_options
@storage_options(dest="store_fmt")
def table(src, target, out, task, fmt, sep, header, skip_rows, names, target_file, missing, fill_value, float_dtype, dt,
          categorical, numeric, dates, drop, val_fraction, split_column, seed, max_categories, drop_missing_target, keep_ids,
          overwrite, workers, progress, engine, address, scheduler_file, store_fmt, compress):
    """Convert tables to typed arrays: floats, integer codes with vocabularies, statistics, splits."""
    from ..progress import Progress
    from ..remote.urls import redact
    from ..tables.build import build_table, input_bytes
    from ..tables.columns import TableSettings
    from ..tables.field import dropped_rows

    settings = TableSettings(target=target, task=task, float_dtype=float_dtype, missing=missing, fill_value=fill_value, datetime=dt,
                             categorical=_list(categorical), numeric=_list(numeric), dates=_list(dates), drop=_list(drop),
                             val_fraction=val_fraction, split_column=split_column, seed=seed, max_categories=max_categories,
                             drop_missing_target=drop_missing_target, keep_ids=keep_ids)
    read = {"fmt": fmt, "sep": sep, "header": header, "skip_rows": skip_rows, "names": list(_list(names)) or None}
    show = shown(progress)
    with engine_for(engine, workers, address, scheduler_file) as eng, \
            staged_output(out, store_fmt, compress, overwrite, eng, progress=show) as target_dir:
        with Progress(f"table {redact(str(out))}", input_bytes(list(src)), "bytes", show=show) as bar:
            r = build_table(list(src), target_dir, settings, read, target_file, overwrite, engine=eng, progress=bar)
    t = r["target"]
    import numpy as np

    click.echo(f"pack: {redact(str(out))}")
    click.echo("  rows: " + ", ".join(f"{k} {v}" for k, v in r["splits"].items()) + f"; {dropped_rows(r['rows'])}")
    click.echo(f"  {r['features']} feature columns, {r['categorical']} categorical; target {t['column']!r}: {t['task']} "
               f"({np.dtype(t['dtype']).name}" + (f", {len(t['classes'])} classes)" if t["task"] == "classification" else ")"))
    click.echo("  columns:")
    for c, what in r["columns"].items():
        click.echo(f"    {c}: {what}")
    click.echo(f"  {sum(r['splits'].values())} rows in {r['seconds']:.2f} s")
