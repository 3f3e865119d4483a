"""Upload stage: takes a local npy pack (or one being built) and a URL, gives the same pack at the URL,
its manifest written last, so a store never shows a complete-looking unfinished pack.

During a build, `Publisher` uploads each shard as soon as the build publishes it (its directory renamed
into place), many at once, while later shards are still being made; at the end it uploads what is left,
the attachments, removes objects under the prefix that the new pack does not have (a previous pack's
shards), and writes the manifest. Before anything is uploaded the prefix's old manifest is removed, so a
rebuild never leaves an old manifest beside new shards. Each object's size is checked after its upload.
"""
from __future__ import annotations

import json
import re
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from ..errors import PackExistsError, option
from ..pack.manifest import MANIFEST, read_manifest_file
from ..pack.shard import SHARD_RECORD, TMP_PREFIX
from .fetch import CONCURRENCY, retried
from .store import Store
from .urls import RemoteError

PACK_OBJECT = re.compile(r"^[^/]+/[^/]+/[^/]+$")  # split/shard/file: what a pack (or an unfinished upload) holds


def claim(url: str, overwrite: bool, storage_options: dict | None = None, resume: bool = False) -> Store:
    """The store a build will publish to: refused when a pack is there already (unless `overwrite`, which
    removes its manifest first, so the old pack stops looking complete before a byte of the new one lands),
    and refused when the prefix holds anything that is not a pack's or an unfinished upload's objects
    (whatever the flags: nothing under it is ever removed that a pack did not put there)."""
    store = Store(url, storage_options)
    old = store.size(MANIFEST) is not None
    there = store.listing()
    foreign = [rel for rel in there if rel != MANIFEST and not PACK_OBJECT.match(rel)]
    if old:
        try:
            foreign = [rel for rel in foreign if rel not in (json.loads(store.read(MANIFEST)).get("attachments") or {})]
        except (ValueError, AttributeError):
            pass
    if foreign:
        raise PackExistsError(f"{store.shown}: holds objects that are not a dataprep pack's ({', '.join(foreign[:3])}"
                              f"{' ...' if len(foreign) > 3 else ''}); choose an empty prefix")
    if old:
        if not overwrite:
            raise PackExistsError(f"{store.where(MANIFEST)}: a pack is there already; pass {option('overwrite')} to replace it")
        store.remove(MANIFEST)
    elif there and not (overwrite or resume):
        raise PackExistsError(f"{store.shown}: holds an unfinished upload (shards, no manifest); pass {option('resume')} to "
                              f"continue it or {option('overwrite')} to replace it")
    store.prepare()
    return store


class Publisher:
    """Uploads a local pack directory's shards to `store` as they appear, then the rest, manifest last."""

    def __init__(self, local: Path, store: Store, concurrency: int = CONCURRENCY, poll: float = 0.5):
        self.local, self.store, self.poll = Path(local), store, poll
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="dataprep-upload")
        self._sent: dict[str, tuple[tuple[int, int], Future]] = {}  # rel -> ((size, mtime) sent, upload)
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self.bytes = 0
        self.t0 = time.perf_counter()

    def start(self) -> "Publisher":
        self._watcher = threading.Thread(target=self._watch, daemon=True, name="dataprep-upload-watch")
        self._watcher.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(self.poll):
            try:
                self._scan()
            except OSError:
                pass  # a directory renamed or removed under the scan: the next one sees it

    def _scan(self) -> None:
        """Send every file of every published shard directory (shard.json last in it: a shard on the store
        is complete when its record is there) not sent yet."""
        if not self.local.is_dir():
            return
        for split in sorted(p for p in self.local.iterdir() if p.is_dir() and not p.name.startswith(".")):
            for shard in sorted(p for p in split.iterdir() if p.is_dir() and not p.name.startswith(TMP_PREFIX)):
                if not (shard / SHARD_RECORD).is_file():
                    continue
                files = sorted(f for f in shard.iterdir() if f.is_file() and f.name != SHARD_RECORD)
                for f in [*files, shard / SHARD_RECORD]:
                    self._send(f)

    def _send(self, path: Path) -> None:
        """Upload `path` unless this very file (its size and mtime) was sent: a shard a resumed build makes
        again is a new file under the old name, and is sent again."""
        rel = path.relative_to(self.local).as_posix()
        st = path.stat()
        stamp = (st.st_size, st.st_mtime_ns)
        if rel in self._sent and self._sent[rel][0] == stamp:
            return
        self._sent[rel] = (stamp, self._pool.submit(self._put, path, rel))

    def _put(self, path: Path, rel: str) -> None:
        size = path.stat().st_size

        def once() -> None:
            self.store.upload(path, rel)
            got = self.store.size(rel)
            if got != size:
                raise RemoteError(f"{self.store.where(rel)}: uploaded {size:,} bytes, the store holds {got}")

        retried(once, what_stops=None)  # a transient failure must not lose an hours-long build
        self.bytes += size

    def finish(self) -> dict:
        """Upload what is left (the build is over and its manifest written locally), remove objects the pack
        does not have, then write the manifest. Returns {bytes, objects, files, shard_records, seconds}."""
        self._stop.set()
        if self._watcher:
            self._watcher.join()
        m = read_manifest_file(self.local)  # checks the local pack is complete before anything claims it is
        wanted = {MANIFEST}
        records = [(f"{split}/{s['name']}/{fname}", rec) for split, entry in m["splits"].items() for s in entry["shards"]
                   for fname, rec in s.get("files", {}).items()]
        records += [(name, rec) for name, rec in (m.get("attachments") or {}).items()]
        for rel, rec in records:  # every object the manifest names is sent as it is now, or there is no manifest
            wanted.add(rel)
            path = self.local / rel
            if not path.is_file() or path.stat().st_size != int(rec.get("bytes", -1)):
                raise RemoteError(f"{self.local / rel}: the manifest records it ({rec.get('bytes')} bytes) but the staged "
                                  "build does not hold it so; nothing was published (with --engine dask, the workers must "
                                  "write where the driver stages: set DATAPREP_CACHE_DIR to a shared directory)")
            self._send(path)
        for split, entry in m["splits"].items():
            for s in entry["shards"]:
                rel = f"{split}/{s['name']}/{SHARD_RECORD}"
                wanted.add(rel)
                if (self.local / rel).is_file():
                    self._send(self.local / rel)
        self._wait()
        for rel in self.store.listing():  # a previous pack's shards; never anything a pack did not put there
            if rel not in wanted and PACK_OBJECT.match(rel):
                self.store.remove(rel)
        data = (self.local / MANIFEST).read_bytes()
        self.store.write(MANIFEST, data)
        self.bytes += len(data)
        self._pool.shutdown()
        # what the store now holds under the pack: the files the manifest records (what `dataprep info` counts),
        # one shard record per shard, and the manifest
        return {"bytes": self.bytes, "objects": len(wanted), "files": len(records),
                "shard_records": len(wanted) - len(records) - 1, "seconds": time.perf_counter() - self.t0}

    def _wait(self) -> None:
        for _, f in list(self._sent.values()):
            f.result()  # the first failed upload is the error

    def abandon(self) -> None:
        """The build failed: stop watching, let uploads in flight end; no manifest is written."""
        self._stop.set()
        if self._watcher:
            self._watcher.join()
        self._pool.shutdown(wait=True, cancel_futures=True)


def upload_pack(local: Path, url: str, overwrite: bool = False, storage_options: dict | None = None) -> dict:
    """A finished local npy pack to `url` (its manifest last)."""
    pub = Publisher(Path(local), claim(url, overwrite, storage_options))
    try:
        return pub.finish()
    except BaseException:
        pub.abandon()
        raise
