"""Convert with URLs: takes a pack at a URL or a local one and a target (a URL or a local path), gives
`pack/convert.py`'s conversion through a local copy: a remote source is fetched whole (checked) first,
and a URL target, always an npy pack, is uploaded from a local npy conversion, manifest last. Both local
copies are staged under the cache directory with this process's pid in their names (remote/cachedir.py)."""
from __future__ import annotations

from pathlib import Path

from ..errors import DataprepError
from ..pack.convert import convert
from .cachedir import staging_dir
from .packs import local_copy
from .upload import upload_pack
from .urls import is_url, redact


def convert_remote(pack, out, to: str, compression: str = "none", engine=None, overwrite: bool = False,
                   progress: bool | None = None) -> dict:
    """`convert` where either side is a URL; `progress` shows the fetch and the conversion (as convert's)."""
    if is_url(out) and (to != "npy" or compression != "none"):
        raise DataprepError(f"{redact(str(out))}: packs at URLs are npy packs; convert with --to npy")
    if is_url(pack):
        with local_copy(str(pack), progress=progress) as (rp, local, _):
            r = _to(local, out, to, compression, engine, overwrite, progress, f"convert {rp.shown}")
            r["from"] = f"npy at {rp.shown}"
            return r
    return _to(Path(pack), out, to, compression, engine, overwrite, progress, f"convert {pack}")


def _to(local: Path, out, to: str, compression: str, engine, overwrite: bool, progress=None, what: str | None = None) -> dict:
    if not is_url(out):
        return convert(local, out, to, compression, engine, overwrite, progress, what)
    from ..pack.backends import detect

    if detect(local) == "npy":
        r = upload_pack(local, str(out), overwrite)
        return {"from": "npy", "to": f"npy at {redact(str(out))}", "bytes": r["bytes"]}
    with staging_dir("convert") as staging:  # `convert-PID-*`: `dataprep cache list|clean` find it if this run is killed
        c = convert(local, staging / "pack", "npy", "none", engine, progress=progress, what=what)
        r = upload_pack(staging / "pack", str(out), overwrite)
    return {"from": c["from"], "to": f"npy at {redact(str(out))}", "bytes": r["bytes"]}
