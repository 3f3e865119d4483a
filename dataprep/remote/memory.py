"""Fetch into memory: takes a pack at a URL and the shard files a RAM or shared-memory cache loads, gives
each file's bytes to the load as it asks for them, checked against the manifest's sha256, without a
staging copy on local disk (a node with more RAM than disk still loads a pack that fits its RAM).

Objects are fetched in the order the load will most likely ask for them, `concurrency` requests at a
time (a large object's byte ranges in parallel), at most `window` bytes ahead of the load; an object the
load asks for out of turn is fetched at once. A dropped range is retried with backoff; a damaged or
truncated object is fetched again once, then is an error naming it; a missing object is an error naming
it. What a load has consumed is released immediately, so memory holds the cache plus the window. The
bytes fetched are reported on stderr when it is a log and the fetch is long (dataprep/progress.py); on a
terminal the cache's own loading line says how far the load is.
"""
from __future__ import annotations

import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import PackError
from ..pack.shard import npy_header_bytes
from ..progress import reporter
from . import fetch
from .fetch import CONCURRENCY, _read_range
from .store import Store
from .urls import RemoteError

WINDOW = 1 << 30  # bytes fetched ahead of the load (plus the object in flight that crosses it)
SMALL = 1 << 20  # objects up to this size are fetched ahead first


class MemoryFetch:
    """The LoadContext reader of a remote pack's staged directory: `read` gives a shard file's array from
    fetched bytes (the local reader's other hooks are the staged directory's)."""

    def __init__(self, store: Store, root: Path, items: list[tuple[str, dict]], local_reader,
                 concurrency: int = CONCURRENCY, window: int = WINDOW, progress=None):
        """`progress`: True shows the bytes fetched (a bar on a terminal, lines in a log), False nothing,
        None lines in a log only; a callable is told of them."""
        self.store, self.root, self.local = store, Path(root), local_reader
        # small files first: the load reads them field by field, one per shard (a round trip each if not ahead)
        self.items = sorted(items, key=lambda it: int(it[1].get("bytes", 0)) > SMALL)
        self.index = {rel: k for k, (rel, _) in enumerate(self.items)}
        self.window = window
        self._done: dict[str, Any] = {}  # rel -> bytes, or the RemoteError it came to
        self._started: set[str] = set()
        self._next = 0
        self._ahead = 0  # bytes started and not yet consumed
        self._cond = threading.Condition()
        self._objects = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="dataprep-fetch")
        self._ranges = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="dataprep-range")
        total = sum(int(rec.get("bytes", 0)) for _, rec in self.items if isinstance(rec.get("bytes", 0), int))
        self.progress = reporter(progress, f"fetch {store.shown}", total, "bytes", default=None)
        # nothing is fetched before the load asks (a segment already filled needs nothing)

    def __getattr__(self, name):  # plans, shard_array, attachments, ... as the staged directory's reader has them
        return getattr(self.local, name)

    # -- scheduling -------------------------------------------------------------------------------------
    def _pump(self) -> None:
        while self._next < len(self.items) and (self._ahead < self.window or self._ahead == 0):
            rel, _ = self.items[self._next]
            self._next += 1
            if rel not in self._started:
                self._start(rel)

    def _start(self, rel: str) -> None:
        self._started.add(rel)
        self._ahead += int(self.items[self.index[rel]][1].get("bytes", 0))
        self._objects.submit(self._fetch, rel)

    def _fetch(self, rel: str) -> None:
        rec = self.items[self.index[rel]][1]
        try:
            data = self._whole(rel, rec)
        except RemoteError as e:
            data = e
        except Exception as e:  # MemoryError, a thread that cannot start, ...: the load must hear of it
            data = RemoteError(f"{self.store.where(rel)}: cannot fetch it ({type(e).__name__}: {e})")
        with self._cond:
            self._done[rel] = data
            self._cond.notify_all()

    def _whole(self, rel: str, rec: dict) -> bytes:
        try:
            size, want = fetch.record_size(rec)
        except (KeyError, TypeError, ValueError) as e:
            raise RemoteError(f"{self.store.where(rel)}: the manifest's record of it is unusable ({e})") from None
        for attempt in (1, 2):
            parts = [self._ranges.submit(self._range, rel, a, min(size, a + fetch.BLOCK)) for a in range(0, size, fetch.BLOCK)]
            data = b"".join(p.result() for p in parts) if len(parts) != 1 else parts[0].result()
            if len(data) == size and hashlib.sha256(data).hexdigest() == want:
                return data
            what = (f"truncated: {len(data):,} of the {size:,} bytes the manifest records" if len(data) < size else
                    "corrupt: its sha256 is not the manifest's")
            if attempt == 2:
                raise RemoteError(f"{self.store.where(rel)}: {what} (fetched twice)")
        raise AssertionError("unreachable")

    def _range(self, rel: str, start: int, end: int) -> bytes:
        data = _read_range(self.store, rel, start, end)
        self.progress(len(data))
        return data

    def _take(self, rel: str) -> bytes:
        with self._cond:
            if rel not in self._started:
                self._start(rel)
            while rel not in self._done:
                self._cond.wait()
            data = self._done.pop(rel)
            self._ahead -= int(self.items[self.index[rel]][1].get("bytes", 0))
            self._pump()
        if isinstance(data, RemoteError):
            raise data
        return data

    # -- the LoadContext hooks --------------------------------------------------------------------------
    def read(self, path, rec: dict[str, Any], out: np.ndarray | None = None, verify: bool = False) -> np.ndarray:
        rel = Path(os.fspath(path)).relative_to(self.root).as_posix()
        if rel not in self.index:
            return self.local.read(path, rec, out, verify)
        data = self._take(rel)  # its sha256 is checked: verify holds by construction
        shape, dtype = tuple(rec["shape"]), np.dtype(rec["dtype"])
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        arr = np.frombuffer(data, dtype, offset=_data_offset(data, rec, self.store.where(rel))).reshape(shape)
        if arr.nbytes != nbytes:
            raise PackError(f"{self.store.where(rel)}: size differs from the manifest's totals")
        if out is None:
            return arr.copy()
        if out.nbytes != nbytes:
            raise PackError(f"{self.store.where(rel)}: size differs from the manifest's totals")
        out.reshape(-1).view(np.uint8)[:] = arr.reshape(-1).view(np.uint8)
        return out.reshape(shape) if out.shape != shape else out

    def close(self) -> None:
        self._objects.shutdown(wait=True, cancel_futures=True)
        self._ranges.shutdown(wait=True, cancel_futures=True)
        self.progress.close()
        self.local.close()


def _data_offset(data: bytes, rec: dict[str, Any], where: str) -> int:
    """Where an npy file's data begins, once its header says the manifest's dtype and shape (byte for byte
    what np.save writes, or any header numpy reads that says the same, C order)."""
    head = npy_header_bytes(rec["dtype"], tuple(rec["shape"]))
    if head is not None and data.startswith(head):
        offset = len(head)
    else:
        import io

        f = io.BytesIO(data)
        try:
            version = np.lib.format.read_magic(f)
            shape, fortran, dtype = np.lib.format._read_array_header(f, version)
        except (ValueError, OSError) as e:
            raise PackError(f"{where}: not an npy file ({e})") from None
        if list(shape) != list(rec["shape"]) or dtype.str != rec["dtype"] or fortran:
            raise PackError(f"{where}: holds {dtype.str} {list(shape)}, the manifest records {rec['dtype']} {rec['shape']}")
        offset = f.tell()
    want = int(np.prod(rec["shape"], dtype=np.int64)) * np.dtype(rec["dtype"]).itemsize
    if len(data) - offset != want:
        raise PackError(f"{where}: {len(data) - offset:,} bytes of data, the manifest's {rec['dtype']} {rec['shape']} needs {want:,}")
    return offset
