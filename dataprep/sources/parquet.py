"""Table listing: takes Parquet files, Arrow IPC files (file or stream format) and `datasets.save_to_disk`
directories whose image column holds encoded image bytes, gives one split whose samples are the rows,
labelled and captioned from other columns, each recorded as `file.parquet:ROW` (the row's index in its file).

Read through pyarrow alone (the `datasets` package is not needed). The image column is binary (or
large_binary), or Hugging Face's `Image` struct `{bytes, path}`: its bytes are used; a row whose bytes are
null but whose path is set is read from that path, resolved inside the table file's folder (the dataset's),
and skipped with its reason when no such file is there. A null image is skipped with its reason. A column
of text (URLs) is refused: dataprep does not download.

Class names come from a `ClassLabel` feature in the dataset's metadata (the schema's b"huggingface" entry
that `datasets` writes into Parquet and Arrow files, or `dataset_info.json` beside a save_to_disk
directory's files): the labels are then ints indexing those names, and -1 (the hub's "no label") is a row
without one. Otherwise labels are integers or class names, as `labelled_split` takes them. A label or
caption cell of a string column whose bytes are not UTF-8 (pyarrow stores what a writer gives it) skips its
row ("bad label", "bad caption"), as a caption that is not Unicode text is skipped.

The listing reads only the label and caption columns, never the images. Units are row groups (Parquet)
or record batches (Arrow), read in one pass each (`sequential`); the reader reads only the image column of
a row group, `BATCH_ROWS` rows at a time with buffered column reads, so memory holds a few batches and one
data page of that column, however large the row group. (The page is the writer's choice: pyarrow's holds up
to 1024 values, whatever their size, a page being closed between batches of 1024 once over its page size.)
Arrow files are memory-mapped; uncompressed, a record batch is read whole from the mapping, which copies
nothing (reading only some columns, `included_fields`, would copy those out of it: measured, 600 MiB for a
600 MiB cell). A compressed file (LZ4 or ZSTD buffers; `pyarrow.feather.write_feather` compresses with LZ4
by default) has only the columns read decompressed, a whole column of a batch at a time: write_feather's
batches are 64K rows by default, 6.5 GB for 100 KB images. To bound it, write the file in smaller batches
(`chunksize=`), or as Parquet (read `BATCH_ROWS` rows at a time).

What a file declares is not trusted: a lying file is refused (naming it) or its bad rows skipped with their
reasons, never a crash, a dead worker or a wrong value.

- Every record batch and array pyarrow reads is fully validated (`_valid`: `validate(full=True)`, offsets
  inside their buffers and increasing, buffers as long as their types need) before any value is used:
  pyarrow checks only cheaply, and an offset that lies made it read wild memory (SIGSEGV, SIGBUS) and a
  schema that lies about its batches (int16 over int8 data) gave wrong values. Text and binary offsets must
  be exactly as many as a batch's length needs (`_exact_offsets`: a stream declaring binary over
  large_binary batches otherwise pairs rows with other rows' bytes). A bad batch of the label or caption
  columns refuses the file; of the image column, its rows are skipped ("unreadable", with the reason).
  (Fixed-width values whose buffer is long enough for the type declared are indistinguishable from data of
  that type.) Validation reads offsets only, never the bytes, so it is a small part of a read
  (docs/benchmarks.md, "Costs the code is shaped by").
- A cell over the byte cap (`max_bytes`, None: `limits.IMAGE_MAX_BYTES`) is skipped ("too large") before its
  bytes are held. Arrow: by its offsets (never made a scalar, which would copy it); in a compressed batch by
  what the batch's buffers declare (`_ipc_oversized`), before pyarrow decompresses anything, the batch's
  other rows going with it (pyarrow decompresses a column whole). Parquet: by the sizes the page headers
  declare, read before anything is decompressed (`_parquet_oversized`; the footer is read here too, as
  pyarrow's Python binding aborts on some lying column metadata). A page over the cap is never given to
  pyarrow (a 49 KB file can hold a 1.5 GiB cell, which cost 6.4 GB): pyarrow reads the row group with that
  page replaced by a blank one of the same length (`_Blanked`), and the image page itself is streamed a cell
  at a time (`_page_cells`: PLAIN values, uncompressed, ZSTD, GZIP or BROTLI), each cell over the cap skipped
  by the length before it; other pages over the cap (SNAPPY or LZ4, which decompress whole; label and
  caption pages) skip their rows, a dictionary page over the cap its row group.
- An Image struct's `path` is resolved inside the table's folder (the dataset's): a path that is absolute
  outside it, climbs out (`../`) or leads out through a symlink is refused with one reason and detail ("bad
  path") whatever is there, so no skip record says whether a file outside exists; the file is opened a
  component at a time without following symlinks, and skipped by its size (fstat) over the cap.

The checks are in two modules beside this one: sources/arrow_checks.py validates what pyarrow reads and
reads Arrow IPC messages (`_valid`, `_exact_offsets`, `_ipc_oversized`); sources/parquet_pages.py reads the
Parquet footer and page headers, blanks pages for pyarrow and streams them (`_parquet_oversized`,
`_Blanked`, `_page_cells`).
"""
from __future__ import annotations

import errno
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from ..errors import ImageDecodeError, SourceError
from ..limits import IMAGE_MAX_BYTES, over_cap
from .arrow_checks import (
    _DICTIONARY_BATCH,
    _RECORD_BATCH,
    ARROW_FILE,
    ARROW_STREAM,
    PARQUET,
    _exact_offsets,
    _ipc_messages,
    _ipc_oversized,
    _pa,
    _Substream,
    _valid,
)
from .listing import Source, expand, labelled_split, skip
from .parquet_pages import _blanked_file, _Oversized, _Page, _page_cells, _parquet_oversized

BATCH_ROWS = 16  # image rows pyarrow hands the reader at a time
READ_BUFFER = 1 << 20  # bytes of a column chunk read at a time (pyarrow's default, 0, reads a whole chunk)
IMG2DATASET = "https://github.com/rom1504/img2dataset"


def table_format(path: str | os.PathLike) -> str:
    """PARQUET, ARROW_FILE or ARROW_STREAM, from the file's first bytes (a stream has no magic: it is
    what opens as one)."""
    with open(path, "rb") as f:
        head = f.read(8)
    if head[:4] == b"PAR1":
        return PARQUET
    if head[:6] == b"ARROW1":
        return ARROW_FILE
    pa = _pa()
    try:
        with pa.memory_map(str(path)) as m:
            pa.ipc.open_stream(m)
    except (pa.ArrowException, OSError, ValueError) as e:
        raise SourceError(f"{path}: neither Parquet nor an Arrow IPC file or stream ({e})") from None
    return ARROW_STREAM


# ---------------------------------------------------------------------------------------------------------
# Opening tables: a file's schema, its units' row counts, and chosen columns, by format


def _parquet_file(path: str):
    """A ParquetFile that streams a column chunk (buffered reads, nothing read ahead) instead of reading
    it whole: what bounds the reader's memory."""
    pa = _pa()
    return pa.parquet.ParquetFile(path, pre_buffer=False, buffer_size=READ_BUFFER)


def _ipc_options(schema, columns: Sequence[str]):
    pa = _pa()
    return pa.ipc.IpcReadOptions(use_threads=False, included_fields=[schema.get_field_index(c) for c in columns])


@dataclass(frozen=True)
class _Skipped:
    """A record batch not read: its cells over the cap ({row: detail}) and why the others go with them."""

    num_rows: int
    over: dict
    detail: str


def _arrow_batches(path: str, fmt: str, columns: Sequence[str], unit: int | None = None,
                   cap: int = IMAGE_MAX_BYTES) -> Iterator:
    """The record batches of an Arrow IPC file (only `columns`; all of them, or just batch `unit`), each
    validated (`_valid`, `_exact_offsets`) and of the columns and types the file declares before it is
    yielded. Uncompressed, they are read whole from the memory map, which copies nothing (reading only some
    columns would copy those out of it). Compressed, only `columns` are decompressed, and first checked by
    what the batch's buffers declare (`_ipc_oversized`): a batch with a cell over `cap` is not decompressed
    (pyarrow decompresses a column whole) but yielded as `_Skipped`."""
    pa = _pa()
    name = os.path.basename(path)
    with pa.memory_map(path) as m, open(path, "rb") as f:
        opener = pa.ipc.open_file if fmt == ARROW_FILE else pa.ipc.open_stream
        schema = opener(m).schema
        m.seek(0)
        data = memoryview(m.read_buffer())
        try:
            messages, framing = _ipc_messages(data, fmt)
        except ValueError as e:
            raise pa.ArrowInvalid(f"{name}: {e}") from None
        compressed = any(msg.codec for msg in messages)
        m.seek(0)
        r = opener(m, options=_ipc_options(schema, columns) if compressed else pa.ipc.IpcReadOptions(use_threads=False))
        want = {c: schema.field(c).type for c in columns}

        def checked(batch, b: int):
            got = {f.name: f.type for f in batch.schema if f.name in want}
            if got != want or (not compressed and batch.schema.types != schema.types):
                raise pa.ArrowInvalid(f"record batch {b} of {name} has columns {got}, not the declared {want}")
            batch = batch.select(list(columns))
            _valid(batch, f"record batch {b} of {name}")
            for c in columns:
                _exact_offsets(batch.column(c), f"record batch {b} of {name}: column {c!r}")
            return batch

        def skipped(b: int):
            """The batch as _Skipped when a cell of `columns` is over the cap, else None (compressed only)."""
            if not compressed or b >= len(messages) or messages[b].codec is None:
                return None
            try:
                over = _ipc_oversized(data, schema, messages[b], columns, cap, name, b)
            except ValueError as e:
                raise pa.ArrowInvalid(f"record batch {b} of {name}: {e}") from None
            if not over:
                return None
            first = min(over)
            return _Skipped(messages[b].length, over, f"in compressed record batch {b} of {name} with a cell over the cap "
                                                      f"(row {first} of the batch: {over[first]}), which pyarrow would "
                                                      "decompress whole: not read")

        if fmt == ARROW_FILE:
            if r.num_record_batches != len(messages):
                raise pa.ArrowInvalid(f"{name}: its footer lists {r.num_record_batches} record batches to pyarrow, "
                                      f"{len(messages)} here")
            for b in (range(r.num_record_batches) if unit is None else [unit]):
                yield skipped(b) or checked(r.get_batch(b), b)
            return
        if not compressed:
            for b, batch in enumerate(r):
                if unit is None or b == unit:
                    yield checked(batch, b)
                    if unit is not None:
                        return
            return
        batches = [k for k, (_, _, kind) in enumerate(framing) if kind == _RECORD_BATCH]
        for b in (range(len(batches)) if unit is None else [unit] if unit < len(batches) else []):
            sk = skipped(b)
            if sk is not None:
                yield sk
                continue
            parts = [framing[0][:2]] + [fr[:2] for fr in framing[1:batches[b]] if fr[2] == _DICTIONARY_BATCH] + [framing[batches[b]][:2]]
            one = pa.ipc.open_stream(pa.PythonFile(_Substream(f.fileno(), parts), mode="r"), options=_ipc_options(schema, columns))
            yield checked(one.read_next_batch(), b)


def _schema(path: str, fmt: str):
    """A table file's schema, its names UTF-8 (an ArrowInvalid when they are not: pyarrow decodes them when
    asked, as a UnicodeDecodeError)."""
    pa = _pa()
    if fmt == PARQUET:
        schema = _parquet_file(path).schema_arrow
    else:
        with pa.memory_map(path) as m:
            schema = (pa.ipc.open_file if fmt == ARROW_FILE else pa.ipc.open_stream)(m).schema

    def names(t) -> None:
        for i in range(getattr(t, "num_fields", 0)):
            _ = t.field(i).name  # decoded here, so a name that is not UTF-8 raises now
            names(t.field(i).type)
        if pa.types.is_dictionary(t):
            names(t.value_type)

    try:
        for field in schema:
            _ = field.name  # decoded here, so a name that is not UTF-8 raises now
            names(field.type)
    except UnicodeDecodeError as e:
        raise pa.ArrowInvalid(f"a column name is not UTF-8 ({e})") from None
    return schema


def _read_columns(path: str, fmt: str, columns: list[str], any_column: str,
                  cap: int = IMAGE_MAX_BYTES) -> tuple[list[int], dict[str, list], dict[int, str]]:
    """Each unit's row count, the values of `columns` (labels, captions; never the images), validated before
    they are read, and {row: detail} of the rows whose cells are over the cap `cap` (Parquet: their pages,
    never decompressed; their values here are None). An Arrow stream has no index of its batches, so it is
    walked through one column: `any_column` when none is asked."""
    values: dict[str, list] = {c: [] for c in columns}
    over: dict[int, str] = {}
    rows: list[int] = []
    if fmt == PARQUET:
        pf = _parquet_file(path)
        for g in range(pf.metadata.num_row_groups):
            n = pf.metadata.row_group(g).num_rows
            first = sum(rows)
            rows.append(n)
            if not columns:
                continue
            found = _parquet_oversized(path, g, columns, cap, pf=pf)
            unit_over = found.over
            if found.whole is not None:
                unit_over = dict.fromkeys(range(n), found.whole)
                part = {c: [None] * n for c in columns}
            else:
                f = _blanked_file(path, found.blanks) if found.blanks else path
                table = _valid(_parquet_file(f).read_row_group(g, columns=columns, use_threads=False),
                               f"row group {g} of {os.path.basename(path)}")
                if table.num_rows != n:
                    raise _pa().ArrowInvalid(f"row group {g} of {os.path.basename(path)} holds {table.num_rows} rows, "
                                             f"not the {n} its metadata declares")
                part = {c: _pylist(table.column(c)) for c in columns}
            for c in columns:
                values[c] += [None if r in unit_over else v for r, v in enumerate(part[c])]
            over.update({first + r: d for r, d in unit_over.items()})
        return rows, values, over
    for batch in _arrow_batches(path, fmt, columns or [any_column], cap=cap):
        first = sum(rows)
        rows.append(batch.num_rows)
        if isinstance(batch, _Skipped):
            for c in columns:
                values[c] += [None] * batch.num_rows
            over.update({first + r: batch.over.get(r, batch.detail) for r in range(batch.num_rows)} if columns else {})
            continue
        for c in columns:
            col = batch.column(c)
            sizes = _cell_sizes(col)
            big = set() if sizes is None else set(np.flatnonzero(sizes > cap).tolist())
            if not big:
                values[c] += _pylist(col)
                continue
            for r in big:
                over[first + r] = f"column {c!r}: {over_cap(int(sizes[r]), cap)}"
            kept = iter(_pylist(col.take(_pa().array([r for r in range(len(col)) if r not in big], _pa().int64()))))
            values[c] += [None if r in big else next(kept) for r in range(len(col))]  # the big cells never copied
    return rows, values, over


def _cell_sizes(column) -> np.ndarray | None:
    """Each cell's size in bytes, from the offsets of a validated text or binary column (nulls 0); None for
    a column of other values."""
    pa = _pa()
    import pyarrow.compute as pc

    t = column.type
    if pa.types.is_dictionary(t):
        sizes = _cell_sizes(column.dictionary)
        if sizes is None or not len(sizes):
            return None if sizes is None else np.zeros(len(column), np.int64)
        return sizes[np.asarray(column.indices.fill_null(0), np.int64)]
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t) \
            or pa.types.is_string(t) or pa.types.is_large_string(t):
        return np.asarray(pc.binary_length(column).fill_null(0), np.int64)
    if _is_bytes(t) or getattr(pa.types, "is_string_view", lambda t: False)(t):  # views: no kernel, one scalar at a time
        return np.asarray([v.as_buffer().size if v.is_valid else 0 for v in column], np.int64)
    return None


@dataclass(frozen=True)
class NotUtf8:
    """A text cell whose bytes are not UTF-8 (pyarrow does not check what a writer stored in a string column)."""

    detail: str


def _pylist(column) -> list:
    """A column's values as Python's; a text cell that is not UTF-8 is a NotUtf8 (its row is skipped) instead
    of a UnicodeDecodeError for the whole column."""
    try:
        return column.to_pylist()
    except UnicodeDecodeError:
        pass
    pa = _pa()
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    out = []
    for v in column.cast(pa.large_binary()).to_pylist():  # the same bytes, not decoded
        try:
            out.append(None if v is None else v.decode("utf-8"))
        except UnicodeDecodeError as e:
            out.append(NotUtf8(f"not UTF-8 text ({e.reason} at byte {e.start}: {v[e.start:e.start + 4]!r})"))
    return out


# ---------------------------------------------------------------------------------------------------------
# Hugging Face metadata


def _hf_features(schema) -> dict | None:
    """The `features` that `datasets` writes into a table's schema metadata, or None."""
    raw = (schema.metadata or {}).get(b"huggingface")
    if not raw:
        return None
    try:
        feats = json.loads(raw.decode("utf-8")).get("info", {}).get("features")
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return None
    return feats if isinstance(feats, dict) else None


def _class_label(features: dict | None, column: str) -> list[str] | None:
    """The names of a ClassLabel feature `column`, or None."""
    f = (features or {}).get(column)
    if isinstance(f, dict) and f.get("_type") == "ClassLabel" and isinstance(f.get("names"), list):
        return [str(n) for n in f["names"]]
    return None


def _saved_dataset(folder: Path, split: str) -> tuple[list[Path], dict | None]:
    """The Arrow files of a `datasets.save_to_disk` directory (a Dataset's, or the split `split` of a
    DatasetDict's) and the features of its dataset_info.json."""
    if (folder / "dataset_dict.json").is_file() and not (folder / "state.json").is_file():
        try:
            splits = json.loads((folder / "dataset_dict.json").read_text())["splits"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SourceError(f"{folder / 'dataset_dict.json'}: unreadable ({e})") from None
        if split not in splits:
            raise SourceError(f"{folder}: a DatasetDict with splits {', '.join(map(str, splits))}, not {split!r}; "
                              "pass --split with one of them")
        folder = folder / split
    state_path = folder / "state.json"
    if not state_path.is_file():
        raise SourceError(f"{folder}: a directory, but not one written by datasets.save_to_disk (no state.json or "
                          f"dataset_dict.json); for a folder of Parquet files give a glob such as '{folder}/*.parquet'")
    try:
        state = json.loads(state_path.read_text())
        names = [d["filename"] for d in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SourceError(f"{state_path}: no list of data files ({e})") from None
    if state.get("_indices_data_files"):
        raise SourceError(f"{state_path}: the dataset is a selection of rows through an indices file; save it again "
                          "after dataset.flatten_indices()")
    files = []
    for name in names:
        p = folder / name
        if os.path.dirname(os.path.normpath(name)) or not p.is_file():
            raise SourceError(f"{state_path}: lists {name!r}, which is not a file in {folder}")
        files.append(p)
    features = None
    info = folder / "dataset_info.json"
    if info.is_file():
        try:
            features = json.loads(info.read_text()).get("features")
        except (OSError, ValueError, AttributeError):
            features = None
    return files, features if isinstance(features, dict) else None


def _inputs(patterns: Sequence[str], split: str) -> tuple[list[tuple[Path, dict | None]], list[Path]]:
    """(file, save_to_disk features or None) for every table the patterns name, and the directories given."""
    out, dirs = [], []
    for pattern in patterns:
        if os.path.isdir(pattern):
            files, features = _saved_dataset(Path(pattern), split)
            out += [(f, features) for f in files]
            dirs.append(Path(pattern))
            continue
        out += [(f, None) for f in expand([pattern])]
    seen, unique = set(), []
    for f, feats in out:
        if f.resolve() not in seen:
            seen.add(f.resolve())
            unique.append((f, feats))
    return unique, dirs


# ---------------------------------------------------------------------------------------------------------
# Columns


def _image_column(path, schema, column: str) -> None:
    """Refuse an image column that is missing or holds no image bytes."""
    pa = _pa()
    if column not in schema.names:
        raise SourceError(f"{path}: no column {column!r} (columns: {', '.join(schema.names)}); pass --image-column")
    t = schema.field(column).type
    if _is_bytes(t) or (pa.types.is_struct(t) and t.get_field_index("bytes") >= 0 and _is_bytes(t.field("bytes").type)):
        return
    if pa.types.is_string(t) or pa.types.is_large_string(t) or getattr(pa.types, "is_string_view", lambda t: False)(t):
        raise SourceError(
            f"{path}: column {column!r} holds text (URLs or paths), not image bytes. dataprep does not download "
            f"images: fetch them first with img2dataset ({IMG2DATASET}), which writes WebDataset tars or Parquet "
            "with the image bytes, and build from those")
    raise SourceError(f"{path}: column {column!r} is {t}, not image bytes (binary, or a struct with a binary "
                      "'bytes' field as Hugging Face's Image feature stores it)")


def _is_bytes(t) -> bool:
    pa = _pa()
    return (pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)
            or getattr(pa.types, "is_binary_view", lambda t: False)(t))


def _check_column(path, schema, column: str, option: str, kinds: tuple[str, ...]) -> None:
    pa = _pa()
    if column not in schema.names:
        raise SourceError(f"{path}: no column {column!r} (columns: {', '.join(schema.names)}); pass {option}")
    t = schema.field(column).type
    if pa.types.is_dictionary(t):
        t = t.value_type
    ok = {"int": pa.types.is_integer(t) or pa.types.is_floating(t),
          "str": pa.types.is_string(t) or pa.types.is_large_string(t)
          or getattr(pa.types, "is_string_view", lambda t: False)(t)}
    if not any(ok[k] for k in kinds):
        want = "integers or class names" if "int" in kinds else "text"
        raise SourceError(f"{path}: column {column!r} ({option}) is {t}, not {want}")


def _label(value: Any, ref: str, names: list[str] | None):
    """A label as labelled_split takes it (int, class name or None) from a column's value."""
    if value is None or value != value:  # null, or NaN (pandas' missing value)
        return None
    if isinstance(value, float):
        if not value.is_integer():
            raise SourceError(f"{ref}: label {value} is not an integer")
        value = int(value)
    if names is not None and isinstance(value, int):
        if value == -1:
            return None  # ClassLabel's "no label"
        if not 0 <= value < len(names):
            raise SourceError(f"{ref}: label {value} is outside the ClassLabel's {len(names)} names")
    return value


# ---------------------------------------------------------------------------------------------------------
# Reading the images


@dataclass(frozen=True)
class TableReader:
    """Reads image cells: a locator is (table relative to the root, format, unit, row in the unit, image
    column). Each unit (row group, record batch) is read in one pass, only its image column. `max_bytes`:
    the cap on one cell's bytes (None: `limits.IMAGE_MAX_BYTES`); a cell over it is skipped unread."""

    sequential: bool = True
    max_bytes: int | None = None

    def open(self, root: str, refs: Sequence[str], locators: Sequence[Any]) -> Iterator[bytes | ImageDecodeError]:
        cap = IMAGE_MAX_BYTES if self.max_bytes is None else self.max_bytes
        i = 0
        while i < len(locators):
            file, fmt, unit, _, column = locators[i]
            j = i + 1
            while (j < len(locators) and locators[j][:3] == (file, fmt, unit) and locators[j][4] == column
                   and locators[j][3] > locators[j - 1][3]):
                j += 1
            yield from _read_unit(os.path.join(root, file), fmt, unit, column, refs[i:j], [loc[3] for loc in locators[i:j]], cap)
            i = j


def _unit_arrays(path: str, fmt: str, unit: int, column: str, cap: int = IMAGE_MAX_BYTES) -> Iterator:
    """The image column of one unit, in pieces of a few rows (Parquet) or as one mapped array (Arrow; or a
    `_Skipped` batch)."""
    if fmt == PARQUET:
        yield from _parquet_arrays(path, unit, column)
    else:
        for batch in _arrow_batches(path, fmt, [column], unit, cap):
            yield batch if isinstance(batch, _Skipped) else batch.column(column)


def _parquet_arrays(source, unit: int, column: str) -> Iterator:
    for batch in _parquet_file(source).iter_batches(batch_size=BATCH_ROWS, row_groups=[unit], columns=[column],
                                                    use_threads=False):
        yield batch.column(0)


def _read_unit(path: str, fmt: str, unit: int, column: str, refs, rows: list[int],
               cap: int = IMAGE_MAX_BYTES) -> Iterator[bytes | ImageDecodeError]:
    """The cells `rows` (increasing) of one unit's image column, in order. Every piece pyarrow gives is
    validated before a cell is taken from it, and a cell over the cap is skipped before its bytes are copied;
    a Parquet page over the cap is never given to pyarrow: its cells are streamed one at a time
    (`_page_cells`), or skipped with it where its codec cannot stream."""
    pa = _pa()
    k, start, reason = 0, 0, None
    found = _Oversized({}, [], [])
    name = os.path.basename(path)
    try:
        if fmt == PARQUET:
            pf = _parquet_file(path)
            image = f"{column}.bytes" if pa.types.is_struct(pf.schema_arrow.field(column).type) else column
            found = _parquet_oversized(path, unit, [column], cap, image, pf=pf)
            if found.whole is not None:
                for ref in refs:
                    yield ImageDecodeError(ref, "too large", found.whole)
                return
            pieces = _parquet_arrays(_blanked_file(path, found.blanks), unit, column) if found.blanks else \
                _unit_arrays(path, fmt, unit, column)
        else:
            pieces = _unit_arrays(path, fmt, unit, column, cap)
    except (pa.ArrowException, OSError, ValueError, KeyError) as e:
        reason = f"{type(e).__name__}: {name}: row group {unit}: {e}"
    struct = fmt == PARQUET and reason is None and pa.types.is_struct(pf.schema_arrow.field(column).type)
    streams = [_Streamed(first, first + p.rows, p, _page_cells(path, p, leaf, codec, cap),
                         leaf.max_definition_level - 1 if struct else 0) for first, p, leaf, codec in found.streamed]

    def streamed(r: int):
        """Row r's cell from the page streamed for it (the rows before it in that page read and dropped), or
        None when no page over the cap holds it."""
        s = next((s for s in streams if s.first <= r < s.end), None)
        if s is None:
            return None
        got = None
        try:
            while s.failed is None and s.next <= r:
                got = next(s.cells)
                s.next += 1
        except (pa.ArrowException, OSError, ValueError, StopIteration) as e:  # its rows are skipped as the page is
            s.failed = (f"{over_cap(s.page.size, cap)}: the size declared by the page of column {column!r} that holds "
                        f"rows {s.first} to {s.end - 1}, which could not be streamed ({type(e).__name__}: {e}), not read")
        if s.failed is not None:
            return "too large", s.failed
        if got is None:
            return None
        if got[0] == "too large":
            return "too large", over_cap(got[1], cap)
        if got[0] == "null" and got[1] < s.struct_level:
            return "no image", "the image column is null"
        return got

    while k < len(rows) and reason is None:
        try:
            arr = next(pieces, None)
            if arr is not None and not isinstance(arr, _Skipped):
                _valid(arr, f"{'row group' if fmt == PARQUET else 'record batch'} {unit} of {name}")
        except (pa.ArrowException, OSError, ValueError) as e:
            reason = f"{type(e).__name__}: {e}"
            break
        if arr is None:
            reason = f"{name} holds fewer rows than when it was listed"
            break
        if isinstance(arr, _Skipped):
            while k < len(rows) and rows[k] < start + arr.num_rows:
                yield ImageDecodeError(refs[k], "too large", arr.over.get(rows[k] - start, arr.detail))
                k += 1
            start += arr.num_rows
            continue
        sizes = _image_sizes(arr)  # from the offsets: a cell over the cap is never made a scalar (that copies it)
        while k < len(rows) and rows[k] < start + len(arr):
            r = rows[k]
            if sizes is not None and sizes[r - start] > cap and r not in found.over:
                yield ImageDecodeError(refs[k], "too large", over_cap(int(sizes[r - start]), cap))
                k += 1
                continue
            got = streamed(r) if streams else None
            if r in found.over:
                yield ImageDecodeError(refs[k], "too large", found.over[r])
            elif got is None or got[0] == "null":  # a null in a streamed page: its struct's path, as pyarrow reads it
                yield _cell(arr[r - start], refs[k], path, cap)
            elif got[0] == "bytes":
                yield got[1]
            else:
                yield ImageDecodeError(refs[k], *got)
            k += 1
        start += len(arr)
    for ref in refs[k:]:  # what the read did not reach
        yield ImageDecodeError(ref, "unreadable", reason)


def _image_sizes(array) -> np.ndarray | None:
    """Each image cell's size in bytes (a binary column's, or its struct's `bytes`), from the offsets."""
    pa = _pa()
    if pa.types.is_struct(array.type):
        k = array.type.get_field_index("bytes")
        return None if k < 0 else _cell_sizes(array.flatten()[k])
    return _cell_sizes(array)


@dataclass
class _Streamed:
    """A page over the cap read a cell at a time for `_read_unit`: its rows [first, end), its cells, the next
    row they give, a detail once it could not be read, and the levels below which its struct is null."""

    first: int
    end: int
    page: _Page
    cells: Iterator
    struct_level: int
    next: int = -1
    failed: str | None = None

    def __post_init__(self):
        self.next = self.first


PATH_MAX = 4096  # the longest image path taken from a table (the kernel's own limit)


def _cell(value, ref: str, table: str, cap: int = IMAGE_MAX_BYTES) -> bytes | ImageDecodeError:
    """One image cell's bytes (of a validated array): binary, or the {bytes, path} struct's bytes, else the
    file at its path inside the table's folder; over the cap, skipped before its bytes are copied."""
    if not value.is_valid:
        return ImageDecodeError(ref, "no image", "the image column is null")
    if not hasattr(value, "keys"):  # binary
        return _capped(value, ref, cap)
    data = value["bytes"]
    if data.is_valid:
        return _capped(data, ref, cap)
    path = value["path"] if "path" in value.keys() else None
    if path is None or not path.is_valid or not path.as_buffer().size:
        return ImageDecodeError(ref, "no image", "the image's bytes and path are null")
    try:
        text = path.as_py() if path.as_buffer().size <= PATH_MAX else None
    except UnicodeDecodeError:
        text = None
    if not isinstance(text, str):
        return ImageDecodeError(ref, "bad path", "the image path is not a path inside the dataset's folder")
    return _read_inside(os.path.dirname(table), text, ref, cap)


def _capped(scalar, ref: str, cap: int) -> bytes | ImageDecodeError:
    """A binary scalar's bytes, or "too large" when its size (zero-copy: `as_buffer`) is over the cap."""
    buf = scalar.as_buffer()
    big = over_cap(buf.size, cap)
    return ImageDecodeError(ref, "too large", big) if big else buf.to_pybytes()


def _read_inside(folder: str, path: str, ref: str, cap: int) -> bytes | ImageDecodeError:
    """The bytes of the file an Image struct's `path` names, resolved inside `folder` (the table's: the
    dataset's). A path that is absolute outside it, climbs out of it (../) or leads out through a symlink is
    refused with one reason and detail whatever is there, so no skip record tells whether a file outside
    exists. The file is opened a component at a time from the folder, never through a symlink (one swapped
    in after the check is refused too), and skipped by its size (fstat) over the cap before it is read."""
    refused = ImageDecodeError(ref, "bad path", f"the image path {path!r} is not inside the dataset's folder")
    base = os.path.realpath(folder)
    if "\0" in path:
        return refused
    rel = os.path.relpath(os.path.realpath(os.path.join(base, path)), base)
    parts = rel.split(os.sep)
    if rel in (os.curdir, "") or os.path.isabs(rel) or os.pardir in parts:
        return refused
    missing = lambda why: ImageDecodeError(ref, "no image bytes", f"bytes are null and its path {path!r} gives none ({why})")  # noqa: E731
    nofollow = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        return missing(e.strerror or str(e))
    try:
        for k, part in enumerate(parts):
            last = k == len(parts) - 1
            nxt = os.open(part, nofollow | (os.O_NONBLOCK if last else os.O_DIRECTORY), dir_fd=fd)  # a FIFO opens at once
            os.close(fd)
            fd = nxt
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device or socket"
            return missing(f"it is {kind}, not a regular file")
        big = over_cap(st.st_size, cap)
        if big:
            return ImageDecodeError(ref, "too large", big)
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(st.st_size)  # at most its size when opened, however it grows
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EMLINK):  # a symlink where the check saw none: changed since
            return refused
        return missing(e.strerror or str(e))
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------------------
# The listing


def scan_parquet(files: Sequence[str], split: str = "train", image_column: str = "image", label_column: str | None = None,
                 caption_column: str | None = None, strict: bool = False, max_bytes: int | None = None) -> Source:
    """List the rows of Parquet files, Arrow IPC files and save_to_disk directories (files and globs as
    `expand` takes them, directories as `datasets` writes them) into one split `split`. Labels from
    `label_column` (integers, class names, or a ClassLabel's ints), captions from `caption_column`; rows
    null in either are skipped with their reasons; with `strict`, the first such row refuses the tables
    instead (SourceError naming the row and why). (A null image is found when the build reads it, where
    the build's own strict applies.) `max_bytes`: the cap on one cell's bytes (None: `limits.IMAGE_MAX_BYTES`),
    the images' when they are read and the labels' and captions' here."""
    cap = IMAGE_MAX_BYTES if max_bytes is None else max_bytes
    inputs, dirs = _inputs(files, split)
    if not inputs:
        raise SourceError(f"{', '.join(map(str, files)) or 'no files given'}: no table files")
    base = Path(os.path.commonpath([str(p.resolve().parent) for p, _ in inputs] + [str(d.resolve()) for d in dirs]))
    tables, names_seen = [], {}
    for path, saved_features in inputs:
        fmt = table_format(path)
        try:
            schema = _schema(str(path), fmt)
        except (_pa().ArrowException, OSError, ValueError) as e:  # ValueError: names pyarrow cannot decode
            raise SourceError(f"{path}: unreadable as {fmt} ({e})") from None
        _image_column(path, schema, image_column)
        if label_column:
            _check_column(path, schema, label_column, "--label-column", ("int", "str"))
            names = _class_label(_hf_features(schema) or saved_features, label_column)
            if names is not None:
                names_seen.setdefault(tuple(names), path)
        if caption_column:
            _check_column(path, schema, caption_column, "--caption-column", ("str",))
        tables.append((path, os.path.relpath(path.resolve(), base), fmt))
    if len(names_seen) > 1:
        (a, fa), (b, fb) = list(names_seen.items())[:2]
        raise SourceError(f"{fa} and {fb}: their ClassLabel features name different classes ({list(a)[:5]} ... and "
                          f"{list(b)[:5]} ...); build them as separate packs")
    names = list(next(iter(names_seen))) if names_seen else None  # a table without the metadata takes the others'
    columns = [c for c in (label_column, caption_column) if c]
    refs, locators, units, raw_labels, captions, skipped = [], [], [], [], [], []
    u = 0
    for path, rel, fmt in tables:
        try:
            rows, values, over = _read_columns(str(path), fmt, columns, image_column, cap)
        except (_pa().ArrowException, OSError, ValueError) as e:
            raise SourceError(f"{path}: unreadable as {fmt} ({e})") from None
        row = 0
        for unit, n in enumerate(rows):
            for r in range(n):
                ref = f"{rel}:{row}"
                label = values[label_column][row] if label_column else None
                caption = values[caption_column][row] if caption_column else None
                row += 1
                if row - 1 in over:
                    skip(skipped, {"source": ref, "reason": "too large", "detail": over[row - 1]}, strict)
                    continue
                bad = [(what, c, v) for what, c, v in (("bad label", label_column, label), ("bad caption", caption_column, caption))
                       if isinstance(v, NotUtf8)]
                if bad:  # as labelled_split skips a caption that is not Unicode text
                    what, c, v = bad[0]
                    skip(skipped, {"source": ref, "reason": what, "detail": f"column {c!r}: {v.detail}"}, strict)
                    continue
                refs.append(ref)
                locators.append((rel, fmt, unit, r, image_column))
                units.append(u)
                raw_labels.append(_label(label, ref, names) if label_column else None)
                captions.append(caption)
            u += 1
    if not refs:
        raise SourceError(f"{', '.join(map(str, files))}: no rows in {len(tables)} table file(s)")
    source = labelled_split(
        "parquet", base, split, refs, raw_labels, captions, skipped,
        {"files": [rel for _, rel, _ in tables], "formats": sorted({fmt for _, _, fmt in tables}),
         "image_column": image_column, **({"label_column": label_column} if label_column else {}),
         **({"caption_column": caption_column} if caption_column else {}),
         **({"classes_from": "ClassLabel"} if names else {})},
        reader=TableReader(max_bytes=max_bytes), locators=locators, units=np.asarray(units, np.int64), strict=strict)
    if names and source.classes:  # labelled: the labels index the ClassLabel's names
        source.classes = names
    return source
