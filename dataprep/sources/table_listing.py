"""The table listing: takes Parquet files, Arrow IPC files and `datasets.save_to_disk` directories (files and
globs, checked by sources/table_inputs.py), gives one split whose samples are their rows, labelled (ClassLabel
names) and captioned from other columns, each recorded as `file.parquet:ROW`, read by sources/parquet.py's
`TableReader`. Only the label and caption columns are read here (parquet.py's `_read_columns`), never the
images; parquet.py's docstring says what is trusted of a file and why. `scan_parquet` is still served from
parquet.py, the listing module of its kind.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import SourceError
from ..limits import IMAGE_MAX_BYTES
from .arrow_checks import _pa
from .listing import Source, labelled_split, skip
from .parquet import TableReader, _read_columns, _schema
from .table_cells import NotUtf8
from .table_inputs import _check_column, _class_label, _hf_features, _image_column, _inputs, _label, table_format


def scan_parquet(files: Sequence[str], split: str = "train", image_column: str = "image", label_column: str | None = None,
                 caption_column: str | None = None, strict: bool = False, max_bytes: int | None = None) -> Source:
    """List the rows of Parquet files, Arrow IPC files and save_to_disk directories (files and globs as
    `expand` takes them, directories as `datasets` writes them) into one split `split`. Labels from
    `label_column` (integers, class names, or a ClassLabel's ints), captions from `caption_column`; rows
    null in either are skipped with their reasons; with `strict`, the first such row refuses the tables
    instead (SourceError naming the row and why). (A null image is found when the build reads it, where
    the build's own strict applies.) `max_bytes`: the cap on one cell's bytes (None: `limits.IMAGE_MAX_BYTES`),
    the images' when they are read and the labels' and captions' here."""
    cap = IMAGE_MAX_BYTES if max_bytes is None else max_bytes
    inputs, dirs = _inputs(files, split)
    if not inputs:
        raise SourceError(f"{', '.join(map(str, files)) or 'no files given'}: no table files")
    base = Path(os.path.commonpath([str(p.resolve().parent) for p, _ in inputs] + [str(d.resolve()) for d in dirs]))
    tables, names_seen = [], {}
    for path, saved_features in inputs:
        fmt = table_format(path)
        try:
            schema = _schema(str(path), fmt)
        except (_pa().ArrowException, OSError, ValueError) as e:  # ValueError: names pyarrow cannot decode
            raise SourceError(f"{path}: unreadable as {fmt} ({e})") from None
        _image_column(path, schema, image_column)
        if label_column:
            _check_column(path, schema, label_column, "--label-column", ("int", "str"))
            names = _class_label(_hf_features(schema) or saved_features, label_column)
            if names is not None:
                names_seen.setdefault(tuple(names), path)
        if caption_column:
            _check_column(path, schema, caption_column, "--caption-column", ("str",))
        tables.append((path, os.path.relpath(path.resolve(), base), fmt))
    if len(names_seen) > 1:
        (a, fa), (b, fb) = list(names_seen.items())[:2]
        raise SourceError(f"{fa} and {fb}: their ClassLabel features name different classes ({list(a)[:5]} ... and "
                          f"{list(b)[:5]} ...); build them as separate packs")
    names = list(next(iter(names_seen))) if names_seen else None  # a table without the metadata takes the others'
    columns = [c for c in (label_column, caption_column) if c]
    refs, locators, units, raw_labels, captions, skipped = [], [], [], [], [], []
    u = 0
    for path, rel, fmt in tables:
        try:
            rows, values, over = _read_columns(str(path), fmt, columns, image_column, cap)
        except (_pa().ArrowException, OSError, ValueError) as e:
            raise SourceError(f"{path}: unreadable as {fmt} ({e})") from None
        row = 0
        for unit, n in enumerate(rows):
            for r in range(n):
                ref = f"{rel}:{row}"
                label = values[label_column][row] if label_column else None
                caption = values[caption_column][row] if caption_column else None
                row += 1
                if row - 1 in over:
                    skip(skipped, {"source": ref, "reason": "too large", "detail": over[row - 1]}, strict)
                    continue
                bad = [(what, c, v) for what, c, v in (("bad label", label_column, label), ("bad caption", caption_column, caption))
                       if isinstance(v, NotUtf8)]
                if bad:  # as labelled_split skips a caption that is not Unicode text
                    what, c, v = bad[0]
                    skip(skipped, {"source": ref, "reason": what, "detail": f"column {c!r}: {v.detail}"}, strict)
                    continue
                refs.append(ref)
                locators.append((rel, fmt, unit, r, image_column))
                units.append(u)
                raw_labels.append(_label(label, ref, names) if label_column else None)
                captions.append(caption)
            u += 1
    if not refs:
        raise SourceError(f"{', '.join(map(str, files))}: no rows in {len(tables)} table file(s)")
    source = labelled_split(
        "parquet", base, split, refs, raw_labels, captions, skipped,
        {"files": [rel for _, rel, _ in tables], "formats": sorted({fmt for _, _, fmt in tables}),
         "image_column": image_column, **({"label_column": label_column} if label_column else {}),
         **({"caption_column": caption_column} if caption_column else {}),
         **({"classes_from": "ClassLabel"} if names else {})},
        reader=TableReader(max_bytes=max_bytes), locators=locators, units=np.asarray(units, np.int64), strict=strict)
    if names and source.classes:  # labelled: the labels index the ClassLabel's names
        source.classes = names
    return source
