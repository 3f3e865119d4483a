"""How many bytes one source sample may bring into a build: a cap that holds whatever a file claims.

A hostile or broken source (a 3 MB .tar.gz whose one member inflates to 3 GiB, a pax header declaring
1.5 GiB, a 49 KB Parquet file with a 1.5 GiB cell, a file larger than RAM in a folder) must cost a
skipped sample with its reason, not the machine's memory or the rest of the build. Every reader checks
a sample's size against the cap *before* it holds the bytes: from the size a header, a file's fstat or
a column's offsets declare, and again while reading, where the declared size can lie.

The cap is `BuildSettings.max_bytes` (`--max-bytes` on the command line), recorded in the manifest;
None takes the kind's default below.
"""
from __future__ import annotations

import math

from .errors import DataprepError, brief

IMAGE_MAX_BYTES = 256 << 20  # one image's encoded bytes: far above any photo (a 100 MP PNG is ~300 MB raw)
VOLUME_MAX_BYTES = 8 << 30  # one volume file (.npy, TIFF): CT and microscopy stacks run to gigabytes
VIDEO_MAX_BYTES = 16 << 30  # one video file: hours of 1080p H.264 run to gigabytes
# The most frames one video may give a build (decoded, and again after --fps repeats or drops them): about 4.6 hours
# at 30 fps.
# A container declaring more is refused before decoding unless --max-frames or --max-seconds bounds what is read;
# one that declares none (or lies) is stopped when decoding reaches it, so an endless stream costs bounded time.
VIDEO_MAX_FRAMES = 500_000
# The latest time a video's frame may be stamped, in seconds from its first (about 115 days): timestamps stay far
# from where a float's sums lose their fractions, and a forged jump in a file's timestamps is refused.
VIDEO_MAX_SECONDS = 10_000_000
# The largest byte count taken (1024TiB): past any file or node's RAM, and exact in a float and an int64, so a
# cap of inf, 1e400 or 400 digits is refused with this range instead of overflowing where a reader meets it.
MAX_BYTES = 1 << 50


def parse_bytes(text: str | int) -> int:
    """A byte count as a user writes it: 268435456, 256MiB, 256M (binary), 1.5GiB, 4G.

    Args:
        text: the count, as text (a command line's, a config's) or a number.

    Returns:
        The count in bytes, from 1 to MAX_BYTES; anything else (0, nan, inf, 1e400, 400 digits, a bool) is a
        DataprepError saying what a byte count is and its range.
    """
    value: float | int | None = None
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    elif not isinstance(text, bool):
        s = str(text).strip().upper().replace(" ", "")
        units = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
                 "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30, "T": 1 << 40, "TB": 1 << 40, "TIB": 1 << 40}
        num = s.rstrip("KMGTIB")
        unit = s[len(num):]
        try:
            value = float(num) * units[unit]  # a number past a float's range is inf here, refused below
        except (ValueError, KeyError):
            value = None
    if value is None or (isinstance(value, float) and not math.isfinite(value)) or not 1 <= value <= MAX_BYTES:
        raise DataprepError(f"{brief(text)}: not a byte count from 1 to 1024TiB ({MAX_BYTES:,}), e.g. 268435456, 256MiB, 1.5GiB")
    return int(value)


def over_cap(size: int, cap: int) -> str | None:
    """The skip detail for a sample of `size` bytes under `cap`, or None when it fits."""
    if size > cap:
        return f"{size:,} bytes, over the {cap:,}-byte cap on one sample (--max-bytes)"
    return None
