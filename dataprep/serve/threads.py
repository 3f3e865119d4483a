"""The Loader's thread backend (a serve/passes.py `Fills`): takes the scheduler's batches and the Loader's
ring, fills them with `num_workers` threads of this process, each batch split across them as the worker
processes split it.

No fork and no IPC: the threads write straight into the ring's slots (plain memory of this process), so it
runs where fork is absent or unsafe (Windows, macOS, a parent that has started CUDA or threads of its
own) and under the `spawn` start method. The decoders and OpenCV release the GIL; the Python around each
crop does not, nor does the Loader's own thread, which is why processes stay the default on Linux
(docs/benchmarks.md, Crops: two threads serve 0.82x two processes' rate on 2 cores).

The rules the processes keep hold here too: a slot is refilled only when no batch in flight uses it and
no tensor served from it is alive (Ring.free_slot), so a held batch never changes; a part of a pass
left early may still be writing its slot, so that slot stays busy until the part is done, and the next
pass waits for every such part before it starts (the dataset's state, e.g. the resolution it holds,
changes only between passes). A pass that raises (a fill's error, a timeout, Ctrl-C in the consumer)
shuts the pool before the exception leaves it, as the processes stop their workers: no thread is left for
the garbage collector to find, and the next pass starts a new pool. A pass's first part runs in the
calling thread before any other starts where the request differs from the last pass's in more than its
epoch, or the dataset holds a partition (whose part may move with the epoch): whatever state the request moves the dataset to (a resolution, a
partition's part) is moved there once, not by several threads at a time. (Always doing so cost ~8 % on
epochs of 356 crops.) A dataset must say that its fills may run concurrently
(`fills_in_threads`, serve/contract.py); dataprep's image, detection, segmentation, video and packed-row datasets
do, and a Mixture of them (its members moved in that first fill: `settle`).
"""
from __future__ import annotations

import concurrent.futures as cf
import time
from typing import Any

import numpy as np

from ..errors import DataprepError, WorkerError
from . import contract
from .passes import closed_during_pass
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
        # the pass being served (begin): where its parts go and what they carry
        self.alone, self.ring, self.req, self.layout, self.runs, self.rec = False, None, None, {}, False, None
        self.parts: dict[int, list[tuple[cf.Future, np.ndarray]]] = {}  # batch -> its parts and their samples

    def busy(self) -> set[int]:
        """Slots a part still writes (of this pass, or of one left early)."""
        for f in [f for f in self.inflight if f.done()]:
            del self.inflight[f]
        return set(self.inflight.values())

    def drain(self) -> None:
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

    def begin(self, ring: Ring, req, layout: dict, runs: bool, rec: Any) -> None:
        """A pass starts: parts of one left early are waited for; its first part runs alone (see above)."""
        self.drain()
        if rec is not None:  # decode counts: this process's, read against this start (as with no workers)
            rec.paths_of, rec.paths_from = self.dataset, decode_snapshot(self.dataset)
        key = req.but(epoch=0)
        self.alone = key != self.last or contract.attribute(self.dataset, "partition") is not None
        self.last = key
        self.ring, self.req, self.layout, self.runs, self.rec = ring, req, layout, runs, rec
        self.parts = {}

    def submit(self, b: int, slot: int, idx: np.ndarray) -> None:
        """Batch b's parts to the pool; the pass's first part in this thread where it must run alone."""
        assert self.ring is not None
        parts: list[tuple[cf.Future, np.ndarray]] = []
        for w, a, e, part in split(idx, self.workers, self.runs):
            out = self.ring.rows(self.layout, slot, a, e - a)
            if self.alone and b == 0 and not parts:  # the pass's first part, here: the dataset's state moves once
                f: cf.Future = cf.Future()
                try:
                    f.set_result(_fill(self.dataset, part, out, self.req, w))
                except Exception as ex:  # noqa: BLE001 - raised by wait, as a thread's would be
                    f.set_exception(ex)
            else:
                f = self.pool.submit(_fill, self.dataset, part, out, self.req, w)
            self.inflight[f] = slot
            parts.append((f, idx[a:e]))
        self.parts[b] = parts

    def wait(self, want: int, batches: list[np.ndarray]) -> list[int]:
        """Batch `want`, once its parts are done; a fill's error raised naming the batch and its samples."""
        for f, idx in self.parts.pop(want):
            try:
                w, busy = f.result(timeout=self.timeout)
            except cf.TimeoutError:
                self.hung = True
                raise WorkerError(f"no batch from the loader threads in {self.timeout:.0f} s "
                                  f"(batch {want}, samples {np.asarray(idx[:8]).tolist()})") from None
            except Exception as e:
                if self.closed:  # cancelled by close() from another thread
                    raise closed_during_pass() from None
                raise DataprepError(f"loader thread failed on batch {want}: {type(e).__name__}: {e} "
                                    f"(samples {np.asarray(idx[:8]).tolist()})") from e
            self.inflight.pop(f, None)
            if self.rec is not None:
                self.rec.busy_s[w] += busy
        return [want]

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


