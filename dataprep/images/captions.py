"""Captions stage: takes a split's captions, gives their token ids. At build time `CaptionTokenizer` encodes
a shard's captions through dataprep/text.py (what token packs use) into ids plus offsets (field
caption_tokens); at serving time `fill_caption_ids` writes a batch's ids, cut or padded to a fixed length,
and their lengths into the Loader's buffers.
"""
from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..text import TOKENIZER_FILE, check_ids, encode, pad_id, token_dtype, tokenizer_file, tokenizer_from_json
from .field import CaptionTokensField


@dataclass(frozen=True)
class CaptionTokenizer:
    """How a shard encodes its captions (--tokenize), through the tokens kind's code (dataprep/text.py): the
    tokenizer's JSON text (so workers on other machines need no copy of the file), its sha256, the id dtype,
    and whether the post-processor's special tokens are added (as `Tokenizer.encode` does by default)."""

    json: str = field(repr=False)
    sha256: str
    dtype: str
    pad_id: int = 0
    special_tokens: bool = True

    @property
    def tokens_field(self) -> CaptionTokensField:
        return CaptionTokensField(self.dtype, pad_id=self.pad_id, special_tokens=self.special_tokens)

    def encode(self, captions: list[str], where: str) -> tuple[np.ndarray, np.ndarray]:
        """The captions' ids (int64) and each one's length; a DataprepError when an id does not fit the dtype."""
        ids, lengths = encode(_tokenizer(self.json), captions, None, self.special_tokens)
        dtype = np.dtype(self.dtype)
        check_ids(ids, int(np.iinfo(dtype).max), dtype, where)
        return ids, lengths


@functools.lru_cache(maxsize=2)
def _tokenizer(text: str):
    """The tokenizer of a JSON text, parsed once per process (a worker makes many shards)."""
    return tokenizer_from_json(text, "the build's tokenizer")


def caption_tokenizer(path: str | os.PathLike) -> tuple[CaptionTokenizer, bytes, dict[str, Any]]:
    """The tokenizer file at `path` as shards use it, its bytes (the pack's copy) and the manifest's record
    of it. The pad id is the tokenizer's own (its padding setting, else a pad token it knows), else 0."""
    data, tok = tokenizer_file(path)
    text = data.decode("utf-8")
    vocab = tok.get_vocab_size(with_added_tokens=True)
    dtype = token_dtype(vocab)
    own = pad_id(text, tok)
    pad = 0 if own is None else own
    check_ids(np.array([pad]), int(np.iinfo(dtype).max), dtype, f"{path}: its pad id")
    digest = hashlib.sha256(data).hexdigest()
    record = {"path": str(Path(path).resolve()), "file": TOKENIZER_FILE, "sha256": digest, "vocab_size": vocab,
              "pad_id": int(pad), "pad_from": "the tokenizer" if own is not None else "0: the tokenizer has no pad",
              "special": {t.content: int(i) for i, t in tok.get_added_tokens_decoder().items()}}
    return CaptionTokenizer(text, digest, dtype.str, int(pad)), data, record


def fill_caption_ids(ids_all: np.ndarray, offsets: np.ndarray, idx: np.ndarray, pad: int, ids: np.ndarray,
                     lengths: np.ndarray) -> None:
    """Captions `idx` (runs of `ids_all` between `offsets`) as token ids into the (n, L) rows `ids`, the first L
    of each and `pad` after the last, and each one's length capped at L into `lengths`: one gather for the batch."""
    starts = offsets[idx]
    take = np.minimum(offsets[idx + 1] - starts, ids.shape[1])
    inside = np.arange(ids.shape[1]) < take[:, None]  # (n, L): which places hold a caption's id
    ids[:] = pad
    ids[inside] = ids_all[(starts[:, None] + np.arange(ids.shape[1]))[inside]]
    lengths[:] = take
