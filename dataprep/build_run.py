"""A front-door build's run: takes a listed source, the kind's build function (its settings bound) and the
checked options, gives the build run on its engine into its output (a directory, an .h5 file or a URL, staged
and converted by output.py) with its progress, its notices (`notices_to`, `_Notices`) and Ctrl-C as
`BuildInterrupted` where the build can resume, and its summary (`run`; `TokenizeSummary` and `TableSummary`
for the two builds that are not image-like). build.py's functions call these; the CLI prints the summaries.
"""
from __future__ import annotations

import builtins
import contextlib
import contextvars
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from .errors import NothingStored

if TYPE_CHECKING:
    from .driver import BuildSummary


class BuildInterrupted(KeyboardInterrupt):
    """Ctrl-C during a build: the workers are stopped and the finished shards kept in `kept_in`; the same
    call (or command) with resume=True continues it."""

    def __init__(self, kept_in: str | os.PathLike):
        super().__init__(f"interrupted: finished shards kept in {kept_in}; run it again with resume=True (--resume)")
        self.kept_in = kept_in


# Where notices go while a build runs: the CLI sends them to stderr whatever --progress says (notices_to).
_NOTICES: contextvars.ContextVar[Callable[[str], None] | None] = contextvars.ContextVar("dataprep_build_notices", default=None)


@contextlib.contextmanager
def notices_to(say: Callable[[str], None]) -> Iterator[None]:
    """Send the notices of the builds run inside the block to `say` (the CLI: stderr)."""
    token = _NOTICES.set(say)
    try:
        yield
    finally:
        _NOTICES.reset(token)


class _Notices(builtins.list):
    """A build's notices, each told as it happens (to notices_to's `say`, else stderr when progress is on)."""

    def __init__(self, progress: bool | None):
        super().__init__()
        self.say = _NOTICES.get() or ((lambda line: print(line, file=sys.stderr, flush=True)) if progress else None)

    def __call__(self, line: str) -> None:
        self.append(line)
        if self.say is not None:
            self.say(line)


def _shown(out) -> str:
    """`out` as summaries and progress show it: a URL without its credentials."""
    from .remote.urls import is_url, redact

    return redact(str(out)) if is_url(out) else str(out)


def _out_name(out):
    """What a summary calls the pack: a URL without credentials, else the path."""
    from .remote.urls import is_url, redact

    return redact(str(out)) if is_url(out) else Path(out)


@contextlib.contextmanager
def _running(out, o: dict[str, Any], workers: int, what: str, total: int | None, unit: str, notices: _Notices,
             resume: bool = False, label: str | None = None):
    """The engine, the staged output and the progress of one build: yields (engine, target, bar) and
    collects the output's closing lines (stored as, uploaded to) in `after`; Ctrl-C inside stops the
    workers and becomes BuildInterrupted where the build can be resumed (its options have `resume`), else
    stays a KeyboardInterrupt (a table build keeps nothing to resume from: run it again). A build that
    stored nothing (NothingStored) leaves no directory it made: the staging, and `out` unless it was there."""
    from .engine import open_engine
    from .output import staged_output
    from .progress import Progress
    from .remote.urls import is_url

    after: builtins.list[str] = []
    made = [] if is_url(out) or os.path.lexists(out) else [Path(out)]
    with open_engine(o["engine"], workers, o["address"], o["scheduler_file"], say=notices) as eng, \
            staged_output(out, o["fmt"], o["compress"], o["overwrite"], eng, resume, progress=o["progress"], said=after,
                          notice=notices) as target:
        with Progress(f"{what} {_shown(out)}", total, unit, show=bool(o["progress"]), label=label) as bar:
            try:
                yield eng, target, bar, after
            except NothingStored as e:
                bar.close(failed=True)
                staged = str(target) != str(out)  # hdf5/zarr staging, a URL's cache directory
                for d in ([Path(target)] if staged and not is_url(out) else []) + made:
                    with contextlib.suppress(OSError):  # only when empty (the driver removed the shards): rmdir
                        d.rmdir()
                if e.summary is not None:
                    e.summary.out = _out_name(out)
                if staged:  # the message names what the user gave, not where it was staged
                    raise NothingStored(str(e).replace(str(target), _shown(out), 1), e.summary) from None
                raise
            except KeyboardInterrupt:
                bar.close(failed=True)
                if "resume" not in o:
                    raise
                raise BuildInterrupted(target) from None


def run(source, build_fn, settings, o: dict[str, Any], noun: str = "images", notices: _Notices | None = None) -> BuildSummary:
    """Run a build (`build_fn(source, out, settings, progress=..., engine=...)`, the kind's own settings bound) on
    the engine of `o` into `o["out"]` (a directory, an .h5 file or a URL, through the storage backends); the
    summary."""
    notices = notices if notices is not None else _Notices(o["progress"])
    out = o["out"]
    try:
        with _running(out, o, settings.workers, "build", source.planned(settings.limit), noun, notices, settings.resume,
                      label="building") as (eng, target, bar, after):
            summary = build_fn(source, target, settings, progress=bar, engine=eng)
    except NothingStored as e:
        if e.summary is not None:
            e.summary.noun = noun
        raise
    summary.out = _out_name(out)
    summary.after = after
    summary.notices = builtins.list(notices)
    return summary


class TokenizeSummary(dict):
    """What `tokenize` did: the token pack's splits {name: (documents, tokens)}, dtype, tokens, seconds,
    resumed tasks and units and replaced bytes, as a dict; `.lines()` is what `dataprep tokenize` prints."""

    out: Any = None
    after: builtins.list[str]
    notices: builtins.list[str]

    def lines(self) -> builtins.list[str]:
        r = self
        out = [*self.after, f"pack: {self.out}"]
        for name, (docs, toks) in r["splits"].items():
            out.append(f"  {name}: {docs:,} documents, {toks:,} tokens ({r['dtype']})")
        if r.get("reused") or r.get("kept_units"):
            n, of = r.get("kept_units", 0), "it" if r["tasks"] - r["reused"] == 1 else "them"
            units = f" ({n} finished unit{'s' * (n != 1)} of {of} kept)" if n else ""
            out.append(f"  resumed: {r['reused']} of {r['tasks']} tasks were finished and intact, {r['tasks'] - r['reused']} tokenized{units}")
        if r["replaced"]:
            out.append("  bytes that were not UTF-8, replaced: " + ", ".join(f"{k}: {v}" for k, v in r["replaced"].items()))
        out.append(f"  {r['tokens']:,} tokens from {r['files']} files in {r['seconds']:.1f} s "
                   f"({r['tokens'] / max(r['seconds'], 1e-9):,.0f} tokens/s)")
        return out


class TableSummary(dict):
    """What `table` did: rows per split, rows read and dropped, the columns and what each became, the
    target, as a dict; `.lines()` is what `dataprep table` prints."""

    out: Any = None
    after: builtins.list[str]
    notices: builtins.list[str]

    def lines(self) -> builtins.list[str]:
        import numpy as np

        from .tables.field import dropped_rows

        r, t = self, self["target"]
        out = [*self.after, f"pack: {self.out}",
               "  rows: " + ", ".join(f"{k} {v}" for k, v in r["splits"].items()) + f"; {dropped_rows(r['rows'])}",
               f"  {r['features']} feature columns, {r['categorical']} categorical; target {t['column']!r}: {t['task']} "
               f"({np.dtype(t['dtype']).name}" + (f", {len(t['classes'])} classes)" if t["task"] == "classification" else ")"),
               "  columns:"]
        out.extend(f"    {c}: {what}" for c, what in r["columns"].items())
        out.append(f"  {sum(r['splits'].values())} rows in {r['seconds']:.2f} s")
        return out
