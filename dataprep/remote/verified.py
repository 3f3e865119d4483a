"""What a local directory holds verified: takes a fetched pack's directory and the manifest's records of
the files it should hold, gives which of them are there whole (`_Verified.present`: a regular file whose
size and sha256 are the record's) and the bytes a fetch would still bring (`missing_bytes`).

A file's sha256 is computed once: `.verified.json` in the directory records each file found to match, by
size, mtime, ctime and inode, and this process remembers every file it hashed. Nothing is read through a
symlink (`_read_plain`).
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import threading
from pathlib import Path

from ..safe_paths import atomic_write, open_nofollow

VERIFIED = ".verified.json"  # in a fetched pack's directory: the files whose sha256 matched, by identity


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
