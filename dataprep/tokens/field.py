"""The tokens field: every document's token ids (uint16 or uint32, an end-of-text id after each) as one array
per shard plus int64 document offsets into it; how it is written, described and loaded."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import PackError
from ..pack.arrays import LoadContext, load_blob
from ..pack.fields import Field, IdsField
from ..text import TOKENIZER_FILE, tokenizer_from_json  # noqa: F401 (re-exported)
from ..text import read_tokenizer as _read_tokenizer


@dataclass(frozen=True)
class TokensField(IdsField):
    dtype: str  # "<u2" or "<u4"
    vocab_size: int = 0  # every stored id is below it (checked on load)
    tokens: str = "tokens"
    offsets: str = "doc_offsets"

    def to_manifest(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "arrays": [self.tokens, self.offsets],
                "meaning": "every document's ids followed by eot_id; doc_offsets index the tokens array of its shard"}

    @classmethod
    def from_manifest(cls, m: dict[str, Any], where: Path | str) -> "TokensField":
        try:
            spec = m["fields"]["tokens"]
            dtype = np.dtype(spec["dtype"]).str
            tokens, offsets = (str(a) for a in spec.get("arrays", ["tokens", "doc_offsets"]))
            vocab = int(m["tokenizer"]["vocab_size"])
        except (KeyError, TypeError, ValueError) as e:
            raise PackError(f"{where}: malformed tokens field description ({e})") from None
        if dtype not in ("<u2", "<u4"):
            raise PackError(f"{where}: token ids stored as {dtype}, not uint16 or uint32")
        return cls(dtype, vocab, tokens, offsets)

    def load(self, split_dir: Path, shards: list[dict], ctx: LoadContext | None = None) -> dict[str, Any]:
        """The split's tokens as one array (mapped with cache="mmap" when the split is one shard, whose file
        is then that array) and the document offsets into it."""
        ctx = ctx or LoadContext()
        tokens, offsets = load_blob(split_dir, shards, self.tokens, self.offsets, ctx,
                                    map_data=ctx.mapped and len(shards) == 1, dtype=self.np_dtype)
        if hasattr(tokens, "parts"):
            tokens = tokens.parts[0]
        return {self.tokens: tokens, self.offsets: offsets}

    def check(self, arrays: dict[str, Any], deep: bool = False) -> list[str]:
        out = []
        if np.any(np.diff(arrays[self.offsets]) <= 0):
            out.append(f"{self.offsets}.npy: a document holds no token (each ends with the end-of-text id)")
        return out + super().check(arrays, deep)  # and every id within the vocabulary

    def describe(self) -> str:
        return f"token ids, {self.np_dtype.name}, vocabulary {self.vocab_size:,}"


def fields_of(m: dict[str, Any], where: Path | str = "manifest") -> dict[str, Field]:
    return {"tokens": TokensField.from_manifest(m, where)}



def served_fields(m: dict[str, Any], resolution: int | None = None, where: Path | str = "manifest") -> dict[str, Field]:
    """What a dataset holds: every field (one resolution only)."""
    return fields_of(m, where)


def tokenizer_file(m: dict[str, Any]) -> str | None:
    """The name of the pack's copy of its tokenizer; packs made before the copy hold one only when the
    tokenizer was trained for them (None otherwise)."""
    tok = m.get("tokenizer") or {}
    return tok.get("file") or (TOKENIZER_FILE if tok.get("trained_here") else None)


def read_tokenizer(pack: Path, m: dict[str, Any]):
    """The tokenizer a token pack was made with, from the pack's own copy (any backend), checked against the
    manifest's sha256; a PackError when the pack predates the copy or the copy is missing or changed."""
    return _read_tokenizer(pack, m, tokenizer_file(m))


def summary(m: dict[str, Any]) -> list[str]:
    tok = m["tokenizer"]
    return [f"tokens:    {np.dtype(m['fields']['tokens']['dtype']).name}, vocabulary {tok['vocab_size']:,}, end-of-text id {tok['eot_id']}"]



def document_lengths(reader, split: str) -> np.ndarray:
    """Each document's tokens, its end-of-text id included, in a split: from the document offsets alone,
    shard by shard (no token is read), through any backend's reader.

    Args:
        reader: The pack's reader (pack/backends' `open_reader`).
        split: The split's name.

    Returns:
        (documents,) int64, each >= 1.
    """
    field = TokensField.from_manifest(reader.manifest, reader.root)
    parts = []
    for k, shard in enumerate(reader.manifest["splits"][split]["shards"]):
        lengths = np.diff(np.asarray(reader.shard_array(split, k, field.offsets), np.int64))
        if len(lengths) != int(shard["count"]) or (len(lengths) and int(lengths.min()) < 1):
            raise PackError(f"{reader.root}: {split}/{shard['name']}/{field.offsets}.npy: not {shard['count']} documents "
                            "of at least one token each (run dataprep verify)")
        parts.append(lengths)
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def packed_rows(pack: str | Path, m: dict[str, Any], context: int, strategy: str) -> dict[str, dict[str, Any]]:
    """What packing each split's documents into rows of `context` tokens gives (`dataprep info --context`):
    the plan `PackedDocuments` serves, made of seed 0's epoch 0. Rows and padding are the same in every
    epoch; the documents concat cuts vary a little with the epoch's order, the fits' do not.

    Args:
        pack: A local token pack (any backend).
        m: Its manifest.
        context: Tokens a row (>= 2).
        strategy: A packing strategy (tokens/packing.py's `STRATEGIES`).

    Returns:
        split -> documents, rows, tokens (in rows: a cut's overlapping token counts twice), padding (tokens),
        padding_share, documents_cut.
    """
    from ..pack.backends import open_reader
    from .packing import Packing

    reader = open_reader(pack)
    try:
        out = {}
        for split in m["splits"]:
            lengths = document_lengths(reader, split)
            plan = Packing(lengths, context, strategy).plan(0, 0)
            out[split] = {"documents": len(lengths), "rows": plan.rows, "tokens": plan.tokens, "padding": plan.padding,
                          "padding_share": plan.padding_share, "documents_cut": plan.documents_cut}
        return out
    finally:
        reader.close()
