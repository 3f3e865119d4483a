"""Cache stage: takes a pack's split and a cache mode, gives its arrays in memory, one copy per machine.

- "ram":  read into this process's memory as a few contiguous buffers; forked DataLoader workers share
          them (numpy buffers have no per-object reference counts to copy on read).
- "mmap": map the pack's shard files; the OS page cache is the one copy for every worker and every rank.
          Small arrays (offsets, labels, shapes, paths) are read into RAM.
- "shm":  copy the split once into a file in /dev/shm named after the pack's identity, and map it in
          every process on the node (torchrun ranks included). Two lock files per segment: "fill" is
          held exclusively, briefly, to check for the segment and fill it if missing (a temporary
          file, published by rename); "users" is held shared by every process attached. The last user
          to leave (its exclusive try on "users", under "fill") removes the segment. A segment a
          crash left behind is complete (it was renamed only when full) and is reused; a half-filled
          temporary one is replaced. Never a FileExistsError.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import mmap
import os
import sys
import tempfile
import time
from multiprocessing import util as mp_util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import DataprepError, PackError
from ..pack.fields import BYTES, OFFSETS, LoadContext, Strings, blob_shapes, load_blob, load_rows, rows_shape
from ..images.field import ImageField, mask_key_of
from ..pack.backends import open_source
from ..pack.manifest import MANIFEST

CACHE_MODES = ("ram", "mmap", "shm")
SHM_DIR = Path(os.environ.get("DATAPREP_SHM_DIR", "/dev/shm"))
_MAGIC = b"DPSHM\x00v1"
_ALIGN = 4096
PROGRESS_BYTES = 1 << 30  # show loading progress by default from 1 GiB up


@dataclass
class CachedSplit:
    """A split's arrays, wherever they live, plus what describes them."""

    manifest: dict[str, Any]
    field: ImageField  # the images (or volumes) served
    arrays: dict[str, Any]  # by generic key: images (+ offsets), shapes, [masks ...], [labels], sources, source_offsets
    sources: Strings
    segment: "ShmSegment | None" = None
    mask_field: ImageField | None = None

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())


def layout(pack: Path, split: str, m: dict[str, Any], fields: list[ImageField]) -> list[tuple[str, tuple[int, ...], np.dtype]]:
    """Every array a split loads: (stored name, shape, dtype), in load order."""
    shards = m["splits"][split]["shards"]
    split_dir = pack / split
    out = [a for f in fields for a in f.layout(split_dir, shards)]
    if "label" in m["fields"]:
        out.append(("labels", rows_shape(shards, ()), np.dtype(m["fields"]["label"]["dtype"])))
    for name in _string_fields(m):
        blob, offs = blob_shapes(split_dir, shards, name, _OFFSETS_OF[name])
        out += [(name, blob, BYTES), (_OFFSETS_OF[name], offs, OFFSETS)]
    return out


_OFFSETS_OF = {"sources": "source_offsets", "mask_sources": "mask_source_offsets"}


def _string_fields(m: dict[str, Any]) -> list[str]:
    return ["sources"] + (["mask_sources"] if "mask_source" in m["fields"] else [])


def _nbytes(shape, dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


# Which field a dataset serves, by pack kind (images may have one field per resolution: "image@R").
SERVED = {"images": "image", "segmentation": "image", "volumes": "volume"}


def image_field_key(m: dict[str, Any], resolution: int | None, where: Path) -> str:
    """The manifest field of the asked resolution ("image", or "image@R" in a multi-resolution pack)."""
    have = m.get("resolutions")
    base = SERVED.get(m.get("kind"), "image")
    if not have:
        size = m.get("settings", {}).get("image", {}).get("size")
        if resolution is not None and resolution != size:
            raise PackError(f"{where}: no resolution {resolution}; the pack has [{size}]")
        return base
    resolution = max(have) if resolution is None else resolution
    if resolution not in have:
        raise PackError(f"{where}: no resolution {resolution}; the pack has {sorted(have)}")
    return f"{base}@{resolution}"


def open_split(pack: str | os.PathLike, split: str, cache: str = "ram", verify: bool = False,
               progress: bool | None = None, resolution: int | None = None, kinds: tuple[str, ...] = ("images",)) -> CachedSplit:
    """Bring a split of a pack whose kind is one of `kinds` (at one resolution) into memory according to
    `cache`; check it on the way. Every field is loaded: the served one, masks, labels, source paths."""
    if cache not in CACHE_MODES:
        raise DataprepError(f"unknown cache mode {cache!r}; choose one of {list(CACHE_MODES)}")
    pack = Path(pack)
    source = open_source(pack)  # opened once: its manifest, then its arrays
    m = source.manifest
    if m["kind"] not in kinds:
        raise PackError(f"{pack}: a {m['kind']!r} pack, not {' or '.join(repr(k) for k in kinds)}")
    if split not in m["splits"]:
        raise PackError(f"{pack}: no split {split!r}; the pack has {sorted(m['splits'])}")
    key = image_field_key(m, resolution, pack)
    img = ImageField.from_manifest(m["fields"][key], pack / MANIFEST)
    mask_key = mask_key_of(key)
    mask = ImageField.from_manifest(m["fields"][mask_key], pack / MANIFEST) if mask_key in m["fields"] else None
    if mask is not None and mask.role != ("volume_mask" if img.role == "volume" else "mask"):
        raise PackError(f"{pack / MANIFEST}: the mask field describes a {mask.role!r}")
    fields = [img] + ([mask] if mask else [])
    plan = layout(pack, split, m, fields)
    total = sum(_nbytes(s, d) for _, s, d in plan)
    if cache == "ram":
        _check_ram(pack, total)
    report = _Progress(f"{pack}/{split}", cache, total) if (progress or (progress is None and total >= PROGRESS_BYTES)) else None
    ctx = LoadContext(verify=verify, map_images=cache == "mmap", progress=report.add if report else None, source=source)
    segment = None
    if cache == "shm":
        segment = ShmSegment.attach(pack, m, f"{split}/{key}", plan,
                                    lambda alloc: _load(pack, split, m, fields, LoadContext(verify, alloc, False, ctx.progress, source)))
        generic = {f.name(g): g for f in fields for g in f.keys}
        arrays = {generic.get(k, k): v for k, v in segment.arrays.items()}
    else:
        arrays = _load(pack, split, m, fields, ctx)
    if report:
        report.done()
    for a in arrays.values():
        a.setflags(write=False)  # the cache is shared: nobody may scribble on it
    n = len(arrays[img.keys[2]])
    entry = m["splits"][split]
    if n != entry["count"] or (mask and len(arrays[mask.keys[2]]) != n) or ("labels" in arrays and len(arrays["labels"]) != n):
        raise PackError(f"{pack / split}: manifest counts {entry['count']} samples, shards hold {n}")
    if "labels" in arrays:
        ncls = int(m["fields"]["label"]["num_classes"])
        if n and int(arrays["labels"].max()) >= ncls:
            raise PackError(f"{pack / split}: a label is {int(arrays['labels'].max())}, but the pack has {ncls} classes")
    axes = 3 if img.role == "volume" else 2  # (H, W) of images; (D, H, W) of volumes
    if mask and n and not np.array_equal(np.asarray(arrays[mask.keys[2]])[:, :axes], np.asarray(arrays[img.keys[2]])[:, :axes]):
        raise PackError(f"{pack / split}: masks and {img.role}s differ in size")
    return CachedSplit(m, img, arrays, Strings(arrays["sources"], arrays["source_offsets"]), segment, mask)


def _load(pack: Path, split: str, m: dict, fields: list[ImageField], ctx: LoadContext) -> dict[str, Any]:
    shards = m["splits"][split]["shards"]
    split_dir = pack / split
    arrays: dict[str, Any] = {}
    for f in fields:
        arrays.update(f.load(split_dir, shards, ctx))
    if "label" in m["fields"]:
        arrays["labels"] = load_rows(split_dir, shards, "labels", np.dtype(m["fields"]["label"]["dtype"]), (), ctx)
    for name in _string_fields(m):
        arrays[name], arrays[_OFFSETS_OF[name]] = load_blob(split_dir, shards, name, _OFFSETS_OF[name], ctx)
    return arrays


def available_ram() -> int:
    """MemAvailable from /proc/meminfo (bytes), or a large number where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


def _check_ram(pack: Path, total: int) -> None:
    free = available_ram()
    if total > free:
        raise DataprepError(
            f"{pack}: loading it with cache='ram' needs {total / 1e9:.2f} GB, but only {free / 1e9:.2f} GB are "
            "available; use cache='mmap' (the page cache holds what fits and shares it) or free memory"
        )


class _Progress:
    def __init__(self, what: str, cache: str, total: int):
        self.what, self.cache, self.total = what, cache, max(total, 1)
        self.got = 0
        self.t0 = self.last = time.perf_counter()

    def add(self, n: int) -> None:
        self.got += n
        now = time.perf_counter()
        if now - self.last >= 0.5:
            self.last = now
            self._line(now)

    def _line(self, now: float, end: str = "\r") -> None:
        rate = self.got / max(now - self.t0, 1e-9)
        print(f"loading {self.what} ({self.cache}): {self.got / 1e6:,.0f} of {self.total / 1e6:,.0f} MB "
              f"({100 * min(self.got, self.total) / self.total:.0f}%), {rate / 1e9:.2f} GB/s", end=end, file=sys.stderr, flush=True)

    def done(self) -> None:
        self._line(time.perf_counter(), end="\n")


# -- shared memory ------------------------------------------------------------------------------------
def _lock_dir() -> Path:
    d = Path(tempfile.gettempdir()) / "dataprep-locks"
    d.mkdir(exist_ok=True)
    return d


def segment_name(manifest: dict[str, Any], split: str) -> str:
    """Named after the manifest (which holds every shard's checksum): the same pack content gives the
    same segment, whatever its backend or path; a rebuilt pack a new one."""
    digest = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode() + b"\0" + split.encode()).hexdigest()
    return f"dataprep-{digest[:24]}"


@dataclass
class ShmSegment:
    path: Path
    users_fd: int
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    created: bool = False

    @classmethod
    def attach(cls, pack: Path, manifest: dict[str, Any], split: str, plan: list,
               fill: Callable[[Callable], dict[str, Any]]) -> "ShmSegment":
        name = segment_name(manifest, split)
        path = SHM_DIR / name
        offsets, total = _offsets(plan)
        fill_fd = os.open(_lock_dir() / f"{name}.fill", os.O_CREAT | os.O_RDWR, 0o666)
        users_fd = os.open(_lock_dir() / f"{name}.users", os.O_CREAT | os.O_RDWR, 0o666)
        try:
            created = False
            fcntl.flock(fill_fd, fcntl.LOCK_EX)  # one process checks or fills at a time; held briefly
            try:
                if not _complete(path, total):
                    _create(path, pack, split, plan, offsets, total, fill)
                    created = True
                fcntl.flock(users_fd, fcntl.LOCK_SH)  # a user until released: the segment stays
            finally:
                fcntl.flock(fill_fd, fcntl.LOCK_UN)
                os.close(fill_fd)
            arrays = _views(_map(path), plan, offsets)
        except BaseException:
            os.close(users_fd)
            raise
        seg = cls(path, users_fd, arrays, created)
        # multiprocessing's Finalize, not weakref.finalize: it also runs when a DataLoader or Loader
        # worker (a multiprocessing child, which never runs atexit) exits, so a segment attached in a
        # worker (a resolution switched to there) is released too.
        mp_util.Finalize(seg, _release, (users_fd, path, os.getpid()), exitpriority=10)
        return seg


def _offsets(plan) -> tuple[dict[str, int], int]:
    pos, out = _ALIGN, {}  # the first page holds the header
    for key, shape, dtype in plan:
        out[key] = pos
        pos += -(-_nbytes(shape, dtype) // _ALIGN) * _ALIGN
    return out, pos


def _complete(path: Path, total: int) -> bool:
    try:
        with open(path, "rb") as f:
            return os.fstat(f.fileno()).st_size == total and f.read(len(_MAGIC)) == _MAGIC
    except OSError:
        return False


def _create(path: Path, pack: Path, split: str, plan, offsets: dict[str, int], total: int, fill) -> None:
    for stale in list(path.parent.glob(path.name + ".tmp-*")) + [path]:
        stale.unlink(missing_ok=True)  # a crash mid-fill, or a segment of the wrong size
    st = os.statvfs(path.parent)
    if st.f_bavail * st.f_frsize < total:
        raise DataprepError(
            f"{path.parent}: {total / 1e9:.2f} GB needed for {pack}/{split} with cache='shm', "
            f"{st.f_bavail * st.f_frsize / 1e9:.2f} GB free; use cache='mmap' or enlarge {path.parent}"
        )
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w+b") as f:
            f.truncate(total)
            mm = mmap.mmap(f.fileno(), total)
            header = json.dumps({"pack": str(pack.resolve()), "split": split, "layout": [[k, list(s), np.dtype(d).str] for k, s, d in plan]}).encode()
            if len(_MAGIC) + 8 + len(header) > _ALIGN:
                header = b"{}"
            _fill_into(mm, plan, offsets, fill, f"{pack}/{split}")
            mm[len(_MAGIC) : len(_MAGIC) + 8] = len(header).to_bytes(8, "little")
            mm[len(_MAGIC) + 8 : len(_MAGIC) + 8 + len(header)] = header
            mm[: len(_MAGIC)] = _MAGIC  # last: a segment without the magic is never taken as complete
            mm.close()
        os.rename(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _views(buf, plan, offsets: dict[str, int]) -> dict[str, np.ndarray]:
    """The arrays of `plan` as views of a mapped segment, at their offsets."""
    return {k: np.frombuffer(buf, d, int(np.prod(s, dtype=np.int64)), offsets[k]).reshape(s) for k, s, d in plan}


def _fill_into(mm: mmap.mmap, plan, offsets: dict[str, int], fill, where: str) -> None:
    """Run the loader with an allocator that hands out views of the segment (they die on return, so the
    mapping can be closed)."""
    views = _views(mm, plan, offsets)

    def alloc(key, shape, dtype):
        v = views[key]
        if v.shape != tuple(shape) or v.dtype != np.dtype(dtype):
            raise PackError(f"{where}: {key} is {shape} {dtype}, the layout said {v.shape} {v.dtype}")
        return v

    fill(alloc)


def _map(path: Path) -> mmap.mmap:
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)


def _release(users_fd: int, path: Path, pid: int) -> None:
    """Drop this process's use of the segment; the last user removes it.

    Lock order is the same as in `attach` (fill, then users), so a process attaching at this moment
    either sees the segment before it goes or fills a new one after.
    """
    if os.getpid() != pid:
        return  # a forked child inherited the object: the parent owns the lock
    try:
        os.close(users_fd)
        fill_fd = os.open(_lock_dir() / f"{path.name}.fill", os.O_RDWR)
    except OSError:
        return
    try:
        fcntl.flock(fill_fd, fcntl.LOCK_EX)
        users = os.open(_lock_dir() / f"{path.name}.users", os.O_RDWR)
        try:
            fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
            path.unlink(missing_ok=True)  # nobody else holds it: we were the last user
        except OSError:
            pass  # somebody still uses it
        finally:
            os.close(users)
    finally:
        os.close(fill_fd)


def list_segments() -> list[Path]:
    """dataprep's segments in the shared-memory directory (complete or not)."""
    return sorted(SHM_DIR.glob("dataprep-*")) if SHM_DIR.is_dir() else []
