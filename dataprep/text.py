"""Text to token ids, kind-free: takes a Hugging Face tokenizers JSON file (or its text) and strings, gives the
tokenizer as packs encode with it (padding and truncation off), every string's ids as one int64 array plus
each one's length, the smallest id dtype for a vocabulary (uint16, else uint32) and the check that ids fit
it; and a pack's own copy of its tokenizer (`tokenizer.json` beside the manifest), read back checked.

The tokens kind (documents, an end-of-text id after each) and the images kind (captions) both encode through
here, so a caption's ids are exactly what a token pack would hold for the same text."""
from __future__ import annotations

import hashlib
import itertools
import json
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .errors import DataprepError, PackError, SourceError

TOKENIZER_FILE = "tokenizer.json"  # the pack's copy of the tokenizer it was made with, beside the manifest
PAD_TOKENS = ("[PAD]", "<pad>", "<|pad|>", "<|padding|>")  # what a tokenizer without a padding setting may call its pad


def tokenizer_from_json(text: str, where: Path | str, error: type[Exception] = PackError):
    """A `tokenizers.Tokenizer` from its JSON text, with padding and truncation switched off (as packs are
    encoded); `error` (naming `where`) when the text is not a tokenizer."""
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_str(text)
    except Exception as e:  # tokenizers raises its own exception type for any bad file
        raise error(f"{where}: not a tokenizers JSON file ({e})") from None
    tok.no_padding()
    tok.no_truncation()
    return tok


def tokenizer_file(path: str | os.PathLike):
    """A tokenizer JSON file's bytes (what a pack copies) and the tokenizer they give, from one read."""
    if not os.path.isfile(path):
        raise SourceError(f"{path}: tokenizer file does not exist")
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise SourceError(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SourceError(f"{path}: not a tokenizers JSON file (not UTF-8)") from None
    return data, tokenizer_from_json(text, path, SourceError)


def pad_id(text: str, tok) -> int | None:
    """The tokenizer's pad id: its padding setting's `pad_id` (read from the JSON text: a loaded tokenizer has
    padding switched off), else the id of a pad token it knows (PAD_TOKENS); None when it has neither."""
    try:
        padding = json.loads(text).get("padding")
    except (ValueError, AttributeError):
        padding = None
    if isinstance(padding, dict) and isinstance(padding.get("pad_id"), int):
        return int(padding["pad_id"])
    return next((tok.token_to_id(t) for t in PAD_TOKENS if tok.token_to_id(t) is not None), None)


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def check_ids(tokens: np.ndarray, limit: int, dtype: np.dtype, where: str) -> None:
    """Every id in [0, limit], else a DataprepError naming `where` (ids are never truncated to the dtype)."""
    if len(tokens) and (tokens.max() > limit or tokens.min() < 0):
        raise DataprepError(f"{where}: token id {int(tokens.max())} does not fit in {dtype} (vocabulary {limit + 1})")  # never truncate


def join_ids(encs: Sequence[Any], end_id: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Every encoding's ids, each followed by `end_id` when given, as one int64 array; and each one's length
    (its end id included)."""
    lens = np.fromiter((len(e.ids) for e in encs), np.int64, len(encs))
    flat = np.fromiter(itertools.chain.from_iterable(e.ids for e in encs), np.int64, int(lens.sum()))
    if end_id is None:
        return flat, lens
    lengths = lens + 1
    out = np.empty(int(lengths.sum()), np.int64)
    is_eot = np.zeros(len(out), bool)
    is_eot[np.cumsum(lengths) - 1] = True
    out[is_eot] = end_id
    out[~is_eot] = flat
    return out, lengths


def encode(tok, texts: list[str], end_id: int | None = None, special_tokens: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """`texts` encoded with the tokenizer's batch API (every core), joined by `join_ids`; `special_tokens`:
    with what the tokenizer's post-processor adds around a sequence ([CLS] ... [SEP]), as `Tokenizer.encode`
    gives by default. The encodings (about 100 bytes a token) are let go before this returns."""
    encs = tok.encode_batch_fast(texts, add_special_tokens=special_tokens)
    return join_ids(encs, end_id)


def read_tokenizer(pack: Path, m: dict[str, Any], name: str | None):
    """The tokenizer a pack was made with, from the pack's own copy `name` (any backend), checked against the
    manifest's sha256 (`m["tokenizer"]`); a PackError when the copy is missing or changed (`name` None: the pack
    predates copies)."""
    from .pack.backends import open_reader

    tok = m.get("tokenizer") or {}
    if name is None:
        raise PackError(f"{pack}: the pack predates the tokenizer copy: it records only the tokenizer's path "
                        f"{tok.get('path')!r} (sha256 {str(tok.get('sha256'))[:12]}...); load that file with "
                        "tokenizers.Tokenizer.from_file, or tokenize again to carry a copy in the pack")
    reader = open_reader(pack)
    try:
        data = reader.attachments().get(name)
    finally:
        reader.close()
    where = Path(pack) / name
    if data is None:
        raise PackError(f"{where}: missing; the pack's copy of its tokenizer is gone")
    digest = hashlib.sha256(data).hexdigest()
    if digest != tok.get("sha256"):
        raise PackError(f"{where}: checksum mismatch (sha256 {digest[:12]}..., manifest {str(tok.get('sha256'))[:12]}...)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise PackError(f"{where}: not UTF-8 JSON") from None
    return tokenizer_from_json(text, where)
