"""Tokenize stage: takes a stream of documents and a tokenizer, gives a pack of kind "tokens": per split,
shards of one token array (uint16 when every id fits, else uint32) plus int64 document offsets.

Documents are read in bounded chunks and encoded with the tokenizer's batch API (which uses every
core), so peak memory does not grow with the corpus. Each document is followed by an end-of-text
id. The split of a document (train or val) comes from a seeded generator over document numbers.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import itertools
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from .. import __version__
from ..build import prepare_output
from ..errors import DataprepError, SourceError
from ..pack.manifest import write_manifest
from ..pack.shard import shard_name, write_shard
from .read import ReadStats, documents

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
    strict: bool = False

    def __post_init__(self):
        if not 0 <= self.val_fraction < 1:
            raise DataprepError("val_fraction must be in [0, 1)")
        if self.chunk_bytes < 1 or self.shard_tokens < 1:
            raise DataprepError("chunk_bytes and shard_tokens must be positive")


def load_tokenizer(path: str):
    """A Hugging Face tokenizer from its JSON file, with padding and truncation switched off."""
    from tokenizers import Tokenizer

    if not os.path.isfile(path):
        raise SourceError(f"{path}: tokenizer file does not exist")
    try:
        tok = Tokenizer.from_file(path)
    except Exception as e:  # tokenizers raises its own exception type for any bad file
        raise SourceError(f"{path}: not a tokenizers JSON file ({e})") from None
    tok.no_padding()
    tok.no_truncation()
    return tok


def train_bpe(docs: Iterable[str], vocab_size: int, out: Path):
    """Train a byte-level BPE (exact round trips: decode(encode(text)) == text) and save it to `out`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(docs, trainer)
    tok.save(str(out))
    return tok


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def _join(encs, eot_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Every encoding's ids, each followed by eot_id, as one int64 array; and each document's length."""
    lens = np.fromiter((len(e.ids) for e in encs), np.int64, len(encs))
    flat = np.fromiter(itertools.chain.from_iterable(e.ids for e in encs), np.int64, int(lens.sum()))
    lengths = lens + 1
    out = np.empty(int(lengths.sum()), np.int64)
    is_eot = np.zeros(len(out), bool)
    is_eot[np.cumsum(lengths) - 1] = True
    out[is_eot] = eot_id
    out[~is_eot] = flat
    return out, lengths


def _chunks(docs: Iterator[str], limit: int) -> Iterator[list[str]]:
    chunk, size = [], 0
    for d in docs:
        chunk.append(d)
        size += len(d)
        if size >= limit:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


class _SplitWriter:
    """Collects one split's documents and writes a shard whenever `shard_tokens` are waiting."""

    def __init__(self, out: Path, name: str, dtype: np.dtype, shard_tokens: int):
        self.dir, self.name, self.dtype, self.limit = out / name, name, dtype, shard_tokens
        self.parts: list[np.ndarray] = []
        self.lengths: list[int] = []
        self.waiting = 0
        self.shards: list[dict[str, Any]] = []
        self.docs = self.tokens = 0

    def add(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Documents already joined: `tokens` of several documents, each `lengths[i]` long (its eot included)."""
        if not len(lengths):
            return
        self.parts.append(tokens.astype(self.dtype))  # held in the stored dtype: 4x less than int64
        self.lengths.extend(lengths.tolist())
        self.waiting += len(tokens)
        if self.waiting >= self.limit:
            self.flush()

    def flush(self) -> None:
        if not self.parts:
            return
        tokens = np.concatenate(self.parts).astype(self.dtype, copy=False)
        offsets = np.zeros(len(self.lengths) + 1, "<i8")
        np.cumsum(self.lengths, out=offsets[1:])
        files = write_shard(self.dir, len(self.shards), {"tokens": tokens, "doc_offsets": offsets}, {"count": len(self.lengths)})
        self.shards.append({"name": shard_name(len(self.shards)), "count": len(self.lengths), "tokens": int(len(tokens)), "files": files})
        self.docs += len(self.lengths)
        self.tokens += len(tokens)
        self.parts, self.lengths, self.waiting = [], [], 0


def tokenize(inputs: list[str], out: str | os.PathLike, settings: TokenizeSettings, tokenizer: str | None = None,
             train_bpe_vocab: int | None = None, overwrite: bool = False,
             progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Tokenize documents from `inputs` into a token pack; return a summary."""
    out = Path(out)
    t0 = time.perf_counter()
    if (tokenizer is None) == (train_bpe_vocab is None):
        raise DataprepError("give a tokenizer file or --train-bpe VOCAB (one of the two)")
    prepare_output(out, overwrite)
    if train_bpe_vocab:
        tok_path = out / "tokenizer.json"
        tok = train_bpe(documents(inputs, settings.split, settings.text_field, settings.strict), train_bpe_vocab, tok_path)
    else:
        tok_path = Path(tokenizer)
        tok = load_tokenizer(str(tok_path))
    vocab = tok.get_vocab_size(with_added_tokens=True)
    eot_id = settings.eot_id
    if eot_id is None:
        names = [settings.eot] if settings.eot else list(EOT_CANDIDATES)
        eot_id = next((tok.token_to_id(n) for n in names if tok.token_to_id(n) is not None), None)
        if eot_id is None:
            raise DataprepError(f"{tok_path}: has none of {names} as a token; choose the end-of-text id with --eot-id")
    dtype = token_dtype(vocab)
    limit = int(np.iinfo(dtype).max)
    writers = {n: _SplitWriter(out, n, dtype, settings.shard_tokens) for n in (["train", "val"] if settings.val_fraction else ["train"])}
    stats = ReadStats()
    doc_no = 0
    for k, chunk in enumerate(_chunks(documents(inputs, settings.split, settings.text_field, settings.strict, stats), settings.chunk_bytes)):
        encs = tok.encode_batch_fast(chunk, add_special_tokens=False)
        tokens, lengths = _join(encs, eot_id)
        del encs  # an Encoding holds offsets and masks per token: let them go before the next chunk
        if len(tokens) and (tokens.max() > limit or tokens.min() < 0):
            raise DataprepError(f"token id {int(tokens.max())} does not fit in {dtype} (vocabulary {vocab})")  # never truncate
        val = np.random.default_rng([settings.seed, k]).random(len(chunk)) < settings.val_fraction
        if val.any():
            in_val = np.repeat(val, lengths)
            writers["val"].add(tokens[in_val], lengths[val])
            writers["train"].add(tokens[~in_val], lengths[~val])
        else:
            writers["train"].add(tokens, lengths)
        doc_no += len(chunk)
        if progress:
            progress(sum(len(d) for d in chunk))
    for w in writers.values():
        w.flush()
    if doc_no == 0:
        raise SourceError(f"{', '.join(inputs[:3])}: the corpus holds no documents")
    tok_bytes = tok_path.read_bytes()
    seconds = time.perf_counter() - t0
    manifest = {
        "kind": "tokens",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "dataprep_version": __version__,
        "source": {"inputs": [str(Path(p).resolve()) for p in inputs], "replaced_bytes": stats.replaced},
        "settings": asdict(settings),
        "tokenizer": {"path": str(tok_path.resolve()), "sha256": hashlib.sha256(tok_bytes).hexdigest(),
                      "vocab_size": vocab, "eot_id": int(eot_id), "trained_here": bool(train_bpe_vocab),
                      "special": {t.content: int(i) for i, t in tok.get_added_tokens_decoder().items()}},
        "fields": {"tokens": {"dtype": dtype.str, "arrays": ["tokens", "doc_offsets"],
                              "meaning": "every document's ids followed by eot_id; doc_offsets index the tokens array of its shard"}},
        "splits": {n: {"count": w.docs, "tokens": w.tokens, "shards": w.shards} for n, w in writers.items()},
        "build": {"seconds": round(seconds, 3)},
    }
    write_manifest(out, manifest)
    return {"documents": doc_no, "tokens": sum(w.tokens for w in writers.values()), "dtype": dtype.str,
            "splits": {n: (w.docs, w.tokens) for n, w in writers.items()}, "seconds": seconds, "replaced": stats.replaced}
