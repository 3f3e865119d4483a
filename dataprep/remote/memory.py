"""Fetch into memory: takes a pack at a URL and the shard files a RAM or shared-memory cache loads, gives
each file's bytes to the load as it asks for them, checked against the manifest's sha256, without a
staging copy on local disk (a node with more RAM than disk still loads a pack that fits its RAM).

Objects are fetched in the order the load will most likely ask for them, `concurrency` requests at a
time (a large object's byte ranges in parallel), at most `window` bytes ahead of the load; an object the
load asks for out of turn is fetched at once. A dropped range is retried with backoff; a damaged or
truncated object is fetched again once, then is an error naming it; a missing object is an error naming
it. An object's ranges are issued in order, `concurrency` at a time, and its first short range stops it
(a manifest claiming terabytes for a small object costs a few requests, not millions); an object larger
than that is looked up first, and its store's size must be the manifest's. What a load asks for must fit
this machine's memory (RAM and swap) at all, or it is refused before anything is fetched. What a load
has consumed is released immediately, so memory holds the cache plus the window. The bytes fetched are
reported on stderr when it is a log and the fetch is long (dataprep/progress.py); on a terminal the
cache's own loading line says how far the load is.
"""
from __future__ import annotations

import hashlib
import os
import threading
from collections import deque
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
        self.concurrency = concurrency
        declared = sum(b for _, rec in items for b in [rec.get("bytes", 0)] if isinstance(b, int) and b > 0)
        memory = machine_memory()
        if declared > memory:
            local_reader.close()
            raise RemoteError(f"{store.shown}: the manifest records {declared:,} bytes for this load, more than this "
                              f"machine's RAM and swap ({memory:,} bytes) could hold; a manifest that lies, or a pack "
                              "to serve with cache='disk:DIR'")
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
        if size > self.concurrency * fetch.BLOCK:  # more ranges than are in flight at once: the store's size first
            try:
                real = self.store.size(rel)
            except RemoteError:
                real = None  # a store that cannot say: the ranges will tell
            if real is not None and real != size:
                raise RemoteError(f"{self.store.where(rel)}: " + (
                    f"truncated: the store holds {real:,} of the {size:,} bytes the manifest records" if real < size
                    else f"corrupt: the store holds {real:,} bytes, the manifest records {size:,}"))
        for attempt in (1, 2):
            data = self._gather(rel, size)
            if len(data) == size and hashlib.sha256(data).hexdigest() == want:
                return data
            what = (f"truncated: {len(data):,} of the {size:,} bytes the manifest records" if len(data) < size else
                    "corrupt: its sha256 is not the manifest's")
            if attempt == 2:
                raise RemoteError(f"{self.store.where(rel)}: {what} (fetched twice)")
        raise AssertionError("unreachable")

    def _gather(self, rel: str, size: int) -> bytes:
        """The object's bytes, its ranges `concurrency` in flight, in order; the first short range (the object
        ends early) stops the issuing, and what came is returned (short)."""
        block = fetch.BLOCK
        starts = iter(range(0, size, block))
        flight: deque = deque()
        parts: list[bytes] = []
        try:
            for a in starts:
                flight.append((a, self._ranges.submit(self._range, rel, a, min(size, a + block))))
                if len(flight) < self.concurrency:
                    continue
                a0, f = flight.popleft()
                parts.append(f.result())
                if len(parts[-1]) != min(size, a0 + block) - a0:
                    return b"".join(parts)
            while flight:
                a0, f = flight.popleft()
                parts.append(f.result())
                if len(parts[-1]) != min(size, a0 + block) - a0:
                    return b"".join(parts)
            return parts[0] if len(parts) == 1 else b"".join(parts)
        finally:
            for _, f in flight:
                f.cancel()

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


def machine_memory() -> int:
    """MemTotal + SwapTotal from /proc/meminfo (bytes): more than any cache on this machine can hold; a large
    number where it cannot be read."""
    total = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(("MemTotal:", "SwapTotal:")):
                    total += int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return 1 << 62
    return total or (1 << 62)


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
