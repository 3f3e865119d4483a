"""Encoding a task's text: takes chunks of a task's (piece, last) pairs, its tokenizer and its splits'
writers, gives each finished document's token ids, an end-of-text id after each, to its split's shards
(`_encode_chunk`): whole documents in one vectorised call, a long document's pieces a few at a time, held
in the stored dtype until its last (`_LongDocument`); `_SplitWriter` collects one split's documents of one
task and writes a shard whenever `shard_tokens` are waiting. tokens/tokenize.py runs a task through these.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from ..pack.shard import write_shard
from ..text import check_ids as _check_ids
from ..text import encode
from .field import TokensField
from .val_draw import _ValDraw

if TYPE_CHECKING:
    from .tokenize import FileTask


LONG_BATCH_CHARS = 1 << 20  # text encoded at once while a long document is in progress


def _batches(sizes: list[int], limit: int) -> list[tuple[int, int]]:
    """[a, b) ranges of consecutive items of about `limit` total size (at least one item each)."""
    out, a, total = [], 0, 0
    for i, n in enumerate(sizes):
        if total and total + n > limit:
            out.append((a, i))
            a, total = i, 0
        total += n
    out.append((a, len(sizes)))
    return out


class _LongDocument:
    """The pieces of a document too long to encode at once, held in the stored dtype until its last piece;
    its split (train or val) is drawn from its whole text, hashed piece by piece."""

    def __init__(self, draw: _ValDraw) -> None:
        self.parts: list[np.ndarray] = []
        self.draw = draw
        self.hash = draw.start()

    @property
    def empty(self) -> bool:
        return not self.parts

    def add(self, ids: np.ndarray, text: str) -> None:
        self.parts.append(ids)
        self.hash.update(text.encode("utf-8", "surrogatepass"))

    def finish(self, eot_id: int, dtype: np.dtype) -> tuple[np.ndarray, bool]:
        tokens = np.concatenate([*self.parts, np.array([eot_id], dtype)])
        val = self.draw.of(self.hash)
        self.parts, self.hash = [], self.draw.start()
        return tokens, val


def _chunks(docs: Iterator, limit: int) -> Iterator[list]:
    """Consecutive items (documents, or (piece, last) pairs) in lists of about `limit` characters."""
    chunk, size = [], 0
    for d in docs:
        chunk.append(d)
        size += len(d if isinstance(d, str) else d[0])
        if size >= limit:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


class _SplitWriter:
    """Collects one split's documents of one task and writes a shard whenever `shard_tokens` are
    waiting; shard names are the task's number and a part number (TTTTTPPPP), so tasks can run in
    any order, on any engine, and give the same shards."""

    def __init__(self, out: Path, name: str, dtype: np.dtype, shard_tokens: int, task_no: int, fingerprint: str = ""):
        self.dir, self.name, self.dtype, self.limit, self.task_no = out / name, name, dtype, shard_tokens, task_no
        self.fingerprint = fingerprint  # the task's: in every shard.json, so --resume checks a shard as image builds do
        self.parts: list[np.ndarray] = []
        self.lengths: list[int] = []
        self.waiting = 0
        self.shards: list[dict[str, Any]] = []
        self.docs = self.tokens = 0

    def keep(self, split: dict[str, Any]) -> None:
        """Start after the shards an earlier run finished (a resumed task's kept units): numbering goes on from them."""
        self.shards, self.docs, self.tokens = list(split["shards"]), split["docs"], split["tokens"]

    def add(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Documents already joined: `tokens` of several documents, each `lengths[i]` long (its eot included)."""
        if not len(lengths):
            return
        self.parts.append(tokens.astype(self.dtype, copy=False))  # held in the stored dtype: 4x less than int64
        self.lengths.extend(lengths.tolist())
        self.waiting += len(tokens)
        if self.waiting >= self.limit:
            self.flush()

    def flush(self) -> None:
        if not self.parts:
            return
        tokens = self.parts[0] if len(self.parts) == 1 else np.concatenate(self.parts)
        self.parts = []
        name = f"{self.task_no:05d}{len(self.shards):04d}"
        arrays = TokensField(self.dtype.str).shard_arrays(tokens, self.lengths)
        files = write_shard(self.dir, name, arrays, {"count": len(self.lengths), "fingerprint": self.fingerprint})
        self.shards.append({"name": name, "count": len(self.lengths), "tokens": int(len(tokens)), "files": files})
        self.docs += len(self.lengths)
        self.tokens += len(tokens)
        self.parts, self.lengths, self.waiting = [], [], 0


def _encode_chunk(tok, chunk: list[tuple[str, bool]], task: FileTask, writers: dict[str, _SplitWriter],
                  pending: _LongDocument, draw: _ValDraw, limit: int, dtype: np.dtype) -> None:
    """Encode a chunk of (piece, last) and hand each finished document to its split's writer."""
    if pending.empty and all(last for _, last in chunk):  # whole documents only: one vectorised join
        tokens, lengths = encode(tok, [text for text, _ in chunk], task.eot_id)  # its Encodings already let go
        _check_ids(tokens, limit, dtype, task.paths[0])
        val = np.array([draw.text(text) for text, _ in chunk], bool) if draw.bound else np.zeros(len(chunk), bool)
        if val.any():
            in_val = np.repeat(val, lengths)
            writers["val"].add(tokens[in_val], lengths[val])
            writers["train"].add(tokens[~in_val], lengths[~val])
        else:
            writers["train"].add(tokens, lengths)
        return
    # A long document's pieces, a few at a time (an Encoding costs ~100 bytes per token): joined, with
    # one end-of-text id after the last.
    for a, b in _batches([len(text) for text, _ in chunk], LONG_BATCH_CHARS):
        encs = tok.encode_batch_fast([text for text, _ in chunk[a:b]], add_special_tokens=False)
        for enc, (text, last) in zip(encs, chunk[a:b]):
            ids = np.asarray(enc.ids, np.int64)
            _check_ids(ids, limit, dtype, task.paths[0])
            pending.add(ids.astype(dtype), text)
            if last:
                tokens, in_val = pending.finish(task.eot_id, dtype)
                writers["val" if in_val else "train"].add(tokens, np.array([len(tokens)], np.int64))
        del encs
