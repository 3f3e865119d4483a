"""Path-list listing: takes a CSV of `path,label[,caption]` rows and a root, gives one split of those files
in the list's order, each recorded as its path relative to the root.

A first row `path,label` or `path,label,caption` is a header (optional). A label is an integer or a class
name (a list of names gives the sorted names as classes, as class folders do; integers and names are not
mixed); an empty label is an unlabelled row, skipped with its reason where other rows have one (a list
with no labels at all is unlabelled). A row whose path leaves the root (`..`, an absolute path elsewhere, a
symlink out), names no file, or has more than three fields is skipped with its reason. Files are read as
every folder source reads them (`FileReader`), confined to the root: the file the build opens is checked to
be under it (on the descriptor), so a path swapped for a symlink out after the listing is skipped, never read.
"""
from __future__ import annotations

import csv
import os
import re
from pathlib import Path

from ..errors import SourceError
from .listing import FileReader, Skips, Source, labelled_split, skip

HEADERS = (["path", "label"], ["path", "label", "caption"])


def _label(text: str) -> int | str | None:
    text = text.strip()
    if not text:
        return None
    return int(text) if re.fullmatch(r"[+-]?\d+", text) else text


def _relative(path: str, root: Path, real_root: str) -> str | None:
    """`path` relative to the root (an absolute one under it made relative), or None when it leaves the root."""
    ref = os.path.normpath(path)
    if os.path.isabs(ref):
        tries = [os.path.relpath(ref, os.path.abspath(root)), os.path.relpath(os.path.realpath(ref), real_root)]
        ref = next((r for r in tries if not _escapes(r)), tries[0])
    return None if _escapes(ref) else ref


def _escapes(ref: str) -> bool:
    return ref in (".", "..") or ref.startswith(".." + os.sep) or os.path.isabs(ref)


def scan_list(csv_path: str | os.PathLike, root: str | os.PathLike | None = None, split: str = "train",
              strict: bool = False, max_bytes: int | None = None) -> Source:
    """List the files a `path,label[,caption]` CSV names, relative to `root` (default: the CSV's folder),
    into one split `split`. `strict`: a row the listing would skip refuses the list instead (SourceError
    naming the row and why). `max_bytes`: the cap on one file's bytes when the build reads it (None:
    `limits.IMAGE_MAX_BYTES`)."""
    csv_path = Path(csv_path)
    root = Path(root) if root is not None else csv_path.resolve().parent
    if not root.is_dir():
        raise SourceError(f"{root}: the root of {csv_path} is not a directory")
    try:
        with open(csv_path, newline="", encoding="utf-8-sig") as f:
            rows = list(csv.reader(f))
    except FileNotFoundError:
        raise SourceError(f"{csv_path}: no such list file") from None
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise SourceError(f"{csv_path}: unreadable as a UTF-8 CSV ({e})") from None
    real_root = os.path.realpath(root)
    refs, raw_labels, captions, skipped = [], [], [], Skips()
    for line, row in enumerate(rows, 1):
        if not row or not any(x.strip() for x in row):
            continue
        if line == 1 and [x.strip().lower() for x in row] in HEADERS:
            continue
        where = f"{csv_path.name}:{line}"
        if len(row) > 3:
            skip(skipped, {"source": where, "reason": "bad row",
                           "detail": f"{len(row)} fields, not path,label[,caption] (quote a caption that holds commas)"}, strict)
            continue
        path = row[0].strip()
        if not path:
            skip(skipped, {"source": where, "reason": "bad row", "detail": "no path"}, strict)
            continue
        ref = _relative(path, root, real_root)
        full = os.path.realpath(os.path.join(root, ref)) if ref is not None else None
        if ref is None or not full.startswith(real_root.rstrip(os.sep) + os.sep):
            how = f"resolves to {full}, outside {real_root}" if ref is not None else f"leaves the root {root}"
            skip(skipped, {"source": path, "reason": "outside the root", "detail": f"{where}: {how}"}, strict)
            continue
        if not os.path.isfile(full):
            skip(skipped, {"source": ref, "reason": "missing file", "detail": f"{where}: no such file under {root}"}, strict)
            continue
        refs.append(ref)
        raw_labels.append(_label(row[1]) if len(row) > 1 else None)
        captions.append(row[2] if len(row) > 2 else None)
    if not refs:
        raise SourceError(f"{csv_path}: no usable row" + (f" ({skipped[0]['reason']}: {skipped[0]['detail']})" if skipped else ""))
    return labelled_split("list", root, split, refs, raw_labels, captions, skipped, {"list": str(csv_path.resolve())},
                          strict=strict, reader=FileReader(max_bytes=max_bytes, confine=True))
