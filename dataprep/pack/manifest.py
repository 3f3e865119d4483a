"""Manifest stage: takes the shard records of a finished build, gives `manifest.json`; reads and checks it back.

The manifest is the pack's table of contents and its proof of completion: it is written last,
through a temporary file, fsync and an atomic rename, so a directory without it is not a pack.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ..errors import FormatVersionError, PackError
from ..safe_paths import atomic_write, create_excl
from .names import check_manifest_names

FORMAT = "dataprep-pack"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
MANIFEST_TMP = f".{MANIFEST}.tmp-"  # + pid + random hex: a manifest being written (O_EXCL, never a guessable name)
# Files a pack keeps beside its manifest (text.TOKENIZER_FILE, tables.columns.VOCAB_FILE), written just before it: an
# unfinished build may hold them (and their temporaries, `attachment_tmp`), and --resume / --overwrite know them.
KEPT_BESIDE = ("tokenizer.json", "vocab.json")


def attachment_tmp(name: str) -> str:
    """The prefix of `write_attachment`'s temporaries for `name` (safe_paths.atomic_write's)."""
    return f".{name}.tmp-"


def _full_disk_hint(e: OSError) -> str:
    if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return "; the disk is full or a file-size limit was reached: free space, then rerun with --resume (every shard is kept)"
    return ""


def write_manifest(pack_dir: str | os.PathLike, manifest: dict[str, Any]) -> Path:
    """Write `manifest.json` atomically: a temporary of a random name created with O_EXCL | O_NOFOLLOW (a file or
    symlink another user planted at a name is never written through), fsync, rename, fsync of the directory."""
    pack_dir = Path(pack_dir)
    body = {"format": FORMAT, "format_version": FORMAT_VERSION, **manifest}
    fd, tmp = create_excl(pack_dir, MANIFEST_TMP, 0o644)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(body, f, indent=1, sort_keys=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        final = pack_dir / MANIFEST
        os.replace(tmp, final)
    except OSError as e:
        tmp.unlink(missing_ok=True)  # a full disk must not leave a file that makes --resume and --overwrite refuse
        raise PackError(f"{pack_dir / MANIFEST}: cannot write the manifest ({e.strerror or e}){_full_disk_hint(e)}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(pack_dir)
    return final


def write_attachment(pack_dir: str | os.PathLike, name: str, data: bytes) -> Path:
    """A file the pack keeps beside its manifest (one of KEPT_BESIDE), written atomically through an O_EXCL
    temporary (never through a symlink); a full disk is a PackError naming the file and saying how to continue."""
    path = Path(pack_dir) / name
    try:
        return atomic_write(path, data, 0o644)
    except OSError as e:
        raise PackError(f"{path}: cannot write ({e.strerror or e}){_full_disk_hint(e)}") from None


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_manifest_file(pack_dir: Path) -> dict[str, Any]:
    """The manifest.json of an npy pack directory, checked."""
    path = pack_dir / MANIFEST
    if not pack_dir.exists():
        raise PackError(f"{pack_dir}: no such pack directory")
    if not path.is_file():
        hint = " (an unfinished build: shards without a manifest)" if any(pack_dir.iterdir()) else ""
        raise PackError(f"{path}: missing; {pack_dir} is not a complete pack{hint}")
    try:
        with open(path, encoding="utf-8") as f:
            m = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PackError(f"{path}: unreadable manifest ({e})") from None
    return check_manifest(m, path)


def check_manifest(m: Any, where: str | os.PathLike) -> dict[str, Any]:
    """Check a manifest's format, version and required keys (wherever it was stored)."""
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise PackError(f"{where}: not a dataprep manifest (format is {m.get('format') if isinstance(m, dict) else None!r})")
    version = m.get("format_version")
    if version != FORMAT_VERSION:
        raise FormatVersionError(
            f"{where}: format version {version!r}, but this dataprep reads version {FORMAT_VERSION}; "
            "rebuild the pack or use a matching dataprep"
        )
    for key in ("kind", "splits", "fields"):
        if key not in m:
            raise PackError(f"{where}: manifest lacks {key!r}")
    check_manifest_names(m, where)  # every name it holds is joined onto the pack's path later
    return m


def attachment_record(data: bytes) -> dict[str, Any]:
    """The manifest's record of a file a pack keeps beside its shards (its `"attachments"`: name -> record)."""
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def attachment_problems(m: dict[str, Any], attached: dict[str, bytes]) -> list[tuple[str, str]]:
    """(name, what is wrong) for every file the manifest's `"attachments"` records that `attached` (a reader's
    attachments()) lacks or holds with other bytes."""
    out = []
    records = m.get("attachments") or {}
    for name, rec in records.items() if isinstance(records, dict) else ():
        if name not in attached:
            out.append((name, "missing; the manifest records it"))
            continue
        got, want = attachment_record(attached[name]), rec if isinstance(rec, dict) else {}
        if got != {k: want.get(k) for k in got}:
            out.append((name, f"checksum mismatch ({got['bytes']} bytes, sha256 {got['sha256'][:12]}...; "
                              f"manifest {want.get('bytes')} bytes, {str(want.get('sha256'))[:12]}...)"))
    return out
