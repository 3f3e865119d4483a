"""The options of every build, as `dataprep build`, `dataprep table` and `dataprep tokenize` spell them
(underscores for dashes): their defaults (the *_OPTIONS tables, which the CLI's options take theirs from),
what each may be (ranges, fixed choices) and the checks the front door (dataprep/build.py) makes of a
call's options before anything is listed: a bad value is a UsageError, an unknown name a TypeError. Each
table has its TypedDict (ImageOptions, VolumeOptions, VideoOptions, TokenizeOptions, TableOptions): every option's type
and what it does, so that an IDE completes the front door's keywords and mypy checks them.
"""
from __future__ import annotations

import math
import os
from typing import Any, Literal, Mapping, Sequence, TypedDict

from .errors import UsageError, brief

__all__ = ["COUNT_MAX", "DETECTION_OPTIONS", "IMAGE_OPTIONS", "TABLE_OPTIONS", "TOKENIZE_OPTIONS", "VIDEO_OPTIONS", "VOLUME_OPTIONS",
           "ImageOptions", "RunOptions", "ShardOptions", "TableOptions", "TokenizeOptions", "VideoOptions", "VolumeOptions", "bounds", "check",
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
# `dataprep build video`: frames stored as JPEGs at the training size (shorter side to `size`, as images).
VIDEO_OPTIONS: dict[str, Any] = {
    "size": 128, "sizes": None, "resize": "shorter", "upscale": False, "quality": 90, "fps": None, "max_frames": None,
    "max_seconds": None, "split": "train", **{k: IMAGE_OPTIONS[k] for k in ("workers", "limit", "shard_size", "strict", "resume")},
    "max_bytes": "16GiB", **_RUN_OPTIONS,
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


# The tables' options typed, each with what it does: `**options: Unpack[ImageOptions]` in the front door's
# signatures. Their keys and the tables' are the same, and each choice's Literal holds the CLI's choices
# (tests/test_front_door.py holds both). total=False: every option may be left out, for its default. A
# table's TypedDict names TypedDict among its bases for pdoc (scripts/api_docs.py): on Python 3.11 it reads a
# TypedDict's inherited keys only from the bases it names, one level up.
class RunOptions(TypedDict, total=False):
    """Where a build's output goes and how its work runs: the options every build takes."""

    overwrite: bool
    """Replace a pack or an unfinished build already in `out`."""
    progress: bool
    """Report progress on stderr: a bar on a terminal, plain lines in a log."""
    engine: Literal["local", "dask"]
    """Where the tasks run: a process pool here, or a Dask cluster. The output is the same."""
    address: str | None
    """The scheduler of an existing Dask cluster, e.g. tcp://10.0.0.5:8786 (never shut down)."""
    scheduler_file: str | os.PathLike[str] | None
    """The scheduler file of an existing Dask cluster."""
    fmt: Literal["npy", "hdf5", "zarr"]
    """The pack's storage (the CLI's `--format`): npy shards, one HDF5 file, or a Zarr group."""
    compress: Literal["none", "gzip", "lzf", "zstd", "blosc"]
    """hdf5: gzip or lzf; zarr: zstd or blosc. A compressed pack cannot be mapped."""


class ShardOptions(TypedDict, total=False):
    """The shard layout, strictness and byte cap of the image and volume builds."""

    workers: int | None
    """Processes; None is every core."""
    limit: int | None
    """Build only this many samples a split (images: spread over the classes); None builds all."""
    shard_size: int | None
    """Samples per shard; None takes it from the split's size."""
    strict: bool
    """Fail on the first unusable file instead of skipping it."""
    max_bytes: int | str | None
    """A cap on one sample's source bytes (an int, "256MiB", "1.5GiB"); a larger one is skipped with its reason."""
    resume: bool
    """Continue an interrupted build: finished shards, intact by checksum, are kept."""


class ImageOptions(ShardOptions, RunOptions, TypedDict, total=False):
    """The options of every image build (IMAGE_OPTIONS holds their defaults)."""

    size: int
    """The target size in pixels, 8 to 16384; `resize` says which side takes it."""
    sizes: Sequence[int] | str | None
    """Several sizes in one pass, e.g. (128, 192, 256) or "128,192,256"; it replaces `size`."""
    resize: Literal["center-crop", "longer", "pad", "shorter"]
    """shorter or longer: that side to `size`, aspect kept; center-crop: then the central square; pad: then padded to a square."""
    upscale: bool
    """Enlarge images smaller than `size`."""
    grayscale: bool
    """Store 1-channel images."""
    mode: Literal["encoded", "raw"]
    """encoded: JPEG bytes, decoded when served; raw: decoded uint8 pixels."""
    depth: Literal[8, 16]
    """Bits per channel stored. 16 keeps 16-bit PNG and TIFF values exactly (with mode="raw")."""
    quality: int
    """The JPEG quality, 1 to 100."""
    keep_jpeg: bool
    """Store a source JPEG as it is when it needs no resize and no conversion."""
    drop_duplicates: bool
    """Leave out exact and near duplicates (`dataprep audit`'s rule); they are counted in the summary."""


class VolumeOptions(ShardOptions, RunOptions, TypedDict, total=False):
    """The options of the volume build (VOLUME_OPTIONS holds their defaults)."""

    shape: Sequence[int] | str | None
    """Resample every volume to (D, H, W) or "D,H,W"; None keeps each one's shape."""
    resample: Literal["linear", "nearest"]
    """linear for intensities (an area average when shrinking); nearest for label volumes."""
    depth: Literal[8, 16]
    """Bits per voxel stored."""
    window: Sequence[float] | str | None
    """(LO, HI) source values mapped linearly onto the stored range; needed for float and negative values."""
    masks: str | os.PathLike[str] | None
    """A folder of label volumes, paired by relative path and stem and stored beside the volumes."""
    mask_dtype: Literal["auto", "uint8", "uint16"]
    """The label volumes' dtype; auto is uint8 unless a label above 255 occurs."""
    split: str
    """The split's name."""


class VideoOptions(ShardOptions, RunOptions, TypedDict, total=False):
    """The options of the video build (VIDEO_OPTIONS holds their defaults)."""

    size: int
    """Every frame's target size in pixels, 8 to 16384; `resize` says which side takes it."""
    sizes: Sequence[int] | str | None
    """Several sizes in one pass, e.g. (112, 160) or "112,160"; it replaces `size`."""
    resize: Literal["center-crop", "longer", "pad", "shorter"]
    """shorter or longer: that side to `size`, aspect kept; center-crop: then the central square; pad: then padded to a square."""
    upscale: bool
    """Enlarge frames smaller than `size`."""
    quality: int
    """The frames' JPEG quality, 1 to 100."""
    fps: float | None
    """Resample every video to this frame rate by its timestamps; None keeps every frame."""
    max_frames: int | None
    """Store at most this many frames a video (its first ones); None stores all."""
    max_seconds: float | None
    """Store only a video's frames before this many seconds; None stores all."""
    split: str
    """The split's name when the source has no split folders (or is a CSV list)."""


class TokenizeOptions(RunOptions, TypedDict, total=False):
    """The options of `tokenize` (TOKENIZE_OPTIONS holds their defaults)."""

    tokenizer: str | os.PathLike[str] | None
    """A Hugging Face tokenizers JSON file."""
    train_bpe: int | None
    """Train a byte-level BPE of this vocabulary size first (instead of `tokenizer`)."""
    split_docs: Literal["file", "line", "paragraph"]
    """Plain text: a document per file, per line, or per blank-line-separated paragraph."""
    text_field: str
    """The text field of .jsonl, or the column of CSV and Parquet."""
    eot: str | None
    """The end-of-text token; None takes `<|endoftext|>`, `</s>` or `[SEP]`, whichever exists."""
    eot_id: int | None
    """The end-of-text id (instead of `eot`)."""
    val_fraction: float
    """The share of documents drawn for val, each by a hash of `seed` and its text."""
    seed: int
    """The seed of the val draw."""
    chunk_mb: int
    """MiB of text encoded per batch: it bounds memory and never changes the pack."""
    strict: bool
    """Fail on bytes that are not UTF-8 instead of replacing and counting them."""
    resume: bool
    """Continue an interrupted run: finished tasks and units, intact by checksum, are kept."""
    workers: int
    """Processes for the local engine, or the local Dask cluster's size."""
    task_mb: int
    """Input files are grouped into tasks of about this many MiB of text; it never changes the pack."""


class TableOptions(RunOptions, TypedDict, total=False):
    """The options of `table` (TABLE_OPTIONS holds their defaults)."""

    task: Literal["auto", "classification", "regression"]
    """auto: text, integer and boolean targets are classes; float targets are regression."""
    input_format: Literal["csv", "excel", "feather", "json", "parquet"] | None
    """How to parse the files; None takes it from the file name."""
    sep: str
    """The CSV separator: a character, "space", or "auto" to sniff it."""
    header: str | int
    """"infer", "none", or the header's line number."""
    skip_rows: int
    """Lines to skip first (e.g. a line that is not column names)."""
    names: Sequence[str] | str | None
    """Column names, a sequence or "a,b"; the files then have no header."""
    target_file: str | os.PathLike[str] | None
    """The target as a one-column file of the same rows."""
    missing: Literal["error", "mean", "value", "mask"]
    """Missing values: fail, the column's train mean, `fill_value`, or 0 plus a mask array."""
    fill_value: float
    """What missing="value" fills in."""
    float_dtype: Literal["float32", "float64", "float16"]
    """The dtype of the float columns."""
    datetime: Literal["parts", "int64"]
    """Datetimes as parts (year, month, day, weekday, hour) or as int64 seconds."""
    categorical: Sequence[str] | str | None
    """Columns to treat as categories."""
    numeric: Sequence[str] | str | None
    """Columns that must be numbers."""
    dates: Sequence[str] | str | None
    """Columns to parse as datetimes; text that looks like dates is otherwise kept as categories."""
    drop: Sequence[str] | str | None
    """Columns to leave out."""
    val_fraction: float
    """The share of rows drawn for val."""
    split_column: str | None
    """A column naming each row's split (instead of `val_fraction`)."""
    seed: int
    """The seed of the val draw."""
    max_categories: int
    """Codes per categorical column; rarer values share the code of `<other>` (0: no limit)."""
    drop_missing_target: bool
    """Leave out rows whose target is missing (counted) instead of failing."""
    keep_ids: bool
    """Keep columns whose values are all distinct (IDs, left out by default)."""
    workers: int
    """Processes reading files for the local engine, or the local Dask cluster's size."""


# The largest count an option takes (None below): what an int64 holds. A count past it is a typo or an attack,
# never a dataset, and it would overflow where numpy or a C library meets it.
COUNT_MAX = (1 << 63) - 1
# Integer options' ranges (None: up to COUNT_MAX), checked alike by the front door and the CLI (cli/numbers.py).
# Tighter bounds are where a larger value costs more than it can mean: a process per worker; ids stored in
# uint32 (train_bpe, eot_id); a chunk or task read whole (chunk_mb, task_mb: 1 TiB); pandas holding a set of
# the skipped line numbers (skip_rows); numpy's generators taking a non-negative seed (table), kept to 64 bits.
_RANGES = {"size": (8, 16384), "quality": (1, 100), "workers": (1, 4096), "limit": (1, None), "shard_size": (1, None),
           "train_bpe": (256, 1 << 32), "eot_id": (0, (1 << 32) - 1), "chunk_mb": (1, 1 << 20), "task_mb": (1, 1 << 20),
           "skip_rows": (0, 1_000_000), "seed": (0, (1 << 64) - 1), "max_frames": (1, None),
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
    for k in ("fps", "max_seconds"):  # the video build's rates and durations: positive finite numbers
        v = o.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf or (k == "fps" and v > 1000)):
            raise UsageError(f"{k}={brief(v)}: must be a number above 0" + (" and at most 1000" if k == "fps" else " (seconds)"))
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


def options(given: Mapping[str, Any], table: dict[str, Any], what: str) -> dict[str, Any]:
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
