"""The fast loader: takes a dataset that can fill batch buffers (`batch_layout` + `fill_batch`: the
serving contract, serve/contract.py), gives the batches a DataLoader would, assembled in buffers
allocated once instead of a new tensor per batch; with epochs that advance by themselves, shares per
DDP rank, and a state that a checkpoint can save and a new process resume from mid-epoch.

- With no workers, batches are gathered (decoded packs) or decoded (JPEG packs) in the main process,
  into one of two reused buffers.
- With workers, a ring of batch slots lives in one anonymous shared mapping made before the workers
  fork; a worker fills a whole slot and only (batch number, slot) crosses the pipe back. Each request
  carries everything the samples depend on (epoch, seed, resolution, crop, flip): a worker never acts
  on the dataset object as it was when it forked.

Large per-sample fields (images, token windows) are views of their slot, and a batch the caller still
holds never changes: a slot is refilled only once nothing refers to the tensors served from it (the
numpy view each tensor was made from has no reference left but the Loader's). The ring has spare
slots (`hold_bytes`, reserved but untouched until used) for batches a caller keeps, as `list(loader)`,
a cache or gradient accumulation do; once they are all held, further batches are served as copies,
with one warning naming `copy=True`. A loop that drops each batch before asking for the next reuses
the same slots as before and copies nothing. Small fields (labels, targets: at most 1 KiB a sample)
are fresh tensors. With `pin_memory=True` every large field is copied into a new pinned tensor before
it is served: a `non_blocking` copy to the GPU reads that tensor, never the ring, and PyTorch's pinned
allocator does not hand its block out again until the copy's recorded event has completed.

Workers are forked on the first epoch and kept for the next ones (`close()` stops them; so does garbage
collection); each batch is split across all workers. Worker deaths and errors reach the caller as exceptions naming the batch
and samples, within a fraction of a second, and stop the workers; so does Ctrl-C. The shared mapping
goes with the processes. Leaving an epoch early is fine: its unfinished parts are waited for before
their slots are reused. Linux (fork) only for workers.

Order. An epoch's global order is a permutation drawn from (seed, epoch) (or the dataset's own order,
or a sampler's). With `world_size` W ranks it is cut into global batches of W x batch_size samples,
rank r taking the r-th share of each, so after k batches every rank has consumed the same prefix of
the one order: that prefix is what `state_dict()` records, and a restored run (on any number of ranks)
serves the rest of the epoch exactly once.
"""
from __future__ import annotations

import atexit
import math
import threading
import warnings
import weakref
from typing import Any, Iterable, Iterator

import numpy as np
import torch

from ..errors import DataprepError
from . import contract
from .arguments import check_arguments
from .cursor import Cursor
from .order import rank_batch_count, rank_batches
from .passes import Fills, InlineFills, Pass, PassPlan
from .processes import WorkerProcesses
from .request import Request
from .resume import check_state, loader_state
from .ring import Ring, Serving
from .stats import DATA_BOUND, EpochStats
from .threads import ThreadFills

HOLD_BYTES = 1 << 30  # default bytes of spare ring slots for batches a caller keeps (reserved, not touched)


class Loader:
    """A drop-in for `DataLoader(dataset, batch_size, shuffle, sampler, num_workers, drop_last)` over
    dataprep datasets, yielding a tuple of tensors per batch in the dataset's batch layout (a dict where the
    dataset `serves_dicts`: packed token rows): for images
    `(images, labels)`, images uint8 (N, C, H, W) in channels-last memory (`layout="nhwc"` for
    (N, H, W, C)), labels int64.

    Args:
        dataset: a dataprep dataset, or any that gives serve/contract.py's `Servable` (`__len__`,
            `batch_layout`, `fill_batch`; docs/datasets.md); one lacking any is refused here.
        batch_size: samples a batch (a rank's, with rank sharding).
        shuffle, seed: a new permutation every epoch, drawn from (seed, epoch). Every `iter()` starts the
            next epoch; `set_epoch(e)` selects the one the next `iter()` serves (and is passed on to a
            sampler that has it, such as DistributedSampler).
        num_workers: processes (or threads) that fill batches; 0 fills them in this process.
        drop_last: leave out the epoch's last incomplete batch.
        sampler: any iterable of indices (e.g. DistributedSampler), instead of shuffle and rank sharding.
        pin_memory: serve large fields in fresh pinned tensors, for `non_blocking` copies to the GPU.
        layout: "nchw" (images (N, C, H, W) in channels-last memory) or "nhwc" ((N, H, W, C)).
        rank, world_size: this process's share of every epoch [default: from torch.distributed when it is
            initialised, else the whole epoch]. Every rank serves the same number of batches: with
            `drop_last` the epoch's last incomplete global batch is dropped; without it, that batch is
            padded to a multiple of world_size with the epoch's first samples (as DistributedSampler
            pads; `padding(epoch)` says how many).
        crop: (H, W) to center-crop images of a variable-size pack (padded where smaller), or a crop plan:
            `dataprep.RandomResizedCrop(size, ...)` or `dataprep.CenterCrop(size)`, cut from the whole
            stored image per sample in the workers.
        flip: a random horizontal flip per sample (p = 0.5). Crops and flips are drawn from (seed,
            epoch, sample index): any num_workers, and a resumed run, gives the same batches.
        schedule: a `Schedule` of resolutions over epochs: each epoch is served at schedule(epoch), the
            output size of a crop plan, or else the stored size of a multi-resolution pack. The ring is
            allocated once for the largest size; persistent workers switch without restarting.
        copy: large fields (images) as fresh tensors too. Not needed to keep batches (a held batch never
            changes), but it saves the ring's spare slots and the warning when most batches are kept.
        hold_bytes: bytes of spare ring slots kept for batches the caller still references (at least one
            slot); past them, batches are served as copies.
        indices: also yield each batch's sample indices (int64, last), e.g. for dataprep.gpu crops.
        prefetch: batches each worker may have in flight.
        timeout: seconds to wait for the workers' part of a batch before a WorkerError.
        threads: fill batches with `num_workers` threads of this process instead of forked worker
            processes (serve/threads.py): no fork, no IPC, so it runs on Windows, on macOS and under the
            `spawn` start method; the dataset must allow concurrent fills (`fills_in_threads`: dataprep's
            image, detection, segmentation, video and packed-row datasets, and Mixtures of them).
            [default: threads where fork is absent or unsafe (Windows, macOS) and the dataset allows them,
            else processes, faster on Linux (docs/benchmarks.md, Crops)]
        stats: measure how long the consumer waits for data (`stats()`: three clock reads a batch here,
            one a part in each worker); False measures nothing.

    `state_dict()` / `load_state_dict()` follow torchdata's StatefulDataLoader: save the state with a
    checkpoint, restore it into a Loader over the same dataset in a new process, and the next `iter()`
    serves exactly the batches the uninterrupted run would have served next, without touching the
    skipped ones.
    """

    def __init__(self, dataset, batch_size: int, shuffle: bool = False, seed: int = 0, num_workers: int = 0,
                 drop_last: bool = False, sampler: Iterable[int] | None = None, pin_memory: bool = False,
                 layout: str = "nchw", crop: Any = None, flip: bool = False, schedule=None,
                 rank: int | None = None, world_size: int | None = None, copy: bool = False,
                 indices: bool = False, prefetch: int = 2, timeout: float = 300.0, hold_bytes: int = HOLD_BYTES,
                 stats: bool = True, threads: bool | None = None):
        threads, self.rank, self.world_size = check_arguments(  # serve/arguments.py: UsageErrors naming the argument
            dataset, batch_size=batch_size, shuffle=shuffle, num_workers=num_workers, sampler=sampler, layout=layout,
            crop=crop, schedule=schedule, rank=rank, world_size=world_size, prefetch=prefetch, hold_bytes=hold_bytes,
            threads=threads)
        self.dataset, self.batch_size, self.shuffle, self.seed = dataset, batch_size, shuffle, int(seed)
        self.num_workers, self.drop_last, self.sampler, self.pin_memory = num_workers, drop_last, sampler, pin_memory
        self.layout, self.crop, self.flip, self.schedule, self.copy = layout, crop, bool(flip), schedule, copy
        self.prefetch, self.timeout, self.indices, self.hold_bytes = prefetch, timeout, indices, int(hold_bytes)
        self.threads, self.measure = threads, bool(stats)
        self.batch_sampler = None  # DataLoader's attribute, read by tools that inspect loaders (Lightning does)
        self.ring, self.cursor = Ring(), Cursor()  # the batch slots; where the run is over its epochs
        self._workers = WorkerProcesses(dataset, num_workers, timeout, self.measure)  # forked at the first pass
        self._inline = InlineFills(dataset)
        self._fills: ThreadFills | None = None  # the thread pool (threads=True), made at the first pass
        self._current: weakref.ref[Pass] | None = None  # the pass last begun: a newer one ends it
        self._prefetched = None  # (key, thread, result) of the next epoch's order, drawn in the background
        self._epoch_stats: dict[int, EpochStats] = {}  # epoch -> its figures (its last pass's), see stats()
        self._latest = 0  # the epoch of the pass served last: what stats() describes by default
        # image packs' own attributes (no part of the contract): only for this warning
        if schedule is not None and num_workers and not threads and getattr(dataset, "cache", None) == "ram" \
                and len(set(getattr(dataset, "resolutions", []))) > 1:
            warnings.warn("a schedule over a multi-resolution pack with cache='ram': each worker loads each resolution "
                          "into its own memory; cache='shm' (or 'mmap') keeps one copy", stacklevel=2)
        self.request(0)  # refuse a crop, flip or schedule the dataset cannot serve now, not at the first batch

    # -- what each epoch serves ---------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch the next iter() serves, which while a pass has batches left is the one being served.
        Once a pass has served its epoch's last batch this reads the next epoch, even before the iterator
        is exhausted (a loop that takes exactly `len(loader)` batches: Lightning's, `islice`, `zip`);
        a pass left early leaves it where it was. (`state_dict()` still places a state saved inside the
        last step at the finished epoch's end, which resumes the same way.)"""
        return self.cursor.next_epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next iter() serve `epoch` (from its start). After `load_state_dict`, setting the restored
        epoch keeps the restored position, so a loop that calls `set_epoch(epoch)` every epoch resumes exactly;
        setting another epoch drops it, with a warning.

        Args:
            epoch: the epoch the next iter() serves (also passed on to a sampler that has set_epoch).
        """
        epoch = int(epoch)
        dropped = self.cursor.set_epoch(epoch)
        if dropped is not None:
            warnings.warn(f"set_epoch({epoch}) drops the restored position (epoch {dropped[0]}, "
                          f"{dropped[1]} samples consumed): epoch {epoch} is served from its start", stacklevel=2)
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def request(self, epoch: int) -> Request:
        """What every batch of `epoch` carries to the workers; checks the dataset can serve it.

        Args:
            epoch: the epoch (a schedule's size, the crops' and flips' draws depend on it).

        Returns:
            The Request: epoch, seed, resolution, crop plan and flip.
        """
        res, crop = contract.attribute(self.dataset, "resolution"), self.crop
        if self.schedule is not None:
            size = self.schedule(epoch)
            if crop is not None:
                crop = crop.resized(size)
            else:
                res = size
        req = Request(epoch=int(epoch), seed=self.seed, resolution=res, crop=crop, flip=self.flip)
        self.dataset.batch_layout(req)
        return req

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The epoch's whole order.

        Args:
            epoch: the epoch whose permutation (drawn from (seed, epoch)) is given.

        Returns:
            Sample indices, int64: a sampler's (this rank's share), or the global order all ranks share.
        """
        if self.sampler is not None:
            return np.fromiter((int(i) for i in self.sampler), np.int64)
        n = len(self.dataset)
        if self.shuffle:
            part = contract.attribute(self.dataset, "partition")  # each node its own order: no pairing across nodes
            key = [self.seed, int(epoch)] + ([0x9A27, part.node] if part is not None else [])
            return np.random.default_rng(key).permutation(n)
        return np.arange(n, dtype=np.int64)

    def _order_of(self, epoch: int) -> np.ndarray:
        """The epoch's order, drawn by the thread `_prefetch` started during the epoch before when it was
        this one (a permutation of millions of samples is worth hiding behind the previous epoch's batches).
        The thread is always joined here, so none is running when this Loader forks its workers (another
        Loader started in the middle of this one's epoch may fork while it runs: the thread holds no lock
        a forked worker needs)."""
        pending, self._prefetched = self._prefetched, None
        if pending is not None:
            key, thread, box = pending
            thread.join()
            if key == (epoch, self.seed, len(self.dataset)) and "order" in box:
                return box["order"]
        return self.epoch_order(epoch)

    def _prefetch(self, epoch: int) -> None:
        if not self.shuffle or self.sampler is not None or self._prefetched is not None:
            return
        box: dict = {}
        thread = threading.Thread(target=lambda: box.setdefault("order", self.epoch_order(epoch)), daemon=True)
        thread.start()  # numpy draws the permutation without the GIL
        self._prefetched = ((epoch, self.seed, len(self.dataset)), thread, box)

    def padding(self, epoch: int = 0) -> int:
        """How many samples of a whole epoch are served twice (or, for a dataset that `pads_empty`, as empty
        samples) to give every rank equal batches.

        Args:
            epoch: the epoch (every epoch pads the same number today).

        Returns:
            The count: 0 with drop_last or a sampler.
        """
        if self.sampler is not None or self.drop_last:
            return 0
        tail = len(self.dataset) % (self.world_size * self.batch_size)
        return (-tail) % self.world_size if tail else 0

    def __len__(self) -> int:
        """Batches of a whole epoch on this rank; for a restored epoch, the batches the saved run had
        served (counted in its own batches) plus those this Loader has left to serve of it, so a training
        loop that counts steps (Lightning does) ends the epoch where the Loader does, on any world size."""
        if self.cursor.restored_len is not None:
            return self.cursor.restored_len
        if self.sampler is not None:
            return rank_batch_count(len(self.sampler), 0, 1, self.batch_size, self.drop_last)
        return rank_batch_count(len(self.dataset), 0, self.world_size, self.batch_size, self.drop_last)

    # -- resuming -------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where the run is: seed, epoch, samples of the epoch's order consumed (by all ranks), and what
        the run was serving (serve/resume.py).

        Returns:
            A dict of plain values (a few hundred bytes, made in microseconds) for `torch.save` or JSON.
        """
        return loader_state(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from `state_dict()`'s output: the next iter() serves the rest of that epoch (split over
        this run's ranks and batch size, however many there are; nothing when the state was saved after
        the epoch's last batch), then the epochs after it. The saved run's seed replaces this Loader's
        (the position means something only in its order): a different one warns, as a different
        shuffle, crop, flip or batch size does (serve/resume.py says what each changes). Every value is
        checked before any is used, and a state from another pack of the same length is refused.

        Args:
            state: what `state_dict()` gave, in this process or another.
        """
        total = check_state(self, state)
        self.seed = int(state["seed"])
        epoch, consumed = int(state["epoch"]), int(state["samples_consumed"])
        restored_len = None
        if self.sampler is None and consumed:
            done = consumed // (int(state["world_size"]) * int(state["batch_size"]))
            restored_len = done + rank_batch_count(total, consumed, self.world_size, self.batch_size, self.drop_last)
        self.cursor.restore(epoch, consumed, restored_len)
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    # -- the ring ---------------------------------------------------------------------------------------
    def _slots(self) -> int:
        """Slots the pipeline cycles through: the batches in flight plus the one the caller is using."""
        return self.num_workers * self.prefetch + 1 if self.num_workers else 2

    def _layout(self, req: Request) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        return {k: (tuple(int(v) for v in shape), np.dtype(dt)) for k, (shape, dt) in self.dataset.batch_layout(req).items()}

    def _largest(self, epoch: int) -> dict[str, tuple[int, np.dtype]]:
        """Bytes a sample needs per key: for this epoch, or for the largest size a schedule reaches."""
        epochs = [epoch]
        if self.schedule is not None:
            sizes = {}
            for e in range(min(self.schedule.points), max(self.schedule.points) + 1):
                sizes.setdefault(self.schedule(e), e)
            epochs += list(sizes.values())
        need: dict[str, tuple[int, np.dtype]] = {}
        for e in epochs:
            for k, (shape, dt) in self._layout(self.request(e)).items():
                nbytes = math.prod(shape) * dt.itemsize
                if k not in need or need[k][0] < nbytes:
                    need[k] = (nbytes, dt)
        return need

    def _buffers(self, layout: dict, epoch: int) -> dict[str, np.ndarray]:
        """The ring's buffer, made once for the largest layout the run will serve (serve/ring.py; remade,
        workers restarted, only if one outgrows it)."""
        if not self.ring.fits(layout, self.batch_size):  # the batch size as it is now (a caller may have set it)
            if self._procs:
                self.close()
            capacity = self._largest(epoch)
            for k, (shape, dt) in layout.items():  # a layout the schedule did not foresee (ds.use(bigger))
                nbytes = math.prod(shape) * dt.itemsize
                if k not in capacity or capacity[k][0] < nbytes:
                    capacity[k] = (nbytes, dt)
            if self.threads and self._fills is not None:
                self._fills.drain()  # no part still writes the old buffer
            # threads and inline fills: this process's own memory (no mapping to share: Windows has no MAP_SHARED)
            self.ring.make(capacity, self._slots(), bool(self.num_workers) and not self.threads, self.batch_size,
                           self.hold_bytes)
        assert self.ring.buffers is not None
        return self.ring.buffers

    def worker_pids(self) -> list[int]:
        """The worker processes running now.

        Returns:
            Their process ids: none before the first pass, with threads, or with no workers.
        """
        return [p.pid for p in self._workers.procs]

    # what tests read of the ring and the workers by their old names
    @property
    def _procs(self) -> list:
        return self._workers.procs

    @property
    def _ring(self) -> dict[str, np.ndarray] | None:
        return self.ring.buffers

    @property
    def _total(self) -> int:
        return self.ring.total

    @property
    def _handed(self) -> dict[int, list[np.ndarray]]:
        return self.ring.handed

    # -- how long the consumer waits ---------------------------------------------------------------------
    def stats(self, epoch: int | None = None, threshold: float = DATA_BOUND) -> dict[str, Any]:
        """How long the consumer waited for data in the epoch being served (or the last one served), or
        in a finished `epoch`: batches and samples served, wall_s (from the epoch's first next() to its
        end, or to now), wait_s (time spent in next()), wait_fraction (wait_s / wall_s), startup_s (the
        first next(): workers starting, the first fill), steady_wait_fraction (the share after the first
        batch, which the verdict judges), worker_busy (each worker's share
        of wall_s spent filling batches; with num_workers=0, consumer_fill_fraction: the consumer's own),
        decode_paths (counts per path, summed over workers: image packs), and a one-line verdict. A pass
        served again (an epoch left early, then iterated) replaces that epoch's figures; a resumed epoch's
        count from the resume; a pass that serves nothing (resumed after an epoch's last batch) records
        nothing; workers' time finishing parts of a pass left early counts in no epoch. `threshold`: the
        wait share above which the verdict says data-bound. serve/stats.py says how each is measured.

        Args:
            epoch: a finished epoch [default: the one being served, or the last one served].
            threshold: the wait share above which the verdict says data-bound.

        Returns:
            The figures above as a dict of plain values.
        """
        if not self.measure:
            raise DataprepError("this Loader was made with stats=False: it measured nothing")
        if epoch is None:
            if not self._epoch_stats:
                raise DataprepError("no epoch served yet: stats() describes one once its first batch is asked for")
            epoch = self._latest
        if epoch not in self._epoch_stats:
            raise DataprepError(f"epoch {epoch} was not served by this Loader (served: {sorted(self._epoch_stats)})")
        return self._epoch_stats[epoch].as_dict(threshold)

    # -- iterating --------------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        """A pass over `self.epoch`, from its start, or the rest of a restored epoch (nothing, when the state
        was saved after its last batch). The epoch advances once a pass has served its last batch; a pass
        left early (a peek with `next(iter(loader))`, a `break`) leaves it where it was, so the next
        iter() serves the same epoch again (call `set_epoch` to move on). The epoch is chosen at the first
        `next()`, not here: an iterator made and thrown away (Lightning makes one) changes nothing.

        Returns:
            A serve/passes.py `Pass`: an iterator of batches that owns the pass's slots, batches in flight
            and figures; `close()` leaves it early.
        """
        return Pass(self._plan_pass, self.ring, self.cursor)

    def _plan_pass(self, asked: float, current: Pass) -> PassPlan:
        """What `current` serves, decided at its first next() (at `asked`: planning counts as waiting). A
        pass begun earlier and still held ends here, as one left early."""
        earlier = self._current() if self._current is not None else None
        if earlier is not None and earlier is not current:
            earlier.close()
        self._current = weakref.ref(current)
        self._starting()
        epoch, start = self.cursor.begin()
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)
        set_epoch = contract.hook(self.dataset, "set_epoch")
        if set_epoch is not None:
            set_epoch(epoch)  # for indexing in this process; workers get the epoch with each request
        req = self.request(epoch)
        layout = self._layout(req)
        if self.sampler is None:
            batches, after = rank_batches(self._order_of(epoch), start, self.rank, self.world_size, self.batch_size,
                                          self.drop_last, -1 if contract.flag(self.dataset, "pads_empty") else None)
        else:  # a sampler's order is this rank's already
            batches, after = rank_batches(self.epoch_order(epoch), start, 0, 1, self.batch_size, self.drop_last)
        rec = None
        if self.measure and len(batches):  # a pass with nothing to serve (resumed after its last batch) says nothing
            rec = self._epoch_stats[epoch] = EpochStats(epoch, self.num_workers, started=asked)
            self._latest = epoch
        self._buffers(layout, epoch)
        return PassPlan(epoch, start, batches, after, req, layout, self._fills_for_pass(), self._slots() - 1,
                        Serving(self.copy, self.pin_memory, self.layout == "nchw", contract.flag(self.dataset, "serves_dicts")),
                        self._runs(),
                        contract.hook(self.dataset, "finish_batch"), rec, self.indices,
                        on_first=lambda: self._prefetch(epoch + 1), on_error=self.close)

    def _starting(self) -> None:
        """Called at a pass's first next(), before its epoch is chosen: a subclass may `set_epoch` here
        (dataprep.lightning's follows the trainer's epoch)."""

    def _fills_for_pass(self) -> Fills:
        """The backend that fills this pass: this process, the thread pool (made at its first pass) or the
        worker processes (forked at their first pass); either of the last two is stopped at exit."""
        if not self.num_workers:
            return self._inline
        _closed_at_exit(self)
        if not self.threads:
            return self._workers
        if self._fills is None:
            self._fills = ThreadFills(self.dataset, self.num_workers, self.timeout)
        return self._fills

    # -- closing: workers, processes or threads -----------------------------------------------------
    def close(self) -> None:
        """Stop the workers, processes or threads (also done when the Loader is garbage-collected)."""
        if getattr(self, "_fills", None) is not None:
            if not self._fills.close():
                self.ring.drop()  # a part that never returned may still write into it: the next pass gets a new ring
            self._fills = None
        self._workers.stop()

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        workers = getattr(self, "_workers", None)
        if (workers is not None and workers.procs) or getattr(self, "_fills", None) is not None:
            self.close()

    def _runs(self) -> bool:
        """Whether batches reach the dataset as ranges: it takes them (`fills_runs`: a Mixture, which then
        skips checking that the positions are a run) and the epoch's order is the identity (no shuffle, no
        sampler), where a batch whose ends are len - 1 apart is a run (a padded last batch that wraps
        around to the epoch's start never is)."""
        return contract.flag(self.dataset, "fills_runs") and not self.shuffle and self.sampler is None

_LIVE: "weakref.WeakSet[Loader]" = weakref.WeakSet()  # Loaders whose workers may be running


def _closed_at_exit(loader: Loader) -> None:
    """Have the interpreter's exit stop `loader`'s workers, before multiprocessing's own exit hook (atexit
    runs hooks in reverse order, and multiprocessing registered its hook when it was imported, before this
    first call). Told to stop, a worker ends by itself; multiprocessing's hook would instead SIGTERM it and
    wait, forever where the worker kept a handler that ignores SIGTERM (workers/default_signals resets them)."""
    if not _LIVE:
        atexit.unregister(_close_live)  # once registered, at most
        atexit.register(_close_live)
    _LIVE.add(loader)


def _close_live() -> None:
    for loader in list(_LIVE):
        try:
            loader.close()
        except Exception:  # noqa: BLE001 - at exit: the next Loader must still be stopped
            pass

