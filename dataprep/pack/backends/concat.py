"""What HDF5 and Zarr readers share: a split's arrays are stored concatenated over its shards, and any
shard's array is given back exactly as its npy file held it (offsets made local again), so loaders
and checksums work unchanged. Subclasses say how rows [a, b) of a stored array are read."""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import PackError
from ..shard import npy_header_bytes
from .layout import ArrayPlan, group_path, plan_arrays

ATTACHMENTS = "_files"


class ConcatReader:
    name = "?"
    why_no_map = ""

    def __init__(self, root: Path, manifest: dict[str, Any]):
        self.root, self.manifest = root, manifest
        self._plans: dict[str, dict[str, ArrayPlan]] = {}
        self._index = {split: {str(s["name"]): k for k, s in enumerate(e["shards"])} for split, e in manifest["splits"].items()}

    def plans(self, split: str) -> dict[str, ArrayPlan]:
        if split not in self._plans:
            self._plans[split] = plan_arrays(self.manifest, split)
        return self._plans[split]

    def shard_meta(self, split: str, k: int) -> dict[str, Any]:
        metas = self._split_attr(split, "shard_meta")
        if isinstance(metas, str):
            import json

            metas = json.loads(metas)
        if isinstance(metas, list) and k < len(metas):
            return metas[k]
        s = self.manifest["splits"][split]["shards"][k]
        return {key: v for key, v in s.items() if key not in ("name", "files")}

    def attachments(self) -> dict[str, bytes]:
        """Files an npy pack kept beside its shards, stored as uint8 arrays under `_files/`."""
        return {name: self._whole(f"{ATTACHMENTS}/{name}").tobytes() for name in self._attachment_names()}

    # -- subclasses ------------------------------------------------------------------------------
    def _attachment_names(self) -> list[str]:
        return []

    def _whole(self, key: str) -> np.ndarray:
        raise NotImplementedError

    def _split_attr(self, split: str, key: str) -> Any:
        return None

    def _rows(self, key: str, a: int, b: int, out: np.ndarray) -> None:
        """Rows [a, b) of the stored array at `key` into `out`."""
        raise NotImplementedError

    def _check_extent(self, key: str, shape, dtype, b: int, want: np.ndarray | np.dtype, row_shape: tuple) -> None:
        """The stored array holds at least b rows of `row_shape` in the wanted dtype: rows come from the
        manifest, and must never be read past the end of what is stored (nor from what follows it)."""
        want_dtype = want.dtype if isinstance(want, np.ndarray) else np.dtype(want)
        if len(shape) < 1 or int(shape[0]) < b or tuple(int(x) for x in shape[1:]) != tuple(row_shape):
            raise PackError(f"{self.root}: {key} is stored as {list(shape)}, the manifest needs {b} rows of {list(row_shape)} "
                            "(truncated or replaced)")
        if np.dtype(dtype).newbyteorder("=") != want_dtype.newbyteorder("="):
            raise PackError(f"{self.root}: {key} is stored as {np.dtype(dtype)}, the manifest says {want_dtype}")

    def _map(self, key: str, a: int, b: int) -> np.ndarray:
        raise PackError(f"{self.root}: {self.why_no_map}")

    # -- the reader interface ---------------------------------------------------------------------
    def global_slice(self, split: str, name: str, a: int, b: int) -> np.ndarray:
        p = self.plans(split)[name]
        out = np.empty((max(0, b - a), *p.row_shape), p.dtype)
        if len(out):
            self._rows(group_path(split, name), a, b, out)
        return out

    def whole(self, split: str, name: str, out: np.ndarray) -> np.ndarray:
        """The split's whole concatenated array `name` into `out` (offsets global), in one read."""
        p = self.plans(split)[name]
        out = out.reshape(p.shape)
        if p.total_rows:
            self._rows(group_path(split, name), 0, p.total_rows, out)
        return out

    def map_whole(self, split: str, name: str) -> np.ndarray:
        p = self.plans(split)[name]
        return self._map(group_path(split, name), 0, p.total_rows)

    def _locate(self, path: str | Path) -> tuple[str, int, ArrayPlan]:
        path = Path(path)
        split, shard, name = path.parent.parent.name, path.parent.name, path.stem
        try:
            k = self._index[split][shard]
            return split, k, self.plans(split)[name]
        except KeyError:
            raise PackError(f"{self.root}: the manifest lists no array {name} in {split}/{shard}") from None

    def shard_array(self, split: str, k: int, name: str, verify: bool = False, out: np.ndarray | None = None) -> np.ndarray:
        p = self.plans(split)[name]
        start, rows = p.starts[k], p.shard_rows[k]
        if out is None:
            out = np.empty((rows, *p.row_shape), p.dtype)
        out = out.reshape((rows, *p.row_shape))
        if rows:
            self._rows(group_path(split, name), start, start + rows, out)
        if p.is_offsets and rows:
            out -= int(out[0])  # back to the shard's own offsets
        if verify:
            rec = self.manifest["splits"][split]["shards"][k]["files"][f"{name}.npy"]
            sha = hashlib.sha256(npy_header_bytes(p.dtype.str, tuple(out.shape)))
            sha.update(np.ascontiguousarray(out).reshape(-1).view(np.uint8))
            if sha.hexdigest() != rec["sha256"]:
                raise PackError(f"{self.root}: {split}/{self.manifest['splits'][split]['shards'][k]['name']}/{name} "
                                f"checksum mismatch (sha256 {sha.hexdigest()[:12]}..., manifest {rec['sha256'][:12]}...)")
        return out

    def read(self, path: Path, rec: dict[str, Any], out: np.ndarray | None = None, verify: bool = False) -> np.ndarray:
        split, k, p = self._locate(path)
        if list(rec["shape"]) != [p.shard_rows[k], *p.row_shape] or rec["dtype"] != p.dtype.str:
            raise PackError(f"{path}: the manifest's record disagrees with the stored array")
        if out is not None and out.nbytes != rec["shape"][0] * int(np.prod(p.row_shape, dtype=np.int64)) * p.dtype.itemsize:
            raise PackError(f"{path}: size differs from the manifest's totals")
        return self.shard_array(split, k, p.name, verify, out)

    def map(self, path: Path, rec: dict[str, Any], verify: bool = False) -> np.ndarray:
        split, k, p = self._locate(path)
        if p.is_offsets:
            return self.read(path, rec, None, verify)
        if verify:
            self.shard_array(split, k, p.name, True)
        start = p.starts[k]
        return self._map(group_path(split, p.name), start, start + p.shard_rows[k])

    def reopen(self) -> "ConcatReader":
        """A new reader of the same pack (its own file handles)."""
        return type(self)(self.root)

    def __reduce__(self):  # crosses process boundaries as its path, reopened on arrival
        return (type(self), (self.root,))

    def close(self) -> None:
        pass
