"""A pass over an epoch, and the one scheduler every backend shares: takes the pass's plan (its batches, the
request and layout they carry, the backend that fills them: this process, threads or worker processes)
and the Loader's ring, gives the pass's batches as tensors, one per next().

`iter(loader)` returns a `Pass`. It owns what lives for one pass: its plan, the batches in flight and the
slots they fill, the batches done but not yet served, and the pass's figures; the Loader keeps the
configuration and its position over epochs (serve/cursor.py). The plan is made at the first next(), not at
iter(): an iterator made and thrown away (Lightning makes one) changes nothing.

The scheduler keeps up to `depth` batches in flight, each in a ring slot that no batch in flight uses, no
part of an earlier pass still writes (`Fills.busy`) and no caller still holds (`Ring.free_slot`); it hands
a batch over once the backend says every part of it is done. A backend is the small `Fills` interface:
what differs between filling in this process, in threads and in worker processes lives there, and the
rule that a held batch never changes lives once, here and in serve/ring.py.

A pass ends after its last batch, or early: a `break` that drops the iterator, `close()`, a newer pass of
the same Loader, or an error (the backend is then stopped, by `on_error`, before the error is raised).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import numpy as np
import torch

from ..errors import DataprepError
from .cursor import Cursor
from .request import Request, as_run
from .ring import Layout, Ring, Serving
from .stats import EpochStats, decode_snapshot


class Fills(Protocol):
    """What the scheduler asks of a backend (InlineFills here, threads.ThreadFills, processes.WorkerProcesses)."""

    @property
    def closed(self) -> bool:
        """Whether the backend was stopped under the pass being served (no part of it will be done)."""

    def begin(self, ring: Ring, req: Request, layout: Layout, runs: bool, rec: Any) -> None:
        """A pass starts: what its parts share (the request, the layout, where its figures go)."""

    def busy(self) -> set[int]:
        """Slots that parts of an earlier pass (one left early) may still write."""

    def submit(self, b: int, slot: int, idx: np.ndarray) -> None:
        """Start filling batch `b` (sample indices `idx`) into `slot`."""

    def wait(self, want: int, batches: list[np.ndarray]) -> list[int]:
        """Block until at least one batch of this pass is done (batch `want` is the one asked for); give
        the batches whose every part is done. An error names the batch and its samples."""


class InlineFills:
    """num_workers=0: each batch is filled in this process when it is submitted, which the scheduler does
    only when the caller asks for it (depth 1), so no batch is filled ahead of the loop."""

    closed = False

    def __init__(self, dataset):
        self.dataset = dataset
        self.ring: Ring | None = None
        self.req, self.layout, self.runs, self.rec = Request(), {}, False, None

    def begin(self, ring: Ring, req: Request, layout: Layout, runs: bool, rec: Any) -> None:
        self.ring, self.req, self.layout, self.runs, self.rec = ring, req, layout, runs, rec
        if rec is not None:  # this process's decode counts, read against this start when asked (not per batch)
            rec.paths_of, rec.paths_from = self.dataset, decode_snapshot(self.dataset)

    def busy(self) -> set[int]:
        return set()

    def submit(self, b: int, slot: int, idx: np.ndarray) -> None:
        assert self.ring is not None
        t0 = time.perf_counter()
        self.dataset.fill_batch(as_run(idx) if self.runs else idx, self.ring.rows(self.layout, slot, 0, len(idx)), self.req)
        if self.rec is not None:
            self.rec.busy_s[0] += time.perf_counter() - t0

    def wait(self, want: int, batches: list[np.ndarray]) -> list[int]:
        return [want]  # filled when it was submitted


@dataclass
class PassPlan:
    """What a pass serves, as the Loader decides it at the pass's first next().

    Args:
        epoch, start: the epoch, and the samples of its order consumed before this pass.
        batches: this rank's batches (sample indices), in the order served.
        after: for each batch, the samples of the epoch's order consumed once it is served (all ranks).
        req, layout: what every part of the pass carries, and the batch layout.
        fills: the backend; depth: batches in flight at most (the slots the pipeline cycles through, but
            the caller's).
        serving: how the ring makes tensors (copies, pinned memory, channels first).
        runs: the dataset takes a batch of the identity order as a range.
        finish: the dataset's finish_batch hook, or None.
        rec: the pass's EpochStats, or None (stats=False, or nothing to serve).
        indices: also give each batch's sample indices (int64, last).
        on_first: called once the first batch is out (the Loader then draws the next epoch's order).
        on_error: what stops the backend (the Loader's close) on an error, a dead worker or Ctrl-C, before
            the error is raised; a consumer that leaves the pass early stops nothing.
    """

    epoch: int
    start: int
    batches: list[np.ndarray]
    after: list[int]
    req: Request
    layout: Layout
    fills: Fills
    depth: int
    serving: Serving
    runs: bool = False
    finish: Callable | None = None
    rec: EpochStats | None = None
    indices: bool = False
    on_first: Callable[[], None] | None = None
    on_error: Callable[[], None] | None = None


class Pass:
    """One pass over an epoch: what `iter(loader)` returns (see the module's docstring).

    Args:
        plan: called at the first next() with the time it was asked (its planning counts as waiting) and
            this pass; gives the PassPlan (the Loader's `_plan_pass`).
        ring: the Loader's ring (its buffer made for the plan's layout by then).
        cursor: the Loader's position, moved as batches are served and when the pass ends.
    """

    def __init__(self, plan: Callable[[float, "Pass"], PassPlan], ring: Ring, cursor: Cursor):
        self._make_plan = plan
        self.ring, self.cursor = ring, cursor
        self.plan: PassPlan | None = None
        self.over = False  # ended (its last batch served, left early, or failed): next() stops
        self.served = 0  # batches handed over
        self.sent = 0  # batches submitted to the backend
        self.pending: dict[int, int] = {}  # batch submitted and not yet served -> its slot
        self.ready: set[int] = set()  # batches done, not yet served

    def __iter__(self) -> "Pass":
        return self

    def __next__(self) -> tuple[torch.Tensor, ...] | dict[str, Any]:
        asked = time.perf_counter()
        if self.over:
            raise StopIteration
        if self.plan is None:
            self.plan = self._make_plan(asked, self)
            p = self.plan
            try:
                p.fills.begin(self.ring, p.req, p.layout, p.runs, p.rec)
            except BaseException:
                self._failed()
                raise
        p = self.plan
        b = self.served
        if b == len(p.batches):  # the next() that finds no more batches: the epoch is over
            if p.rec is not None:
                p.rec.wait_s += time.perf_counter() - asked
            self.cursor.finished(p.epoch)
            self._end()
            raise StopIteration
        try:
            view = self._schedule(b)
        except BaseException:
            self._failed()
            raise
        self.served += 1
        self.cursor.served(p.epoch, p.after[b], b == len(p.batches) - 1)
        if b == 0 and p.on_first is not None:  # any workers are forked by now: a thread may run
            p.on_first()
        if p.indices:
            idx = torch.from_numpy(p.batches[b].copy())
            view = {**view, "indices": idx} if isinstance(view, dict) else view + (idx,)
        if p.rec is not None:
            p.rec.served(len(p.batches[b]), time.perf_counter() - asked)
        return view

    def _schedule(self, want: int) -> tuple[torch.Tensor, ...] | dict[str, Any]:
        """Batch `want`: batches up to `depth` ahead submitted into free slots, then waited for."""
        p = self.plan
        assert p is not None
        if p.fills.closed:
            raise closed_during_pass()
        batches, pending = p.batches, self.pending
        while self.sent < len(batches) and self.sent < want + p.depth:
            slot = self.ring.free_slot(p.fills.busy() | set(pending.values()))
            if slot is None:
                break  # every other slot is held or in flight: the next wait frees one
            p.fills.submit(self.sent, slot, batches[self.sent])
            pending[self.sent] = slot
            self.sent += 1
        if want >= self.sent:  # cannot happen while the caller holds no more than the spare slots
            raise DataprepError("internal: no ring slot is free to fill the next batch")
        while want not in self.ready:
            self.ready.update(p.fills.wait(want, batches))
        self.ready.discard(want)
        return self.ring.view(p.layout, pending.pop(want), len(batches[want]), p.serving, p.finish)

    def _failed(self) -> None:
        """An error, a dead worker or Ctrl-C in next(): the backend stopped (unless it was stopped under
        the pass), then the pass ends as one left early."""
        p = self.plan
        try:
            if p is not None and not p.fills.closed and p.on_error is not None:
                p.on_error()
        finally:
            self.close()

    def close(self) -> None:
        """Leave the pass: parts in flight are waited for before their slots are reused, the backend stays;
        unless its last batch was served, the Loader's next pass serves this epoch again from this pass's
        start. Also done when the pass is dropped or a newer pass of its Loader begins."""
        p = self.plan
        if self.over or p is None:
            self.over = True
            return
        self.cursor.leave(p.epoch, p.start)
        self._end()

    def _end(self) -> None:
        self.over = True
        if self.plan is not None and self.plan.rec is not None:
            self.plan.rec.end()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at collection, maybe at exit: nothing to report to
            pass


def closed_during_pass() -> DataprepError:
    """What next() raises on a pass whose Loader was closed under it (any backend)."""
    return DataprepError("the Loader was closed (close(), or the end of its with-block) during this pass; "
                         "iterate it again for a new pass")
