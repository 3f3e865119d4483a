"""Volume fields: volumes (pixels of role "volume": (D, H, W), uint8 or uint16, no channel axis), the label
volumes beside them (role "volume_mask"), labels and source paths; the fields of a volume pack."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..errors import PackError
from ..images.field import ImageField, common_fields
from ..pack.fields import Field


def volume_field(shape: tuple[int, int, int] | None, dtype: str, role: str = "volume") -> ImageField:
    """Volumes (or label volumes) of one fixed shape, or each its own."""
    return ImageField("raw", tuple(shape) if shape else None, None, dtype=dtype, role=role)


def fields_of(m: dict[str, Any], where: Path | str = "manifest") -> dict[str, Field]:
    """The volume field (first), its label volumes when the pack has them, labels, source paths."""
    if "volume" not in m["fields"]:
        raise PackError(f"{where}: no volume field")
    out: dict[str, Field] = {"volume": ImageField.from_manifest(m["fields"]["volume"], where)}
    if "volume_mask" in m["fields"]:
        mask = ImageField.from_manifest(m["fields"]["volume_mask"], where)
        if mask.role != "volume_mask":
            raise PackError(f"{where}: the mask field describes a {mask.role!r}")
        out["volume_mask"] = mask
    return {**out, **common_fields(m, where)}


def served_fields(m: dict[str, Any], resolution: int | None = None, where: Path | str = "manifest") -> dict[str, Field]:
    if resolution is not None:
        raise PackError(f"{where}: volume packs have one resolution")
    return fields_of(m, where)


def same_shapes(arrays: dict[str, Any]) -> bool:
    """Whether every label volume has its volume's (D, H, W)."""
    if "volume_mask_shapes" not in arrays:
        return True
    return np.array_equal(np.asarray(arrays["volume_mask_shapes"]), np.asarray(arrays["volume_shapes"]))


def summary(m: dict[str, Any]) -> list[str]:
    """`dataprep info`: the volumes' dtype, shape and how they were resampled; the label volumes."""
    vol, v = m["fields"]["volume"], m["settings"].get("volume", {})
    shape = "x".join("?" if d is None else str(d) for d in vol["shape"][:3]) if vol["layout"] == "fixed" else "each its own"
    out = [f"volumes:   {np.dtype(vol['dtype']).name}, shape {shape}" + (f" ({v.get('resample')})" if v.get("shape") else "")
           + (f", window {v['window'][0]:g}..{v['window'][1]:g}" if v.get("window") else "")
           + (f"; labels {np.dtype(m['fields']['label']['dtype']).name}" if "label" in m["fields"] else "; unlabelled")]
    if "volume_mask" in m["fields"]:
        out.append(f"labels:    label volumes {np.dtype(m['fields']['volume_mask']['dtype']).name}, resampled nearest")
    return out

