"""Shard stage: takes one shard's arrays, gives a directory of .npy files written atomically with checksums;
reads them back into caller-provided buffers, checking every header against the manifest.

A shard is written to a hidden temporary directory and renamed into place when every file is
flushed, so a crash never leaves a shard that looks finished. Files are plain .npy (no pickle,
explicit little-endian dtypes) so numpy alone can open them.
"""
from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import io
import json
import math
import os
import shutil
import socket
import uuid
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import PackError
from .names import check_name

TMP_PREFIX = ".tmp-"
SHARD_RECORD = "shard.json"
_CHUNK = 16 << 20  # read in 16 MiB pieces so hashing overlaps with the page cache's readahead
_BYTES = "|u1"  # a blob's dtype (pack/arrays.py: BYTES)


class _HashingWriter:
    """A file-like object that hashes what numpy writes through it."""

    def __init__(self, f):
        self.f = f
        self.sha = hashlib.sha256()
        self.n = 0

    def write(self, b) -> int:
        self.sha.update(b)
        self.n += len(b)
        return self.f.write(b)


def shard_name(index: int | str) -> str:
    """A shard's directory name: its number, five digits at least (or a name of digits given whole)."""
    return index if isinstance(index, str) else f"{index:05d}"


def write_shard(split_dir: Path, index: int | str, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> dict[str, Any]:
    """Write `arrays` as NAME.npy, plus `shard.json` (the file records and `meta`), into split_dir/NNNNN
    atomically; return the file records {file: {bytes, sha256, dtype, shape}}.

    `shard.json` is what lets a resumed build trust a finished shard: it is written inside the
    temporary directory, before the rename that makes the shard visible.
    """
    with ShardWriter(split_dir, index) as shard:
        for name, arr in arrays.items():
            shard.add(name, arr)
        return shard.commit(meta)


class ShardWriter:
    """One shard's files, written into a hidden temporary directory next to where the shard goes: arrays whole
    (`add`) or byte blobs appended piece by piece (`blob`: what a build must not hold whole, such as a long
    video's frames); `commit` writes `shard.json` and renames the directory into place. Leaving a `with` block
    by an exception, or `abort`, removes the directory, so a crash never leaves a shard that looks finished.

    Args:
        split_dir: The split's folder.
        index: The shard's number, or a name of digits.
    """

    def __init__(self, split_dir: Path, index: int | str):
        self.final = split_dir / check_name(shard_name(index), "shard", str(split_dir), PackError)
        # unique across the hosts of a cluster that share the output directory, and across retries of one shard
        self.tmp = split_dir / f"{TMP_PREFIX}{shard_name(index)}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.files: dict[str, Any] = {}
        self._open: list[BlobWriter] = []
        with self._failing():
            split_dir.mkdir(parents=True, exist_ok=True)
            self.tmp.mkdir()

    @contextlib.contextmanager
    def _failing(self):
        """Any error removes the temporary directory; an OSError becomes a PackError naming the shard."""
        try:
            yield
        except OSError as e:
            self.abort()
            hint = ""
            if e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
                hint = "; the disk is full or a file-size limit was reached: free space, then rerun with --resume"
            raise PackError(f"{self.final}: cannot write shard ({e.strerror or e}){hint}") from None
        except BaseException:
            self.abort()
            raise

    def add(self, name: str, arr: np.ndarray) -> None:
        """Write `arr` as NAME.npy (little-endian only).

        Args:
            name: The array's name in the shard.
            arr: The array.
        """
        with self._failing():
            if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "=" and not np.little_endian):
                raise ValueError(f"{name}: refusing a big-endian array")
            arr = np.ascontiguousarray(arr)
            fname = f"{name}.npy"
            with open(self.tmp / fname, "wb") as f:
                hw = _HashingWriter(f)
                np.lib.format.write_array(hw, arr, allow_pickle=False)
                f.flush()
                os.fsync(f.fileno())
            self.files[fname] = {"bytes": hw.n, "sha256": hw.sha.hexdigest(), "dtype": arr.dtype.str, "shape": list(arr.shape)}

    def blob(self, name: str) -> BlobWriter:
        """A byte blob NAME.npy (uint8, one dimension) to append to; it is finished by `commit`.

        Args:
            name: The blob's name in the shard.

        Returns:
            Its writer.
        """
        with self._failing():
            w = BlobWriter(self.tmp / f"{name}.npy", self._failing)
        self._open.append(w)
        return w

    def commit(self, meta: dict[str, Any]) -> dict[str, Any]:
        """Finish every blob, write `shard.json` (the file records and `meta`) and rename the shard into place.

        Args:
            meta: What the shard records beside its files (count, fingerprint, ...).

        Returns:
            The file records {file: {bytes, sha256, dtype, shape}}.
        """
        with self._failing():
            for w in self._open:
                self.files[w.path.name] = w.close()
            self._open = []
            with open(self.tmp / SHARD_RECORD, "w", encoding="utf-8") as f:
                json.dump({"files": self.files, **meta}, f)
                f.flush()
                os.fsync(f.fileno())
            if self.final.exists():
                shutil.rmtree(self.final)
            os.rename(self.tmp, self.final)
        return self.files

    def abort(self) -> None:
        """Remove the temporary directory and everything written into it."""
        for w in self._open:
            with contextlib.suppress(OSError):  # closing flushes: on a full disk that fails again
                w.f.close()
        self._open = []
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, kind, value, tb) -> None:
        if kind is not None or self.tmp.exists():  # an error, or left without commit: nothing of it stays
            self.abort()


class BlobWriter:
    """A uint8 .npy file appended to piece by piece. Its header is reserved at the start and written by `close`,
    once the length is known: the header np.save writes for that length (it is the same size for any length),
    so readers take it as any other shard file. Nothing appended is held in memory."""

    def __init__(self, path: Path, failing: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext):
        self.path, self._failing = path, failing  # the shard's: an OSError removes it and becomes a PackError
        self._header = len(npy_header_bytes(_BYTES, (0,)) or b"")
        self.f = open(path, "xb")
        self.f.write(bytes(self._header))
        self.n = 0

    def append(self, data) -> int:
        """Add bytes at the end.

        Args:
            data: Bytes, or a uint8 array.

        Returns:
            Where they start in the blob.
        """
        at = self.n
        with self._failing():
            self.n += self.f.write(memoryview(data).cast("B"))
        return at

    def rewind(self, n: int) -> None:
        """Drop everything after the blob's first `n` bytes (what a sample that failed half-way appended).

        Args:
            n: The length to keep (a length `append` gave or the blob had).
        """
        if not 0 <= n <= self.n:
            raise ValueError(f"{self.path}: cannot rewind a blob of {self.n} bytes to {n}")
        with self._failing():
            self.f.flush()
            self.f.truncate(self._header + n)
            self.f.seek(self._header + n)
        self.n = n

    def close(self) -> dict[str, Any]:
        """Write the header for the length reached, flush to disk and checksum the file.

        Returns:
            The file's record {bytes, sha256, dtype, shape}.
        """
        header = npy_header_bytes(_BYTES, (self.n,))
        if header is None or len(header) != self._header:
            raise ValueError(f"{self.path}: no .npy header of {self._header} bytes for {self.n} bytes")
        self.f.seek(0)
        self.f.write(header)
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        return {"bytes": self._header + self.n, "sha256": file_sha256(self.path), "dtype": _BYTES, "shape": [self.n]}


def reusable_shard(split_dir: Path, index: int, fingerprint: str) -> dict[str, Any] | None:
    """The record of a finished shard that was made from the same inputs and settings and whose files
    all still match their checksums; None when the shard must be (re)built."""
    d = split_dir / shard_name(index)
    try:
        with open(d / SHARD_RECORD, encoding="utf-8") as f:
            rec = json.load(f)
        if rec.get("fingerprint") != fingerprint:
            return None
        for fname, frec in rec["files"].items():
            p = d / fname
            if p.stat().st_size != frec["bytes"] or file_sha256(p) != frec["sha256"]:
                return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return rec


def remove_temporaries(split_dir: Path) -> int:
    """Delete shard directories a crashed or interrupted build left half-written; return how many."""
    n = 0
    if split_dir.is_dir():
        for p in split_dir.iterdir():
            if p.name.startswith(TMP_PREFIX):
                shutil.rmtree(p, ignore_errors=True)
                n += 1
    return n


def npy_header(f) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, fortran_order, dtype) of the .npy file open at its start (versions 1.0 and 2.0); the file is
    left at the first data byte. Raises ValueError (or EOFError) for anything else."""
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(f)
    if version == (2, 0):
        return np.lib.format.read_array_header_2_0(f)
    raise ValueError(f"npy version {version} is not supported")


@functools.lru_cache(maxsize=4096)
def npy_header_bytes(dtype: str, shape: tuple) -> bytes | None:
    """The header np.save writes for an array of this dtype and shape (None for a record that names none)."""
    try:
        dt = np.dtype(dtype)
        if dt.hasobject or not all(isinstance(n, int) and n >= 0 for n in shape):
            return None
        d = {"descr": np.lib.format.dtype_to_descr(dt), "fortran_order": False, "shape": shape}
        buf = io.BytesIO()
        try:
            np.lib.format.write_array_header_1_0(buf, d)
        except ValueError:
            buf = io.BytesIO()
            np.lib.format.write_array_header_2_0(buf, d)
        return buf.getvalue()
    except (TypeError, ValueError):
        return None


def open_npy(path: Path, record: dict[str, Any]) -> tuple[Any, int, tuple[int, ...], np.dtype]:
    """Open a shard file and check its header against its manifest record; return (file, data offset, shape, dtype).

    Every mismatch (missing file, wrong size, wrong dtype or shape, Fortran order) is a PackError
    naming the file, so a damaged pack fails here, never deep inside a DataLoader worker.
    """
    if not (
        isinstance(record, dict)
        and isinstance(record.get("bytes"), int)
        and isinstance(record.get("dtype"), str)
        and isinstance(record.get("shape"), list)
        and isinstance(record.get("sha256"), str)
    ):
        raise PackError(f"{path}: malformed file record in the manifest")
    try:
        # raw: readinto goes straight to the caller's buffer; O_NOFOLLOW: a shard file that is a symlink (to a
        # file outside the pack) is refused, not read
        f = os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb", buffering=0)
    except OSError as e:
        why = "a symlink; shard files must be the pack's own" if e.errno == errno.ELOOP else (e.strerror or str(e))
        raise PackError(f"{path}: cannot open shard file ({why})") from None
    try:
        size = os.fstat(f.fileno()).st_size
        if size != record["bytes"]:
            raise PackError(f"{path}: {size} bytes on disk, manifest says {record['bytes']} (truncated or replaced)")
        expected = npy_header_bytes(record["dtype"], tuple(record["shape"]))
        if expected is not None and f.read(len(expected)) == expected:
            # the header is byte for byte what np.save writes for the recorded dtype and shape
            shape, fortran, dtype = tuple(record["shape"]), False, np.dtype(record["dtype"])
        else:
            f.seek(0)
            try:
                shape, fortran, dtype = npy_header(f)
            except Exception as e:
                raise PackError(f"{path}: not a valid .npy file ({e})") from None
        if fortran or dtype.hasobject:
            raise PackError(f"{path}: unsupported array layout (Fortran order or object dtype)")
        if dtype.str != record["dtype"] or list(shape) != list(record["shape"]):
            raise PackError(
                f"{path}: holds {dtype.str} {list(shape)}, manifest says {record['dtype']} {record['shape']}"
            )
        offset = f.tell()
        if offset + math.prod(shape) * dtype.itemsize != size:
            raise PackError(f"{path}: header and file size disagree")
        return f, offset, tuple(shape), dtype
    except BaseException:
        f.close()
        raise


def read_npy_into(path: Path, record: dict[str, Any], out: np.ndarray | None = None, verify: bool = False) -> np.ndarray:
    """Read a shard file into `out` (a contiguous buffer of the right size) or a new array.

    With `verify`, the sha256 of the whole file is computed in the same pass and compared with the
    manifest's, so a checked load reads every byte once.
    """
    f, offset, shape, dtype = open_npy(path, record)
    with f:
        nbytes = math.prod(shape) * dtype.itemsize
        if out is None:
            out = np.empty(shape, dtype)
        elif out.nbytes != nbytes:
            raise PackError(f"{path}: size differs from the manifest's totals")
        sha = None
        if verify:
            f.seek(0)
            sha = hashlib.sha256(f.read(offset))
        view = memoryview(out.reshape(-1).view(np.uint8))
        got = 0
        while got < nbytes:
            n = f.readinto(view[got : got + _CHUNK])
            if not n:
                raise PackError(f"{path}: file ended early")
            if sha is not None:
                sha.update(view[got : got + n])
            got += n
    if sha is not None and sha.hexdigest() != record["sha256"]:
        raise PackError(f"{path}: checksum mismatch (sha256 {sha.hexdigest()[:12]}..., manifest {record['sha256'][:12]}...)")
    return out.reshape(shape) if out.shape != shape else out


def map_npy(path: Path, record: dict[str, Any], verify: bool = False) -> np.ndarray:
    """Memory-map a shard file read-only after checking its header (and, with `verify`, its checksum)."""
    f, offset, shape, dtype = open_npy(path, record)
    f.close()
    if verify and file_sha256(path) != record["sha256"]:
        raise PackError(f"{path}: checksum mismatch")
    if math.prod(shape) == 0:
        return np.empty(shape, dtype)  # mmap cannot map zero bytes
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
