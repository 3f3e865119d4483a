"""Local engine: a process pool on this machine.
 A worker that dies is reported as a WorkerError
naming the shards in flight, never a hang; Ctrl-C stops every worker before it propagates.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Sequence

from ..errors import DataprepError, WorkerError

# fork on Linux: workers start in milliseconds, and a user's script without an `if __name__ ==
# "__main__"` guard is not re-run in every worker (spawn re-imports __main__, which in a training
# script means torch and everything else, slowing builds). Workers use only
# Pillow, OpenCV (set to no threads, which is fork-safe) and numpy, never torch.
_CTX = "fork" if "fork" in mp.get_all_start_methods() and sys.platform.startswith("linux") else "spawn"


def exit_with_parent(parent: int | None = None, every: float = 0.5) -> None:
    """In a worker process: exit as soon as the process that started it is gone (SIGKILLed, or crashed),
    instead of waiting forever on a pipe another worker still holds open. A daemon thread compares the
    parent pid every `every` seconds (a parent-death signal would be tied to the thread that forked)."""
    parent = os.getppid() if parent is None else parent

    def watch() -> None:
        while True:
            time.sleep(every)
            if os.getppid() != parent:
                os._exit(1)  # nothing of ours to clean up: temporaries are the next run's (or --resume's) business

    threading.Thread(target=watch, name="dataprep-parent-watch", daemon=True).start()


def default_signals() -> None:
    """In a forked worker: every signal the parent handled in Python (Lightning's SIGTERM handler, a
    preemptible job's checkpoint hook) goes back to its default action, SIGTERM even where the parent
    ignored it, and SIGINT is ignored. A worker that kept a handler which does not exit would outlive the
    SIGTERM multiprocessing sends its daemonic children at exit, and the parent would wait for it forever.
    The parent owns Ctrl-C and stops its workers itself. Other ignored signals stay ignored (a `nohup`
    job's workers outlive a hangup as the job does), SIGPIPE too, as Python sets it."""
    for sig in signal.valid_signals():
        if sig in (signal.SIGINT, signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            if callable(signal.getsignal(sig)) or (sig == signal.SIGTERM and signal.getsignal(sig) != signal.SIG_DFL):
                signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):  # a signal the platform reserves
            pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        signal.set_wakeup_fd(-1)  # a parent's wakeup pipe (asyncio's) is not the worker's to write
    except ValueError:  # pragma: no cover - not the main thread
        pass


def _init_worker(parent: int | None = None) -> None:
    default_signals()  # first: a SIGTERM from here on ends the worker, whatever the parent installed
    exit_with_parent(parent)
    try:
        import cv2

        cv2.setNumThreads(0)  # one process per core already; OpenCV's own pool would oversubscribe
    except ImportError:  # pragma: no cover
        pass


def run_tasks(
    fn: Callable[[Any], Any],
    tasks: Sequence[Any],
    workers: int,
    on_result: Callable[[int, Any], None] | None = None,
    names: Sequence[str] | None = None,
) -> list[Any]:
    """Run fn(task) for every task on `workers` processes; return results in task order.

    `on_result(i, result)` is called in the driver as each task finishes (for progress).
    At most 2 x workers tasks are queued at once, so a failure stops the build quickly.
    """
    names = list(names) if names is not None else [str(i) for i in range(len(tasks))]
    results: list[Any] = [None] * len(tasks)
    if workers <= 1 or len(tasks) <= 1:
        for i, t in enumerate(tasks):
            results[i] = fn(t)
            if on_result:
                on_result(i, results[i])
        return results
    pool = ProcessPoolExecutor(
        max_workers=min(workers, len(tasks)), mp_context=mp.get_context(_CTX), initializer=_init_worker,
        initargs=(os.getpid(),),
    )
    pending: dict[Future, int] = {}
    todo = iter(range(len(tasks)))
    try:
        for i in todo:
            pending[pool.submit(fn, tasks[i])] = i
            if len(pending) >= 2 * workers:
                break
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                i = pending.pop(fut)
                try:
                    results[i] = fut.result()
                except BrokenProcessPool:
                    in_flight = sorted([names[i]] + [names[j] for j in pending.values()])
                    raise WorkerError(
                        f"a build worker died (killed, or out of memory) while shards {', '.join(in_flight)} were in flight"
                    ) from None
                if on_result:
                    on_result(i, results[i])
                nxt = next(todo, None)
                if nxt is not None:
                    pending[pool.submit(fn, tasks[nxt])] = nxt
        pool.shutdown(wait=True)
        return results
    except BaseException:
        _stop(pool)
        raise


def _stop(pool: ProcessPoolExecutor) -> None:
    """Cancel queued tasks and terminate the workers now (not after their current shard)."""
    procs = list(getattr(pool, "_processes", {}).values())  # the executor offers no public kill
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=5)


class LocalEngine:
    """Tasks on `workers` processes of this machine (forked on Linux)."""

    name = "local"

    def __init__(self, workers: int = 1):
        self.workers = max(1, int(workers))

    @classmethod
    def from_options(cls, workers: int, address: str | None = None, scheduler_file: str | None = None,
                     retries: int = 2) -> "LocalEngine":
        if address or scheduler_file:
            raise DataprepError("--address and --scheduler-file need --engine dask")
        return cls(workers)

    def map(self, fn, tasks, on_result=None, names=None) -> list[Any]:
        return run_tasks(fn, tasks, self.workers, on_result, names)

    def describe(self) -> str:
        return f"local, {self.workers} processes"

    def __enter__(self) -> "LocalEngine":
        return self

    def __exit__(self, *exc) -> None:
        pass
