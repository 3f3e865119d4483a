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

Tar members, their headers bounded and grouped by key, are tar_members.py's; a sample's label and
caption wds_labels.py's. Their names are still served from here.
"""
from __future__ import annotations

import lzma
import os
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from ..errors import ImageDecodeError, SourceError
from ..limits import IMAGE_MAX_BYTES, over_cap
from .listing import Skips, Source, expand, labelled_split, skip, skip_counts

# tar_members.py's and wds_labels.py's names: those used here, and the rest still importable from here, where they lived before
from .tar_members import (  # noqa: F401
    _EXTENDED,
    _WDS_META,
    HEADER_LIMIT,
    META_LIMIT,
    _compressed,
    _decompressing,
    _each,
    _Groups,
    _Info,
    _names_of,
    _no_end,
    split_key,
)
from .wds_labels import _json_keys, _label_caption, _note_disagreements, _value  # noqa: F401

# WebDataset's extensions for image members (what its decoders take); the content is sniffed later anyway.
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "ppm", "pgm", "pbm", "bmp", "tif", "tiff", "gif")


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
