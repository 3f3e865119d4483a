"""Counter-based randomness: takes a key (seed, epoch, stream, ...) and sample indices, gives each
index its own draw, the same in whichever process, worker or batch asks for it.

A training run that is stopped and resumed, or served by 0, 1 or 8 workers, must draw the same window
start, crop box and flip for sample i of epoch e. A stateful generator cannot promise that (its output
depends on how many draws came before); a hash of (key, i) can. The hash is SplitMix64's finaliser
chained over the key's words, vectorised in numpy.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

_G, _K1, _K2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB  # SplitMix64's constants
_GOLDEN, _M1, _M2 = np.uint64(_G), np.uint64(_K1), np.uint64(_K2)
_MASK, _START = (1 << 64) - 1, 0x243F6A8885A308D3  # 64 bits; the chain's first value


# Every consumer of draws leads its key with its own tag, so no two streams ever share bits (a mixture's
# shuffle of member 0 must not be the crop's area draw of the same sample, for instance).
CROP, FLIP, MIXTURE, TOKENS, PAD, CLIP = 0xC209, 0xF119, 0x3A7E, 0x70C5, 0x9AD0, 0xC11B


def _mix(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def _chain(h: int, words) -> int:
    """`h` chained through the finaliser with each word: `_mix` in Python's integers, wrapped to 64 bits."""
    for word in words:
        x = h ^ (((int(word) & _MASK) + _G) & _MASK)
        x ^= x >> 30
        x = x * _K1 & _MASK
        x ^= x >> 27
        x = x * _K2 & _MASK
        h = x ^ (x >> 31)
    return h


@lru_cache(maxsize=4096)
def key_hash(key: tuple[int, ...]) -> np.uint64:
    """The 64-bit hash of a key (its words chained through the finaliser), what `bits` starts from; done
    in Python's integers, which are cheaper here than numpy's scalars, and cached, as it is paid per new key."""
    return np.uint64(_chain(_START, key))


def key_hashes(prefix: tuple[int, ...], last) -> np.ndarray:
    """`key_hash((*prefix, w))` for each word w of `last`, the prefix chained once (a crop plan's 40 streams
    a seed and epoch share it)."""
    h = _chain(_START, prefix)
    return np.array([_chain(h, (w,)) for w in last], np.uint64)


def bits(key: tuple[int, ...], idx) -> np.ndarray:
    """64 random bits per index, a pure function of (key, index)."""
    return hashed_bits(key_hash(tuple(int(k) for k in key)), idx)


def hashed_bits(h, idx) -> np.ndarray:
    """`bits` from key hashes: one hash for all indices, one per index, or a grid (hashes of shape
    (..., 1) against indices (n,) give (..., n): every key's bits of every index, in one pass)."""
    idx = np.asarray(idx, np.int64)
    flat = idx.reshape(-1).astype(np.uint64)  # array arithmetic wraps silently (scalar arithmetic would warn)
    got = _mix(h ^ (flat * _GOLDEN + _GOLDEN))
    return got.reshape(idx.shape) if got.shape == flat.shape else got


def uniform(key: tuple[int, ...], idx) -> np.ndarray:
    """Floats in [0, 1), 53 bits each."""
    return to_uniform(bits(key, idx))


def to_uniform(b: np.ndarray) -> np.ndarray:
    return (b >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def integers(key: tuple[int, ...], idx, high: int | np.ndarray) -> np.ndarray:
    """Integers in [0, high) (high may differ per index), by the multiply-shift reduction."""
    return to_integers(bits(key, idx), high)


def to_integers(b: np.ndarray, high: int | np.ndarray) -> np.ndarray:
    return np.minimum((to_uniform(b) * np.asarray(high, np.float64)).astype(np.int64), np.asarray(high, np.int64) - 1)


def permuted(n: int, key: tuple[int, ...], k) -> np.ndarray:
    """Position k of a pseudo-random permutation of range(n), without building it: a 4-round Feistel
    network over the smallest even number of bits that covers n, walking cycles until the value falls
    below n (expected fewer than 4 steps). O(1) memory, however large n is."""
    k = np.asarray(k, np.int64)
    if n <= 1:
        return np.zeros_like(k)
    half = max(1, ((int(n - 1).bit_length()) + 1) // 2)
    mask = np.uint64((1 << half) - 1)
    x = k.astype(np.uint64)
    todo = np.ones(x.shape, bool)
    while todo.any():
        left, right = x[todo] >> np.uint64(half), x[todo] & mask
        for r in range(4):
            left, right = right, left ^ (bits((*key, r), right.astype(np.int64)) & mask)
        y = (left << np.uint64(half)) | right
        x[todo] = y
        todo[todo] = y >= np.uint64(n)
    return x.astype(np.int64)
