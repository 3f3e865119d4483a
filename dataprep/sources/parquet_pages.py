"""Parquet pages read before pyarrow sees them: takes a Parquet file and one of its row groups, gives what
the byte cap keeps out of the row group (`_parquet_oversized`, from the page headers, before anything is
decompressed) and a page over the cap streamed a cell at a time (`_page_cells`). The footer and page
headers are read by parquet_footer.py (the project's own Thrift compact reader: pyarrow's Python binding
aborts the process on some lying column metadata), the file as pyarrow reads it with those pages blanked
is parquet_blanks.py's (`_Blanked`); their names are still served from here.

sources/parquet.py reads row groups through these; its docstring says why a page over the cap is never
handed to pyarrow.
"""
from __future__ import annotations

import io
import os
import struct
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from ..limits import over_cap
from .arrow_checks import _pa

# parquet_footer.py's and parquet_blanks.py's names: those used here, and the rest still importable from here, where they lived before
from .parquet_blanks import BLANK_CHUNK, _blank_page, _blank_segments, _Blanked, _blanked_file, _skipped_page  # noqa: F401
from .parquet_footer import (  # noqa: F401
    _CODECS,
    _DATA_PAGE,
    _DATA_PAGE_V2,
    _DICTIONARY_PAGE,
    _I32,
    _INDEX_PAGE,
    _STRUCT,
    PAGE_HEADER_MAX,
    _Chunk,
    _chunk_pages,
    _footer,
    _Page,
    _row_group,
    _thrift_fields,
    _thrift_struct,
    _thrift_value,
    _Truncated,
    _uvarint,
    _varint,
)


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
