"""Upload stage: takes a local npy pack (or one being built) and a URL, gives the same pack at the URL,
its manifest written last, so a store never shows a complete-looking unfinished pack.

During a build, `Publisher` uploads each shard as soon as the build publishes it (its directory renamed
into place), many at once, while later shards are still being made; at the end it uploads what is left,
the attachments, removes objects under the prefix that the new pack does not have (a previous pack's
shards), and writes the manifest. Before anything is uploaded the prefix's old manifest is removed, so a
rebuild never leaves an old manifest beside new shards. Each object's size is checked after its upload.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from ..errors import PackExistsError
from ..pack.manifest import MANIFEST, read_manifest_file
from ..pack.shard import SHARD_RECORD, TMP_PREFIX
from .fetch import CONCURRENCY
from .store import Store
from .urls import RemoteError


def claim(url: str, overwrite: bool, storage_options: dict | None = None) -> Store:
    """The store a build will publish to: refused when a pack is there already (unless `overwrite`, which
    removes its manifest first, so the old pack stops looking complete before a byte of the new one lands)."""
    store = Store(url, storage_options)
    if store.size(MANIFEST) is not None:
        if not overwrite:
            raise PackExistsError(f"{store.where(MANIFEST)}: a pack is there already; pass --overwrite to replace it")
        store.remove(MANIFEST)
    store.prepare()
    return store


class Publisher:
    """Uploads a local pack directory's shards to `store` as they appear, then the rest, manifest last."""

    def __init__(self, local: Path, store: Store, concurrency: int = CONCURRENCY, poll: float = 0.5):
        self.local, self.store, self.poll = Path(local), store, poll
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="dataprep-upload")
        self._sent: dict[str, Future] = {}
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
        rel = path.relative_to(self.local).as_posix()
        if rel in self._sent:
            return
        self._sent[rel] = self._pool.submit(self._put, path, rel)

    def _put(self, path: Path, rel: str) -> None:
        size = path.stat().st_size
        self.store.upload(path, rel)
        got = self.store.size(rel)
        if got != size:
            raise RemoteError(f"{self.store.where(rel)}: uploaded {size:,} bytes, the store holds {got}")
        self.bytes += size

    def finish(self) -> dict:
        """Upload what is left (the build is over and its manifest written locally), remove objects the pack
        does not have, then write the manifest. Returns {bytes, objects, seconds}."""
        self._stop.set()
        if self._watcher:
            self._watcher.join()
        m = read_manifest_file(self.local)  # checks the local pack is complete before anything claims it is
        wanted = {MANIFEST}
        for split, entry in m["splits"].items():
            for s in entry["shards"]:
                for fname in [*s.get("files", {}), SHARD_RECORD]:
                    rel = f"{split}/{s['name']}/{fname}"
                    wanted.add(rel)
                    if (self.local / rel).is_file():
                        self._send(self.local / rel)
        for name in (m.get("attachments") or {}):
            wanted.add(name)
            self._send(self.local / name)
        self._wait()
        for rel in self.store.listing():
            if rel not in wanted:
                self.store.remove(rel)
        data = (self.local / MANIFEST).read_bytes()
        self.store.write(MANIFEST, data)
        self.bytes += len(data)
        self._pool.shutdown()
        return {"bytes": self.bytes, "objects": len(self._sent) + 1, "seconds": time.perf_counter() - self.t0}

    def _wait(self) -> None:
        for f in list(self._sent.values()):
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
