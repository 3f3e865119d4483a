"""HDF5 backend: one file per pack.

Schema (h5py alone opens it): one group per split, and inside it one subgroup per resolution of a
multi-resolution pack (`r128/`, ...); in each, the split's arrays concatenated over its shards:
`images` (JPEG bytes as one uint8 blob, or raw pixels (N, H, W, C)), `offsets` (N + 1 int64: sample i
is images[offsets[i]:offsets[i + 1]]), `shapes` (N x 3), `labels`, `sources` + `source_offsets` (UTF-8
paths), and whatever other arrays the pack's fields store (masks, volumes, `tokens` + `doc_offsets`, table
columns). Each dataset's attribute
`layout` says "rows" or "offsets" (with `offsets_of`). Files an npy pack keeps beside its shards (the
tokenizer a token pack trained) are uint8 datasets under `_files/`. The root's attribute `dataprep_manifest` is
the manifest as JSON; `format`, `format_version`, `kind` and `backend` are plain attributes too.

Datasets are contiguous and uncompressed by default, so cache="mmap" maps them straight from the
file; `gzip` or `lzf` compression (chunked) is offered, and then mmap is refused.

Parallel writing: builds write npy shards in parallel (atomic, resumable, retried on any engine) and
the finished shards are merged into the file at the end, sequentially at disk speed. HDF5 has no
safe concurrent writers without MPI, and virtual datasets over one file per shard could not rebase
the offsets, and would not be one file.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import DataprepError, PackError
from .concat import ATTACHMENTS, ConcatReader
from .layout import group_path

COMPRESSION = ("none", "gzip", "lzf")


def _h5py():
    try:
        import h5py
    except ImportError as e:
        raise DataprepError(f"HDF5 packs need h5py: pip install h5py ({e})") from None
    return h5py


def _read_at(path: Path, offset: int, view: np.ndarray, key: str) -> None:
    mv, got = memoryview(view), 0
    with open(path, "rb", buffering=0) as f:
        f.seek(offset)
        while got < len(mv):
            n = f.readinto(mv[got : got + (16 << 20)])
            if not n:
                raise PackError(f"{path}: {key} ends beyond the end of the file (truncated)")
            got += n


class Hdf5Reader(ConcatReader):
    """Reads an HDF5 pack: uncompressed contiguous datasets straight from the file, the rest through h5py."""

    name = "hdf5"

    def __init__(self, root: Path):
        h5py = _h5py()
        try:
            self.f = h5py.File(root, "r")
            raw = self.f.attrs["dataprep_manifest"]
        except KeyError:
            raise PackError(f"{root}: an HDF5 file without a dataprep manifest (not a finished pack)") from None
        except OSError as e:
            raise PackError(f"{root}: cannot open as HDF5 ({e}); truncated or damaged") from None
        from ..manifest import check_manifest

        try:
            manifest = json.loads(raw)
        except (TypeError, ValueError) as e:
            raise PackError(f"{root}: the dataprep_manifest attribute is not JSON ({e})") from None
        super().__init__(root, check_manifest(manifest, root))

    def _attachment_names(self) -> list[str]:
        return sorted(self.f[ATTACHMENTS].keys()) if ATTACHMENTS in self.f else []

    def _whole(self, key: str) -> np.ndarray:
        return self._dset(key)[...]

    def _split_attr(self, split: str, key: str):
        try:
            return self.f[split].attrs.get(key)
        except KeyError:
            return None

    def _dset(self, key: str):
        try:
            return self.f[key]
        except KeyError:
            raise PackError(f"{self.root}: no dataset {key}") from None

    def _rows(self, key: str, a: int, b: int, out: np.ndarray) -> None:
        d = self._dset(key)
        self._check_extent(key, d.shape, d.dtype, b, out, out.shape[1:])
        offset = d.id.get_offset() if d.chunks is None else None
        row = int(np.prod(d.shape[1:], dtype=np.int64)) * d.dtype.itemsize
        if offset is not None and out.flags.c_contiguous and out.dtype == d.dtype:
            # contiguous and uncompressed: the bytes lie in the file as they are; read them straight in
            _read_at(self.root, offset + a * row, out.reshape(-1).view(np.uint8), key)
            return
        try:
            d.read_direct(out, np.s_[a:b], np.s_[0 : b - a])
        except (OSError, ValueError, TypeError) as e:
            raise PackError(f"{self.root}: cannot read {key}[{a}:{b}] ({e}); the file is truncated or damaged") from None

    def _map(self, key: str, a: int, b: int) -> np.ndarray:
        d = self._dset(key)
        self._check_extent(key, d.shape, d.dtype, b, d.dtype, tuple(d.shape[1:]))
        offset = d.id.get_offset()
        if offset is None or d.compression is not None or d.chunks is not None:
            raise PackError(f"{self.root}: {key} is chunked or compressed; cache='mmap' needs contiguous uncompressed "
                            "datasets (use cache='ram' or 'shm')")
        row = int(np.prod(d.shape[1:], dtype=np.int64)) * d.dtype.itemsize
        if b <= a:
            return np.empty((0, *d.shape[1:]), d.dtype)
        if offset + b * row > os.path.getsize(self.root):
            raise PackError(f"{self.root}: {key} ends beyond the end of the file (truncated)")
        return np.memmap(self.root, dtype=d.dtype, mode="r", offset=offset + a * row, shape=(b - a, *d.shape[1:]))

    def close(self) -> None:
        self.f.close()


def write_hdf5(reader, out: Path, manifest: dict[str, Any], compression: str = "none", engine=None) -> None:
    """Write every split's arrays of `reader` (any backend's) into one HDF5 file, atomically (sequentially:
    `engine` is not used, see the module docstring)."""
    h5py = _h5py()
    if compression not in COMPRESSION:
        raise DataprepError(f"HDF5 compression is one of {list(COMPRESSION)}, not {compression!r}")
    from ..temporaries import disk_refused, finished, quiet_hdf5_teardown, temporary, write_failure

    tmp, record = temporary(out)  # `.NAME.tmp-PID-RANDOM`; those of killed conversions to `out` removed first
    try:
        _write_file(h5py, tmp, reader, manifest, compression)
        os.replace(tmp, out)
    except BaseException as e:
        full = disk_refused(e)
        tmp.unlink(missing_ok=True)
        if full:
            quiet_hdf5_teardown()
            err = write_failure(e, out, f"free space on that disk or choose another --out ({tmp.name} removed)")
            # HDF5's own failure (its error stack quotes the errno), not one above it: the library may crash
            # this interpreter at exit, so the CLI leaves at once after the message (cli/convert.py)
            err.hdf5_unclean = "errno = " in str(e) or "file write failed" in str(e)
            raise err from None
        raise
    finally:
        finished(tmp, record)


def _write_file(h5py, tmp: Path, reader, manifest: dict[str, Any], compression: str) -> None:
    """The pack's file at `tmp`, written whole, closed whether or not writing fails. After a full disk, HDF5
    reports each of its objects failing to close (silenced: `quiet_hdf5_teardown`) and may crash the
    interpreter at exit (HDF5's own teardown), which is why `convert` checks the free space first."""
    import traceback

    f = h5py.File(tmp, "x")  # created exclusively: never an existing file, nor through a symlink
    try:
        _fill(f, reader, manifest, compression)
    except BaseException as e:
        from ..temporaries import disk_refused, quiet_hdf5_teardown

        if disk_refused(e):
            quiet_hdf5_teardown()
        traceback.clear_frames(e.__traceback__)  # the datasets the failed frames hold go while the file is open
        try:
            f.close()
        except Exception:  # noqa: BLE001 - the first error is the one to report
            pass
        raise
    f.close()


def _fill(f, reader, manifest: dict[str, Any], compression: str) -> None:
    for split in manifest["splits"]:
        g = f.require_group(split)
        g.attrs["count"] = int(manifest["splits"][split]["count"])
        g.attrs["shard_meta"] = json.dumps([reader.shard_meta(split, k) for k in range(len(manifest["splits"][split]["shards"]))])
        plans = reader.plans(split)
        for name, p in plans.items():
            kw: dict[str, Any] = {}
            if compression != "none" and p.total_rows:
                rows = max(1, (1 << 20) // max(1, int(np.prod(p.row_shape, dtype=np.int64)) * p.dtype.itemsize))
                kw = {"chunks": (min(rows, p.total_rows), *p.row_shape), "compression": compression, "shuffle": p.dtype.itemsize > 1}
            d = f.create_dataset(group_path(split, name), shape=p.shape, dtype=p.dtype, **kw)
            d.attrs["layout"] = "offsets" if p.is_offsets else "rows"
            if p.is_offsets:
                d.attrs["offsets_of"] = p.blob
            bases = plans[p.blob].starts if p.is_offsets else None
            for k, start in enumerate(p.starts):
                arr = reader.shard_array(split, k, name)
                if p.is_offsets:
                    arr = arr[:-1] + bases[k]
                if len(arr):
                    d[start : start + len(arr)] = arr
            if p.is_offsets:
                d[p.total_rows - 1] = plans[p.blob].total_rows
    for fname, data in reader.attachments().items():
        f.create_dataset(f"{ATTACHMENTS}/{fname}", data=np.frombuffer(data, np.uint8))
    for key in ("format", "format_version", "kind"):
        f.attrs[key] = manifest[key]
    f.attrs["backend"] = "hdf5"
    f.attrs["dataprep_manifest"] = json.dumps(manifest)  # last: a file without it is not a pack
