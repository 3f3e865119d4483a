"""WebDataset listing: takes tar shards (brace patterns such as `train-{000000..000127}.tar`, globs; plain
or compressed), gives one split whose samples are the keys that hold an image, labelled from `.cls` or a JSON
field, captioned from `.txt` or a JSON field, each recorded as `shard.tar:key`.

Samples are grouped as WebDataset groups them: consecutive members whose names share everything up to
the first dot of the file name (`dir/000123.jpg`, `dir/000123.cls` -> key `dir/000123`). What cannot be
used is skipped with its reason, never silently: a key with no image, one with two images, a label or
caption that is missing where the others have one, a damaged member, a tar cut short (its complete
members are kept). Reading a plain tar seeks to each member (any shard of it, in parallel); a gzip tar is
read in one pass per tar. Nothing is unpacked to disk.

Memory is bounded whatever a tar declares: an image member over the byte cap (`max_bytes`, default
`limits.IMAGE_MAX_BYTES`) is skipped from its declared size (a pax `size` included) before a byte of it is
read, at listing and again at build time; a pax or GNU long-name header over `HEADER_LIMIT` is stepped over
unread (tarfile would hold it whole: 1.6 GB for a 1.6 MB .tar.gz) and the member it describes skipped; the
listing streams through the members, holding a group at a time (and each key, to find duplicates), never
every member.
"""
from __future__ import annotations

import contextlib
import json
import lzma
import os
import re
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from ..errors import ImageDecodeError, SourceError
from ..limits import IMAGE_MAX_BYTES, over_cap
from .listing import Skips, Source, expand, labelled_split, skip, skip_counts

# WebDataset's extensions for image members (what its decoders take); the content is sniffed later anyway.
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "ppm", "pgm", "pbm", "bmp", "tif", "tiff", "gif")
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


@dataclass(frozen=True)
class TarReader:
    """Reads tar members: a locator is (tar relative to the root, member name, data offset, size,
    compressed). Plain tars are read by seeking to each member; compressed ones (gzip, bzip2, xz) in one
    pass: the driver asks `unit_sequential` per tar (`sequential`, the protocol's split-wide answer, is False)."""

    sequential: bool = False
    max_bytes: int | None = None  # the cap on one member's bytes (None: limits.IMAGE_MAX_BYTES)

    @staticmethod
    def unit_sequential(locator) -> bool:
        """A compressed tar is read in one pass; a plain one by seeking (its shards in parallel)."""
        return bool(locator[4])

    def open(self, root: str, refs: Sequence[str], locators: Sequence[Any]) -> Iterator[bytes | ImageDecodeError]:
        cap = IMAGE_MAX_BYTES if self.max_bytes is None else self.max_bytes
        i = 0
        while i < len(locators):
            tar = locators[i][0]
            j = i
            while j < len(locators) and locators[j][0] == tar:
                j += 1
            path = os.path.join(root, tar)
            if locators[i][4]:
                yield from _stream(path, refs[i:j], locators[i:j], cap)
            else:
                yield from _seek(path, refs[i:j], locators[i:j], cap)
            i = j


def _too_large(ref: str, member: str, size: int, cap: int) -> ImageDecodeError | None:
    big = over_cap(size, cap)
    return None if big is None else ImageDecodeError(ref, "too large", f"{member}: {big}")


def _seek(path: str, refs, locators, cap: int = IMAGE_MAX_BYTES) -> Iterator[bytes | ImageDecodeError]:
    with _open_listed(path) as f:
        for ref, (_, member, offset, size, _) in zip(refs, locators):
            err = _too_large(ref, member, size, cap)
            if err is None:
                try:
                    f.seek(offset)
                    data = f.read(size)
                except MemoryError:
                    err = ImageDecodeError(ref, "too large", f"{member}: out of memory reading its {size:,} bytes")
                else:
                    if len(data) != size:
                        err = ImageDecodeError(ref, "truncated archive", f"{member}: {len(data)} of {size} bytes in the tar")
            if err is None:
                yield data
            else:
                yield err
            data = None  # not held while the next member is read


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


def _open_listed(path: str):
    """A listed tar, opened to read its samples: one that is gone or unreadable now (deleted since the listing,
    not visible from a Dask worker) fails the build naming it, never a skip per sample."""
    try:
        return open(path, "rb")
    except OSError as e:
        raise SourceError(f"{path}: the tar listed cannot be opened to read its samples ({e.strerror or e})") from None


def _stream(path: str, refs, locators, cap: int = IMAGE_MAX_BYTES) -> Iterator[bytes | ImageDecodeError]:
    """One pass over a (gzip) tar, yielding the wanted members in order: the file member listed at that
    offset (a link or an earlier member of the same name is not it), none of it read when its declared size
    is over the cap."""
    wanted = iter(zip(refs, locators))
    ref, loc = next(wanted, (None, None))
    try:
        with _open_listed(path) as raw, _decompressing(raw) as plain, tarfile.open(fileobj=plain, mode="r|*", tarinfo=_Info) as tf:
            for m in _each(tf):
                if loc is None:
                    return
                if m.name != loc[1] or m.offset_data != loc[2] or not m.isfile():
                    continue
                err = _too_large(ref, m.name, m.size, cap) or (ImageDecodeError(ref, *m.bad) if m.bad else None)
                data = b""
                if err is None:
                    try:
                        f = tf.extractfile(m)
                        data = f.read(m.size) if f is not None else b""
                    except MemoryError:
                        err = ImageDecodeError(ref, "too large", f"{m.name}: out of memory reading its {m.size:,} bytes")
                    else:
                        if len(data) != loc[3]:
                            err = ImageDecodeError(ref, "truncated archive", f"{m.name}: {len(data)} of {loc[3]} bytes")
                if err is None:
                    yield data
                else:
                    yield err
                data = None  # not held while the pass goes on
                ref, loc = next(wanted, (None, None))
    except (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError, ValueError, IndexError) as e:
        reason = f"{type(e).__name__}: {e}"
    else:
        reason = "member not found on the second read"
    while loc is not None:  # what the pass did not reach
        yield ImageDecodeError(ref, "truncated archive", reason)
        ref, loc = next(wanted, (None, None))


def _value(doc: Any, field: str) -> Any:
    """A JSON document's value at a dotted path (`meta.label`), or None."""
    for part in field.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return None
        doc = doc[part]
    return doc


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


def scan_webdataset(patterns: Sequence[str], split: str = "train", label_field: str | None = None,
                    caption_field: str | None = None, root: str | os.PathLike | None = None, strict: bool = False,
                    max_bytes: int | None = None) -> Source:
    """List tar shards into one split. Labels: `label_field` of the `.json` member when one is named (an
    integer, or a class name: classes are then the sorted names), else a `.cls` member (an integer). A
    field the user names wins over `.cls`: a sample whose `.json` lacks it has no label (and is skipped
    when others have one), and where both exist and disagree the split's summary says how often. Captions:
    `caption_field` of the `.json` when named, else `.txt`. A split where no sample has a label is
    unlabelled (as flat folders are). `strict` (the build's --strict): the first sample the listing would
    skip refuses the tars instead. `max_bytes`: the cap on one image member's bytes (None:
    `limits.IMAGE_MAX_BYTES`); a member declaring more is skipped ("too large"), here and when built."""
    cap = IMAGE_MAX_BYTES if max_bytes is None else max_bytes
    tars = expand(patterns, "tar file")
    base = Path(root) if root is not None else Path(os.path.commonpath([str(p.resolve().parent) for p in tars]))
    refs, locators, units, raw_labels, captions, skipped = [], [], [], [], [], Skips()
    cls_of: dict[str, int] = {}  # ref -> its .cls, where --label-field gave the label: to count disagreements
    first_json = None  # (sample, bytes) of the first .json member: its keys name what a misspelled field missed
    used = ("cls", "txt", "json") if label_field or caption_field else ("cls", "txt")
    for u, tar in enumerate(tars):
        rel = os.path.relpath(tar.resolve(), base.resolve())
        gz = _compressed(tar)
        groups = _Groups(tar)
        start = len(refs)
        seen: dict[str, int] = {}  # key -> the index of its sample in `refs`, or -1 (its first group made none)
        duplicated: dict[str, None] = {}  # keys found twice, in the order found
        drop: set[int] = set()  # samples of keys found twice later
        n_groups = 0
        for key, members in groups:
            n_groups += 1
            ref = f"{rel}:{key}"
            if key in seen or len({m[1] for m in members}) != len(members):
                # a key or member that occurs twice (`tar -r` appends, repeats apart): which copy is meant is unclear,
                # and `shard.tar:key` would not name one sample
                duplicated[key] = None
                if seen.get(key, -1) >= 0:
                    drop.add(seen[key])
                seen[key] = -1
                continue
            seen[key] = -1
            bad = next((m[5] for m in members if m[5]), None)
            if bad:
                skip(skipped, {"source": ref, "reason": bad[0], "detail": bad[1]}, strict)
                continue
            images = [m for m in members if m[0] in IMAGE_EXTS]
            if not images:
                skip(skipped, {"source": ref, "reason": "no image", "detail": "members: " + ", ".join(m[0] for m in members)}, strict)
                continue
            if len(images) > 1:
                skip(skipped, {"source": ref, "reason": "two images",
                                "detail": "one sample holds " + ", ".join(m[1] for m in images) + "; which is meant is unclear"}, strict)
                continue
            _, name, offset, size, _, _ = images[0]
            big = over_cap(size, cap)
            if big is not None:  # its bytes are never read: skipped from the size its header declares
                skip(skipped, {"source": ref, "reason": "too large", "detail": f"{name}: {big}"}, strict)
                continue
            meta_big = [m for m in members if m[0] in used and m[3] > META_LIMIT]
            if meta_big:  # its bytes were not read: an empty caption or label would stand in for them
                skip(skipped, {"source": ref, "reason": "bad metadata",
                                "detail": f"{meta_big[0][1]} is {meta_big[0][3]} bytes, over the {META_LIMIT} a metadata member may have"}, strict)
                continue
            meta = {m[0]: m[4] for m in members if m[4] is not None}
            if first_json is None and "json" in meta:
                first_json = (ref, meta["json"])
            try:
                label, caption, cls = _label_caption(meta, label_field, caption_field)
            except ValueError as e:
                skip(skipped, {"source": ref, "reason": "bad metadata", "detail": str(e)}, strict)
                continue
            seen[key] = len(refs)
            refs.append(ref)
            if cls is not None and label is not None:
                cls_of[ref] = cls
            locators.append((rel, name, int(offset), int(size), gz))
            units.append(u)
            raw_labels.append(label)
            captions.append(caption)
        cut = groups.cut
        if cut is not None and cut[0] in seen:  # the cut group repeats an earlier key: that one is a duplicate too
            duplicated[cut[0]] = None
            if seen[cut[0]] >= 0:
                drop.add(seen[cut[0]])
        if duplicated:
            names = _names_of(tar, set(duplicated))
            for key in duplicated:
                skip(skipped, {"source": f"{rel}:{key}", "reason": "duplicate key",
                                "detail": "the tar holds " + ", ".join(names[key]) + "; no copy is used"}, strict)
        if drop:
            keep = [i for i in range(start, len(refs)) if i not in drop]
            for ref in (refs[i] for i in drop):
                cls_of.pop(ref, None)
            for seq in (refs, locators, units, raw_labels, captions):
                seq[start:] = [seq[i] for i in keep]
        if groups.stopped:
            skip(skipped, {"source": f"{rel}:{cut[0]}" if cut else rel, "reason": "truncated archive",
                            "detail": f"{groups.stopped}; the {n_groups} sample(s) before it are kept"
                                      + (", this one (perhaps incomplete) is not" if cut else "")}, strict)
    if not refs:
        raise SourceError(f"{', '.join(map(str, patterns))}: no sample with an image in {len(tars)} tar file(s)"
                          + (" (skipped: " + ", ".join(f"{n} {r}" for r, n in skip_counts(skipped).most_common())
                             + f"; the first: {skipped[0]['source']}: {skipped[0]['detail']})" if skipped else ""))
    for option, field, values in (("--label-field", label_field, raw_labels), ("--caption-field", caption_field, captions)):
        if field and all(v is None for v in values):  # a misspelled field would give an unlabelled or uncaptioned pack
            raise SourceError(f"{', '.join(map(str, patterns))}: no sample's .json has {option} {field!r}"
                              + "; " + _json_keys(first_json))
    source = labelled_split("webdataset", base, split, refs, raw_labels, captions, skipped,
                         {"tars": [os.path.relpath(t.resolve(), base.resolve()) for t in tars],
                          **({"label_field": label_field} if label_field else {}),
                          **({"caption_field": caption_field} if caption_field else {})},
                         reader=TarReader(max_bytes=max_bytes), locators=locators,
                         units=np.asarray(units, np.int64), strict=strict)
    if cls_of:
        _note_disagreements(source, label_field, cls_of)
    return source


def _note_disagreements(source: Source, label_field: str, cls_of: dict[str, int]) -> None:
    """Where a sample has both a `.cls` and the named `label_field`, and the class `.cls` names is not the
    one the field gave: say how many, and an example, under the split's summary (and in the manifest)."""
    split = source.splits[0]
    both = wrong = 0
    first = None
    for ref, label in zip(split.paths, split.labels.tolist()):
        if ref in cls_of:
            both += 1
            if cls_of[ref] != label:
                wrong += 1
                first = first or (ref, label, cls_of[ref])
    source.details["label_disagreements"] = wrong
    if wrong:
        ref, label, cls = first
        name = f"{source.classes[label]!r} (class {label})" if source.classes and source.classes[label] != str(label) else str(label)
        split.notes.append(f"--label-field {label_field} and .cls disagree on {wrong:,} of {both:,} samples that have both "
                           f"(the first: {ref}: {label_field} {name}, .cls {cls}); labels follow --label-field")


def _json_keys(first: tuple[str, bytes] | None) -> str:
    """What the first sample's .json holds, for an error about a field none has."""
    if first is None:
        return "no sample has a .json member"
    try:
        doc = json.loads(first[1].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return f"the first .json ({first[0]}) does not parse"
    if not isinstance(doc, dict):
        return f"the first .json ({first[0]}) is a {type(doc).__name__}, not an object"
    return f"the first .json ({first[0]}) has keys: " + (", ".join(map(str, doc)) or "none")


def _label_caption(meta: dict[str, bytes], label_field: str | None, caption_field: str | None):
    label = caption = None
    doc = None
    if "json" in meta and (label_field or caption_field):
        try:
            doc = json.loads(meta["json"].decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f".json does not parse ({e})") from None
    cls = None
    if "cls" in meta:
        text = meta["cls"].decode("utf-8", "replace").strip()
        try:
            cls = int(text)
        except ValueError:
            if not label_field:  # with a named field, .cls is only compared, never used
                raise ValueError(f".cls holds {text[:40]!r}, not an integer") from None
    if label_field:
        if doc is not None:
            label = _value(doc, label_field)
            if label is not None and not isinstance(label, (int, str)) or isinstance(label, bool):
                raise ValueError(f"{label_field} is {label!r}, not an integer or a class name")
    else:
        label = cls
    if caption_field and doc is not None:
        caption = _value(doc, caption_field)
        if caption is not None and not isinstance(caption, str):
            raise ValueError(f"{caption_field} is {type(caption).__name__}, not text")
    elif "txt" in meta:
        try:
            caption = meta["txt"].decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f".txt is not UTF-8 ({e})") from None
    return label, caption, cls
