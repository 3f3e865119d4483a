"""Read stage for tables: takes file paths and how to parse them, gives one DataFrame (rows of all files).

`READERS` is the registry of formats (the CLI's `--format` choices); the format is guessed from the
file name when not given. CSV-like text may be gzip-compressed, comma- or whitespace-separated, and
may start with lines that are not column names (`--header none --skip-rows 1`). Parquet and Feather are
read by pyarrow and fully validated before pandas sees a value (a lying offset is an error, not a crash).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import SourceError


def _csv(path: str, sep: str | None, header: str, skip_rows: int, names: list[str] | None):
    import pandas as pd

    kw = {"skiprows": skip_rows or None, "compression": "infer"}
    if sep in (None, "auto"):
        kw.update(sep=None, engine="python")  # sniffs commas, semicolons, tabs and runs of spaces
    elif sep in ("space", "whitespace"):
        kw.update(sep=r"\s+", engine="python")
    else:
        kw["sep"] = sep
    if names:
        kw.update(header=None, names=names)
    elif header == "none":
        kw["header"] = None
    elif header != "infer":
        kw["header"] = int(header)
    return pd.read_csv(path, **kw)


def _validated(path: str, table):
    """`table` (pyarrow) as a DataFrame once pyarrow's full validation passes (offsets inside their buffers
    and increasing, buffers as long as their types need, text UTF-8): pyarrow reads Arrow files with cheap
    checks only, and converting a table whose offsets lie reads wild memory (SIGSEGV)."""
    import pyarrow as pa

    try:
        table.validate(full=True)
    except pa.ArrowInvalid as e:
        raise SourceError(f"{path}: invalid table data ({e})") from None
    return table.to_pandas()  # what pandas' readers do with what pyarrow reads


def _parquet(path: str, *_):
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise SourceError(f"{path}: reading Parquet needs pyarrow: pip install 'dataprep[parquet]' ({e})") from None
    return _validated(path, pq.read_table(path))


def _feather(path: str, *_):
    try:
        import pyarrow.feather as feather
    except ImportError as e:
        raise SourceError(f"{path}: reading Feather needs pyarrow: pip install 'dataprep[parquet]' ({e})") from None
    return _validated(path, feather.read_table(path))


def _reader(name: str) -> Callable:
    def read(path: str, *_):
        import pandas as pd

        return getattr(pd, name)(path)

    return read


READERS: dict[str, Callable] = {
    "csv": _csv,
    "parquet": _parquet,
    "json": _reader("read_json"),
    "feather": _feather,
    "excel": _reader("read_excel"),
}
_BY_SUFFIX = {".csv": "csv", ".tsv": "csv", ".txt": "csv", ".data": "csv", ".parquet": "parquet", ".pq": "parquet",
              ".json": "json", ".jsonl": "json", ".feather": "feather", ".xlsx": "excel", ".xls": "excel"}


def guess_format(path: str) -> str:
    name = path[:-3] if path.endswith(".gz") else path
    return _BY_SUFFIX.get(os.path.splitext(name)[1].lower(), "csv")


@dataclass(frozen=True)
class ReadTask:
    """One table file and how to parse it (a task for an engine: any process, any machine)."""

    path: str
    fmt: str | None = None
    sep: str | None = None
    header: str = "infer"
    skip_rows: int = 0
    names: tuple[str, ...] | None = None


def read_one(t: ReadTask):
    """One file's rows, columns named by strings; a SourceError naming the file when it cannot be parsed."""
    import pandas as pd

    p = t.path
    if not Path(p).is_file():
        raise SourceError(f"{p}: no such file")
    f = t.fmt or guess_format(p)
    if f not in READERS:
        raise SourceError(f"{p}: unknown format {f!r}; choose one of {sorted(READERS)}")
    try:
        df = READERS[f](p, t.sep, t.header, t.skip_rows, list(t.names) if t.names else None)
    except SourceError:
        raise
    except Exception as e:  # pandas raises many types; the message names the file and pandas' reason
        hint = " (if its first lines are not column names, try --header none --skip-rows 1)" if f == "csv" else ""
        raise SourceError(f"{p}: cannot read as {f}: {type(e).__name__}: {e}{hint}") from None
    if not isinstance(df.index, pd.RangeIndex):
        # pandas turns the extra leading fields into an index when rows are longer than the header
        raise SourceError(f"{p}: its rows have more fields than its first line; that line is not column names "
                          "(try --header none --skip-rows 1)")
    df.columns = [str(c).strip() for c in df.columns]
    return df


def read_tables(paths: list[str], fmt: str | None = None, sep: str | None = None, header: str = "infer",
                skip_rows: int = 0, names: list[str] | None = None, engine=None):
    """Read and concatenate rows of every file (one task per file on `engine`, default this process);
    column names become strings ("0", "1", ... without a header)."""
    import pandas as pd

    from ..engine import LocalEngine

    if not paths:
        raise SourceError("no table files given")
    tasks = [ReadTask(str(p), fmt, sep, header, skip_rows, tuple(names) if names else None) for p in paths]
    frames = (engine or LocalEngine(1)).map(read_one, tasks, names=[os.path.basename(str(p)) for p in paths])
    cols = list(frames[0].columns)
    for p, df in zip(paths[1:], frames[1:]):
        if list(df.columns) != cols:
            raise SourceError(f"{p}: columns {list(df.columns)[:6]}... differ from {paths[0]}'s {cols[:6]}...")
    out = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    if len(out) == 0:
        raise SourceError(f"{', '.join(map(str, paths))}: the table is empty")
    return out
