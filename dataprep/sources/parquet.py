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
- An Image struct's `path` is resolved inside the table's folder (the dataset's), never followed out of it,
  and skipped by its size over the cap (sources/table_cells.py's `_read_inside`).

The checks are in modules beside this one: sources/arrow_checks.py validates what pyarrow reads and
reads Arrow IPC messages (`_valid`, `_exact_offsets`, `_ipc_oversized`); sources/parquet_pages.py weighs
Parquet pages against the cap and streams them (`_parquet_oversized`, `_page_cells`), from the footer and
page headers parquet_footer.py reads, and parquet_blanks.py blanks pages for pyarrow (`_Blanked`). What
the listing is given is checked in sources/table_inputs.py (files, save_to_disk directories, ClassLabel
names, columns: `_inputs`, `_image_column`, `_label`), and a cell's size, value and image bytes come from
sources/table_cells.py (`_cell_sizes`, `_pylist`, `_cell`). The listing itself (`scan_parquet`) is
sources/table_listing.py's, still served from here.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from ..errors import ImageDecodeError
from ..limits import IMAGE_MAX_BYTES, over_cap
from .arrow_checks import (
    _DICTIONARY_BATCH,
    _RECORD_BATCH,
    ARROW_FILE,
    PARQUET,
    _exact_offsets,
    _ipc_messages,
    _ipc_oversized,
    _pa,
    _Substream,
    _valid,
)
from .parquet_blanks import _blanked_file
from .parquet_footer import _Page
from .parquet_pages import _Oversized, _page_cells, _parquet_oversized
from .table_cells import PATH_MAX, NotUtf8, _capped, _cell, _cell_sizes, _image_sizes, _is_bytes, _pylist, _read_inside  # noqa: F401
from .table_inputs import (  # noqa: F401
    IMG2DATASET,
    _check_column,
    _class_label,
    _hf_features,
    _image_column,
    _inputs,
    _label,
    _saved_dataset,
    table_format,
)

BATCH_ROWS = 16  # image rows pyarrow hands the reader at a time
READ_BUFFER = 1 << 20  # bytes of a column chunk read at a time (pyarrow's default, 0, reads a whole chunk)


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


# table_listing.py's scan_parquet, which callers import from here, where it lived before: table_listing.py
# imports this module, so it is looked up when first asked for (PEP 562), not imported above
_LISTING = ("scan_parquet",)


def __getattr__(name: str) -> Any:
    if name in _LISTING:
        return getattr(importlib.import_module(".table_listing", __package__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
