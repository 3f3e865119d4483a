"""Which documents are val: takes a document's text (whole, or piece by piece), a seed and a val fraction,
gives whether the document is in the val split (`in_val`, `_ValDraw`) and the manifest's record of the rule
(`val_rule`). A pure function of the text: chunk and task sizes, workers, engines and the order of the
inputs never change which documents are val. tokens/tokenize.py draws every document's split through it.
"""
from __future__ import annotations

import hashlib
from typing import Any

# Which documents are val. The identity of a document is its text, not where it sits (file, ordinal, chunk,
# task): the draw then cannot move with --chunk-mb, --task-mb, the workers, the engine, the order or the names
# of the input files, their format, or the tokenizer. Every copy of a repeated text lands in the same split,
# so val never holds a document train also holds; the price is that a text repeated n times is one draw for
# n documents (a text's occurrence number would spread copies over both splits, and needs a count across
# every earlier task). The draw is counter-based: no generator state runs from one document to the next.
VAL_RULE = "blake2b-text"


def val_rule(seed: int, fraction: float) -> dict[str, Any]:
    """The manifest's record of how `in_val` chose the val documents."""
    return {"name": VAL_RULE, "seed": int(seed), "fraction": float(fraction),
            "rule": "a document is val when the first 8 bytes of blake2b(digest_size=8) over 'dataprep-val', NUL, "
                    "the seed in decimal, NUL and the document's UTF-8 text, read as a little-endian integer, are "
                    "below fraction * 2**64"}


class _ValDraw:
    """`in_val` for one seed and fraction, a document's text given whole or piece by piece."""

    def __init__(self, seed: int, fraction: float):
        self.base = hashlib.blake2b(f"dataprep-val\0{int(seed)}\0".encode(), digest_size=8)
        self.bound = int(fraction * 2.0**64)

    def start(self) -> Any:
        return self.base.copy()

    def of(self, h) -> bool:
        return int.from_bytes(h.digest(), "little") < self.bound

    def text(self, text: str) -> bool:
        h = self.base.copy()
        h.update(text.encode("utf-8", "surrogatepass"))  # json may give lone surrogates
        return self.of(h)


def in_val(text: str, seed: int, fraction: float) -> bool:
    """Whether a document of this text is in the val split of a pack tokenized with `seed` and val `fraction`.

    Args:
        text: the document's whole text, as the reader gives it.
        seed: the pack's seed (`--seed`).
        fraction: the pack's val fraction (`--val-fraction`).

    Returns:
        True for val, False for train.
    """
    return _ValDraw(seed, fraction).text(text)
