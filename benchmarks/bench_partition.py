"""Partitioned caches (issue 22): how close to a global shuffle is the order a partitioned cache serves?
Simulates epochs of the Loader's real orders (serve/order.py, serve/partition.py, the Loader's epoch
permutations) for a pack split over nodes, against one global shuffle of the same pack, and prints:

- position: the chi-square statistic of each sample's step in the epoch against uniform (both should sit
  near its degrees of freedom: every sample is equally likely at every step);
- pairs: how often two samples share a global batch, for pairs held by one node and by two nodes,
  against the global shuffle's rate (1 / steps);
- composition: the spread of one part's share of a global batch (a global shuffle varies; a partition
  serves exactly batch / nodes from each part: stratified).

    .venv/bin/python benchmarks/bench_partition.py [--samples 4096] [--nodes 4] [--ranks 2] [--batch 16] [--epochs 200]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from dataprep.serve.order import rank_batches  # noqa: E402
from dataprep.serve.partition import Partition  # noqa: E402


def partitioned_epoch(parts, nodes, ranks, batch, seed, epoch):
    """Global batches (as split indices) of one epoch: every node's ranks' batches at each step."""
    steps = None
    per_node = []
    for node in range(nodes):
        held = parts[node]
        order = np.random.default_rng([seed, epoch, 0x9A27, node]).permutation(len(held))  # the Loader's key
        batches = [rank_batches(order, 0, r, ranks, batch, False)[0] for r in range(ranks)]
        per_node.append([np.concatenate([held[b[t]] for b in batches]) for t in range(len(batches[0]))])
        steps = len(batches[0])
    return [np.concatenate([per_node[n][t] for n in range(nodes)]) for t in range(steps)]


def global_epoch(total, world, batch, seed, epoch):
    order = np.random.default_rng([seed, epoch]).permutation(total)
    return [order[k:k + world * batch] for k in range(0, total, world * batch)]


def measure(epochs_of, total, epochs, part_of, nodes):
    steps = len(epochs_of(0))
    pos = np.zeros((total, steps), np.int64)
    rng = np.random.default_rng(7)
    a, b = rng.integers(0, total, 20000), rng.integers(0, total, 20000)
    keep = a != b
    a, b = a[keep], b[keep]
    together = np.zeros(len(a), np.int64)
    share = []
    for e in range(epochs):
        step_of = np.empty(total, np.int64)
        for t, g in enumerate(epochs_of(e)):
            step_of[g] = t
            share.append(np.mean(part_of[g] == 0))
        pos[np.arange(total), step_of] += 1
        together += step_of[a] == step_of[b]
    expected = epochs / steps
    chi = float(((pos - expected) ** 2 / expected).sum(1).mean())
    same = part_of[a] == part_of[b]
    return {"chi2": chi, "dof": steps - 1, "same": together[same].mean() / epochs, "cross": together[~same].mean() / epochs,
            "rate": 1 / steps, "share_sd": float(np.std(share)), "share_mean": float(np.mean(share))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--shard", type=int, default=64)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=200)
    a = ap.parse_args()
    counts = [a.shard] * (a.samples // a.shard)
    total = sum(counts)
    p = Partition(a.nodes, 0)
    starts = np.concatenate([[0], np.cumsum(counts)])
    parts = [np.concatenate([np.arange(starts[k], starts[k + 1]) for k in part]) for part in p.parts(counts)]
    part_of = np.empty(total, np.int64)
    for n, held in enumerate(parts):
        part_of[held] = n
    world = a.nodes * a.ranks
    print(f"{total} samples in {len(counts)} shards over {a.nodes} nodes x {a.ranks} ranks, batch {a.batch} a rank "
          f"(global {world * a.batch}), {a.epochs} epochs")
    for name, fn in (("global shuffle", lambda e: global_epoch(total, world, a.batch, 0, e)),
                     ("partition='node'", lambda e: partitioned_epoch(parts, a.nodes, a.ranks, a.batch, 0, e))):
        r = measure(fn, total, a.epochs, part_of, a.nodes)
        print(f"  {name:17s} position chi2 {r['chi2']:6.1f} (dof {r['dof']}); a pair shares a global batch: "
              f"one node's {r['same']:.4f}, two nodes' {r['cross']:.4f} (1/steps {r['rate']:.4f}); "
              f"part 0's share of a batch {r['share_mean']:.3f} +- {r['share_sd']:.3f}")


if __name__ == "__main__":
    main()
