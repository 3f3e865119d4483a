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


def summary(m: dict[str, Any]) -> list[str]:
    f = m["fields"]
    t = f["target"]
    cats = len(f.get("categorical", {}).get("columns", []))
    return [f"table:     {len(f['features']['columns'])} features ({f['features']['dtype']}), {cats} categorical, "
            f"target {t.get('column')!r} ({t.get('task')}, {t.get('dtype')})"]

