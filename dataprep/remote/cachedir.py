"""The cache directory: takes $DATAPREP_CACHE_DIR (else ~/.cache/dataprep), gives where packs at URLs are
staged (`cache_root`, private), a lock on a staged directory (`_locked`), private directories for the copies
verify, convert and plan make (`staging_dir`), the copies a killed run left (`staged_copies`, removed by
`clean_staged`), and local write failures as one-line errors naming the file (`LocalWriteError`).

Where the files go is private: the cache directory and a `disk:DIR` must be ours and writable by nobody
else (dataprep/safe_paths.py). Copies for verify, convert and plan are staged as `copy-PID-*` (a
conversion's as `convert-PID-*`) under the cache directory: `dataprep cache list` shows one a killed run
left, `dataprep cache clean` removes it, never one whose lock is held or whose pid lives.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

from ..errors import DataprepError
from ..pack.temporaries import cache_base, pid_alive, tree_bytes
from ..safe_paths import make_private_dir, open_nofollow

STAGED = ("copy-", "convert-")  # prefixes of the copies staged under the cache directory, then PID-
IN_USE = ".in-use"  # in a staged copy: flocked (shared) while a process uses it


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
