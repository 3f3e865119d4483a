"""Dask engine: the tasks (one per shard) on a Dask cluster.

With an address or a scheduler file it connects to an existing cluster (on Kubernetes, SLURM through
dask-jobqueue, a cloud service) and never shuts it down; without either it starts a local cluster
bound to 127.0.0.1, speaking TLS with a certificate made for the run (so another local user cannot submit
tasks to it), and stops it at the end. That cluster serves no HTTP: Dask's dashboard and its JSON and
metrics pages need no credentials, so on 127.0.0.1 any local user could read them (task names, shard
paths, the workers' state). DATAPREP_DASK_DASHBOARD=1 (or an address, e.g. 127.0.0.1:8787) turns the
dashboard on for a run, on 127.0.0.1 unless the address says otherwise; dataprep says so on stderr.
The driver keeps a bounded number of tasks in flight (twice the cluster's threads), reports each result as it arrives, and retries a
task that failed for a reason other than bad data: a worker that dies mid-shard has its task
rescheduled elsewhere by the scheduler, and after the scheduler gives up (KilledWorker) the driver
resubmits it `retries` more times. A shard becomes visible only by its final rename, so a worker
killed mid-write leaves at most a temporary directory, removed at the end of the build.

Every worker must see the output directory at the same path (a shared filesystem: NFS, Lustre, a
cloud file share) and have dataprep and its dependencies installed.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import os
import sys
import uuid
from typing import Any, Callable, Sequence

from ..errors import DataprepError, WorkerError

INSTALL = "Dask is not installed: pip install 'dataprep[dask]' (dask and distributed)"
DASHBOARD_ENV = "DATAPREP_DASK_DASHBOARD"


def dashboard_address() -> str | None:
    """The address the local cluster's dashboard listens on, when DATAPREP_DASK_DASHBOARD asks for one."""
    raw = os.environ.get(DASHBOARD_ENV, "").strip()
    if raw.lower() in ("", "0", "no", "false", "off"):
        return None
    if raw.lower() in ("1", "yes", "true", "on"):
        return "127.0.0.1:0"
    return raw if ":" in raw else f"127.0.0.1:{raw}"


@contextlib.contextmanager
def _no_http(off: bool):
    """With `off`, Dask's HTTP routes (scheduler, workers) are none while a cluster starts: its
    servers answer nothing (the workers inherit the setting through their nannies)."""
    if not off:
        yield
        return
    import dask

    with dask.config.set({"distributed.scheduler.http.routes": [], "distributed.worker.http.routes": []}):
        yield


def _distributed():
    try:
        import distributed
    except ImportError as e:
        raise DataprepError(f"{INSTALL} ({e})") from None
    return distributed


_READY = False


def _call(fn: Callable[[Any], Any], task: Any) -> Any:
    """Run one task in a Dask worker: the first call in each worker process turns OpenCV's own thread
    pool off, as the local engine does (one task per worker thread already fills the cores)."""
    global _READY
    if not _READY:
        try:
            import cv2

            cv2.setNumThreads(0)
        except ImportError:  # pragma: no cover
            pass
        _READY = True
    return fn(task)


class DaskEngine:
    name = "dask"

    def __init__(self, address: str | None = None, scheduler_file: str | None = None, workers: int = 1,
                 retries: int = 2, in_flight: int | None = None, connect_timeout: float = 30.0):
        if address and scheduler_file:
            raise DataprepError("give --address or --scheduler-file, not both")
        _distributed()
        self.address, self.scheduler_file, self.workers = address, scheduler_file, max(1, int(workers))
        self.retries, self.in_flight, self.connect_timeout = int(retries), in_flight, connect_timeout
        self.client = None
        self._cluster = None

    @classmethod
    def from_options(cls, workers: int, address: str | None = None, scheduler_file: str | None = None,
                     retries: int = 2) -> "DaskEngine":
        return cls(address=address, scheduler_file=scheduler_file, workers=workers, retries=retries)

    def __enter__(self) -> "DaskEngine":
        from distributed import Client, LocalCluster

        try:
            if self.address:
                self.client = Client(self.address, timeout=self.connect_timeout)
            elif self.scheduler_file:
                self.client = Client(scheduler_file=self.scheduler_file, timeout=self.connect_timeout)
            else:
                # TLS with a certificate made for this run only (Security.temporary): other local users can reach
                # 127.0.0.1 too, and a plain-TCP scheduler would run whatever tasks they sent it.
                from distributed.security import Security

                try:
                    security = Security.temporary()
                except ImportError as e:
                    raise DataprepError(f"a local Dask cluster needs TLS certificates: {INSTALL} ({e})") from None
                dash = dashboard_address()
                with _no_http(dash is None):
                    self._cluster = LocalCluster(n_workers=self.workers, threads_per_worker=1, processes=True,
                                                 protocol="tls", host="127.0.0.1", dashboard_address=dash,
                                                 worker_dashboard_address=None, silence_logs=logging.WARNING,
                                                 security=security)
                if dash is None:
                    # the scheduler listens for HTTP even without a dashboard (an empty set of routes now): closed
                    scheduler = self._cluster.scheduler
                    http = getattr(scheduler, "http_server", None)
                    if http is not None:
                        http.stop()
                    scheduler.services.pop("dashboard", None)  # Dask files its HTTP server as the dashboard
                else:
                    print(f"dataprep: the Dask dashboard is at {self._cluster.dashboard_link} ({DASHBOARD_ENV}); "
                          "any local user can read it", file=sys.stderr)
                self.client = Client(self._cluster, security=security)
        except (OSError, TimeoutError, ValueError) as e:
            where = self.address or self.scheduler_file or "a local cluster"
            self.__exit__()
            raise DataprepError(f"cannot reach the Dask scheduler at {where} ({type(e).__name__}: {e})") from None
        return self

    def __exit__(self, *exc) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        if self._cluster is not None:  # ours: stop it; a cluster we connected to is left running
            self._cluster.close()
            self._cluster = None

    def threads(self) -> int:
        info = self.client.scheduler_info()
        return max(1, sum(int(w.get("nthreads", 1)) for w in info.get("workers", {}).values()))

    def describe(self) -> str:
        where = self.address or self.scheduler_file or "local cluster on 127.0.0.1"
        return f"dask ({where}), {self.threads()} worker threads"

    def map(self, fn: Callable[[Any], Any], tasks: Sequence[Any], on_result: Callable[[int, Any], None] | None = None,
            names: Sequence[str] | None = None) -> list[Any]:
        if self.client is None:
            raise DataprepError("DaskEngine.map outside `with engine:`")
        from distributed import as_completed

        names = list(names) if names is not None else [str(i) for i in range(len(tasks))]
        run = uuid.uuid4().hex[:8]
        results: list[Any] = [None] * len(tasks)
        attempts = [0] * len(tasks)
        pending: dict[Any, int] = {}
        limit = self.in_flight or 2 * self.threads()
        todo = iter(range(len(tasks)))

        def submit(i: int):
            fut = self.client.submit(_call, fn, tasks[i], key=f"dataprep-{run}-{names[i]}-{attempts[i]}", pure=False)
            pending[fut] = i
            return fut

        ac = as_completed([submit(i) for i in itertools.islice(todo, limit)])
        try:
            for fut in ac:
                i = pending.pop(fut)
                if fut.status == "error":
                    exc = fut.exception()
                    if isinstance(exc, DataprepError):
                        raise exc  # bad data or a strict build's error: retrying gives the same answer
                    attempts[i] += 1
                    if attempts[i] > self.retries:
                        raise WorkerError(f"shard {names[i]} failed {attempts[i]} times on the Dask cluster "
                                          f"({type(exc).__name__}: {exc})")
                    ac.add(submit(i))
                    continue
                results[i] = fut.result()
                if on_result:
                    on_result(i, results[i])
                nxt = next(todo, None)
                if nxt is not None:
                    ac.add(submit(nxt))
                fut.release()
        except BaseException:
            self.client.cancel(list(pending))
            raise
        return results
