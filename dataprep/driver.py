"""The shard driver every kind's build runs on: takes a listed source, the settings, a task maker and a
shard function, gives a pack.

plan (shards of a fixed number of samples, in source order) -> engine (one task per shard) ->
shard writer (atomic) -> manifest (written last). A file that cannot be decoded is skipped and
recorded with its reason, unless `strict`; one bad file never stops a build.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from .engine import Engine, LocalEngine
from .errors import NothingStored, PackExistsError, option
from .pack.backends import is_pack
from .pack.manifest import FORMAT_VERSION, KEPT_BESIDE, MANIFEST, MANIFEST_TMP, attachment_tmp
from .pack.names import check_name, inside
from .pack.shard import ShardWriter, remove_temporaries, reusable_shard, shard_name, write_shard
from .safe_paths import check_dir, check_links, make_dir
from .settings import BuildSettings
from .version import __version__


def task_fingerprint(head: list, rows: Iterable[tuple]) -> str:
    """The digest a shard task's output depends on: the format version and `head` (settings, shard
    number), then each input row (paths, labels) in order. Every shard kind's resume check uses it."""
    h = hashlib.sha256(json.dumps([FORMAT_VERSION, *head]).encode())
    for row in rows:
        h.update(b"\0".join(str(x).encode("utf-8", "surrogateescape") for x in row) + b"\n")
    return h.hexdigest()


_META = ("count", "skipped", "kept_jpeg", "source_bytes", "counts")


def reused_shard(task, fp: str) -> dict[str, Any] | None:
    """With `task.resume`: the record of the task's shard when it is finished, made from the same inputs
    and settings (`fp`) and intact by checksum; else None (build it). Every shard kind starts here."""
    if not task.resume:
        return None
    rec = reusable_shard(Path(task.split_dir), task.index, fp)
    if rec is None or any(k not in rec for k in _META):  # an older dataprep's shard lacks what this one records
        return None
    return {"name": shard_name(task.index), "files": rec["files"], **{k: rec[k] for k in _META}, "reused": True}


def finish_shard(task, fp: str, arrays: dict[str, np.ndarray], count: int, skipped: list[dict], kept_jpeg: int,
                 source_bytes: int, counts: dict[str, int] | None = None, shard: ShardWriter | None = None) -> dict[str, Any]:
    """Write a task's shard (atomically, with its fingerprint for --resume) and give the record the
    driver collects. Every shard kind ends here. `counts` are the kind's own tallies of the shard's
    samples (name -> n); the driver sums them per split (`SplitSummary.counts`), and a resumed build
    reads them back from the shard. `shard`: the writer a kind streamed part of the shard into (its
    blobs), which `arrays` join before it is committed; None writes `arrays` alone."""
    meta = {"count": count, "skipped": skipped, "kept_jpeg": kept_jpeg, "source_bytes": source_bytes,
            "counts": dict(sorted((counts or {}).items()))}
    if shard is None:
        files = write_shard(Path(task.split_dir), task.index, arrays, {"fingerprint": fp, **meta})
    else:
        for name, arr in arrays.items():
            shard.add(name, arr)
        files = shard.commit({"fingerprint": fp, **meta})
    return {"name": shard_name(task.index), "files": files, **meta, "reused": False}


@dataclass
class SplitSummary:
    name: str
    planned: int
    written: int = 0
    skipped: Counter = field(default_factory=Counter)
    bytes: int = 0
    source_bytes: int = 0
    kept_jpeg: int = 0
    shards: int = 0
    reused: int = 0
    kept: int = 0  # samples of the reused shards: written by an earlier run, not by this one
    counts: Counter = field(default_factory=Counter)  # the kind's tallies (finish_shard's `counts`), summed
    notes: list[str] = field(default_factory=list)  # the kind's lines about this split, printed under it


@dataclass
class BuildSummary:
    """What a build did: the pack, each split's counts and the time; `lines()` is what the CLI prints.
    The front door (dataprep/build.py) adds where the output went (`after`: stored as, uploaded to), the
    notices the build gave, and the val labels file an ImageNet build found."""

    out: Path
    splits: list[SplitSummary]
    seconds: float
    noun: str = "images"
    after: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    val_labels: Path | None = None

    @property
    def written(self) -> int:
        """Samples in the pack."""
        return sum(s.written for s in self.splits)

    @property
    def kept(self) -> int:
        """Samples of the shards a resumed build kept from an earlier run."""
        return sum(s.kept for s in self.splits)

    @property
    def built(self) -> int:
        """Samples this run wrote: what its rate is over."""
        return self.written - self.kept

    def lines(self) -> list[str]:
        out = [*self.after, f"pack: {self.out}"]
        for s in self.splits:
            skip = ", ".join(f"{n} {r}" for r, n in sorted(s.skipped.items())) or "none"
            kept = f"; {s.kept_jpeg} JPEGs kept as they were" if self.noun not in ("volumes", "videos") else ""  # those kinds keep no source JPEG
            out.append(
                f"  {s.name}: {s.written} of {s.planned} {self.noun} written, {s.bytes / 1e6:.1f} MB "
                f"(from {s.source_bytes / 1e6:.1f} MB of sources{kept}); skipped: {skip}"
            )
            out.extend(f"  {s.name}: {note}" for note in s.notes)
            if s.reused:
                out.append(f"  {s.name}: resumed: {s.reused} of {s.shards} shards were finished and intact, {s.shards - s.reused} built")
        out.append(self._rate_line())
        return out

    def _rate_line(self) -> str:
        """How much this run built and how fast; kept shards are said apart (they cost a checksum, not a build)."""
        built, kept = self.built, self.kept
        earlier = f"{kept:,} kept from an earlier run"
        if built and self.seconds > 0:
            line = f"  {built:,} {self.noun} built in {self.seconds:.1f} s, {built / self.seconds:,.0f} {self.noun}/s"
            return line + (f"; {earlier}" if kept else "")
        return f"  {built:,} {self.noun} built" + (f", {earlier}," if kept else "") + f" in {self.seconds:.1f} s"


TASK_RECORDS = ".task-records"  # a build's records of its finished tasks (token packs' --resume), removed once it is a pack


def prepare_output(out: Path, overwrite: bool, resume: bool = False) -> None:
    """Refuse to clobber a pack or foreign files, and to write where other users could interfere: an `out`
    (or the directory it is created in) that others can write, or that is not ours, is refused before
    anything is written (safe_paths.check_dir). `overwrite` empties a pack or unfinished build; `resume`
    keeps its shards for reuse. Either way the old manifest goes first (with the files kept beside it and
    any temporaries), so a crash during the rebuild never leaves a directory that claims to be complete.
    Nothing in `out` is followed when removed: a symlink is unlinked, never emptied; `out` itself may be a
    symlink only when it is ours and in a directory only we can write (safe_paths.check_links)."""
    check_links(out, "output directory")
    if out.is_symlink() and not out.exists():
        raise PackExistsError(f"{out}: is a dangling symlink; choose another {option('out', None)}")
    if out.exists() and not out.is_dir():
        raise PackExistsError(f"{out}: exists and is not a directory")
    if out.exists():
        check_dir(out, "output directory")
    if out.is_dir() and any(out.iterdir()):
        ours = is_pack(out) or all(_ours(p) for p in out.iterdir())
        if not ours:
            raise PackExistsError(f"{out}: holds files that are not a dataprep pack; refusing to write into it")
        if not (overwrite or resume):
            if is_pack(out):
                raise PackExistsError(f"{out}: already holds a pack; pass {option('overwrite')} to replace it, or choose another "
                                      f"{option('out', None)}")
            raise PackExistsError(
                f"{out}: holds an unfinished build; pass {option('resume')} to continue it, or {option('overwrite')} to start again"
            )
        (out / MANIFEST).unlink(missing_ok=True)
        for p in out.iterdir():  # a manifest whose writing was cut short, the files beside it and theirs
            if _beside_manifest(p.name) and (p.is_symlink() or not p.is_dir()):
                p.unlink()
        if overwrite:
            for p in out.iterdir():
                remove_entry(p)
    make_dir(out, "output directory")


def _beside_manifest(name: str) -> bool:
    return name.startswith(MANIFEST_TMP) or name in KEPT_BESIDE or any(name.startswith(attachment_tmp(k)) for k in KEPT_BESIDE)


def _ours(p: Path) -> bool:
    """Whether an entry of an unfinished build's directory is one a build writes: a split directory of shards,
    a file kept beside the manifest (or a temporary of one), a build's task records. A symlink is ours only
    under a file's name (it is unlinked, never followed); a split directory that is a symlink is not."""
    if _beside_manifest(p.name):
        return p.is_symlink() or p.is_file()
    if p.is_symlink() or not p.is_dir():
        return False
    if p.name == TASK_RECORDS:
        return all(c.is_file() and not c.is_symlink() for c in p.iterdir())
    return _looks_like_split(p)


def _looks_like_split(p: Path) -> bool:
    return all(not c.is_symlink() and c.is_dir() and (c.name.isdigit() or c.name.startswith(".tmp-")) for c in p.iterdir())


def remove_entry(p: Path) -> None:
    """Remove a file, a symlink (itself, never what it points at) or a directory tree (rmtree follows no symlink)."""
    if p.is_symlink() or not p.is_dir():
        p.unlink(missing_ok=True)
    else:
        shutil.rmtree(p)


def _remove_unplanned(out: Path, planned: dict[str, int]) -> None:
    """After a resumed build: drop shards and splits an earlier plan made that this one does not have."""
    for split_dir in out.iterdir():
        if split_dir.is_symlink() or not split_dir.is_dir() or split_dir.name == TASK_RECORDS:
            continue
        n = planned.get(split_dir.name)
        for shard in split_dir.iterdir():
            if n is None or not shard.name.isdigit() or int(shard.name) >= n:
                try:
                    remove_entry(shard)
                except OSError:
                    pass
        if n is None:
            shutil.rmtree(split_dir, ignore_errors=True)


@dataclass(frozen=True)
class UnitTasks:
    """The shard tasks of one unit of a sequential reader (a gzip tar, a row group): one engine task that
    reads the unit once, the shards in order."""

    tasks: tuple


def run_unit(shard_fn: Callable[..., dict[str, Any]], task) -> Any:
    """Run a shard task, or a unit's shard tasks over one pass of its reader: each shard function gets
    `samples`, its part of the stream (what a reused shard leaves unread is skipped)."""
    if not isinstance(task, UnitTasks):
        return shard_fn(task)
    first = task.tasks[0]
    refs = [r for t in task.tasks for r in t.paths]
    locs = [x for t in task.tasks for x in t.locators]
    stream = iter(first.reader.open(first.root, refs, locs))  # a generator: nothing is read before the first next()
    out, owed = [], 0  # samples of earlier (reused) shards not read yet: skipped only when a later shard reads
    for t in task.tasks:
        part = _Counted(stream, len(t.paths), owed)
        out.append(shard_fn(t, samples=part))
        owed = part.left + (owed if not part.started else 0)
    return out


class _Counted:
    """The next n samples of a unit's stream, after skipping `skip` owed by shards that did not read theirs
    (a resumed build whose shards are all reused reads nothing of the unit)."""

    def __init__(self, stream, n: int, skip: int):
        self.stream, self.left, self.skip, self.started = stream, n, skip, False

    def __iter__(self):
        return self

    def __next__(self):
        if not self.started:
            self.started = True
            for _ in islice(self.stream, self.skip):
                pass
        if self.left <= 0:
            raise StopIteration
        self.left -= 1
        return next(self.stream)


def unit_is_sequential(reader, locators, start: int) -> bool:
    """Must the unit whose first sample is `start` be read in one pass? (`reader.unit_sequential(locator)`
    where a reader decides per unit: a plain tar beside gzip ones is still read by seeking.)"""
    if reader is None:
        return False
    per_unit = getattr(reader, "unit_sequential", None)
    if per_unit is not None and locators is not None:
        return bool(per_unit(locators[start]))
    return bool(getattr(reader, "sequential", False))


def build_shards(
    out: Path,
    settings: BuildSettings,
    splits: list,
    make_task: Callable[[Any, int, int, int], Any],
    shard_fn: Callable[[Any], dict[str, Any]],
    progress: Callable[[int], None] | None = None,
    engine: Engine | None = None,
) -> tuple[list[SplitSummary], dict[str, dict], float]:
    """The driver every sharded build shares: prepare `out`, cut each split (anything with `name`, `paths`
    and `skipped_before()`; `unit_bounds()` and `reader` where it has them) into shards of
    `settings.shard_size_for(n)` samples that never span two units, run `shard_fn` on the task
    `make_task(split, k, start, stop)` of each on the engine (default: a local pool of `settings.workers`
    processes; a sequential reader's unit is one engine task, `shard_fn(task, samples=...)` for each of
    its shards), clean up, and summarise. The caller writes the manifest (last) from
    the split entries returned. `progress(n)` is told of each finished shard's samples (written or
    skipped); those of a shard reused by --resume go to `progress.kept(n)` where it has one (a
    `dataprep.progress.Progress`), so its rate counts only what this run built."""
    for split in splits:
        check_name(split.name, "split", "the source's splits")
    prepare_output(out, settings.overwrite, settings.resume)
    for split in splits:
        inside(out, out / split.name, "split directory")
    t0 = time.perf_counter()
    tasks: list[Any] = []  # a shard's task, or a UnitTasks (a sequential reader's unit: its shards in one pass)
    plan: list[tuple[str, int]] = []
    names: list[str] = []
    for split in splits:
        per = settings.shard_size_for(len(split.paths))
        bounds = split.unit_bounds() if hasattr(split, "unit_bounds") else [(0, len(split.paths))]
        k = 0
        for a, b in bounds:  # shards never span two units (tars, row groups)
            unit = []
            for start in range(a, b, per):
                unit.append(make_task(split, k, start, min(start + per, b)))
                plan.append((split.name, k))
                k += 1
            if len(unit) > 1 and unit_is_sequential(getattr(split, "reader", None), getattr(split, "locators", None), a):
                tasks.append(UnitTasks(tuple(unit)))
                names.append(f"{split.name}/{shard_name(k - len(unit))}..{shard_name(k - 1)}")
            else:
                tasks += unit
                names += [f"{split.name}/{shard_name(k - len(unit) + j)}" for j in range(len(unit))]

    kept = getattr(progress, "kept", progress)

    def done(i: int, rec) -> None:
        if progress:
            for r in rec if isinstance(rec, list) else [rec]:
                (kept if r.get("reused") else progress)(r["count"] + len(r["skipped"]))

    try:
        engine = engine or LocalEngine(settings.workers)
        fn = partial(run_unit, shard_fn) if any(isinstance(t, UnitTasks) for t in tasks) else shard_fn
        results = engine.map(fn, tasks, done, names=names)
    finally:
        for split in splits:
            remove_temporaries(out / split.name)
    records = [r for res in results for r in (res if isinstance(res, list) else [res])]
    _remove_unplanned(out, {sp.name: sum(1 for name, _ in plan if name == sp.name) for sp in splits})

    summaries, split_entries = [], {}
    for split in splits:
        recs = [r for (name, _), r in zip(plan, records) if name == split.name]
        skipped = [s for r in recs for s in r.pop("skipped")] + split.skipped_before()
        # a summary skip record (sources.listing.Skips, past 1,000 of one reason) stands for "count" samples
        summ = SplitSummary(split.name, len(split.paths) + sum(int(s.get("count", 1)) for s in split.skipped_before()))
        summ.notes = list(getattr(split, "notes", []))
        summ.written = sum(r["count"] for r in recs)
        summ.skipped = Counter()
        for s in skipped:
            summ.skipped[s["reason"]] += int(s.get("count", 1))
        summ.bytes = sum(f["bytes"] for r in recs for f in r["files"].values())
        summ.source_bytes = sum(r.pop("source_bytes") for r in recs)
        summ.kept_jpeg = sum(r.pop("kept_jpeg") for r in recs)
        summ.shards = len(recs)
        summ.kept = sum(r["count"] for r in recs if r["reused"])
        summ.reused = sum(r.pop("reused") for r in recs)
        summ.counts = sum((Counter(r.pop("counts")) for r in recs), Counter())
        summaries.append(summ)
        split_entries[split.name] = {
            "count": summ.written,
            "shards": recs,
            "skipped": skipped,
            "skipped_by_reason": dict(sorted(summ.skipped.items())),
            "kept_jpeg": summ.kept_jpeg,
            "bytes": summ.bytes,
        }
    seconds = time.perf_counter() - t0
    if not any(s.written for s in summaries):
        nothing_stored(out, [sp.name for sp in splits], BuildSummary(out, summaries, seconds, noun="samples"),
                       [s for e in split_entries.values() for s in e["skipped"]])
    return summaries, split_entries, seconds


def nothing_stored(out: Path, split_names: list[str], summary: BuildSummary | None, skipped: list[dict],
                   what: str = "") -> None:
    """Raise NothingStored for a build that stored no sample, its split directories removed first: with no
    manifest written, nothing is left that looks like a pack, nor an unfinished build that --resume could
    only repeat. The message counts the skips by reason and quotes the first, as a listing's does."""
    for name in split_names:
        p = out / name
        if p.is_symlink() or p.exists():
            remove_entry(p)
    shutil.rmtree(out / TASK_RECORDS, ignore_errors=True)
    if summary is not None and skipped:
        planned = sum(s.planned for s in summary.splits)
        per = "; ".join(f"{s.name}: " + ", ".join(f"{n} {r}" for r, n in s.skipped.most_common()) for s in summary.splits if s.skipped)
        first = skipped[0]
        detail = f": {first['detail']}" if first.get("detail") else ""
        every = "the one sample listed was" if planned == 1 else f"all {planned:,} samples listed were"
        what = f"{every} skipped ({per}; the first: {first['source']}: {first['reason']}{detail})"
    raise NothingStored(f"{out}: nothing stored: {what or 'the source gave no sample'}; no pack was written, and "
                        "the build's shards were removed", summary)


def pack_header(kind: str, settings: BuildSettings, source: dict[str, Any], seconds: float,
                kind_settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """The manifest entries every built pack has; `kind_settings` (e.g. {"image": ...}) go into "settings"
    beside the build's own."""
    return {
        "kind": kind,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "dataprep_version": __version__,
        "source": source,
        "settings": {**(kind_settings or {}), **settings.to_dict()},
        "build": {"seconds": round(seconds, 3), "workers": settings.workers},
    }
