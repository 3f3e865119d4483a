"""Parquet's footer and page headers, read without pyarrow: takes a Parquet file (and one of its row
groups), gives the footer's row groups and their column chunks (`_footer`, `_row_group`: pyarrow's Python
binding aborts the process on some lying column metadata) and each page of a column chunk as its header
declares it (`_chunk_pages`: where it lies, its kind, rows and sizes), through the project's own Thrift
compact reader (`_thrift_struct`; `_thrift_fields` writes the few structs a blank page needs). A header
that does not parse, or sizes that leave the chunk or the file, are a ValueError.
sources/parquet_pages.py weighs the pages against the cap through these.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any, Sequence

PAGE_HEADER_MAX = 16 << 20  # the longest page header read (statistics make them long): Arrow's own limit
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
