"""Parquet pages read before pyarrow sees them: takes a Parquet file and one of its row groups, gives the
footer's column chunks and each page's declared sizes, read with the project's own Thrift compact reader
(pyarrow's Python binding aborts the process on some lying column metadata), what the byte cap keeps out of
the row group (`_parquet_oversized`, before anything is decompressed), the file as pyarrow reads it with
those pages blanked (`_Blanked`), and a page over the cap streamed a cell at a time (`_page_cells`).

sources/parquet.py reads row groups through these; its docstring says why a page over the cap is never
handed to pyarrow.
"""
from __future__ import annotations

import functools
import io
import os
import struct
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from ..limits import over_cap
from .arrow_checks import _pa, _Seekable

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


def _parquet_oversized(path: str, unit: int, columns: Sequence[str], cap: int, image: str | None = None, *,
                       pf) -> _Oversized:
    """What the cap keeps out of row group `unit` of `columns` (their leaves), from the page headers, before
    anything is decompressed. A page over the cap is never handed to pyarrow (which would hold it whole,
    and again as an array): it is blanked, and its rows skipped ("too large"), except a page of the image
    leaf `image` (the column's binary leaf) of PLAIN values through a codec that streams: that page is read
    a cell at a time (`_page_cells`), each cell over the cap skipped by the length before it. `pf`: the file
    open already (sources/parquet.py's ParquetFile)."""
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
