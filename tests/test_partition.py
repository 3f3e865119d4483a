"""Partitioned caches (issue 22): each node holds its part of the shards; the node's ranks share its part;
every sample is served exactly once an epoch across all ranks; parts rotate by the stated amount; a
resumed run keeps the rules of the loader's state (local world size may change, the partition may not)."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dataprep
from dataprep.errors import DataprepError
from dataprep.images.build import build_images
from dataprep.images.settings import ImageSettings
from dataprep.serve.loader import Loader
from dataprep.serve.partition import Partition
from dataprep.settings import BuildSettings
from dataprep.sources import scan_imagenet
from dataprep.synthetic import decode_index

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pack(index_tree, tmp_path_factory) -> Path:
    """16 index-coded images in 4 shards of 4: two parts of 8 samples each (whole global batches of 2 x 2)."""
    out = tmp_path_factory.mktemp("partition") / "pack"
    build_images(scan_imagenet(index_tree), out, BuildSettings(shard_size=4, limit=16),
                 ImageSettings(size=32, resize="center-crop", mode="raw"), progress=False)
    return out


def served(loader) -> list[int]:
    return [decode_index(im.permute(1, 2, 0).numpy()) for x, _ in loader for im in x]


def test_parts_are_balanced_deterministic_and_cover_every_shard_once():
    counts = [100] * 9 + [37]
    p = Partition(nodes=3, node=0, seed=4)
    parts = p.parts(counts)
    assert sorted(k for part in parts for k in part) == list(range(10))
    sizes = [sum(counts[k] for k in part) for part in parts]
    assert max(sizes) - min(sizes) <= 100  # within one shard of each other
    assert parts == Partition(nodes=3, node=2, seed=4).parts(counts)  # every node agrees on the cut
    assert parts != Partition(nodes=3, node=0, seed=5).parts(counts)  # the seed draws it
    assert p.length(counts) == max(sizes)
    with pytest.raises(DataprepError, match="cannot be parted"):
        Partition(nodes=4, node=0).parts([5, 5, 5])


def test_rotation_moves_each_part_on_every_rotate_every_epochs():
    p = Partition(nodes=3, node=1, rotate_every=2)
    assert [p.part_of(e) for e in range(7)] == [1, 1, 2, 2, 0, 0, 1]
    assert {Partition(nodes=3, node=1).part_of(e) for e in range(7)} == {1}  # no rotation by default


def test_from_env_reads_torchruns_variables(monkeypatch):
    for k, v in {"WORLD_SIZE": "8", "RANK": "5", "LOCAL_WORLD_SIZE": "4", "LOCAL_RANK": "1", "GROUP_RANK": "1"}.items():
        monkeypatch.setenv(k, v)
    p = Partition.from_env()
    assert (p.nodes, p.node, p.local_rank, p.local_world) == (2, 1, 1, 4)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    with pytest.raises(DataprepError, match="whole nodes"):
        Partition.from_env()


def node_loaders(pack, nodes=2, local=2, rotate_every=0, cache="ram", **kw):
    out = []
    for node in range(nodes):
        for r in range(local):
            ds = dataprep.InMemoryImageDataset(pack, cache=cache, partition=Partition(nodes, node, 0, rotate_every, r, local))
            out.append(Loader(ds, 2, shuffle=True, seed=1, **kw))
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_every_sample_once_an_epoch_across_nodes_and_ranks(pack, workers):
    loaders = node_loaders(pack, num_workers=workers)
    full = dataprep.InMemoryImageDataset(pack)
    assert len(loaders[0].dataset) == 8 and len(loaders[0].dataset.shapes) == 8  # each node holds half
    for _epoch in range(2):
        seen = [served(lo) for lo in loaders]
        everything = sorted(i for s in seen for i in s)
        assert everything == sorted(served(Loader(full, 6)))  # exactly once each, across the 4 ranks
        assert not set(seen[0]) & set(seen[1]) and set(seen[0] + seen[1]).isdisjoint(seen[2] + seen[3])
        assert len({len(s) for s in seen}) == 1  # equal steps on every rank
    for lo in loaders:
        lo.close()


def test_parts_rotate_so_every_sample_reaches_every_node(pack):
    with pytest.raises(DataprepError, match="rotating partition"):  # ram: each worker would load its own copy
        dataprep.InMemoryImageDataset(pack, partition=Partition(2, 0, rotate_every=1))
    loaders = node_loaders(pack, rotate_every=1, cache="shm", num_workers=2)  # persistent workers follow the rotation
    node0 = [set(served(loaders[0]) + served(loaders[1])) for _ in range(2)]
    assert node0[0].isdisjoint(node0[1]) and len(node0[0] | node0[1]) == 16  # epoch 1: node 0 holds the other half
    fixed = node_loaders(pack)
    still = [set(served(fixed[0]) + served(fixed[1])) for _ in range(2)]
    assert still[0] == still[1]  # negative control: without rotation the node keeps its part


def test_a_smaller_part_pads_with_its_own_first_samples(index_tree, tmp_path):
    build_images(scan_imagenet(index_tree), tmp_path / "odd", BuildSettings(shard_size=4),  # shards 4,4,4,4,2
                 ImageSettings(size=32, resize="center-crop", mode="raw"), progress=False)
    a = dataprep.InMemoryImageDataset(tmp_path / "odd", partition=Partition(2, 0))
    b = dataprep.InMemoryImageDataset(tmp_path / "odd", partition=Partition(2, 1))
    assert len(a) == len(b) == max(len(a.shapes), len(b.shapes)) and len(a.shapes) != len(b.shapes)
    small = a if len(a.shapes) < len(b.shapes) else b
    got = served(Loader(small, 100, shuffle=True))
    assert len(got) == len(small) and len(set(got)) == len(small.shapes)  # every held sample, the padding twice


def test_crops_are_drawn_from_the_split_index_not_the_held_row(pack):
    crop = dataprep.RandomResizedCrop(16)
    node = next(n for n in (0, 1) if Partition(2, n).shards([4] * 4, 0) != [0, 1])  # rows that are not 0..7
    parted = dataprep.InMemoryImageDataset(pack, partition=Partition(2, node))
    whole = dataprep.InMemoryImageDataset(pack)
    a = next(iter(Loader(parted, 8, crop=crop, flip=True, seed=2)))[0]
    rows = parted._global[:8]  # what the part's rows are in the whole split
    b_all = next(iter(Loader(whole, 16, crop=crop, flip=True, seed=2)))[0]
    # the parted loader shuffles nothing: row k of its batch is held row k, split sample rows[k]
    assert all(torch_equal(a[k], b_all[int(rows[k])]) for k in range(8))
    assert not all(torch_equal(a[k], b_all[k]) for k in range(8))  # keyed by held row, they would differ


def torch_equal(x, y) -> bool:
    return bool((x == y).all())


def test_resume_on_another_local_world_and_refusal_on_another_partition(pack):
    two = node_loaders(pack, nodes=2, local=2)[:2]  # node 0's ranks
    its = [iter(lo) for lo in two]
    first = [decode_index(im.permute(1, 2, 0).numpy()) for it in its for im in next(it)[0]]
    state = two[0].state_dict()
    assert state["partition"] == {"nodes": 2, "node": 0, "seed": 0, "rotate_every": 0}
    one = Loader(dataprep.InMemoryImageDataset(pack, partition=Partition(2, 0, 0, 0, 0, 1)), 2, shuffle=True, seed=1)
    one.load_state_dict(state)
    rest = served(one)
    held = set(served(Loader(dataprep.InMemoryImageDataset(pack, partition=Partition(2, 0)), 8)))
    assert sorted(first + rest) == sorted(held)  # 2 ranks -> 1: nothing of node 0's epoch lost or repeated
    other = Loader(dataprep.InMemoryImageDataset(pack, partition=Partition(2, 1, 0, 0, 0, 1)), 2, shuffle=True, seed=1)
    with pytest.raises(DataprepError, match="partitioned cache"):
        other.load_state_dict(state)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_of_two_ranks_each_under_torchrun(pack, tmp_path):
    """2 torchruns (--nnodes 2, one per node) of 2 ranks, gloo: partition='node' from the environment;
    every sample once an epoch across the 4 ranks; each node's shared segment is about half the pack, and
    what its ranks map of it (PSS) is no more than that."""
    out, port = tmp_path / "ranks.json", free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(n),
                               "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(port),
                               str(ROOT / "tests" / "partition_check.py"), str(pack), str(out)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in range(2)]
    results = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(err[-3000:] for _, err in results)
    ranks = json.loads(out.read_text())
    assert sorted((r["node"], r["local_world"]) for r in ranks) == [(0, 2), (0, 2), (1, 2), (1, 2)]
    full = sorted(served(Loader(dataprep.InMemoryImageDataset(pack), 16)))
    for epoch in range(2):
        assert sorted(i for r in ranks for i in r["epochs"][epoch]) == full  # each sample once, across 4 ranks
    whole = dataprep.InMemoryImageDataset(pack).nbytes
    for node in (0, 1):
        mine = [r for r in ranks if r["node"] == node]
        assert mine[0]["nbytes"] == mine[1]["nbytes"] and 0.4 * whole <= mine[0]["nbytes"] <= 0.6 * whole
        pss = sum(r["pss_kb"] for r in mine) * 1024  # shared pages count once across the node's processes
        assert mine[0]["segment_bytes"] == mine[1]["segment_bytes"] and 0 < pss <= mine[0]["segment_bytes"]


def test_plan_says_how_many_nodes_a_pack_needs_at_a_ram_budget(pack):
    from click.testing import CliRunner

    from dataprep.cli import main

    whole = dataprep.InMemoryImageDataset(pack).nbytes
    args = ["plan", str(pack), "-w", "0", "-b", "1", "--json", "--ram-per-node"]
    one = json.loads(CliRunner().invoke(main, [*args, str(2 * whole)]).output)["partition"]
    two = json.loads(CliRunner().invoke(main, [*args, str(int(0.75 * whole))]).output)["partition"]
    assert one["nodes"] == 1 and two["nodes"] == 2 and two["largest_part"] <= 0.55 * whole
    r = CliRunner().invoke(main, ["plan", str(pack), "--ram-per-node", "10"])
    assert r.exit_code == 0 and "none suffices" in r.output


def test_each_node_draws_its_own_order(pack):
    a, b = (node_loaders(pack)[k] for k in (0, 2))  # rank 0 of node 0 and of node 1
    assert not (a.epoch_order(0) == b.epoch_order(0)).all()  # one order would pair local sample i across nodes
    assert (a.epoch_order(0) == node_loaders(pack)[1].epoch_order(0)).all()  # a node's ranks share one order


def test_an_explicit_global_rank_is_refused_and_padding_rows_change_each_epoch(index_tree, tmp_path, pack):
    ds = dataprep.InMemoryImageDataset(pack, partition=Partition(2, 0, 0, 0, 1, 2))
    with pytest.raises(DataprepError, match="shared by its node's ranks"):
        Loader(ds, 2, rank=3, world_size=4)  # it would shard one node's part over the world: half the samples
    assert Loader(ds, 2, rank=1, world_size=2).rank == 1  # its own local rank is fine
    build_images(scan_imagenet(index_tree), tmp_path / "odd", BuildSettings(shard_size=4),  # shards 4,4,4,4,2
                 ImageSettings(size=32, resize="center-crop", mode="raw"), progress=False)
    a, b = (dataprep.InMemoryImageDataset(tmp_path / "odd", partition=Partition(2, n)) for n in (0, 1))
    small = a if len(a.shapes) < len(b.shapes) else b
    pad = np.arange(len(small.shapes), len(small))
    rows = {tuple(np.asarray(small._held_row(pad, e)).tolist()) for e in range(6)}
    assert len(rows) > 1  # not the same samples served twice every epoch
