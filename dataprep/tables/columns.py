"""Columns stage: takes a DataFrame and the table settings, gives typed arrays per split, the vocabulary
of every categorical column, feature statistics, and a description of every conversion for the manifest.

Numeric and boolean columns become float features (float32 by default); string and category columns
become integer codes (the smallest dtype) with their vocabulary; datetimes become parts (year, month,
day, weekday, hour) or int64 seconds. Missing values follow a named policy and are never filled
silently: "error" (default), "mean", "value" or "mask" (filled with 0, plus a uint8 mask array); rows
whose target is missing are an error unless `drop_missing_target` leaves them out (counted).

Nothing becomes codes silently: a column whose values are all distinct (text or integers, in more than
`ID_MIN_ROWS` rows) is an ID and left out unless `keep_ids`; text that reads as dates stays categorical
but its description names `--dates COL`. Every column's description (`conversions`) says what it became.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..errors import DataprepError
from ..pack.names import check_name

MISSING = ("error", "mean", "value", "mask")
DATETIME_PARTS = ("year", "month", "day", "day_of_week", "hour")
ID_MIN_ROWS = 20  # a column of all-distinct values is an ID only in a table with more rows than this


@dataclass(frozen=True)
class TableSettings:
    target: str
    task: str = "auto"  # auto: text, integer and boolean targets are classes, floats are regression
    float_dtype: str = "float32"
    missing: str = "error"
    fill_value: float = 0.0
    datetime: str = "parts"  # parts | int64
    categorical: tuple[str, ...] = ()  # treat these as categories even if numeric
    numeric: tuple[str, ...] = ()  # these must convert to numbers (an error names the first bad value)
    dates: tuple[str, ...] = ()  # these are parsed as datetimes (text files carry no date type)
    drop: tuple[str, ...] = ()
    val_fraction: float = 0.0
    split_column: str | None = None
    seed: int = 0
    max_categories: int = 10_000  # per categorical column; the rarest values beyond it share one code, "<other>" (0: no limit)
    drop_missing_target: bool = False  # leave out rows whose target is missing (counted) instead of failing
    keep_ids: bool = False  # keep columns of all-distinct values (IDs) as categories or numbers

    def __post_init__(self):
        if self.task not in ("auto", "classification", "regression"):
            raise DataprepError(f"task must be auto, classification or regression, not {self.task!r}")
        if self.missing not in MISSING:
            raise DataprepError(f"unknown missing-value policy {self.missing!r}; choose one of {list(MISSING)}")
        if self.datetime not in ("parts", "int64"):
            raise DataprepError("datetime must be 'parts' or 'int64'")
        if np.dtype(self.float_dtype).kind != "f":
            raise DataprepError(f"float_dtype must be a float type, not {self.float_dtype}")
        if not 0 <= self.val_fraction < 1:
            raise DataprepError("val_fraction must be in [0, 1)")
        if self.max_categories < 0 or self.max_categories == 1:
            raise DataprepError("max_categories must be 0 (no limit) or at least 2")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def smallest_int(lo: int, hi: int) -> np.dtype:
    for dt in ("|u1", "<u2", "<u4", "<u8") if lo >= 0 else ("|i1", "<i2", "<i4", "<i8"):
        info = np.iinfo(np.dtype(dt))
        if info.min <= lo and hi <= info.max:
            return np.dtype(dt)
    raise DataprepError(f"integers from {lo} to {hi} do not fit in 64 bits")


def resolve(df, name: str) -> str:
    """A column by name, or by position ("-1" is the last) where the table has no header."""
    if name in df.columns:
        return name
    try:
        return df.columns[int(name)]
    except (ValueError, IndexError):
        cols = list(df.columns)
        raise DataprepError(f"no column {name!r}; the table has {cols[:12]}{' ...' if len(cols) > 12 else ''}") from None


VOCAB_FILE = "vocab.json"  # beside the manifest: every categorical column's values and train counts
FIRST_VALUES, FIRST_CHARS = 5, 40  # the manifest keeps this much of each vocabulary, for `dataprep info`


@dataclass
class Converted:
    splits: dict[str, dict[str, np.ndarray]]
    fields: dict[str, Any]
    stats: dict[str, Any]
    counts: dict[str, int] = field(default_factory=dict)
    vocab: dict[str, Any] = field(default_factory=dict)  # what VOCAB_FILE holds (kept out of the manifest)
    rows: dict[str, Any] = field(default_factory=dict)  # {"read": N, "dropped": {reason: rows}} for the manifest


@dataclass
class _Features:
    """The feature columns as converted, before they are stacked into arrays."""

    num_cols: list[str] = field(default_factory=list)
    num_arrays: list[np.ndarray] = field(default_factory=list)
    masks: list[np.ndarray] = field(default_factory=list)
    cat_cols: list[str] = field(default_factory=list)
    cat_arrays: list[np.ndarray] = field(default_factory=list)
    vocabs: dict[str, list[str]] = field(default_factory=dict)
    dt_cols: list[str] = field(default_factory=list)
    dt_arrays: list[np.ndarray] = field(default_factory=list)
    conversions: dict[str, str] = field(default_factory=dict)


def convert(df, s: TableSettings) -> Converted:
    """The stages in order: rows without a target, which rows go to which split, the target, the features (by
    column type), then the typed arrays, the train split's statistics and the manifest's descriptions."""
    target = resolve(df, s.target)
    split_col = resolve(df, s.split_column) if s.split_column else None
    dropped_cols = {resolve(df, c) for c in s.drop}
    read = len(df)
    df, lost = _drop_missing_target(df, target, s)
    split_of = _assign_splits(df, split_col, s)
    train_rows = split_of == "train" if (split_of == "train").any() else np.ones(len(df), bool)
    y, tfield = _target(df[target], target, s, target in {resolve(df, c) for c in s.categorical})
    feats = _features(df, {target, split_col} | dropped_cols, s, train_rows)
    arrays, fields = _arrays(feats, s, len(df))
    tfield["dtype"] = y.dtype.str
    named = {target: _describe_target(tfield), **({split_col: "excluded: the split column"} if split_col else {}),
             **{c: "excluded: --drop" for c in dropped_cols}}
    conversions = {c: named.get(c) or feats.conversions[c] for c in df.columns}  # every column, in the table's order
    fields = {"features": fields.pop("features"), "target": tfield, "conversions": conversions, **fields}
    stats, vocab = _statistics(arrays, feats, train_rows)
    splits = {}
    for name in sorted(set(split_of.tolist())):
        rows = split_of == name
        splits[name] = {"features": np.ascontiguousarray(arrays["features"][rows]), "target": np.ascontiguousarray(y[rows]),
                        **{k: np.ascontiguousarray(a[rows]) for k, a in arrays.items() if k != "features"}}
    rows = {"read": read, "dropped": {"missing target": lost} if lost else {}}
    return Converted(splits, fields, stats, {k: len(v["target"]) for k, v in splits.items()}, vocab, rows)


def _drop_missing_target(df, target: str, s: TableSettings):
    """The rows whose target is known, and how many were left out; an error naming the way out when not asked.
    What is left is typed as if the dropped rows had never been there: whole floats become integers (classes
    under task "auto"), as pandas reads a column of integers without gaps."""
    import pandas as pd

    miss = df[target].isna().to_numpy()
    lost = int(miss.sum())
    if not lost:
        return df, 0
    if not s.drop_missing_target:
        raise DataprepError(f"column {target!r} (the target) has {lost} missing values "
                            "(--drop-missing-target leaves those rows out, counted in the manifest)")
    if lost == len(df):
        raise DataprepError(f"column {target!r} (the target) is missing in every row")
    df = df[~miss].reset_index(drop=True)
    t = df[target]
    if s.task != "regression" and pd.api.types.is_float_dtype(t) and np.all(np.mod(t.to_numpy(np.float64), 1) == 0):
        df[target] = t.astype(np.int64)  # integers that pandas read as floats only because some were missing
    return df, lost


def _describe_target(t: dict[str, Any]) -> str:
    if t["task"] == "classification":
        return f"target: classification, {len(t['classes'])} classes ({np.dtype(t['dtype']).name})"
    return f"target: regression ({np.dtype(t['dtype']).name})"


def _assign_splits(df, split_col: str | None, s: TableSettings) -> np.ndarray:
    """Each row's split name: the split column's value, else train with a seeded val fraction."""
    n = len(df)
    if split_col is not None:
        if df[split_col].isna().any():
            raise DataprepError(f"column {split_col!r} (the split column) has missing values")
        split_of = df[split_col].astype(str).to_numpy()
        for name in sorted(set(split_of.tolist())):  # each becomes a directory of the pack
            check_name(name, "split", f"column {split_col!r} (the split column)")
        return split_of
    split_of = np.full(n, "train", dtype=object)
    if s.val_fraction:
        rng = np.random.default_rng(s.seed)
        val = rng.permutation(n)[: int(round(n * s.val_fraction))]
        split_of[val] = "val"
    return split_of


def _target(tcol, target: str, s: TableSettings, force_cat: bool) -> tuple[np.ndarray, dict[str, Any]]:
    """The target as classes (codes of text or integer values) or a regression value, and its description."""
    import pandas as pd

    tfield: dict[str, Any] = {"column": target}
    integral = pd.api.types.is_bool_dtype(tcol) or pd.api.types.is_integer_dtype(tcol)
    if s.task == "regression":
        if not pd.api.types.is_numeric_dtype(tcol):
            raise DataprepError(f"column {target!r} (the target) is not numeric, so it cannot be a regression target")
        y = tcol.to_numpy(np.float64).astype(s.float_dtype)
        tfield["task"] = "regression"
    elif _is_text(tcol) or force_cat or (s.task == "classification" and not integral):
        codes, vocab, _ = _codes(tcol, target, "error")
        y = codes.astype(smallest_int(0, max(len(vocab) - 1, 0)))
        tfield.update(task="classification", classes=vocab)
    elif integral:
        v = tcol.to_numpy(np.int64)
        y = v.astype(smallest_int(int(v.min()), int(v.max())))
        tfield.update(task="classification", classes=sorted(int(x) for x in np.unique(v)))
    elif pd.api.types.is_numeric_dtype(tcol):
        y = tcol.to_numpy(np.float64).astype(s.float_dtype)
        tfield["task"] = "regression"
    else:
        raise DataprepError(f"column {target!r} (the target) has dtype {tcol.dtype}, neither numbers nor categories")
    return y, tfield


def _features(df, skip: set, s: TableSettings, train_rows: np.ndarray) -> _Features:
    """Every other column converted by its type: forced numbers and dates first, then IDs (left out unless
    keep_ids), categories, datetimes (parts or int64 seconds), numbers and booleans; any other dtype is an error
    naming the column. Only columns the settings do not name are guessed at."""
    import pandas as pd

    force_cat = {resolve(df, c) for c in s.categorical}
    force_num = {resolve(df, c) for c in s.numeric}
    force_date = {resolve(df, c) for c in s.dates}
    out = _Features()
    for c in df.columns:
        if c in skip:
            continue
        col = df[c]
        if c in force_num:
            try:
                col = pd.to_numeric(col, errors="raise")
            except (ValueError, TypeError) as e:
                raise DataprepError(f"column {c!r} cannot be converted to numbers: {e}") from None
        if c in force_date:
            try:
                col = pd.to_datetime(col, errors="raise")
            except (ValueError, TypeError) as e:
                raise DataprepError(f"column {c!r} cannot be read as dates: {e}") from None
        guessed = c not in force_cat | force_num | force_date
        dates = guessed and _is_text(col) and _looks_like_dates(col)
        if guessed and not dates and not s.keep_ids and _looks_like_ids(col):
            out.conversions[c] = f"excluded: {len(col)} distinct values in {len(col)} rows, an ID (--keep-ids keeps it)"
            continue
        if c in force_cat or _is_text(col):
            codes, vocab, rare = _codes(col, c, s.missing, s.max_categories)
            out.cat_cols.append(c)
            out.cat_arrays.append(codes)
            out.vocabs[c] = vocab
            out.conversions[c] = f"categorical with {len(vocab)} values" + (
                f" ({rare} values rarer than the {len(vocab) - 1} most frequent share the code of '<other>'; "
                f"--max-categories {s.max_categories})" if rare else "") + (
                f"; they look like dates: --dates {c} parses them (--categorical {c} keeps the codes)" if dates else "")
        elif pd.api.types.is_datetime64_any_dtype(col):
            _datetime(col, c, s, train_rows, out)
        elif pd.api.types.is_bool_dtype(col) or pd.api.types.is_numeric_dtype(col):
            arr, mask = _fill(col.to_numpy(np.float64, na_value=np.nan), c, s, train_rows)
            out.num_cols.append(c)
            out.num_arrays.append(arr)
            out.masks.append(mask)
            out.conversions[c] = (f"feature {s.float_dtype} ({'boolean' if pd.api.types.is_bool_dtype(col) else 'numeric'})"
                                  + (f", {int(mask.sum())} missing: {_filled(s, arr[mask])}" if mask.any() else ""))
        else:
            raise DataprepError(f"column {c!r} has dtype {col.dtype}, which dataprep does not convert (drop it with --drop)")
    return out


def _datetime(col, c: str, s: TableSettings, train_rows: np.ndarray, out: _Features) -> None:
    if col.isna().any() and s.missing == "error":
        raise DataprepError(f"column {c!r} has {int(col.isna().sum())} missing datetimes (choose a --missing policy)")
    if s.datetime == "int64":
        out.dt_cols.append(c)
        if col.dt.tz is not None:
            col = col.dt.tz_convert("UTC").dt.tz_localize(None)
        # by unit, not astype(int64) // 10**9: pandas 3 parses text to microseconds, not nanoseconds
        out.dt_arrays.append(col.to_numpy().astype("datetime64[s]").view("<i8"))
        out.conversions[c] = "datetime: int64 seconds since 1970" + (
            f", {int(col.isna().sum())} missing" if col.isna().any() else "")
        return
    for part in DATETIME_PARTS:
        arr, mask = _fill(getattr(col.dt, part).to_numpy(np.float64), f"{c}.{part}", s, train_rows)
        out.num_cols.append(f"{c}.{part}")
        out.num_arrays.append(arr)
        out.masks.append(mask)
    out.conversions[c] = f"datetime: parts {', '.join(DATETIME_PARTS)} (features {s.float_dtype})"


def _arrays(f: _Features, s: TableSettings, n: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The stacked arrays (features in the float dtype, overflow refused; codes in the smallest integer type;
    the missing-value mask; datetimes) and their manifest descriptions."""
    limit = float(np.finfo(np.dtype(s.float_dtype)).max)
    for c, arr in zip(f.num_cols, f.num_arrays):
        if np.any(np.abs(arr[np.isfinite(arr)]) > limit):
            raise DataprepError(f"column {c!r} does not fit in {s.float_dtype} (values overflow; try --float-dtype float64)")
    arrays = {"features": np.stack(f.num_arrays, axis=1).astype(s.float_dtype) if f.num_arrays else np.zeros((n, 0), s.float_dtype)}
    fields: dict[str, Any] = {"features": {"dtype": arrays["features"].dtype.str, "columns": f.num_cols, "shape": [None, len(f.num_cols)]}}
    if f.cat_arrays:
        cats = np.stack(f.cat_arrays, axis=1)
        arrays["categorical"] = cats.astype(smallest_int(0, max(len(v) for v in f.vocabs.values())))
        fields["categorical"] = {"dtype": arrays["categorical"].dtype.str, "columns": f.cat_cols, "vocab_file": VOCAB_FILE,
                                 "sizes": {c: len(v) for c, v in f.vocabs.items()}, "shape": [None, len(f.cat_cols)],
                                 "first_values": {c: [x[:FIRST_CHARS] for x in v[:FIRST_VALUES]] for c, v in f.vocabs.items()}}
    if s.missing == "mask" and f.masks:
        arrays["mask"] = np.stack(f.masks, axis=1).astype(np.uint8)
        fields["mask"] = {"dtype": "|u1", "columns": f.num_cols, "meaning": "1 where the value was missing (stored as 0)"}
    if f.dt_arrays:
        arrays["datetimes"] = np.stack(f.dt_arrays, axis=1).astype("<i8")
        fields["datetimes"] = {"dtype": "<i8", "columns": f.dt_cols, "unit": "seconds since 1970-01-01 UTC"}
    return arrays, fields


def _statistics(arrays: dict[str, np.ndarray], f: _Features, train_rows: np.ndarray) -> tuple[dict[str, Any], dict[str, Any]]:
    """The train split's mean, std, min and max per feature (masked values left out), for the manifest; and
    each categorical column's vocabulary with its train counts, for VOCAB_FILE (as large as the data needs)."""
    stats: dict[str, Any] = {"features": {}, "categorical": {}}
    vocab: dict[str, Any] = {}
    tr = arrays["features"][train_rows]
    mask = arrays.get("mask")
    for j, c in enumerate(f.num_cols):
        v = (tr[:, j] if mask is None else tr[:, j][mask[train_rows][:, j] == 0]).astype(np.float64)
        stats["features"][c] = {"mean": float(v.mean()) if len(v) else 0.0, "std": float(v.std()) if len(v) else 0.0,
                                "min": float(v.min()) if len(v) else 0.0, "max": float(v.max()) if len(v) else 0.0}
    for j, c in enumerate(f.cat_cols):
        counts = np.bincount(arrays["categorical"][train_rows][:, j].astype(np.int64), minlength=len(f.vocabs[c]))
        vocab[c] = {"values": f.vocabs[c], "train_counts": [int(x) for x in counts]}
        stats["categorical"][c] = {"values": len(f.vocabs[c]), "train_rows": int(counts.sum())}
    return stats, vocab


def _filled(s: TableSettings, values: np.ndarray) -> str:
    """How the missing values of a float column were filled, for its description."""
    if s.missing == "mask":
        return "0, masked"
    return f"filled with {'the train mean ' if s.missing == 'mean' else ''}{float(values[0]):.6g}"


def _looks_like_ids(col) -> bool:
    """Text or integers, none missing, every value different, in more than a handful of rows."""
    import pandas as pd

    if len(col) <= ID_MIN_ROWS or not (_is_text(col) or pd.api.types.is_integer_dtype(col)) or pd.api.types.is_bool_dtype(col):
        return False
    return bool(col.notna().all()) and col.nunique() == len(col)


_DATE = re.compile(r"(\d{4}[-/.]\d{1,2}[-/.]\d{1,2}|\d{1,2}[-/]\d{1,2}[-/]\d{2,4}|\d{1,2}\.\d{1,2}\.\d{4})"  # 2021-03-04,
                   r"([ T]\d{1,2}:\d{2}(:\d{2}(\.\d+)?)?)?\s*(Z|[+-]\d{2}:?\d{2})?")  # 4/3/21, 4.3.2021 (not 1.2.10); a time, a zone


def _looks_like_dates(col, sample: int = 1000) -> bool:
    """Text whose distinct values (the first `sample` of them) all have a date's shape and parse as dates."""
    import pandas as pd

    vals = pd.Series(pd.unique(col.dropna().astype(str).str.strip())[:sample], dtype=object)
    if not len(vals) or not vals.str.fullmatch(_DATE).all():
        return False
    return bool(pd.to_datetime(vals, errors="coerce", format="mixed").notna().all())


def _is_text(col) -> bool:
    import pandas as pd

    return (pd.api.types.is_object_dtype(col) or pd.api.types.is_string_dtype(col)
            or isinstance(col.dtype, pd.CategoricalDtype))


def _codes(col, name: str, missing: str, max_categories: int = 0) -> tuple[np.ndarray, list[str], int]:
    """Integer codes of a categorical column, its vocabulary sorted (missing values: their own code,
    "<missing>", under any policy but "error"), and how many rare values share "<other>" (the last code)
    beyond `max_categories`. Values stay Python strings: a fixed-width unicode array would make every
    row as wide as the longest cell (a 50 kB cell in 10 k rows: 2 GB)."""
    import pandas as pd

    isna = col.isna().to_numpy()
    if isna.any() and missing == "error":
        raise DataprepError(f"column {name!r} has {int(isna.sum())} missing values (choose a --missing policy)")
    vals = col.astype(str).to_numpy(dtype=object)
    vals[isna] = "<missing>"
    codes, uniques = pd.factorize(vals, sort=True)  # sorted by code point, as np.unique sorted
    vocab = [str(v) for v in uniques]
    if not max_categories or len(vocab) <= max_categories:
        return codes.astype(np.int64), vocab, 0
    counts = np.bincount(codes, minlength=len(vocab))
    if "<missing>" in vocab and isna.any():
        counts[vocab.index("<missing>")] = len(codes) + 1  # missing values always keep their own code
    keep = np.sort(np.lexsort((np.arange(len(vocab)), -counts))[: max_categories - 1])  # most frequent; ties by value
    remap = np.full(len(vocab), len(keep), np.int64)
    remap[keep] = np.arange(len(keep))
    kept = [vocab[i] for i in keep]
    other = "<other>"
    while other in kept:  # a real value may be spelled so
        other = other[:-1] + "*>"
    return remap[codes], kept + [other], len(vocab) - len(keep)


def _fill(v: np.ndarray, name: str, s: TableSettings, train_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    miss = np.isnan(v)
    if not miss.any():
        return v, miss
    if s.missing == "error":
        raise DataprepError(f"column {name!r} has {int(miss.sum())} missing values (choose a --missing policy)")
    if s.missing == "mean":
        known = v[train_rows & ~miss]
        fill = float(known.mean()) if len(known) else 0.0
    elif s.missing == "value":
        fill = s.fill_value
    else:
        fill = 0.0
    out = v.copy()
    out[miss] = fill
    return out, miss
