"""The Loader's arguments checked: takes what a caller passed to `Loader(...)`, gives the backend and the
rank share it resolves to, or a UsageError (a ValueError) naming the argument and what it must be, before
anything is made.
"""
from __future__ import annotations

import multiprocessing as mp
import sys
from typing import Any

import numpy as np

from ..errors import UsageError
from . import contract
from .order import rank_and_world


def check_arguments(dataset, *, batch_size: Any, shuffle: bool, num_workers: Any, sampler: Any, layout: str, crop: Any,
                    schedule: Any, rank: int | None, world_size: int | None, prefetch: Any, hold_bytes: Any,
                    threads: bool | None) -> tuple[bool, int, int]:
    """Check a Loader's arguments against each other and the dataset.

    Args:
        dataset: what the Loader serves (it must give serve/contract.py's `Servable`).
        the rest: the Loader's arguments of the same names.

    Returns:
        (threads, rank, world_size): whether the workers are threads (resolved where `threads` is None:
        threads where forking is not an option and the dataset allows them), and this process's share of
        each epoch (a partitioned dataset's node-local one, torch.distributed's, or the whole epoch).
    """
    contract.check_servable(dataset)  # once, here: a dataset lacking a required method never reaches a batch
    if contract.attribute(dataset, "transform") is not None or contract.attribute(dataset, "joint") is not None:
        raise UsageError("Loader serves uint8 batches and applies no per-sample transform: make the dataset "
                         "without transform=, crop and flip with Loader(crop=dataprep.RandomResizedCrop(...), "
                         "flip=True) and normalise on the GPU (dataprep.Normalize); or use torch's DataLoader")
    for name, value, least in (("batch_size", batch_size, 1), ("num_workers", num_workers, 0),
                               ("prefetch", prefetch, 1), ("hold_bytes", hold_bytes, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
            raise UsageError(f"Loader: {name} is a whole number of at least {least}, not {value!r}")
    if layout not in ("nchw", "nhwc"):
        raise UsageError(f"Loader: layout must be 'nchw' or 'nhwc', not {layout!r}")
    if sampler is not None and shuffle:
        raise UsageError("sampler and shuffle=True exclude each other (as in DataLoader): the sampler gives "
                         "the order; shuffle it there (DistributedSampler(shuffle=True))")
    if sampler is not None and (rank is not None or world_size is not None):
        raise UsageError("pass a sampler or rank/world_size, not both: the Loader shards only its own order")
    if shuffle and contract.flag(dataset, "ordered"):
        raise UsageError(f"a {type(dataset).__name__} orders its samples itself (members shuffled, interleaved "
                         "by weight): pass shuffle=False")
    if schedule is not None and isinstance(crop, (tuple, list)):
        raise UsageError("a schedule sets each epoch's output size: pass crop=dataprep.CenterCrop(size) or "
                         "dataprep.RandomResizedCrop(size), not a fixed (H, W)")
    return _backend(dataset, num_workers, threads), *_share(dataset, sampler, rank, world_size)


def _backend(dataset, num_workers: int, threads: bool | None) -> bool:
    """Whether the workers are threads of this process (False: forked processes, or no workers)."""
    concurrent = contract.flag(dataset, "fills_in_threads")
    if threads is None:  # threads where forking is not an option and the dataset allows them
        threads = bool(num_workers) and concurrent and not forks_safely()
    if num_workers and threads and not concurrent:
        raise UsageError(f"a {type(dataset).__name__} does not say that its fills may run in several threads at once "
                         "(the flag fills_in_threads, docs/datasets.md): pass threads=False (worker processes) or "
                         "num_workers=0")
    if num_workers and not threads and "fork" not in mp.get_all_start_methods():
        raise UsageError("Loader worker processes need the fork start method (Linux); pass threads=True (for a "
                         "dataset that allows it) or num_workers=0")
    return bool(threads) and num_workers > 0


def _share(dataset, sampler, rank: int | None, world_size: int | None) -> tuple[int, int]:
    """(rank, world_size) of this process: a sampler's order is this rank's already (0, 1); a node's ranks
    share a partitioned dataset's part."""
    if sampler is not None:
        return 0, 1
    part = contract.attribute(dataset, "partition")
    if part is not None:
        if (rank, world_size) not in ((None, None), (part.local_rank, part.local_world)):
            raise UsageError(f"a partitioned dataset is shared by its node's ranks: rank {part.local_rank} of "
                             f"{part.local_world} (from its Partition), not rank {rank} of {world_size}; pass neither")
        rank, world_size = part.local_rank, part.local_world
    return rank_and_world(rank, world_size)


def forks_safely() -> bool:
    """Whether worker processes may be forked here: fork exists, and it is not macOS, where forking a
    process that has loaded system frameworks (torch does) may crash the child."""
    return "fork" in mp.get_all_start_methods() and sys.platform != "darwin"
