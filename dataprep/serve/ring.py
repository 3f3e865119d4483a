"""The Loader's ring: takes a batch layout and the Loader's options (batch size, slots in flight, bytes
kept for held batches, copy, pin_memory, image layout), gives batch slots in one buffer, the rows a fill
writes, and the tensors a served batch is made of; it knows which slots a caller still holds.

One buffer holds every key's slots: an anonymous shared mapping made before worker processes fork (they
write into it), or this process's own memory for threads and inline fills. It is made once for the largest
layout a run serves (`fit`); a layout that outgrows it makes a new one, and batches served from the old one
keep it alive themselves.

A slot is refilled only once nothing refers to the tensors served from it: large fields are served as views
of their slot, and the numpy view each tensor was made from is recorded (`handed`), so a refcount above the
record's own says a tensor (or a view of one) is still alive. The spare slots (`hold_bytes`, reserved but
untouched until used) take batches a caller keeps; once they are all held, further batches are served as
copies, with one warning naming `copy=True`. Small fields (at most SMALL_FIELD bytes a sample) are fresh
tensors.
"""
from __future__ import annotations

import math
import mmap
import sys
import warnings
from typing import Any, Callable, NamedTuple

import numpy as np
import torch

from .workers import rows

SMALL_FIELD = 1024  # bytes a sample: fields this small are served as fresh tensors, not slot views
# Linux: the spare slots are address space only until written; MAP_NORESERVE keeps strict overcommit from
# charging them up front (Python exposes the flag only from 3.13).
_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0)

Layout = dict[str, tuple[tuple[int, ...], np.dtype]]


class Serving(NamedTuple):
    """How a served batch's large fields are made (the Loader's options, read when a pass begins).

    Args:
        copy: fresh tensors, not views of the slot.
        pin_memory: new pinned tensors (copies).
        channels_first: "images" as (N, C, H, W) views of the (N, H, W, C) rows (clips: (N, T, C, H, W) of
            (N, T, H, W, C); the last axis moves before the two ahead of it).
        as_dict: a batch as a dict of its keys (the dataset `serves_dicts`), not a tuple.
    """

    copy: bool = False
    pin_memory: bool = False
    channels_first: bool = True
    as_dict: bool = False


class Ring:
    """Batch slots for one Loader (see the module's docstring). It keeps no option of the Loader's: the batch
    size and bytes for held batches come with `make` and `fits`, how tensors are made with `view`."""

    def __init__(self) -> None:
        self.buffers: dict[str, np.ndarray] | None = None  # key -> (slots, batch x bytes a sample)
        self.capacity: dict[str, tuple[int, np.dtype]] = {}  # bytes a sample, by key
        self.total = 0  # slots: those the pipeline cycles through plus the spare ones
        self.cycled = 0  # the slots the pipeline cycles through (the rest are spare)
        self.rows_made = 0  # the batch size the buffer was made for
        self.handed: dict[int, list[np.ndarray]] = {}  # slot -> the views its last batch's tensors were made from
        self.warned = False

    def fits(self, layout: Layout, batch_size: int) -> bool:
        """Whether the buffer holds a batch of `batch_size` rows of `layout` in every slot."""
        return self.buffers is not None and self.rows_made == batch_size and all(
            k in self.capacity and self.capacity[k][0] >= math.prod(shape) * dt.itemsize for k, (shape, dt) in layout.items())

    def make(self, capacity: dict[str, tuple[int, np.dtype]], cycled: int, shared: bool, batch_size: int,
             hold_bytes: int) -> dict[str, np.ndarray]:
        """A new buffer of `cycled` slots of `batch_size` rows plus the spare ones (`hold_bytes` of them, at
        least one), `capacity` bytes a sample per key: a shared mapping (worker processes write it), else
        this process's memory."""
        self.capacity, self.cycled, self.rows_made = dict(capacity), cycled, batch_size
        slot_bytes = sum(batch_size * nb for nb, _ in self.capacity.values())
        slots = self.total = cycled + max(1, hold_bytes // max(slot_bytes, 1))
        sizes = {k: -(-slots * batch_size * nb // 4096) * 4096 for k, (nb, _) in self.capacity.items()}
        size = max(sum(sizes.values()), 4096)
        buf = mmap.mmap(-1, size, flags=mmap.MAP_SHARED | _NORESERVE) if shared else np.empty(size, np.uint8)
        ring, pos = {}, 0
        for k, (nb, _) in self.capacity.items():
            ring[k] = np.frombuffer(buf, np.uint8, slots * batch_size * nb, pos).reshape(slots, -1)
            pos += sizes[k]
        self.buffers, self.handed = ring, {}  # batches served from an old buffer keep it alive themselves
        return ring

    def drop(self) -> None:
        """Forget the buffer (a part that never returned may still write into it): the next pass makes one."""
        self.buffers = None

    def rows(self, layout: Layout, slot: int, start: int, n: int) -> dict[str, np.ndarray]:
        """Rows start..start+n of `slot`, shaped as `layout` says (contiguous: one batch is one block)."""
        assert self.buffers is not None
        return rows(self.buffers, layout, slot, start, n)

    def held(self, slot: int) -> bool:
        """Whether a tensor served from `slot` (or a view of one, or its storage) is still alive: each
        recorded view is then referenced by its tensor's storage as well as by the record."""
        views = self.handed.get(slot)
        if views is None:
            return False
        if any(sys.getrefcount(views[i]) > 2 for i in range(len(views))):  # the list's and the call's own
            return True
        del self.handed[slot]
        return False

    def free_slot(self, taken) -> int | None:
        """The lowest slot that no batch in flight uses (`taken`) and no caller still holds."""
        for s in range(self.total):
            if s not in taken and not self.held(s):
                return s
        return None

    def view(self, layout: Layout, slot: int, n: int, serving: Serving,
             finish: Callable | None = None) -> tuple[torch.Tensor, ...] | dict[str, Any]:
        """The batch in `slot`, one tensor per key of `layout`. Large fields are views of the slot unless
        copying is asked for (`serving`: copy, pin_memory) or the spare slots are all held; the views are
        recorded so the slot is not refilled while any is alive. `finish`: the dataset's finish_batch hook."""
        held = sum(1 for s in list(self.handed) if s != slot and self.held(s))
        spill = held > self.total - self.cycled
        if spill and not (serving.copy or serving.pin_memory) and not self.warned:
            self.warned = True
            warnings.warn(f"{held} served batches are still referenced (kept in a list, a cache, ...): the Loader keeps "
                          "them intact and serves further batches as copies; pass copy=True to copy every batch, or "
                          "raise hold_bytes to keep more in its ring", stacklevel=3)
        out, views = [], []
        for k, a in self.rows(layout, slot, 0, n).items():
            t = torch.from_numpy(a)
            shape, dt = layout[k]
            small = math.prod(shape) * dt.itemsize <= SMALL_FIELD
            if serving.pin_memory:
                t = t.pin_memory() if torch.cuda.is_available() else t.clone()
            elif small or serving.copy or spill:
                t = t.clone()
            else:
                views.append(a)  # torch.from_numpy holds a reference to `a` for as long as any view of t lives
            if k == "images" and serving.channels_first:
                d = t.dim()
                t = t.permute(*range(d - 3), d - 1, d - 3, d - 2)
            out.append(t)
        if views:
            self.handed[slot] = views
        else:
            self.handed.pop(slot, None)
        batch = dict(zip(layout, out))
        if finish is not None:  # views of the tensors hold the slot as the tensors do (see held)
            batch = finish(batch)
        return batch if serving.as_dict else tuple(batch[k] for k in layout)
