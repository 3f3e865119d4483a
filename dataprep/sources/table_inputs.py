"""What a table listing is given, checked: takes the files, globs and `datasets.save_to_disk` directories
scan_parquet is given and each table's schema, gives every table file once with its format (`table_format`)
and the features its save_to_disk directory declares (`_inputs`), the class names of a `ClassLabel`
feature (`_class_label`, from the schema's b"huggingface" metadata: `_hf_features`), the image, label and
caption columns checked (`_image_column`, `_check_column`: a column of URLs is refused, dataprep does not
download), and a label cell as labelled_split takes it (`_label`: a ClassLabel's -1 is no label).

sources/parquet.py lists tables through these.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

from ..errors import SourceError
from .arrow_checks import ARROW_FILE, ARROW_STREAM, PARQUET, _pa
from .listing import expand
from .table_cells import _is_bytes

IMG2DATASET = "https://github.com/rom1504/img2dataset"


def table_format(path: str | os.PathLike) -> str:
    """PARQUET, ARROW_FILE or ARROW_STREAM, from the file's first bytes (a stream has no magic: it is
    what opens as one)."""
    with open(path, "rb") as f:
        head = f.read(8)
    if head[:4] == b"PAR1":
        return PARQUET
    if head[:6] == b"ARROW1":
        return ARROW_FILE
    pa = _pa()
    try:
        with pa.memory_map(str(path)) as m:
            pa.ipc.open_stream(m)
    except (pa.ArrowException, OSError, ValueError) as e:
        raise SourceError(f"{path}: neither Parquet nor an Arrow IPC file or stream ({e})") from None
    return ARROW_STREAM


def _hf_features(schema) -> dict | None:
    """The `features` that `datasets` writes into a table's schema metadata, or None."""
    raw = (schema.metadata or {}).get(b"huggingface")
    if not raw:
        return None
    try:
        feats = json.loads(raw.decode("utf-8")).get("info", {}).get("features")
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return None
    return feats if isinstance(feats, dict) else None


def _class_label(features: dict | None, column: str) -> list[str] | None:
    """The names of a ClassLabel feature `column`, or None."""
    f = (features or {}).get(column)
    if isinstance(f, dict) and f.get("_type") == "ClassLabel" and isinstance(f.get("names"), list):
        return [str(n) for n in f["names"]]
    return None


def _saved_dataset(folder: Path, split: str) -> tuple[list[Path], dict | None]:
    """The Arrow files of a `datasets.save_to_disk` directory (a Dataset's, or the split `split` of a
    DatasetDict's) and the features of its dataset_info.json."""
    if (folder / "dataset_dict.json").is_file() and not (folder / "state.json").is_file():
        try:
            splits = json.loads((folder / "dataset_dict.json").read_text())["splits"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SourceError(f"{folder / 'dataset_dict.json'}: unreadable ({e})") from None
        if split not in splits:
            raise SourceError(f"{folder}: a DatasetDict with splits {', '.join(map(str, splits))}, not {split!r}; "
                              "pass --split with one of them")
        folder = folder / split
    state_path = folder / "state.json"
    if not state_path.is_file():
        raise SourceError(f"{folder}: a directory, but not one written by datasets.save_to_disk (no state.json or "
                          f"dataset_dict.json); for a folder of Parquet files give a glob such as '{folder}/*.parquet'")
    try:
        state = json.loads(state_path.read_text())
        names = [d["filename"] for d in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SourceError(f"{state_path}: no list of data files ({e})") from None
    if state.get("_indices_data_files"):
        raise SourceError(f"{state_path}: the dataset is a selection of rows through an indices file; save it again "
                          "after dataset.flatten_indices()")
    files = []
    for name in names:
        p = folder / name
        if os.path.dirname(os.path.normpath(name)) or not p.is_file():
            raise SourceError(f"{state_path}: lists {name!r}, which is not a file in {folder}")
        files.append(p)
    features = None
    info = folder / "dataset_info.json"
    if info.is_file():
        try:
            features = json.loads(info.read_text()).get("features")
        except (OSError, ValueError, AttributeError):
            features = None
    return files, features if isinstance(features, dict) else None


def _inputs(patterns: Sequence[str], split: str) -> tuple[list[tuple[Path, dict | None]], list[Path]]:
    """(file, save_to_disk features or None) for every table the patterns name, and the directories given."""
    out, dirs = [], []
    for pattern in patterns:
        if os.path.isdir(pattern):
            files, features = _saved_dataset(Path(pattern), split)
            out += [(f, features) for f in files]
            dirs.append(Path(pattern))
            continue
        out += [(f, None) for f in expand([pattern])]
    seen, unique = set(), []
    for f, feats in out:
        if f.resolve() not in seen:
            seen.add(f.resolve())
            unique.append((f, feats))
    return unique, dirs


def _image_column(path, schema, column: str) -> None:
    """Refuse an image column that is missing or holds no image bytes."""
    pa = _pa()
    if column not in schema.names:
        raise SourceError(f"{path}: no column {column!r} (columns: {', '.join(schema.names)}); pass --image-column")
    t = schema.field(column).type
    if _is_bytes(t) or (pa.types.is_struct(t) and t.get_field_index("bytes") >= 0 and _is_bytes(t.field("bytes").type)):
        return
    if pa.types.is_string(t) or pa.types.is_large_string(t) or getattr(pa.types, "is_string_view", lambda t: False)(t):
        raise SourceError(
            f"{path}: column {column!r} holds text (URLs or paths), not image bytes. dataprep does not download "
            f"images: fetch them first with img2dataset ({IMG2DATASET}), which writes WebDataset tars or Parquet "
            "with the image bytes, and build from those")
    raise SourceError(f"{path}: column {column!r} is {t}, not image bytes (binary, or a struct with a binary "
                      "'bytes' field as Hugging Face's Image feature stores it)")


def _check_column(path, schema, column: str, option: str, kinds: tuple[str, ...]) -> None:
    pa = _pa()
    if column not in schema.names:
        raise SourceError(f"{path}: no column {column!r} (columns: {', '.join(schema.names)}); pass {option}")
    t = schema.field(column).type
    if pa.types.is_dictionary(t):
        t = t.value_type
    ok = {"int": pa.types.is_integer(t) or pa.types.is_floating(t),
          "str": pa.types.is_string(t) or pa.types.is_large_string(t)
          or getattr(pa.types, "is_string_view", lambda t: False)(t)}
    if not any(ok[k] for k in kinds):
        want = "integers or class names" if "int" in kinds else "text"
        raise SourceError(f"{path}: column {column!r} ({option}) is {t}, not {want}")


def _label(value: Any, ref: str, names: list[str] | None):
    """A label as labelled_split takes it (int, class name or None) from a column's value."""
    if value is None or value != value:  # null, or NaN (pandas' missing value)
        return None
    if isinstance(value, float):
        if not value.is_integer():
            raise SourceError(f"{ref}: label {value} is not an integer")
        value = int(value)
    if names is not None and isinstance(value, int):
        if value == -1:
            return None  # ClassLabel's "no label"
        if not 0 <= value < len(names):
            raise SourceError(f"{ref}: label {value} is outside the ClassLabel's {len(names)} names")
    return value
