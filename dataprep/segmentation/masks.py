"""Mask stage: takes a mask file's bytes (and the image's geometry), gives an HxW uint8/uint16 label array
in the pack's geometry.

Label values are never interpolated: a palette PNG keeps its indices (it is not converted to RGB),
16-bit masks keep their values, colour masks are mapped to ids through a table, and resizing is
nearest-neighbour by pixel centres (the convention of the area filter that scales the image, so mask
and image stay aligned), with exact integer index arithmetic. An optional `LabelMap` remaps ids (for example
Cityscapes ids to train ids) with an ignore value.
"""
from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from ..errors import DataprepError, ImageDecodeError
from ..images import resize
from ..images.decode import sniff, upright

MASK_DTYPES = {"uint8": "|u1", "uint16": "<u2"}
UNMAPPED = ("ignore", "keep", "skip")


@dataclass(frozen=True)
class LabelMap:
    """Source ids -> stored ids. Values not in `table`: `unmapped` = ignore (become `ignore`), keep (stay as
    they are) or skip (the sample is skipped). `colors` maps RGB triples of colour masks to source ids."""

    table: dict[int, int] = field(default_factory=dict)
    ignore: int | None = None
    unmapped: str = "ignore"
    classes: tuple[str, ...] = ()
    colors: dict[tuple[int, int, int], int] = field(default_factory=dict)
    name: str = ""

    def __post_init__(self) -> None:
        if self.unmapped not in UNMAPPED:
            raise DataprepError(f"label map: unmapped must be one of {list(UNMAPPED)}, got {self.unmapped!r}")
        if self.unmapped == "ignore" and self.ignore is None:
            raise DataprepError("label map: unmapped: ignore needs an ignore value")
        values = [*self.table.keys(), *self.table.values(), *self.colors.values()] + ([self.ignore] if self.ignore is not None else [])
        if any(not 0 <= int(v) <= 65535 for v in values):
            raise DataprepError("label map: ids must be between 0 and 65535")

    @property
    def max_value(self) -> int:
        """The largest value a remapped mask can hold (65535 when unmapped values are kept)."""
        if self.unmapped == "keep":
            return 65535
        return max([*self.table.values(), *([self.ignore] if self.ignore is not None else []), 0])

    @classmethod
    def load(cls, path: str | Path) -> "LabelMap":
        import yaml

        path = Path(path)
        try:
            d = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            colors = {tuple(int(c) for c in str(k).split(",")): int(v) for k, v in (d.get("colors") or {}).items()}
            if any(len(k) != 3 for k in colors):
                raise ValueError("colors are 'R,G,B' keys")
            return cls(
                table={int(k): int(v) for k, v in (d.get("map") or {}).items()},
                ignore=None if d.get("ignore") is None else int(d["ignore"]),
                unmapped=str(d.get("unmapped", "ignore" if d.get("ignore") is not None else "keep")),
                classes=tuple(str(c) for c in d.get("classes") or ()),
                colors=colors, name=str(d.get("name", path.stem)),
            )
        except (OSError, ValueError, TypeError, AttributeError) as e:
            raise DataprepError(f"{path}: not a label map ({e})") from None
        except yaml.YAMLError as e:
            raise DataprepError(f"{path}: not YAML ({e})") from None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "map": {str(k): v for k, v in sorted(self.table.items())}, "ignore": self.ignore,
                "unmapped": self.unmapped, "classes": list(self.classes),
                "colors": {",".join(map(str, k)): v for k, v in sorted(self.colors.items())}}

    def apply(self, ids: np.ndarray, path: str) -> np.ndarray:
        """Remap an id array through a 65536-entry lookup table (one pass, any size)."""
        if not self.table and self.unmapped == "keep":
            return ids
        lut = np.arange(65536, dtype=np.int32)
        if self.unmapped == "ignore":
            lut[:] = self.ignore
        elif self.unmapped == "skip":
            lut[:] = -1
        for k, v in self.table.items():
            lut[k] = v
        out = lut[ids]
        if self.unmapped == "skip" and np.any(out < 0):
            bad = np.unique(ids[out < 0])[:8].tolist()
            raise ImageDecodeError(path, "unmapped label", f"ids {bad} are not in the label map")
        return out


@dataclass(frozen=True)
class MaskSettings:
    """How masks are stored: dtype (uint8 or uint16), the value padding takes, an optional class count
    (values >= it other than `ignore` are out of range), and the label map."""

    dtype: str = "|u1"
    pad_value: int = 0
    num_classes: int | None = None
    labels: LabelMap | None = None

    @property
    def max_value(self) -> int:
        return int(np.iinfo(np.dtype(self.dtype)).max)

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "pad_value": self.pad_value, "num_classes": self.num_classes,
                "labels": self.labels.to_dict() if self.labels else None}


def decode_mask(data: bytes, path: str, colors: dict[tuple[int, int, int], int] | None = None) -> np.ndarray:
    """A mask file's label ids as HxW int32, upright (its own EXIF orientation applied)."""
    if not data:
        raise ImageDecodeError(path, "empty file")
    fmt = sniff(data)
    if fmt is None:
        raise ImageDecodeError(path, "not an image", "unrecognised header")
    if fmt == "JPEG":
        raise ImageDecodeError(path, "lossy mask", "a JPEG mask holds blurred labels; store masks as PNG or TIFF")
    try:
        im = Image.open(io.BytesIO(data))
        im.load()
    except Exception as e:
        raise ImageDecodeError(path, "corrupt data", f"{type(e).__name__}: {e}") from None
    try:
        orientation = int(im.getexif().get(0x0112, 1))
    except Exception:
        orientation = 1
    mode = im.mode
    if mode in ("P", "L", "1") or mode.startswith("I"):
        ids = np.asarray(im).astype(np.int32)  # palette indices, not colours
    elif mode == "LA":
        ids = np.asarray(im)[:, :, 0].astype(np.int32)
    elif mode in ("RGB", "RGBA"):
        rgb = np.asarray(im)[:, :, :3]
        if not colors:
            if np.array_equal(rgb[:, :, 0], rgb[:, :, 1]) and np.array_equal(rgb[:, :, 0], rgb[:, :, 2]):
                ids = rgb[:, :, 0].astype(np.int32)  # grey saved as RGB
            else:
                raise ImageDecodeError(path, "colour mask", "an RGB mask needs `colors` in the label map to become ids")
        else:
            ids = _colors_to_ids(rgb, colors, path)
    else:
        raise ImageDecodeError(path, "unsupported mode", f"mask mode {mode}")
    if ids.ndim != 2 or ids.min(initial=0) < 0 or ids.max(initial=0) > 65535:
        raise ImageDecodeError(path, "unsupported mode", "mask values outside 0..65535")
    ids = upright(ids[:, :, None], orientation)[:, :, 0]
    return np.ascontiguousarray(ids)


def _colors_to_ids(rgb: np.ndarray, colors: dict[tuple[int, int, int], int], path: str) -> np.ndarray:
    packed = (rgb[:, :, 0].astype(np.int32) << 16) | (rgb[:, :, 1].astype(np.int32) << 8) | rgb[:, :, 2]
    keys = np.array([(r << 16) | (g << 8) | b for r, g, b in colors], np.int64)
    vals = np.array(list(colors.values()), np.int32)
    order = np.argsort(keys)
    keys, vals = keys[order], vals[order]
    pos = np.clip(np.searchsorted(keys, packed), 0, len(keys) - 1)
    found = keys[pos] == packed
    if not found.all():
        bad = np.unique(packed[~found])[:4]
        raise ImageDecodeError(path, "unknown colour",
                               "colours " + ", ".join(f"{v >> 16},{(v >> 8) & 255},{v & 255}" for v in bad) + " are not in the label map")
    return vals[pos]


def check_values(ids: np.ndarray, settings: MaskSettings, path: str) -> np.ndarray:
    """Remap (with a label map), then check every value fits the stored dtype and the class count; give
    the mask in the stored dtype. A violation is an ImageDecodeError("label out of range")."""
    if settings.labels is not None:
        ids = settings.labels.apply(ids, path)
    top = int(ids.max(initial=0))
    if top > settings.max_value:
        raise ImageDecodeError(path, "label out of range",
                               f"holds {top}, more than {np.dtype(settings.dtype).name} holds; pass --mask-dtype uint16")
    if settings.num_classes is not None:
        ignore = settings.labels.ignore if settings.labels else None
        bad = (ids >= settings.num_classes) & (ids != (ignore if ignore is not None else -1))
        if bad.any():
            raise ImageDecodeError(path, "label out of range",
                                   f"holds {int(ids[bad].max())}, but there are {settings.num_classes} classes")
    return ids.astype(np.dtype(settings.dtype))


def resize_mask(mask: np.ndarray, geom: resize.Geometry, pad_value: int) -> np.ndarray:
    """Nearest-neighbour to `geom.scaled` by pixel centres (the convention of the area filter that scales
    the image), then the image's crop and pad (padding with `pad_value`)."""
    h, w = geom.scaled
    if mask.shape[:2] != (h, w):
        mask = mask[resize.nearest_index(h, mask.shape[0])][:, resize.nearest_index(w, mask.shape[1])]
    return resize.crop_pad(mask[:, :, None], geom, pad_value)[:, :, 0]
