"""Progressive resizing: takes a multi-resolution pack's sizes and a plan over epochs, gives each epoch's
resolution, and batches of (resolution, index) pairs that carry it to every worker.

Setting an attribute on the dataset in the main process does not reach DataLoader workers started
with `persistent_workers=True` (each holds its own copy). The resolution therefore travels with the
indices: `ResolutionBatchSampler` yields `[(R, i), ...]`, and `InMemoryImageDataset` switches to R
when it sees it. Use cache="mmap" or "shm" so that a resolution loaded by a worker is still one copy.
"""
from __future__ import annotations

import math
from typing import Iterator, Mapping, Sequence

import numpy as np

from ..errors import DataprepError


class Schedule:
    """Which resolution each epoch uses: a linear ramp or an explicit table, rounded to sizes that exist.

    Make one with `Schedule.ramp` or `Schedule.table`. `Schedule.ramp(sizes, start=128, end=256,
    first_epoch=0, last_epoch=10)` goes linearly from `start` at `first_epoch` to `end` at `last_epoch`.
    Each epoch is rounded to the nearest available size; ties go to the smaller.
    `Schedule.table(sizes, {0: 128, 5: 192, 10: 256})` holds each entry until the next.

    Args:
        sizes: The resolutions the pack holds.
        points: Epoch to resolution: the ramp's two ends, or the table.
        ramp: Interpolate between the points (a ramp), or hold each (a table).
    """

    def __init__(self, sizes: Sequence[int], points: Mapping[int, float], ramp: bool):
        self.sizes = sorted(int(s) for s in sizes)
        if not self.sizes or not points:
            raise DataprepError("a schedule needs the pack's sizes and at least one epoch")
        self.points = dict(sorted((int(e), float(r)) for e, r in points.items()))
        self.ramp = ramp
        if not ramp:
            missing = sorted({int(r) for r in self.points.values()} - set(self.sizes))
            if missing:
                raise DataprepError(f"schedule names resolutions {missing}; the pack has {self.sizes}")

    @classmethod
    def ramp(cls, sizes: Sequence[int], start: int, end: int, first_epoch: int, last_epoch: int) -> "Schedule":
        """A linear ramp of resolutions, each epoch rounded to the nearest size (ties to the smaller).

        Args:
            sizes: The resolutions the pack holds.
            start: The resolution up to `first_epoch`.
            end: The resolution from `last_epoch` on.
            first_epoch: Where the ramp starts.
            last_epoch: Where the ramp ends.

        Returns:
            The schedule.
        """
        if last_epoch < first_epoch:
            raise DataprepError("last_epoch must not come before first_epoch")
        return cls(sizes, {first_epoch: start, last_epoch: end}, ramp=True)

    @classmethod
    def table(cls, sizes: Sequence[int], table: Mapping[int, int]) -> "Schedule":
        """A table of resolutions: each entry holds until the next.

        Args:
            sizes: The resolutions the pack holds.
            table: Epoch to resolution, such as {0: 128, 5: 192, 10: 256}; each one a size the pack holds.

        Returns:
            The schedule.
        """
        return cls(sizes, table, ramp=False)

    def __call__(self, epoch: int) -> int:
        epochs = list(self.points)
        if epoch <= epochs[0]:
            want = self.points[epochs[0]]
        elif epoch >= epochs[-1]:
            want = self.points[epochs[-1]]
        elif self.ramp:
            (e0, r0), (e1, r1) = list(self.points.items())[:2]
            want = r0 + (r1 - r0) * (epoch - e0) / (e1 - e0)
        else:
            want = self.points[max(e for e in epochs if e <= epoch)]
        return min(self.sizes, key=lambda s: (abs(s - want), s))


class ResolutionBatchSampler:
    """Batches of `(resolution, index)` pairs, this epoch's resolution from the schedule.

    Indices are shuffled from (seed, epoch), or taken from any sampler (a DistributedSampler included).
    Call `set_epoch` before each epoch.

    Args:
        sampler_or_length: A sampler, or the dataset's length.
        batch_size: Samples a batch.
        schedule: The resolution of each epoch.
        shuffle: Shuffle the indices (without a sampler).
        seed: The shuffle's seed.
        drop_last: Leave out a last, smaller batch.
    """

    def __init__(self, sampler_or_length, batch_size: int, schedule: Schedule, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False):
        self.sampler = None if isinstance(sampler_or_length, int) else sampler_or_length
        self.length = sampler_or_length if isinstance(sampler_or_length, int) else None
        self.batch_size, self.schedule, self.shuffle, self.seed, self.drop_last = batch_size, schedule, shuffle, seed, drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Pick the epoch the next pass serves: its resolution and its shuffle.

        Args:
            epoch: The epoch; passed on to a sampler that has `set_epoch`.
        """
        self.epoch = epoch
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    @property
    def resolution(self) -> int:
        """This epoch's resolution, from the schedule."""
        return self.schedule(self.epoch)

    def __len__(self) -> int:
        n = len(self.sampler) if self.sampler is not None else self.length
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        if self.sampler is not None:
            order = [int(i) for i in self.sampler]
        elif self.shuffle:
            order = np.random.default_rng([self.seed, self.epoch]).permutation(self.length).tolist()
        else:
            order = list(range(self.length))
        r = self.resolution
        for k in range(0, len(order), self.batch_size):
            batch = order[k : k + self.batch_size]
            if len(batch) < self.batch_size and self.drop_last:
                return
            yield [(r, i) for i in batch]
