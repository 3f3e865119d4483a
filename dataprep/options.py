"""The options of every build, as `dataprep build`, `dataprep table` and `dataprep tokenize` spell them
(underscores for dashes): their defaults (the *_OPTIONS tables, which the CLI's options take theirs from),
what each may be (ranges, fixed choices) and the checks the front door (dataprep/build.py) makes of a
call's options before anything is listed: a bad value is a UsageError, an unknown name a TypeError.
"""
from __future__ import annotations

from typing import Any

from .errors import UsageError

__all__ = ["IMAGE_OPTIONS", "TABLE_OPTIONS", "TOKENIZE_OPTIONS", "VOLUME_OPTIONS", "check", "options"]

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
# Integer options' ranges (None: no upper bound), as the CLI's click.IntRange give them.
_RANGES = {"size": (8, 16384), "quality": (1, 100), "workers": (1, None), "limit": (1, None), "shard_size": (1, None),
           "train_bpe": (256, None), "eot_id": (0, None), "chunk_mb": (1, None), "task_mb": (1, None), "skip_rows": (0, None),
           "max_categories": (0, None), "num_classes": (1, 65536)}


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


def check(o: dict[str, Any]) -> None:
    """Each option of `o` that has a range or a fixed set of values, checked as the CLI checks it."""
    for k, (lo, hi) in _RANGES.items():
        v = o.get(k)
        if v is not None and (_integer(v) is None or v < lo or (hi is not None and v > hi)):
            raise UsageError(f"{k}={v!r}: must be an integer " + (f"from {lo} to {hi}" if hi is not None else f"of {lo} or more"))
        if v is not None:
            o[k] = _integer(v)
    if "seed" in o and _integer(o["seed"]) is None:
        raise UsageError(f"seed={o['seed']!r}: must be an integer")
    if "fill_value" in o and (isinstance(o["fill_value"], bool) or not isinstance(o["fill_value"], (int, float))):
        raise UsageError(f"fill_value={o['fill_value']!r}: must be a number")
    for k, allowed in _choices().items():
        spelled = {str(a) for a in allowed if a is not None}  # the CLI's spelling: depth "8" for 8
        if k in o and o[k] not in allowed and not (isinstance(o[k], str) and o[k] in spelled):
            raise UsageError(f"{k}={o[k]!r}: must be one of {', '.join(sorted(spelled))}")
    v = o.get("val_fraction")
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1):
        raise UsageError(f"val_fraction={v!r}: must be a number from 0 up to (not including) 1")


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
        except (TypeError, ValueError):
            raise UsageError(f"sizes={o['sizes']!r}: not a list of sizes like 128,192,256") from None
        if any(not 8 <= x <= 16384 for x in sizes):
            raise UsageError("sizes must be between 8 and 16384")
        if sizes and "size" in given:
            raise UsageError(f"size={given['size']} and sizes={','.join(map(str, sizes))}: sizes replaces size; give one of them")
        o["sizes"] = sizes
    return o
