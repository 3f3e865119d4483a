"""Where a build's output goes: npy shards written straight into a directory (parallel, atomic,
resumable); for HDF5 or Zarr, npy shards staged beside the target and converted at the end; for a URL,
staged in the cache directory and uploaded as shards finish, the manifest last. What the conversion or
upload did is said in lines appended to `said` (the CLI prints them with the summary)."""
from __future__ import annotations

import contextlib
import shutil
import sys
from pathlib import Path

from .pack.backends import BACKENDS

COMPRESSIONS = tuple(dict.fromkeys(c for b in BACKENDS.values() for c in b.compressions))


def _notice(line: str) -> None:
    """What is being done, said on stderr as it starts (stdout stays the command's result)."""
    print(line, file=sys.stderr, flush=True)


@contextlib.contextmanager
def staged_output(out, fmt: str, compress: str, overwrite: bool, engine=None, resume: bool = False,
                  progress: bool | None = None, said: list[str] | None = None, notice=None):
    """Yield where the npy build goes; for hdf5/zarr convert it to `out` afterwards (Zarr chunk ranges as
    tasks on `engine`, progress shown as `convert`'s) and remove the staging directory (kept when the build
    fails, so --resume continues it). `notice` tells what is being done as it starts (stderr by default)."""
    from .errors import DataprepError, PackExistsError, option
    from .remote.urls import is_url

    said = [] if said is None else said
    if is_url(out):
        yield from _published(str(out), fmt, compress, overwrite, resume, said, notice or _notice)
        return
    from .safe_paths import check_links

    out = check_links(Path(out), "output")  # before the build: a planted symlink is never written through
    if fmt == "npy":
        if compress != "none":
            raise DataprepError("npy packs are not compressed: drop --compress, or choose --format hdf5 or zarr")
        yield out
        return
    if compress not in BACKENDS[fmt].compressions:  # before the build, not after it
        raise DataprepError(f"{fmt} compression is one of {list(BACKENDS[fmt].compressions)}, not {compress!r}")
    if out.exists() and not overwrite:
        raise PackExistsError(f"{out}: exists; pass {option('overwrite')} to replace it")
    staging = out.with_name(out.name + ".staging")
    yield staging
    from .pack.convert import convert

    r = convert(staging, out, fmt, compress, engine, overwrite=True, progress=progress, what=f"store {out} ({fmt})")
    shutil.rmtree(staging)
    said.append(f"stored as {fmt}{' (' + compress + ')' if compress != 'none' else ''}: {out}, {r['bytes'] / 1e6:.1f} MB")


def _published(url: str, fmt: str, compress: str, overwrite: bool, resume: bool, said: list[str], notice=_notice):
    """A build to a URL: npy shards staged in a local directory (kept when the build fails, so --resume
    continues it) and uploaded as they are finished; the manifest uploaded last."""
    import hashlib

    from .errors import DataprepError
    from .remote.cachedir import cache_root
    from .remote.upload import Publisher, claim
    from .remote.urls import redact

    if fmt != "npy" or compress != "none":
        raise DataprepError(f"{redact(url)}: packs at URLs are npy packs (objects per shard file, fetched in parallel); "
                            "drop --format and --compress")
    store = claim(url, overwrite, resume=resume)
    staging = cache_root() / "builds" / hashlib.sha256(store.shown.encode()).hexdigest()[:20]
    staging.parent.mkdir(parents=True, exist_ok=True)
    notice(f"staging the build in {staging}, uploading to {store.shown} as shards finish")
    pub = Publisher(staging, store).start()
    try:
        yield staging
        r = pub.finish()
    except BaseException:
        pub.abandon()
        raise
    shutil.rmtree(staging, ignore_errors=True)
    said.append(f"uploaded to {store.shown}: {r['objects']} objects ({r['files']} files the manifest records, as "
               f"`dataprep info` counts them, {r['shard_records']} shard records, the manifest), {r['bytes'] / 1e6:.1f} MB, "
               f"manifest last ({r['seconds']:.1f} s from the first shard)")
