"""Table fields: each column group of a table pack (float features, categorical codes, the missing-value mask,
datetimes, the target) is one fixed-width array per split, a `RowsField`; the manifest describes each
with its dtype and columns."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..errors import PackError
from ..pack.fields import Field, RowsField

ARRAYS = ("features", "categorical", "mask", "datetimes", "target")  # in the manifest's "fields", when present


def fields_of(m: dict[str, Any], where: Path | str = "manifest") -> dict[str, Field]:
    """One RowsField per stored column group: (N, columns) arrays, and the target (N,)."""
    out: dict[str, Field] = {}
    try:
        for name in ARRAYS:
            spec = m["fields"].get(name)
            if spec is not None:
                width = () if name == "target" else (len(spec["columns"]),)
                out[name] = RowsField(name, np.dtype(spec["dtype"]).str, width)
    except (KeyError, TypeError, ValueError) as e:
        raise PackError(f"{where}: malformed table field description ({type(e).__name__}: {e})") from None
    if "features" not in out or "target" not in out:
        raise PackError(f"{where}: a table pack has features and a target")
    return out



def served_fields(m: dict[str, Any], resolution: int | None = None, where: Path | str = "manifest") -> dict[str, Field]:
    """What a dataset holds: every field (one resolution only)."""
    return fields_of(m, where)


def dropped_rows(rows: dict[str, Any] | None) -> str:
    """The manifest's "rows" record in words: "dropped 3 rows with a missing target" (or none dropped)."""
    dropped = (rows or {}).get("dropped", {})
    return ", ".join(f"dropped {n} row{'s' if n != 1 else ''} with a {why}" for why, n in dropped.items()) or "no rows dropped"


def summary(m: dict[str, Any]) -> list[str]:
    """`dataprep info` lines: the column groups and target, the missing-value policy, dropped rows, and every
    column's type (categorical ones with their size and first values). Packs made before a record existed
    show what they have."""
    f = m["fields"]
    t = f["target"]
    cat = f.get("categorical", {})
    st = m.get("settings", {})
    lines = [(f"table:     {len(f['features']['columns'])} features ({np.dtype(f['features']['dtype']).name}), "
              f"{len(cat.get('columns', []))} categorical, target {t.get('column')!r} ({t.get('task')}, "
              f"{np.dtype(t['dtype']).name if t.get('dtype') else None})")]
    policy = st.get("missing", "error")
    lines.append(f"missing:   {policy}: {_POLICY.get(policy, '').format(st.get('fill_value'))}"
                 + (f"; the mask covers {len(f['mask']['columns'])} feature columns" if "mask" in f else ""))
    read = m.get("rows", {}).get("read")
    lines.append("rows:      " + (f"{read} read, " if read is not None else "") + dropped_rows(m.get("rows")))
    first = cat.get("first_values") or cat.get("vocab") or {}
    sizes = cat.get("sizes") or {c: len(v) for c, v in cat.get("vocab", {}).items()}
    lines.append("columns:")
    for c, what in f.get("conversions", {}).items():
        vals = first.get(c)
        if vals is not None:
            shown = f" ({', '.join(map(str, vals[:_FIRST]))}{', ...' if sizes.get(c, len(vals)) > len(vals[:_FIRST]) else ''})"
            head, values, rest = what.partition(" values")  # "categorical with N values (a, b, ...); a note"
            what = f"{head}{values}{shown}{rest}" if values else what + shown
        lines.append(f"  {c}: {what}")
    return lines


_FIRST = 5  # vocabulary values shown per categorical column
_POLICY = {"error": "a missing feature value fails the build", "mean": "filled with the train split's mean",
           "value": "filled with {}", "mask": "filled with 0, and a mask array marks them"}
