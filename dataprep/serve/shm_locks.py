"""A shared-memory segment's lock files: takes a segment's path, gives its "fill" lock held exclusively, of
the file at that path now (`_take_fill`), a lock wait with a deadline that names the holder's pid (`_lock`),
a lock file opened only when it is ours to trust (`_open_lock`, `_trusted`), and the last user's leaving
(`_leave_if_last`: the segment, then both lock files, "fill" last).

"fill" is held exclusively, briefly, to check for the segment and fill it if missing; "users" is held
shared by every process attached. The last user to leave (its exclusive try on "users", under "fill")
removes the segment and then both lock files, "users" first, "fill" last and while still holding it, so
whoever takes "fill" checks after the flock that the file it locked is still the one at that path (same
inode). Every file is opened with O_NOFOLLOW and checked with fstat (a regular file, ours or the
opted-in group's, private) before it is trusted. Lock waits time out after DATAPREP_SHM_TIMEOUT seconds
(default 600). serve/shm.py's segments and serve/shm_clean.py's `clean` take their locks through these.
"""
from __future__ import annotations

import fcntl
import grp
import os
import stat
import time
from pathlib import Path

from ..errors import DataprepError

_OPEN = os.O_NOFOLLOW | os.O_CLOEXEC


def _timeout() -> float:
    return float(os.environ.get("DATAPREP_SHM_TIMEOUT", "600"))


def _group() -> int | None:
    """The group segments are shared with (DATAPREP_SHM_GROUP, a name or a gid), or None: this user only."""
    g = os.environ.get("DATAPREP_SHM_GROUP")
    if not g:
        return None
    try:
        return int(g) if g.isdigit() else grp.getgrnam(g).gr_gid
    except KeyError:
        raise DataprepError(f"DATAPREP_SHM_GROUP={g!r}: no such group") from None


def _trusted(fd: int, path: Path, size: int | None = None) -> str | None:
    """Why the open file must not be trusted (None: it may): not a regular file, someone else's, readable by
    others, or not of `size`."""
    st = os.fstat(fd)
    group = _group()
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if group is None and (st.st_uid != os.getuid() or st.st_mode & 0o077):
        return f"owned by uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}"
    if group is not None and (st.st_gid != group or st.st_mode & 0o007):
        return f"group {st.st_gid}, mode {stat.S_IMODE(st.st_mode):o}"
    if size is not None and st.st_size != size:
        return f"{st.st_size} bytes, not {size}"
    return None


def _open_lock(path: Path) -> int:
    mode = 0o600 if _group() is None else 0o660
    try:
        fd = os.open(path, os.O_CREAT | os.O_RDWR | _OPEN, mode)
        if os.fstat(fd).st_uid == os.getuid():
            os.fchmod(fd, mode)  # what the umask took away (a group member must open it too)
    except OSError as e:
        raise DataprepError(f"{path}: cannot open the lock file ({e.strerror or e})") from None
    why = _trusted(fd, path)
    if why:
        os.close(fd)
        raise DataprepError(f"{path}: a lock file that is {why}; refusing to trust it (remove it)")
    return fd


def _lock(fd: int, how: int, path: Path, holder: Path | None = None, timeout: float | None = None) -> None:
    """flock with a deadline: a process that holds the lock forever is named, not waited for forever."""
    timeout = _timeout() if timeout is None else timeout
    deadline, pause = time.monotonic() + timeout, 0.005
    while True:
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                who = _holder(holder) if holder else None
                raise DataprepError(f"{path}: waited {timeout:.0f} s for this lock"
                                    + (f"; it is held by pid {who}" if who else "")
                                    + " (a stuck process filling or leaving a shared-memory segment: stop it, or run "
                                    "`dataprep cache clean`)") from None
            time.sleep(pause)
            pause = min(pause * 2, 0.25)


def _holder(path: Path) -> int | None:
    """The pid the fill lock's holder wrote into it."""
    try:
        fd = os.open(path, os.O_RDONLY | _OPEN)
        try:
            return int(os.read(fd, 32).decode().strip() or 0) or None
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return None


def _say_holder(fd: int) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)


def _is_at(fd: int, path: Path) -> bool:
    """Whether the open file is still the one at `path` (not unlinked, not replaced, since it was opened)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (own.st_dev, own.st_ino) == (st.st_dev, st.st_ino)


def _take_fill(path: Path, timeout: float | None = None, wait: bool = True) -> int | None:
    """A descriptor of the segment's "fill" lock file (made if missing), held exclusively, of the file at its
    path now: the last user of a segment removes the file while holding it, so one locked after a wait may
    be gone or replaced, and is then let go and opened again. None: it is held and not `wait`."""
    lock = path.parent / f"{path.name}.fill"
    while True:
        fd = _open_lock(lock)
        try:
            if wait:
                _lock(fd, fcntl.LOCK_EX, path, lock, timeout)
            else:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    return None
            if _is_at(fd, lock):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # removed (or replaced) by its last user while we waited: take the one there now


def _nobody_uses(path: Path) -> int | None:
    """Under the fill lock: a descriptor of "users" held exclusively when no process holds it (-1: there is
    no "users" file, so nobody can), None when some process does."""
    try:
        fd = os.open(path.parent / f"{path.name}.users", os.O_RDWR | _OPEN)
    except FileNotFoundError:
        return -1
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except OSError:
        os.close(fd)
        return None


def _drop_locks(path: Path) -> int:
    """Under the fill lock and with "users" free: remove both lock files, "fill" last (an opener that took
    the old one notices it went, see `_take_fill`); the number removed."""
    n = 0
    for suffix in (".users", ".fill"):
        try:
            (path.parent / f"{path.name}{suffix}").unlink()
            n += 1
        except FileNotFoundError:
            pass
    return n


def _leave_if_last(path: Path, remove_segment: bool = True) -> None:
    """Under the fill lock: when no process uses the segment, remove it (with `remove_segment`) and, once it
    is gone, its lock files."""
    users = _nobody_uses(path)
    if users is None:
        return  # somebody still uses it
    try:
        if remove_segment:
            path.unlink(missing_ok=True)  # nobody else holds it: we were the last user
        if not os.path.lexists(path):
            _drop_locks(path)
    finally:
        if users >= 0:
            os.close(users)
