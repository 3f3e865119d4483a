"""Shared-memory segments: one copy of a split per machine, in a file under /dev/shm that every process and
rank of one user maps. Two lock files per segment (serve/shm_locks.py): "fill" is held exclusively,
briefly, to check for the segment and fill it if missing (a temporary file, published by rename); "users"
is held shared by every process attached, and the last user to leave removes the segment and then both
lock files. A segment a crash left behind is complete (it was renamed only when full), keeps its one pair
of lock files and is reused; a half-filled temporary one is replaced. `clean` (serve/shm_clean.py)
removes only what no live process holds and reports counts, not files.

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
import hashlib
import importlib
import json
import mmap
import os
import stat
from dataclasses import dataclass, field
from multiprocessing import util as mp_util
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import DataprepError, PackError

# shm_locks.py's names: those used here, and the rest still importable from here, where they lived before
from .shm_locks import (  # noqa: F401
    _OPEN,
    _drop_locks,
    _group,
    _holder,
    _is_at,
    _leave_if_last,
    _lock,
    _nobody_uses,
    _open_lock,
    _say_holder,
    _take_fill,
    _timeout,
    _trusted,
)

SHM_DIR = Path(os.environ.get("DATAPREP_SHM_DIR", "/dev/shm"))
_MAGIC = b"DPSHM\x00v2"
_ALIGN = 4096


def _nbytes(shape, dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


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


# shm_clean.py's names, which callers import from here, where they lived before: shm_clean.py imports this
# module, so they are looked up when first asked for (PEP 562), not imported above
_CLEAN = ("Cleaned", "clean", "_size")


def __getattr__(name: str) -> Any:
    if name in _CLEAN:
        return getattr(importlib.import_module(".shm_clean", __package__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
