"""Which samples each rank serves: takes an epoch's one global order, a start position and the ranks,
gives this rank's batches and the global position after each, so that after k batches every rank has
consumed the same prefix of the order (what a Loader's state records and a resumed run starts from).

The order is cut into global batches of world_size x batch_size samples, rank r taking the r-th share of
each. An incomplete last global batch is dropped (`drop_last`) or padded to a multiple of world_size
with the epoch's first samples, as DistributedSampler pads, so every rank serves equally many batches.
"""
from __future__ import annotations

import numpy as np

from ..errors import DataprepError


def rank_batches(order: np.ndarray, start: int, rank: int, world_size: int, batch_size: int,
                 drop_last: bool, pad_index: int | None = None) -> tuple[list[np.ndarray], list[int]]:
    """This rank's batches of `order` from global position `start`, and the global position after each.
    The epoch's last global batch, without drop_last, is made a multiple of world_size with the order's
    first samples, or with `pad_index` where given (a dataset that fills it as a sample counting nothing)."""
    n, g = len(order), world_size * batch_size
    full = max(n - start, 0) // g
    batches, after = [], []
    for k in range(full):
        base = start + k * g + rank * batch_size
        batches.append(order[base : base + batch_size])
        after.append(start + (k + 1) * g)
    tail = n - start - full * g
    if tail > 0 and not drop_last:
        share = -(-tail // world_size)
        extra = share * world_size - tail
        last = order[start + full * g :]
        if extra:
            pad = np.resize(order, extra) if pad_index is None else np.full(extra, pad_index, order.dtype)
            last = np.concatenate([last, pad])
        batches.append(last[rank * share : (rank + 1) * share])
        after.append(n)
    return batches, after


def rank_batch_count(n: int, start: int, world_size: int, batch_size: int, drop_last: bool) -> int:
    """How many batches `rank_batches` gives for an epoch of n samples from `start` (without the order)."""
    full, tail = divmod(max(n - start, 0), world_size * batch_size)
    return full + (1 if tail and not drop_last else 0)


def rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """This process's rank and the world size: as given, else from torch.distributed once initialised."""
    if rank is None and world_size is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1
    if rank is None or world_size is None:
        raise DataprepError("pass both rank and world_size (or neither, to take them from torch.distributed)")
    if not 0 <= int(rank) < int(world_size):
        raise DataprepError(f"rank {rank} is not in 0..{int(world_size) - 1}")
    return int(rank), int(world_size)
