"""Arrow data checked before it is used: takes what pyarrow reads from a table file (arrays, record batches)
and the bytes of an Arrow IPC file, gives them validated in full (`_valid`, `_exact_offsets`), the record
batch messages of the file as they are laid out (`_ipc_messages`), and for a compressed record batch the cells
over the byte cap, from what its buffers declare, before pyarrow decompresses any (`_ipc_oversized`); a
substream of one record batch (`_Substream`); and the pyarrow import (the `parquet` extra) and the table
formats that sources/parquet.py and sources/parquet_pages.py share.

sources/parquet.py's docstring says why each check is needed: pyarrow checks only cheaply when it reads,
and a file that lies made it read wild memory, give wrong values, or decompress bombs whole.
"""
from __future__ import annotations

import io
import os
import struct
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from ..errors import SourceError
from ..limits import over_cap

PARQUET, ARROW_FILE, ARROW_STREAM = "parquet", "arrow file", "arrow stream"


def _pa():
    try:
        import pyarrow as pa
        import pyarrow.ipc  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError as e:  # the `parquet` extra
        raise SourceError(f"reading Parquet or Arrow needs pyarrow: pip install 'dataprep[parquet]' ({e})") from None
    return pa


def _valid(data, what: str):
    """`data` (a record batch, table or array) once pyarrow's full validation passes: offsets inside their
    buffers and increasing, every buffer as long as its type's width needs for the length declared. pyarrow
    checks only cheaply when it reads, and a value read from a batch that lies is wild memory or a wrong
    value; so nothing is read from one before this. (Text is validated as the bytes it is: a cell that is not
    UTF-8 skips its own row: sources/table_cells.py's `_pylist`.) A lie is an ArrowInvalid naming `what`."""
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


# ---------------------------------------------------------------------------------------------------------
# Read-only streams handed to pyarrow: a substream of an IPC file here, a blanked Parquet file in parquet_blanks.py


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
