"""Listings: what every source gives the build, whatever holds the samples (files in folders, members of
tar archives, rows of Parquet or Arrow tables, a list of paths): per split, each sample's reference (what
the pack records as its `source`), its label and caption, and how its bytes are read (a `Reader`).

A reader is picklable and stateless: a build task opens it on its own samples, in the pack's order, and
gets each sample's bytes (or the reason it has none) one at a time, so memory never holds more than one
sample's source however large the archive or row group. Samples of one *unit* (a tar, a row group) are
never split over two shards' containers in a way that reads a unit twice: the driver (driver.py) cuts shards
inside units and, for readers that must stream (`sequential`: a gzip tar, a row group), gives all the
shards of one unit to one task, which reads the unit once.
"""
from __future__ import annotations

import dataclasses
import glob
import os
import re
import stat
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Protocol, Sequence

import numpy as np

from ..errors import ImageDecodeError, SourceError
from ..limits import IMAGE_MAX_BYTES, over_cap

# Integer labels index the classes 0..max: a largest label at least this large and more than 100 times the
# number of distinct labels is an id, not a class index (labels 0 and 3,000,000 would make 3,000,001
# classes), and is refused. A real label set never trips it: ImageNet-21k's 21,841 classes are far below,
# and a set of millions of classes (face identities) uses most of its indices.
SPARSE_LABELS = 1_000_000


def spread(n: int, limit: int | None) -> np.ndarray | None:
    """Indices of `limit` of n items spread evenly from first to last (None: take them all). Every
    split kind's `limited` uses it, so --limit samples the same way for every build."""
    if limit is None or limit >= n:
        return None
    return np.unique(np.linspace(0, n - 1, limit).round().astype(np.int64))


def spread_by_class(labels, limit: int | None) -> np.ndarray | None:
    """Indices of `limit` labelled items in their order: every class gets at least one when `limit` allows
    (else `limit` classes spread over the class list get one each), the rest is shared in proportion to
    the classes' sizes (largest remainders), each class's items spread evenly from first to last. (An even
    spread over the whole list missed a small class between large ones.) None: take them all."""
    labels = np.asarray(labels)
    n = len(labels)
    if limit is None or limit >= n:
        return None
    classes, counts = np.unique(labels, return_counts=True)
    quota = np.zeros(len(classes), np.int64)
    if limit < len(classes):
        if limit:
            quota[spread(len(classes), limit)] = 1
    else:
        room = counts - 1
        share = (limit - len(classes)) * room / max(int(room.sum()), 1)
        quota = 1 + np.floor(share).astype(np.int64)
        left = limit - int(quota.sum())
        for c in np.argsort(-(share - np.floor(share)), kind="stable"):  # largest remainders, within each class's size
            if left <= 0:
                break
            if quota[c] < counts[c]:
                quota[c] += 1
                left -= 1
    picked = [np.zeros(0, np.int64)]
    for c, q in zip(classes, quota):
        members = np.flatnonzero(labels == c)
        if q:
            sub = spread(len(members), int(q))
            picked.append(members if sub is None else members[sub])
    return np.sort(np.concatenate(picked))


class Reader(Protocol):
    """How a split's samples' bytes are read: `open(root, locators)` yields, for each locator in order,
    the sample's bytes or an ImageDecodeError naming the sample and why it has none. `sequential`: the
    samples of one unit must be read in one pass (the driver gives a unit's shards to one task)."""

    sequential: bool

    def open(self, root: str, refs: Sequence[str], locators: Sequence[Any]) -> Iterator[bytes | ImageDecodeError]: ...


@dataclass(frozen=True)
class FileReader:
    """Files relative to the root (the locators are unused: a sample's reference is its path). `max_bytes`:
    the cap on one file's bytes (None: `limits.IMAGE_MAX_BYTES`); `confine`: the file opened must lie under
    the root (a listing that refused paths leaving it: a symlink swapped in after the listing is refused too)."""

    sequential: bool = False
    max_bytes: int | None = None
    confine: bool = False

    def open(self, root: str, refs: Sequence[str], locators: Sequence[Any]) -> Iterator[bytes | ImageDecodeError]:
        for ref in refs:
            path = os.path.join(root, ref)
            try:
                yield read_source(path, self.max_bytes, root if self.confine else None)
            except ImageDecodeError as e:
                yield e


FILES = FileReader()


def capped(reader: Any, max_bytes: int | None) -> Any:
    """`reader` with the byte cap `max_bytes` (a build's `BuildSettings.max_bytes`), where it takes one;
    None keeps the reader's own (what the listing gave it)."""
    if max_bytes is None or not dataclasses.is_dataclass(reader) or "max_bytes" not in {f.name for f in dataclasses.fields(reader)}:
        return reader
    return replace(reader, max_bytes=max_bytes)


def read_source(path: str, max_bytes: int | None = None, root: str | None = None) -> bytes:
    """A source file's bytes: only a regular file (a FIFO named .png would block, a symlink to /dev/zero
    never end), no more than the size it had when opened, and none at all when that size is over the cap
    `max_bytes` (None: `limits.IMAGE_MAX_BYTES`): checked on the opened descriptor, before anything is read.
    With `root`, the file opened must be under it (checked on the descriptor too, so a path swapped for a
    symlink after the listing checked it cannot bring an outside file in)."""
    fd, st = open_source(path, IMAGE_MAX_BYTES if max_bytes is None else max_bytes, root)
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(st.st_size)  # at most its size when opened (<= the cap), however it grows meanwhile
    except OSError as e:
        raise ImageDecodeError(path, "unreadable", e.strerror or str(e)) from None
    except MemoryError:
        raise ImageDecodeError(path, "too large", "out of memory reading it") from None
    finally:
        os.close(fd)


def open_source(path: str, cap: int, root: str | None = None,
                error: type[ImageDecodeError] = ImageDecodeError) -> tuple[int, os.stat_result]:
    """Open a source file for reading, refusing what `read_source` refuses (not a regular file, over `cap`
    bytes, outside `root`), checked on the descriptor: opened without blocking, so a FIFO is refused at once.

    Args:
        path: The file.
        cap: The most bytes it may hold.
        root: Where the file opened must be (None: anywhere).
        error: The error class raised (path, reason, detail): the kind's decode error.

    Returns:
        (a blocking descriptor the caller closes, its stat).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))  # a FIFO opens at once instead of waiting
    except IsADirectoryError:
        raise error(path, "unreadable", "is a directory") from None
    except OSError as e:
        raise error(path, "unreadable", e.strerror or str(e)) from None
    try:
        st = os.fstat(fd)
        if root is not None:
            where = _outside(fd, st, path, root)
            if where is not None:
                raise error(path, "outside the root", where)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device or socket"
            raise error(path, "not a regular file", f"it is {kind}")
        big = over_cap(st.st_size, cap)
        if big is not None:
            raise error(path, "too large", big)
        os.set_blocking(fd, True)
        return fd, st
    except OSError as e:
        os.close(fd)
        raise error(path, "unreadable", e.strerror or str(e)) from None
    except BaseException:
        os.close(fd)
        raise


def _outside(fd: int, st: os.stat_result, path: str, root: str) -> str | None:
    """Why the file open on `fd` is not under `root`, or None when it is: the descriptor's own path
    (/proc/self/fd/N), else (no /proc) the path as it resolves now, which must also name the file opened."""
    real_root = os.path.realpath(root)

    def inside(p: str) -> bool:
        return p == real_root or p.startswith(real_root.rstrip(os.sep) + os.sep)

    try:
        where = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        where = None
    if where is not None and where.startswith(os.sep):
        ok = inside(where)
    else:
        where = os.path.realpath(path)
        try:
            now = os.stat(where)
            ok = inside(where) and (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)
        except OSError:
            ok = False
    return None if ok else f"the file opened is {where}, outside {real_root} (a path changed to a symlink since the listing?)"


@dataclass
class SplitSource:
    """One split in pack order: each sample's reference (`paths`: a path relative to the source root, or
    `shard.tar:key`, `file.parquet:row`), label, optional caption, and where its bytes are (`reader` and
    its per-sample `locators`; files by default). `units`: the unit (tar, row group) of each sample, in
    runs; None for files."""

    name: str
    paths: list[str]
    labels: np.ndarray  # int64, index into Source.classes
    unlabeled: list[str] = field(default_factory=list)  # listed files with no label (reported as skipped)
    captions: list[str] | None = None
    reader: Any = FILES
    locators: list[Any] | None = None
    units: np.ndarray | None = None
    skipped: list[dict] = field(default_factory=list)  # samples the listing already could not use, with reasons
    notes: list[str] = field(default_factory=list)  # what the listing found worth saying, printed under the split's summary

    def limited(self, limit: int | None) -> "SplitSource":
        """A deterministic sample of `limit` samples in which every class shows up (`spread_by_class`)."""
        idx = spread_by_class(self.labels, limit)
        if idx is None:
            return self
        return self.take(idx)

    def take(self, idx: np.ndarray) -> "SplitSource":
        """Samples `idx` (in order) of this split."""
        pick = lambda seq: None if seq is None else [seq[i] for i in idx]  # noqa: E731
        return replace(self, paths=pick(self.paths), labels=np.asarray(self.labels)[idx], unlabeled=[],
                       captions=pick(self.captions), locators=pick(self.locators),
                       units=None if self.units is None else np.asarray(self.units)[idx], skipped=[])

    def skipped_before(self) -> list[dict]:
        """Samples listed but not built, as skipped-sample records (summarised past `SKIP_RECORDS` of a reason:
        `skip_counts` counts them)."""
        if not self.unlabeled:
            return self.skipped
        return Skips([{"source": p, "reason": "no label", "detail": "not in the labels file"} for p in self.unlabeled]
                     + list(self.skipped))

    def unit_bounds(self) -> list[tuple[int, int]]:
        """(start, stop) of each run of samples of one unit; the whole split when it has no units."""
        if self.units is None or not len(self.paths):
            return [(0, len(self.paths))]
        u = np.asarray(self.units)
        cuts = np.flatnonzero(u[1:] != u[:-1]) + 1
        edges = [0, *cuts.tolist(), len(u)]
        return list(zip(edges[:-1], edges[1:]))


@dataclass
class Source:
    layout: str
    root: Path
    classes: list[str]
    class_names: list[str] | None
    splits: list[SplitSource]
    val_labels: Path | None = None  # the labels file a flat val folder was labelled from (recorded in the manifest)
    details: dict[str, Any] = field(default_factory=dict)  # what the manifest's "source" records beside layout and root

    def planned(self, limit: int | None = None) -> int:
        """Samples a build will try, over all splits."""
        return sum(len(s.limited(limit).paths) for s in self.splits)


def _is_text(caption: str) -> bool:
    """Whether a caption is Unicode text that UTF-8 can store (a JSON string may hold a lone surrogate)."""
    try:
        caption.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# Skip records kept one by one per reason: past this, one summary record per reason counts the rest ("count"),
# so a tar of a million unusable members costs a few thousand records in memory and in the manifest, not a
# million (119 MB of manifest, seconds to open the pack). Counts stay exact: `skip_counts`.
SKIP_RECORDS = 1000


class Skips(list):
    """Skip records (source, reason, detail) as a listing gathers them, at most `per_reason` of each reason
    one by one; the rest of a reason are one record whose "count" says how many samples it stands for (its
    source is the first of them). A list: what goes into the manifest as it is."""

    def __init__(self, records=(), per_reason: int = SKIP_RECORDS):
        super().__init__()
        self.per_reason = per_reason
        self._kept: Counter = Counter()
        self._rest: dict[str, dict] = {}
        self._first: dict[str, str] = {}  # reason -> the detail of the first record summarised
        for r in records:
            self.add(r)

    def add(self, record: dict) -> None:
        reason, n = record["reason"], int(record.get("count", 1))
        if n == 1 and self._kept[reason] < self.per_reason:
            self._kept[reason] += 1
            self.append(record)
            return
        rest = self._rest.get(reason)
        if rest is None:
            rest = self._rest[reason] = {"source": record["source"], "reason": reason, "detail": "", "count": 0}
            self._first[reason] = record["detail"]
            self.append(rest)
        rest["count"] += n
        rest["detail"] = (f"and {rest['count']:,} more {reason} (summarised past {self.per_reason:,} records of a reason; "
                          f"the first of them: {rest['source']}: {self._first[reason]})")

    def __reduce__(self):  # a plain list of records when pickled (to a worker, into a shard's metadata)
        return (list, (list(self),))


def skip_counts(records) -> Counter:
    """Skipped samples per reason, counting what a summary record (`Skips`) stands for."""
    out: Counter = Counter()
    for r in records:
        out[r["reason"]] += int(r.get("count", 1))
    return out


def skip(skipped: list[dict], record: dict, strict: bool = False) -> None:
    """Record a sample the listing cannot use (a skip record: source, reason, detail); with `strict` (the
    build's --strict), refuse the source instead, naming the sample and why. Into a `Skips`, past
    `SKIP_RECORDS` of a reason the record only counts."""
    if strict:
        raise SourceError(f"{record['source']}: {record['reason']} ({record['detail']}); --strict: refusing the source "
                          "instead of skipping the sample")
    if isinstance(skipped, Skips):
        skipped.add(record)
    else:
        skipped.append(record)


def expand(patterns: Sequence[str], what: str = "file") -> list[Path]:
    """Brace patterns (`{000..127}` ranges keep their zero padding, `{a,b}` lists) and globs, in the order
    given, each matching at least one file (`what` names them in errors: "tar file")."""
    out: list[Path] = []
    for pattern in patterns:
        found: list[str] = []
        for p in _braces(str(pattern)):
            hits = sorted(glob.glob(p)) if glob.has_magic(p) else ([p] if os.path.exists(p) else [])
            if not hits and not glob.has_magic(p):  # a shard missing from a range is an error, as in WebDataset
                raise SourceError(f"{p}: no such {what}" + (f" (one of {pattern})" if p != str(pattern) else ""))
            found += hits
        if not found:
            raise SourceError(f"{pattern}: matches no file")
        out += [Path(f) for f in found]
    seen, unique = set(), []
    for p in out:
        if p.resolve() not in seen:
            seen.add(p.resolve())
            unique.append(p)
    for p in unique:
        if not p.is_file():
            raise SourceError(f"{p}: not a file")
    return unique


def _braces(s: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", s)
    if not m:
        return [s]
    head, body, tail = s[: m.start()], m.group(1), s[m.end():]
    r = re.fullmatch(r"(-?\d+)\.\.(-?\d+)", body)
    if r:
        lo, hi = r.group(1), r.group(2)
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
        step = 1 if int(hi) >= int(lo) else -1
        items = [str(i).zfill(width) for i in range(int(lo), int(hi) + step, step)]
    else:
        items = body.split(",")
    return [x for item in items for x in _braces(head + item + tail)]


def labelled_split(layout: str, root: Path, split: str, refs: list[str], raw_labels: list, captions: list,
                  skipped: list[dict], details: dict, *, strict: bool = False, **reader) -> Source:
    """A one-split Source from listed samples whose labels (ints, class names or None) and captions (str or
    None) were read from the data: labelled if any sample is, captioned if any sample is; a sample missing
    what the others have is skipped with its reason (with `strict`, refused: `skip`). Every table-like listing
    (tars, Parquet, lists) ends here; its skip records are summarised past `SKIP_RECORDS` of a reason."""
    if not isinstance(skipped, Skips):
        skipped = Skips(skipped)
    keep = np.ones(len(refs), bool)
    has_label = [x is not None for x in raw_labels]
    has_caption = [x is not None for x in captions]
    labelled, captioned = any(has_label), any(has_caption)
    for i, ref in enumerate(refs):
        if labelled and not has_label[i]:
            keep[i] = False
            skip(skipped, {"source": ref, "reason": "no label", "detail": "the other samples have one"}, strict)
        elif captioned and not has_caption[i]:
            keep[i] = False
            skip(skipped, {"source": ref, "reason": "no caption", "detail": "the other samples have one"}, strict)
        elif has_caption[i] and not _is_text(captions[i]):
            keep[i] = False
            skip(skipped, {"source": ref, "reason": "bad caption", "detail": "not Unicode text (a lone surrogate, as a JSON "
                                                                            "\\ud800 escape gives): UTF-8 cannot store it"}, strict)
    idx = np.flatnonzero(keep)
    names = [raw_labels[i] for i in idx] if labelled else []
    if any(isinstance(x, str) for x in names):
        if not all(isinstance(x, str) for x in names):
            a = next(k for k, x in zip(idx, names) if not isinstance(x, str))
            b = next(k for k, x in zip(idx, names) if isinstance(x, str))
            raise SourceError(f"labels mix integers and class names ({refs[a]}: {raw_labels[a]!r}, {refs[b]}: "
                              f"{raw_labels[b]!r}); give one or the other")
        classes = sorted(set(names))
        index = {c: k for k, c in enumerate(classes)}
        labels = np.asarray([index[x] for x in names], np.int64)
    elif names:
        labels = np.asarray(names, np.int64)
        if labels.min() < 0:
            bad = refs[int(idx[int(np.argmin(labels))])]
            raise SourceError(f"{bad}: label {int(labels.min())} is negative")
        top, distinct = int(labels.max()), len(np.unique(labels))
        if top >= SPARSE_LABELS and top + 1 > 100 * distinct:  # ids, not class indices: refuse before listing them all
            bad = refs[int(idx[int(np.argmax(labels))])]
            raise SourceError(f"{bad}: label {top} would make {top + 1} classes (integer labels index the classes "
                              f"0..{top}) for {distinct} distinct labels; give class names instead, or remap the labels "
                              f"to 0..{distinct - 1}")
        classes = [str(c) for c in range(top + 1)]
    else:
        labels, classes = np.zeros(len(idx), np.int64), []
    s = SplitSource(split, [refs[i] for i in idx], labels, captions=[captions[i] for i in idx] if captioned else None,
                    skipped=skipped, **{k: ([v[i] for i in idx] if isinstance(v, list) else
                                            (np.asarray(v)[idx] if isinstance(v, np.ndarray) else v))
                                        for k, v in reader.items()})
    if not len(idx):
        if not skipped:
            raise SourceError(f"{root}: no sample listed")
        reasons = ", ".join(f"{n} {reason}" for reason, n in skip_counts(skipped).most_common())
        first = skipped[0]
        raise SourceError(f"{root}: no usable sample (skipped: {reasons}; the first: {first['source']}: {first['reason']}: "
                          f"{first['detail']})")
    return Source(layout, root, classes, None, [s], details=details)
