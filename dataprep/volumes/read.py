"""Read stage for volumes: takes a .npy file or a (multi-page) TIFF, gives a (D, H, W) array and brings its
values to the stored depth.

.npy files are read without pickle (object arrays are refused); TIFF stacks page by page through Pillow
(every page one size, one channel). Depth conversion: uint8 and uint16 sources are rescaled between 8
and 16 bits as images are (x * 257, round(x / 257)); other integer and boolean volumes (label
volumes, non-negative CT numbers) keep their values when they fit; anything else, floats included,
needs a window [lo, hi] mapped linearly onto the stored range.
"""
from __future__ import annotations

import os
import stat

import numpy as np

from ..errors import ImageDecodeError
from ..images.decode import to_depth
from ..settings import VOLUME_MAX_BYTES, over_cap  # limits.py's, through the layer kinds may import

VOLUME_EXTENSIONS = frozenset({".npy", ".tif", ".tiff"})


def read_volume(path: str, max_bytes: int | None = None) -> np.ndarray:
    """The file's volume as a (D, H, W) array of its own dtype. `max_bytes` (None: limits.VOLUME_MAX_BYTES):
    the cap on its bytes: the file's size, and a TIFF's decoded pages as they add up (a small compressed
    TIFF can declare gigabytes), checked before they are held; running out of memory is a skip too
    ("too large")."""
    cap = VOLUME_MAX_BYTES if max_bytes is None else max_bytes
    ext = os.path.splitext(path)[1].lower()
    try:
        st = os.stat(path)
    except OSError as e:
        raise ImageDecodeError(path, "unreadable", e.strerror or str(e)) from None
    if not stat.S_ISREG(st.st_mode):  # a FIFO would block the worker, a device never end
        raise ImageDecodeError(path, "not a regular file")
    big = over_cap(st.st_size, cap)
    if big is not None:
        raise ImageDecodeError(path, "too large", big)
    try:
        if ext == ".npy":
            arr = _read_npy(path)
        elif ext in (".tif", ".tiff"):
            arr = _read_tiff_stack(path, cap)
        else:
            raise ImageDecodeError(path, "not a volume", f"unknown extension {ext!r}")
    except MemoryError:
        raise ImageDecodeError(path, "too large", "out of memory reading it") from None
    if arr.ndim == 4 and arr.shape[-1] == 1:
        arr = arr[..., 0]
    if arr.ndim == 2:
        arr = arr[None]
    if arr.ndim != 3 or 0 in arr.shape:
        raise ImageDecodeError(path, "not a volume", f"shape {arr.shape} is not (D, H, W)")
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_) or np.iscomplexobj(arr):
        raise ImageDecodeError(path, "not a volume", f"dtype {arr.dtype} holds no intensities")
    return arr


def _read_npy(path: str) -> np.ndarray:
    """An .npy file's array, its header checked first: object dtypes (pickle) refused, size matched."""
    from ..pack.shard import npy_header

    try:
        with open(path, "rb") as f:
            shape, fortran, dtype = npy_header(f)
            start = f.tell()
            size = os.fstat(f.fileno()).st_size
    except (ValueError, OSError, EOFError, SyntaxError) as e:
        raise ImageDecodeError(path, "corrupt header", f"not an .npy file ({type(e).__name__}: {e})") from None
    if dtype.hasobject:
        raise ImageDecodeError(path, "not a volume", "object arrays (pickled Python objects) are refused")
    need = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if size - start != need:
        raise ImageDecodeError(path, "truncated", f"holds {size - start} bytes of data, its header says {need}")
    return np.asarray(np.load(path, allow_pickle=False, mmap_mode="r"))


def _read_tiff_stack(path: str, cap: int = VOLUME_MAX_BYTES) -> np.ndarray:
    from PIL import Image, ImageSequence

    pages, held = [], 0
    try:
        with Image.open(path) as im:
            for p in ImageSequence.Iterator(im):
                w, h = p.size
                held += w * h * max(1, len(p.getbands())) * (2 if p.mode.startswith("I;16") else 4 if p.mode in ("I", "F") else 1)
                big = over_cap(held, cap)  # from the page's header, before it is decoded
                if big is not None:
                    raise ImageDecodeError(path, "too large", f"its pages decode to {big} (by page {len(pages) + 1})")
                pages.append(np.asarray(p))
    except ImageDecodeError:
        raise
    except MemoryError:
        raise
    except Exception as e:
        raise ImageDecodeError(path, "corrupt data", f"{type(e).__name__}: {e}") from None
    shapes = {p.shape for p in pages}
    if len(shapes) != 1:
        raise ImageDecodeError(path, "not a volume", f"pages differ in shape: {sorted(shapes)[:3]}")
    if pages[0].ndim != 2:
        raise ImageDecodeError(path, "not a volume", f"pages have {pages[0].shape[2]} channels; a volume has one")
    return np.stack(pages)


def to_stored(arr: np.ndarray, depth: int, window: tuple[float, float] | None, path: str) -> np.ndarray:
    """Bring a volume to uint8 (depth 8) or uint16 (depth 16) as the module docstring says."""
    target = np.uint16 if depth == 16 else np.uint8
    top = np.iinfo(target).max
    if window is not None:
        lo, hi = window
        x = (arr.astype(np.float64) - lo) * (top / (hi - lo))
        return np.rint(np.clip(x, 0, top)).astype(target)
    if arr.dtype in (np.uint8, np.uint16):
        return to_depth(np.ascontiguousarray(arr), depth)
    if arr.dtype == np.bool_ or np.issubdtype(arr.dtype, np.integer):
        lo, hi = (int(arr.min()), int(arr.max())) if arr.size else (0, 0)
        if lo < 0 or hi > top:
            raise ImageDecodeError(path, "values out of range",
                                   f"{arr.dtype} values {lo}..{hi} do not fit {np.dtype(target).name}; pass --window LO,HI")
        return arr.astype(target)
    raise ImageDecodeError(path, "values out of range", f"{arr.dtype} values need --window LO,HI to become {np.dtype(target).name}")
