"""Partitioned caches: takes a split's shard counts, the node count, a seed and an epoch, gives the shards
one node holds in that epoch, so a pack larger than one node's RAM is held once across the nodes.

Shards are dealt into `nodes` parts of nearly equal sample counts: the shards in an order drawn from the
seed, cut where the running count crosses each k / nodes of the total. Node n holds part (n + r) mod
nodes, where r = epoch // rotate_every (0 when rotate_every is 0): every `rotate_every` epochs each
node takes the next node's part (it fetches or reads its new part), so over `nodes` rotations
every sample is served on every node. Within an epoch, a node's ranks share its part as one Loader order
(serve/order.py, with the node's local ranks, an order of the node's own); every node serves as many
samples as the largest part holds, so every rank takes equally many steps: a smaller part serves some of
its samples twice (rows drawn anew each epoch), as DistributedSampler pads. Parts are whole shards, so
they differ by up to a shard: give each node many shards (9 equal shards on 4 nodes make parts of 3, 2,
2, 2 shards: the smaller three pad half a part each). `partition="node"` never rotates; pass
`Partition.from_env(rotate_every=k)` for that.

The trade-off against one global shuffle: a global batch is always drawn half from each of two nodes'
parts (stratified by part) rather than from the whole pack at once; over epochs the parts rotate.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ..errors import DataprepError
from . import contract


@dataclass(frozen=True)
class Partition:
    """Which node this process is on, of how many, and its rank among the node's processes.

    `Partition.from_env()` reads them from torchrun's environment.

    Args:
        nodes: How many nodes share the pack.
        node: This node's index, from 0.
        seed: Draws the order in which shards are dealt into parts.
        rotate_every: Every this many epochs each node takes the next node's part; 0 never moves them.
        local_rank: This process's rank among the node's processes.
        local_world: How many processes the node runs.
    """

    nodes: int
    node: int
    seed: int = 0
    rotate_every: int = 0
    local_rank: int = 0
    local_world: int = 1

    def __post_init__(self):
        if self.nodes < 1 or not 0 <= self.node < self.nodes:
            raise DataprepError(f"partition: node {self.node} of {self.nodes} nodes is not a node")
        if self.local_world < 1 or not 0 <= self.local_rank < self.local_world:
            raise DataprepError(f"partition: local rank {self.local_rank} of {self.local_world} is not a rank")
        if self.rotate_every < 0:
            raise DataprepError("partition: rotate_every is a number of epochs (0: the parts never move)")

    @classmethod
    def from_env(cls, seed: int = 0, rotate_every: int = 0) -> "Partition":
        """The partition torchrun (or the environment) describes.

        The local world and rank are LOCAL_WORLD_SIZE and LOCAL_RANK. The node is GROUP_RANK (torchrun),
        NODE_RANK, or RANK // LOCAL_WORLD_SIZE, of WORLD_SIZE / LOCAL_WORLD_SIZE nodes. A single process is
        node 0 of 1.

        Args:
            seed: Draws the order in which shards are dealt into parts.
            rotate_every: Every this many epochs each node takes the next node's part; 0 never moves them.

        Returns:
            This process's partition.
        """
        env = os.environ
        world, rank = int(env.get("WORLD_SIZE", 1)), int(env.get("RANK", 0))
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                world, rank = dist.get_world_size(), dist.get_rank()
        except ImportError:  # pragma: no cover - torch is a dependency
            pass
        local_world = int(env.get("LOCAL_WORLD_SIZE", world))
        if world % local_world:
            raise DataprepError(f"partition: {world} ranks do not make whole nodes of {local_world} (LOCAL_WORLD_SIZE)")
        node = int(env.get("GROUP_RANK", env.get("NODE_RANK", rank // local_world)))
        return cls(world // local_world, node, seed, rotate_every, int(env.get("LOCAL_RANK", rank % local_world)), local_world)

    def part_of(self, epoch: int) -> int:
        """The part this node holds in `epoch`.

        Args:
            epoch: The epoch.

        Returns:
            The part's index, from 0.
        """
        shift = int(epoch) // self.rotate_every if self.rotate_every else 0
        return (self.node + shift) % self.nodes

    def parts(self, counts: list[int]) -> list[list[int]]:
        """The shards of every part, parts of nearly equal sample counts.

        Args:
            counts: The split's samples in each shard.

        Returns:
            Each part's shard indices, in the split's order.
        """
        if len(counts) < self.nodes:
            raise DataprepError(f"partition: {len(counts)} shards cannot be parted over {self.nodes} nodes; "
                                "rebuild with a smaller --shard-size")
        order = np.random.default_rng([self.seed, 0x9A27]).permutation(len(counts))
        c = np.asarray(counts, np.int64)[order]
        mid = np.cumsum(c) - c / 2  # each shard goes where its middle falls
        cut = np.minimum((mid * self.nodes // max(int(c.sum()), 1)).astype(np.int64), self.nodes - 1)
        parts = [sorted(order[cut == p].tolist()) for p in range(self.nodes)]
        for p, got in enumerate(parts):  # a tiny shard among huge ones may leave a part empty: take one
            if not got:
                donor = max(range(self.nodes), key=lambda q: len(parts[q]))
                parts[p] = [parts[donor].pop()]
        return parts

    def shards(self, counts: list[int], epoch: int) -> list[int]:
        """The shards this node holds in `epoch`.

        Args:
            counts: The split's samples in each shard.
            epoch: The epoch.

        Returns:
            The indices of this node's shards.
        """
        return self.parts(counts)[self.part_of(epoch)]

    def length(self, counts: list[int]) -> int:
        """Samples every node serves an epoch: the largest part's.

        Args:
            counts: The split's samples in each shard.

        Returns:
            The count.
        """
        return max(sum(counts[k] for k in p) for p in self.parts(counts))


def partition_of(partition, seed: int = 0) -> Partition | None:
    """A dataset's `partition` argument: None, "node" (from the environment), or a Partition."""
    if partition is None or isinstance(partition, Partition):
        return partition
    if partition == "node":
        return Partition.from_env(seed)
    raise DataprepError(f"partition is None, 'node' (each node holds its part, from torchrun's environment) or a "
                        f"dataprep.Partition, not {partition!r}")


def partition_state(dataset) -> dict | None:
    """What of a dataset's partition a resumed run must share (a Loader state records it): nodes, node,
    seed, rotation; not the local ranks, which may change like any world size."""
    p = contract.attribute(dataset, "partition")
    return None if p is None else {"nodes": p.nodes, "node": p.node, "seed": p.seed, "rotate_every": p.rotate_every}
