"""How long training waits for data: per epoch, the time the consumer spent blocked in `next()` against the
epoch's wall time, how busy each worker was filling batches, and which decode paths were taken; with a
one-line verdict. `Loader.stats()` gives them for its epochs (serve/loader.py records them: three clock
reads a batch in the consumer, one a part in each worker); `DataWait` gives the consumer-side figures for any
iterable of batches (the stock DataLoader, whose workers report nothing).

wall_s runs from the epoch's first `next()` to the pass's end (the `next()` that finds no more batches, or
the loop leaving early), or to now while the epoch is served; wait_s sums the time each `next()` took,
which with num_workers=0 includes filling the batch in the consumer's own process: that is waiting too.
startup_s is the first `next()` alone (workers starting, the order drawn, the first fill): reported apart,
because a short run's first epoch would otherwise read data-bound for a cost paid once. The verdict judges
the steady state, steady_wait_fraction: the waits after the first batch against the time after it.
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from .contract import attribute

__all__ = ["DATA_BOUND", "BUSY", "EpochStats", "DataWait", "verdict", "steady_state", "decode_snapshot", "paths_since"]

DATA_BOUND = 0.10  # waiting for data more than this share of the wall time: the data path bounds the step
BUSY = 0.85  # workers filling batches more than this share of the time: they are the limit, not the handoff


def verdict(wait_fraction: float, busy: list[float] | None, workers: int | None, threshold: float = DATA_BOUND,
            decoded: bool = False) -> str:
    """One line a person acts on: data-bound or compute-bound, by how much, and what would help (`decoded`:
    the pack's images are stored decoded, so a decoded pack is no advice)."""
    if wait_fraction <= threshold:
        return f"compute-bound: waits {wait_fraction:.0%} of the time for data"
    head = f"data-bound: waits {wait_fraction:.0%} of the time for data"
    if workers == 0:
        return f"{head}; batches are filled in the training process: num_workers > 0 would help"
    helps = "more workers or smaller stored images" if decoded else "more workers, a decoded pack (--mode raw) or smaller stored images"
    if not busy:
        return f"{head}; {helps} would help"
    mean = sum(busy) / len(busy)
    if mean >= BUSY:
        return f"{head}; workers busy {mean:.0%}: {helps} would help"
    return (f"{head}; workers busy only {mean:.0%}: the handoff or the training process is the limit "
            "(another process on these cores? batches too small?)")


@dataclass(slots=True)  # slots: its counters are updated every batch
class EpochStats:
    """One epoch's figures as the Loader gathers them (see the module's docstring)."""

    epoch: int
    workers: int
    batches: int = 0
    samples: int = 0
    wait_s: float = 0.0
    started: float | None = None  # time.perf_counter() at the epoch's first next()
    first_s: float | None = None  # the first next()'s wait: start-up, judged apart
    ended: float | None = None  # ... at the pass's end; None while it is served
    busy_s: list[float] = field(default_factory=list)  # per worker (one entry, the consumer's, with no workers)
    paths: dict[str, int] = field(default_factory=dict)
    paths_of: Any = None  # with no workers: the dataset whose decode counts this process keeps ...
    paths_from: dict[str, int] | None = None  # ... and their values when the pass began

    def __post_init__(self):
        self.busy_s = [0.0] * max(self.workers, 1)

    def served(self, samples: int, waited: float) -> None:
        """A batch of `samples` handed over after the consumer waited `waited` seconds for it."""
        if self.first_s is None:
            self.first_s = waited
        self.batches += 1
        self.samples += samples
        self.wait_s += waited

    def count_paths(self, paths: dict[str, int]) -> None:
        for k, v in paths.items():  # (Counter.update's Mapping check costs more than the few keys here)
            self.paths[k] = self.paths.get(k, 0) + v

    def begin(self) -> None:
        if self.started is None:
            self.started = time.perf_counter()

    def end(self) -> None:
        if self.started is not None and self.ended is None:
            self.ended = time.perf_counter()
            self._settle_paths()

    def _settle_paths(self) -> None:
        """Fold this process's decode counts since the pass began into `paths` (no workers: see paths_of)."""
        if self.paths_of is not None:
            now = decode_snapshot(self.paths_of)
            self.count_paths(paths_since(self.paths_from, now))
            self.paths_from = now
            if self.ended is not None:
                self.paths_of = None

    def as_dict(self, threshold: float = DATA_BOUND) -> dict[str, Any]:
        """The figures `Loader.stats()` returns; wall_s up to now while the epoch is served."""
        self._settle_paths()
        if self.started is None:
            wall = 0.0
        else:
            wall = (self.ended if self.ended is not None else time.perf_counter()) - self.started
        fraction = min(self.wait_s / wall, 1.0) if wall > 0 else 0.0
        startup, steady = steady_state(self.first_s, self.wait_s, self.batches, wall, fraction)
        busy = [min(b / wall, 1.0) if wall > 0 else 0.0 for b in self.busy_s]
        return {"epoch": self.epoch, "batches": self.batches, "samples": self.samples, "wall_s": wall,
                "wait_s": self.wait_s, "wait_fraction": fraction, "startup_s": startup, "steady_wait_fraction": steady,
                "workers": self.workers,
                "worker_busy": busy if self.workers else [], "consumer_fill_fraction": busy[0] if not self.workers else None,
                "decode_paths": dict(self.paths), "finished": self.ended is not None,
                "verdict": verdict(steady, busy if self.workers else None, self.workers, threshold,
                                   decoded=self.samples > 0 and not self.paths)}


def steady_state(first_s: float | None, wait_s: float, batches: int, wall: float, fraction: float) -> tuple[float, float]:
    """(startup_s, steady_wait_fraction) of a pass: the first next()'s wait, and the share of the time after
    it spent waiting; with one batch or none there is no steady state, and the whole pass's share stands."""
    startup = first_s or 0.0
    after = wall - startup
    if batches < 2 or after <= 0:
        return startup, fraction
    return startup, min(max(wait_s - startup, 0.0) / after, 1.0)


class DataWait:
    """The consumer-side figures for any iterable of batches.

    Use `for batch in DataWait(DataLoader(...))`, then `.stats()`. Each pass over it is an epoch; wait_s
    is the time spent in `next()`. The stock DataLoader's workers report nothing, so worker_busy and
    decode_paths are not available here (the Loader's `stats()` has them). `samples` counts the first
    dimension of each batch's first tensor.

    Args:
        batches: Any iterable of batches, such as a DataLoader or a Loader.
        threshold: The share of the time spent waiting above which the verdict says data-bound.
    """

    def __init__(self, batches: Iterable, threshold: float = DATA_BOUND):
        self.batches, self.threshold = batches, threshold
        self.epochs: list[EpochStats] = []

    def __len__(self) -> int:
        return len(self.batches)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator:
        rec = EpochStats(epoch=len(self.epochs), workers=-1)
        self.epochs.append(rec)
        return _timed(self.batches, rec)

    def stats(self, epoch: int | None = None) -> dict[str, Any]:
        """The figures of one pass, with a verdict: data-bound or compute-bound.

        Args:
            epoch: The pass, from 0; None is the last.

        Returns:
            The Loader's `stats()` keys; those only its workers report (worker_busy, decode_paths, ...)
            are None.
        """
        if not self.epochs:
            raise ValueError("no pass over the batches yet: iterate first")
        d = self.epochs[-1 if epoch is None else epoch].as_dict(self.threshold)
        d.update(workers=None, worker_busy=None, consumer_fill_fraction=None, decode_paths=None)
        d["verdict"] = verdict(d["steady_wait_fraction"], None, None, self.threshold)
        return d


def _timed(batches: Iterable, rec: EpochStats) -> Iterator:
    """`batches`' items, each next() timed into `rec`; starting the iterator (a DataLoader starts its
    workers then) counts as waiting for the first batch."""
    rec.begin()
    try:
        t0 = time.perf_counter()
        it = iter(batches)
        rec.wait_s += time.perf_counter() - t0
        while True:
            t0 = time.perf_counter()
            try:
                item = next(it)
            except StopIteration:
                return
            finally:
                rec.wait_s += time.perf_counter() - t0
            if rec.first_s is None:
                rec.first_s = rec.wait_s  # iter() and the first next(): the DataLoader's workers start there
            rec.batches += 1
            first = item[0] if isinstance(item, (tuple, list)) else item
            if isinstance(first, Mapping):
                first = next(iter(first.values()), first)  # a batch as a mapping: its first field's rows
            rec.samples += int(len(first)) if hasattr(first, "__len__") else 1
            yield item
    finally:
        rec.end()


def decode_snapshot(dataset) -> dict[str, int] | None:
    """A snapshot of the dataset's decode path counts (contract attribute `decode_paths`), if it keeps them."""
    paths = attribute(dataset, "decode_paths")
    return dict(paths) if paths else None


def paths_since(before: dict[str, int] | None, now: dict[str, int] | None) -> dict[str, int]:
    """The decode paths counted between two snapshots."""
    if not now:
        return {}
    before = before or {}
    return {k: v - before.get(k, 0) for k, v in now.items() if v != before.get(k, 0)}
