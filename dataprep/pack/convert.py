"""Convert stage: takes a pack of any backend, gives the same pack in another (npy, hdf5, zarr) without
decoding anything: arrays are copied, offsets rebased, and the npy shards a conversion writes are
checked against the manifest's checksums, so npy -> hdf5 -> zarr -> npy gives the original files back."""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from ..errors import DataprepError, PackError, PackExistsError
from .backends import BACKENDS, detect, open_source


def _clear(out: Path, overwrite: bool) -> None:
    if out.exists() or out.is_symlink():
        from .manifest import is_pack

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
    if out.resolve() == pack.resolve():
        raise DataprepError(f"{out}: the output is the input pack")
    source = open_source(pack)
    try:
        m = {k: v for k, v in source.manifest.items() if k != "storage"}
        if to != "npy":
            m["storage"] = {"backend": to, "compression": compression}
        elif compression != "none":
            raise DataprepError("npy packs are not compressed: drop --compress, or choose --to hdf5 or zarr")
        _clear(out, overwrite)
        if to == "npy":
            _write_npy(source, out, m)
        elif to == "hdf5":
            from .backends.hdf5 import write_hdf5

            write_hdf5(source, out, m, compression)
        else:
            from .backends.zarr import write_zarr

            write_zarr(source, pack, out, m, compression, engine)
    finally:
        source.close()
    size = out.stat().st_size if out.is_file() else sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return {"from": detect(pack), "to": to, "bytes": size}


def _write_npy(source, out: Path, m: dict[str, Any]) -> None:
    from .manifest import write_manifest
    from .shard import write_shard

    out.mkdir(parents=True)
    try:
        for split, entry in m["splits"].items():
            for k, s in enumerate(entry["shards"]):
                names = [f[:-4] for f in s["files"]]
                arrays = {n: source.shard_array(split, k, n) for n in names}
                meta = source.shard_meta(split, k)
                files = write_shard(out / split, str(s["name"]), arrays, meta)
                for f, rec in s["files"].items():
                    if files[f]["sha256"] != rec["sha256"]:
                        raise PackError(f"{out / split / str(s['name']) / f}: converted bytes differ from the manifest's checksum")
        for name, data in source.attachments().items():
            (out / name).write_bytes(data)
        write_manifest(out, m)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
