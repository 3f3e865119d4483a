"""Zarr backend: a Zarr v3 group (zarr-python 3.x), chunked, optionally compressed.

Layout (documented for `zarr.open_group(path, mode="r")`): one group per split, one subgroup per
resolution of a multi-resolution pack (`r128`, ...), and in each the split's arrays concatenated over
its shards, with the same names and meaning as in the HDF5 backend (`images`, `offsets`, `shapes`,
`labels`, `sources`, `source_offsets`, masks, volumes, `tokens` + `doc_offsets`). Each array's
attribute `layout` is "rows" or "offsets" (with `offsets_of`); files an npy pack keeps beside its
shards (a trained tokenizer) are uint8 arrays under `_files/`; the root group's attributes hold the
manifest (`dataprep_manifest`) and `format`, `format_version`, `kind`, `backend`.

Chunks hold about 16 MiB along the first axis; `zstd` or `blosc` compression is offered for
everything but JPEG bytes (which do not compress). Writing is parallel: every chunk-aligned range
of every array is a task on the engine (local pool or Dask), so concurrent writers touch disjoint
chunks. Every chunk is written, even an all-zero one, so a missing chunk file is damage: reading it
is an error naming the file, never a silent zero. cache="mmap" is refused: chunks are separate files.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import DataprepError, PackError
from ..fields import encoded_arrays
from .concat import ATTACHMENTS, ConcatReader
from .layout import group_path

COMPRESSION = ("none", "zstd", "blosc")
CHUNK_BYTES = 16 << 20


def _zarr():
    try:
        import zarr
    except ImportError as e:
        raise DataprepError(f"Zarr packs need zarr 3 (Python 3.11+): pip install 'zarr>=3' ({e})") from None
    return zarr


class ZarrReader(ConcatReader):
    """Reads a Zarr pack. Metadata (zarr.json files) is read as JSON and uncompressed chunks straight
    from their files; zarr-python decodes compressed chunks."""

    name = "zarr"
    why_no_map = "cache='mmap' is not offered for Zarr packs: their arrays are stored as separate chunk files; use cache='ram' or 'shm'"

    def __init__(self, root: Path):
        meta = self._json(root / "zarr.json")
        if meta.get("node_type") != "group":
            raise PackError(f"{root}/zarr.json: not a Zarr v3 group")
        raw = meta.get("attributes", {}).get("dataprep_manifest")
        if raw is None:
            raise PackError(f"{root}: a Zarr group without a dataprep manifest (not a finished pack)")
        from ..manifest import check_manifest

        try:
            manifest = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError as e:
            raise PackError(f"{root}: the dataprep_manifest attribute is not JSON ({e})") from None
        super().__init__(root, check_manifest(manifest, root))
        self._metas: dict[str, dict] = {}
        self._group = None

    @staticmethod
    def _json(path: Path) -> dict:
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise PackError(f"{path}: missing") from None
        except (OSError, ValueError) as e:
            raise PackError(f"{path}: unreadable Zarr metadata ({e})") from None

    def _meta(self, key: str) -> dict:
        if key not in self._metas:
            m = self._json(self.root / key / "zarr.json")
            if m.get("node_type") != "array":
                raise PackError(f"{self.root / key}: not a Zarr array")
            self._metas[key] = m
        return self._metas[key]

    def _array(self, key: str):
        if self._group is None:
            zarr = _zarr()
            try:
                self._group = zarr.open_group(str(self.root), mode="r")
            except Exception as e:  # zarr raises several types for damaged metadata
                raise PackError(f"{self.root}: cannot open as a Zarr group ({type(e).__name__}: {e})") from None
        return self._group[key]

    def _attachment_names(self) -> list[str]:
        d = self.root / ATTACHMENTS
        return sorted(p.name for p in d.iterdir() if (p / "zarr.json").is_file()) if d.is_dir() else []

    def _whole(self, key: str) -> np.ndarray:
        return self._array(key)[:]

    def _split_attr(self, split: str, key: str):
        p = self.root / split / "zarr.json"
        return self._json(p).get("attributes", {}).get(key) if p.is_file() else None

    def _chunk_file(self, key: str, i: int, ndim: int) -> Path:
        return self.root.joinpath(key, "c", str(i), *("0" for _ in range(ndim - 1)))

    def _rows(self, key: str, a: int, b: int, out: np.ndarray) -> None:
        m = self._meta(key)
        shape, c = m["shape"], m["chunk_grid"]["configuration"]["chunk_shape"][0]
        try:
            stored = np.dtype(m["data_type"])
        except TypeError:
            raise PackError(f"{self.root}/{key}: unknown data type {m['data_type']!r}") from None
        self._check_extent(key, shape, stored, b, out, out.shape[1:])
        for i in range(a // c, (b - 1) // c + 1):
            f = self._chunk_file(key, i, len(shape))
            if not f.is_file():
                raise PackError(f"{f}: missing chunk of {key} (rows {i * c}:{(i + 1) * c}); the pack is damaged")
        codecs = m.get("codecs", [])
        raw = (len(codecs) == 1 and codecs[0].get("name") == "bytes"
               and codecs[0].get("configuration", {}).get("endian", "little") == "little"
               and m.get("chunk_key_encoding", {}).get("configuration", {}).get("separator", "/") == "/")
        if raw and out.flags.c_contiguous and np.dtype(m["data_type"]) == out.dtype.newbyteorder("="):
            self._read_chunks(key, shape, c, a, b, out)
            return
        try:
            out[...] = self._array(key)[a:b]
        except Exception as e:
            raise PackError(f"{self.root}/{key}: cannot read rows {a}:{b} ({type(e).__name__}: {e})") from None

    def _read_chunks(self, key: str, shape: list[int], c: int, a: int, b: int, out: np.ndarray) -> None:
        """Uncompressed chunks hold the rows' bytes as they are: read them straight from their files into
        `out` (zarr-python's own path copies each chunk through several buffers)."""
        row = int(np.prod(shape[1:], dtype=np.int64)) * out.dtype.itemsize
        flat = memoryview(out.reshape(-1).view(np.uint8))
        for i in range(a // c, (b - 1) // c + 1):
            lo, hi = max(a, i * c), min(b, (i + 1) * c)
            f = self._chunk_file(key, i, len(shape))
            try:
                fh = os.fdopen(os.open(f, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb", buffering=0)
            except OSError as e:
                raise PackError(f"{f}: cannot open the chunk of {key} ({e.strerror or e}; a symlink is refused)") from None
            with fh:
                fh.seek((lo - i * c) * row)
                want, got = (hi - lo) * row, 0
                dst = flat[(lo - a) * row : (hi - a) * row]
                while got < want:
                    n = fh.readinto(dst[got:])
                    if not n:
                        raise PackError(f"{f}: chunk of {key} is shorter than its {c} rows (truncated)")
                    got += n


@dataclass(frozen=True)
class ChunkTask:
    """Rows [a, b) (whole chunks) of one array: read from the source pack, written into the Zarr array."""

    reader: Any  # a backend reader; it pickles as its path and reopens itself where the task runs
    store: str
    split: str
    name: str
    a: int
    b: int


def _write_rows(zarr, path: str, a: int, b: int, data: np.ndarray) -> None:
    """Rows [a, b) of the array at `path` written with every chunk stored, an all-zero one too. zarr 3 skips a
    chunk equal to the fill value unless the array's config says otherwise, and that config lives on the array
    object, not in its metadata: what create_array was given is gone once a task reopens the array, so it is
    set again here, on the array (`with_config`) where zarr has it; a process-wide zarr.config.set, the fallback
    for zarr versions without it, is read as the array opens."""
    arr = zarr.open_array(path, mode="r+")
    if hasattr(arr, "with_config"):
        arr.with_config({"write_empty_chunks": True})[a:b] = data
        return
    with zarr.config.set({"array.write_empty_chunks": True}):
        zarr.open_array(path, mode="r+")[a:b] = data


def write_chunks(t: ChunkTask) -> int:
    zarr = _zarr()
    reader = t.reader.reopen()  # its own handle: tasks in one process must not share an open file
    try:
        data = reader.global_slice(t.split, t.name, t.a, t.b)
    finally:
        reader.close()
    try:
        _write_rows(zarr, str(Path(t.store) / group_path(t.split, t.name)), t.a, t.b, data)
    except OSError as e:
        from ..temporaries import disk_refused, write_failure

        if disk_refused(e):  # an error no retry mends (a Dask engine retries what is not a DataprepError)
            raise write_failure(e, getattr(e, "filename", None) or t.store, "free space on that disk or choose another --out") from None
        raise
    return int(data.nbytes)


def write_zarr(reader, out: Path, manifest: dict[str, Any], compression: str = "none", engine=None) -> None:
    """Write every split's arrays of `reader` (any backend's) into a Zarr v3 group at `out`, atomically
    (a temporary directory renamed at the end), the chunk ranges as parallel tasks on `engine`."""
    zarr = _zarr()
    from zarr.codecs import BloscCodec, ZstdCodec

    from ...engine import LocalEngine

    if compression not in COMPRESSION:
        raise DataprepError(f"Zarr compression is one of {list(COMPRESSION)}, not {compression!r}")
    from ..temporaries import disk_refused, finished, temporary, write_failure

    encoded = encoded_arrays(manifest)
    tmp, record = temporary(out)  # `.NAME.tmp-PID-RANDOM`; those of killed conversions to `out` removed first
    try:
        os.mkdir(tmp, 0o755)  # a new directory: never one that is there already, nor a symlink's target
        root = zarr.open_group(str(tmp), mode="w", zarr_format=3)
        tasks = []
        for split in manifest["splits"]:
            g = root.require_group(split)
            g.attrs["count"] = int(manifest["splits"][split]["count"])
            g.attrs["shard_meta"] = [reader.shard_meta(split, k) for k in range(len(manifest["splits"][split]["shards"]))]
            for name, p in reader.plans(split).items():
                row = max(1, int(np.prod(p.row_shape, dtype=np.int64)) * p.dtype.itemsize)
                # chunks of about CHUNK_BYTES, sized so the last one is nearly full (edge chunks are stored whole)
                pieces = max(1, -(-p.total_rows * row // CHUNK_BYTES))
                chunk = max(1, -(-max(p.total_rows, 1) // pieces))
                squeeze = compression != "none" and name not in encoded  # JPEG bytes do not compress further
                codec = (ZstdCodec(level=3) if compression == "zstd" else BloscCodec(cname="zstd", clevel=3)) if squeeze else None
                arr = root.create_array(group_path(split, name), shape=p.shape, dtype=p.dtype, chunks=(chunk, *p.row_shape),
                                        compressors=codec, fill_value=0, config={"write_empty_chunks": True},
                                        attributes={"layout": "offsets" if p.is_offsets else "rows",
                                                    **({"offsets_of": p.blob} if p.is_offsets else {})})
                per = max(1, (64 << 20) // (chunk * row)) * chunk  # whole chunks, about 64 MiB per task
                tasks += [ChunkTask(reader, str(tmp), split, name, a, min(a + per, p.total_rows))
                          for a in range(0, p.total_rows, per)]
                del arr
        for fname, data in reader.attachments().items():
            root.create_array(f"{ATTACHMENTS}/{fname}", data=np.frombuffer(data, np.uint8), config={"write_empty_chunks": True})
        (engine or LocalEngine(1)).map(write_chunks, tasks, names=[f"{t.split}/{t.name}[{t.a}:{t.b}]" for t in tasks])
        root.attrs.update({"format": manifest["format"], "format_version": manifest["format_version"],
                           "kind": manifest["kind"], "backend": "zarr"})
        root.attrs["dataprep_manifest"] = json.dumps(manifest)  # last: a group without it is not a pack
        if out.exists():
            shutil.rmtree(out)
        os.rename(tmp, out)
    except BaseException as e:
        if os.path.isdir(tmp) and not os.path.islink(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
        if disk_refused(e):
            raise write_failure(e, out, f"free space on that disk or choose another --out ({tmp.name} removed)") from None
        if isinstance(e, DataprepError) and "cannot write it" in str(e) and str(tmp) in str(e):
            raise DataprepError(f"{out}: {str(e).split(': ', 1)[1]} ({tmp.name} removed)") from None
        raise
    finally:
        finished(tmp, record)
