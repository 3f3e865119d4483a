"""Image fingerprints: takes decoded pixels (HW or HWC, C = 1, 3 or 4, RGB order, any integer dtype),
gives a 64-bit perceptual hash (near copies land a few bits apart) and an exact digest of the pixels
(equal only for identical images); hashes given back by a caller or a pack are checked (`as_hashes`).

The hash (`HASH_NAME`) is a windowed pHash: a 32x32 grayscale copy, its mean taken away, weighted by a
sine window that falls to zero at the borders, then the 8x8 lowest frequencies of its DCT, each bit
saying whether a coefficient is above their median. The low frequencies keep the coarse layout of the
picture and drop what recompression and rescaling change; the window is there for crops: what a crop
cuts off and what its zoom moves most lie at the borders, where the window gives them no weight (a
plain pHash finds about half of the 4 % crops at the distance where this one finds nearly all; the
figures are in docs/audit.md). Brightness and contrast scale every coefficient alike, so the comparison
with the median is unmoved until pixels clip. Exactly half the bits are set (ties aside), so distances
between hashes are even. The window is symmetric, so a horizontal mirror only negates the odd horizontal
frequencies: `flipped_hash` comes from the same 8x8 block.

Bit k of a hash is coefficient (k // 8, k % 8) of the block, row-major. A blank image (every pixel
equal) hashes to 0 whatever its colour: blank images pair with each other, and the pixel digest says
whether they are the same blank.
"""
from __future__ import annotations

import hashlib
from typing import Iterable

import numpy as np

from ..errors import UsageError

HASH_NAME = "dct-sine-8x8"  # recorded beside stored hashes: a pack hashed otherwise is hashed again
HASH_BITS = 64
GRID = 32  # side of the grayscale copy the DCT is taken from
PRE = 64  # the copy is made in two steps: bilinear to PRE x PRE, then 2x2 area averages
LOW = 8  # side of the block of low frequencies kept: LOW * LOW = HASH_BITS
DIGEST_BYTES = 16
DIGEST_NAME = "sha256-128"  # pixel_digest: what a pack's digest field holds, of each sample as stored
_x = (np.arange(GRID) + 0.5) / GRID
WINDOW = np.outer(np.sin(np.pi * _x), np.sin(np.pi * _x)).astype(np.float32)
# a horizontal mirror of the (symmetric) windowed grid negates every coefficient of odd horizontal frequency
_FLIP_SIGNS = np.where(np.arange(LOW) % 2 == 1, -1.0, 1.0).astype(np.float32)


def _small_gray(pixels: np.ndarray) -> np.ndarray:
    """The image as a GRID x GRID float32 grayscale copy. The bilinear step touches only the pixels it
    samples, which is what keeps the hash cheap on a full-size image; the 2x2 average after it is the
    antialiasing that the measurements needed. An image smaller than the grid is enlarged."""
    import cv2

    a = np.asarray(pixels)
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[:, :, 0]
    if not (a.ndim == 2 or (a.ndim == 3 and a.shape[2] in (3, 4))):
        raise ValueError(f"cannot hash an image of shape {a.shape}: expected HW or HWC with 1, 3 or 4 channels")
    if a.shape[0] == 0 or a.shape[1] == 0:
        raise ValueError(f"cannot hash an empty image of shape {a.shape}")
    if a.dtype == np.bool_ or not (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)):
        raise ValueError(f"cannot hash pixels of dtype {a.dtype}")
    if a.dtype not in (np.uint8, np.uint16, np.float32):
        a = a.astype(np.float32)
    if a.ndim == 3:
        a = a[:, :, :3]
    s = cv2.resize(np.ascontiguousarray(a), (PRE, PRE), interpolation=cv2.INTER_LINEAR)
    s = cv2.resize(s, (GRID, GRID), interpolation=cv2.INTER_AREA)
    if s.ndim == 3:
        s = cv2.cvtColor(s, cv2.COLOR_RGB2GRAY)  # the same luma weights (0.299, 0.587, 0.114) for every dtype
    return s.astype(np.float32)


def _block(pixels: np.ndarray) -> np.ndarray:
    """The 8x8 lowest DCT frequencies of the windowed, mean-free grayscale copy."""
    import cv2

    g = _small_gray(pixels)
    return cv2.dct((g - g.mean()) * WINDOW)[:LOW, :LOW]


def _bits(blocks: np.ndarray) -> np.ndarray:
    """(n, 8, 8) coefficients -> n uint64: bit k set when coefficient k is above its block's median."""
    flat = blocks.reshape(len(blocks), HASH_BITS)
    part = np.partition(flat, (HASH_BITS // 2 - 1, HASH_BITS // 2), axis=1)
    median = (part[:, HASH_BITS // 2 - 1] + part[:, HASH_BITS // 2]) * 0.5
    bits = flat > median[:, None]
    return np.packbits(bits, axis=1, bitorder="little").view("<u8")[:, 0].astype(np.uint64)


def perceptual_hash(pixels: np.ndarray) -> np.uint64:
    """The 64-bit perceptual hash of one decoded image (HW or HWC, C = 1, 3 or 4; RGB order)."""
    flat = _block(pixels).ravel()
    s = np.sort(flat)
    bits = flat > (s[HASH_BITS // 2 - 1] + s[HASH_BITS // 2]) * 0.5  # the same rule as _bits, for one block
    return np.packbits(bits, bitorder="little").view("<u8")[0].astype(np.uint64)


def hash_and_flipped(pixels: np.ndarray) -> tuple[np.uint64, np.uint64]:
    """The hash of the image and of its horizontal mirror, from one resize and one DCT."""
    b = _block(pixels)
    h = _bits(np.stack([b, b * _FLIP_SIGNS]))
    return h[0], h[1]


def flipped_hash(pixels: np.ndarray) -> np.uint64:
    """The hash of the image's horizontal mirror (what `--flips` compares against), without mirroring it."""
    return hash_and_flipped(pixels)[1]


def perceptual_hashes(images: Iterable[np.ndarray], flips: bool = False):
    """Hashes of many images as one uint64 array; with `flips`, (hashes, flipped hashes)."""
    blocks = [_block(im) for im in images]
    if not blocks:
        empty = np.zeros(0, np.uint64)
        return (empty, empty.copy()) if flips else empty
    b = np.stack(blocks)
    return (_bits(b), _bits(b * _FLIP_SIGNS)) if flips else _bits(b)


def pixel_digest(pixels: np.ndarray) -> bytes:
    """SHA-256 of the pixels' dtype, shape and bytes, cut to 16 bytes: equal digests mean identical
    decoded images. HW and HWx1 give the same digest (one grayscale image, two spellings). Any other
    array (a stored sample's encoded bytes, 1-D uint8) is digested the same way, by its own shape.
    SHA-256, not blake2b: hashlib runs it on the CPU's SHA instructions, about twice blake2b's speed."""
    a = np.asarray(pixels)
    if a.ndim == 2:
        a = a[:, :, None]
    a = np.ascontiguousarray(a)
    shape = "x".join(str(n) for n in a.shape)
    h = hashlib.sha256(f"{a.dtype.str}:{shape};".encode(), usedforsecurity=False)
    h.update(memoryview(a.reshape(-1).view(np.uint8)))
    return h.digest()[:DIGEST_BYTES]


def hamming(a, b) -> np.ndarray:
    """Bits that differ between uint64 hashes (elementwise, broadcast), as int64."""
    return np.bitwise_count(np.bitwise_xor(np.asarray(a, np.uint64), np.asarray(b, np.uint64))).astype(np.int64)


def as_hashes(values, what: str = "hashes") -> np.ndarray:
    """`values` as a 1-D uint64 array, one hash a sample, or a UsageError naming `what` and why. Taken:
    any unsigned integers, signed ones without negatives, Python ints in [0, 2**64), an empty list. Refused
    rather than cast: floats (1.5 would become 1, NaN anything), booleans, strings, negative values (a
    wrapped -1 is a hash of 64 ones) and more than one dimension (a flattened (N, 2) is 2N samples)."""
    try:
        # a list is read as Python objects: numpy would make [2**64 - 1, 0] floats and [1.5] a float array
        a = np.asarray(values, dtype=object) if isinstance(values, (list, tuple)) else np.asarray(values)
        if a.dtype == object:  # each checked, then made uint64
            for k, x in enumerate(a.reshape(-1)):
                if not (isinstance(x, (int, np.integer)) and not isinstance(x, bool) and 0 <= x < 2 ** 64):
                    raise UsageError(f"{what} must be integers from 0 to 2**64 - 1 (uint64 hashes); "
                                     f"the first that is not, at {k}: {x!r:.40} ({type(x).__name__})")
            a = a.astype(np.uint64)
    except (OverflowError, ValueError, TypeError) as e:
        if isinstance(e, UsageError):
            raise
        raise UsageError(f"{what} must be one uint64 hash per sample: {e}") from None
    if a.size == 0:
        return np.zeros(0, np.uint64)
    if a.ndim != 1:
        raise UsageError(f"{what} must be one uint64 hash per sample (1-D), got shape {a.shape}")
    if a.dtype == np.bool_ or not np.issubdtype(a.dtype, np.integer):
        raise UsageError(f"{what} must be integers (uint64 hashes), got {a.dtype}")
    if np.issubdtype(a.dtype, np.signedinteger) and (a < 0).any():
        k = int(np.argmax(a < 0))
        raise UsageError(f"{what} must not be negative (uint64 hashes): {int((a < 0).sum())} are, the first at {k} ({int(a[k])}); "
                         "hashes stored as int64 are read back with .view(np.uint64)")
    return a.astype(np.uint64, copy=False)
