"""Tokenize stage: takes a stream of documents and a tokenizer, gives a pack of kind "tokens": per split,
shards of one token array (uint16 when every id fits, else uint32) plus int64 document offsets.

One task per group of consecutive input files of about `task_bytes` (on the local engine, or a Dask
cluster): its documents are read in bounded
chunks and encoded with the tokenizer's batch API (which uses every core), so peak memory does not
grow with the corpus, and written as that file's shards. Each document is followed by an end-of-text
id. The split of a document (train or val) is a pure function of the seed and the document's text
(`in_val`, recorded in the manifest as "val_rule"), so chunk and task sizes, workers, engines and the
order of the inputs never change which documents are val. A task is written in units of about
`unit_bytes` of text, each recorded when its shards are written, so --resume keeps the finished units
of a task that was cut short.

Beside it: tokens/val_draw.py draws each document's split (`in_val`), tokens/encoding.py encodes a chunk
and writes its shards (`_encode_chunk`, `_SplitWriter`), tokens/task_records.py keeps and drops a task's
shards for --resume (`_finished`, `_save_record`).
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import os
import shlex
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from ..driver import TASK_RECORDS, nothing_stored, prepare_output, task_fingerprint
from ..errors import DataprepError
from ..pack.manifest import attachment_record, write_attachment, write_manifest
from ..pack.shard import remove_temporaries
from ..text import check_ids as _check_ids  # noqa: F401 (token_dtype re-exported)
from ..text import token_dtype
from ..text import tokenizer_file as _tokenizer_file
from ..version import __version__
from .encoding import LONG_BATCH_CHARS, _batches, _chunks, _encode_chunk, _LongDocument, _SplitWriter  # noqa: F401
from .field import TOKENIZER_FILE, TokensField, tokenizer_from_json
from .read import PIECE_CHARS, ReadStats, documents, pieces
from .task_records import _drop_shards_of, _finished, _remove_unrecorded, _save_record, _stamp, _task_record  # noqa: F401
from .val_draw import VAL_RULE, _ValDraw, in_val, val_rule  # noqa: F401

EOT_CANDIDATES = ("<|endoftext|>", "</s>", "[SEP]", "<eos>", "<|end_of_text|>")


@dataclass(frozen=True)
class TokenizeSettings:
    split: str = "file"  # file | line | paragraph
    text_field: str = "text"
    eot: str | None = None  # token text; default: the first of EOT_CANDIDATES the tokenizer knows
    eot_id: int | None = None
    val_fraction: float = 0.0
    seed: int = 0
    chunk_bytes: int = 8 << 20
    shard_tokens: int = 1 << 24  # 16 M tokens (32 MB as uint16) per shard
    task_bytes: int = 64 << 20  # consecutive input files are grouped into tasks of about this much text
    strict: bool = False
    unit_bytes: int = 8 << 20  # a task's text is written (and kept by --resume) in units of about this much

    def __post_init__(self):
        if not 0 <= self.val_fraction < 1:
            raise DataprepError("val_fraction must be in [0, 1)")
        if self.chunk_bytes < 1 or self.shard_tokens < 1 or self.task_bytes < 1 or self.unit_bytes < 1:
            raise DataprepError("chunk_bytes, shard_tokens, task_bytes and unit_bytes must be positive")


def load_tokenizer(path: str):
    """A Hugging Face tokenizer from its JSON file, with padding and truncation switched off."""
    return _tokenizer_file(path)[1]


def train_bpe(docs: Iterable[str], vocab_size: int, out: Path | None = None):
    """Train a byte-level BPE (exact round trips: decode(encode(text)) == text), saved to `out` if given."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(docs, trainer)
    if out is not None:
        tok.save(str(out))
    return tok


@dataclass(frozen=True)
class FileTask:
    """Consecutive input files to tokenize into shards: a pure function of these fields (the tokenizer
    travels as its JSON text, so workers on other machines need no copy of the file)."""

    paths: tuple[str, ...]
    task_no: int  # the task's number: names its shards and seeds its val split
    out: str
    tokenizer_json: str
    eot_id: int
    dtype: str
    settings: TokenizeSettings
    resume: bool = False  # keep the task's shards when an earlier run finished them with the same inputs and settings

    def fingerprint(self) -> str:
        """A digest of everything the task's shards depend on: its files (paths, sizes, mtimes), its number, the
        tokenizer, the end-of-text id, the dtype, the settings and the val rule."""
        head = ["tokens", self.task_no, hashlib.sha256(self.tokenizer_json.encode("utf-8")).hexdigest(), self.eot_id,
                self.dtype, asdict(self.settings), VAL_RULE]
        return task_fingerprint(head, (_stamp(p) for p in self.paths))


class _ReadAgain(Exception):
    """A kept unit's documents were not all there to skip: the task is tokenized from its start."""


def tokenize_file(task: FileTask) -> dict[str, Any]:
    """Tokenize the task's documents into its shards (with `resume`, keep them when an earlier run finished the
    task with the same inputs and settings, or the units of it that it finished); return their records and the
    statistics, `reused` saying whether the whole task was kept, `kept_units` and `kept_bytes` how much of it."""
    fp = task.fingerprint()
    out = Path(task.out)
    kept = _finished(task, fp) if task.resume else None
    if kept is not None and kept["done"]:
        return {**kept["record"], "reused": True, "kept_units": 0, "kept_bytes": 0}
    if task.resume:
        splits = kept["record"]["splits"] if kept else {}
        _drop_shards_of(out, task.task_no, {(n, sh["name"]) for n, sp in splits.items() for sh in sp["shards"]})
    try:
        rec, units, chars = _tokenize(task, fp, kept)
    except _ReadAgain:
        _drop_shards_of(out, task.task_no)
        kept = None
        rec, units, chars = _tokenize(task, fp, None)
    _save_record(out, task.task_no, fp, True, rec["documents"], chars, rec)
    kept_bytes = rec["bytes"] * kept["chars"] // max(chars, 1) if kept else 0  # for the rate: about what was not redone
    return {**rec, "reused": False, "kept_units": units if kept else 0, "kept_bytes": kept_bytes}


class _Units:
    """A task's stream of (piece, last) in units of at least `limit` characters that end with a document: the part
    of a task that --resume keeps once it is written. `docs` and `chars` count what was read, `count` the units
    begun, `ended` says the stream is done."""

    def __init__(self, stream: Iterator[tuple[str, bool]], limit: int):
        self.stream, self.limit = stream, limit
        self.docs = self.chars = self.count = 0
        self.ended = False

    def skip(self, docs: int, chars: int) -> None:
        """Read the first `docs` documents (the kept units') without handing them on; they must come to `chars`
        characters, as when they were written, else _ReadAgain."""
        if docs:
            for piece, last in self.stream:
                self.chars += len(piece)
                self.docs += last
                if self.docs == docs:
                    break
        if (self.docs, self.chars) != (docs, chars):  # the inputs changed under the same fingerprint (sizes, mtimes)
            raise _ReadAgain

    def unit(self) -> Iterator[tuple[str, bool]]:
        """The next unit's (piece, last) pairs."""
        size = 0
        for piece, last in self.stream:
            self.count += size == 0
            size += len(piece)
            self.chars += len(piece)
            self.docs += last
            yield piece, last
            if last and size >= self.limit:
                return
        self.ended = True


def _tokenize(task: FileTask, fp: str, kept: dict[str, Any] | None) -> tuple[dict[str, Any], int, int]:
    """The task's shards, after its `kept` units (from _finished) where an earlier run finished some; gives the
    task's record, the number of units kept and the characters read."""
    tok = tokenizer_from_json(task.tokenizer_json, task.paths[0])
    s, dtype = task.settings, np.dtype(task.dtype)
    limit = int(np.iinfo(dtype).max)
    names = ["train", "val"] if s.val_fraction else ["train"]
    writers = {n: _SplitWriter(Path(task.out), n, dtype, s.shard_tokens, task.task_no, fp) for n in names}
    draw = _ValDraw(s.seed, s.val_fraction)
    stats = ReadStats()
    pending = _LongDocument(draw)
    stream = pieces(list(task.paths), s.split, s.text_field, s.strict, stats, min(PIECE_CHARS, s.chunk_bytes))
    size = sum(os.path.getsize(p) for p in task.paths)
    # At most about 512 units a task, so a huge single file does not run out of shard part numbers (PPPP).
    units = _Units(stream, max(s.unit_bytes, size // 512))
    n_kept = 0
    if kept is not None:
        for n, w in writers.items():
            w.keep(kept["record"]["splits"][n])
        units.skip(kept["read"], kept["chars"])  # read again (cheap beside encoding), so the statistics count every document
        n_kept = kept["record"]["units"]
    while not units.ended:
        for chunk in _chunks(units.unit(), s.chunk_bytes):
            _encode_chunk(tok, chunk, task, writers, pending, draw, limit, dtype)
        if units.ended:
            break
        for w in writers.values():
            w.flush()
        _save_record(Path(task.out), task.task_no, fp, False, units.docs, units.chars,
                     _record(writers, stats, size, n_kept + units.count))
    for w in writers.values():
        w.flush()
    return _record(writers, stats, size, n_kept + units.count), n_kept, units.chars


def _record(writers: dict[str, _SplitWriter], stats: ReadStats, size: int, units: int) -> dict[str, Any]:
    return {"splits": {n: {"docs": w.docs, "tokens": w.tokens, "shards": list(w.shards)} for n, w in writers.items()},
            "documents": stats.documents, "replaced": dict(stats.replaced), "bytes": size, "units": units}


def _groups(paths: list[str], target: int) -> list[tuple[str, ...]]:
    """Consecutive files in groups of about `target` bytes (a larger file is a group of its own)."""
    groups, cur, size = [], [], 0
    for p in paths:
        cur.append(str(p))
        size += os.path.getsize(p)
        if size >= target:
            groups.append(tuple(cur))
            cur, size = [], 0
    if cur:
        groups.append(tuple(cur))
    return groups


def tokenize(inputs: list[str], out: str | os.PathLike, settings: TokenizeSettings, tokenizer: str | None = None,
             train_bpe_vocab: int | None = None, overwrite: bool = False,
             progress: Callable[[int], None] | None = None, engine=None, resume: bool = False) -> dict[str, Any]:
    """Tokenize documents from `inputs` (files) into a token pack, one task per group of files on `engine`
    (default: this process); return a summary. `progress(n)` is told of n more bytes of input (those a resumed
    run kept go to `progress.kept(n)` where it has one). `resume` continues an unfinished run in `out`: the tasks
    it finished with the same inputs and settings, shards intact by checksum, are kept (summary's `reused`), and
    so are the finished units of the others (`kept_units`)."""
    from ..engine import LocalEngine

    out = Path(out)
    t0 = time.perf_counter()
    if (tokenizer is None) == (train_bpe_vocab is None):
        raise DataprepError("give a tokenizer file or --train-bpe VOCAB (one of the two)")
    if train_bpe_vocab:
        prepare_output(out, overwrite, resume)
        tok_path = out / TOKENIZER_FILE
        tok = train_bpe(documents(inputs, settings.split, settings.text_field, settings.strict), train_bpe_vocab)
        tok_bytes = tok.to_str(pretty=True).encode("utf-8")
    else:
        tok_path = Path(tokenizer)
        tok_bytes, tok = _tokenizer_file(tok_path)  # read before --overwrite empties `out`, which may hold it
        prepare_output(out, overwrite, resume)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    eot_id = settings.eot_id
    if eot_id is None:
        names = [settings.eot] if settings.eot else list(EOT_CANDIDATES)
        eot_id = next((tok.token_to_id(n) for n in names if tok.token_to_id(n) is not None), None)
        if eot_id is None:
            special = _special_tokens(tok)
            example = shlex.quote(special[0] if special else "<EOT>")
            raise DataprepError(f"{tok_path}: has none of {names} as a token; name the end-of-text token with --eot "
                                f"(e.g. --eot {example}) or give its id with --eot-id" + _special_list(special))
    dtype = token_dtype(vocab)
    if not 0 <= eot_id <= np.iinfo(dtype).max:  # checked here: a long document's last piece appends it in `dtype`
        raise DataprepError(f"end-of-text id {eot_id} does not fit in {dtype} (vocabulary {vocab})")  # never truncate
    tok_json = tok.to_str()
    tasks = [FileTask(group, k, str(out), tok_json, int(eot_id), dtype.str, settings, resume)
             for k, group in enumerate(_groups(inputs, settings.task_bytes))]
    kept = getattr(progress, "kept", progress)

    def done(i: int, rec: dict) -> None:
        if progress:
            old = rec["bytes"] if rec.get("reused") else rec.get("kept_bytes", 0)
            if old:
                kept(old)
            if rec["bytes"] - old:
                progress(rec["bytes"] - old)

    try:
        recs = (engine or LocalEngine(1)).map(tokenize_file, tasks, done, names=[os.path.basename(t.paths[0]) for t in tasks])
    finally:
        for split in ("train", "val"):
            remove_temporaries(out / split)
    reused = sum(bool(r.pop("reused", False)) for r in recs)
    kept_units = sum(r.pop("kept_units", 0) for r in recs)
    for r in recs:
        r.pop("kept_bytes", None)
    names = ["train", "val"] if settings.val_fraction else ["train"]
    _remove_unrecorded(out, names, recs)
    splits: dict[str, dict[str, Any]] = {}
    for n in names:
        parts = [r["splits"][n] for r in recs]
        splits[n] = {"count": sum(p["docs"] for p in parts), "tokens": sum(p["tokens"] for p in parts),
                     "shards": [sh for p in parts for sh in p["shards"]]}
    doc_no = sum(r["documents"] for r in recs)
    if doc_no == 0:
        nothing_stored(out, ["train", "val"], None, [], f"{', '.join(inputs[:3])}: the corpus holds no documents")
    replaced = {k: v for r in recs for k, v in r["replaced"].items()}
    # The tokenizer travels with the pack (its datasets decode with it), written last but for the manifest, atomically:
    # a build that stops before or after leaves an unfinished build that --resume and --overwrite recognise.
    write_attachment(out, TOKENIZER_FILE, tok_bytes)
    seconds = time.perf_counter() - t0
    manifest = {
        "kind": "tokens",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "dataprep_version": __version__,
        "source": {"inputs": [str(Path(p).resolve()) for p in inputs], "replaced_bytes": replaced},
        "settings": asdict(settings),
        "val_rule": val_rule(settings.seed, settings.val_fraction),
        "tokenizer": {"path": str(tok_path.resolve()), "file": TOKENIZER_FILE, "sha256": hashlib.sha256(tok_bytes).hexdigest(),
                      "vocab_size": vocab, "eot_id": int(eot_id), "trained_here": bool(train_bpe_vocab),
                      "special": {t.content: int(i) for i, t in tok.get_added_tokens_decoder().items()}},
        "fields": {"tokens": TokensField(dtype.str, vocab).to_manifest()},
        "splits": splits,
        "build": {"seconds": round(seconds, 3)},
        "attachments": {TOKENIZER_FILE: attachment_record(tok_bytes)},
    }
    write_manifest(out, manifest)
    shutil.rmtree(out / TASK_RECORDS, ignore_errors=True)  # a pack now: what --resume needed is done with
    return {"documents": doc_no, "tokens": sum(sp["tokens"] for sp in splits.values()), "dtype": dtype.str,
            "splits": {n: (sp["count"], sp["tokens"]) for n, sp in splits.items()}, "seconds": seconds, "replaced": replaced,
            "tasks": len(tasks), "reused": reused, "kept_units": kept_units}


def _special_tokens(tok) -> list[str]:
    """The tokenizer's added (special) tokens, by id: the likely end-of-text names an error can suggest."""
    try:
        added = tok.get_added_tokens_decoder()
    except AttributeError:  # an older tokenizers
        return []
    return [t.content for _, t in sorted(added.items())]


def _special_list(names: list[str]) -> str:
    """'; its special tokens: ...' for the no-EOT error, at most 8 named."""
    if not names:
        return "; it has no special tokens"
    return "; its special tokens: " + ", ".join(names[:8]) + (f" (+{len(names) - 8} more)" if len(names) > 8 else "")
