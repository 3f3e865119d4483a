"""The audit's input: takes each split's hashes, sources, and optionally pixel digests and flipped hashes,
gives them checked and joined into one `Samples` (split code, index in the split, source, hash, digest,
flipped hash per sample), or a UsageError naming the split and what is wrong with it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import UsageError
from .hashes import DIGEST_BYTES, as_hashes


@dataclass(frozen=True)
class Samples:
    """Every sample audited, in one order: its split (a code into `splits`), index in the split, source,
    hash, flipped hash (for flips) and pixel digest ((N, 16) uint8; None when the pack has none)."""

    splits: tuple[str, ...]
    split: np.ndarray
    index: np.ndarray
    source: Sequence[str]
    hashes: np.ndarray
    digests: np.ndarray | None = None
    flipped: np.ndarray | None = None

    @classmethod
    def from_splits(cls, parts: Mapping[str, Mapping[str, Any]]) -> Samples:
        """From {split: {"hashes": ..., "sources": ..., "digests": ..., "flipped": ...}} (digests and flipped
        optional, but given for every split or none); the splits keep the mapping's order. Hashes and
        flipped hashes are one unsigned integer a sample (hashes.as_hashes: floats, negatives, booleans,
        strings and 2-D arrays are refused, not cast), digests 16 bytes a sample, sources one a sample:
        anything else is a UsageError naming the split."""
        names = tuple(parts)
        if len(names) > 63:
            raise UsageError(f"at most 63 splits can be audited together, got {len(names)}")
        hs, sp, ix, src, dg, fl = [], [], [], [], [], []
        for k, name in enumerate(names):
            p = parts[name]
            h = as_hashes(p["hashes"], f"split {name!r}: hashes")
            given = p.get("sources")
            s = list(given) if given is not None and len(given) else [""] * len(h)
            if len(s) != len(h):
                raise UsageError(f"split {name!r}: {len(h)} hashes but {len(s)} sources")
            hs.append(h)
            sp.append(np.full(len(h), k, np.int64))
            ix.append(np.arange(len(h), dtype=np.int64))
            src += s
            dg.append(None if p.get("digests") is None else _digests(p["digests"], len(h), name))
            f = None if p.get("flipped") is None else as_hashes(p["flipped"], f"split {name!r}: flipped hashes")
            if f is not None and len(f) != len(h):
                raise UsageError(f"split {name!r}: {len(h)} hashes but {len(f)} flipped hashes")
            fl.append(f)
        for what, xs in (("digests", dg), ("flipped", fl)):
            if any(x is None for x in xs) and not all(x is None for x in xs):
                raise UsageError(f"{what} are given for some splits and not others")
        cat = (lambda xs, dt, *shape: np.concatenate(xs) if xs else np.zeros((0, *shape), dt))
        return cls(names, cat(sp, np.int64), cat(ix, np.int64), src, cat(hs, np.uint64),
                   None if not dg or dg[0] is None else cat(dg, np.uint8, 16),
                   None if not fl or fl[0] is None else cat(fl, np.uint64))

    def __len__(self) -> int:
        return len(self.hashes)

    def label(self, k: int) -> dict[str, Any]:
        return {"split": self.splits[int(self.split[k])], "index": int(self.index[k]), "source": str(self.source[k])}


def _digests(values, n: int, name: str) -> np.ndarray:
    """A split's pixel digests as (n, 16) uint8, or a UsageError naming the split: bytes (0..255), 16 a sample."""
    a = np.asarray(values)
    if a.dtype == np.bool_ or not np.issubdtype(a.dtype, np.integer) or (a.size and (a.min() < 0 or a.max() > 255)):
        raise UsageError(f"split {name!r}: digests must be bytes (uint8), got {a.dtype}" + (" values past 0..255" if a.dtype.kind in "iu" else ""))
    if a.size != n * DIGEST_BYTES or (a.ndim == 2 and a.shape[1] != DIGEST_BYTES) or a.ndim > 2:
        raise UsageError(f"split {name!r}: digests must be {DIGEST_BYTES} bytes for each of its {n} samples, got shape {a.shape}")
    return a.astype(np.uint8).reshape(n, DIGEST_BYTES)
