"""Shared-memory segments: one copy of a split per machine, in a file under /dev/shm that every process and
rank of one user maps. Two lock files per segment: "fill" is held exclusively, briefly, to check for the
segment and fill it if missing (a temporary file, published by rename); "users" is held shared by every
process attached. The last user to leave (its exclusive try on "users", under "fill") removes the
segment and then both lock files, so they do not pile up: "users" first, "fill" last and while still
holding it. Whoever takes "fill" checks after the flock that the file it locked is still the one at that
path (same inode) and opens it again if not, so a lock file being removed is never locked by two; "users"
is opened only under a checked "fill". A segment a crash left behind is complete (it was renamed only
when full), keeps its one pair of lock files and is reused; a half-filled temporary one is replaced.
`clean` removes only what no live process holds (a non-blocking "fill", then "users", and no mapping of
the segment) and reports counts, not files.

Other local users are not trusted. Segments and their locks live in a directory of this user's own,
`SHM_DIR/dataprep-UID` (mode 0700), so nobody else can read a segment, plant one, truncate one or hold
its locks; every file is opened with O_NOFOLLOW (temporaries with O_EXCL too) and checked with fstat (a
regular file, ours, private) before anything in it is trusted. A segment's header carries the digest
of the manifest and split it was filled from and the filler's uid; `verify=True` also checks its bytes
against the manifest's checksums on attach, not only when filling. Lock waits time out
(DATAPREP_SHM_TIMEOUT seconds, default 600) with a message naming the holder's pid. Sharing one segment
between users is an explicit opt-in: DATAPREP_SHM_GROUP=<group> puts segments in `dataprep-g<GID>`
(mode 2770), readable and writable by that group's members, trusted as far as they are.
DATAPREP_SHM_DIR (read at import; tests set `SHM_DIR` itself) moves the whole tree elsewhere.
"""
from __future__ import annotations

import fcntl
import grp
import hashlib
import json
import mmap
import os
import stat
import time
from dataclasses import dataclass, field
from multiprocessing import util as mp_util
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import DataprepError, PackError

SHM_DIR = Path(os.environ.get("DATAPREP_SHM_DIR", "/dev/shm"))
_MAGIC = b"DPSHM\x00v2"
_ALIGN = 4096
_OPEN = os.O_NOFOLLOW | os.O_CLOEXEC


def _nbytes(shape, dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


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


def _segment_path() -> Path:
    """Where this user's (or the opted-in group's) segments live, made or not."""
    group = _group()
    return SHM_DIR / (f"dataprep-{os.getuid()}" if group is None else f"dataprep-g{group}")


def segment_dir() -> Path:
    """This user's directory of segments and locks (or the opted-in group's), made if missing; refused when
    what stands there is not exactly what it would have made: a symlink, not a directory, owned by someone
    else, or open to other users."""
    group = _group()
    d = _segment_path()
    mode = 0o700 if group is None else 0o2770
    try:
        os.mkdir(d, mode)
        if group is not None:
            os.chown(d, -1, group)
        os.chmod(d, mode)  # whatever the umask took away
    except FileExistsError:
        pass
    except OSError as e:
        raise DataprepError(f"{d}: cannot make the shared-memory directory ({e.strerror or e}); use cache='mmap' "
                            "or set DATAPREP_SHM_DIR") from None
    st = os.lstat(d)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise DataprepError(f"{d}: is a symlink or not a directory; refusing to keep shared memory there (remove it)")
    if group is None and (st.st_uid != os.getuid() or st.st_mode & 0o077):
        raise DataprepError(f"{d}: owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):o}, not a directory private "
                            f"to you (uid {os.getuid()}); refusing to trust it (remove it, or set DATAPREP_SHM_DIR)")
    if group is not None and (st.st_gid != group or st.st_mode & 0o007):
        raise DataprepError(f"{d}: group {st.st_gid} and mode {stat.S_IMODE(st.st_mode):o}, not private to group {group}; "
                            "refusing to trust it")
    return d


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


def segment_name(manifest: dict[str, Any], split: str) -> str:
    """Named after the manifest (which holds every shard's checksum): the same pack content gives the
    same segment, whatever its backend or path; a rebuilt pack a new one."""
    return f"dataprep-{_digest(manifest, split)[:24]}"


def _digest(manifest: dict[str, Any], split: str) -> str:
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode() + b"\0" + split.encode()).hexdigest()


@dataclass
class ShmSegment:
    path: Path
    users_fd: int
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    created: bool = False
    _finalizer: Any = field(default=None, repr=False, compare=False)

    @classmethod
    def attach(cls, pack: Path, manifest: dict[str, Any], split: str, plan: list,
               fill: Callable[[Callable], dict[str, Any]], verify: bool = False, shard_split: str | None = None) -> "ShmSegment":
        """The segment of `split` (a split and what of it is held, e.g. "train/image@128"), filled by `fill`
        if it is missing or not to be trusted; with `verify`, its bytes are checked against the checksums
        of `shard_split`'s shard files in the manifest, however it came to be there."""
        d = segment_dir()
        name = segment_name(manifest, split)
        path = d / name
        digest = _digest(manifest, split)
        offsets, total = _offsets(plan)
        created, users_fd = False, -1
        fill_fd = _take_fill(path)  # one process checks or fills at a time
        try:
            _say_holder(fill_fd)
            seg_fd = _open_complete(path, total, digest)
            if seg_fd is None:
                _create(path, pack, split, plan, offsets, total, fill, digest)
                created = True
                seg_fd = _open_complete(path, total, digest)
                if seg_fd is None:  # pragma: no cover - we just made it
                    raise DataprepError(f"{path}: the segment just filled does not check out")
            try:
                # opened only under a checked fill lock: nobody removes "users" meanwhile
                users_fd = _open_lock(d / f"{name}.users")
                _lock(users_fd, fcntl.LOCK_SH, path)  # a user until released: the segment stays
            except BaseException:
                os.close(seg_fd)
                raise
        except BaseException:
            if users_fd >= 0:
                os.close(users_fd)
            try:
                _leave_if_last(path, remove_segment=False)  # a failed fill leaves no lock files behind
            finally:
                os.close(fill_fd)
            raise
        fcntl.flock(fill_fd, fcntl.LOCK_UN)
        os.close(fill_fd)
        try:
            try:
                arrays = _views(mmap.mmap(seg_fd, 0, prot=mmap.PROT_READ), plan, offsets)
            finally:
                os.close(seg_fd)
            if verify and not created:
                _verify(arrays, manifest, shard_split or split.split("/")[0], path)
        except BaseException:
            _release(users_fd, path, os.getpid())  # the last user of a segment that failed takes it away
            raise
        seg = cls(path, users_fd, arrays, created)
        _USER_FDS.add(users_fd)
        # multiprocessing's Finalize, not weakref.finalize: it also runs when a DataLoader or Loader
        # worker (a multiprocessing child, which never runs atexit) exits, so a segment attached in a
        # worker (a resolution switched to there) is released too. A negative priority runs it at exit only
        # after multiprocessing has stopped this process's daemonic children: persistent DataLoader workers
        # still hold the segment until then (they are terminated, running no finalizer), so a release
        # before that would find users left and leave the segment behind for good.
        seg._finalizer = mp_util.Finalize(seg, _release, (users_fd, path, os.getpid()), exitpriority=-10)
        return seg

    def close(self) -> None:
        """Stop using the segment now (the last user removes it and its lock files); the arrays already
        taken stay valid. Otherwise this happens when the object is collected or the process exits."""
        if self._finalizer is not None:
            self._finalizer()


def _offsets(plan) -> tuple[dict[str, int], int]:
    pos, out = _ALIGN, {}  # the first page holds the header
    for key, shape, dtype in plan:
        out[key] = pos
        pos += -(-_nbytes(shape, dtype) // _ALIGN) * _ALIGN
    return out, pos


def _open_complete(path: Path, total: int, digest: str) -> int | None:
    """A descriptor of the segment at `path` when it is complete and ours to trust: a regular private file of
    this user (or group) of the right size whose header names this manifest and split; else None."""
    try:
        fd = os.open(path, os.O_RDONLY | _OPEN)
    except OSError:
        return None
    try:
        if _trusted(fd, path, total) is None:
            head = os.pread(fd, _ALIGN, 0)
            if head.startswith(_MAGIC):
                n = int.from_bytes(head[len(_MAGIC) : len(_MAGIC) + 8], "little")
                header = json.loads(head[len(_MAGIC) + 8 : len(_MAGIC) + 8 + n])
                if header.get("digest") == digest and (_group() is not None or header.get("uid") == os.getuid()):
                    return fd
    except (OSError, ValueError, UnicodeDecodeError, AttributeError):
        pass
    os.close(fd)
    return None


def _create(path: Path, pack: Path, split: str, plan, offsets: dict[str, int], total: int, fill, digest: str) -> None:
    for stale in list(path.parent.glob(path.name + ".tmp-*")) + [path]:
        stale.unlink(missing_ok=True)  # a crash mid-fill, or a segment not to be trusted (we hold the fill lock)
    st = os.statvfs(path.parent)
    if st.f_bavail * st.f_frsize < total:
        raise DataprepError(
            f"{path.parent}: {total / 1e9:.2f} GB needed for {pack}/{split} with cache='shm', "
            f"{st.f_bavail * st.f_frsize / 1e9:.2f} GB free; use cache='mmap' or enlarge {path.parent}"
        )
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}-{os.urandom(4).hex()}")
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_RDWR | _OPEN, 0o600 if _group() is None else 0o640)
    os.fchmod(fd, 0o600 if _group() is None else 0o640)  # whatever the umask took away
    try:
        with os.fdopen(fd, "w+b") as f:
            f.truncate(total)
            mm = mmap.mmap(f.fileno(), total)
            meta = {"digest": digest, "uid": os.getuid(), "split": split, "pack": str(pack.resolve()),
                    "layout": [[k, list(s), np.dtype(d).str] for k, s, d in plan]}
            header = json.dumps(meta).encode()
            if len(_MAGIC) + 8 + len(header) > _ALIGN:  # a long layout is not needed to trust the segment
                header = json.dumps({k: meta[k] for k in ("digest", "uid", "split")}).encode()
            _fill_into(mm, plan, offsets, fill, f"{pack}/{split}")
            mm[len(_MAGIC) : len(_MAGIC) + 8] = len(header).to_bytes(8, "little")
            mm[len(_MAGIC) + 8 : len(_MAGIC) + 8 + len(header)] = header
            mm[: len(_MAGIC)] = _MAGIC  # last: a segment without the magic is never taken as complete
            mm.close()
        os.rename(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _verify(arrays: dict[str, np.ndarray], manifest: dict[str, Any], split: str, path: Path) -> None:
    """Each array's rows of each shard, hashed as that shard's .npy file (header and data, offsets made local
    again), must give the manifest's sha256."""
    from ..pack.backends.layout import plan_arrays
    from ..pack.shard import npy_header_bytes

    plans = plan_arrays(manifest, split)
    shards = manifest["splits"][split]["shards"]
    for name, arr in arrays.items():
        p = plans.get(name)
        if p is None:
            raise PackError(f"{path}: holds {name}, which split {split} of the manifest does not")
        for k, (start, rows) in enumerate(zip(p.starts, p.shard_rows)):
            piece = np.asarray(arr[start : start + rows])
            if p.is_offsets and rows:
                piece = piece - piece[0]
            sha = hashlib.sha256(npy_header_bytes(p.dtype.str, (rows, *p.row_shape)))
            sha.update(np.ascontiguousarray(piece, p.dtype).reshape(-1).view(np.uint8))
            if sha.hexdigest() != shards[k]["files"][f"{name}.npy"]["sha256"]:
                raise PackError(f"{path}: {name} of shard {shards[k]['name']} differs from the pack's checksum; the "
                                "segment is not this pack's (remove it, or run `dataprep cache clean`)")


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
    """Drop this process's use of the segment; the last user removes it and then its lock files.

    Lock order is the same as in `attach` (fill, then users), so a process attaching at this moment
    either sees the segment before it goes or fills a new one after (with new lock files).
    """
    if os.getpid() != pid:
        return  # a forked child inherited the object: the parent owns the lock
    _USER_FDS.discard(users_fd)
    try:
        os.close(users_fd)
    except OSError:
        return
    try:
        # made again if missing: another user may have removed it with the segment after we let go (then
        # this finds nothing to do and removes it again), or someone removed it by hand
        fill_fd = _take_fill(path, timeout=5.0)
    except DataprepError:
        return  # at exit a stuck peer must not hang us; the segment stays for `dataprep cache clean`
    try:
        _leave_if_last(path)
    except OSError:
        pass  # at exit: whatever is left is for `dataprep cache clean`
    finally:
        os.close(fill_fd)


def list_segments() -> list[Path]:
    """This user's (or the opted-in group's) segments, complete or being filled; not their lock files."""
    d = _segment_path()
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if p.name.startswith("dataprep-") and not p.name.endswith((".fill", ".users")))


def _header(path: Path) -> dict[str, Any]:
    try:
        fd = os.open(path, os.O_RDONLY | _OPEN)
        try:
            head = os.pread(fd, _ALIGN, 0)
        finally:
            os.close(fd)
        n = int.from_bytes(head[len(_MAGIC) : len(_MAGIC) + 8], "little")
        return json.loads(head[len(_MAGIC) + 8 : len(_MAGIC) + 8 + n]) if head.startswith(_MAGIC) else {}
    except (OSError, ValueError, UnicodeDecodeError):
        return {}


def _mappers(paths: list[Path]) -> dict[str, list[int]]:
    """The pids that map each file now (from /proc/PID/maps; processes of other users are not visible)."""
    want = {str(p): [] for p in paths}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/maps") as f:
                seen = {line.split(maxsplit=5)[-1].strip() for line in f if "/" in line}
        except OSError:
            continue
        for p in want:
            if p in seen:
                want[p].append(int(entry.name))
    return want


def describe_segments() -> list[dict[str, Any]]:
    """This user's segments: path, bytes, pack and split they hold, the pids mapping them, whether complete."""
    segs = list_segments()
    users = _mappers(segs)
    out = []
    for p in segs:
        h = _header(p)
        try:
            size = p.stat().st_size
        except FileNotFoundError:  # its last user removed it since the listing (another run on this machine)
            continue
        out.append({"path": str(p), "bytes": size, "pack": h.get("pack", "?"), "split": h.get("split", "?"),
                    "complete": bool(h) and ".tmp-" not in p.name, "users": users[str(p)]})
    return out


@dataclass
class Cleaned:
    """What `clean` did: (path, bytes) of each segment removed, by kind; lock files removed; what it kept."""
    unused: list[tuple[str, int]] = field(default_factory=list)  # complete (or damaged) segments nobody used
    half: list[tuple[str, int]] = field(default_factory=list)  # half-filled temporaries no live process fills
    in_use: list[tuple[str, int]] = field(default_factory=list)  # removed though in use (`all_mine`)
    locks: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # in use, or being filled or left right now

    @property
    def removed(self) -> list[str]:
        return [p for p, _ in self.unused + self.half + self.in_use] + self.locks

    def summary(self) -> str:
        def mb(items):
            return f"{sum(b for _, b in items) / 1e6:,.1f} MB"

        out = (f"removed {len(self.unused)} unused segment(s) ({mb(self.unused)}), {len(self.half)} half-filled "
               f"segment(s) left by a killed run ({mb(self.half)}), ")
        if self.in_use:
            out += f"{len(self.in_use)} segment(s) in use ({mb(self.in_use)}), "
        return out + f"{len(self.locks)} stale lock file(s); kept {len(self.kept)} segment(s) in use"


def clean(all_mine: bool = False) -> Cleaned:
    """Remove this user's segments nobody uses (every one with `all_mine`: processes that map one keep their
    mapping), half-filled temporaries no process is filling, and lock files no process holds whose segment
    is gone. Nothing a live process holds is touched: a segment whose fill lock is held (being filled, or
    its last user leaving) is skipped, and one with a holder of its users lock, or a process mapping it, is
    kept (its lock files always, the segment too unless `all_mine`)."""
    done = Cleaned()
    d = _segment_path()
    if not d.is_dir():
        return done
    bases = sorted({n.split(".tmp-")[0].removesuffix(".fill").removesuffix(".users")
                    for n in os.listdir(d) if n.startswith("dataprep-")})
    mapped = _mappers(list_segments())
    for base in bases:
        path = d / base
        fill_was_there = os.path.lexists(d / f"{base}.fill")
        fill_fd = _take_fill(path, wait=False)
        if fill_fd is None:  # a live process is filling it or leaving it now
            done.kept += [str(p) for p in [path, *d.glob(base + ".tmp-*")] if os.path.lexists(p)]
            continue
        try:
            for tmp in sorted(d.glob(base + ".tmp-*")):  # its filler would hold the fill lock: it died
                done.half.append((str(tmp), _size(tmp)))
                tmp.unlink(missing_ok=True)
            users = _nobody_uses(path)
            try:
                if os.path.lexists(path):
                    in_use = users is None or bool(mapped.get(str(path)))
                    if in_use and not all_mine:
                        done.kept.append(str(path))
                    else:
                        (done.in_use if in_use else done.unused).append((str(path), _size(path)))
                        path.unlink(missing_ok=True)
                if users is not None and not os.path.lexists(path):
                    done.locks += [str(d / f"{base}{x}") for x in (".users", ".fill")
                                   if os.path.lexists(d / f"{base}{x}") and (x == ".users" or fill_was_there)]
                    _drop_locks(path)
            finally:
                if users is not None and users >= 0:
                    os.close(users)
        finally:
            os.close(fill_fd)
    return done


def _size(path: Path) -> int:
    try:
        return os.lstat(path).st_size
    except FileNotFoundError:
        return 0
