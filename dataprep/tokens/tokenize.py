"""Tokenize stage: takes a stream of documents and a tokenizer, gives a pack of kind "tokens": per split,
shards of one token array (uint16 when every id fits, else uint32) plus int64 document offsets.

One task per group of consecutive input files of about `task_bytes` (on the local engine, or a Dask
cluster): its documents are read in bounded
chunks and encoded with the tokenizer's batch API (which uses every core), so peak memory does not
grow with the corpus, and written as that file's shards. Each document is followed by an end-of-text
id. The split of a document (train or val) comes from a generator seeded by the seed, the file's
task's number and the chunk's, so every engine and every order of tasks gives the same pack.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shlex
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from .. import __version__
from ..driver import TASK_RECORDS, prepare_output, remove_entry, task_fingerprint
from ..errors import DataprepError, SourceError
from ..pack.manifest import attachment_record, write_attachment, write_manifest
from ..pack.shard import remove_temporaries, reusable_shard, write_shard
from ..safe_paths import open_nofollow
from ..text import check_ids as _check_ids  # noqa: F401 (token_dtype re-exported)
from ..text import encode, token_dtype
from ..text import tokenizer_file as _tokenizer_file
from .field import TOKENIZER_FILE, TokensField, tokenizer_from_json
from .read import PIECE_CHARS, ReadStats, documents, pieces

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

    def __post_init__(self):
        if not 0 <= self.val_fraction < 1:
            raise DataprepError("val_fraction must be in [0, 1)")
        if self.chunk_bytes < 1 or self.shard_tokens < 1 or self.task_bytes < 1:
            raise DataprepError("chunk_bytes, shard_tokens and task_bytes must be positive")


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
    its split (train or val) is drawn for its first piece."""

    def __init__(self) -> None:
        self.parts: list[np.ndarray] = []
        self.val = False

    @property
    def empty(self) -> bool:
        return not self.parts

    def add(self, ids: np.ndarray, val: bool) -> None:
        if not self.parts:
            self.val = val
        self.parts.append(ids)

    def finish(self, eot_id: int, dtype: np.dtype) -> tuple[np.ndarray, bool]:
        tokens = np.concatenate([*self.parts, np.array([eot_id], dtype)])
        val, self.parts = self.val, []
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
        tokenizer, the end-of-text id, the dtype and the settings."""
        head = ["tokens", self.task_no, hashlib.sha256(self.tokenizer_json.encode("utf-8")).hexdigest(), self.eot_id,
                self.dtype, asdict(self.settings)]
        return task_fingerprint(head, (_stamp(p) for p in self.paths))


def _stamp(path: str) -> tuple:
    try:
        st = os.stat(path)
        return os.path.abspath(path), st.st_size, st.st_mtime_ns
    except OSError:
        return os.path.abspath(path), -1, -1


def _task_record(out: Path, task_no: int) -> Path:
    return out / TASK_RECORDS / f"{task_no:05d}.json"


def _finished(task: FileTask, fp: str) -> dict[str, Any] | None:
    """The record an earlier run left of this task when it finished it with the same fingerprint and every one of
    its shards is still intact by checksum; else None."""
    out = Path(task.out)
    try:
        with os.fdopen(open_nofollow(_task_record(out, task.task_no)), encoding="utf-8") as f:
            rec = json.load(f)
        if rec.get("fingerprint") != fp:
            return None
        rec = rec["record"]
        for n, sp in rec["splits"].items():
            for sh in sp["shards"]:
                got = reusable_shard(out / n, sh["name"], fp)
                if got is None or got.get("files") != sh["files"]:
                    return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return rec


def _drop_shards_of(out: Path, task_no: int) -> None:
    """An unfinished (or stale) run's shards of this task: its shards are named after its number (TTTTTPPPP)."""
    prefix = f"{task_no:05d}"
    for n in ("train", "val"):
        d = out / n
        if d.is_dir() and not d.is_symlink():
            for p in d.iterdir():
                if len(p.name) == 9 and p.name.isdigit() and p.name.startswith(prefix):
                    remove_entry(p)


def tokenize_file(task: FileTask) -> dict[str, Any]:
    """Tokenize the task's documents into its shards (with `resume`, keep them when an earlier run finished the
    task with the same inputs and settings); return their records and the statistics, `reused` saying which."""
    fp = task.fingerprint()
    out = Path(task.out)
    if task.resume:
        rec = _finished(task, fp)
        if rec is not None:
            return {**rec, "reused": True}
        _drop_shards_of(out, task.task_no)
    rec = _tokenize(task, fp)
    record = _task_record(out, task.task_no)
    record.parent.mkdir(mode=0o755, exist_ok=True)
    write_attachment(record.parent, record.name, json.dumps({"fingerprint": fp, "record": rec}).encode("utf-8"))
    return {**rec, "reused": False}


def _tokenize(task: FileTask, fp: str) -> dict[str, Any]:
    tok = tokenizer_from_json(task.tokenizer_json, task.paths[0])
    s, dtype = task.settings, np.dtype(task.dtype)
    limit = int(np.iinfo(dtype).max)
    names = ["train", "val"] if s.val_fraction else ["train"]
    writers = {n: _SplitWriter(Path(task.out), n, dtype, s.shard_tokens, task.task_no, fp) for n in names}
    stats = ReadStats()
    pending = _LongDocument()
    stream = pieces(list(task.paths), s.split, s.text_field, s.strict, stats, min(PIECE_CHARS, s.chunk_bytes))
    for k, chunk in enumerate(_chunks(stream, s.chunk_bytes)):
        val = np.random.default_rng([s.seed, task.task_no, k]).random(len(chunk)) < s.val_fraction
        if pending.empty and all(last for _, last in chunk):  # whole documents only: one vectorised join
            tokens, lengths = encode(tok, [text for text, _ in chunk], task.eot_id)  # its Encodings already let go
            _check_ids(tokens, limit, dtype, task.paths[0])
            if val.any():
                in_val = np.repeat(val, lengths)
                writers["val"].add(tokens[in_val], lengths[val])
                writers["train"].add(tokens[~in_val], lengths[~val])
            else:
                writers["train"].add(tokens, lengths)
            continue
        # A long document's pieces, a few at a time (an Encoding costs ~100 bytes per token): joined, with
        # one end-of-text id after the last.
        for a, b in _batches([len(text) for text, _ in chunk], LONG_BATCH_CHARS):
            encs = tok.encode_batch_fast([text for text, _ in chunk[a:b]], add_special_tokens=False)
            for enc, (_, last), v in zip(encs, chunk[a:b], val[a:b]):
                ids = np.asarray(enc.ids, np.int64)
                _check_ids(ids, limit, dtype, task.paths[0])
                pending.add(ids.astype(dtype), bool(v))
                if last:
                    tokens, in_val = pending.finish(task.eot_id, dtype)
                    writers["val" if in_val else "train"].add(tokens, np.array([len(tokens)], np.int64))
            del encs
    for w in writers.values():
        w.flush()
    return {"splits": {n: {"docs": w.docs, "tokens": w.tokens, "shards": w.shards} for n, w in writers.items()},
            "documents": stats.documents, "replaced": stats.replaced, "bytes": sum(os.path.getsize(p) for p in task.paths)}


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
    """Tokenize documents from `inputs` (files) into a token pack, one task per file on `engine` (default:
    this process); return a summary. `progress(n)` is told of n more bytes of input (those of tasks a resumed
    run kept go to `progress.kept(n)` where it has one). `resume` continues an unfinished run in `out`: the tasks
    it finished with the same inputs and settings, shards intact by checksum, are kept (summary's `reused`)."""
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
            (kept if rec.get("reused") else progress)(rec["bytes"])

    try:
        recs = (engine or LocalEngine(1)).map(tokenize_file, tasks, done, names=[os.path.basename(t.paths[0]) for t in tasks])
    finally:
        for split in ("train", "val"):
            remove_temporaries(out / split)
    reused = sum(bool(r.pop("reused", False)) for r in recs)
    names = ["train", "val"] if settings.val_fraction else ["train"]
    _remove_unrecorded(out, names, recs)
    splits: dict[str, dict[str, Any]] = {}
    for n in names:
        parts = [r["splits"][n] for r in recs]
        splits[n] = {"count": sum(p["docs"] for p in parts), "tokens": sum(p["tokens"] for p in parts),
                     "shards": [sh for p in parts for sh in p["shards"]]}
    doc_no = sum(r["documents"] for r in recs)
    if doc_no == 0:
        raise SourceError(f"{', '.join(inputs[:3])}: the corpus holds no documents")
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
            "tasks": len(tasks), "reused": reused}


def _remove_unrecorded(out: Path, names: list[str], recs: list[dict]) -> None:
    """After the tasks: drop shards and splits an earlier (resumed) run left that this run's records do not have."""
    recorded = {(n, sh["name"]) for r in recs for n, sp in r["splits"].items() for sh in sp["shards"]}
    for n in ("train", "val"):
        d = out / n
        if d.is_symlink() or not d.is_dir():
            continue
        if n not in names:
            remove_entry(d)
            continue
        for p in d.iterdir():
            if (n, p.name) not in recorded:
                remove_entry(p)


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
