"""Table cells as the reader and the listing take them: takes a validated Arrow column or cell of a table
file, gives each cell's size from its offsets (`_cell_sizes`, `_image_sizes`: a cell over the cap is never
made a scalar), a column's Python values with a text cell that is not UTF-8 given as `NotUtf8` (`_pylist`),
and an image cell's bytes (`_cell`): binary, or Hugging Face's Image struct's `bytes`, else the file its
`path` names inside the table's folder (`_read_inside`), each skipped with its reason over the byte cap.

An Image struct's `path` is resolved inside the table's folder (the dataset's): a path that is absolute
outside it, climbs out (`../`) or leads out through a symlink is refused with one reason and detail ("bad
path") whatever is there, so no skip record says whether a file outside exists; the file is opened a
component at a time without following symlinks, and skipped by its size (fstat) over the cap.
sources/parquet.py reads tables through these.
"""
from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

import numpy as np

from ..errors import ImageDecodeError
from ..limits import IMAGE_MAX_BYTES, over_cap
from .arrow_checks import _pa


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


def _is_bytes(t) -> bool:
    pa = _pa()
    return (pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)
            or getattr(pa.types, "is_binary_view", lambda t: False)(t))


def _image_sizes(array) -> np.ndarray | None:
    """Each image cell's size in bytes (a binary column's, or its struct's `bytes`), from the offsets."""
    pa = _pa()
    if pa.types.is_struct(array.type):
        k = array.type.get_field_index("bytes")
        return None if k < 0 else _cell_sizes(array.flatten()[k])
    return _cell_sizes(array)


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
