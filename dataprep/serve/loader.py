"""The fast loader: takes a dataset that can fill batch buffers (`batch_layout` + `fill_batch`), gives the
batches a DataLoader would, assembled in buffers allocated once instead of a new tensor per batch.

- With no workers, batches are gathered (decoded packs) or decoded (JPEG packs) in the main process,
  into one of two reused buffers.
- With workers, a ring of batch slots lives in one anonymous shared mapping made before the workers
  fork; a worker fills a whole slot and only (batch number, slot) crosses the pipe back.

A yielded batch is a view of its slot and stays valid until the next batch is requested: copy it to
the GPU (or `.clone()` it) before asking for the next one, as a training step does anyway; or pass
`pin_memory=True` to get pinned copies. Workers are forked on the first epoch and kept for the next
ones (`close()` stops them; so does garbage collection); each batch is split across all workers.
Worker deaths and errors reach the caller as exceptions naming the batch and samples, within a
fraction of a second, and stop the workers; so does Ctrl-C. The shared mapping goes with the
processes. Leaving an epoch early is fine: its unfinished parts are waited for before their slots
are reused. Linux (fork) only for workers.
"""
from __future__ import annotations

import math
import mmap
import multiprocessing as mp
import os
import signal
from multiprocessing.connection import wait
from typing import Iterable, Iterator

import numpy as np
import torch

from ..engine.local import exit_with_parent
from ..errors import DataprepError, WorkerError


class Loader:
    """A drop-in for `DataLoader(dataset, batch_size, shuffle, sampler, num_workers, drop_last)` over
    dataprep datasets, yielding `(images, labels)`: images uint8 (N, C, H, W) in channels-last memory
    (`layout="nhwc"` for (N, H, W, C)), labels int64.

    Args:
        shuffle, seed: a new permutation every epoch from (seed, epoch); `set_epoch` selects the epoch
            (and is passed on to a sampler that has it, such as DistributedSampler).
        sampler: any iterable of indices (e.g. DistributedSampler); replaces shuffle.
        crop: (H, W) to center-crop images of a variable-size pack (padded where smaller).
        prefetch: batches each worker may have in flight.
    """

    def __init__(self, dataset, batch_size: int, shuffle: bool = False, seed: int = 0, num_workers: int = 0,
                 drop_last: bool = False, sampler: Iterable[int] | None = None, pin_memory: bool = False,
                 layout: str = "nchw", crop: tuple[int, int] | None = None, prefetch: int = 2, timeout: float = 300.0):
        if batch_size < 1 or num_workers < 0 or prefetch < 1:
            raise DataprepError("batch_size and prefetch must be >= 1, num_workers >= 0")
        if layout not in ("nchw", "nhwc"):
            raise DataprepError(f"layout must be 'nchw' or 'nhwc', not {layout!r}")
        if num_workers and "fork" not in mp.get_all_start_methods():
            raise DataprepError("Loader workers need the fork start method (Linux); use num_workers=0")
        self.dataset, self.batch_size, self.shuffle, self.seed = dataset, batch_size, shuffle, seed
        self.num_workers, self.drop_last, self.sampler, self.pin_memory = num_workers, drop_last, sampler, pin_memory
        self.layout, self.prefetch, self.timeout = layout, prefetch, timeout
        self.epoch = 0
        self._spec = dataset.batch_layout(crop) if crop is not None else dataset.batch_layout()
        self._crop = crop
        self._ring: dict[str, np.ndarray] | None = None
        self._procs: list = []
        self._pipes: list = []
        self._outstanding: dict[tuple[int, int, int], tuple[int, np.ndarray]] = {}  # (gen, batch, worker) -> (slot, idx)
        self._gen = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def _order(self) -> np.ndarray:
        if self.sampler is not None:
            return np.fromiter((int(i) for i in self.sampler), np.int64)
        n = len(self.dataset)
        if self.shuffle:
            return np.random.default_rng([self.seed, self.epoch]).permutation(n)
        return np.arange(n, dtype=np.int64)

    def __len__(self) -> int:
        n = len(self.sampler) if self.sampler is not None else len(self.dataset)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def _slots(self) -> int:
        return self.num_workers * self.prefetch + 1 if self.num_workers else 2

    def _buffers(self) -> dict[str, np.ndarray]:
        """The ring: (slots, batch, *sample shape) per key, in one anonymous shared mapping (made once)."""
        if self._ring is None:
            slots, sizes = self._slots(), {}
            for k, (shape, dtype) in self._spec.items():
                sizes[k] = slots * self.batch_size * int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            total = sum(-(-s // 4096) * 4096 for s in sizes.values())
            buf = mmap.mmap(-1, max(total, 4096), flags=mmap.MAP_SHARED)
            ring, pos = {}, 0
            for k, (shape, dtype) in self._spec.items():
                count = slots * self.batch_size * int(np.prod(shape, dtype=np.int64))
                ring[k] = np.frombuffer(buf, dtype, count, pos).reshape(slots, self.batch_size, *shape)
                pos += -(-sizes[k] // 4096) * 4096
            self._ring = ring
        return self._ring

    def _batches(self) -> list[np.ndarray]:
        order = self._order()
        n = len(order) - len(order) % self.batch_size if self.drop_last else len(order)
        return [order[i : i + self.batch_size] for i in range(0, n, self.batch_size)]

    def _view(self, slot: int, n: int) -> tuple[torch.Tensor, ...]:
        """The batch in `slot`, one tensor per key of the dataset's batch layout (images in `layout`)."""
        out = []
        for k, buf in self._buffers().items():
            t = torch.from_numpy(buf[slot, :n])
            if k == "images" and self.layout == "nchw":
                t = t.permute(0, 3, 1, 2)
            if self.pin_memory:
                t = t.pin_memory() if torch.cuda.is_available() else t.clone()
            out.append(t)
        return tuple(out)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        batches = self._batches()
        ring = self._buffers()
        if not self.num_workers:
            for b, idx in enumerate(batches):
                slot = b % 2
                self.dataset.fill_batch(idx, {k: v[slot] for k, v in ring.items()})
                yield self._view(slot, len(idx))
            return
        yield from self._with_workers(batches, ring)

    # -- workers ------------------------------------------------------------------------------------
    def _start(self, ring: dict[str, np.ndarray]) -> None:
        """Fork the workers once; they live until `close()` (or an error), across epochs."""
        if self._procs:
            return
        ctx = mp.get_context("fork")
        for w in range(self.num_workers):
            mine, theirs = ctx.Pipe()
            # the child closes its copies of every parent-side end, so a dead parent is an EOF, never a hang
            p = ctx.Process(target=_worker, args=(self.dataset, ring, theirs, [mine, *self._pipes], os.getpid()),
                            daemon=True, name=f"dataprep-loader-{w}")
            p.start()
            theirs.close()
            self._pipes.append(mine)
            self._procs.append(p)

    def close(self) -> None:
        """Stop the workers (also done when the Loader is garbage-collected)."""
        for c in self._pipes:
            try:
                c.send(None)
            except OSError:
                pass
        for p in self._procs:
            p.join(timeout=1)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        for c in self._pipes:
            c.close()
        self._procs, self._pipes, self._outstanding = [], [], {}

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        if getattr(self, "_procs", None):
            self.close()

    def _with_workers(self, batches: list[np.ndarray], ring: dict[str, np.ndarray]):
        """Each batch is split across the workers (so the first batch comes quickly and an epoch's last
        batch keeps every worker busy); a batch is ready when all its parts are."""
        self._start(ring)
        self._gen += 1
        gen, nw = self._gen, len(self._procs)
        free = [s for s in range(self._slots()) if s not in self._busy_slots()]
        parts_left: dict[int, int] = {}
        ready: dict[int, tuple[int, int]] = {}
        sent = 0
        try:
            for want in range(len(batches)):
                while free and sent < len(batches) and sent < want + self._slots() - 1:
                    slot, idx = free.pop(), batches[sent]
                    bounds = np.linspace(0, len(idx), nw + 1).astype(int)
                    parts = [(w, a, b) for w, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])) if b > a]
                    for w, a, b in parts:
                        self._pipes[w].send((gen, sent, slot, int(a), idx[a:b]))
                        self._outstanding[(gen, sent, w)] = (slot, idx[a:b])
                    parts_left[sent] = len(parts)
                    sent += 1
                while want not in ready:
                    for g, b, _w, slot in self._collect(batches):
                        if g != gen:  # a part of an abandoned epoch: its slot was kept out of this one
                            if slot not in self._busy_slots() and slot not in free:
                                free.append(slot)
                            continue
                        parts_left[b] -= 1
                        if not parts_left[b]:
                            ready[b] = (slot, len(batches[b]))
                slot, n = ready.pop(want)
                yield self._view(slot, n)
                free.append(slot)  # the consumer asked for the next batch: this slot may be refilled
        except GeneratorExit:
            raise  # the consumer left the epoch early: workers stay; unfinished parts are waited for later
        except BaseException:
            self.close()  # an error, a dead worker or Ctrl-C: stop everything now
            raise

    def _busy_slots(self) -> set[int]:
        """Slots that workers may still be writing for an abandoned epoch."""
        return {slot for slot, _ in self._outstanding.values()}

    def _collect(self, batches) -> list[tuple[int, int, int, int]]:
        """Wait for worker messages: (generation, batch, worker, slot) of each finished part. A worker's
        death or exception is raised, naming the batch and samples."""
        sentinels = {p.sentinel: w for w, p in enumerate(self._procs)}
        got = wait([*self._pipes, *sentinels], timeout=self.timeout)
        if not got:
            raise WorkerError(f"no batch from the loader workers in {self.timeout:.0f} s")
        done = []
        for c in got:
            if c not in sentinels:
                done += self._receive(self._pipes.index(c))
        for c in got:
            if c in sentinels:
                w = sentinels[c]
                while True:  # what it said before it went
                    try:
                        more = self._pipes[w].poll() and self._receive(w)
                    except OSError:
                        more = []
                    if not more:
                        break
                    done += more
                self._procs[w].join(timeout=1)
                lost = [(b, idx) for (g, b, w2), (_, idx) in self._outstanding.items() if w2 == w]
                where = f" while filling batch {lost[0][0]} (samples {lost[0][1][:8].tolist()})" if lost else ""
                raise WorkerError(f"loader worker {w} died (exit code {self._procs[w].exitcode}){where}")
        return done

    def _receive(self, w: int) -> list[tuple[int, int, int, int]]:
        try:
            msg = self._pipes[w].recv()
        except (EOFError, OSError):
            return []  # the worker is gone (a reset if it died with tasks unread): its sentinel reports it
        if msg[0] == "ok":
            _, gen, b = msg
            slot, _ = self._outstanding.pop((gen, b, w))
            return [(gen, b, w, slot)]
        raise DataprepError(f"loader worker failed on batch {msg[2]}: {msg[3]}")


def _worker(dataset, ring: dict[str, np.ndarray], conn, parent_ends: list, parent: int) -> None:
    for end in parent_ends:
        end.close()
    exit_with_parent(parent)  # a SIGKILLed trainer leaves no worker behind
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process owns Ctrl-C and stops us
    try:
        import cv2

        cv2.setNumThreads(0)  # 0, not 1: see engine.py
    except ImportError:  # pragma: no cover
        pass
    torch.set_num_threads(1)
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        gen, b, slot, start, idx = msg
        try:
            dataset.fill_batch(idx, {k: v[slot, start : start + len(idx)] for k, v in ring.items()})
            conn.send(("ok", gen, b))
        except Exception as e:  # reported with the batch; the main process raises it
            conn.send(("err", gen, b, f"{type(e).__name__}: {e} (samples {idx[:8].tolist()})"))
