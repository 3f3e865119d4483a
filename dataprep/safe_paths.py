"""Writing where another local user could interfere: the rules every place dataprep writes follows.

A directory another user can write (a shared /scratch, a 0777 cache directory) lets that user plant
files dataprep would trust (a shard of the right size), symlinks it would follow (a `.lock` or a
temporary pointing at a file of the victim's: root writing through it clobbers that file), or swap
a file between a check and its use. So:

- `check_dir(path, what)`: a directory is used only if it is ours or root's and nobody else may write
  it, unless it is sticky and ours to write in (as /tmp and /dev/shm are: others cannot remove or
  rename what we create there, and we create only with O_EXCL). Every parent up to / follows the same
  rule where it could be replaced under us (a parent writable by others and not sticky).
- `check_links(path, what)`: a path written through a symlink (the path itself, or a directory above it)
  only where the link is ours (or root's) and sits in a directory nobody else can write. A link another
  user planted in /tmp (`--out /tmp/pack` pointing at a pack of the victim's) would otherwise be followed,
  and `--overwrite` would replace what it points at; a link in a shared directory, even one we own, is
  refused too, since whoever can write there could have made it or could make the next one.
  `check_dir` applies it to every directory it accepts.
- Group-writable counts as writable by others (a group is many users), unless DATAPREP_TRUST_GROUP=1
  says the group is trusted (a team's shared project space).
- `make_dir(path, what)`: a directory created (each missing level 0755 less the umask) only where the
  directory it goes in passes the parent rule, then checked as `check_dir` does.
- `create_excl(dir, prefix)`: a temporary with a random name, created with O_CREAT | O_EXCL |
  O_NOFOLLOW (never an existing file, never through a symlink), mode 0600 unless asked.
- `open_nofollow(path, flags)`: opening a file that must not be a symlink; the caller checks the
  descriptor (fstat), never the path.
- `atomic_write(path, data)`: a whole file replaced atomically: an O_EXCL temporary beside it,
  fsync, rename over the final name, fsync of the directory.
- `check_file(path, what)`, `write_file(path, data, what)`: a single file a user names as an output (a
  contact sheet): written only as a regular file of ours, never through a symlink, never into a FIFO,
  in a folder others cannot swap it in; then replaced atomically.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import DataprepError


class UnsafeDirectory(DataprepError):
    """A directory other users can write (or not ours), where dataprep refuses to write or trust files."""


def _others_may_write(st: os.stat_result) -> bool:
    return bool(st.st_mode & (stat.S_IWOTH | stat.S_IWGRP))


def check_dir(path: str | os.PathLike, what: str = "directory", *, group_ok: bool = False) -> Path:
    """`path` (an existing directory) if dataprep may write and trust files in it, else UnsafeDirectory
    naming it and why. Owned by us (or root), not writable by other users (nor by the group unless
    `group_ok`), and the same for each parent that is not sticky; no symlink on it but ours in a directory
    only we can write (`check_links`). A sticky directory writable by others (/tmp) is accepted as a
    parent: what we create in it cannot be replaced by others."""
    p = check_links(path, what, group_ok=group_ok)  # first: a planted link is named as such, not by its target
    uid = os.geteuid()
    try:
        st = os.stat(p)
    except OSError as e:
        raise UnsafeDirectory(f"{p}: cannot use this {what} ({e.strerror or e})") from None
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectory(f"{p}: this {what} is not a directory")
    if st.st_uid not in (uid, 0):
        raise UnsafeDirectory(f"{p}: this {what} belongs to uid {st.st_uid}, not to you (uid {uid}); "
                              "files another user controls are never trusted or written through: choose a directory of your own")
    if _writable_by_others(st, group_ok) and not (st.st_mode & stat.S_ISVTX and st.st_uid == uid):
        raise UnsafeDirectory(f"{p}: other users can write this {what} (mode {stat.S_IMODE(st.st_mode):o}), so they could "
                              "plant files or symlinks in it; use a directory only you can write (chmod go-w)"
                              + _group_hint(st))
    _check_parents(p, p.resolve().parent, what, group_ok)
    return p


def check_links(path: str | os.PathLike, what: str = "output", *, group_ok: bool = False) -> Path:
    """`path` if no symlink on it could redirect a write: it and each directory above it are either not
    symlinks, or symlinks owned by us (or root) in a directory other users cannot write (sticky or not).
    Else UnsafeDirectory naming the link, where it points and why, and what to give instead.

    Args:
        path: a file or directory about to be written, or a directory about to be trusted; it may not exist.
        what: what it is, for the message ("output directory").
        group_ok: trust a directory the group can write (as DATAPREP_TRUST_GROUP=1 does).

    Returns:
        `path` as given.
    """
    p = Path(path)
    uid = os.geteuid()
    full = Path(os.path.abspath(p))
    for link in (*reversed(full.parents), full):
        try:
            st = os.lstat(link)
        except OSError:
            break  # missing from here down: nothing below it can be a link yet
        if not stat.S_ISLNK(st.st_mode):
            continue
        holder = Path(os.path.realpath(link.parent))
        try:
            hst = os.stat(holder)
            target = os.readlink(link)
        except OSError as e:
            raise UnsafeDirectory(f"{p}: cannot check the symlink {link} ({e.strerror or e})") from None
        named = f"{p}: this {what}" if link == full else f"{p}: the directory {link} above this {what}"
        if st.st_uid not in (uid, 0):
            raise UnsafeDirectory(f"{named} is a symlink (to {target}) that uid {st.st_uid} owns, not you (uid {uid}): "
                                  "dataprep never writes through a symlink another user controls; give the path it "
                                  "should write itself, in a directory of your own")
        if _writable_by_others(hst, group_ok):
            raise UnsafeDirectory(f"{named} is a symlink (to {target}) in {holder}, which other users can write (mode "
                                  f"{stat.S_IMODE(hst.st_mode):o}), so any of them may have planted it: dataprep writes through a "
                                  "symlink only when it is yours and in a directory only you can write; give the real path "
                                  "instead" + _group_hint(hst))
    return p


TRUST_GROUP_ENV = "DATAPREP_TRUST_GROUP"  # "1": directories your group can write are trusted (a team's project space)


def _group_trusted(group_ok: bool) -> bool:
    return group_ok or os.environ.get(TRUST_GROUP_ENV) == "1"


def _writable_by_others(st: os.stat_result, group_ok: bool) -> bool:
    return bool(st.st_mode & stat.S_IWOTH) or (not _group_trusted(group_ok) and bool(st.st_mode & stat.S_IWGRP))


def _group_hint(st: os.stat_result) -> str:
    """For a directory only the group (not the world) can write: how to trust the group."""
    if st.st_mode & stat.S_IWGRP and not st.st_mode & stat.S_IWOTH:
        return f"; or, if everyone in its group may be trusted with your files, set {TRUST_GROUP_ENV}=1"
    return ""


def _check_parents(p: Path, parent: Path, what: str, group_ok: bool) -> None:
    """UnsafeDirectory unless `parent` (resolved) and each directory above it is sticky or not writable by others."""
    seen: set[Path] = set()
    while parent not in seen:
        seen.add(parent)
        try:
            pst = os.stat(parent)
        except OSError:
            break
        if _writable_by_others(pst, group_ok) and not (pst.st_mode & stat.S_ISVTX):
            raise UnsafeDirectory(f"{p}: its parent {parent} can be written by other users (mode "
                                  f"{stat.S_IMODE(pst.st_mode):o}, not sticky), so they could replace this {what}"
                                  + _group_hint(pst))
        parent = parent.parent


def make_dir(path: str | os.PathLike, what: str = "directory", mode: int = 0o755, *, group_ok: bool = False) -> Path:
    """`path` created where missing, then checked as `check_dir` does. Nothing is created unless the existing
    directory the new ones go in (and each above it) is sticky or writable only by us: elsewhere another
    user could rename what we create away and plant their own in its place. Each missing level is made with
    `mode` (less the umask), so what dataprep creates only it can write, whatever the umask's group bits."""
    p = Path(path)
    missing = []
    base = p
    while not os.path.lexists(base) and base != base.parent:
        missing.append(base)
        base = base.parent
    if missing:
        try:
            st = os.stat(base)
        except OSError as e:
            raise UnsafeDirectory(f"{p}: cannot create this {what} in {base} ({e.strerror or e})") from None
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafeDirectory(f"{p}: cannot create this {what}: {base} is not a directory")
        if _writable_by_others(st, group_ok) and not st.st_mode & stat.S_ISVTX:
            raise UnsafeDirectory(f"{p}: would be created in {base}, which other users can write (mode "
                                  f"{stat.S_IMODE(st.st_mode):o}, not sticky), so they could replace this {what} or plant "
                                  "files in it; choose a directory only you can write (chmod go-w)" + _group_hint(st))
        _check_parents(p, base.resolve().parent, what, group_ok)
        for d in reversed(missing):
            try:
                os.mkdir(d, mode)
            except FileExistsError:
                pass  # made meanwhile (by us, or by another user in a sticky directory: check_dir refuses that)
    return check_dir(p, what, group_ok=group_ok)


def make_private_dir(path: str | os.PathLike, what: str = "directory") -> Path:
    """`path` created (with parents) mode 0700 where missing, then checked as `check_dir` does."""
    p = Path(path)
    p.mkdir(mode=0o700, parents=True, exist_ok=True)
    return check_dir(p, what)


def create_excl(directory: str | os.PathLike, prefix: str, mode: int = 0o600) -> tuple[int, Path]:
    """(fd, path) of a new file in `directory` named `prefix` + pid + random hex, created with O_EXCL and
    O_NOFOLLOW: never an existing file, never through a symlink planted at a guessable name."""
    d = Path(directory)
    for _ in range(16):
        path = d / f"{prefix}{os.getpid()}-{os.urandom(6).hex()}"
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        except FileExistsError:
            continue
        return fd, path
    raise DataprepError(f"{d}: could not create a temporary file named {prefix}* (16 names taken)")


def open_nofollow(path: str | os.PathLike, flags: int = os.O_RDONLY, mode: int = 0o600) -> int:
    """os.open with O_NOFOLLOW | O_CLOEXEC: a symlink at `path` is an OSError (ELOOP), never followed."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)


def atomic_write(path: str | os.PathLike, data: bytes, mode: int = 0o644) -> Path:
    """Replace `path` with `data` atomically: an O_EXCL temporary beside it (random name), fsync, rename,
    fsync of the directory. A crash leaves the old file or the new one, never a mix; a symlink planted at
    a temporary's name is never written through."""
    final = Path(path)
    fd, tmp = create_excl(final.parent, f".{final.name}.tmp-", mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dfd = os.open(final.parent, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return final


class UnsafeFile(DataprepError):
    """A file dataprep was asked to write that it will not: a symlink, not a regular file, another user's,
    or in a folder other users could swap it in."""


def check_file(path: str | os.PathLike, what: str = "file", *, group_ok: bool = False) -> Path:
    """`path` if dataprep may write a file of its own there, replacing what the name holds; else
    UnsafeFile (or UnsafeDirectory) naming it and why. The directories above it pass `check_links`; its
    folder exists, and it and each folder above it is sticky or not writable by other users (in /tmp,
    what we create cannot be replaced by others); the name itself, if taken, is a regular file of ours:
    a symlink is never written through (one planted in a shared folder would redirect the write onto a
    file of the victim's), and a FIFO, a device or a directory is refused, not opened (a FIFO would block
    the write forever).

    Args:
        path: the file to write.
        what: what it is, for the message ("contact sheet").
        group_ok: trust a directory the group can write (as DATAPREP_TRUST_GROUP=1 does).

    Returns:
        `path` as given.
    """
    p = Path(path)
    folder = Path(os.path.abspath(p)).parent
    check_links(folder, f"folder of this {what}", group_ok=group_ok)
    try:
        fst = os.stat(folder)
    except OSError as e:
        raise UnsafeFile(f"{p}: cannot write this {what}: no folder {folder} ({e.strerror or e})") from None
    if not stat.S_ISDIR(fst.st_mode):
        raise UnsafeFile(f"{p}: cannot write this {what}: {folder} is not a directory")
    _check_parents(p, folder.resolve(), what, group_ok)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return p
    except OSError as e:
        raise UnsafeFile(f"{p}: cannot check this {what} ({e.strerror or e})") from None
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(p)
        except OSError:
            target = "?"
        raise UnsafeFile(f"{p}: this {what} is a symlink (to {target}), and dataprep never writes through one (another "
                         "user may have planted it to point at a file of yours); remove it or give the real path")
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode)
                else "a socket" if stat.S_ISSOCK(st.st_mode) else "a device")
        raise UnsafeFile(f"{p}: this {what} is {kind}, not a regular file, and dataprep writes only regular files; "
                         "remove it or choose another name")
    uid = os.geteuid()
    if st.st_uid != uid:
        raise UnsafeFile(f"{p}: this {what} belongs to uid {st.st_uid}, not to you (uid {uid}), and dataprep does not "
                         "replace another user's file; choose another name")
    return p


def write_file(path: str | os.PathLike, data: bytes, what: str = "file", mode: int = 0o644, *, group_ok: bool = False) -> Path:
    """`data` written as a file output of dataprep's: `path` checked as `check_file` does, then replaced
    atomically (`atomic_write`: an O_EXCL | O_NOFOLLOW temporary beside it, renamed over the name, so a
    symlink planted there since the check is replaced, never written through).

    Args:
        path: the file to write.
        data: its bytes.
        what: what it is, for messages ("contact sheet").
        mode: the new file's permission bits (less the umask).
        group_ok: trust a directory the group can write (as DATAPREP_TRUST_GROUP=1 does).

    Returns:
        `path` as a Path.
    """
    check_file(path, what, group_ok=group_ok)
    return atomic_write(path, data, mode)
