"""A pack at a URL: takes its URL, gives `RemotePack` (its manifest read and every file record checked, its
manifest and attachments staged in a local directory), the local directory and cache mode a dataset
serves it with (`resolve`; `origin` in a spawned worker), the shard files a kept copy (`cache="disk:DIR"`)
needs fetched into it (`fetch_kept`), a temporary copy for verify, convert and plan (`local_copy`), and
what `info` reports missing (`missing_objects`).

Every dataset's URL is staged here (`resolve`: the manifest and attachments in a local directory); the
shard files come only for `cache="disk:DIR"` (a verified copy kept for later runs) and for verify, convert
and plan (`local_copy`), through fetch.py. RAM and shared-memory caches take the bytes straight from the
store (remote/memory.py).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable

from ..errors import DataprepError, PackError
from ..pack.manifest import MANIFEST, check_manifest
from ..progress import Progress, reporter
from ..safe_paths import atomic_write, make_private_dir
from .cachedir import _local_error, _locked, cache_root, staging_dir
from .fetch import CONCURRENCY, HEADER, fetch_files, record_size
from .store import Store
from .urls import RemoteError, RemoteNotFound, redact
from .verified import _read_plain, missing_bytes

REMOTE = ".remote.json"  # in a fetched pack's directory: where it came from (the URL, redacted for display)
PER_SAMPLE = 1 << 36  # bytes one sample may take in one shard file (64 GiB: far above any image or volume)


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
