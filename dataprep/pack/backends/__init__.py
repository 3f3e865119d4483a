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
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ...errors import PackError
from ...sources import IMAGE_EXTENSIONS
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
    name = detect(path)
    if name == "npy":
        _refuse_source_folder(Path(path))
    return BACKENDS[name].reader(Path(path))


def _refuse_source_folder(path: Path) -> None:
    """A PackError saying so when `path` is a build's source (images where a pack has shard directories,
    and no manifest), not a pack; a few entries are looked at, never the whole tree."""
    if not path.is_dir() or (path / MANIFEST).exists():
        return
    where = shlex.quote(str(path))
    if _holds_images(path / "train", 2):
        what, then = "an ImageNet-style tree: train/<class>/ images", f"build a pack from it with: dataprep build imagenet {where} --out PACK"
    elif any(_holds_images(d, 2) for d in _subdirs(path)[:3]):
        what, then = "class folders of images", f"build a pack from it with: dataprep build folder {where} --out PACK"
    elif _holds_images(path, 1):
        what, then = "images without class folders", (f"`dataprep build folder` takes class folders: put the images in "
                                                       f"{path}/<class>/ and run dataprep build folder {where} --out PACK")
    else:
        return
    raise PackError(f"{path}: this looks like a source folder ({what}), not a pack (a pack has manifest.json "
                    f"and shard directories); {then}")


def _subdirs(d: Path) -> list[Path]:
    try:
        return sorted(Path(e.path) for e in os.scandir(d) if e.is_dir() and not e.name.startswith("."))
    except OSError:
        return []


def _holds_images(d: Path, depth: int) -> bool:
    """An image file in `d` or (depth > 1) in one of its first few folders, down to `depth` levels."""
    try:
        with os.scandir(d) as it:
            if any(e.is_file() and not e.name.startswith(".") and os.path.splitext(e.name)[1].lower() in IMAGE_EXTENSIONS
                   for e in it):
                return True
    except OSError:
        return False
    return depth > 1 and any(_holds_images(s, depth - 1) for s in _subdirs(d)[:3])


def read_manifest(pack: str | os.PathLike) -> dict[str, Any]:
    """Read and check a pack's manifest, whatever its backend (npy directory, HDF5 file, Zarr group).

    Args:
        pack: The pack's folder or file.

    Returns:
        The manifest, as a dict.

    Raises:
        PackError: The pack is missing or damaged; the message names the path and what is wrong.
    """
    reader = open_reader(pack)
    reader.close()
    return reader.manifest


def is_pack(pack_dir: str | os.PathLike) -> bool:
    """Whether `pack_dir` holds a finished pack, of any backend.

    Args:
        pack_dir: The folder or file to look at.

    Returns:
        True when a finished pack is there.
    """
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
