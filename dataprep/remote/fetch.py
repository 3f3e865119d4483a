"""Fetch stage: takes a pack at a URL and the files a dataset (or verify, or convert) needs, gives them in a
local directory, each checked against the manifest's size and sha256 on the way in.

Objects are fetched concurrently (threads; the async stores run them on one event loop), in byte ranges
of `BLOCK`, appended to `NAME.part` and renamed into place only once their sha256 matches. Ranges are
issued lazily, at most twice `concurrency` in flight, so an object's first short range (it ends early)
stops its fetch at once, whatever size the manifest claims for it. An interrupted fetch (a dropped
connection, a stopped server, a killed process) resumes where its `.part` ends, in this run (retried with
backoff) or the next. A damaged or truncated object is fetched again once, then is an error naming it; a
missing object is an error naming it.

A manifest at a URL is not trusted further than it can be checked: every file record is checked when the
pack is opened (bytes against shape x dtype, and against a bound of its shard's count x `PER_SAMPLE`: packs.py),
and an object larger than the ranges in flight at once is looked up first (one HEAD): the store's size
must be the manifest's. Every file is created without following symlinks (O_NOFOLLOW, O_EXCL
temporaries with random names).

The pack's side lives beside this stage: packs.py (`RemotePack`, `resolve`, `local_copy`: what is
fetched, and where), verified.py (which files a directory holds whole, hashed once) and cachedir.py (the
private cache directory, its locks and staged copies). Their public names are still served from here.
"""
from __future__ import annotations

import hashlib
import importlib
import os
import stat
import threading
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import DataprepError
from ..pack.temporaries import remove_path as _remove
from ..safe_paths import open_nofollow

# cachedir.py's and verified.py's public names, which callers import from here, where they lived before
from .cachedir import IN_USE, STAGED, LocalWriteError, _local_error, cache_root, clean_staged, staged_copies, staging_dir  # noqa: F401
from .store import Store, deadline_for, time_left
from .urls import RemoteError, RemoteNotFound, RemoteTimeout
from .verified import VERIFIED, _Verified, missing_bytes  # noqa: F401

BLOCK = 64 << 20  # bytes a request asks for (objects up to it in one GET, as s3fs cat does): what an interruption can cost
CONCURRENCY = 16  # objects in flight
ATTEMPTS = 6  # tries of one range before the fetch gives up (backoff 0.25 s doubling: ~16 s in all)
HEADER = 64 << 10  # an npy file's header is at most this




def fetch_files(store: Store, items: list[tuple[str, dict]], dest: Path, concurrency: int = CONCURRENCY,
                progress: Callable[[int], None] | None = None, keep_going: bool = False) -> list[tuple[str, str]]:
    """Each (object name, record) into dest/name, checked against the record's bytes and sha256. Byte ranges
    are issued lazily, at most 2 x `concurrency` in flight (a large object's ranges in parallel too), in
    object order; each object's ranges are appended and hashed in order as they arrive, so its `.part`
    always holds a verified-length prefix to resume from, and its first short range stops it. Returns
    (object URL, what is wrong) for each object that could not be fetched whole; with `keep_going` every
    object is tried (verify reports them all), else the first failure stops the rest. A local write that
    fails (a full disk) is a LocalWriteError naming the file, whatever `keep_going`. `progress(n)` is told
    of each range's bytes as it arrives, and `progress.kept(n)` (where it has one: a
    `dataprep.progress.Progress`) of those an interrupted fetch left in a `.part`."""
    verified = _Verified(dest)
    try:
        todo = [(rel, rec) for rel, rec in items if not verified.present(rel, rec)]
        objects = deque(_Object(store, rel, rec, dest / rel, verified) for rel, rec in todo)
        problems: list[tuple[str, str]] = []
        if objects:
            _fetch(store, objects, concurrency, progress, keep_going, problems)
        return problems
    finally:
        verified.save()


def _fetch(store: Store, queue: deque, concurrency: int, progress, keep_going: bool, problems: list) -> None:
    resumed = getattr(progress, "kept", None)
    stop = threading.Event()
    limit = 2 * concurrency  # ranges in flight, and objects open at once
    local: list[DataprepError] = []  # a local write failed: the first one is the error
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="dataprep-fetch") as pool:
        # the store's own size of each object larger than the ranges in flight at once: a manifest claiming
        # terabytes for a small object is an error now, not after thousands of requests
        big = [o for o in queue if o.size > limit * BLOCK]
        for o, real in zip(big, pool.map(_store_size, big)):
            if real is not None and real != o.size:
                o.refuse(f"truncated: the store holds {real:,} of the {o.size:,} bytes the manifest records" if real < o.size
                         else f"corrupt: the store holds {real:,} bytes, the manifest records {o.size:,}")
        pending: set = set()
        active: list[_Object] = []

        def fetch_range(obj: "_Object", start: int, end: int) -> "_Object":
            if stop.is_set() or not obj.wanted():
                obj.skipped(stop.is_set())  # counted down all the same, so the object settles
                return obj
            try:
                data = _read_range(store, obj.rel, start, end)
            except RemoteError as e:
                obj.fail(str(e))
                return obj
            try:
                obj.arrived(start, end, data, progress)
            except OSError as e:  # the local disk: full, read-only, ...
                obj.fail(f"cannot write {obj.part}", e)
                stop.set()
            return obj

        def start(obj: "_Object") -> None:
            """Begin an attempt; an object with no range left to fetch (empty, or resumed whole) ends now."""
            try:
                obj.begin()
            except OSError as e:
                local.append(_local_error(e, obj.part, _FIX))
                stop.set()
                return
            if resumed and obj.attempt == 1 and obj.have_from_start:
                resumed(obj.have_from_start)
            active.append(obj)

        def settle(obj: "_Object") -> None:
            outcome = obj.finish()
            if obj.local is not None:
                local.append(_local_error(obj.local, obj.local_path or obj.part, _FIX))
                stop.set()
                return
            if outcome == "stopped":
                return  # another object failed first: this one keeps its .part for the next run
            if outcome == "again":
                start(obj)
            elif outcome is not None:
                where = store.where(obj.rel)
                problems.append((where, outcome[len(where) + 2:] if outcome.startswith(where + ": ") else outcome))
                if not keep_going:
                    stop.set()

        def top_up() -> None:
            """Issue ranges until `limit` are in flight: the first open object with one to issue, else the
            next object opened; an object that issues no more and has none in flight is settled."""
            while True:
                for obj in list(active):
                    if obj.settled(stop):
                        active.remove(obj)
                        settle(obj)
                while len(pending) < limit:
                    r = next(((o, rng) for o in active for rng in [o.take(stop, limit * BLOCK)] if rng), None)
                    if r is None:
                        if queue and len(active) < limit and not stop.is_set():
                            start(queue.popleft())
                            continue
                        break
                    obj, (a, b) = r
                    pending.add(pool.submit(fetch_range, obj, a, b))
                if not any(o.settled(stop) for o in active):
                    return

        top_up()
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                f.result()
            top_up()
        for obj in active:  # nothing in flight: whatever is left was stopped
            obj.finish()
    if local:
        raise local[0]


_FIX = "free space there (or choose another directory) and run again: the fetch resumes where it stopped"


def _store_size(obj: "_Object") -> int | None:
    try:
        return obj.store.size(obj.rel)
    except RemoteError:  # a store that cannot say: the ranges will tell
        return None


def record_size(rec: dict, bound: int | None = None, npy: bool = False) -> tuple[int, str]:
    """(bytes, sha256) of a file record, once they agree with what it says it holds: an npy file (`npy`:
    one must say its shape and dtype) is its header (at most 64 KiB) plus shape x itemsize bytes, so a
    damaged manifest cannot send a fetch after 2**42 bytes; and at most `bound` bytes. A ValueError
    otherwise."""
    size, want = rec["bytes"], rec["sha256"]
    if not isinstance(size, int) or isinstance(size, bool) or not isinstance(want, str):
        raise ValueError("its bytes are not a whole number, or its sha256 not a string")
    if size < 0 or len(want) != 64 or any(c not in "0123456789abcdef" for c in want.lower()):
        raise ValueError("a negative size or a malformed sha256")
    if "shape" in rec and "dtype" in rec:
        shape = rec["shape"]
        if not isinstance(shape, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
            raise ValueError(f"shape {shape!r} is not a list of sizes")
        data = int(np.prod(shape, dtype=object)) * np.dtype(rec["dtype"]).itemsize
        if not data <= size <= data + HEADER:
            raise ValueError(f"{size:,} bytes for {rec['dtype']} {rec['shape']}")
    elif npy:
        raise ValueError(f"{size:,} bytes of an npy file with no shape and dtype")
    if bound is not None and size > bound:
        raise ValueError(f"{size:,} bytes, more than its shard's samples can hold ({bound:,})")
    return size, want


class _Object:
    """One object being fetched: its ranges are issued in order, arrive in any order, and are appended (and
    hashed) in order; the first short one stops the issuing."""

    def __init__(self, store: Store, rel: str, rec: dict, path: Path, verified: _Verified | None = None):
        self.store, self.rel, self.path, self.verified = store, rel, path, verified
        self.part = path.with_name(path.name + ".part")
        self.refused: str | None = None
        try:
            self.size, self.want = record_size(rec, npy=rel.endswith(".npy") and "/" in rel)
        except (KeyError, TypeError, ValueError, OverflowError) as e:
            self.size, self.want = -1, ""
            self.refused = f"the manifest's record of it is unusable ({e})"
        self.attempt = 0
        self.file = None
        self.local: OSError | None = None
        self.local_path: Path | None = None
        self.lock = threading.Lock()
        self._closed = True

    def refuse(self, why: str) -> None:
        """Fail every attempt with `why`, without a request."""
        self.refused = why

    def begin(self) -> None:
        """Start an attempt: resume the .part the first time (its bytes hashed again), from scratch the second.
        The .part is never opened through a symlink: anything but a regular file there is removed first."""
        self.attempt += 1
        self.failed: str | None = f"{self.store.where(self.rel)}: {self.refused}" if self.refused else None
        self.short = self.stopped = False
        self.received = 0  # bytes the store gave, in whatever order
        self.inflight = 0
        self.sha = hashlib.sha256()
        self.waiting: dict[int, tuple[int, bytes]] = {}
        self._closed = False
        have = 0
        if not self.failed:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                st = os.lstat(self.part)
            except FileNotFoundError:
                st = None
            if st is not None and (self.attempt > 1 or not stat.S_ISREG(st.st_mode) or st.st_size > self.size):
                _remove(self.part)
            elif st is not None:
                have = st.st_size
        fd = None
        if have:
            fd = open_nofollow(self.part, os.O_RDWR | os.O_APPEND)
            if not stat.S_ISREG(os.fstat(fd).st_mode) or os.fstat(fd).st_size != have:
                os.close(fd)
                fd, have = None, 0
                _remove(self.part)
            else:
                pos = 0
                while pos < have:
                    chunk = os.pread(fd, min(1 << 20, have - pos), pos)
                    if not chunk:
                        break
                    self.sha.update(chunk)
                    pos += len(chunk)
        if not self.failed:
            if fd is None:  # from scratch: whatever is at the name goes (an empty .part, a symlink), then a new file
                _remove(self.part)
                fd = open_nofollow(self.part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            self.file = open(fd, "ab" if have else "wb")
        self.pos = self.start = self.next = self.have_from_start = have

    def wanted(self) -> bool:
        """Whether ranges of this attempt are still worth fetching."""
        return not (self.failed or self.short)

    def take(self, stop: threading.Event, window: int) -> tuple[int, int] | None:
        """The next range to fetch, or None: none left, the object failed or ended short, or it is `window`
        bytes ahead of what is written (an earlier range is slow: waiting, not issuing)."""
        with self.lock:
            if self._closed or stop.is_set() or not self.wanted() or self.next >= self.size:
                return None
            if self.next - self.pos >= window:
                return None
            a, b = self.next, min(self.size, self.next + BLOCK)
            self.next = b
            self.inflight += 1
            return a, b

    def settled(self, stop: threading.Event) -> bool:
        """Nothing in flight and nothing more to issue: ready to finish."""
        with self.lock:
            if self._closed or self.inflight:
                return False
            if stop.is_set():
                self.stopped = self.stopped or (self.wanted() and self.next < self.size)
                return True
            return not self.wanted() or self.next >= self.size

    def arrived(self, start: int, end: int, data: bytes, progress) -> None:
        got = len(data)  # told to `progress`: `data` is rebound below as waiting ranges are written
        with self.lock:
            self.inflight -= 1
            self.received += got
            if len(data) != end - start:
                self.short = True  # the object ends early (or the store answered short): truncated
            self.waiting[start] = (end, data)
            while self.pos in self.waiting and not self.short:
                end, data = self.waiting.pop(self.pos)
                self.file.write(data)
                self.sha.update(data)
                self.pos = end
            if self.short:
                self.waiting.clear()
            if progress:
                progress(got)

    def skipped(self, stopped: bool) -> None:
        with self.lock:
            self.inflight -= 1
            self.stopped = self.stopped or stopped

    def fail(self, why: str, local: OSError | None = None) -> None:
        """A range failed: the store's error (`why` names the object already), or (`local`) writing the
        range that had arrived (its count already taken down)."""
        with self.lock:
            if local is None:
                self.inflight -= 1
                self.failed = self.failed or why
            else:
                self.local, self.local_path = self.local or local, self.part
                self.failed = self.failed or f"{self.store.where(self.rel)}: {why}"

    def finish(self) -> str | None:
        """None when the object is whole and verified (renamed into place); "again" for a second attempt;
        "stopped" when the fetch stopped first (its .part kept); else what is wrong. A failed fetch keeps its
        verified-length prefix for the next run."""
        if self._closed:
            return "stopped"
        self._closed = True
        if self.file is not None:
            try:
                self.file.close()  # a buffered write's flush: where a full disk often shows
            except OSError as e:
                self.local, self.local_path = self.local or e, self.part
            self.file = None
        if self.local is not None:
            return "stopped"
        if self.failed:
            return self.failed
        if self.stopped:
            return "stopped"
        got = self.pos if not self.short else self.have_from_start + self.received
        if got == self.size and not self.short and self.sha.hexdigest() == self.want:
            try:
                os.replace(self.part, self.path)
            except OSError as e:
                self.local, self.local_path = e, self.path
                return "stopped"
            if self.verified is not None:
                self.verified.add(self.rel, self.want)
            return None
        _remove(self.part)
        what = (f"truncated: {got:,} of the {self.size:,} bytes the manifest records" if got < self.size or self.short else
                f"corrupt: its sha256 {self.sha.hexdigest()[:12]}... is not the manifest's {self.want[:12]}...")
        if self.attempt >= 2:
            return f"{self.store.where(self.rel)}: {what} (fetched twice)"
        return "again"


def retried(fn, *args, what_stops: type[RemoteError] | None = RemoteNotFound):
    """fn(*args), tried ATTEMPTS times with backoff (0.25 s doubling) while it raises a RemoteError that is
    not a `what_stops` (a missing object is not coming back; None: retry every RemoteError) nor a
    RemoteTimeout. All the tries share one deadline (remote/store.py): a store that hangs is an error within
    it, not ATTEMPTS times it."""
    delay = 0.25
    with deadline_for():
        for attempt in range(ATTEMPTS):
            try:
                return fn(*args)
            except RemoteError as e:
                left = time_left()
                if (what_stops is not None and isinstance(e, what_stops)) or attempt == ATTEMPTS - 1 \
                        or isinstance(e, RemoteTimeout) or (left is not None and left <= delay):
                    raise
                time.sleep(delay)
                delay *= 2
    raise AssertionError("unreachable")


def _read_range(store: Store, rel: str, start: int, end: int) -> bytes:
    return retried(store.read, rel, start, end)


# packs.py's names, which callers import from here, where they lived before: packs.py imports this module,
# so they are looked up when first asked for (PEP 562), not imported above
_PACKS = ("REMOTE", "PER_SAMPLE", "RemotePack", "copy_origin", "resolve", "origin", "fetch_kept", "local_copy", "missing_objects")


def __getattr__(name: str) -> Any:
    if name in _PACKS:
        return getattr(importlib.import_module(".packs", __package__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
