"""Names: takes a split, shard, field or array name wherever it enters (build options, table cells,
manifests, HDF5/Zarr groups), gives it back only when it is safe to join onto a pack's path; and checks
that a path the pack code writes or removes stays inside its pack.

A name is 1-128 characters of letters, digits and `_ . @ + = -`, starting with a letter or digit, and
holds no `..`: no `/`, no parent steps, never absolute, so `pack / split / shard / (array + ".npy")`
cannot leave the pack, whatever a manifest, a cell or an HDF5 group says.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from ..errors import DataprepError, PackError

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@+=-]{0,127}")


def bad_name(value: Any) -> bool:
    return not isinstance(value, str) or not _NAME.fullmatch(value) or ".." in value


def check_name(value: Any, what: str, origin: str, error: type[DataprepError] = DataprepError) -> str:
    """`value` when it is a safe name; else an `error` naming the value, what it names and where it came from."""
    if bad_name(value):
        raise error(f"{origin}: {what} name {value!r} is not allowed (1-128 letters, digits and _ . @ + = -, "
                    "starting with a letter or digit; no '/', no '..')")
    return value


def check_manifest_names(m: dict[str, Any], where: str | os.PathLike) -> None:
    """Every split, shard, field and file name in a manifest is a safe name (a PackError otherwise)."""
    origin = f"{where}"
    splits = m.get("splits")
    if not isinstance(splits, dict) or not isinstance(m.get("fields"), dict):
        raise PackError(f"{where}: the manifest's splits and fields are not mappings")
    for key in m["fields"]:
        check_name(key, "field", origin, PackError)
    for split, entry in splits.items():
        check_name(split, "split", origin, PackError)
        shards = entry.get("shards") if isinstance(entry, dict) else None
        if not isinstance(shards, list):
            raise PackError(f"{where}: split {split!r} has no list of shards")
        for s in shards:
            if not isinstance(s, dict):
                raise PackError(f"{where}: split {split!r} holds a shard entry that is not a mapping")
            check_name(str(s.get("name")) if isinstance(s.get("name"), (str, int)) else s.get("name"), "shard", origin, PackError)
            files = s.get("files", {})
            if not isinstance(files, dict):
                raise PackError(f"{where}: shard {s.get('name')!r} of {split!r}: files is not a mapping")
            for fname in files:
                if not isinstance(fname, str) or not fname.endswith(".npy"):
                    raise PackError(f"{where}: shard {s.get('name')!r} of {split!r} lists a file {fname!r} that is not .npy")
                check_name(fname[:-4], "array", origin, PackError)
    attached = m.get("attachments") or {}
    if not isinstance(attached, dict):
        raise PackError(f"{where}: the manifest's attachments are not a mapping")
    for name, rec in attached.items():  # written beside the manifest by a fetch: never a path
        check_name(name, "attached file", origin, PackError)
        if not isinstance(rec, dict) or not isinstance(rec.get("bytes"), int) or rec["bytes"] < 0:
            raise PackError(f"{where}: attached file {name!r} has no byte count")


def inside(root: str | os.PathLike, path: str | os.PathLike, what: str = "path") -> Path:
    """`path`, when it resolves (symlinks followed) to `root` itself or below it; a PackError otherwise."""
    r, p = os.path.realpath(root), os.path.realpath(path)
    if p != r and not p.startswith(r.rstrip(os.sep) + os.sep):
        raise PackError(f"{path}: the {what} resolves to {p}, outside {r}; refusing to touch it")
    return Path(path)
