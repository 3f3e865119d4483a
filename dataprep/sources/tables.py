"""Table listing: takes Parquet files, Arrow IPC files (file or stream format) and `datasets.save_to_disk`
directories whose image column holds encoded image bytes, gives one split whose samples are the rows,
labelled and captioned from other columns, each recorded as `file.parquet:ROW` (the row's index in its file).

Read through pyarrow alone (the `datasets` package is not needed). The image column is binary (or
large_binary), or Hugging Face's `Image` struct `{bytes, path}`: its bytes are used; a row whose bytes are
null but whose path is set is read from that path (absolute, or relative to the table file's folder, as
`datasets` resolves it), and skipped with its reason when no such file is there. A null image is skipped
with its reason. A column of text (URLs) is refused: dataprep does not download.

Class names come from a `ClassLabel` feature in the dataset's metadata (the schema's b"huggingface" entry
that `datasets` writes into Parquet and Arrow files, or `dataset_info.json` beside a save_to_disk
directory's files): the labels are then ints indexing those names, and -1 (the hub's "no label") is a row
without one. Otherwise labels are integers or class names, as `labelled_split` takes them. A label or
caption cell of a string column whose bytes are not UTF-8 (pyarrow stores what a writer gives it) skips its
row ("bad label", "bad caption"), as a caption that is not Unicode text is skipped.

The listing reads only the label and caption columns, never the images. Units are row groups (Parquet)
or record batches (Arrow), read in one pass each (`sequential`); the reader reads only the image column of
a row group, `BATCH_ROWS` rows at a time with buffered column reads, so memory holds a few batches and one
data page of that column, however large the row group. (The page is the writer's choice: pyarrow closes
one after at most 1024 values, or sooner at its page size; a table written with a whole row group in one
page is read a page at a time, which is then the row group.) Arrow files are memory-mapped, but a record
batch is the smallest piece pyarrow reads: the reader holds one record batch's image column (all of its
images' bytes) while it yields that batch's rows, and the listing one batch's label and caption columns.
Reading only some columns (`included_fields`) copies them out of the mapping (pyarrow 26: measured, 10 MB
held for a 100-row batch of 100 KB images, uncompressed), and a compressed file (LZ4 or ZSTD buffers;
`pyarrow.feather.write_feather` compresses with LZ4 by default) is decompressed a whole buffer, so a whole
batch's column, at a time. write_feather's batches are 64K rows by default: 6.5 GB for 100 KB images. To
bound it, write the file in smaller batches (`chunksize=`), or as Parquet (read `BATCH_ROWS` rows at a time).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from ..errors import ImageDecodeError, SourceError
from .listing import Source, expand, labelled_split, read_source, skip

BATCH_ROWS = 16  # image rows pyarrow hands the reader at a time
READ_BUFFER = 1 << 20  # bytes of a column chunk read at a time (pyarrow's default, 0, reads a whole chunk)
PARQUET, ARROW_FILE, ARROW_STREAM = "parquet", "arrow file", "arrow stream"
IMG2DATASET = "https://github.com/rom1504/img2dataset"


def _pa():
    try:
        import pyarrow as pa
        import pyarrow.ipc  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError as e:  # the `parquet` extra
        raise SourceError(f"reading Parquet or Arrow needs pyarrow: pip install 'dataprep[parquet]' ({e})") from None
    return pa


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
    except (pa.ArrowInvalid, OSError) as e:
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


def _arrow_batches(path: str, fmt: str, columns: Sequence[str], unit: int | None = None) -> Iterator:
    """The record batches of an Arrow IPC file (only `columns`; all of them, or just batch `unit`),
    memory-mapped: taking a batch copies nothing."""
    pa = _pa()
    with pa.memory_map(path) as m:
        opener = pa.ipc.open_file if fmt == ARROW_FILE else pa.ipc.open_stream
        schema = opener(m).schema
        m.seek(0)
        r = opener(m, options=_ipc_options(schema, columns))
        if fmt == ARROW_FILE:
            units = range(r.num_record_batches) if unit is None else [unit]
            for b in units:
                yield r.get_batch(b)
            return
        for b, batch in enumerate(r):
            if unit is None or b == unit:
                yield batch
                if unit is not None:
                    return


def _schema(path: str, fmt: str):
    pa = _pa()
    if fmt == PARQUET:
        return _parquet_file(path).schema_arrow
    with pa.memory_map(path) as m:
        return (pa.ipc.open_file if fmt == ARROW_FILE else pa.ipc.open_stream)(m).schema


def _read_columns(path: str, fmt: str, columns: list[str], any_column: str) -> tuple[list[int], dict[str, list]]:
    """Each unit's row count and the values of `columns` (labels, captions; never the images). An Arrow
    stream has no index of its batches, so it is walked through one column: `any_column` when none is asked."""
    if fmt == PARQUET:
        pf = _parquet_file(path)
        rows = [pf.metadata.row_group(g).num_rows for g in range(pf.metadata.num_row_groups)]
        table = pf.read(columns=columns, use_threads=False) if columns else None
        return rows, {c: _pylist(table.column(c)) for c in columns}
    rows, values = [], {c: [] for c in columns}
    for batch in _arrow_batches(path, fmt, columns or [any_column]):
        rows.append(batch.num_rows)
        for c in columns:
            values[c] += _pylist(batch.column(c))
    return rows, values


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
    column). Each unit (row group, record batch) is read in one pass, only its image column."""

    sequential: bool = True

    def open(self, root: str, refs: Sequence[str], locators: Sequence[Any]) -> Iterator[bytes | ImageDecodeError]:
        i = 0
        while i < len(locators):
            file, fmt, unit, _, column = locators[i]
            j = i + 1
            while (j < len(locators) and locators[j][:3] == (file, fmt, unit) and locators[j][4] == column
                   and locators[j][3] > locators[j - 1][3]):
                j += 1
            yield from _read_unit(os.path.join(root, file), fmt, unit, column, refs[i:j], [loc[3] for loc in locators[i:j]])
            i = j


def _unit_arrays(path: str, fmt: str, unit: int, column: str) -> Iterator:
    """The image column of one unit, in pieces of a few rows (Parquet) or as one mapped array (Arrow)."""
    if fmt == PARQUET:
        for batch in _parquet_file(path).iter_batches(batch_size=BATCH_ROWS, row_groups=[unit], columns=[column],
                                                      use_threads=False):
            yield batch.column(0)
    else:
        for batch in _arrow_batches(path, fmt, [column], unit):
            yield batch.column(column)


def _read_unit(path: str, fmt: str, unit: int, column: str, refs, rows: list[int]) -> Iterator[bytes | ImageDecodeError]:
    """The cells `rows` (increasing) of one unit's image column, in order."""
    pa = _pa()
    k, start = 0, 0
    pieces = _unit_arrays(path, fmt, unit, column)
    while k < len(rows):
        try:
            arr = next(pieces, None)
        except (pa.ArrowException, OSError) as e:
            reason = f"{type(e).__name__}: {e}"
            break
        if arr is None:
            reason = f"{os.path.basename(path)} holds fewer rows than when it was listed"
            break
        while k < len(rows) and rows[k] < start + len(arr):
            yield _cell(arr[rows[k] - start], refs[k], path)
            k += 1
        start += len(arr)
    for ref in refs[k:]:  # what the read did not reach
        yield ImageDecodeError(ref, "unreadable", reason)


def _cell(value, ref: str, table: str) -> bytes | ImageDecodeError:
    """One image cell's bytes: binary, or the {bytes, path} struct's bytes, else the file at its path."""
    if not value.is_valid:
        return ImageDecodeError(ref, "no image", "the image column is null")
    if not hasattr(value, "keys"):  # binary
        return value.as_py()
    data = value["bytes"].as_py()
    if data is not None:
        return data
    path = value["path"].as_py() if "path" in value.keys() else None
    if not path:
        return ImageDecodeError(ref, "no image", "the image's bytes and path are null")
    try:
        return read_source(os.path.join(os.path.dirname(table), path))
    except ImageDecodeError as e:
        return ImageDecodeError(ref, "no image bytes", f"bytes are null and its path {path!r} gives none ({e.detail})")


# ---------------------------------------------------------------------------------------------------------
# The listing


def scan_parquet(files: Sequence[str], split: str = "train", image_column: str = "image", label_column: str | None = None,
                 caption_column: str | None = None, strict: bool = False) -> Source:
    """List the rows of Parquet files, Arrow IPC files and save_to_disk directories (files and globs as
    `expand` takes them, directories as `datasets` writes them) into one split `split`. Labels from
    `label_column` (integers, class names, or a ClassLabel's ints), captions from `caption_column`; rows
    null in either are skipped with their reasons; with `strict`, the first such row refuses the tables
    instead (SourceError naming the row and why). (A null image is found when the build reads it, where
    the build's own strict applies.)"""
    inputs, dirs = _inputs(files, split)
    if not inputs:
        raise SourceError(f"{', '.join(map(str, files)) or 'no files given'}: no table files")
    base = Path(os.path.commonpath([str(p.resolve().parent) for p, _ in inputs] + [str(d.resolve()) for d in dirs]))
    tables, names_seen = [], {}
    for path, saved_features in inputs:
        fmt = table_format(path)
        try:
            schema = _schema(str(path), fmt)
        except (_pa().ArrowException, OSError) as e:
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
            rows, values = _read_columns(str(path), fmt, columns, image_column)
        except (_pa().ArrowException, OSError) as e:
            raise SourceError(f"{path}: unreadable as {fmt} ({e})") from None
        row = 0
        for unit, n in enumerate(rows):
            for r in range(n):
                ref = f"{rel}:{row}"
                label = values[label_column][row] if label_column else None
                caption = values[caption_column][row] if caption_column else None
                row += 1
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
        reader=TableReader(), locators=locators, units=np.asarray(units, np.int64), strict=strict)
    if names and source.classes:  # labelled: the labels index the ClassLabel's names
        source.classes = names
    return source
