"""JPEG segment surgery: takes a JPEG's bytes, gives what its marker segments say and JPEGs cut or mended
from them, decoding nothing: the frame header (`jpeg_header`), the fewest bytes the frame needs (`least_bytes`)
and why a pack would not serve it (`jpeg_problem`); its restart segments (`jpeg_layout`) and the JPEG of those
around a box (`region_jpeg`; `region_of`: the frame size and that cut in one call); a kept source JPEG without
the junk between its segments (`without_junk`) and with restart markers added losslessly (`with_restarts`).
The decoders are codec.py's.

Region decoding. A pack's JPEGs carry a restart marker every few MCUs, at a period that divides an MCU
row (`restart_interval`). Each restart segment is entropy-coded on its own (the DC predictors restart),
so the segments that cover a box, cut out and joined under a frame header that declares the box's size,
are themselves a valid JPEG: `region_jpeg` makes it, and a decoder then reads only those bytes (no
Huffman decoding, IDCT or colour conversion of the rest). Blocks are transformed independently and,
with the fast (non-fancy) upsampling, colour planes are upsampled within their MCU, so the region's
pixels equal the whole image's decoded the same way (tests/test_region_decode.py holds that).

The compiled part (images/_jpegseg.c, built by setup.py where a C compiler is; optional) does the same
cut in one call (`region_of`), and gives a kept source JPEG restart markers without touching its
coefficients (`with_restarts`), so that its crops are region-decoded too. Without it `region_of` takes
the Python path here (the same bytes) and kept sources stay as they are (decoded whole).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

RESTART_MCUS = 4  # the longest restart period: a box's edges are rounded out to at most this many MCUs


def restart_interval(width: int, mcu_width: int = 16) -> int:
    """Restart period (in MCUs) for an image `width` px wide: the largest divisor of its MCUs per row up to
    RESTART_MCUS, so every MCU row holds whole segments and a region's columns are whole segments."""
    mcus = max(1, -(-width // mcu_width))
    return max(d for d in range(1, min(RESTART_MCUS, mcus) + 1) if mcus % d == 0)


_SOF = frozenset((0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF))


_STANDALONE = frozenset((0x01, *range(0xD0, 0xD8)))  # markers without a length: RSTn, TEM


def _next_marker(b, i: int, junk: bool = False) -> tuple[int, int, int] | None:
    """The one step of every walk through a JPEG's marker segments in Python (_jpegseg.c's `next_marker` takes
    the same): the marker at offset `i` of `b`, its fill bytes (FF FF) stepped over, read without decoding
    anything. A walk starts at 2, past SOI, and goes on at `at + 2 + length`; each stops where its question
    is answered.

    Args:
        b: the JPEG's bytes (bytes; or a memoryview, where `junk` is False).
        i: where the marker's FF is.
        junk: step over bytes that start no marker, and FF 00, to the next marker, as libjpeg's next_marker
            does; else there is no marker there.

    Returns:
        (at, marker, length): `at` the FF before the marker's code, `length` its length field (0 for a
        standalone marker, RSTn or TEM, which has none). None where the walk ends: fewer than four bytes
        left, no marker, or a length field under 2.
    """
    n = len(b)
    while i + 3 < n:
        if b[i] != 0xFF:
            if not junk:
                return None
            i = b.find(b"\xff", i)
            if i < 0:
                return None
            continue
        marker = b[i + 1]
        if marker == 0xFF:  # a fill byte
            i += 1
        elif marker in _STANDALONE:
            return i, marker, 0
        elif junk and marker == 0:
            i += 2
        else:
            length = (b[i + 2] << 8) | b[i + 3]
            return (i, marker, length) if length >= 2 else None
    return None


def _sof_at(b) -> int | None:
    """Where a JPEG's first frame header (SOF) lies, found by walking the marker segments without decoding
    anything; None when the bytes are not a JPEG or end before a frame."""
    n = len(b)
    if n < 4 or b[0] != 0xFF or b[1] != 0xD8:
        return None
    i = 2
    while (found := _next_marker(b, i)) is not None:
        i, marker, length = found
        if marker in (0xD9, 0xDA):  # end of image, or scan data before any frame header
            return None
        if marker in _SOF:
            return i if i + 9 < n and length >= 8 else None
        i += 2 + length
    return None


def _bytes_of(buf):
    return memoryview(buf).cast("B") if not isinstance(buf, (bytes, bytearray)) else buf


def jpeg_header(buf) -> tuple[int, int, int] | None:
    """(height, width, components) from a JPEG's frame header (its first SOF segment), read by walking the
    marker segments without decoding anything; None when the bytes are not a JPEG or end before a frame."""
    b = _bytes_of(buf)
    i = _sof_at(b)
    return None if i is None else ((b[i + 5] << 8) | b[i + 6], (b[i + 7] << 8) | b[i + 8], b[i + 9])


def least_bytes(buf) -> int | None:
    """The fewest bytes a complete JPEG with `buf`'s frame header holds, from that header alone: a Huffman
    code is at least a bit, and every block of every component is coded in some scan, with a DC code and an
    end of block in a sequential frame (2 bits), at least the DC code in a progressive or lossless one (1 bit).
    0 for an arithmetic-coded frame (no such floor); None without a frame header whose components are there.
    Bytes short of it are a truncated (or forged) file, which decoders would fill out to the frame's size."""
    b = _bytes_of(buf)
    i = _sof_at(b)
    return None if i is None else _least(b, i)


def _least(b, i: int) -> int | None:
    """least_bytes for the frame header at `i`."""
    comps, marker = b[i + 9], b[i + 1]
    if comps == 0 or i + 9 + 3 * comps >= len(b):
        return None
    if marker >= 0xC9:
        return 0
    h, w = (b[i + 5] << 8) | b[i + 6], (b[i + 7] << 8) | b[i + 8]
    factors = [(b[k] >> 4, b[k] & 15) for k in range(i + 11, i + 11 + 3 * comps, 3)]
    hmax, vmax = max(f for f, _ in factors), max(f for _, f in factors)
    blocks = 0
    for fh, fv in factors:  # a component's blocks: its own size (the frame's, scaled by its factors over the largest) in 8x8 blocks
        if fh < 1 or fv < 1:
            return None
        blocks += ((-(-w * fh // hmax) + 7) >> 3) * ((-(-h * fv // vmax) + 7) >> 3)
    return (blocks * (2 if marker in (0xC0, 0xC1) else 1) + 7) >> 3


def jpeg_problem(buf, height: int, width: int) -> str | None:
    """Why the pack does not serve `buf` as a `height` x `width` JPEG, from its marker segments alone (nothing
    decoded, nothing allocated): no frame header that the pack's walks find, a frame of another size, or too few
    bytes for the frame (`least_bytes`); None where it does. What every serving path asks before a decoder sees
    a stored JPEG, and what a build asks of a source JPEG it keeps."""
    b = _bytes_of(buf)
    i = _sof_at(b)
    if i is None:
        return "no JPEG frame header"
    h, w = (b[i + 5] << 8) | b[i + 6], (b[i + 7] << 8) | b[i + 8]
    if (h, w) != (height, width):
        return f"a {w}x{h} JPEG"
    least = _least(b, i)
    if least is None:
        return "a frame header cut short"
    if len(b) < least:
        return f"{len(b):,} bytes, fewer than a complete {w}x{h} JPEG holds ({least:,})"
    return None


def without_junk(data: bytes) -> bytes:
    """A source JPEG with the bytes between its marker segments before the scan dropped: junk that is no
    marker (libjpeg and Pillow skip it, with a warning), as libjpeg's next_marker finds markers (any
    non-0xFF byte, a stuffed FF 00, fill FFs), and standalone markers. The pack's own header walks (`jpeg_header`, _jpegseg.c)
    refuse such bytes, so a build keeps a source without them. `data` itself where there are none, or
    where the segments do not add up (the caller's checks then decide)."""
    n, out = len(data), bytearray(data[:2])
    if n < 4 or data[:2] != b"\xff\xd8":
        return data
    end = 2
    while (found := _next_marker(data, end, junk=True)) is not None:
        i, marker, length = found
        end = i + 2 + length
        if marker in _STANDALONE:  # RSTn or TEM outside a scan: decoders ignore them, the pack's walks need not
            continue
        if marker in (0xD8, 0xD9) or end > n:
            return data
        out += data[i:end]
        if marker == 0xDA:  # the scan: its entropy-coded data and what follows, as they are
            return data if len(out) == end else bytes(out + data[end:])
    return data


class JpegLayout(NamedTuple):
    """Where a baseline JPEG's restart segments lie: segment k (MCU row k // columns, segment k % columns
    of it) is bytes [starts[k], ends[k]); `header` bytes precede the first; the frame header is at `sof`."""

    header: int
    sof: int
    height: int
    width: int
    mcu_h: int
    mcu_w: int
    interval: int  # MCUs per segment
    columns: int  # segments per MCU row
    rows: int  # MCU rows
    starts: np.ndarray
    ends: np.ndarray


def jpeg_layout(buf: np.ndarray) -> JpegLayout | None:
    """The restart segments of a sequential (SOF0/SOF1) single-scan JPEG whose restart period divides its
    MCU rows; None for any other JPEG (progressive, no or another restart period, a standalone marker before
    the scan, a marker count that does not add up, markers out of sequence): those are decoded whole."""
    b = np.asarray(buf, np.uint8).reshape(-1)
    n = len(b)
    head = bytes(b[: min(n, 4096)])  # the marker segments before the scan (Python ints: faster to walk)
    if n < 4 or head[0] != 0xFF or head[1] != 0xD8:
        return None
    known = _known_header(head)
    if known is None:
        known = _walked_header(b, head)
    return None if known is None else _segments(b, *known)


def _walked_header(b: np.ndarray, head: bytes):
    """_known_header's answer for `b`, whose first bytes are `head`, from a walk through its marker segments to
    the scan (its template kept for the next JPEGs like it); None where they give no layout."""
    n = len(b)
    i, sof, dri, comps, dri_at = 2, -1, 0, 0, -1
    while (found := _next_marker(head, i)) is not None:
        i, marker, length = found
        if marker in _STANDALONE:  # it has no length (the header walks step over it): a length read here jumps elsewhere
            return None
        if i + 2 + length > n:
            return None
        if i + 2 + length > len(head) and marker in (0xC0, 0xC1, 0xDD, 0xDA):
            return _walked_header(b, bytes(b))  # a segment read past `head`: walk the whole file
        if marker in (0xC0, 0xC1):
            if sof >= 0 or length < 8:
                return None
            sof, comps = i, head[i + 9]
            if comps not in (1, 3) or length != 8 + 3 * comps:
                return None
            height, width = (head[i + 5] << 8) | head[i + 6], (head[i + 7] << 8) | head[i + 8]
            factors = [head[i + 11 + 3 * k] for k in range(comps)]
            if min(f >> 4 for f in factors) < 1 or min(f & 15 for f in factors) < 1:
                return None
            hmax, vmax = (max(f >> 4 for f in factors), max(f & 15 for f in factors)) if comps == 3 else (1, 1)
        elif 0xC2 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return None  # progressive, lossless or arithmetic-coded frames
        elif marker == 0xDD:
            if length != 4:
                return None
            dri, dri_at = (head[i + 4] << 8) | head[i + 5], i
        elif marker == 0xDA:
            if sof < 0 or dri == 0 or head[i + 4] != comps:
                return None
            header = i + 2 + length
            if len(_HEADERS) < 16:  # the tables before the scan, as a template the next JPEGs like it match
                _HEADERS.append((header, sof, dri_at, _template(head, header, sof, dri_at), hmax, vmax))
            return header, sof, height, width, hmax, vmax, dri
        elif marker in (0xD8, 0xD9):
            return None
        i += 2 + length
    # the walk ended: past `head`'s bytes where the tables are longer than usual (walk the whole file), or
    # where the segments do not add up
    return None if len(head) == n else _walked_header(b, bytes(b))


# Headers seen (their bytes but the frame size and restart period, and where those lie): a pack's JPEGs
# share their tables, so a match stands for the walk through the marker segments that found them.
_HEADERS: list[tuple[int, int, int, bytes, int, int]] = []


def _template(head: bytes, header: int, sof: int, dri_at: int) -> bytes:
    return head[: sof + 5] + head[sof + 9 : dri_at + 4] + head[dri_at + 6 : header]


def _known_header(head: bytes):
    """(header, sof, height, width, hmax, vmax, interval) where `head` matches a template seen before."""
    for header, sof, dri_at, key, hmax, vmax in _HEADERS:
        if len(head) >= header and _template(head, header, sof, dri_at) == key:
            return (header, sof, (head[sof + 5] << 8) | head[sof + 6], (head[sof + 7] << 8) | head[sof + 8], hmax, vmax,
                    (head[dri_at + 4] << 8) | head[dri_at + 5])
    return None


def _segments(b: np.ndarray, header: int, sof: int, height: int, width: int, hmax: int, vmax: int, dri: int) -> JpegLayout | None:
    """The layout, from the frame and restart period the header gives, once the markers in the entropy-coded
    data add up to them, numbered in sequence (a cut renumbers them, and a decoder meeting one out of
    sequence skips or pads MCUs: the whole image shows what no cut would)."""
    if height == 0 or width == 0 or dri == 0:
        return None
    mcu_h, mcu_w = 8 * vmax, 8 * hmax
    per_row, rows = -(-width // mcu_w), -(-height // mcu_h)
    if per_row % dri:
        return None
    columns = per_row // dri
    ff = np.flatnonzero(b[header:-1] == 0xFF)
    ff += header
    nxt = b[ff + 1]
    rst = ff[(nxt & 0xF8) == 0xD0]
    eoi = ff[nxt == 0xD9]
    segments = rows * columns
    if len(eoi) == 0 or len(rst) != segments - 1 or (len(rst) and rst[-1] > eoi[0]):
        return None
    if np.any((b[rst + 1] & 7) != (np.arange(len(rst)) & 7)):  # out of sequence: decoders resynchronise there
        return None
    starts = np.empty(segments, np.int64)
    ends = np.empty(segments, np.int64)
    starts[0], starts[1:] = header, rst + 2
    ends[:-1], ends[-1] = rst, eoi[0]
    return JpegLayout(header, sof, height, width, mcu_h, mcu_w, dri, columns, rows, starts, ends)


try:  # the compiled part (setup.py builds it where it can; see the module docstring)
    from . import _jpegseg
except ImportError:  # pragma: no cover - an install without a C compiler
    _jpegseg = None


def compiled() -> bool:
    """Whether images/_jpegseg.c was built and imports (region cuts in C, restart markers for kept JPEGs)."""
    return _jpegseg is not None


def region_of(buf: np.ndarray, y0: int, y1: int, x0: int, x1: int, pure: bool = False):
    """The frame's (height, width) and the region JPEG covering rows [y0, y1), columns [x0, x1) of `buf`
    (`region_jpeg`'s bytes) with its origin: (height, width, sub, top, left), `sub` None where `buf` is
    decoded whole (no restart layout, or the region is the whole image); None where `buf` is not a JPEG
    with a frame header. In C where the compiled part is (`pure=True`: the Python path, for tests)."""
    if _jpegseg is not None and not pure:
        return _jpegseg.region(buf, y0, y1, x0, x1)
    head = jpeg_header(buf)
    if head is None:
        return None
    lay = jpeg_layout(buf)
    if lay is None:
        return head[0], head[1], None, 0, 0
    sub, top, left = region_jpeg(buf, lay, y0, y1, x0, x1)
    return head[0], head[1], (None if sub is buf else sub), top, left



def with_restarts(data: bytes) -> bytes:
    """A source JPEG as a pack keeps it, with restart markers every `restart_interval` MCUs added
    losslessly (the same coefficients, so the same pixels: tests/test_jpegseg.py decodes both), so that
    training crops decode only the segments around their box. `data` itself where that is not done:
    no compiled part, a progressive or otherwise unusual JPEG, damaged data, or markers already there."""
    if _jpegseg is None:
        return data
    out = _jpegseg.add_restarts(data, RESTART_MCUS)
    return data if out is None else out


def kept_jpeg(data: bytes, height: int, width: int) -> np.ndarray | None:
    """A source JPEG as a pack keeps it (its coefficients as they are): the junk between its marker segments
    dropped (`without_junk`), restart markers added (`with_restarts`), and then what every serving path takes
    as a `height` x `width` JPEG (`jpeg_problem`); None where it would not be (the build encodes the pixels)."""
    out = with_restarts(without_junk(data))
    return None if jpeg_problem(out, height, width) else np.frombuffer(out, np.uint8)



def region_jpeg(buf: np.ndarray, lay: JpegLayout, y0: int, y1: int, x0: int, x1: int) -> tuple[np.ndarray, int, int]:
    """The smallest JPEG of whole restart segments that covers pixel rows [y0, y1) and columns [x0, x1) of
    `buf` (clipped to the image), and its origin (top, left) in the image's pixels: `buf` itself when
    that is the whole image."""
    cw = lay.interval * lay.mcu_w
    r0, r1 = max(0, y0 // lay.mcu_h), min(lay.rows, -(-y1 // lay.mcu_h))
    c0, c1 = max(0, x0 // cw), min(lay.columns, -(-x1 // cw))
    if r1 <= r0 or c1 <= c0:
        r0, r1, c0, c1 = 0, lay.rows, 0, lay.columns
    if (r0, r1, c0, c1) == (0, lay.rows, 0, lay.columns):
        return buf, 0, 0
    b = np.asarray(buf, np.uint8).reshape(-1)
    raw = b.tobytes()  # bytes slices and one join: cheaper than numpy views per row
    sub_h = min(lay.height, r1 * lay.mcu_h) - r0 * lay.mcu_h
    sub_w = min(lay.width, c1 * cw) - c0 * cw
    sof = lay.sof
    span = c1 - c0  # segments a row of the region holds
    first = np.arange(r0 * lay.columns + c0, r1 * lay.columns, lay.columns)
    a, z = lay.starts[first].tolist(), lay.ends[first + (span - 1)].tolist()
    rows = len(a)
    # each row's bytes (its segments and the markers between them) and then the marker ending it, numbered
    # as the region's restart count has it there (k * span + span - 1); the last row ends with EOI
    ends = [bytes((0xFF, 0xD0 | ((k * span + span - 1) & 7))) for k in range(rows - 1)] + [b"\xff\xd9"]
    parts = [raw[: sof + 5], bytes((sub_h >> 8, sub_h & 255, sub_w >> 8, sub_w & 255)), raw[sof + 9 : lay.header]]
    for k in range(rows):
        parts += (raw[a[k] : z[k]], ends[k])
    out = np.frombuffer(bytearray(b"".join(parts)), np.uint8)
    if span > 1:  # the markers inside each row: renumbered as the region counts them
        length = np.asarray(z) - np.asarray(a) + 2
        base = lay.header - np.asarray(a) + np.concatenate(([0], np.cumsum(length[:-1])))
        inner = (lay.ends[first[:, None] + np.arange(span - 1)] + base[:, None]).reshape(-1)
        out[inner + 1] = 0xD0 | ((np.arange(rows)[:, None] * span + np.arange(span - 1)).reshape(-1) & 7)
    return out, r0 * lay.mcu_h, c0 * cw

