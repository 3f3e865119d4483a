"""Parquet pages blanked: takes a Parquet file and the pages (page, leaf) pyarrow must not read, gives the
file as pyarrow reads it with each of those pages replaced by bytes of the same length (`_Blanked`, every
offset the footer records still right): a blank data page of its rows (nulls, or zeros where the leaf is
required: `_blank_page`), then index pages, which readers skip, of at most BLANK_CHUNK each
(`_blank_segments`). pyarrow then reads the other rows of a row group without decompressing a page over
the cap. sources/parquet.py opens its row groups through `_blanked_file`.
"""
from __future__ import annotations

import os

from .arrow_checks import _Seekable
from .parquet_footer import _DATA_PAGE_V2, _I32, _INDEX_PAGE, _STRUCT, _Page, _thrift_fields, _uvarint

BLANK_CHUNK = 1 << 20  # a blanked page's bytes, handed to pyarrow as skipped pages of at most this


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
