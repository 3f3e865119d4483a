"""The Loader's thread backend: takes a pass's batches and the Loader's ring, gives the batches filled by
`num_workers` threads of this process, each batch split across them as the worker processes split it.

No fork and no IPC: the threads write straight into the ring's slots (plain memory of this process), so it
runs where fork is absent or unsafe (Windows, macOS, a parent that has started CUDA or threads of its
own) and under the `spawn` start method. The decoders and OpenCV release the GIL; the Python around each
crop does not, nor does the Loader's own thread, which is why processes stay the default on Linux
(docs/benchmarks.md, Crops: two threads serve 0.82x two processes' rate on 2 cores).

The rules the processes keep hold here too: a slot is refilled only when no batch in flight uses it and
no tensor served from it is alive (Loader._free_slot), so a held batch never changes; a part of a pass
left early may still be writing its slot, so that slot stays busy until the part is done, and the next
pass waits for every such part before it starts (the dataset's state, e.g. the resolution it holds,
changes only between passes). A pass that raises (a fill's error, a timeout, Ctrl-C in the consumer)
shuts the pool before the exception leaves it, as the processes stop their workers: no thread is left for
the garbage collector to find, and the next pass starts a new pool. A pass's first part runs in the
calling thread before any other starts where the request differs from the last pass's in more than its
epoch, or the dataset holds a partition (whose part may move with the epoch): whatever state the request moves the dataset to (a resolution, a
partition's part) is moved there once, not by several threads at a time. (Always doing so cost ~8 % on
epochs of 356 crops.) A dataset must say that its fills may run concurrently
(`fills_in_threads`, serve/contract.py); dataprep's image, detection and segmentation datasets do.
"""
from __future__ import annotations

import concurrent.futures as cf
import time
from typing import Any, Callable

import numpy as np

from ..errors import DataprepError, WorkerError
from . import contract
from .request import split
from .ring import Ring
from .stats import decode_snapshot


class ThreadFills:
    """The pool and the parts in flight of one Loader (made at its first pass with threads, shut at close)."""

    def __init__(self, dataset, workers: int, timeout: float):
        self.dataset, self.workers, self.timeout = dataset, workers, timeout
        init = contract.hook(dataset, "worker_init")
        if init is not None:  # once, in this process: e.g. OpenCV's own pool off (the threads are the parallelism)
            init()
        self.pool = cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dataprep-loader")
        self.inflight: dict[cf.Future, int] = {}  # part -> the slot it writes
        self.last = None  # the last pass's request, but its epoch
        self.closed = False
        self.hung = False  # a part outlived the timeout: closing does not wait for it again

    def busy(self) -> set[int]:
        """Slots a part still writes (of this pass, or of one left early)."""
        for f in [f for f in self.inflight if f.done()]:
            del self.inflight[f]
        return set(self.inflight.values())

    def settle(self) -> None:
        """Wait for every part in flight (those of a pass left early): their errors no longer matter."""
        for f in list(self.inflight):
            try:
                f.result(timeout=self.timeout)
            except cf.TimeoutError:
                self.hung = True
                raise WorkerError(f"a loader thread filled no part in {self.timeout:.0f} s") from None
            except Exception:  # noqa: BLE001 - a part of an abandoned pass: nobody will be served it
                pass
        self.inflight.clear()

    def close(self) -> bool:
        """Shut the pool: parts not started are cancelled, running ones waited for (up to the timeout, not
        again after a part outlived it). Gives whether every thread ended; False: a part that never
        returned was let go, and may still write into its slot."""
        self.closed = True
        running = [f for f in self.inflight if not f.cancel()]
        _done, stuck = cf.wait(running, timeout=0 if self.hung else self.timeout)
        self.pool.shutdown(wait=not stuck, cancel_futures=True)
        self.inflight.clear()
        return not stuck


def _fill(dataset, idx, out: dict[str, np.ndarray], req, w: int) -> tuple[int, float]:
    t0 = time.perf_counter()
    dataset.fill_batch(idx, out, req)
    return w, time.perf_counter() - t0


def with_threads(fills: ThreadFills, ring: Ring, batches: list[np.ndarray], req, layout: dict, depth: int, runs: bool,
                 rec: Any = None, finish: Callable | None = None, on_error: Callable[[], None] | None = None):
    """The pass's batches as tensors (Ring.view), filled by the pool; at most `depth` batches in flight.
    An exception in a fill is raised here, naming the batch and its first samples, once the pool is shut by
    `on_error` (the Loader's close; so is it on Ctrl-C or a timeout); a pass whose Loader was closed under it
    says so."""
    try:
        yield from _pass(fills, ring, batches, req, layout, depth, runs, rec, finish)
    except GeneratorExit:
        raise  # the consumer left the pass early: the pool stays; its parts are waited for before their slots are reused
    except BaseException:
        if not fills.closed and on_error is not None:
            on_error()  # its pool's threads joined now, not when the garbage collector finds the Loader
        raise


def _pass(fills: ThreadFills, ring: Ring, batches: list[np.ndarray], req, layout: dict, depth: int, runs: bool,
          rec: Any = None, finish: Callable | None = None):
    """with_threads' pass, its errors left to the caller."""
    fills.settle()
    dataset = fills.dataset
    if rec is not None:  # decode counts: this process's, read against this start (as with no workers)
        rec.paths_of, rec.paths_from = dataset, decode_snapshot(dataset)
    nw = fills.workers
    key = req.but(epoch=0)
    alone = key != fills.last or contract.attribute(dataset, "partition") is not None
    fills.last = key
    pending: dict[int, tuple[int, list[tuple[cf.Future, np.ndarray]]]] = {}  # batch -> (slot, its parts)
    sent = 0
    for want in range(len(batches)):
        if fills.closed:
            raise closed_during_pass()
        while sent < len(batches) and sent < want + depth:
            slot = ring.free_slot(fills.busy() | {s for s, _ in pending.values()})
            if slot is None:
                break  # every other slot is held or in flight: the next wait frees one
            idx = batches[sent]
            parts = []
            for w, a, b, part in split(idx, nw, runs):
                out = ring.rows(layout, slot, a, b - a)
                if alone and sent == 0 and not parts:  # the pass's first part, here: the dataset's state moves once
                    f: cf.Future = cf.Future()
                    try:
                        f.set_result(_fill(dataset, part, out, req, w))
                    except Exception as e:  # noqa: BLE001 - raised below, as a thread's would be
                        f.set_exception(e)
                else:
                    f = fills.pool.submit(_fill, dataset, part, out, req, w)
                fills.inflight[f] = slot
                parts.append((f, idx[a:b]))
            pending[sent] = (slot, parts)
            sent += 1
        if want >= sent:  # cannot happen while the caller holds no more than the spare slots
            raise DataprepError("internal: no ring slot is free to fill the next batch")
        slot, parts = pending.pop(want)
        for f, idx in parts:
            try:
                w, busy = f.result(timeout=fills.timeout)
            except cf.TimeoutError:
                fills.hung = True
                raise WorkerError(f"no batch from the loader threads in {fills.timeout:.0f} s "
                                  f"(batch {want}, samples {np.asarray(idx[:8]).tolist()})") from None
            except Exception as e:
                if fills.closed:  # cancelled by close() from another thread
                    raise closed_during_pass() from None
                raise DataprepError(f"loader thread failed on batch {want}: {type(e).__name__}: {e} "
                                    f"(samples {np.asarray(idx[:8]).tolist()})") from e
            fills.inflight.pop(f, None)
            if rec is not None:
                rec.busy_s[w] += busy
        yield ring.view(layout, slot, len(batches[want]), finish)  # refilled only once the caller drops it


def closed_during_pass() -> DataprepError:
    """What next() raises on a pass whose Loader was closed under it (either backend)."""
    return DataprepError("the Loader was closed (close(), or the end of its with-block) during this pass; "
                         "iterate it again for a new pass")
