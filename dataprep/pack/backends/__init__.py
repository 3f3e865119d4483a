"""Storage backends: where a pack's arrays live. `npy` (a directory of shard files, the default), `hdf5`
(one file) and `zarr` (a Zarr v3 group, chunked, optionally compressed).

Every backend keeps the same manifest and the same shard records; what differs is where the bytes
are. HDF5 and Zarr hold each split's arrays concatenated over shards (offsets rebased to the whole
split), which is what a user opening the file with h5py or zarr alone wants, and what the RAM cache
holds. A reader gives any shard's array exactly as the npy shard file holds it (`shard_array`), so
every loader, `verify` (whose checksums are of those npy files: header and data) and `convert` work
the same on every backend.

`BACKENDS` is the registry (name -> `Backend`: its reader, its writer, its compressions, how its packs are
recognised); the CLI's `--format` and `--to` choices come from it. h5py and zarr are imported only by
the code that opens or writes such a pack.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ...errors import PackError
from ..manifest import MANIFEST
from .hdf5 import COMPRESSION as HDF5_COMPRESSION
from .hdf5 import Hdf5Reader, write_hdf5
from .npy import NpyReader, write_npy
from .zarr import COMPRESSION as ZARR_COMPRESSION
from .zarr import ZarrReader, write_zarr

HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


def _is_hdf5(path: Path) -> bool:
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(8) == HDF5_MAGIC


@dataclass(frozen=True)
class Backend:
    name: str
    reader: type  # Reader(path): .manifest, .plans(split), .shard_array(split, k, name), ...
    write: Callable[..., None]  # write(reader, out, manifest, compression, engine)
    compressions: tuple[str, ...]
    claims: Callable[[Path], bool]  # whether a path holds this backend's pack (by content, not name)
    help: str


BACKENDS: dict[str, Backend] = {b.name: b for b in (
    Backend("npy", NpyReader, write_npy, ("none",), lambda p: p.is_dir() and not (p / "zarr.json").is_file(),
            "a directory of shard directories of .npy files"),
    Backend("hdf5", Hdf5Reader, write_hdf5, HDF5_COMPRESSION, _is_hdf5, "one HDF5 file"),
    Backend("zarr", ZarrReader, write_zarr, ZARR_COMPRESSION, lambda p: (p / "zarr.json").is_file(), "a Zarr v3 group"),
)}


def detect(path: str | os.PathLike) -> str:
    """The backend of the pack at `path`: an HDF5 file, a Zarr group directory, or an npy pack directory."""
    path = Path(path)
    if not path.exists():
        return "npy"  # reading it says "no such pack directory"
    for b in BACKENDS.values():
        if b.claims(path):
            return b.name
    if path.is_file():
        raise PackError(f"{path}: not a pack (a file, but not HDF5; an npy pack is a directory with manifest.json)")
    raise PackError(f"{path}: not a pack of a known backend ({', '.join(BACKENDS)})")


def open_reader(path: str | os.PathLike):
    """The reader of the pack at `path`, whatever its backend; `.manifest` is its checked manifest."""
    return BACKENDS[detect(path)].reader(Path(path))


def read_manifest(pack: str | os.PathLike) -> dict[str, Any]:
    """Read and check a pack's manifest, whatever its backend (npy directory, HDF5 file, Zarr group);
    raise PackError naming the path and what is wrong."""
    reader = open_reader(pack)
    reader.close()
    return reader.manifest


def is_pack(pack_dir: str | os.PathLike) -> bool:
    """Whether `pack_dir` holds a finished pack (of any backend)."""
    p = Path(pack_dir)
    if (p / MANIFEST).is_file():
        return True
    if p.is_file() or (p / "zarr.json").is_file():
        try:
            read_manifest(p)
            return True
        except PackError:
            return False
    return False
