"""The Loader's process backend (a serve/passes.py `Fills`): takes the scheduler's batches and the Loader's
ring (an anonymous shared mapping made before the fork), fills them with `num_workers` forked worker
processes (serve/workers.py), each batch split across them as the thread backend splits it (serve/request.py).

Only small messages cross the pipes: once a pass, the request and the batch layout to each worker; then,
per part, where it goes (generation, batch, slot, first row, sample indices) and back which part is done
(with its seconds and decode counts for Loader.stats()). A part of an abandoned pass (the consumer left
early) keeps its slot busy until the worker reports it (`busy`). A worker's death or error is
raised naming the batch and its samples, and stops every worker (`stop`). The state lives in a
WorkerProcesses (the Loader holds one), as serve/threads.py keeps its pool in a ThreadFills.
"""
from __future__ import annotations

import multiprocessing as mp
import os
from multiprocessing.connection import wait
from typing import Any

import numpy as np

from ..errors import DataprepError, WorkerError
from .request import Request, split
from .ring import Ring
from .workers import serve_requests


class WorkerProcesses:
    """The forked workers of one Loader, their pipes and the parts they have in flight.

    Args:
        dataset: what the workers fill batches from (as it is at the fork).
        workers: how many processes.
        timeout: seconds to wait for any part before a WorkerError.
        measure: whether workers time their parts (Loader.stats()).
    """

    def __init__(self, dataset, workers: int, timeout: float, measure: bool):
        self.dataset, self.workers, self.timeout, self.measure = dataset, workers, timeout, measure
        self.procs: list = []
        self.pipes: list = []
        self.outstanding: dict[tuple[int, int, int], tuple[int, np.ndarray]] = {}  # (gen, batch, worker) -> (slot, idx)
        self.gen = 0  # the pass generation: parts of an earlier one count nowhere
        self.gen_stats: dict[int, Any] = {}  # generation -> the EpochStats its parts count into
        self.pass_procs: list = self.procs  # the workers the pass being served began with
        self.runs = False
        self.parts_left: dict[int, int] = {}  # batch of this pass -> its parts not yet reported

    @property
    def closed(self) -> bool:
        """Whether the workers the pass began with were stopped under it (their parts went with them)."""
        return self.procs is not self.pass_procs

    def begin(self, ring: Ring, req: Request, layout: dict, runs: bool, rec: Any) -> None:
        """A pass starts: the workers forked (once), the pass's request and layout sent to each."""
        assert ring.buffers is not None
        self.start(ring.buffers)
        self.pass_procs = self.procs  # stop() replaces the list: a pass whose workers were stopped under it knows
        self.gen += 1
        if self.measure:
            self.gen_stats = {self.gen: rec}  # parts of earlier generations count nowhere
        for pipe in self.pipes:  # what every part of this generation shares, pickled once per worker
            pipe.send(("epoch", self.gen, req, layout, self.measure))
        self.runs = runs
        self.parts_left: dict[int, int] = {}

    def submit(self, b: int, slot: int, idx: np.ndarray) -> None:
        """Batch b's parts, one per worker that gets rows: where each goes, down its worker's pipe."""
        parts = split(idx, len(self.procs), self.runs)
        for w, a, e, part in parts:
            self.pipes[w].send((self.gen, b, slot, a, part))
            self.outstanding[(self.gen, b, w)] = (slot, idx[a:e])
        self.parts_left[b] = len(parts)

    def wait(self, want: int, batches: list[np.ndarray]) -> list[int]:
        """The batches of this pass whose last part a worker reported in this wait."""
        done = []
        for g, b, _w, _slot in self.collect(batches, want):
            if g != self.gen:  # a part of an abandoned pass: its slot is free once no part is out
                continue
            self.parts_left[b] -= 1
            if not self.parts_left[b]:
                done.append(b)
        return done

    def start(self, buffers: dict[str, np.ndarray]) -> None:
        """Fork the workers once; they live until `stop()` (or an error), across epochs."""
        if self.procs:
            return
        ctx = mp.get_context("fork")
        for w in range(self.workers):
            mine, theirs = ctx.Pipe()
            # the child closes its copies of every parent-side end, so a dead parent is an EOF, never a hang
            p = ctx.Process(target=serve_requests, args=(self.dataset, buffers, theirs, [mine, *self.pipes], os.getpid()),
                            daemon=True, name=f"dataprep-loader-{w}")
            p.start()
            theirs.close()
            self.pipes.append(mine)
            self.procs.append(p)

    def busy(self) -> set[int]:
        """Slots that workers may still be writing for an abandoned pass."""
        return {slot for slot, _ in self.outstanding.values()}

    def collect(self, batches, want: int) -> list[tuple[int, int, int, int]]:
        """Wait for worker messages: (generation, batch, worker, slot) of each finished part. A worker's
        death or exception is raised, naming the batch and samples (`want`: the batch waited for)."""
        sentinels = {p.sentinel: w for w, p in enumerate(self.procs)}
        got = wait([*self.pipes, *sentinels], timeout=self.timeout)
        if not got:
            raise WorkerError(f"no batch from the loader workers in {self.timeout:.0f} s "
                              f"(batch {want}, samples {np.asarray(batches[want][:8]).tolist()})")
        done = []
        for c in got:
            if c not in sentinels:
                done += self.receive(self.pipes.index(c))
        for c in got:
            if c in sentinels:
                w = sentinels[c]
                while True:  # what it said before it went
                    try:
                        more = self.pipes[w].poll() and self.receive(w)
                    except OSError:
                        more = []
                    if not more:
                        break
                    done += more
                self.procs[w].join(timeout=1)
                lost = [(b, idx) for (g, b, w2), (_, idx) in self.outstanding.items() if w2 == w]
                where = f" while filling batch {lost[0][0]} (samples {lost[0][1][:8].tolist()})" if lost else ""
                raise WorkerError(f"loader worker {w} died (exit code {self.procs[w].exitcode}){where}")
        return done

    def receive(self, w: int) -> list[tuple[int, int, int, int]]:
        try:
            msg = self.pipes[w].recv()
        except (EOFError, OSError):
            return []  # the worker is gone (a reset if it died with tasks unread): its sentinel reports it
        if msg[0] == "ok":
            _, gen, b, busy, paths = msg
            slot, _ = self.outstanding.pop((gen, b, w))
            rec = self.gen_stats.get(gen)
            if rec is not None:
                rec.busy_s[w] += busy
                rec.count_paths(paths)
            return [(gen, b, w, slot)]
        raise DataprepError(f"loader worker failed on batch {msg[2]}: {msg[3]}")

    def stop(self) -> None:
        """Tell each worker to end, wait a moment, then terminate any left (kill one that outlives SIGTERM);
        the pipes closed."""
        for c in self.pipes:
            try:
                c.send(None)
            except OSError:
                pass
        for p in self.procs:
            p.join(timeout=1)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
            if p.is_alive():  # a fill that never returns, or a handler of its own that swallowed SIGTERM
                p.kill()
                p.join(timeout=5)
        for c in self.pipes:
            c.close()
        self.procs, self.pipes, self.outstanding = [], [], {}


