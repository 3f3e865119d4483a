"""Read stage for text: takes files, directories and globs, gives a stream of documents (str), reading
each file whole only where its format needs it (jsonl and plain-text lines stream).

`.txt` is one document per file, per line, or per blank-line-separated paragraph (`split`); `.jsonl`
takes a text field; CSV and Parquet a text column (pandas); any of them may be gzip-compressed.
Bytes that are not UTF-8 are replaced and counted, or fail with `strict`.
"""
from __future__ import annotations

import glob
import gzip
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from ..errors import SourceError

SPLITS = ("file", "line", "paragraph")
TEXT_SUFFIXES = (".txt", ".text", ".md", ".jsonl", ".json", ".csv", ".tsv", ".parquet")


@dataclass
class ReadStats:
    files: int = 0
    documents: int = 0
    replaced: dict[str, int] = field(default_factory=dict)  # file -> bytes that were not UTF-8


def expand(inputs: list[str]) -> list[str]:
    """Files named, found under directories (sorted), or matched by globs; an input matching nothing is an error."""
    out: list[str] = []
    for item in inputs:
        if os.path.isdir(item):
            found = sorted(str(p) for p in Path(item).rglob("*") if p.is_file() and _base_suffix(str(p)) in TEXT_SUFFIXES)
        elif os.path.isfile(item):
            found = [item]
        else:
            found = sorted(glob.glob(item, recursive=True))
        if not found:
            raise SourceError(f"{item}: no such file, or no text files under it")
        out += found
    return out


def _base_suffix(path: str) -> str:
    p = path[:-3] if path.endswith(".gz") else path
    return os.path.splitext(p)[1].lower()


def _text(path: str, strict: bool, stats: ReadStats) -> str:
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as e:
        raise SourceError(f"{path}: cannot read ({e})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        if strict:
            raise SourceError(f"{path}: not UTF-8 at byte {e.start} (drop --strict to replace and count such bytes)") from None
        text = data.decode("utf-8", errors="replace")
        stats.replaced[path] = text.count("\ufffd") - data.decode("utf-8", errors="ignore").count("\ufffd")
        return text


def documents(paths: list[str], split: str = "file", text_field: str = "text", strict: bool = False,
              stats: ReadStats | None = None) -> Iterator[str]:
    """Every document of every file, in order; empty documents are left out."""
    if split not in SPLITS:
        raise SourceError(f"unknown document split {split!r}; choose one of {list(SPLITS)}")
    stats = stats if stats is not None else ReadStats()
    for path in paths:
        stats.files += 1
        kind = _base_suffix(path)
        if kind in (".csv", ".tsv", ".parquet"):
            docs = _table_column(path, kind, text_field)
        elif kind in (".jsonl", ".json"):
            docs = _jsonl(path, text_field, strict, stats)
        else:
            text = _text(path, strict, stats)
            if split == "file":
                docs = [text]
            elif split == "line":
                docs = text.splitlines()
            else:
                docs = [p for p in text.replace("\r\n", "\n").split("\n\n")]
        for d in docs:
            if d and d.strip():
                stats.documents += 1
                yield d


def _jsonl(path: str, text_field: str, strict: bool, stats: ReadStats) -> Iterator[str]:
    for n, line in enumerate(_text(path, strict, stats).splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise SourceError(f"{path}: line {n} is not JSON ({e.msg})") from None
        if not isinstance(obj, dict) or text_field not in obj:
            raise SourceError(f"{path}: line {n} has no {text_field!r} field (choose one with --text-field)")
        yield str(obj[text_field])


def _table_column(path: str, kind: str, column: str) -> list[str]:
    import pandas as pd

    try:
        df = pd.read_parquet(path, columns=[column]) if kind == ".parquet" else pd.read_csv(path, sep="\t" if kind == ".tsv" else ",")
    except (ImportError, ValueError, KeyError, OSError) as e:
        raise SourceError(f"{path}: cannot read column {column!r} ({type(e).__name__}: {e})") from None
    if column not in df.columns:
        raise SourceError(f"{path}: no column {column!r}; it has {list(df.columns)[:10]} (choose one with --text-field)")
    return df[column].dropna().astype(str).tolist()
