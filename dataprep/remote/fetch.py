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
pack is opened (bytes against shape x dtype, and against a bound of its shard's count x `PER_SAMPLE`),
and an object larger than the ranges in flight at once is looked up first (one HEAD): the store's size
must be the manifest's.

Every dataset's URL is first staged here (`resolve`: the manifest and attachments in a local directory);
the shard files come here only for `cache="disk:DIR"` (a verified copy kept for later runs) and for
verify, convert and plan (`local_copy`). RAM and shared-memory caches take the bytes straight from the
store (remote/memory.py).

Where the files go is private: the cache directory ($DATAPREP_CACHE_DIR, else ~/.cache/dataprep) and a
`disk:DIR` must be ours and writable by nobody else (dataprep/safe_paths.py), every file is created
without following symlinks (O_NOFOLLOW, O_EXCL temporaries with random names), and a file a kept copy
already holds is reused only once its sha256 matched (recorded in `.verified.json`, by size, mtime, ctime
and inode, so it is hashed once). Copies for verify, convert and plan are staged as `copy-PID-*` under the
cache directory: `dataprep cache list` shows one a killed run left, `dataprep cache clean` removes it.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
import sys
import tempfile
import threading
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from ..errors import DataprepError, PackError
from ..pack.manifest import MANIFEST, check_manifest
from ..pack.temporaries import cache_base, pid_alive, tree_bytes
from ..pack.temporaries import remove_path as _remove
from ..progress import Progress, reporter
from ..safe_paths import atomic_write, make_private_dir, open_nofollow
from .store import Store, deadline_for, time_left
from .urls import RemoteError, RemoteNotFound, RemoteTimeout, redact

BLOCK = 64 << 20  # bytes a request asks for (objects up to it in one GET, as s3fs cat does): what an interruption can cost
CONCURRENCY = 16  # objects in flight
ATTEMPTS = 6  # tries of one range before the fetch gives up (backoff 0.25 s doubling: ~16 s in all)
REMOTE = ".remote.json"  # in a fetched pack's directory: where it came from (the URL, redacted for display)
VERIFIED = ".verified.json"  # in a fetched pack's directory: the files whose sha256 matched, by identity
HEADER = 64 << 10  # an npy file's header is at most this
PER_SAMPLE = 1 << 36  # bytes one sample may take in one shard file (64 GiB: far above any image or volume)
STAGED = ("copy-", "convert-")  # prefixes of the copies staged under the cache directory, then PID-


class LocalWriteError(DataprepError):
    """The local disk refused a write (full, over quota, read-only): the fetch stops, naming the file."""




def cache_root(create: bool = True) -> Path:
    """Where fetched packs are staged: `cache_base()/remote`, created mode 0700, and refused (UnsafeDirectory)
    when it is not ours or others can write it or a parent that is not sticky."""
    d = cache_base() / "remote"
    if not create:
        return d
    try:
        return make_private_dir(d, "cache directory ($DATAPREP_CACHE_DIR/remote)")
    except OSError as e:
        raise _local_error(e, d, "choose another DATAPREP_CACHE_DIR") from None


def _local_error(e: OSError, path, fix: str) -> DataprepError:
    from ..pack.temporaries import write_failure

    return write_failure(e, path, fix, LocalWriteError)


class RemotePack:
    """A pack at a URL: its manifest (checked) and attachments read at once; its shard files on demand."""

    def __init__(self, url: str, storage_options: dict | None = None):
        self.store = Store(url, storage_options)
        self.url, self.shown = self.store.url, self.store.shown
        raw = self._manifest_bytes()
        try:
            m = json.loads(raw)
        except (UnicodeDecodeError, ValueError) as e:
            raise PackError(f"{self.store.where(MANIFEST)}: unreadable manifest ({e})") from None
        self.manifest = check_manifest(m, self.store.where(MANIFEST))
        self.raw_manifest = raw
        self.key = hashlib.sha256(self.shown.encode() + b"\0" + raw).hexdigest()[:20]
        self._check_records()

    def _manifest_bytes(self) -> bytes:
        try:
            return self.store.read(MANIFEST)
        except RemoteNotFound:
            if self.store.size("zarr.json") is not None:
                raise PackError(f"{self.shown}: a Zarr pack; packs at URLs are npy packs (convert it: "
                                "dataprep convert PACK --to npy --out URL)") from None
            hint = " (an unfinished upload: objects without a manifest)" if self.store.listing() else ""
            raise PackError(f"{self.store.where(MANIFEST)}: missing; {self.shown} is not a complete pack{hint}") from None

    def _check_records(self) -> None:
        """Every shard file's record, before anything is fetched: a size that agrees with its shape and dtype
        (an npy file has both), within its shard's count x PER_SAMPLE bytes. A RemoteError naming the first
        object whose record is unusable."""
        splits = self.manifest.get("splits")
        for split, entry in (splits.items() if isinstance(splits, dict) else ()):
            for s in (entry.get("shards") or []) if isinstance(entry, dict) else ():
                if not isinstance(s, dict) or not isinstance(s.get("files", {}), dict):
                    continue
                count = s.get("count", 0)
                bound = HEADER + (count if isinstance(count, int) and count > 0 else 1) * PER_SAMPLE
                for fname, rec in s.get("files", {}).items():
                    try:
                        if not isinstance(rec, dict):
                            raise ValueError("not a record")
                        record_size(rec, bound, npy=str(fname).endswith(".npy"))
                    except (KeyError, TypeError, ValueError, OverflowError) as e:
                        where = self.store.where(f"{split}/{s.get('name')}/{fname}")
                        raise RemoteError(f"{where}: the manifest's record of it is unusable ({e or type(e).__name__})") from None

    def shard_files(self, splits: Iterable[str] | None = None, arrays: Iterable[str] | None = None,
                    shards: set | None = None) -> list[tuple[str, dict]]:
        """(object name, record) of every shard file of `splits` [all] holding one of `arrays` [all], of the
        shards named `shards` [all]."""
        want = None if arrays is None else {f"{a}.npy" for a in arrays}
        out = []
        for split, entry in self.manifest["splits"].items():
            if splits is not None and split not in splits:
                continue
            for s in entry["shards"]:
                if shards is not None and s["name"] not in shards:
                    continue
                for fname, rec in s.get("files", {}).items():
                    if want is None or fname in want or fname == "shard.json":
                        out.append((f"{split}/{s['name']}/{fname}", rec))
        return [(rel, rec) for rel, rec in out if not rel.endswith("/shard.json")]

    def attachment_files(self) -> list[tuple[str, dict]]:
        recs = self.manifest.get("attachments") or {}
        return [(name, rec) for name, rec in recs.items()] if isinstance(recs, dict) else []

    def stage(self, dest: Path) -> Path:
        """`dest` as a local pack directory of this pack: its manifest, attachments and origin (no shard
        files yet: `fetch` brings those); the manifest goes in last. `dest` must be private (ours, nobody
        else may write it); its files are written through O_EXCL temporaries, never a planted name."""
        try:
            make_private_dir(dest, "staged pack directory")
        except OSError as e:
            raise _local_error(e, dest, "free space there or choose another directory") from None
        with _locked(dest):  # ranks opening one URL at once: one fetches, the others find it done
            problems = fetch_files(self.store, self.attachment_files(), dest)
            if problems:
                raise RemoteError(": ".join(problems[0]))
            # the URL itself only when it carries no secret (credentials come from the usual chains)
            origin_rec = json.dumps({"url": self.url if self.url == self.shown else None, "shown": self.shown,
                                     "manifest_sha256": hashlib.sha256(self.raw_manifest).hexdigest()}).encode()
            for name, data in ((REMOTE, origin_rec), (MANIFEST, self.raw_manifest)):  # the manifest last
                if _read_plain(dest / name, len(data) + 1) != data:
                    try:
                        atomic_write(dest / name, data, 0o600)
                    except OSError as e:
                        raise _local_error(e, dest / name, "free space there or choose another directory") from None
        return dest


def _read_plain(path: Path, limit: int) -> bytes | None:
    """Up to `limit` bytes of a regular file at `path` (never through a symlink), or None."""
    try:
        fd = open_nofollow(path)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        return f.read(limit)


def copy_origin(pack_dir: str | os.PathLike) -> str | None:
    """The URL (as shown, without credentials) a local directory is a staged copy of, from the origin file
    `RemotePack.stage` wrote there (a `cache="disk:DIR"` copy, a dataset's staging); None for a pack built
    or converted here. Such a copy holds the shard files its loads needed, not every file of the pack."""
    raw = _read_plain(Path(pack_dir) / REMOTE, 1 << 20)
    try:
        info = json.loads(raw) if raw is not None else None
    except ValueError:
        return None
    return str(info["shown"]) if isinstance(info, dict) and info.get("shown") else None


@contextlib.contextmanager
def _locked(d: Path):
    lock = d / ".lock"
    try:
        fd = open_nofollow(lock, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise DataprepError(f"{lock}: a symlink where dataprep keeps its lock file; refusing to follow it "
                                "(remove it if you made it)") from None
        raise _local_error(e, lock, "free space there or choose another directory") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise DataprepError(f"{lock}: not a regular file of yours; refusing to use it as a lock")
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


# -- what a directory holds verified -------------------------------------------------------------------------
_HASHED: dict[tuple, str] = {}  # (path, size, mtime_ns, ctime_ns, inode) -> sha256, in this process
_HASHED_LOCK = threading.Lock()


def _identity(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _sha256_of(path: Path, st: os.stat_result) -> str | None:
    key = (str(path), *_identity(st))
    with _HASHED_LOCK:
        if key in _HASHED:
            return _HASHED[key]
    try:
        fd = open_nofollow(path)
    except OSError:
        return None
    h = hashlib.sha256()
    with os.fdopen(fd, "rb") as f:
        if _identity(os.fstat(f.fileno())) != _identity(st):
            return None
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    with _HASHED_LOCK:
        _HASHED[key] = h.hexdigest()
    return h.hexdigest()


class _Verified:
    """`dest/.verified.json`: rel -> [size, mtime_ns, ctime_ns, inode, sha256] of each file whose sha256 was
    found to be the manifest's (fetched, or hashed once when found there). A file is present when it is a
    regular file whose identity is recorded with the manifest's sha256; else it is hashed (and recorded
    when it matches), else fetched again."""

    def __init__(self, dest: Path):
        self.dest, self.changed = Path(dest), False
        raw = _read_plain(self.dest / VERIFIED, 256 << 20)
        try:
            got = json.loads(raw) if raw else {}
        except ValueError:
            got = {}
        self.known: dict[str, list] = got if isinstance(got, dict) else {}
        self.lock = threading.Lock()

    def present(self, rel: str, rec: dict) -> bool:
        try:
            size, want = int(rec["bytes"]), str(rec["sha256"])
        except (KeyError, TypeError, ValueError):
            return False
        path = self.dest / rel
        try:
            st = os.lstat(path)
        except OSError:
            return False
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            return False
        if self.known.get(rel) == [*_identity(st), want]:
            return True
        if _sha256_of(path, st) != want:
            return False
        with self.lock:
            self.known[rel], self.changed = [*_identity(st), want], True
        return True

    def add(self, rel: str, sha: str) -> None:
        try:
            st = os.lstat(self.dest / rel)
        except OSError:
            return
        with self.lock:
            self.known[rel], self.changed = [*_identity(st), sha], True

    def save(self) -> None:
        if not self.changed:
            return
        try:
            atomic_write(self.dest / VERIFIED, json.dumps(self.known).encode(), 0o600)
            self.changed = False
        except OSError:  # a full disk: the files are re-hashed next time, nothing worse
            pass


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


def resolve(pack: Any, cache: str, storage_options: dict | None = None) -> tuple[Any, str]:
    """(local pack directory, cache mode) for a dataset's pack argument: a local pack as it is; a URL as a
    staged directory (its manifest and attachments now, its shard files when the cache is filled), served
    with "ram" or "shm", or with "disk:DIR" from a verified copy in DIR kept for later runs (mapped)."""
    from .urls import is_url

    disk = isinstance(cache, str) and cache.startswith("disk:")
    if not is_url(pack):
        if disk:
            raise DataprepError(f"cache={cache!r} keeps a local copy of a pack at a URL; {pack} is local already: "
                                "serve it with cache='mmap' (or 'ram', 'shm')")
        return pack, cache
    rp = RemotePack(str(pack), storage_options)
    if disk:
        if not cache[5:]:
            raise DataprepError("cache='disk:DIR' names the directory that keeps the copy (e.g. disk:/local/nvme)")
        where = Path(cache[5:]).expanduser()
        try:  # ours, and nobody else may write it: files planted there would be served (dataprep/safe_paths.py)
            make_private_dir(where, "disk cache directory (cache='disk:DIR')")
        except OSError as e:
            raise _local_error(e, where, "choose another directory for cache='disk:DIR'") from None
        dest = where / rp.key
        mode = "mmap"
    elif cache in ("ram", "shm"):
        dest = cache_root() / rp.key
        mode = cache
    else:
        raise DataprepError(f"a pack at a URL is served with cache 'ram', 'shm' or 'disk:DIR' (a verified local copy), "
                            f"not {cache!r}")
    rp.stage(dest)
    _ORIGINS[str(dest)] = (rp, disk)
    return dest, mode


_ORIGINS: dict[str, tuple[RemotePack, bool]] = {}  # staged directory -> (its remote pack, kept for later runs)


def origin(pack_dir: Path) -> tuple[RemotePack | None, bool]:
    """The remote pack a staged directory was made from, and whether its files are kept: as this process
    staged it, or (a spawned worker given the dataset's recipe) from its origin file, if the pack there is
    still the one staged."""
    got = _ORIGINS.get(str(pack_dir))
    if got is not None:
        return got
    raw = _read_plain(Path(pack_dir) / REMOTE, 1 << 20)
    if raw is None:
        return None, False
    try:
        info = json.loads(raw)
    except ValueError:
        return None, False
    if not isinstance(info, dict):
        return None, False
    if not info.get("url"):
        raise DataprepError(f"{pack_dir}: a staged copy of {info.get('shown')}, whose URL held credentials this "
                            "process was not given; open the URL again")
    rp = RemotePack(info["url"])
    if hashlib.sha256(rp.raw_manifest).hexdigest() != info.get("manifest_sha256"):
        raise PackError(f"{info.get('shown')}: the pack there changed since {pack_dir} was staged from it; open the URL again")
    keep = Path(pack_dir).parent != cache_root(create=False)
    _ORIGINS[str(pack_dir)] = (rp, keep)
    return rp, keep


def missing_bytes(items: list[tuple[str, dict]], dest: Path) -> int:
    """The bytes of the objects `fetch_files` would fetch into `dest`: those not there, verified, under their
    own name."""
    total = 0
    verified = _Verified(dest)
    for rel, rec in items:
        if not verified.present(rel, rec):
            try:
                total += int(rec["bytes"])
            except (KeyError, TypeError, ValueError):
                pass
    verified.save()
    return total


def fetch_kept(pack_dir: Path, remote: RemotePack, rels: list[tuple[str, dict]]) -> None:
    """The shard files a load of a kept copy (`disk:DIR`) needs, fetched into it under its lock (one fetcher
    per directory and node; the others find the files there, verified); progress lines when stderr is a log
    and the fetch is long (dataprep/progress.py)."""
    t0 = time.perf_counter()
    with _locked(pack_dir):
        with Progress(f"fetch {remote.shown}", missing_bytes(rels, pack_dir), "bytes", show=None) as bar:
            problems = fetch_files(remote.store, rels, pack_dir, progress=bar)
    if problems:
        raise RemoteError(": ".join(problems[0]))
    total = sum(int(r.get("bytes", 0)) for _, r in rels)
    if total >= (1 << 30) and time.perf_counter() - t0 > 1 and not bar.shown:
        print(f"fetched {redact(remote.url)}: {total / 1e9:.2f} GB in {time.perf_counter() - t0:.1f} s", file=sys.stderr)


@contextlib.contextmanager
def local_copy(url: str, keep_going: bool = False, storage_options: dict | None = None,
               which: Callable[[str], bool] | None = None, progress=None):
    """(the remote pack, a temporary local copy of it, the objects that could not be fetched whole) for
    verify, convert and plan: every shard file, or those whose object names `which` takes; the copy is
    removed afterwards. Without `keep_going` the first bad object is the error. `progress`: True shows the
    bytes fetched (a bar on a terminal, lines in a log), False nothing, None lines in a log only; a
    callable is told of them."""
    rp = RemotePack(url, storage_options)
    with staging_dir("copy") as d:  # `copy-PID-*`: `dataprep cache list|clean` find it if this run is killed
        rp.stage(d)
        files = [(rel, rec) for rel, rec in rp.shard_files() if which is None or which(rel)]
        with reporter(progress, f"fetch {rp.shown}", missing_bytes(files, d), "bytes", default=None) as bar:
            problems = fetch_files(rp.store, files, d, keep_going=keep_going, progress=bar)
        if problems and not keep_going:
            raise RemoteError(": ".join(problems[0]))
        yield rp, d, problems


def missing_objects(rp: RemotePack) -> tuple[int, list[str]]:
    """(objects checked, what is wrong with each that is not there with its recorded size), looked up
    many at once (no object is read)."""
    items = rp.shard_files() + rp.attachment_files()

    def check(item):
        rel, rec = item
        got = rp.store.size(rel)
        if got is None:
            return f"{rp.store.where(rel)}: missing"
        if "bytes" in rec and got != int(rec["bytes"]):
            return f"{rp.store.where(rel)}: {got:,} bytes, the manifest records {int(rec['bytes']):,}"
        return None

    with ThreadPoolExecutor(max_workers=CONCURRENCY, thread_name_prefix="dataprep-info") as pool:
        bad = [b for b in pool.map(check, items) if b]
    return len(items), bad


# -- copies staged under the cache directory ---------------------------------------------------------------
IN_USE = ".in-use"  # in a staged copy: flocked (shared) while a process uses it


@contextlib.contextmanager
def staging_dir(kind: str):
    """A new private directory `KIND-PID-RANDOM` under the cache directory, for a copy this process uses
    (its `.in-use` lock held meanwhile) and removes when it is done; one a killed run left is shown by
    `dataprep cache list` and removed by `cache clean`, never one whose lock is held or whose pid lives."""
    try:
        d = Path(tempfile.mkdtemp(prefix=f"{kind}-{os.getpid()}-", dir=cache_root()))
        fd = open_nofollow(d / IN_USE, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        raise _local_error(e, cache_root(create=False), "free space there or choose another DATAPREP_CACHE_DIR") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
        os.close(fd)


def _in_use(d: Path) -> bool:
    """Whether a process holds a staged copy's `.in-use` lock."""
    try:
        fd = open_nofollow(d / IN_USE, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)




def _pid_of(name: str, prefix: str) -> int | None:
    rest = name[len(prefix):]
    digits = rest.split("-", 1)[0]
    return int(digits) if digits.isdigit() else None




def staged_copies() -> list[dict[str, Any]]:
    """The copies staged under the cache directory (verify, convert and plan of a URL, and a conversion's
    npy staging for an upload): {path, kind, pid, alive, bytes}; one whose pid is gone was left by a
    killed run."""
    from ..safe_paths import check_dir

    root = cache_root(create=False)
    out = []
    try:
        check_dir(root, "cache directory")  # one another user can write holds nothing of ours to list or remove
        names = sorted(os.listdir(root))
    except (OSError, DataprepError):
        return out
    for name in names:
        kind = next((k for k in STAGED if name.startswith(k)), None)
        pid = _pid_of(name, kind) if kind else None
        path = root / name
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if pid is None or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            continue
        out.append({"path": str(path), "kind": kind.rstrip("-"), "pid": pid,
                    "alive": pid_alive(pid) or _in_use(path), "bytes": tree_bytes(path)})
    return out


def clean_staged() -> tuple[list[tuple[str, int]], list[str]]:
    """Remove the staged copies whose process is gone: ([(path, bytes) removed], [paths kept: in use])."""
    removed, kept = [], []
    for c in staged_copies():
        if c["alive"]:
            kept.append(c["path"])
            continue
        shutil.rmtree(c["path"], ignore_errors=True)
        removed.append((c["path"], c["bytes"]))
    return removed, kept
