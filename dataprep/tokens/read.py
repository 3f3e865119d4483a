"""Read stage for text: takes files, directories and globs, gives a stream of documents (str), reading
each file whole only where its format needs it (jsonl and plain-text lines stream).

`.txt` is one document per file, per line, or per blank-line-separated paragraph (`split`; a paragraph runs
from its first line with text to its last, however many blank lines separate it from the next); `.jsonl`
takes a text field; CSV and Parquet a text column (pandas); any of them may be gzip-compressed.
Bytes that are not UTF-8 are replaced and counted, or fail with `strict`.
"""
from __future__ import annotations

import codecs
import glob
import gzip
import json
import os
import re
import stat
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
            found = sorted(p for p in glob.glob(item, recursive=True) if os.path.isfile(p))  # regular files only
        if not found:
            raise SourceError(f"{item}: no such file, or no text files under it")
        out += found
    return out


def _base_suffix(path: str) -> str:
    p = path[:-3] if path.endswith(".gz") else path
    return os.path.splitext(p)[1].lower()


BLOCK = 1 << 20  # bytes read at a time
_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"  # where str.splitlines splits
_BOUNDARY = re.compile(f"[{_BREAKS}]")
PIECE_CHARS = 256 << 10  # a document longer than this is handed on in pieces cut at whitespace


def _blocks(path: str, strict: bool, stats: ReadStats) -> Iterator[str]:
    """The file's text, decoded as UTF-8 a block at a time (never the whole file at once). Bytes that are not
    UTF-8 are replaced and counted in `stats.replaced`, or, with `strict`, an error naming the byte."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block, /dev/zero never end
            raise SourceError(f"{path}: not a regular file")
    except OSError as e:
        raise SourceError(f"{path}: cannot read ({e.strerror or e})") from None
    opener = gzip.open if path.endswith(".gz") else open
    decoder = codecs.getincrementaldecoder("utf-8")("strict" if strict else "replace")
    ignoring = codecs.getincrementaldecoder("utf-8")("ignore")  # the same text without replacements: their count
    pos = replaced = 0
    try:
        with opener(path, "rb") as f:
            while True:
                data = f.read(BLOCK)
                pending = len(decoder.getstate()[0])
                try:
                    text = decoder.decode(data, final=not data)
                except UnicodeDecodeError as e:
                    raise SourceError(f"{path}: not UTF-8 at byte {pos - pending + e.start} "
                                      "(drop --strict to replace and count such bytes)") from None
                if not strict:
                    plain = ignoring.decode(data, final=not data)
                    if "\ufffd" in text:
                        replaced += text.count("\ufffd") - plain.count("\ufffd")
                pos += len(data)
                if text:
                    yield text
                if not data:
                    break
    except (OSError, EOFError) as e:
        raise SourceError(f"{path}: cannot read ({e})") from None
    if replaced:
        stats.replaced[path] = replaced


def _cut(text: str, limit: int) -> int:
    """Where to cut a too-long piece: before the last run of whitespace that starts within `limit` (the whole
    run goes to the next piece, as a byte-level BPE would split it), else, with no whitespace in the last
    4096 characters (CJK text, base64), at `limit`."""
    for i in range(limit, max(limit - 4096, 0), -1):
        if text[i].isspace():
            while i > 0 and text[i - 1].isspace():
                i -= 1
            return i if i > 0 else limit
    return limit


def _split_long(doc: str, limit: int) -> Iterator[tuple[str, bool]]:
    """A whole document as (piece, last) pairs of at most about `limit` characters."""
    while len(doc) > limit:
        i = _cut(doc, limit)
        yield doc[:i], False
        doc = doc[i:]
    yield doc, True


def _streamed(blocks: Iterator[str], split: str, limit: int) -> Iterator[tuple[str, bool]]:
    """Documents of a text stream as (piece, last): the whole text, each line (str.splitlines' boundaries)
    or each paragraph (blank-line separated), each bounded by `limit` characters per piece whatever the
    line lengths; the same documents a whole-file split gives."""
    carry = ""
    held: list[str] = []  # line mode: blocks of a line still growing (no boundary in them), joined once
    held_chars = 0
    for block in blocks:
        if split == "line" and not _BOUNDARY.search(block):
            held.append(block)
            held_chars += len(block)
            if held_chars + len(carry) <= 2 * limit:
                continue
            block = ""
        if held:
            block, held, held_chars = "".join(held) + block, [], 0
        if split == "paragraph":
            if carry.endswith("\r"):  # a \r\n cut in two by the block boundary
                block, carry = "\r" + block, carry[:-1]
            block = block.replace("\r\n", "\n")
        buf = carry + block
        if split == "line":
            parts = buf.splitlines(keepends=True)
            done, carry = (parts, "") if parts and parts[-1].splitlines()[0] != parts[-1] else (parts[:-1], parts[-1] if parts else "")
            for line in done:
                yield from _split_long(line.splitlines()[0] if line.splitlines() else "", limit)
        elif split == "paragraph":
            parts = buf.split("\n\n")
            carry = parts.pop()
            for par in parts:
                yield from _split_long(par, limit)
        else:
            carry = buf
        while len(carry) > 2 * limit:  # a document still growing: hand on its beginning
            i = _cut(carry, limit)
            yield carry[:i], False
            carry = carry[i:]
    carry += "".join(held)
    if split == "line":
        for line in carry.splitlines() or [carry]:
            yield from _split_long(line, limit)
    else:
        yield from _split_long(carry, limit)


def _last_break(text: str) -> int:
    """The index of the last line boundary in `text` (str.splitlines' boundaries), or -1."""
    return max(text.rfind(c) for c in _BREAKS)


def _without_blank_edges(stream: Iterator[tuple[str, bool]]) -> Iterator[tuple[str, bool]]:
    """Each document of a (piece, last) stream without the whitespace-only lines at its start and end (a
    paragraph after more than one blank line began with a line boundary); the first line's indentation and
    the last line's trailing spaces stay. Whitespace after a piece's text is held back until more text comes
    (it is whitespace-only lines if the document ends first), so pieces keep their cuts, plus at most one
    before such a run (where a byte-level BPE splits anyway)."""
    head, lead = True, ""  # no text handed on yet; the whitespace after the last line boundary seen so far
    held: list[str] = []  # whitespace after the text handed on
    for piece, last in stream:
        if head:
            piece = lead + piece
            j = _last_break(piece[: len(piece) - len(piece.lstrip())])
            piece = piece[j + 1 :]
            lead = piece if not piece.strip() else ""
            if lead or not piece:  # only whitespace so far, on the last line boundary's right at most
                if last:
                    yield "", True  # a blank document (pieces() leaves it out)
                    lead = ""
                continue
            head = False
        text = piece.rstrip()
        if text:
            yield from ((h, False) for h in held if h)
            held = []
            if not last:
                yield text, False
        held.append(piece[len(text):])
        if last:  # the trailing whitespace up to its first line boundary is the last line's
            tail = "".join(held)
            k = _BOUNDARY.search(tail)
            yield text + (tail[: k.start()] if k else tail), True
            head, held = True, []


def pieces(paths: list[str], split: str = "file", text_field: str = "text", strict: bool = False,
           stats: ReadStats | None = None, limit: int = PIECE_CHARS) -> Iterator[tuple[str, bool]]:
    """Every document of every file, in order, as (piece, last): a document of more than `limit` characters
    comes in pieces cut at whitespace, `last` on its final one. Empty documents are left out. Files are
    streamed: memory is bounded by `limit`, the block size and one jsonl line, not by the file or its lines."""
    if split not in SPLITS:
        raise SourceError(f"unknown document split {split!r}; choose one of {list(SPLITS)}")
    stats = stats if stats is not None else ReadStats()
    for path in paths:
        stats.files += 1
        kind = _base_suffix(path)
        if kind in (".csv", ".tsv", ".parquet"):
            stream = (piece for d in _table_column(path, kind, text_field) for piece in _split_long(d, limit))
        elif kind in (".jsonl", ".json"):
            stream = (piece for d in _jsonl(path, text_field, strict, stats) for piece in _split_long(d, limit))
        else:
            stream = _streamed(_blocks(path, strict, stats), split, limit)
            if split == "paragraph":
                stream = _without_blank_edges(stream)
        doc: list[str] = []  # pieces not yet handed on: the last one, and any before the first that is not blank
        started = False
        for piece, last in stream:
            doc.append(piece)
            started = started or bool(piece.strip())
            if started:
                while len(doc) > 1:
                    yield doc.pop(0), False
            if last:
                if started:
                    stats.documents += 1
                    yield doc[0], True
                doc, started = [], False


def documents(paths: list[str], split: str = "file", text_field: str = "text", strict: bool = False,
              stats: ReadStats | None = None) -> Iterator[str]:
    """Every document of every file, in order, as text (a long one in pieces); empty documents are left out."""
    return (piece for piece, _ in pieces(paths, split, text_field, strict, stats))


def _jsonl(path: str, text_field: str, strict: bool, stats: ReadStats) -> Iterator[str]:
    n = 0
    for line, _ in _streamed(_blocks(path, strict, stats), "line", 1 << 62):
        n += 1
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
