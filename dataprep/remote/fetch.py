"""Fetch stage: takes a pack at a URL and the files a dataset (or verify, or convert) needs, gives them in a
local directory, each checked against the manifest's size and sha256 on the way in.

Objects are fetched concurrently (threads; the async stores run them on one event loop), in byte ranges
of `BLOCK`, appended to `NAME.part` and renamed into place only once their sha256 matches: a file present
under its own name is verified. An interrupted fetch (a dropped connection, a stopped server, a killed
process) resumes where its `.part` ends, in this run (retried with backoff) or the next. A damaged or
truncated object is fetched again once, then is an error naming it; a missing object is an error naming it.

Every dataset's URL is first staged here (`resolve`: the manifest and attachments in a local directory);
the shard files come here only for `cache="disk:DIR"` (a verified copy kept for later runs) and for
verify, convert and plan (`local_copy`). RAM and shared-memory caches take the bytes straight from the
store (remote/memory.py).
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from ..errors import DataprepError, PackError
from ..pack.manifest import MANIFEST, check_manifest
from ..progress import Progress, reporter
from .store import Store
from .urls import RemoteError, redact

BLOCK = 64 << 20  # bytes a request asks for (objects up to it in one GET, as s3fs cat does): what an interruption can cost
CONCURRENCY = 16  # objects in flight
ATTEMPTS = 6  # tries of one range before the fetch gives up (backoff 0.25 s doubling: ~16 s in all)
REMOTE = ".remote.json"  # in a fetched pack's directory: where it came from (the URL, redacted for display)


def cache_root() -> Path:
    """Where fetched packs are staged: $DATAPREP_CACHE_DIR, else ~/.cache/dataprep (user-only)."""
    base = Path(os.environ.get("DATAPREP_CACHE_DIR") or Path.home() / ".cache" / "dataprep")
    d = base / "remote"
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    return d


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

    def _manifest_bytes(self) -> bytes:
        try:
            return self.store.read(MANIFEST)
        except RemoteError as e:
            if "missing" not in str(e):
                raise
            if self.store.size("zarr.json") is not None:
                raise PackError(f"{self.shown}: a Zarr pack; packs at URLs are npy packs (convert it: "
                                "dataprep convert PACK --to npy --out URL)") from None
            hint = " (an unfinished upload: objects without a manifest)" if self.store.listing() else ""
            raise PackError(f"{self.store.where(MANIFEST)}: missing; {self.shown} is not a complete pack{hint}") from None

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
        files yet: `fetch` brings those); the manifest goes in last."""
        dest.mkdir(parents=True, exist_ok=True, mode=0o700)
        with _locked(dest):  # ranks opening one URL at once: one fetches, the others find it done
            problems = fetch_files(self.store, self.attachment_files(), dest)
            if problems:
                raise RemoteError(": ".join(problems[0]))
            # the URL itself only when it carries no secret (credentials come from the usual chains)
            origin_rec = json.dumps({"url": self.url if self.url == self.shown else None, "shown": self.shown,
                                     "manifest_sha256": hashlib.sha256(self.raw_manifest).hexdigest()}).encode()
            for name, data in ((REMOTE, origin_rec), (MANIFEST, self.raw_manifest)):  # the manifest last
                if not (dest / name).is_file() or (dest / name).read_bytes() != data:
                    tmp = dest / f".{name}.tmp-{os.getpid()}"
                    tmp.write_bytes(data)
                    os.replace(tmp, dest / name)
        return dest


@contextlib.contextmanager
def _locked(d: Path):
    fd = os.open(d / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def fetch_files(store: Store, items: list[tuple[str, dict]], dest: Path, concurrency: int = CONCURRENCY,
                progress: Callable[[int], None] | None = None, keep_going: bool = False) -> list[tuple[str, str]]:
    """Each (object name, record) into dest/name, checked against the record's bytes and sha256. The byte
    ranges of all objects are fetched `concurrency` at a time (a large object's ranges in parallel too);
    each object's ranges are appended and hashed in order as they arrive, so its `.part` always holds a
    verified-length prefix to resume from. Returns (object URL, what is wrong) for each object that could
    not be fetched whole; with `keep_going` every object is tried (verify reports them all), else the
    first failure stops the rest. `progress(n)` is told of each range's bytes as it arrives, and
    `progress.kept(n)` (where it has one: a `dataprep.progress.Progress`) of those an interrupted fetch
    left in a `.part`."""
    objects = [_Object(store, rel, rec, dest / rel) for rel, rec in items if not _present(dest / rel, rec)]
    resumed = getattr(progress, "kept", None)
    problems: list[tuple[str, str]] = []
    stop = threading.Event()
    if not objects:
        return problems
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="dataprep-fetch") as pool:
        pending = set()

        def submit(obj: "_Object") -> None:
            for start, end in obj.ranges():
                pending.add(pool.submit(fetch_range, obj, start, end))

        def fetch_range(obj: "_Object", start: int, end: int) -> "_Object":
            if stop.is_set() or obj.failed:
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
                obj.failed = obj.failed or f"{store.where(obj.rel)}: cannot write {obj.part} ({e.strerror or e})"
                stop.set()
            return obj

        def start(obj: "_Object") -> None:
            """Begin an attempt; an object with no range left to fetch (empty, or resumed whole) ends now."""
            obj.begin()
            if resumed and obj.attempt == 1 and obj.have_from_start:
                resumed(obj.have_from_start)
            if obj.outstanding:
                submit(obj)
            else:
                settle(obj)

        def settle(obj: "_Object") -> None:
            outcome = obj.finish()
            if outcome == "stopped":
                return  # another object failed first: this one keeps its .part for the next run
            if outcome == "again":
                start(obj)
            elif outcome is not None:
                where = store.where(obj.rel)
                problems.append((where, outcome[len(where) + 2:] if outcome.startswith(where + ": ") else outcome))
                if not keep_going:
                    stop.set()

        for obj in objects:
            start(obj)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                obj = f.result()
                if obj.settled():
                    settle(obj)
    return problems


def record_size(rec: dict) -> tuple[int, str]:
    """(bytes, sha256) of a file record, once they agree with what it says it holds: an npy file is its
    header (at most 64 KiB) plus shape x itemsize bytes, so a damaged manifest cannot send a fetch after
    2**42 bytes. A ValueError otherwise."""
    size, want = int(rec["bytes"]), str(rec["sha256"])
    if size < 0 or len(want) != 64:
        raise ValueError("a negative size or a malformed sha256")
    if "shape" in rec and "dtype" in rec:
        data = int(np.prod(rec["shape"], dtype=np.int64)) * np.dtype(rec["dtype"]).itemsize
        if not data <= size <= data + (64 << 10):
            raise ValueError(f"{size:,} bytes for {rec['dtype']} {rec['shape']}")
    return size, want


def _present(path: Path, rec: dict) -> bool:
    """A file under its own name was renamed there after its checksum matched; its size still must."""
    try:
        return path.stat().st_size == int(rec["bytes"])
    except (OSError, KeyError, TypeError, ValueError):
        return False


class _Object:
    """One object being fetched: its ranges arrive in any order and are appended (and hashed) in order."""

    def __init__(self, store: Store, rel: str, rec: dict, path: Path):
        self.store, self.rel, self.path = store, rel, path
        self.part = path.with_name(path.name + ".part")
        try:
            self.size, self.want = record_size(rec)
        except (KeyError, TypeError, ValueError) as e:
            self.size, self.want, self.bad = -1, "", str(e)
        self.attempt = 0
        self.lock = threading.Lock()

    def begin(self) -> None:
        """Start an attempt: resume the .part the first time (its bytes hashed again), from scratch the second."""
        self.attempt += 1
        self.failed: str | None = None if self.size >= 0 else \
            f"{self.store.where(self.rel)}: the manifest's record of it is unusable ({getattr(self, 'bad', 'no size and sha256')})"
        self.short = self.stopped = False
        self.received = 0  # bytes the store gave, in whatever order
        self.sha = hashlib.sha256()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        have = self.part.stat().st_size if self.attempt == 1 and self.part.exists() else 0
        if have > self.size:
            have = 0
        if have:
            with open(self.part, "rb") as old:
                for chunk in iter(lambda: old.read(1 << 20), b""):
                    self.sha.update(chunk)
        self.file = open(self.part, "ab" if have else "wb")
        self.pos = self.start = self.have_from_start = have
        self.waiting: dict[int, tuple[int, bytes]] = {}
        self.outstanding = len(self.ranges())

    def ranges(self) -> list[tuple[int, int]]:
        if self.failed:
            return []
        return [(a, min(self.size, a + BLOCK)) for a in range(self.start, self.size, BLOCK)]

    def arrived(self, start: int, end: int, data: bytes, progress) -> None:
        got = len(data)  # told to `progress`: `data` is rebound below as waiting ranges are written
        with self.lock:
            self.outstanding -= 1
            self.received += got
            if len(data) != end - start:
                self.short = True  # the object ends early (or the store answered short): truncated
            self.waiting[start] = (end, data)
            while self.pos in self.waiting and not self.short:
                end, data = self.waiting.pop(self.pos)
                self.file.write(data)
                self.sha.update(data)
                self.pos = end
            if progress:
                progress(got)

    def skipped(self, stopped: bool) -> None:
        with self.lock:
            self.outstanding -= 1
            self.stopped = self.stopped or stopped

    def fail(self, why: str) -> None:
        with self.lock:
            self.outstanding -= 1
            self.failed = self.failed or why

    def settled(self) -> bool:
        with self.lock:
            return self.outstanding <= 0 and not getattr(self, "_closed", False)

    def finish(self) -> str | None:
        """None when the object is whole and verified (renamed into place); "again" for a second attempt;
        else what is wrong. A failed fetch keeps its verified-length prefix for the next run."""
        self._closed = True
        self.file.close()
        if self.failed:
            return self.failed
        if self.stopped:
            return "stopped"
        got = self.pos if not self.short else self.have_from_start + self.received
        if got == self.size and not self.short and self.sha.hexdigest() == self.want:
            os.replace(self.part, self.path)
            return None
        self.part.unlink(missing_ok=True)
        what = (f"truncated: {got:,} of the {self.size:,} bytes the manifest records" if got < self.size or self.short else
                f"corrupt: its sha256 {self.sha.hexdigest()[:12]}... is not the manifest's {self.want[:12]}...")
        if self.attempt >= 2:
            return f"{self.store.where(self.rel)}: {what} (fetched twice)"
        self._closed = False
        return "again"


def retried(fn, *args, what_stops: str | None = "missing"):
    """fn(*args), tried ATTEMPTS times with backoff (0.25 s doubling) while it raises a RemoteError that
    does not say `what_stops` (a missing object is not coming back; None: retry every RemoteError)."""
    delay = 0.25
    for attempt in range(ATTEMPTS):
        try:
            return fn(*args)
        except RemoteError as e:
            if (what_stops is not None and what_stops in str(e)) or attempt == ATTEMPTS - 1:
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
        where = Path(cache[5:]).expanduser()
        if not cache[5:]:
            raise DataprepError("cache='disk:DIR' names the directory that keeps the copy (e.g. disk:/local/nvme)")
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
    rec = pack_dir / REMOTE
    if not rec.is_file():
        return None, False
    info = json.loads(rec.read_text())
    if not info.get("url"):
        raise DataprepError(f"{pack_dir}: a staged copy of {info.get('shown')}, whose URL held credentials this "
                            "process was not given; open the URL again")
    rp = RemotePack(info["url"])
    if hashlib.sha256(rp.raw_manifest).hexdigest() != info.get("manifest_sha256"):
        raise PackError(f"{info.get('shown')}: the pack there changed since {pack_dir} was staged from it; open the URL again")
    keep = pack_dir.parent != cache_root()
    _ORIGINS[str(pack_dir)] = (rp, keep)
    return rp, keep


def missing_bytes(items: list[tuple[str, dict]], dest: Path) -> int:
    """The bytes of the objects `fetch_files` would fetch into `dest`: those not there under their own name."""
    total = 0
    for rel, rec in items:
        if not _present(dest / rel, rec):
            try:
                total += int(rec["bytes"])
            except (KeyError, TypeError, ValueError):
                pass
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
    d = Path(tempfile.mkdtemp(prefix="copy-", dir=cache_root()))
    try:
        rp.stage(d)
        files = [(rel, rec) for rel, rec in rp.shard_files() if which is None or which(rel)]
        with reporter(progress, f"fetch {rp.shown}", missing_bytes(files, d), "bytes", default=None) as bar:
            problems = fetch_files(rp.store, files, d, keep_going=keep_going, progress=bar)
        if problems and not keep_going:
            raise RemoteError(": ".join(problems[0]))
        yield rp, d, problems
    finally:
        shutil.rmtree(d, ignore_errors=True)


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
