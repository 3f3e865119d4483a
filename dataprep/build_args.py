"""The front door's arguments as the builds take them: takes a build's checked options and the values a
caller gives as one item or several, or as the CLI's text, gives the settings every build shares
(`_settings`: `BuildSettings`) and the image builds' (`_image_settings`: `ImageSettings`), paths as a list
(`_paths`), a D,H,W shape or a LO,HI window (`_triple`) and column names (`_names`); a bad value is a
`UsageError` naming the argument.
"""
from __future__ import annotations

import builtins
import math
import os
from typing import Any

from .errors import UsageError, brief


def _settings(o: dict[str, Any]):
    """The shard layout, strictness and byte cap every build shares, from its options."""
    from .settings import BuildSettings

    return BuildSettings(workers=o["workers"] or os.cpu_count() or 1, limit=o["limit"], shard_size=o["shard_size"],
                         strict=o["strict"], overwrite=o["overwrite"], resume=o["resume"], max_bytes=o["max_bytes"])


def _image_settings(o: dict[str, Any]):
    from .images.settings import ImageSettings

    return ImageSettings(size=o["size"], sizes=o["sizes"], resize=o["resize"], upscale=o["upscale"], grayscale=o["grayscale"],
                         mode=o["mode"], depth=int(o["depth"]), quality=o["quality"], keep_jpeg=o["keep_jpeg"])


def _paths(given, what: str) -> builtins.list[str]:
    """One path or pattern, or several, as a list of strings."""
    items = [given] if isinstance(given, (str, os.PathLike)) else builtins.list(given)
    if not items:
        raise UsageError(f"{what}: give at least one")
    return [os.fspath(x) for x in items]


def _triple(value, what: str, cast, n: int, example: str) -> tuple | None:
    """A D,H,W shape or LO,HI window given as a sequence or as the CLI's text ('64,128,128', '-1000,2000')."""
    if value is None:
        return None
    try:
        parts = value.replace("x", ",").split(",") if isinstance(value, str) else builtins.list(value)
        t = tuple(cast(v) for v in parts)
    except (TypeError, ValueError, OverflowError):  # OverflowError: int(inf), float(10**400)
        t = ()
    # a side past 16384 (--size's bound) or a window of inf or nan would overflow or fill the volume with nan
    if len(t) != n or not all(1 <= v <= 16384 if cast is int else math.isfinite(v) for v in t):
        raise UsageError(f"{what}={brief(value)}: not {example}")
    return t


def _names(value) -> tuple[str, ...]:
    """Column names given as 'a,b' (the CLI's form) or as a sequence."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else builtins.list(value)
    return tuple(str(v).strip() for v in items if str(v).strip())
