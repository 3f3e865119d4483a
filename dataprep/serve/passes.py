"""One scheduler for every backend: takes a pass's batches, the Loader's ring and a backend that fills
parts of batches (in this process, in threads, in worker processes), gives the pass's batches as tensors.

The scheduler keeps up to `depth` batches in flight, each in a ring slot that no batch in flight uses, no
part of an earlier pass still writes (`Fills.busy`) and no caller still holds (`Ring.free_slot`); it hands
a batch over once the backend says every part of it is done. A backend is the small `Fills` interface:
what differs between filling in this process, in threads and in worker processes lives there, and the
rule that a held batch never changes lives once, here and in serve/ring.py.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Iterator, Protocol

import numpy as np
import torch

from ..errors import DataprepError
from .request import Request, as_run
from .ring import Layout, Ring
from .stats import decode_snapshot


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


def serve_pass(fills: Fills, ring: Ring, batches: list[np.ndarray], req: Request, layout: Layout, depth: int,
               runs: bool = False, rec: Any = None, finish: Callable | None = None,
               on_error: Callable[[], None] | None = None) -> Iterator[tuple[torch.Tensor, ...]]:
    """The pass's batches as tensors (Ring.view), filled by `fills`, at most `depth` in flight.

    Args:
        fills: the backend.
        ring: the Loader's ring, its buffer made for `layout`.
        batches: each batch's sample indices, in the order served.
        req, layout: what every part of the pass carries, and the batch layout.
        depth: batches in flight at most (the slots the pipeline cycles through, but the caller's).
        runs: the dataset takes a batch of the identity order as a range.
        rec: the pass's EpochStats, or None.
        finish: the dataset's finish_batch hook, or None.
        on_error: what stops the backend (the Loader's close) on an error, a dead worker or Ctrl-C, before
            the error is raised; a consumer that leaves the pass early stops nothing.

    Yields:
        Each batch's tensors, in order; a slot is refilled only once the caller drops them.
    """
    try:
        yield from _pass(fills, ring, batches, req, layout, depth, runs, rec, finish)
    except GeneratorExit:
        raise  # the consumer left early: the backend stays; parts in flight are waited for before their slots are reused
    except BaseException:
        if not fills.closed and on_error is not None:
            on_error()
        raise


def _pass(fills: Fills, ring: Ring, batches, req, layout, depth, runs, rec, finish):
    fills.begin(ring, req, layout, runs, rec)
    pending: dict[int, int] = {}  # batch submitted and not yet served -> its slot
    ready: set[int] = set()
    sent = 0
    for want in range(len(batches)):
        if fills.closed:
            raise closed_during_pass()
        while sent < len(batches) and sent < want + depth:
            slot = ring.free_slot(fills.busy() | set(pending.values()))
            if slot is None:
                break  # every other slot is held or in flight: the next wait frees one
            fills.submit(sent, slot, batches[sent])
            pending[sent] = slot
            sent += 1
        if want >= sent:  # cannot happen while the caller holds no more than the spare slots
            raise DataprepError("internal: no ring slot is free to fill the next batch")
        while want not in ready:
            ready.update(fills.wait(want, batches))
        ready.discard(want)
        yield ring.view(layout, pending.pop(want), len(batches[want]), finish)


def closed_during_pass() -> DataprepError:
    """What next() raises on a pass whose Loader was closed under it (any backend)."""
    return DataprepError("the Loader was closed (close(), or the end of its with-block) during this pass; "
                         "iterate it again for a new pass")
