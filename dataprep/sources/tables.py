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
  that type.) Measured on 2,000 rows of ~100 KB images: 1.0 ms of validation in a 53 ms read (Arrow, batches
  of 100), 1.7 ms in 154 ms (Parquet): offsets only, never the bytes.
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
"""
from __future__ import annotations

import errno
import functools
import io
import json
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from ..errors import ImageDecodeError, SourceError
from ..limits import IMAGE_MAX_BYTES, over_cap
from .listing import Source, expand, labelled_split, skip

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


def _valid(data, what: str):
    """`data` (a record batch, table or array) once pyarrow's full validation passes: offsets inside their
    buffers and increasing, every buffer as long as its type's width needs for the length declared. pyarrow
    checks only cheaply when it reads, and a value read from a batch that lies is wild memory or a wrong
    value; so nothing is read from one before this. (Text is validated as the bytes it is: a cell that is not
    UTF-8 skips its own row, `_pylist`.) A lie is an ArrowInvalid naming `what`."""
    pa = _pa()
    try:
        data.validate()  # the cheap checks first: lengths, buffer counts
        columns = data.columns if hasattr(data, "columns") else [data]
        for col in columns:
            for chunk in (col.chunks if isinstance(col, pa.ChunkedArray) else [col]):
                untexted = _untexted(chunk.type)
                (chunk.view(untexted) if untexted != chunk.type else chunk).validate(full=True)
    except pa.ArrowInvalid as e:
        raise pa.ArrowInvalid(f"{what} is invalid ({e})") from None
    return data


def _exact_offsets(array, what: str) -> None:
    """Refuse (ArrowInvalid) text or binary offsets longer than their length needs. Valid offsets read with
    another width than they were written with pass every other check and pair rows with other rows' bytes
    (a stream declaring binary over large_binary batches: int64 offsets [0, a, a + b] read as int32 are
    [0, 0, a]); a writer's own offsets are exactly (length + 1) offsets. (Fixed-width buffers may be longer
    than they need: pyarrow writes a slice's buffer to its parent's end.)"""
    pa = _pa()
    t = array.type
    if pa.types.is_dictionary(t):
        return _exact_offsets(array.dictionary, what)
    if pa.types.is_struct(t):
        for i in range(t.num_fields):
            _exact_offsets(array.field(i), f"{what}.{t.field(i).name}")
        return
    width = 4 if pa.types.is_binary(t) or pa.types.is_string(t) else 8 if pa.types.is_large_binary(t) or pa.types.is_large_string(t) else 0
    offsets = array.buffers()[1] if width else None
    if offsets is not None and offsets.size and offsets.size != (len(array) + array.offset + 1) * width:
        raise pa.ArrowInvalid(f"{what} ({t}) has {offsets.size} bytes of offsets for {len(array)} values, not "
                              f"{(len(array) + array.offset + 1) * width}: its batch is not of the type the file declares")


def _untexted(t):
    """Type `t` with its text (string) types as the binary types of the same layout: what `_valid` checks,
    offsets without UTF-8."""
    pa = _pa()
    if pa.types.is_string(t):
        return pa.binary()
    if pa.types.is_large_string(t):
        return pa.large_binary()
    if getattr(pa.types, "is_string_view", lambda t: False)(t):
        return pa.binary_view()
    if pa.types.is_dictionary(t):
        return pa.dictionary(t.index_type, _untexted(t.value_type), t.ordered)
    if pa.types.is_struct(t):
        return pa.struct([t.field(i).with_type(_untexted(t.field(i).type)) for i in range(t.num_fields)])
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_untexted(t.value_type)))
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_untexted(t.value_type)))
    return t


# ---------------------------------------------------------------------------------------------------------
# Arrow IPC messages: where each record batch is and what its buffers declare, read before pyarrow decodes it


class _Flat:
    """Bounds-checked reads of a flatbuffer (the IPC format's metadata): a table's fields by index."""

    def __init__(self, buf):
        self.buf = memoryview(buf)

    def _int(self, pos: int, n: int, signed: bool = False) -> int:
        if pos < 0 or pos + n > len(self.buf):
            raise ValueError("IPC metadata runs past its end")
        return int.from_bytes(self.buf[pos:pos + n], "little", signed=signed)

    def root(self) -> int:
        return self._int(0, 4)

    def field(self, table: int, i: int) -> int | None:
        """Where field `i` of the table at `table` is, or None when absent."""
        vtable = table - self._int(table, 4, signed=True)
        size = self._int(vtable, 2)
        if 4 + 2 * i + 2 > size:
            return None
        off = self._int(vtable + 4 + 2 * i, 2)
        return table + off if off else None

    def scalar(self, table: int, i: int, n: int, default: int = 0, signed: bool = False) -> int:
        pos = self.field(table, i)
        return default if pos is None else self._int(pos, n, signed)

    def table(self, table: int, i: int) -> int | None:
        pos = self.field(table, i)
        return None if pos is None else pos + self._int(pos, 4)

    def structs(self, table: int, i: int, fmt: str) -> list[tuple]:
        """A vector of structs of `fmt` (struct module format) at field `i`."""
        pos = self.field(table, i)
        if pos is None:
            return []
        start = pos + self._int(pos, 4)
        n, size = self._int(start, 4), struct.calcsize(fmt)
        if start + 4 + n * size > len(self.buf):
            raise ValueError("an IPC metadata vector runs past its end")
        return list(struct.iter_unpack(fmt, self.buf[start + 4:start + 4 + n * size]))


@dataclass(frozen=True)
class _BatchMessage:
    """One record batch message: where its metadata and body are in the file, its rows, its codec (None: not
    compressed), its field nodes (length, nulls), buffers (offset, length in the body) and variadic counts."""

    start: int
    body: int
    end: int
    length: int
    codec: str | None
    nodes: list
    buffers: list
    variadic: list


_RECORD_BATCH, _DICTIONARY_BATCH = 3, 2  # MessageHeader
_IPC_CODECS = {0: "lz4", 1: "zstd"}  # CompressionType: LZ4_FRAME, ZSTD


def _message(data, pos: int, end: int) -> tuple[int, int, _Flat | None, int]:
    """The message at `pos`: (its metadata's start, its body's start, its metadata, body length); None
    metadata at the end-of-stream marker."""
    first = int.from_bytes(data[pos:pos + 4], "little")
    meta = pos + 8 if first == 0xFFFFFFFF else pos + 4  # a continuation marker, or the pre-1.0 framing
    if meta > end:
        raise ValueError(f"a message at byte {pos} runs past the file")
    length = int.from_bytes(data[meta - 4:meta], "little", signed=True)
    if length == 0:
        return meta, meta, None, 0
    if length < 0 or meta + length > end:
        raise ValueError(f"the message at byte {pos} declares {length} bytes of metadata, past the file")
    flat = _Flat(data[meta:meta + length])
    body_length = flat.scalar(flat.root(), 3, 8, signed=True)
    if body_length < 0 or meta + length + body_length > end:
        raise ValueError(f"the message at byte {pos} declares a body past the file")
    return meta, meta + length, flat, body_length


def _batch_message(start: int, body: int, flat: _Flat, body_length: int) -> _BatchMessage:
    root = flat.root()
    if flat.scalar(root, 1, 1) != _RECORD_BATCH:
        raise ValueError(f"the message at byte {start} is not a record batch")
    header = flat.table(root, 2)
    if header is None:
        raise ValueError(f"the record batch at byte {start} has no header")
    compression = flat.table(header, 3)
    codec = None if compression is None else _IPC_CODECS.get(flat.scalar(compression, 0, 1), "unknown")
    buffers = flat.structs(header, 2, "<qq")
    if any(o < 0 or n < 0 or o + n > body_length for o, n in buffers):
        raise ValueError(f"the record batch at byte {start} declares a buffer outside its body")
    return _BatchMessage(start, body, body + body_length, flat.scalar(header, 0, 8, signed=True), codec,
                         flat.structs(header, 1, "<qq"), buffers,
                         [v for (v,) in flat.structs(header, 4, "<q")])


def _ipc_messages(data, fmt: str) -> tuple[list[_BatchMessage], list[tuple[int, int]]]:
    """The record batch messages of an IPC file (in its footer's order) or stream (in its order), and for a
    stream where each message is (start, end) with its kind, for substreams (`_Substream`)."""
    end = len(data)
    if fmt == ARROW_FILE:
        if end < 18 or bytes(data[end - 6:]) != b"ARROW1":
            raise ValueError("no Arrow file footer")
        size = int.from_bytes(data[end - 10:end - 6], "little", signed=True)
        if size <= 0 or size > end - 18:
            raise ValueError("an Arrow file footer of impossible size")
        footer = _Flat(data[end - 10 - size:end - 10])
        out = []
        for offset, meta_length, body_length in footer.structs(footer.root(), 3, "<qi4xq"):
            if offset < 8 or meta_length <= 0 or body_length < 0 or offset + meta_length + body_length > end:
                raise ValueError(f"the footer places a record batch outside the file (byte {offset})")
            meta, body, flat, length = _message(data, offset, end)
            if body > offset + meta_length:
                raise ValueError(f"the record batch at byte {offset} has more metadata than the footer says")
            if flat is None:
                raise ValueError(f"the footer's record batch at byte {offset} is an end-of-stream marker")
            out.append(_batch_message(offset, offset + meta_length, flat, min(length, body_length)))
        return out, []
    out, messages, pos = [], [], 0
    while pos + 4 <= end:
        meta, body, flat, length = _message(data, pos, end)
        if flat is None:
            break
        kind = flat.scalar(flat.root(), 1, 1)
        if kind != (1 if not messages else kind if kind in (_DICTIONARY_BATCH, _RECORD_BATCH) else -1):
            raise ValueError(f"the message at byte {pos} is of kind {kind}: a stream is its schema, then dictionaries "
                             "and record batches")
        messages.append((pos, body + length, kind))
        if kind == _RECORD_BATCH:
            out.append(_batch_message(pos, body, flat, length))
        pos = body + length
    return out, messages


def _type_buffers(t, variadic: Iterator[int]) -> tuple[int, list]:
    """(buffers of one node of type `t`, its children's types), as the IPC format lays them out."""
    pa = _pa()
    if pa.types.is_dictionary(t):
        return 2, []
    if pa.types.is_null(t):
        return 0, []
    if pa.types.is_binary(t) or pa.types.is_string(t) or pa.types.is_large_binary(t) or pa.types.is_large_string(t):
        return 3, []
    if getattr(pa.types, "is_binary_view", lambda t: False)(t) or getattr(pa.types, "is_string_view", lambda t: False)(t):
        return 2 + next(variadic), []
    if pa.types.is_struct(t):
        return 1, [t.field(i).type for i in range(t.num_fields)]
    if pa.types.is_fixed_size_list(t):
        return 1, [t.value_type]
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t):
        return 2, [t.value_type] if not pa.types.is_map(t) else [pa.struct([t.key_field, t.item_field])]
    if getattr(pa.types, "is_list_view", lambda t: False)(t) or getattr(pa.types, "is_large_list_view", lambda t: False)(t):
        return 3, [t.value_type]
    if pa.types.is_union(t):
        return (2 if t.mode == "dense" else 1), [t.field(i).type for i in range(t.num_fields)]
    if getattr(pa.types, "is_run_end_encoded", lambda t: False)(t):
        return 0, [t.run_end_type, t.value_type]
    if isinstance(t, pa.ExtensionType):
        return _type_buffers(t.storage_type, variadic)
    if getattr(t, "bit_width", 0):
        return 2, []
    raise ValueError(f"an IPC layout for type {t} is unknown here")


def _ipc_oversized(data, schema, message: _BatchMessage, columns: Sequence[str], cap: int, name: str, b: int) -> dict[int, str]:
    """{row: detail} of the cells over `cap` in `columns` of a compressed record batch, from what its buffers
    declare, before pyarrow decompresses any (it decompresses a column whole, bombs too): each buffer's
    declared size bounded by what its node's length needs, each text or binary cell's size from its offsets
    (decompressed here: a few bytes a row). A declaration that lies is an ArrowInvalid."""
    pa = _pa()
    variadic = iter(message.variadic + [0] * 1024)
    todo = [(schema.field(i).type, schema.field(i).name in columns, schema.field(i).name) for i in range(len(schema))][::-1]
    node = buf = 0
    over: dict[int, str] = {}
    body = data[message.body:message.end]

    def declared(k: int) -> tuple[int, Any]:
        offset, length = message.buffers[k]
        if length == 0:
            return 0, None
        if length < 8:
            raise pa.ArrowInvalid(f"record batch {b} of {name}: a compressed buffer of {length} bytes")
        size = int.from_bytes(body[offset:offset + 8], "little", signed=True)
        return (length - 8, ("raw", offset + 8, length - 8)) if size == -1 else (size, ("packed", offset + 8, length - 8))

    while todo:
        t, wanted, column = todo.pop()
        n_buffers, children = _type_buffers(t, variadic)
        if node >= len(message.nodes) or buf + n_buffers > len(message.buffers):
            raise pa.ArrowInvalid(f"record batch {b} of {name} has fewer nodes or buffers than its schema needs")
        length = message.nodes[node][0]
        if wanted:
            sizes = [declared(buf + k) for k in range(n_buffers)]
            text = pa.types.is_binary(t) or pa.types.is_string(t) or pa.types.is_large_binary(t) or pa.types.is_large_string(t)
            width = 8 if pa.types.is_large_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_list(t) else 4
            bounds = [(length + 7) // 8]  # validity
            if text or pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t):
                bounds.append((length + 1) * width)
            elif pa.types.is_dictionary(t):
                bounds.append(length * t.index_type.bit_width // 8)
            elif getattr(t, "bit_width", 0) and not children:
                bounds.append((length * t.bit_width + 7) // 8)
            for k, (size, _) in enumerate(sizes):
                limit = bounds[k] + 64 if k < len(bounds) else cap  # a writer may pad to 64 bytes
                if size > limit and not (text and k == 2):
                    raise pa.ArrowInvalid(f"record batch {b} of {name}: column {column!r} declares a buffer of "
                                          f"{size:,} bytes for {length:,} values (at most {limit:,})")
            if text and length:
                size, where = sizes[1]
                if where is None or size < (length + 1) * width:
                    raise pa.ArrowInvalid(f"record batch {b} of {name}: column {column!r} has too few offsets")
                kind, offset, stored = where
                raw = body[offset:offset + stored] if kind == "raw" else \
                    pa.decompress(body[offset:offset + stored], decompressed_size=size, codec=message.codec, asbytes=True)
                offs = np.frombuffer(raw, np.int32 if width == 4 else np.int64, length + 1).astype(np.int64)
                cells = np.diff(offs)
                if (cells < 0).any() or offs[0] < 0 or sizes[2][0] < offs[-1]:
                    raise pa.ArrowInvalid(f"record batch {b} of {name}: column {column!r} has offsets outside its data")
                if sizes[2][0] > offs[-1] - offs[0] + 64:
                    raise pa.ArrowInvalid(f"record batch {b} of {name}: column {column!r} declares {sizes[2][0]:,} bytes "
                                          f"of data for {offs[-1] - offs[0]:,} in its offsets")
                for r in np.flatnonzero(cells > cap).tolist():
                    over.setdefault(r, f"column {column!r}: {over_cap(int(cells[r]), cap)}")
        node += 1
        buf += n_buffers
        todo += [(c, wanted, column) for c in children][::-1]
    return over


@dataclass(frozen=True)
class _Skipped:
    """A record batch not read: its cells over the cap ({row: detail}) and why the others go with them."""

    num_rows: int
    over: dict
    detail: str


class _Seekable(io.RawIOBase):
    """A read-only stream over `_size` bytes at position `_pos`: subclasses give `readinto`."""

    _size = _pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self._pos = offset if whence == 0 else self._pos + offset if whence == 1 else self._size + offset
        return self._pos

    def tell(self) -> int:
        return self._pos


class _Substream(_Seekable):
    """An IPC stream of some messages of a stream file (its schema, its dictionaries, one record batch) and
    an end-of-stream marker, read from the file where they are: pyarrow then decodes that batch alone."""

    def __init__(self, fd: int, ranges: list[tuple[int, int]]):
        super().__init__()
        self._fd, self._parts, self._pos = fd, ranges + [(-1, 8)], 0
        self._size = sum(e - s if s >= 0 else e for s, e in self._parts)

    def readinto(self, b) -> int:
        out, at = bytearray(), 0
        for s, e in self._parts:
            n = e - s if s >= 0 else e
            lo, hi = max(self._pos, at), min(self._pos + len(b), at + n)
            if lo < hi:
                out += os.pread(self._fd, hi - lo, s + lo - at) if s >= 0 else b"\xff\xff\xff\xff\0\0\0\0"[lo - at:hi - at]
            at += n
        b[:len(out)] = out
        self._pos += len(out)
        return len(out)


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
            t.field(i).name
            names(t.field(i).type)
        if pa.types.is_dictionary(t):
            names(t.value_type)

    try:
        for field in schema:
            field.name
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
    for b, batch in enumerate(_arrow_batches(path, fmt, columns or [any_column], cap=cap)):
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
# Parquet pages: their sizes, read from their headers before anything is decompressed

PAGE_HEADER_MAX = 16 << 20  # the longest page header read (statistics make them long): Arrow's own limit
BLANK_CHUNK = 1 << 20  # a blanked page's bytes, handed to pyarrow as skipped pages of at most this
_DATA_PAGE, _INDEX_PAGE, _DICTIONARY_PAGE, _DATA_PAGE_V2 = 0, 1, 2, 3  # parquet.thrift's PageType
_I32, _STRUCT = 5, 12  # Thrift compact protocol types


class _Truncated(ValueError):
    """A Thrift struct that runs past the bytes read."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        if pos >= len(buf):
            raise _Truncated("a Thrift struct runs past the bytes read")
        b = buf[pos]
        pos += 1
        out |= (b & 0x7F) << shift
        if not b & 0x80:
            return out, pos
        shift += 7
        if shift > 70:
            raise ValueError("a varint of more than 10 bytes in a page header")


def _thrift_value(buf: bytes, pos: int, kind: int, depth: int) -> tuple[Any, int]:
    """One value of Thrift compact type `kind` at `pos`: ints, binaries (bytes), lists and structs (dicts by
    field id) decoded; doubles and maps skipped (None)."""
    if kind in (1, 2):  # a boolean field: its value is its type
        return kind == 1, pos
    if kind in (4, 5, 6):
        v, pos = _varint(buf, pos)
        return (v >> 1) ^ -(v & 1), pos
    if kind in (3, 7, 8):
        n, pos = (1, pos) if kind == 3 else (8, pos) if kind == 7 else _varint(buf, pos)
        if pos + n > len(buf):
            raise _Truncated("a Thrift struct runs past the bytes read")
        return (bytes(buf[pos:pos + n]) if kind == 8 else buf[pos] if kind == 3 else None), pos + n
    if depth > 32:
        raise ValueError("a Thrift struct nested too deep")
    if kind == 12:
        return _thrift_struct(buf, pos, depth + 1)
    if kind in (9, 10, 11):  # list, set, map
        if kind == 11:
            n, pos = _varint(buf, pos)
            if not n:
                return None, pos
            if pos >= len(buf):
                raise _Truncated("a Thrift struct runs past the bytes read")
            kinds = (buf[pos] >> 4, buf[pos] & 0x0F)
            pos += 1
        else:
            if pos >= len(buf):
                raise _Truncated("a Thrift struct runs past the bytes read")
            n, kinds = buf[pos] >> 4, (buf[pos] & 0x0F,)
            pos += 1
            if n == 15:
                n, pos = _varint(buf, pos)
        if n > len(buf) - pos:  # every element takes a byte at least
            raise _Truncated("a Thrift list longer than the bytes read")
        out = []
        for _ in range(n):
            for k in kinds:
                if k in (1, 2):  # a boolean in a container: one byte
                    if pos >= len(buf):
                        raise _Truncated("a Thrift struct runs past the bytes read")
                    v, pos = buf[pos] == 1, pos + 1
                else:
                    v, pos = _thrift_value(buf, pos, k, depth + 1)
                out.append(v)
        return (out if kind != 11 else None), pos
    raise ValueError(f"Thrift type {kind}")


def _thrift_struct(buf: bytes, pos: int, depth: int = 0) -> tuple[dict[int, Any], int]:
    out: dict[int, Any] = {}
    last = 0
    while True:
        if pos >= len(buf):
            raise _Truncated("a Thrift struct runs past the bytes read")
        head = buf[pos]
        pos += 1
        if head == 0:
            return out, pos
        delta, kind = head >> 4, head & 0x0F
        if delta:
            fid = last + delta
        else:
            v, pos = _varint(buf, pos)
            fid = (v >> 1) ^ -(v & 1)
        last = fid
        out[fid], pos = _thrift_value(buf, pos, kind, depth)


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _thrift_fields(fields: Sequence[tuple[int, int, Any]]) -> bytes:
    """A Thrift compact struct of (field id, type, value): i32s, booleans (1 true, 2 false) and structs."""
    out, last = bytearray(), 0
    for fid, kind, value in fields:
        out.append((fid - last) << 4 | kind)
        last = fid
        if kind == _I32:
            out += _uvarint((value << 1) ^ (value >> 31))
        elif kind == _STRUCT:
            out += _thrift_fields(value)
    out.append(0)
    return bytes(out)


@dataclass(frozen=True)
class _Chunk:
    """A column chunk as the footer declares it (read here: pyarrow's Python binding aborts the process on
    some lying column metadata, where its C++ reader raises)."""

    path: str
    codec: str
    num_values: int
    start: int
    length: int


_CODECS = {0: "UNCOMPRESSED", 1: "SNAPPY", 2: "GZIP", 3: "LZO", 4: "BROTLI", 5: "LZ4", 6: "ZSTD", 7: "LZ4_RAW"}


@functools.lru_cache(maxsize=16)
def _footer(path: str, size: int, mtime: int) -> tuple[tuple[int, tuple[_Chunk, ...]], ...]:
    """(rows, column chunks) of each row group of a Parquet file, from its footer (FileMetaData)."""
    with open(path, "rb") as f:
        fd = f.fileno()
        tail = os.pread(fd, 8, size - 8) if size >= 12 else b""
        if len(tail) < 8 or tail[4:] != b"PAR1":
            raise ValueError("no Parquet footer (an encrypted footer is not read)")
        length = int.from_bytes(tail[:4], "little")
        if length <= 0 or length > size - 12:
            raise ValueError(f"a Parquet footer of {length:,} bytes in a file of {size:,}")
        meta, _ = _thrift_struct(os.pread(fd, length, size - 8 - length), 0)
    groups = []
    for rg in meta.get(4) or []:
        if not isinstance(rg, dict) or not isinstance(rg.get(3), int):
            raise ValueError("a row group without its row count")
        chunks = []
        for c in rg.get(1) or []:
            m = c.get(3) if isinstance(c, dict) else None
            if not isinstance(m, dict) or not all(isinstance(m.get(k), int) for k in (4, 5, 7, 9)):
                raise ValueError("a column chunk without its metadata")
            start, dictionary = m[9], m.get(11)
            if isinstance(dictionary, int) and 0 < dictionary < start:  # as Arrow places a chunk
                start = dictionary
            path_in_schema = ".".join(p.decode("utf-8", "replace") for p in (m.get(3) or []) if isinstance(p, bytes))
            chunks.append(_Chunk(path_in_schema, _CODECS.get(m[4], "unknown"), m[5], start, m[7]))
        groups.append((rg[3], tuple(chunks)))
    return tuple(groups)


def _row_group(path: str, unit: int) -> tuple[int, tuple[_Chunk, ...]]:
    st = os.stat(path)
    groups = _footer(path, st.st_size, st.st_mtime_ns)
    if not 0 <= unit < len(groups):
        raise ValueError(f"no row group {unit} in its footer")
    return groups[unit]


@dataclass(frozen=True)
class _Page:
    """One page of a column chunk as its header declares it: where it lies in the file (header to the end of
    its body), its PageType, its rows (data pages) and the larger of its two sizes."""

    start: int
    end: int
    kind: int
    rows: int
    size: int
    body: int = 0  # where its body starts
    info: Any = None  # its data page header's fields (by Thrift field id)
    usize: int = 0  # its uncompressed size


def _chunk_pages(fd: int, file_size: int, chunk: _Chunk) -> list[_Page]:
    """The pages of a column chunk, from their headers alone (a small read each): the chunk's range as Arrow
    places it, walked header to header as Arrow walks it. A header that does not parse, or sizes that leave
    the chunk, are a ValueError."""
    start, end = chunk.start, chunk.start + chunk.length
    if start < 4 or chunk.length < 0 or end > file_size:
        raise ValueError(f"its column chunk {chunk.path!r} lies outside the file")
    pages, seen, pos = [], 0, start
    while pos < end and seen < chunk.num_values:
        want = 1 << 10
        while True:
            head = os.pread(fd, min(want, end - pos), pos)
            try:
                fields, n = _thrift_struct(head, 0)
                break
            except _Truncated:
                if len(head) < want or want >= PAGE_HEADER_MAX:
                    raise ValueError(f"a page header of column {chunk.path!r} at byte {pos} does not parse") from None
                want *= 8
        kind, usize, csize = fields.get(1), fields.get(2), fields.get(3)
        if not all(isinstance(v, int) and v >= 0 for v in (kind, usize, csize)) or pos + n + csize > end:
            raise ValueError(f"the page header of column {chunk.path!r} at byte {pos} declares no sizes, "
                             "or sizes past its column chunk")
        sub = fields.get({_DATA_PAGE: 5, _DATA_PAGE_V2: 8}.get(kind, 0))
        values = rows = 0
        if kind in (_DATA_PAGE, _DATA_PAGE_V2):
            if not isinstance(sub, dict) or not isinstance(sub.get(1), int) or sub[1] < 0:
                raise ValueError(f"the data page of column {chunk.path!r} at byte {pos} declares no values")
            values = rows = sub[1]
            if kind == _DATA_PAGE_V2 and isinstance(sub.get(3), int):
                rows = sub[3]
        pages.append(_Page(pos, pos + n + csize, kind, rows, max(usize, csize), pos + n, sub, usize))
        seen += values
        pos += n + csize
    return pages


@dataclass
class _Oversized:
    """What the cap keeps out of one row group (`_parquet_oversized`): {row: detail} of the rows skipped, the
    pages (page, leaf) that pyarrow must not read (blanked), the image pages streamed instead (first row,
    page, leaf, codec), and a detail for the whole row group when it cannot be read within the cap."""

    over: dict
    blanks: list
    streamed: list
    whole: str | None = None


# Codecs a data page over the cap is streamed through (pyarrow's CompressedInputStream), a cell at a time;
# SNAPPY and LZ4_RAW decompress a page whole: such a page is, up to PAGE_BUDGET (its cells then taken one at a
# time from it); past that (and LZ4, Hadoop's framing) its rows are skipped. A dictionary page's values are
# any row's: pyarrow reads it whole, up to PAGE_BUDGET (pyarrow's writer puts up to 1024 images in one
# before it falls back to plain pages: 100 images of 3 MB made one of 286 MiB); past it, its row group is
# skipped.
_STREAMED = {"UNCOMPRESSED": None, "ZSTD": "zstd", "GZIP": "gzip", "BROTLI": "brotli"}
_WHOLE = {"SNAPPY": "snappy", "LZ4_RAW": "lz4_raw"}
PAGE_BUDGET = 1 << 30  # the largest page over the cap read whole (a SNAPPY bomb must take 50 MB of file to pass it)


def _parquet_oversized(path: str, unit: int, columns: Sequence[str], cap: int, image: str | None = None,
                       pf=None) -> _Oversized:
    """What the cap keeps out of row group `unit` of `columns` (their leaves), from the page headers, before
    anything is decompressed. A page over the cap is never handed to pyarrow (which would hold it whole,
    and again as an array): it is blanked, and its rows skipped ("too large"), except a page of the image
    leaf `image` (the column's binary leaf) of PLAIN values through a codec that streams: that page is read
    a cell at a time (`_page_cells`), each cell over the cap skipped by the length before it. `pf`: the file
    open already."""
    pf = pf or _parquet_file(path)
    num_rows, chunks = _row_group(path, unit)
    if len(chunks) != len(pf.schema):
        raise ValueError(f"row group {unit} has {len(chunks)} column chunks for {len(pf.schema)} columns")
    out = _Oversized({}, [], [])
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        for j, chunk in enumerate(chunks):
            leaf = pf.schema.column(j)
            name = leaf.path
            if not any(name == c or name.startswith(c + ".") for c in columns):
                continue
            first = 0
            for p in _chunk_pages(f.fileno(), size, chunk):
                big = over_cap(p.size, cap)
                if p.kind == _DICTIONARY_PAGE:  # its values are anyone's: pyarrow reads it whole, up to the budget
                    if p.size > max(cap, PAGE_BUDGET):
                        out.whole = (f"{over_cap(p.size, max(cap, PAGE_BUDGET))}: the size the dictionary page of column "
                                     f"{name!r} declares; its row group is not read")
                        return out
                    continue
                if p.kind not in (_DATA_PAGE, _DATA_PAGE_V2):
                    continue
                if big:
                    if leaf.max_repetition_level or _blank_page(p.rows, leaf) is None:
                        out.whole = f"{big}: the size a page of column {name!r} declares; its row group is not read"
                        return out
                    out.blanks.append((p, leaf))
                    if name == image and _streams(p, leaf, chunk.codec):
                        out.streamed.append((first, p, leaf, chunk.codec))
                    else:
                        what = "it" if p.rows == 1 else f"it and {p.rows - 1} other row(s)"
                        for r in range(first, min(first + p.rows, num_rows)):
                            out.over.setdefault(r, f"{big}: the size declared by the {chunk.codec} page of column "
                                                   f"{name!r} that holds {what}, which is not read")
                first += p.rows
            if not leaf.max_repetition_level and first != num_rows:
                raise ValueError(f"the pages of column {name!r} hold {first} rows, not the row group's {num_rows}")
    return out


def _streams(page: _Page, leaf, codec: str) -> bool:
    """Whether `_page_cells` can read `page`: PLAIN byte arrays, RLE levels, a codec that streams."""
    info = page.info if isinstance(page.info, dict) else {}
    if codec not in _STREAMED and not (codec in _WHOLE and page.size <= PAGE_BUDGET):
        return False
    if leaf.physical_type != "BYTE_ARRAY" or leaf.max_repetition_level:
        return False
    if page.kind == _DATA_PAGE:
        return info.get(2) == 0 and (not leaf.max_definition_level or info.get(3) == 3)
    return info.get(4) == 0 and not info.get(6) and isinstance(info.get(5, 0), int) and 0 <= info.get(5, 0) <= page.end - page.body


class _Region(io.RawIOBase):
    """`length` bytes of a file from `start`, as a stream."""

    def __init__(self, fd: int, start: int, length: int):
        super().__init__()
        self._fd, self._pos, self._end = fd, start, start + length

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        data = os.pread(self._fd, max(0, min(len(b), self._end - self._pos)), self._pos)
        b[:len(data)] = data
        self._pos += len(data)
        return len(data)


def _read_exactly(stream, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = stream.read(min(n - len(out), BLANK_CHUNK))
        if not chunk:
            raise ValueError(f"a page ends {n - len(out):,} bytes early")
        out += chunk
    return bytes(out)


def _levels(buf: bytes, width: int, count: int) -> np.ndarray:
    """`count` levels of the RLE / bit-packed hybrid encoding, `width` bits each."""
    out, pos, n = np.zeros(count, np.uint8), 0, 0
    nbytes = (width + 7) // 8
    while n < count:
        head, pos = _varint(buf, pos)
        if head & 1:  # bit-packed: groups of 8 values
            size = (head >> 1) * width
            if pos + size > len(buf):
                raise ValueError("levels run past their section")
            bits = np.unpackbits(np.frombuffer(buf, np.uint8, size, pos), bitorder="little").reshape(-1, width)
            values = (bits.astype(np.uint16) << np.arange(width, dtype=np.uint16)).sum(axis=1)
            take = min(len(values), count - n)
            out[n:n + take] = values[:take]
            n, pos = n + take, pos + size
        else:
            if not head >> 1 or pos + nbytes > len(buf):
                raise ValueError("an empty or truncated run of levels")
            take = min(head >> 1, count - n)
            out[n:n + take] = int.from_bytes(buf[pos:pos + nbytes], "little")
            n, pos = n + take, pos + nbytes
    return out


def _page_cells(path: str, page: _Page, leaf, codec: str, cap: int) -> Iterator[tuple[str, Any]]:
    """The rows of one data page of PLAIN byte arrays (its column chunk's `codec`), a cell at a time:
    ("bytes", data), ("null", level) or ("too large", size) for a cell over `cap`, skipped by the length
    written before it. Streamed (decompressed as it is read), or for SNAPPY and LZ4_RAW decompressed whole
    first. A page that does not parse is a ValueError."""
    pa = _pa()
    d = leaf.max_definition_level
    info = page.info
    with open(path, "rb") as f:
        region = _Region(f.fileno(), page.body, page.end - page.body)
        compressed = codec != "UNCOMPRESSED" and (page.kind == _DATA_PAGE or info.get(7, True) is not False)

        def values(size: int):
            if not compressed:
                return region
            if codec in _STREAMED:
                return pa.CompressedInputStream(pa.PythonFile(region, mode="r"), _STREAMED[codec])
            packed = _read_exactly(region, page.end - region._pos)
            return pa.BufferReader(pa.decompress(packed, decompressed_size=size, codec=_WHOLE[codec]))

        if page.kind == _DATA_PAGE_V2:
            raw_levels = _read_exactly(region, info.get(5, 0))  # V2 levels: uncompressed, before the values
            if raw_levels and not d:
                raise ValueError("a page of a required column declares definition levels")
            stream = values(page.usize - len(raw_levels))
        else:
            stream = values(page.usize)
            raw_levels = b""
            if d:
                (n,) = struct.unpack("<I", _read_exactly(stream, 4))
                if n > page.size:
                    raise ValueError(f"a page's levels declare {n:,} bytes, more than the page")
                raw_levels = _read_exactly(stream, n)
        levels = _levels(raw_levels, d.bit_length(), page.rows) if d else np.full(page.rows, 0, np.uint8)
        for level in levels.tolist():
            if level < d:
                yield "null", level
                continue
            (n,) = struct.unpack("<I", _read_exactly(stream, 4))
            if n > page.size:
                raise ValueError(f"a cell declares {n:,} bytes, more than its page")
            if n > cap:
                for k in range(0, n, BLANK_CHUNK):  # read through it, a chunk at a time
                    _read_exactly(stream, min(BLANK_CHUNK, n - k))
                yield "too large", n
            else:
                yield "bytes", _read_exactly(stream, n)


def _blank_page(rows: int, leaf, pad: int = 0) -> bytes | None:
    """A data page (v2, uncompressed) of `rows` values: null, or zeros where the leaf is required (None when
    those would be long), and `pad` bytes of nothing after them."""
    d = leaf.max_definition_level
    if d:
        width = (d.bit_length() + 7) // 8
        levels, values, nulls = _uvarint(rows << 1) + (d - 1).to_bytes(width, "little"), b"", rows  # one RLE run
    else:
        w = {"BOOLEAN": 0, "INT32": 4, "INT64": 8, "INT96": 12, "FLOAT": 4, "DOUBLE": 8, "BYTE_ARRAY": 4,
             "FIXED_LEN_BYTE_ARRAY": leaf.length}.get(leaf.physical_type)
        n = None if w is None else (rows + 7) // 8 if w == 0 else rows * w
        if n is None or n > BLANK_CHUNK:
            return None
        levels, values, nulls = b"", bytes(n), 0
    body = levels + values + bytes(pad)
    v2 = [(1, _I32, rows), (2, _I32, nulls), (3, _I32, rows), (4, _I32, 0), (5, _I32, len(levels)), (6, _I32, 0), (7, 2, False)]
    return _thrift_fields([(1, _I32, _DATA_PAGE_V2), (2, _I32, len(body)), (3, _I32, len(body)), (8, _STRUCT, v2)]) + body


def _skipped_page(length: int) -> bytes:
    """The header of an index page (which readers skip) taking `length` bytes with its body of zeros."""
    for n in range(7, 24):
        head = _thrift_fields([(1, _I32, _INDEX_PAGE), (2, _I32, length - n), (3, _I32, length - n)])
        if len(head) == n:
            return head
    raise ValueError(f"no index page of {length} bytes")


def _blank_segments(page: _Page, leaf) -> list[tuple[int, int, bytes | None]]:
    """The bytes that replace `page` (start, end, bytes or None for zeros): a blank data page of its rows,
    then index pages of at most BLANK_CHUNK (pyarrow reads a skipped page's body whole) to its length."""
    length = page.end - page.start
    head = _blank_page(page.rows, leaf)
    rest = length - len(head)
    if 0 < rest < 32:  # too short for an index page: the blank page's body takes it
        head = next((h for pad in range(rest + 1) if len(h := _blank_page(page.rows, leaf, pad)) == length), None)
        rest = 0
    if head is None or rest < 0:
        raise ValueError(f"the page at byte {page.start} is too short to blank")
    out = [(page.start, page.start + len(head), head)]
    pos = page.start + len(head)
    while pos < page.end:
        n = min(page.end - pos, BLANK_CHUNK)
        if 0 < page.end - pos - n < 32:
            n -= 32
        h = _skipped_page(n)
        out += [(pos, pos + len(h), h), (pos + len(h), pos + n, None)]
        pos += n
    return out


class _Blanked(_Seekable):
    """A Parquet file as pyarrow reads it with some pages replaced by blank ones of the same length (every
    offset the footer records stays right): pyarrow then reads the other rows of a row group without ever
    decompressing a page over the cap."""

    def __init__(self, path: str, blanks: list):
        super().__init__()
        self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self._size = os.fstat(self._fd).st_size
        self._pos = 0
        self._segments = sorted(s for page, leaf in blanks for s in _blank_segments(page, leaf))

    def readinto(self, b) -> int:
        n = max(0, min(len(b), self._size - self._pos))
        lo, hi = self._pos, self._pos + n
        data = bytearray(os.pread(self._fd, n, lo)) if n else bytearray()
        for s, e, payload in self._segments:
            a, z = max(s, lo), min(e, hi)
            if a < z:
                data[a - lo:z - lo] = payload[a - s:z - s] if payload is not None else bytes(z - a)
        b[:len(data)] = data
        self._pos += len(data)
        return len(data)

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()


def _blanked_file(path: str, blanks: list):
    return _Blanked(path, blanks)


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
            found = _parquet_oversized(path, unit, [column], cap, image, pf)
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
