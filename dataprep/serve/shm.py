"""Shared-memory segments: one copy of a split per machine, in a file under /dev/shm that every process and
rank maps. Two lock files per segment: "fill" is held exclusively, briefly, to check for the segment and
fill it if missing (a temporary file, published by rename); "users" is held shared by every process
attached. The last user to leave (its exclusive try on "users", under "fill") removes the segment. A
segment a crash left behind is complete (it was renamed only when full) and is reused; a half-filled
temporary one is replaced.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import mmap
import os
import tempfile
from dataclasses import dataclass, field
from multiprocessing import util as mp_util
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import DataprepError, PackError

SHM_DIR = Path(os.environ.get("DATAPREP_SHM_DIR", "/dev/shm"))
_MAGIC = b"DPSHM\x00v1"
_ALIGN = 4096


def _nbytes(shape, dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def _lock_dir() -> Path:
    d = Path(tempfile.gettempdir()) / "dataprep-locks"
    d.mkdir(exist_ok=True)
    return d


def segment_name(manifest: dict[str, Any], split: str) -> str:
    """Named after the manifest (which holds every shard's checksum): the same pack content gives the
    same segment, whatever its backend or path; a rebuilt pack a new one."""
    digest = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode() + b"\0" + split.encode()).hexdigest()
    return f"dataprep-{digest[:24]}"


@dataclass
class ShmSegment:
    path: Path
    users_fd: int
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    created: bool = False

    @classmethod
    def attach(cls, pack: Path, manifest: dict[str, Any], split: str, plan: list,
               fill: Callable[[Callable], dict[str, Any]]) -> "ShmSegment":
        name = segment_name(manifest, split)
        path = SHM_DIR / name
        offsets, total = _offsets(plan)
        fill_fd = os.open(_lock_dir() / f"{name}.fill", os.O_CREAT | os.O_RDWR, 0o666)
        users_fd = os.open(_lock_dir() / f"{name}.users", os.O_CREAT | os.O_RDWR, 0o666)
        try:
            created = False
            fcntl.flock(fill_fd, fcntl.LOCK_EX)  # one process checks or fills at a time; held briefly
            try:
                if not _complete(path, total):
                    _create(path, pack, split, plan, offsets, total, fill)
                    created = True
                fcntl.flock(users_fd, fcntl.LOCK_SH)  # a user until released: the segment stays
            finally:
                fcntl.flock(fill_fd, fcntl.LOCK_UN)
                os.close(fill_fd)
            arrays = _views(_map(path), plan, offsets)
        except BaseException:
            os.close(users_fd)
            raise
        seg = cls(path, users_fd, arrays, created)
        _USER_FDS.add(users_fd)
        # multiprocessing's Finalize, not weakref.finalize: it also runs when a DataLoader or Loader
        # worker (a multiprocessing child, which never runs atexit) exits, so a segment attached in a
        # worker (a resolution switched to there) is released too.
        mp_util.Finalize(seg, _release, (users_fd, path, os.getpid()), exitpriority=10)
        return seg


def _offsets(plan) -> tuple[dict[str, int], int]:
    pos, out = _ALIGN, {}  # the first page holds the header
    for key, shape, dtype in plan:
        out[key] = pos
        pos += -(-_nbytes(shape, dtype) // _ALIGN) * _ALIGN
    return out, pos


def _complete(path: Path, total: int) -> bool:
    try:
        with open(path, "rb") as f:
            return os.fstat(f.fileno()).st_size == total and f.read(len(_MAGIC)) == _MAGIC
    except OSError:
        return False


def _create(path: Path, pack: Path, split: str, plan, offsets: dict[str, int], total: int, fill) -> None:
    for stale in list(path.parent.glob(path.name + ".tmp-*")) + [path]:
        stale.unlink(missing_ok=True)  # a crash mid-fill, or a segment of the wrong size
    st = os.statvfs(path.parent)
    if st.f_bavail * st.f_frsize < total:
        raise DataprepError(
            f"{path.parent}: {total / 1e9:.2f} GB needed for {pack}/{split} with cache='shm', "
            f"{st.f_bavail * st.f_frsize / 1e9:.2f} GB free; use cache='mmap' or enlarge {path.parent}"
        )
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w+b") as f:
            f.truncate(total)
            mm = mmap.mmap(f.fileno(), total)
            header = json.dumps({"pack": str(pack.resolve()), "split": split, "layout": [[k, list(s), np.dtype(d).str] for k, s, d in plan]}).encode()
            if len(_MAGIC) + 8 + len(header) > _ALIGN:
                header = b"{}"
            _fill_into(mm, plan, offsets, fill, f"{pack}/{split}")
            mm[len(_MAGIC) : len(_MAGIC) + 8] = len(header).to_bytes(8, "little")
            mm[len(_MAGIC) + 8 : len(_MAGIC) + 8 + len(header)] = header
            mm[: len(_MAGIC)] = _MAGIC  # last: a segment without the magic is never taken as complete
            mm.close()
        os.rename(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _views(buf, plan, offsets: dict[str, int]) -> dict[str, np.ndarray]:
    """The arrays of `plan` as views of a mapped segment, at their offsets."""
    return {k: np.frombuffer(buf, d, int(np.prod(s, dtype=np.int64)), offsets[k]).reshape(s) for k, s, d in plan}


def _fill_into(mm: mmap.mmap, plan, offsets: dict[str, int], fill, where: str) -> None:
    """Run the loader with an allocator that hands out views of the segment (they die on return, so the
    mapping can be closed)."""
    views = _views(mm, plan, offsets)

    def alloc(key, shape, dtype):
        v = views[key]
        if v.shape != tuple(shape) or v.dtype != np.dtype(dtype):
            raise PackError(f"{where}: {key} is {shape} {dtype}, the layout said {v.shape} {v.dtype}")
        return v

    fill(alloc)


def _map(path: Path) -> mmap.mmap:
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)


# This process's "users" lock descriptors. A forked child (a Loader or DataLoader worker) shares them with its
# parent, and a flock lasts while any process holds the description: a worker still alive when the parent's
# release runs at exit would keep the segment in /dev/shm. The child closes its copies at once; its mapping
# stays valid, and the parent's lock keeps the segment for as long as the parent uses it.
_USER_FDS: set[int] = set()


def _forget_inherited_locks() -> None:
    for fd in list(_USER_FDS):
        try:
            os.close(fd)
        except OSError:
            pass
    _USER_FDS.clear()


os.register_at_fork(after_in_child=_forget_inherited_locks)


def _release(users_fd: int, path: Path, pid: int) -> None:
    """Drop this process's use of the segment; the last user removes it.

    Lock order is the same as in `attach` (fill, then users), so a process attaching at this moment
    either sees the segment before it goes or fills a new one after.
    """
    if os.getpid() != pid:
        return  # a forked child inherited the object: the parent owns the lock
    try:
        _USER_FDS.discard(users_fd)
        os.close(users_fd)
        fill_fd = os.open(_lock_dir() / f"{path.name}.fill", os.O_RDWR)
    except OSError:
        return
    try:
        fcntl.flock(fill_fd, fcntl.LOCK_EX)
        users = os.open(_lock_dir() / f"{path.name}.users", os.O_RDWR)
        try:
            fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
            path.unlink(missing_ok=True)  # nobody else holds it: we were the last user
        except OSError:
            pass  # somebody still uses it
        finally:
            os.close(users)
    finally:
        os.close(fill_fd)


def list_segments() -> list[Path]:
    """dataprep's segments in the shared-memory directory (complete or not)."""
    return sorted(SHM_DIR.glob("dataprep-*")) if SHM_DIR.is_dir() else []
