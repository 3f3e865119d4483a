"""The options of every build, as `dataprep build`, `dataprep table` and `dataprep tokenize` spell them
(underscores for dashes): their defaults (the *_OPTIONS tables, which the CLI's options take theirs from),
what each may be (ranges, fixed choices) and the checks the front door (dataprep/build.py) makes of a
call's options before anything is listed: a bad value is a UsageError, an unknown name a TypeError.
"""
from __future__ import annotations

import math
from typing import Any

from .errors import UsageError, brief

__all__ = ["COUNT_MAX", "DETECTION_OPTIONS", "IMAGE_OPTIONS", "TABLE_OPTIONS", "TOKENIZE_OPTIONS", "VOLUME_OPTIONS", "bounds", "check",
           "options", "out_of_range"]

# Options every build takes, by where the output goes and how the work runs.
_RUN_OPTIONS: dict[str, Any] = {"overwrite": False, "progress": False, "engine": "local", "address": None,
                                "scheduler_file": None, "fmt": "npy", "compress": "none"}
# The options every image build takes, as `dataprep build` spells them (dashes for underscores), and their
# defaults; what each may be is in _RANGES and _choices(). The CLI's options take their defaults from here.
IMAGE_OPTIONS: dict[str, Any] = {
    "size": 512, "sizes": None, "resize": "shorter", "upscale": False, "grayscale": False, "mode": "encoded", "depth": 8,
    "quality": 90, "keep_jpeg": True, "workers": None, "limit": None, "shard_size": None, "strict": False,
    "max_bytes": "256MiB", "resume": False, "drop_duplicates": False, **_RUN_OPTIONS,
}
# What `coco` and `yolo` take beside IMAGE_OPTIONS. max_boxes: an image listing more boxes is skipped ("too many
# boxes"), since the Loader pads every batch row to the most boxes a held image has (300,000 on one image made
# each row of every batch that wide). 1000 is ten times COCO's most on one image (93); dense sets (retail
# shelves, crowds, aerial scenes such as DOTA) can hold more and take a higher cap.
DETECTION_OPTIONS: dict[str, Any] = {"max_boxes": 1000}
VOLUME_OPTIONS: dict[str, Any] = {
    "shape": None, "resample": "linear", "depth": 16, "window": None, "masks": None, "mask_dtype": "auto", "split": "train",
    **{k: IMAGE_OPTIONS[k] for k in ("workers", "limit", "shard_size", "strict", "resume")},
    "max_bytes": "8GiB", **_RUN_OPTIONS,
}
TOKENIZE_OPTIONS: dict[str, Any] = {
    "tokenizer": None, "train_bpe": None, "split_docs": "file", "text_field": "text", "eot": None, "eot_id": None,
    "val_fraction": 0.0, "seed": 0, "chunk_mb": 8, "strict": False, "resume": False, "workers": 1, "task_mb": 64,
    **_RUN_OPTIONS,
}
TABLE_OPTIONS: dict[str, Any] = {
    "task": "auto", "input_format": None, "sep": "auto", "header": "infer", "skip_rows": 0, "names": None,
    "target_file": None, "missing": "error", "fill_value": 0.0, "float_dtype": "float32", "datetime": "parts",
    "categorical": None, "numeric": None, "dates": None, "drop": None, "val_fraction": 0.0, "split_column": None,
    "seed": 0, "max_categories": 10_000, "drop_missing_target": False, "keep_ids": False, "workers": 1, **_RUN_OPTIONS,
}
# The largest count an option takes (None below): what an int64 holds. A count past it is a typo or an attack,
# never a dataset, and it would overflow where numpy or a C library meets it.
COUNT_MAX = (1 << 63) - 1
# Integer options' ranges (None: up to COUNT_MAX), checked alike by the front door and the CLI (cli/numbers.py).
# Tighter bounds are where a larger value costs more than it can mean: a process per worker; ids stored in
# uint32 (train_bpe, eot_id); a chunk or task read whole (chunk_mb, task_mb: 1 TiB); pandas holding a set of
# the skipped line numbers (skip_rows); numpy's generators taking a non-negative seed (table), kept to 64 bits.
_RANGES = {"size": (8, 16384), "quality": (1, 100), "workers": (1, 4096), "limit": (1, None), "shard_size": (1, None),
           "train_bpe": (256, 1 << 32), "eot_id": (0, (1 << 32) - 1), "chunk_mb": (1, 1 << 20), "task_mb": (1, 1 << 20),
           "skip_rows": (0, 1_000_000), "seed": (0, (1 << 64) - 1),
           "max_categories": (0, None), "num_classes": (1, 65536), "max_boxes": (1, None)}


def _choices() -> dict[str, tuple]:
    """What each option with a fixed set of values may be (the CLI's click.Choice lists)."""
    from .engine import ENGINES
    from .images.resize import RESIZE_MODES
    from .images.settings import IMAGE_MODES
    from .output import COMPRESSIONS
    from .pack.backends import BACKENDS
    from .tables.columns import MISSING
    from .tables.read import READERS
    from .tokens.read import SPLITS

    return {"resize": tuple(sorted(RESIZE_MODES)), "mode": tuple(IMAGE_MODES), "depth": (8, 16), "engine": tuple(ENGINES),
            "fmt": tuple(BACKENDS), "compress": COMPRESSIONS, "resample": ("linear", "nearest"),
            "mask_dtype": ("auto", "uint8", "uint16"), "split_docs": SPLITS, "task": ("auto", "classification", "regression"),
            "input_format": (None, *sorted(READERS)), "missing": MISSING, "float_dtype": ("float32", "float64", "float16"),
            "datetime": ("parts", "int64")}


def bounds(key: str) -> tuple[int, int]:
    """The lowest and highest value of integer option `key` (`size`, `workers`, ...)."""
    lo, hi = _RANGES[key]
    return lo, COUNT_MAX if hi is None else hi


def out_of_range(value: Any, lo: int, hi: int) -> str | None:
    """Why `value` is not an integer from `lo` to `hi` ("inf: must be an integer from 1 to 4096"), or None
    when it is one; the caller's message names the option."""
    v = _integer(value)
    if v is None or not lo <= v <= hi:
        return f"{brief(value)}: must be an integer from {lo} to {hi}"
    return None


def check(o: dict[str, Any]) -> None:
    """Each option of `o` that has a range or a fixed set of values, checked as the CLI checks it."""
    for k in _RANGES:
        v = o.get(k)
        if v is not None:
            why = out_of_range(v, *bounds(k))
            if why:
                raise UsageError(f"{k}={why}")
            o[k] = _integer(v)
    if "fill_value" in o:
        _check_fill(o["fill_value"], o.get("float_dtype") or "float64")
    for k, allowed in _choices().items():
        spelled = {str(a) for a in allowed if a is not None}  # the CLI's spelling: depth "8" for 8
        if k in o and o[k] not in allowed and not (isinstance(o[k], str) and o[k] in spelled):
            raise UsageError(f"{k}={o[k]!r}: must be one of {', '.join(sorted(spelled))}")
    v = o.get("val_fraction")
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1):
        raise UsageError(f"val_fraction={v!r}: must be a number from 0 up to (not including) 1")


def _check_fill(v: Any, dtype: str) -> None:
    """fill_value: a finite number the float columns' dtype holds (1e300 would be stored as inf in float32)."""
    import numpy as np

    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise UsageError(f"fill_value={brief(v)}: must be a number")
    top = float(np.finfo(dtype).max) if dtype in ("float16", "float32", "float64") else float(np.finfo(np.float64).max)
    if (isinstance(v, float) and not math.isfinite(v)) or abs(v) > top:  # an int too: 10**400 has no float
        raise UsageError(f"fill_value={brief(v)}: must be a finite number a {dtype} column holds (from {-top:g} to {top:g})")


def _integer(v) -> int | None:
    """`v` as an int where it is one (numpy's integers too, never a bool), else None."""
    import operator

    if isinstance(v, bool):
        return None
    try:
        return operator.index(v)
    except TypeError:
        return None


def options(given: dict[str, Any], table: dict[str, Any], what: str) -> dict[str, Any]:
    """`given` over the table's defaults, each checked as the CLI checks it; an unknown name is a TypeError
    naming the options there are (as a misspelled keyword is)."""
    wrong = sorted(set(given) - set(table))
    if wrong:
        raise TypeError(f"build.{what}() got unexpected option(s) {', '.join(wrong)}; its options are " + ", ".join(sorted(table)))
    o = {k: given.get(k, d) for k, d in table.items()}
    check(o)
    if o.get("max_bytes") is not None:
        from .limits import parse_bytes

        try:
            o["max_bytes"] = parse_bytes(o["max_bytes"])
        except UsageError:
            raise
        except Exception as e:  # parse_bytes says what a byte count looks like
            raise UsageError(f"max_bytes: {e}") from None
    if "sizes" in o:
        sizes = o["sizes"]
        try:
            sizes = tuple(int(x) for x in (sizes.split(",") if isinstance(sizes, str) else sizes) if str(x).strip()) if sizes else ()
        except (TypeError, ValueError, OverflowError):  # OverflowError: an inf among them
            raise UsageError(f"sizes={brief(o['sizes'])}: not a list of sizes like 128,192,256") from None
        if any(not 8 <= x <= 16384 for x in sizes):
            raise UsageError("sizes must be between 8 and 16384")
        if sizes and "size" in given:
            raise UsageError(f"size={given['size']} and sizes={','.join(map(str, sizes))}: sizes replaces size; give one of them")
        o["sizes"] = sizes
    return o
