"""The image field: both directions of images, masks and volumes in a pack (JPEG bytes or raw pixels, fixed
shape or a blob plus offsets, every sample's shape), and how the field describes itself in the manifest."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import PackError
from ..pack.fields import BYTES, OFFSETS, SHAPES, LoadContext, blob_arrays, blob_shapes, load_blob, load_rows, rows_shape


# What each role's arrays are called: the generic keys a field's `load` returns (its stored names add the
# field's suffix). Distinct per role, so one split's fields load into one flat dict.
ROLE_ARRAYS = {
    "image": ("images", "offsets", "shapes"),
    "mask": ("masks", "mask_offsets", "mask_shapes"),
    "volume": ("volumes", "volume_offsets", "volume_shapes"),
    "volume_mask": ("volume_masks", "volume_mask_offsets", "volume_mask_shapes"),  # label volumes beside volumes
}


PIXEL_DTYPES = ("|u1", "<u2")


def mask_key_of(key: str) -> str | None:
    """The manifest's mask field beside a served field: "mask" for "image", "mask@R" for "image@R",
    "volume_mask" for "volume"."""
    base = key.split("@")[0]
    return "mask" + key[len("image"):] if base == "image" else ("volume_mask" if base == "volume" else None)


@dataclass(frozen=True)
class ImageField:
    """Images (or masks, or volumes), stored as JPEG bytes (`jpeg`) or decoded pixels (`raw`, uint8 or
    little-endian uint16); samples of one fixed shape are one (N, *shape) array, anything else a blob of
    bytes plus byte offsets, with every sample's shape, three ints ((H, W, C), or (D, H, W) for
    volumes), in `shapes`."""

    encoding: str  # "jpeg" | "raw"
    shape: tuple[int, int, int] | None  # fixed shape of raw samples, else None
    channels: int | None  # 1 or 3; None for volumes (no channel axis)
    suffix: str = ""  # array-name suffix of one resolution of a multi-resolution pack ("_r128")
    dtype: str = "|u1"
    role: str = "image"

    def name(self, key: str) -> str:
        """The stored array name of generic key `key` (one of this role's ROLE_ARRAYS)."""
        return key + self.suffix

    @property
    def keys(self) -> tuple[str, str, str]:
        """Generic keys: (data, offsets, shapes)."""
        return ROLE_ARRAYS[self.role]

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(self.dtype)

    @property
    def fixed(self) -> bool:
        return self.encoding == "raw" and self.shape is not None

    def to_manifest(self) -> dict[str, Any]:
        data, offs, shapes = self.keys
        return {
            "role": self.role,
            "encoding": self.encoding,
            "layout": "fixed" if self.fixed else "blob",
            "dtype": self.dtype,
            "shape": list(self.shape) if self.fixed else [None, None, self.channels],
            "channels": self.channels,
            "suffix": self.suffix,
            "arrays": [self.name(a) for a in ([data, shapes] if self.fixed else [data, offs, shapes])],
        }

    @classmethod
    def from_manifest(cls, spec: dict[str, Any], where: Path) -> "ImageField":
        try:
            enc, role = spec["encoding"], str(spec.get("role", "image"))
            channels = None if spec["channels"] is None else int(spec["channels"])
            shape = tuple(int(x) for x in spec["shape"]) if spec["layout"] == "fixed" else None
            suffix, dtype = str(spec.get("suffix", "")), str(spec.get("dtype", "|u1"))
        except (KeyError, TypeError, ValueError) as e:
            raise PackError(f"{where}: malformed image field description ({e})") from None
        if (enc not in ("jpeg", "raw") or role not in ROLE_ARRAYS or dtype not in PIXEL_DTYPES
                or channels not in ((None,) if role.startswith("volume") else (1, 3))
                or (suffix and not re.fullmatch(r"_r\d+", suffix)) or (enc == "jpeg" and dtype != "|u1")):
            raise PackError(f"{where}: unknown {role} field: encoding {enc!r}, dtype {dtype!r}, channel count "
                            f"{channels} or suffix {suffix!r}")
        return cls(enc, shape, channels, suffix, dtype, role)

    def shard_arrays(self, items: Sequence[np.ndarray], shapes: Sequence[tuple[int, int, int]]) -> dict[str, np.ndarray]:
        data, offs, shp_key = self.keys
        shp = np.asarray(shapes, SHAPES).reshape(len(shapes), 3)
        if self.fixed:
            pix = np.stack(items) if items else np.zeros((0, *self.shape), self.np_dtype)
            return {self.name(data): pix.astype(self.np_dtype, copy=False), self.name(shp_key): shp}
        items = [np.ascontiguousarray(x, self.np_dtype) if self.encoding == "raw" else x for x in items]
        return {**blob_arrays(items, self.name(data), self.name(offs)), self.name(shp_key): shp}

    def layout(self, split_dir: Path, shards: list[dict]) -> list[tuple[str, tuple[int, ...], np.dtype]]:
        """Every array `load` allocates: (stored name, shape, dtype), in load order."""
        data, offs, shp_key = self.keys
        out = [(self.name(shp_key), rows_shape(shards, (3,)), SHAPES)]
        if self.fixed:
            return out + [(self.name(data), rows_shape(shards, self.shape), self.np_dtype)]
        blob, offsets = blob_shapes(split_dir, shards, self.name(data), self.name(offs))
        return out + [(self.name(data), blob, BYTES), (self.name(offs), offsets, OFFSETS)]

    def load(self, split_dir: Path, shards: list[dict], ctx: LoadContext | None = None) -> dict[str, Any]:
        """The arrays of `layout`, by generic key (e.g. images, offsets, shapes): the data key is the
        (N, *shape) samples when `fixed`, else the byte blob."""
        ctx = ctx or LoadContext()
        data, offs, shp_key = self.keys
        shapes = load_rows(split_dir, shards, self.name(shp_key), SHAPES, (3,), ctx)
        if self.fixed:
            pixels = load_rows(split_dir, shards, self.name(data), self.np_dtype, self.shape, ctx, map_data=ctx.map_images)
            return {data: pixels, shp_key: shapes}
        blob, offsets = load_blob(split_dir, shards, self.name(data), self.name(offs), ctx, map_data=ctx.map_images)
        if len(shapes) and (np.any(shapes <= 0) or (self.channels is not None and np.any(shapes[:, 2] != self.channels))):
            raise PackError(f"{split_dir}: {self.name(shp_key)}.npy holds non-positive sizes or a channel count other than {self.channels}")
        if self.encoding == "raw" and not np.array_equal(np.diff(offsets), shapes.prod(axis=1) * self.np_dtype.itemsize):
            raise PackError(f"{split_dir}: raw {self.role} sizes disagree with their shapes")
        return {data: blob, offs: offsets, shp_key: shapes}

    def sample(self, arrays: dict[str, Any], i: int) -> np.ndarray:
        """Sample i's stored form as a view: pixels (fixed or raw) in their shape and dtype, or JPEG bytes."""
        data, offs, shp_key = self.keys
        if self.fixed:
            return arrays[data][i]
        buf = arrays[data][arrays[offs][i] : arrays[offs][i + 1]]
        if self.encoding == "raw":
            return buf.view(self.np_dtype).reshape(arrays[shp_key][i])
        return buf
