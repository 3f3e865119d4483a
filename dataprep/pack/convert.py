"""Convert stage: takes a pack of any backend, gives the same pack in another (npy, hdf5, zarr) without
decoding anything: arrays are copied, offsets rebased, and the npy shards a conversion writes are
checked against the manifest's checksums, so npy -> hdf5 -> zarr -> npy gives the original files back."""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from ..errors import DataprepError, PackExistsError
from .backends import BACKENDS, detect, is_pack, open_reader


def _clear(out: Path, overwrite: bool) -> None:
    if out.exists() or out.is_symlink():
        if not overwrite:
            raise PackExistsError(f"{out}: exists; pass --overwrite to replace it")
        if not is_pack(out) and not (out.is_dir() and not any(out.iterdir())):
            raise PackExistsError(f"{out}: holds something that is not a dataprep pack; refusing to replace it")
        shutil.rmtree(out) if out.is_dir() else out.unlink()


def convert(pack: str | os.PathLike, out: str | os.PathLike, to: str, compression: str = "none", engine=None,
            overwrite: bool = False) -> dict[str, Any]:
    """Write the pack at `pack` as a `to` pack at `out`; return {"from", "to", "bytes"}."""
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
        BACKENDS[to].write(reader, out, m, compression, engine)
    finally:
        reader.close()
    size = out.stat().st_size if out.is_file() else sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return {"from": detect(pack), "to": to, "bytes": size}
