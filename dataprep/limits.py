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

from .errors import DataprepError

IMAGE_MAX_BYTES = 256 << 20  # one image's encoded bytes: far above any photo (a 100 MP PNG is ~300 MB raw)
VOLUME_MAX_BYTES = 8 << 30  # one volume file (.npy, TIFF): CT and microscopy stacks run to gigabytes


def parse_bytes(text: str | int) -> int:
    """A byte count as a user writes it: 268435456, 256MiB, 256M (binary), 1.5GiB, 4G."""
    if isinstance(text, int):
        n = text
    else:
        s = str(text).strip().upper().replace(" ", "")
        units = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
                 "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30, "T": 1 << 40, "TB": 1 << 40, "TIB": 1 << 40}
        num = s.rstrip("KMGTIB")
        unit = s[len(num):]
        try:
            value = float(num)
        except ValueError:
            value = None
        if value is None or unit not in units or value != value:
            raise DataprepError(f"{text!r}: not a byte count (e.g. 268435456, 256MiB, 1.5GiB)")
        n = int(value * units[unit])
    if n < 1:
        raise DataprepError(f"a byte cap must be at least 1 byte, not {text!r}")
    return n


def over_cap(size: int, cap: int) -> str | None:
    """The skip detail for a sample of `size` bytes under `cap`, or None when it fits."""
    if size > cap:
        return f"{size:,} bytes, over the {cap:,}-byte cap on one sample (--max-bytes)"
    return None
