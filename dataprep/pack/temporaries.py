"""Temporaries and disk failures of the writes a pack makes outside the shard driver (conversions to
HDF5 or Zarr, local copies of remote packs): each temporary named `.NAME.tmp-PID-RANDOM` and recorded
under the cache directory while it exists, so a killed run's is found (`dataprep cache list|clean`) and
the next conversion to the same output removes it; a full disk is one line naming the file and the fix
(`write_failure`). Kind-free and backend-free: backends, convert and remote all use it, and it imports
none of them.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

from ..errors import DataprepError


def cache_base() -> Path:
    """$DATAPREP_CACHE_DIR, else ~/.cache/dataprep (not created)."""
    return Path(os.environ.get("DATAPREP_CACHE_DIR") or Path.home() / ".cache" / "dataprep").expanduser()


def pid_alive(pid: int) -> bool:
    """Whether a process `pid` exists (one of another user's counts: it may be ours under another uid)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def tree_bytes(path: Path) -> int:
    """The bytes of the regular files under `path` (or of `path` itself), symlinks not followed."""
    try:
        st = os.lstat(path)
    except OSError:
        return 0
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size if stat.S_ISREG(st.st_mode) else 0
    total = 0
    for base, _dirs, files in os.walk(path):
        for f in files:
            try:
                fst = os.lstat(os.path.join(base, f))
            except OSError:
                continue
            if stat.S_ISREG(fst.st_mode):
                total += fst.st_size
    return total


FULL = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "the disk quota is exceeded",
        errno.EROFS: "the file system is read-only", errno.EFBIG: "the file is too large for the file system"}


def disk_refused(e: BaseException) -> bool:
    """Whether `e` is the local disk refusing a write (full, over quota, read-only), as the OS says it, or
    h5py (an OSError or a RuntimeError quoting HDF5's "errno = 28")."""
    if not isinstance(e, (OSError, RuntimeError)):
        return False
    text = str(e)
    return getattr(e, "errno", None) in FULL or "No space left on device" in text or "errno = 28" in text \
        or "Disk quota exceeded" in text


def write_failure(e: BaseException, path, fix: str, cls: type = DataprepError) -> DataprepError:
    """One line for a local write that failed: the file, the reason, what to do."""
    text = str(e)
    why = FULL.get(getattr(e, "errno", None)) or (
        "no space left on the device" if "No space left on device" in text or "errno = 28" in text else
        "the disk quota is exceeded" if "Disk quota exceeded" in text else
        (getattr(e, "strerror", None) or text or type(e).__name__).splitlines()[0])
    return cls(f"{path}: cannot write it: {why}; {fix}")


def _h5py_dealloc(exc: BaseException | None, tb=None) -> bool:
    """Whether `exc` is h5py's object deallocation meeting a full disk (ObjectID._dealloc)."""
    if exc is None or not disk_refused(exc):
        return False
    tb = tb if tb is not None else exc.__traceback__
    last = None
    while tb is not None:
        last, tb = tb, tb.tb_next
    code = last.tb_frame.f_code if last is not None else None
    return code is not None and code.co_name.endswith("_dealloc") and "h5py" in code.co_filename + code.co_name


def quiet_hdf5_teardown() -> None:
    """After HDF5 met a full disk: its objects' own closing meets it again as they go, each an "Exception
    ignored" traceback on stderr (Cython prints it through sys.excepthook, then reports it unraisable).
    Those reports, and only those, are dropped from now on in this process."""
    import sys

    if getattr(sys.unraisablehook, "_dataprep_quiet", False):
        return
    unraisable, excepthook = sys.unraisablehook, sys.excepthook

    def quiet_unraisable(u):
        if not (_h5py_dealloc(u.exc_value, u.exc_traceback) or (disk_refused(u.exc_value) and "h5py" in repr(u.object))):
            unraisable(u)

    def quiet_excepthook(kind, value, tb):
        if not _h5py_dealloc(value, tb):
            excepthook(kind, value, tb)

    quiet_unraisable._dataprep_quiet = True
    sys.unraisablehook, sys.excepthook = quiet_unraisable, quiet_excepthook


# -- temporaries of a conversion ------------------------------------------------------------------------------
def temporary(out: Path) -> tuple[Path, Path | None]:
    """(a fresh temporary name beside `out`, its record under the cache directory or None). Temporaries of
    earlier conversions to `out` whose process is gone are removed first."""
    sweep(out)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}-{os.urandom(6).hex()}")
    return tmp, _record(tmp)


def finished(tmp: Path, record: Path | None) -> None:
    """The conversion that made `tmp` is over (renamed into place, or removed): forget its record."""
    if record is not None:
        try:
            os.unlink(record)
        except OSError:
            pass


def _pending_dir(create: bool) -> Path:
    from ..safe_paths import make_private_dir

    d = cache_base() / "pending"
    return make_private_dir(d, "cache directory ($DATAPREP_CACHE_DIR/pending)") if create else d


def _record(tmp: Path) -> Path | None:
    """Note `tmp` under the cache directory, so `dataprep cache list` finds it if this process is killed;
    None where the cache directory cannot be used (the conversion goes on without the note)."""
    from ..safe_paths import atomic_write

    try:
        rec = _pending_dir(True) / f"{tmp.name.rsplit('.tmp-', 1)[1]}.json"
        atomic_write(rec, json.dumps({"path": str(tmp.resolve()), "pid": os.getpid()}).encode(), 0o600)
        return rec
    except (OSError, DataprepError):
        return None


def _temp_pid(name: str) -> int | None:
    """The pid in a temporary's name `.NAME.tmp-PID[-RANDOM]`."""
    if ".tmp-" not in name:
        return None
    digits = name.rsplit(".tmp-", 1)[1].split("-", 1)[0]
    return int(digits) if digits.isdigit() else None


def _removable(path: Path) -> int | None:
    """The pid of a temporary at `path` that can go (ours, its process gone), else None."""
    pid = _temp_pid(path.name)
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if pid is None or st.st_uid != os.geteuid() or pid_alive(pid):
        return None
    return pid


def remove_path(path: Path) -> None:
    """Whatever is at `path` (a file, a symlink itself, a directory), gone."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def sweep(out: Path) -> list[Path]:
    """Remove the temporaries killed conversions to `out` left (`.NAME.tmp-PID*`, ours, PID gone)."""
    prefix = f".{out.name}.tmp-"
    gone = []
    try:
        names = os.listdir(out.parent)
    except OSError:
        return gone
    for name in names:
        path = out.parent / name
        if name.startswith(prefix) and _removable(path) is not None:
            remove_path(path)
            gone.append(path)
    return gone


def pending_temporaries() -> list[dict[str, Any]]:
    """The temporaries of conversions recorded under the cache directory and still there: {path, pid,
    alive, bytes, record}. Records whose temporary is gone (renamed into place, removed) are dropped."""
    from ..safe_paths import check_dir

    out = []
    d = _pending_dir(False)
    try:
        check_dir(d, "cache directory")  # records another user could plant there name nothing to remove
        names = sorted(os.listdir(d))
    except (OSError, DataprepError):
        return out
    for name in names:
        rec = d / name
        try:
            fd = os.open(rec, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as f:
                info = json.loads(f.read(1 << 16))
            path, pid = Path(info["path"]), int(info["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not os.path.lexists(path) or _temp_pid(path.name) != pid:
            if not pid_alive(pid) or not os.path.lexists(path):
                try:
                    os.unlink(rec)
                except OSError:
                    pass
            continue
        out.append({"path": str(path), "pid": pid, "alive": pid_alive(pid), "bytes": tree_bytes(path), "record": str(rec)})
    return out


def clean_temporaries() -> tuple[list[tuple[str, int]], list[str]]:
    """Remove the recorded temporaries whose conversion was killed: ([(path, bytes) removed], [kept: live])."""
    removed, kept = [], []
    for t in pending_temporaries():
        path = Path(t["path"])
        if _removable(path) is None:
            kept.append(t["path"])
            continue
        remove_path(path)
        removed.append((t["path"], t["bytes"]))
        try:
            os.unlink(t["record"])
        except OSError:
            pass
    return removed, kept
