"""The Loader's process backend: takes a pass's batches and the Loader's ring (an anonymous shared
mapping made before the fork), gives the batches filled by `num_workers` forked worker processes
(serve/workers.py), each batch split across them as the thread backend splits it (serve/request.py).

Only small messages cross the pipes: once a pass, the request and the batch layout to each worker; then,
per part, where it goes (generation, batch, slot, first row, sample indices) and back which part is done
(with its seconds and decode counts for Loader.stats()). A part of an abandoned pass (the consumer left
early) keeps its slot busy until the worker reports it (`busy_slots`). A worker's death or error is
raised naming the batch and its samples, and stops every worker (`stop`). The state lives on the Loader
(its `_procs`, `_pipes`, `_outstanding`, `_gen`), as serve/threads.py keeps its pool in a ThreadFills.
"""
from __future__ import annotations

import multiprocessing as mp
import os
from multiprocessing.connection import wait

import numpy as np

from ..errors import DataprepError, WorkerError
from .request import Request, split
from .threads import closed_during_pass
from .workers import serve_requests


def start(loader, ring: dict[str, np.ndarray]) -> None:
    """Fork the workers once; they live until `close()` (or an error), across epochs."""
    if loader._procs:
        return
    ctx = mp.get_context("fork")
    for w in range(loader.num_workers):
        mine, theirs = ctx.Pipe()
        # the child closes its copies of every parent-side end, so a dead parent is an EOF, never a hang
        p = ctx.Process(target=serve_requests, args=(loader.dataset, ring, theirs, [mine, *loader._pipes], os.getpid()),
                        daemon=True, name=f"dataprep-loader-{w}")
        p.start()
        theirs.close()
        loader._pipes.append(mine)
        loader._procs.append(p)


def with_processes(loader, batches: list[np.ndarray], ring: dict[str, np.ndarray], req: Request, layout: dict,
                   runs: bool = False):
    """Each batch is split across the workers (so the first batch comes quickly and an epoch's last
    batch keeps every worker busy); a batch is ready when all its parts are."""
    start(loader, ring)
    procs = loader._procs  # close() replaces the list: a pass whose workers were stopped under it knows
    loader._gen += 1
    gen, nw, depth = loader._gen, len(loader._procs), loader._slots() - 1  # depth: batches in flight at most
    if loader.measure:
        loader._gen_stats = {gen: loader._filling}  # parts of earlier generations count nowhere
    for pipe in loader._pipes:  # what every part of this generation shares, pickled once per worker
        pipe.send(("epoch", gen, req, layout, loader.measure))
    pending: dict[int, int] = {}  # batch sent and not yet served -> its slot
    parts_left: dict[int, int] = {}
    ready: dict[int, tuple[int, int]] = {}
    sent = 0
    try:
        for want in range(len(batches)):
            if loader._procs is not procs:  # its parts went with the workers: no reply would ever come
                raise closed_during_pass()
            while sent < len(batches) and sent < want + depth:
                slot = loader._free_slot(busy_slots(loader) | set(pending.values()))
                if slot is None:
                    break  # every other slot is held or in flight: the next wait frees one
                idx = batches[sent]
                parts = split(idx, nw, runs)
                for w, a, b, part in parts:
                    loader._pipes[w].send((gen, sent, slot, a, part))
                    loader._outstanding[(gen, sent, w)] = (slot, idx[a:b])
                parts_left[sent], pending[sent] = len(parts), slot
                sent += 1
            if want >= sent:  # cannot happen while the caller holds no more than the spare slots
                raise DataprepError("internal: no ring slot is free to fill the next batch")
            while want not in ready:
                for g, b, _w, slot in collect(loader, batches, want):
                    if g != gen:  # a part of an abandoned epoch: its slot is free once no part is out
                        continue
                    parts_left[b] -= 1
                    if not parts_left[b]:
                        ready[b] = (slot, len(batches[b]))
            slot, n = ready.pop(want)
            del pending[want]
            yield loader._view(layout, slot, n)  # refilled only once the caller drops it (see _held)
    except GeneratorExit:
        raise  # the consumer left the epoch early: workers stay; unfinished parts are waited for later
    except BaseException:
        if loader._procs is procs:
            loader.close()  # an error, a dead worker or Ctrl-C: stop everything now
        raise


def busy_slots(loader) -> set[int]:
    """Slots that workers may still be writing for an abandoned epoch."""
    return {slot for slot, _ in loader._outstanding.values()}


def collect(loader, batches, want: int) -> list[tuple[int, int, int, int]]:
    """Wait for worker messages: (generation, batch, worker, slot) of each finished part. A worker's
    death or exception is raised, naming the batch and samples (`want`: the batch waited for)."""
    sentinels = {p.sentinel: w for w, p in enumerate(loader._procs)}
    got = wait([*loader._pipes, *sentinels], timeout=loader.timeout)
    if not got:
        raise WorkerError(f"no batch from the loader workers in {loader.timeout:.0f} s "
                          f"(batch {want}, samples {np.asarray(batches[want][:8]).tolist()})")
    done = []
    for c in got:
        if c not in sentinels:
            done += receive(loader, loader._pipes.index(c))
    for c in got:
        if c in sentinels:
            w = sentinels[c]
            while True:  # what it said before it went
                try:
                    more = loader._pipes[w].poll() and receive(loader, w)
                except OSError:
                    more = []
                if not more:
                    break
                done += more
            loader._procs[w].join(timeout=1)
            lost = [(b, idx) for (g, b, w2), (_, idx) in loader._outstanding.items() if w2 == w]
            where = f" while filling batch {lost[0][0]} (samples {lost[0][1][:8].tolist()})" if lost else ""
            raise WorkerError(f"loader worker {w} died (exit code {loader._procs[w].exitcode}){where}")
    return done


def receive(loader, w: int) -> list[tuple[int, int, int, int]]:
    try:
        msg = loader._pipes[w].recv()
    except (EOFError, OSError):
        return []  # the worker is gone (a reset if it died with tasks unread): its sentinel reports it
    if msg[0] == "ok":
        _, gen, b, busy, paths = msg
        slot, _ = loader._outstanding.pop((gen, b, w))
        rec = loader._gen_stats.get(gen)
        if rec is not None:
            rec.busy_s[w] += busy
            rec.count_paths(paths)
        return [(gen, b, w, slot)]
    raise DataprepError(f"loader worker failed on batch {msg[2]}: {msg[3]}")


def stop(loader) -> None:
    """Tell each worker to end, wait a moment, then terminate any left; the pipes closed."""
    for c in loader._pipes:
        try:
            c.send(None)
        except OSError:
            pass
    for p in loader._procs:
        p.join(timeout=1)
        if p.is_alive():
            p.terminate()
            p.join(timeout=5)
        if p.is_alive():  # a fill that never returns, or a handler of its own that swallowed SIGTERM
            p.kill()
            p.join(timeout=5)
    for c in loader._pipes:
        c.close()
    loader._procs, loader._pipes, loader._outstanding = [], [], {}
