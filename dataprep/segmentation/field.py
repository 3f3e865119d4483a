"""Segmentation fields: the mask field (pixels of role "mask", with the values it may hold: class count, ignore
and pad values) beside each image field, the masks' source paths, and the fields of a segmentation pack."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import PackError
from ..images.field import ImageField, audit_fields, common_fields, resolution_key
from ..images.field import summary as image_summary
from ..pack.fields import Field, StringsField

MASK_SOURCES = StringsField("mask_source", "mask_sources", "mask_source_offsets", "source.mask_root")  # as builds write it


def _mask_sources(m: dict[str, Any], where: Path | str) -> StringsField:
    return StringsField.from_manifest("mask_source", m["fields"]["mask_source"], where)


def mask_key(image_key: str) -> str:
    """The mask field beside an image field: "mask" for "image", "mask@R" for "image@R"."""
    return "mask" + image_key[len("image"):]


@dataclass(frozen=True)
class MaskField(ImageField):
    """Label ids stored as raw pixels (H, W, 1), uint8 or uint16, never interpolated. `num_classes` (when
    declared) bounds the values, except `ignore`; `pad_value` is what padding wrote."""

    role: str = "mask"
    pad_value: int = 0
    ignore: int | None = None
    num_classes: int | None = None

    def to_manifest(self) -> dict[str, Any]:
        return {**super().to_manifest(), "pad_value": self.pad_value, "ignore": self.ignore, "num_classes": self.num_classes}

    @classmethod
    def from_manifest(cls, spec: dict[str, Any], where: Path | str) -> "MaskField":
        f = ImageField.from_manifest(spec, where)
        if f.role != "mask":
            raise PackError(f"{where}: the mask field describes a {f.role!r}")
        try:
            extra = {"pad_value": int(spec.get("pad_value") or 0),
                     "ignore": None if spec.get("ignore") is None else int(spec["ignore"]),
                     "num_classes": None if spec.get("num_classes") is None else int(spec["num_classes"])}
        except (TypeError, ValueError) as e:
            raise PackError(f"{where}: malformed mask field description ({e})") from None
        return cls(f.encoding, f.shape, f.channels, f.suffix, f.dtype, "mask", **extra)

    def check(self, arrays: dict[str, Any], deep: bool = False) -> list[str]:
        data = np.asarray(arrays["masks"]) if self.num_classes else None
        if data is None or not len(data):
            return []
        values = np.unique(data.view(data.dtype.newbyteorder("=")) if data.dtype.byteorder not in "=|" else data)
        bad = values[(values >= self.num_classes) & (values != (-1 if self.ignore is None else self.ignore))]
        if len(bad):
            return [f"{self.name('masks')}.npy: mask values {bad[:8].tolist()} are neither below {self.num_classes} "
                    "classes nor the ignore value"]
        return []

    def describe(self) -> str:
        return (f"masks, {np.dtype(self.dtype).name}, pad value {self.pad_value}, ignore {self.ignore}, "
                f"classes {self.num_classes or 'not declared'}")


def fields_of(m: dict[str, Any], where: Path | str = "manifest") -> dict[str, Field]:
    """Every field of a segmentation pack: each image field with its mask field, both source-path fields."""
    out: dict[str, Field] = {}
    for key, spec in m["fields"].items():
        if key.split("@")[0] == "image":
            out[key] = ImageField.from_manifest(spec, where)
            out[mask_key(key)] = MaskField.from_manifest(m["fields"][mask_key(key)], where)
    if not out:
        raise PackError(f"{where}: no image field")
    return {**out, **common_fields(m, where), "mask_source": _mask_sources(m, where), **audit_fields(m, where)}


def served_fields(m: dict[str, Any], resolution: int | None = None, where: Path | str = "manifest") -> dict[str, Field]:
    """The image field at one resolution (first), its masks, the source paths of both."""
    key = resolution_key(m, resolution, where)
    if mask_key(key) not in m["fields"]:
        raise PackError(f"{where}: no {mask_key(key)} field beside {key}")
    return {key: ImageField.from_manifest(m["fields"][key], where),
            mask_key(key): MaskField.from_manifest(m["fields"][mask_key(key)], where),
            **common_fields(m, where), "mask_source": _mask_sources(m, where)}


def summary(m: dict[str, Any]) -> list[str]:
    """`dataprep info`: how the images were made, and how the masks were stored."""
    how = m.get("mask", {})
    mask = m["fields"][mask_key(resolution_key(m, None, "manifest"))]
    return image_summary(m) + [
        f"masks:     {np.dtype(mask['dtype']).name} ({how.get('chosen_by', '?')}), pad value {mask.get('pad_value')}, ignore {mask.get('ignore')}, "
        f"classes {mask.get('num_classes') or 'not declared'}" + (f", label map {how['labels']['name']}" if how.get("labels") else "")]

