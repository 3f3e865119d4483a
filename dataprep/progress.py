"""Progress: takes counts of work done toward a total, gives stderr a bar on a terminal and plain lines in a log.

Every long operation (build, tokenize, table, convert, verify, remote fetches) reports through a `Progress`.
On a terminal it draws click's bar. When stderr is not a terminal (nohup, SLURM, CI), where a bar is one
line rewritten with carriage returns that a log never shows, it prints lines such as

    build /data/pack: 1,200/5,000 images (24%), 310 images/s, ETA 12 s

one when `every` seconds have passed since the last, or when another tenth of the total is done and a third
of `every` has passed; then a final line, once any line was printed. An operation done within a third of
`every` prints none: its summary follows at once. `every` is $DATAPREP_PROGRESS_EVERY (seconds, default 30;
0 prints a line per update). Work an earlier run did (shards a resumed build keeps) counts toward the
position and the ETA, never toward the rate. Nothing goes to stdout, so `--json` outputs stay parseable.
"""
from __future__ import annotations

import math
import os
import sys
import threading
import time
from typing import Any, Callable, TextIO

from .errors import DataprepError

EVERY_ENV = "DATAPREP_PROGRESS_EVERY"
EVERY = 30.0  # seconds between lines in a log: a line a minute is too sparse for a job that hangs, a second too chatty
STEP = 0.1  # a line also at every further tenth of the total (at most every `every / 3` seconds)


def every_seconds() -> float:
    """Seconds between progress lines in a log: $DATAPREP_PROGRESS_EVERY, else `EVERY`."""
    raw = os.environ.get(EVERY_ENV, "").strip()
    if not raw:
        return EVERY
    try:
        v = float(raw)
    except ValueError:
        v = -1.0
    if not (math.isfinite(v) and v >= 0):
        raise DataprepError(f"{EVERY_ENV}={raw!r}: not a number of seconds (0 or more) between progress lines")
    return v


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


class Progress:
    """Counts of work toward `total` (None: unknown) in `unit` ("bytes" is shown in kB, MB, GB), told by
    `update(n)` (done by this run) and `kept(n)` (done by an earlier run), in any thread.

    `show`: True shows a bar on a terminal and lines in a log; None (a library's default where no caller
    asked) lines in a log only; False nothing. `forward(n)` is also told of every count (a caller's own
    callback). `label` is the bar's text [default: `what`]. `final`: in a log, print the final line even
    after work too quick for any other (a caller asked for progress by name). Use it as a context manager, or `close()` it:
    that prints the final line (not after a failure: the error follows instead). It is callable as
    `update`, so it serves where a `progress(n)` callback is taken."""

    def __init__(self, what: str, total: int | None = None, unit: str = "items", show: bool | None = True, *,
                 label: str | None = None, every: float | None = None, stream: TextIO | None = None,
                 forward: Callable[[int], None] | None = None, clock: Callable[[], float] = time.monotonic,
                 final: bool = False):
        self.what, self.total, self.unit = what, (int(total) if total is not None else None), unit
        self.stream = stream if stream is not None else sys.stderr
        self.every = every_seconds() if every is None else float(every)
        self.forward, self.clock = forward, clock
        self.final = final  # lines: print the final line even when the work was too quick for any other
        self.done = self.earlier = 0
        self.shown = False  # a line was printed
        self.closed = False
        self._lock = threading.Lock()
        self._bar = None
        self.t0 = self._last = clock()
        self._last_pos = 0
        tty = _isatty(self.stream)
        if show is False:
            self.mode = None
        elif tty:
            self.mode = "bar" if show and self.total else ("lines" if show else None)
        else:
            self.mode = "lines"
        if self.mode == "bar":
            import click  # only here: a library user without a terminal never needs it

            self._bar = click.progressbar(length=self.total, label=label or what, file=self.stream,
                                          show_pos=unit != "bytes", show_eta=True)
            self._bar.__enter__()

    # -- counting -------------------------------------------------------------------------------------
    def update(self, n: int = 1) -> None:
        """n more units done by this run."""
        self._add(int(n), earlier=False)

    __call__ = update

    def kept(self, n: int) -> None:
        """n more units an earlier run did (a resumed build's kept shards): the position moves, the rate does not."""
        self._add(int(n), earlier=True)

    def _add(self, n: int, earlier: bool) -> None:
        if self.forward:
            tell = getattr(self.forward, "kept", self.forward) if earlier else self.forward
            tell(n)
        with self._lock:
            if self.closed:
                return
            if earlier:
                self.earlier += n
            else:
                self.done += n
            if self._bar is not None:
                self._bar.update(n)
            elif self.mode == "lines":
                now = self.clock()
                pos = self.done + self.earlier
                since = now - self._last
                tenth = self.total and pos - self._last_pos >= STEP * self.total and since >= self.every / 3
                if since >= self.every or tenth:
                    self._print(self.line(now))
                    self._last, self._last_pos = now, pos

    def close(self, failed: bool = False) -> None:
        """End the bar, or print the final line when a line was printed; once."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            if self._bar is not None:
                self._bar.render_finish()
            elif self.mode == "lines" and (self.shown or self.final) and not failed:
                self._print(self.line(self.clock(), final=True))

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(failed=exc_type is not None)

    # -- lines ----------------------------------------------------------------------------------------
    def _print(self, line: str) -> None:
        try:
            print(line, file=self.stream, flush=True)
        except (OSError, ValueError):  # a closed or broken stderr must not stop the work it reports on
            return
        self.shown = True

    def line(self, now: float, final: bool = False) -> str:
        """The line for the counts so far, `now` seconds on this Progress's clock."""
        pos = self.done + self.earlier
        elapsed = max(now - self.t0, 0.0)
        rate = self.done / elapsed if self.done and elapsed > 0 else None
        amount = self._amount(pos)
        kept = f"{self._count(self.earlier)} kept from an earlier run" if self.earlier else ""
        if final:
            out = f"{self.what}: {amount}" + (f" ({kept})" if kept else "") + f" in {_duration(elapsed)}"
            return out + (f", {self._rate(rate)}" if rate else "")
        notes = []
        if self.total:
            notes.append(f"{min(100, math.floor(100 * pos / self.total))}%")
        if kept:
            notes.append(kept)
        out = f"{self.what}: {amount}" + (f" ({'; '.join(notes)})" if notes else "")
        if rate:
            out += f", {self._rate(rate)}"
            if self.total and pos < self.total:
                out += f", ETA {_duration((self.total - pos) / rate)}"
        return out

    def _count(self, n: int) -> str:
        if self.unit == "bytes":
            div, name = _scale(n)
            return f"{n / div:.1f} {name}" if div > 1 else f"{n:,} {name}"
        return f"{n:,}"  # beside the amount, which names the unit

    def _amount(self, pos: int) -> str:
        if self.unit != "bytes":
            return f"{pos:,}/{self.total:,} {self.unit}" if self.total is not None else f"{pos:,} {self.unit}"
        div, name = _scale(max(self.total or 0, pos))
        num = (lambda n: f"{n / div:.1f}") if div > 1 else (lambda n: f"{n:,}")
        return f"{num(pos)}/{num(self.total)} {name}" if self.total is not None else f"{num(pos)} {name}"

    def _rate(self, rate: float) -> str:
        if self.unit == "bytes":
            div, name = _scale(rate)
            return f"{rate / div:.1f} {name}/s" if div > 1 else f"{rate:.0f} {name}/s"
        return f"{rate:.1f} {self.unit}/s" if rate < 10 else f"{rate:,.0f} {self.unit}/s"


def reporter(progress: "bool | None | Callable[[int], None]", what: str, total: int | None, unit: str = "items",
             default: bool | None = False, label: str | None = None) -> Progress:
    """The Progress of an operation from its `progress` argument: a callable (told of every count, nothing
    shown; a Progress is one), or whether to show one (as Progress's `show`; None is `default`)."""
    if callable(progress):
        return Progress(what, total, unit, show=False, forward=progress)
    return Progress(what, total, unit, show=default if progress is None else progress, label=label)


def _scale(n: float) -> tuple[float, str]:
    for div, name in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if n >= div:
            return div, name
    return 1, "B"


def _duration(s: float) -> str:
    if s < 10:
        return f"{s:.1f} s"
    s = int(s)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"
