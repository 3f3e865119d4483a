"""Tar members as the WebDataset listing reads them: takes a tar file (plain, gzip, bzip2 or xz), gives its
members one at a time with what tarfile would read whole bounded (`_Info`: a pax or GNU long-name header
over `HEADER_LIMIT` stepped over unread and its member marked bad, a GNU sparse member marked bad; `_each`
forgets each member read), WebDataset's (key, extension) of a name (`split_key`), the consecutive groups of
one key with their metadata members read up to `META_LIMIT` (`_Groups`), the names of keys found twice
(`_names_of`), why a tar whose members ran out is cut or damaged (`_no_end`), and a compressed tar's bytes
decompressed a buffer at a time (`_decompressing`). sources/webdataset.py lists and reads tars through these.
"""
from __future__ import annotations

import contextlib
import lzma
import os
import re
import tarfile
import zlib
from pathlib import Path
from typing import Iterator

from ..errors import SourceError

# WebDataset's own fields, which it skips (tariterators.tar_file_iterator's skip_meta): `__name__` at the top,
# or a `__name__/` directory; `__a.jpg` and `d/__b.jpg` are samples like any other.
_WDS_META = re.compile(r"__[^/]*__($|/)")
META_LIMIT = 1 << 20  # a .cls, .txt or .json member larger than this is not metadata
HEADER_LIMIT = 1 << 20  # a pax or GNU long-name header larger than this is not read (real ones are a few KB)
_EXTENDED = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)


class _Info(tarfile.TarInfo):
    """tarfile's member header, with what tarfile would read whole bounded: an extended header (pax, GNU
    long name) over HEADER_LIMIT is stepped over unread and the member it describes marked `bad`; a GNU
    sparse member is marked `bad` (unsupported) without collecting its map. `bad`: (reason, detail) or None."""

    bad: tuple[str, str] | None = None

    def _proc_member(self, tf):
        if self.type in _EXTENDED and self.size > HEADER_LIMIT:
            what = "pax" if self.type in (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE) else "GNU long-name"
            tf.fileobj.seek(tf.fileobj.tell() + self._block(self.size))  # forward, a block at a time: nothing held
            try:
                nxt = self.fromtarfile(tf)
            except tarfile.HeaderError as e:
                raise tarfile.SubsequentHeaderError(str(e)) from None
            nxt.offset = self.offset
            nxt.bad = ("bad header", f"{nxt.name}: its {what} header declares {self.size:,} bytes, over the "
                                     f"{HEADER_LIMIT:,} a header may have (not read)")
            return nxt
        return super()._proc_member(tf)

    def _proc_sparse(self, tf):  # tarfile's, less the map (unbounded: a block per 21 entries, as many as declared)
        _, extended, origsize = self._sparse_structs
        del self._sparse_structs
        blocks = 0
        while extended:
            buf = tf.fileobj.read(tarfile.BLOCKSIZE)
            blocks += 1
            if len(buf) < tarfile.BLOCKSIZE or blocks * tarfile.BLOCKSIZE > HEADER_LIMIT:
                raise tarfile.InvalidHeaderError("a GNU sparse header cut short or over the header limit")
            extended = bool(buf[504])
        self.sparse = []
        self.offset_data = tf.fileobj.tell()
        tf.offset = self.offset_data + self._block(self.size)
        self.size = origsize
        self.bad = ("unsupported member", f"{self.name}: a GNU sparse member")
        return self

    def _proc_gnusparse_10(self, next, pax_headers, tf):  # noqa: A002 (tarfile's names); its map is not read
        next.sparse = []
        next.bad = ("unsupported member", f"{next.name}: a GNU sparse member")


def split_key(name: str) -> tuple[str, str]:
    """WebDataset's (key, extension) of a member name: the extension is everything after the first dot of
    the file name, lowercased."""
    d, base = os.path.split(name)
    stem, dot, ext = base.partition(".")
    return (os.path.join(d, stem) if d else stem), ext.lower()


def _compressed(path: Path) -> bool:
    """A gzip, bzip2 or xz tar (read in one pass), not a plain one (read by seeking)?"""
    with open(path, "rb") as f:
        head = f.read(6)
    return head.startswith((b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00"))


def _each(tf: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    """A tar's members one at a time, forgetting each (tarfile keeps every TarInfo it has read: a tar of
    millions of members would hold them all)."""
    while True:
        m = tf.next()
        if m is None:
            return
        tf.members = []
        yield m


def _decompressing(raw):
    """A tar's decompressed bytes as a file (gzip, bzip2 or xz; else the file itself): decompressed a buffer at
    a time, where tarfile's own stream decompresses each 10 KB it reads whole (a bzip2 10 KB can inflate to
    gigabytes) and copies its leftovers on every read (about twice as slow to step over a 3 GiB member)."""
    import bz2
    import gzip

    head = raw.read(6)
    raw.seek(0)
    if head.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if head.startswith(b"BZh"):
        return bz2.BZ2File(raw)
    if head.startswith(b"\xfd7zXZ\x00"):
        return lzma.LZMAFile(raw)
    return contextlib.nullcontext(raw)


class _Groups:
    """Consecutive groups (key, [(ext, member name, data offset, size, metadata bytes, bad)]) of a tar, one at a
    time (only the group being gathered is held); after the pass, `stopped`: why the listing stopped early (a
    truncated or damaged tar) or None, and `cut`: the group it stopped in (its members perhaps incomplete),
    not given as a group. Metadata members are read (up to META_LIMIT); images are not."""

    def __init__(self, path: Path):
        self.path = path
        self.stopped: str | None = None
        self.cut: tuple[str, list] | None = None
        try:
            self.tf = tarfile.open(path, "r:*", tarinfo=_Info)
        except (tarfile.TarError, EOFError, zlib.error) as e:  # an HTML page, a zstd tar: nothing here was ever a tar
            raise SourceError(f"{path}: not a tar file that can be read (plain, gzip, bzip2 or xz): {str(e).splitlines()[0]}") from None
        except OSError as e:
            raise SourceError(f"{path}: {e.strerror or e}") from None

    def __iter__(self) -> Iterator[tuple[str, list]]:
        total = self.path.stat().st_size
        gz = _compressed(self.path)
        tf = self.tf
        group: tuple[str, list] | None = None
        try:
            with tf:
                for m in _each(tf):
                    if not m.isfile():
                        continue
                    key, ext = split_key(m.name)
                    if not ext or _WDS_META.match(m.name) or os.path.basename(m.name).startswith("."):
                        continue  # what WebDataset skips too: no extension, its own `__key__`-like fields, hidden files
                    if group is None or group[0] != key:  # first: the sample a cut member belongs to is the one cut
                        if group is not None:
                            yield group
                        group = (key, [])
                    if not gz and m.offset_data + m.size > total:
                        self.stopped = f"{m.name} is cut short ({total - m.offset_data} of {m.size} bytes)"
                        break
                    bad = m.bad or (("unsupported member", f"{m.name}: a GNU sparse member") if m.sparse is not None else None)
                    meta = None
                    if ext in ("cls", "txt", "json") or ext.endswith((".cls", ".txt", ".json")):
                        if m.size > META_LIMIT or bad:
                            meta = b""
                        else:
                            f = tf.extractfile(m)
                            meta = f.read() if f is not None else b""
                            if len(meta) != m.size:
                                self.stopped = f"{m.name} is cut short"
                                break
                    group[1].append((ext, m.name, m.offset_data, m.size, meta, bad))
                else:  # a plain or compressed tar whose members ran out: at its end-of-archive block, or cut or damaged?
                    self.stopped = _no_end(tf.fileobj, tf.offset)
        except (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError, ValueError, IndexError) as e:
            self.stopped = f"{type(e).__name__}: {e}"
        if group is not None:
            if self.stopped:
                self.cut = group  # the members after the cut may have been its own
            else:
                yield group


def _names_of(path: Path, keys: set[str]) -> dict[str, list[str]]:
    """The member names of `keys` in a tar, over all their groups (a second pass over its headers, made only
    for a tar that has duplicate keys, to say what it holds)."""
    out: dict[str, list[str]] = {k: [] for k in keys}
    try:
        with tarfile.open(path, "r:*", tarinfo=_Info) as tf:
            for m in _each(tf):
                if m.isfile():
                    key, ext = split_key(m.name)
                    if key in out and ext and not _WDS_META.match(m.name) and not os.path.basename(m.name).startswith("."):
                        out[key].append(m.name)
    except (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError, ValueError, IndexError):
        pass  # as far as it reads: the first pass said where it stops
    return out


def _no_end(f, offset: int) -> str | None:
    """Why a tar whose members ran out at `offset` has no end-of-archive block there (cut inside or just
    before a member header, or a garbled header: tarfile ends the listing there without a word), or None.
    `f` is the tar's file object as tarfile reads it: the file, or its decompressed stream for a gzip, bzip2
    or xz tar (offsets are then in the decompressed tar; the block just read back is still in its buffer)."""
    f.seek(offset)
    block = f.read(tarfile.BLOCKSIZE)
    if len(block) == tarfile.BLOCKSIZE and not block.strip(b"\0"):
        return None
    if len(block) < tarfile.BLOCKSIZE:
        return f"the tar ends at byte {offset + len(block)}, " + (
            "inside a member header" if block else "where a member header or its end-of-archive block should follow")
    return f"the member header at byte {offset} is damaged"
