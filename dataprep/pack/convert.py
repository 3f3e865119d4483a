"""Convert stage: takes a pack of any backend, gives the same pack in another (npy, hdf5, zarr) without
decoding anything: arrays are copied, offsets rebased, and the npy shards a conversion writes are
checked against the manifest's checksums, so npy -> hdf5 -> zarr -> npy gives the original files back.

An HDF5 or Zarr pack is written to a temporary beside it (`.NAME.tmp-PID-RANDOM`, `temporary()`),
renamed into place at the end. A killed conversion leaves its temporary: the next conversion to the same
output removes it (never one whose process lives), and `dataprep cache list|clean` show and remove it
(each temporary is recorded under the cache directory while it exists). A full disk is one line naming
the file and the fix (`write_failure`), not a traceback.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from ..errors import DataprepError, PackExistsError, option
from ..progress import reporter
from ..safe_paths import check_links
from .backends import BACKENDS, detect, is_pack, open_reader
from .temporaries import FULL, clean_temporaries, disk_refused, finished, pending_temporaries, quiet_hdf5_teardown, sweep, temporary, write_failure  # noqa: F401


def free_bytes(path: Path) -> int | None:
    """Free bytes on the file system that holds `path` (or its nearest existing parent); None if unknown."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def preflight(out: Path, manifest: dict[str, Any], to: str, compression: str) -> None:
    """Refuse, in one line, a conversion whose output cannot fit the free space where it goes (uncompressed:
    its arrays, attachments and manifest, plus a margin), before anything is written: HDF5 in particular
    cannot recover from a full disk mid-write (it reports each of its objects failing to close and may
    crash the interpreter at exit). A compressed output's size is not known: not checked."""
    if compression != "none":
        return
    attached = sum(int(r.get("bytes", 0)) for r in (manifest.get("attachments") or {}).values()
                   if isinstance(r, dict) and isinstance(r.get("bytes", 0), int))
    need = _array_bytes(manifest) + attached + 2 * len(json.dumps(manifest)) + (256 << 10)
    free = free_bytes(out)
    if free is not None and free < need:
        raise DataprepError(f"{out}: cannot write it: no space left on the device ({free:,} bytes free, the {to} "
                            f"pack needs about {need:,}); {_fix_for(out)}")


def _fix_for(out: Path) -> str:
    return f"free space on that disk or choose another --out (nothing was left at {out})"


def _clear(out: Path, overwrite: bool) -> None:
    check_links(out, "output")  # a symlink planted in a shared directory is neither replaced nor written through
    if out.exists() or out.is_symlink():
        if not overwrite:
            raise PackExistsError(f"{out}: exists; pass {option('overwrite')} to replace it")
        if not is_pack(out) and not (out.is_dir() and not any(out.iterdir())):
            raise PackExistsError(f"{out}: holds something that is not a dataprep pack; refusing to replace it")
        shutil.rmtree(out) if out.is_dir() else out.unlink()


def convert(pack: str | os.PathLike, out: str | os.PathLike, to: str, compression: str = "none", engine=None,
            overwrite: bool = False, progress=None, what: str | None = None) -> dict[str, Any]:
    """Write the pack at `pack` as a `to` pack at `out`; return {"from", "to", "bytes"}. `progress`: True
    shows the bytes of arrays copied (dataprep/progress.py), in lines named `what` [default: "convert
    PACK"]; a callable is told of them; None or False shows nothing."""
    what = what or f"convert {pack}"
    pack, out = Path(pack), Path(out)
    if to not in BACKENDS:
        raise DataprepError(f"unknown format {to!r}; choose one of {list(BACKENDS)}")
    if compression not in BACKENDS[to].compressions:
        if to == "npy":
            raise DataprepError("npy packs are not compressed: drop --compress, or choose --to hdf5 or zarr")
        raise DataprepError(f"{to} compression is one of {list(BACKENDS[to].compressions)}, not {compression!r}")
    if out.resolve() == pack.resolve():
        raise DataprepError(f"{out}: the output is the input pack")
    reader = open_reader(pack)
    try:
        m = {k: v for k, v in reader.manifest.items() if k != "storage"}
        if to != "npy":
            m["storage"] = {"backend": to, "compression": compression}
        _clear(out, overwrite)
        preflight(out, m, to, compression)
        try:
            with reporter(progress, what, _array_bytes(m), "bytes") as bar:
                counted = _Counted(reader, bar)
                BACKENDS[to].write(counted, out, m, compression, _CountingEngine(engine, bar))
        except (OSError, RuntimeError) as e:
            if not disk_refused(e):
                raise
            raise write_failure(e, getattr(e, "filename", None) or out, _fix_for(out)) from None
    finally:
        reader.close()
    size = out.stat().st_size if out.is_file() else sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return {"from": detect(pack), "to": to, "bytes": size}


def _array_bytes(manifest: dict[str, Any]) -> int:
    """The bytes of every shard array the manifest records: what a conversion copies."""
    import numpy as np

    total = 0
    for entry in manifest.get("splits", {}).values():
        for shard in entry.get("shards", []):
            for name, rec in (shard.get("files") or {}).items():
                if name.endswith(".npy") and isinstance(rec, dict) and "shape" in rec and "dtype" in rec:
                    total += int(np.prod(rec["shape"], dtype=np.int64)) * np.dtype(rec["dtype"]).itemsize
    return total


def _reader_of(reader):
    return reader


class _Counted:
    """A backend reader whose shard arrays, as a writer reads them, are counted as copied (`progress(nbytes)`).
    It pickles as the reader itself: tasks that reopen it elsewhere are counted by `_CountingEngine`."""

    def __init__(self, reader, progress):
        self._reader, self._progress = reader, progress

    def shard_array(self, *args, **kw):
        arr = self._reader.shard_array(*args, **kw)
        self._progress(int(arr.nbytes))
        return arr

    def __getattr__(self, name):
        return getattr(self._reader, name)

    def __reduce__(self):
        return _reader_of, (self._reader,)


class _CountingEngine:
    """An engine (default: this process) whose tasks' byte counts (a writer task's result) are told to `progress`."""

    def __init__(self, engine, progress):
        from ..engine import LocalEngine

        self._engine, self._progress = engine or LocalEngine(1), progress

    def map(self, fn, tasks, on_result=None, names=None):
        def told(i, result):
            if isinstance(result, int):
                self._progress(result)
            if on_result:
                on_result(i, result)

        return self._engine.map(fn, tasks, told, names=names)

    def __getattr__(self, name):
        return getattr(self._engine, name)
