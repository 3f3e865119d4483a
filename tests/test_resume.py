"""The Loader across stops and restarts: epochs that advance by themselves, rank shares of one global
order, state_dict resumed in a new process (images with random crops and flips, tokens, tables; 0 and 2
workers), world-size changes, schedules over persistent workers, and what reaches the workers."""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import dataprep
from dataprep.errors import DataprepError
from dataprep.images.build import build_images
from dataprep.images.settings import ImageSettings
from dataprep.serve.loader import Loader
from dataprep.settings import BuildSettings
from dataprep.sources import scan_imagenet
from dataprep.synthetic import decode_index
from dataprep.tables.build import build_table
from dataprep.tables.columns import TableSettings
from dataprep.tokens.tokenize import TokenizeSettings, tokenize

from .resume_check import digests, make

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def packs(index_tree, photo_tree, tmp_path_factory):
    base = tmp_path_factory.mktemp("resume")
    out = {}
    build_images(scan_imagenet(photo_tree), base / "images", BuildSettings(shard_size=8), ImageSettings(size=40))
    out["images"] = base / "images"
    build_images(scan_imagenet(index_tree), base / "index", BuildSettings(shard_size=5),
                 ImageSettings(size=32, resize="center-crop", mode="raw"))
    out["index"] = base / "index"
    build_images(scan_imagenet(index_tree), base / "multires", BuildSettings(shard_size=5),
                 ImageSettings(sizes=(16, 24, 32), resize="center-crop", mode="raw"))
    out["multires"] = base / "multires"
    docs = base / "docs.txt"
    docs.write_text("\n".join(f"line {i}: the quick brown fox {i * 7 % 13} jumps over {i % 5} lazy dogs" for i in range(200)))
    tokenize([str(docs)], base / "tokens", TokenizeSettings(), train_bpe_vocab=300)
    out["tokens"] = base / "tokens"
    rng = np.random.default_rng(0)
    pd.DataFrame({"a": rng.normal(size=40), "b": rng.normal(size=40), "y": rng.normal(size=40)}).to_csv(base / "t.csv", index=False)
    build_table([str(base / "t.csv")], base / "tables", TableSettings(target="y"), {})
    out["tables"] = base / "tables"
    return out


def ids(images: torch.Tensor) -> list[int]:
    return [decode_index(im.permute(1, 2, 0).numpy()) for im in images]


def epoch_ids(loader) -> list[int]:
    return [i for x, _ in loader for i in ids(x)]


# -- epochs -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["images", "tokens", "tables"])
def test_each_iter_is_the_next_epoch_and_set_epoch_repeats_one(packs, kind):
    loader = make(kind, str(packs[kind]), 0)
    e0, e1 = digests(loader), digests(loader)
    assert len(e0) == len(loader) and e0 != e1 and loader.epoch == 2
    loader.set_epoch(0)
    assert digests(loader) == e0
    loader.set_epoch(0)
    assert digests(loader) == e0


# -- rank shares --------------------------------------------------------------------------------------
@pytest.mark.parametrize("world,batch,drop_last", [(2, 4, False), (3, 2, False), (2, 4, True), (4, 5, False)])
def test_ranks_partition_one_global_order(packs, world, batch, drop_last):
    ds = dataprep.InMemoryImageDataset(packs["index"])
    for epoch in (0, 1):
        shares = []
        for rank in range(world):
            loader = Loader(ds, batch, shuffle=True, seed=2, rank=rank, world_size=world, drop_last=drop_last)
            loader.set_epoch(epoch)
            shares.append([ids(x) for x, _ in loader])
        assert len({len(s) for s in shares}) == 1  # every rank the same number of batches
        assert len({tuple(len(b) for b in s) for s in shares}) == 1  # ... of the same sizes
        seen = [i for s in shares for b in s for i in b]
        pad = Loader(ds, batch, rank=0, world_size=world, drop_last=drop_last).padding()
        if drop_last:
            assert len(seen) == 18 // (world * batch) * world * batch and len(set(seen)) == len(seen)
        else:
            assert sorted(set(seen)) == list(range(18)) and len(seen) == 18 + pad  # padding is the only repeat
        if epoch == 0:
            first = seen
    assert seen != first  # the next epoch is another order


def test_rank_and_world_size_come_from_torch_distributed_or_are_both_given(packs):
    ds = dataprep.InMemoryImageDataset(packs["index"])
    assert (Loader(ds, 4).rank, Loader(ds, 4).world_size) == (0, 1)  # not initialised: the whole epoch
    with pytest.raises(DataprepError, match="both"):
        Loader(ds, 4, rank=1)
    with pytest.raises(DataprepError, match="rank 2"):
        Loader(ds, 4, rank=2, world_size=2)


@pytest.mark.slow
def test_two_torchrun_ranks_partition_every_epoch(packs, tmp_path):
    from .test_ddp import free_port

    out = tmp_path / "ranks.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), str(ROOT / "tests" / "ddp_loader_check.py"), str(packs["index"]),
           str(packs["tokens"]), str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    ranks = json.loads(out.read_text())
    for epoch in range(2):
        a, b = (set(x["images"][epoch]) for x in ranks)
        assert not a & b and a | b == set(range(18))
        ta, tb = (x["tokens"][epoch] for x in ranks)
        whole = Counter(map(tuple, ranks[0]["whole"][epoch]))
        assert len(ta) == len(tb) and not whole - Counter(map(tuple, ta + tb))  # every window of the epoch ...
        assert len(ta + tb) == sum(whole.values()) + sum(whole.values()) % 2  # ... once, plus the stated padding
    assert ranks[0]["images"][0] != ranks[0]["images"][1]  # no set_epoch, and still a new order


# -- resume ---------------------------------------------------------------------------------------------
def resumed(kind, pack, workers, state, epochs=2, seed=None) -> list[list[str]]:
    if seed is not None:
        state = {**state, "seed": seed}
    cmd = [sys.executable, "-m", "tests.resume_check", kind, str(pack), str(workers), json.dumps(state), str(epochs)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


@pytest.mark.parametrize("kind", ["images", "tokens", "tables"])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_run_stopped_mid_epoch_resumes_in_a_new_process_exactly(packs, kind, workers):
    whole = make(kind, str(packs[kind]), 0)
    e0, e1 = digests(whole), digests(whole)
    stopped = make(kind, str(packs[kind]), workers)
    it = iter(stopped)
    head = digests(next(it) for _ in range(3))
    state = json.loads(json.dumps(stopped.state_dict()))  # what a checkpoint stores
    stopped.close()
    assert head == e0[:3] and state["epoch"] == 0 and state["samples_consumed"] == 3 * stopped.batch_size
    rest = resumed(kind, packs[kind], workers, state)
    assert rest == [e0[3:], e1]  # the batches the uninterrupted run served next: same samples, crops, flips
    if kind != "tables" and workers == 0:  # negative control: another seed is seen (the comparison can fail)
        assert resumed(kind, packs[kind], workers, state, epochs=1, seed=12)[0] != e0[3:]


def test_state_at_an_epoch_end_resumes_with_the_next_epoch(packs):
    loader = make("tokens", str(packs["tokens"]), 0)
    e0, e1 = digests(loader), digests(loader)
    loader.set_epoch(0)
    it = iter(loader)
    assert digests(next(it) for _ in range(len(loader))) == e0
    assert list(it) == []  # the pass has ended (saved after the last batch instead: tests/test_epochs.py)
    state = loader.state_dict()
    assert (state["epoch"], state["samples_consumed"]) == (1, 0)
    fresh = make("tokens", str(packs["tokens"]), 0)
    fresh.load_state_dict(state)
    assert digests(fresh) == e1


def test_state_dict_refuses_another_dataset_and_warns_on_changed_augmentation(packs):
    loader = make("images", str(packs["images"]), 0)
    state = loader.state_dict()
    other = Loader(dataprep.InMemoryImageDataset(packs["index"]), 5)
    with pytest.raises(DataprepError, match="not the same dataset"):
        other.load_state_dict(state)
    with pytest.raises(DataprepError, match="not a dataprep Loader state"):
        loader.load_state_dict({"epoch": 3})
    plain = Loader(dataprep.InMemoryImageDataset(packs["images"]), 5, shuffle=True, seed=11,
                   crop=dataprep.RandomResizedCrop(24))
    with pytest.warns(UserWarning, match="flip"):
        plain.load_state_dict(state)


def test_a_state_of_version_1_over_a_random_window_mixture_warns_and_newer_ones_are_refused(packs):
    """Version 1 states may come from a dataprep that shuffled a mixture's random-window members: resuming
    one over such a mixture says its windows may differ; states of this version, and version 1 states of
    other Loaders, resume quietly; a newer version than this dataprep reads is refused."""
    def token_mix(mode, shuffle=True, nested=False):
        members = [dataprep.TokenDataset(packs["tokens"], context=8, mode=mode, samples=60 if mode == "random" else None)
                   for _ in range(2)]
        mix = dataprep.Mixture(members, [0.5, 0.5], shuffle=shuffle)
        return Loader(dataprep.Mixture([mix, mix], [0.5, 0.5]) if nested else mix, 4)

    loader = token_mix("random")
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    assert state["version"] == 2
    with pytest.warns(UserWarning, match="version 1 over a Mixture with random-window members"):
        token_mix("random").load_state_dict({**state, "version": 1})
    with pytest.warns(UserWarning, match="version 1 over a Mixture"):
        nested = token_mix("random", nested=True)
        nested.load_state_dict({**nested.state_dict(), "version": 1})
    token_mix("random").load_state_dict(state)  # filterwarnings=error: any warning fails
    unshuffled = token_mix("random", shuffle=False)  # no dataprep shuffled these members
    unshuffled.load_state_dict({**unshuffled.state_dict(), "version": 1})
    sequential = token_mix("sequential")
    sequential.load_state_dict({**sequential.state_dict(), "version": 1})
    plain = Loader(dataprep.TokenDataset(packs["tokens"], context=8, samples=60), 4, shuffle=True)
    plain.load_state_dict({**plain.state_dict(), "version": 1})
    with pytest.raises(DataprepError, match="version 3; this dataprep reads up to 2"):
        token_mix("random").load_state_dict({**state, "version": 3})


@pytest.mark.parametrize("before,after", [(2, 1), (1, 2), (2, 3)])
def test_a_world_size_change_serves_the_rest_of_the_epoch_once(packs, before, after):
    ds = dataprep.InMemoryImageDataset(packs["index"])
    full = Loader(ds, 2, shuffle=True, seed=5).epoch_order(0).tolist()
    served, states = [], []
    for rank in range(before):
        loader = Loader(ds, 2, shuffle=True, seed=5, rank=rank, world_size=before)
        it = iter(loader)
        served += [i for _ in range(2) for i in ids(next(it)[0])]
        states.append(loader.state_dict())
    assert all(s == states[0] for s in states)  # every rank records the same position
    assert sorted(served) == sorted(full[: 2 * 2 * before])  # a prefix of the one global order
    for rank in range(after):
        loader = Loader(ds, 2, shuffle=True, seed=5, rank=rank, world_size=after)
        loader.load_state_dict(states[0])
        served += epoch_ids(loader)
    pad = (-(18 - 4 * before) % (2 * after)) % after if (18 - 4 * before) % (2 * after) else 0
    assert sorted(set(served)) == list(range(18)) and len(served) == 18 + pad  # nothing lost, only padding repeats


def test_resuming_skips_without_decoding(packs, monkeypatch):
    loader = make("images", str(packs["images"]), 0)
    loader.load_state_dict({**loader.state_dict(), "samples_consumed": 25})
    seen = []
    original = type(loader.dataset).fill_batch
    monkeypatch.setattr(type(loader.dataset), "fill_batch",
                        lambda self, idx, out, req=None: (seen.append(len(idx)), original(self, idx, out, req))[1])
    n = len(digests(loader))
    assert sum(seen) == len(loader.dataset) - 25 and n == len(seen)


# -- schedules and what reaches the workers --------------------------------------------------------
@pytest.mark.parametrize("workers", [0, 2])
def test_a_schedule_serves_each_epochs_size_through_persistent_workers(packs, workers):
    ds = dataprep.InMemoryImageDataset(packs["multires"], cache="shm")
    sched = dataprep.Schedule.table(ds.resolutions, {0: 16, 1: 24, 2: 32})
    loader = Loader(ds, 4, schedule=sched, num_workers=workers)
    ring, pids = None, None
    for _epoch, size in enumerate((16, 24, 32)):
        batches = [x.clone() for x, _ in loader]
        assert {tuple(x.shape[2:]) for x in batches} == {(size, size)}
        ref = dataprep.InMemoryImageDataset(packs["multires"], resolution=size)
        assert torch.equal(torch.cat(batches), ref[list(range(18))][0])  # the stored pixels of that size
        ring = ring or loader._ring
        assert loader._ring is ring  # allocated once, for the largest size
        if workers:
            pids = pids or [p.pid for p in loader._procs]
            assert [p.pid for p in loader._procs] == pids  # the same workers switched
    crops = Loader(ds, 4, schedule=sched, crop=dataprep.RandomResizedCrop(32), num_workers=workers)
    peeks = []
    for epoch in range(3):  # a peek uses up no epoch (tests/test_epochs.py): name each one
        crops.set_epoch(epoch)
        peeks.append(next(iter(crops))[0].shape[2])
    assert peeks == [16, 24, 32]  # a crop plan's output size follows
    assert crops.state_dict()["resolution"] == 32
    loader.close(), crops.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_what_changes_between_epochs_reaches_the_workers(packs, workers):
    ds = dataprep.InMemoryImageDataset(packs["multires"], cache="shm", resolution=16)
    loader = Loader(ds, 6, num_workers=workers)
    assert next(iter(loader))[0].shape[2] == 16
    ds.use(32)  # after the workers forked
    assert next(iter(loader))[0].shape[2] == 32
    loader.crop = dataprep.CenterCrop(24, resize=32)
    assert next(iter(loader))[0].shape[2] == 24
    loader.close()
    tokens = dataprep.TokenDataset(packs["tokens"], context=8, samples=30, seed=1)
    tl = Loader(tokens, 10, num_workers=workers)
    windows = [torch.cat([x for x, _ in tl]) for _ in range(3)]
    assert not torch.equal(windows[0], windows[1]) and not torch.equal(windows[1], windows[2])
    tokens.set_epoch(1)
    assert torch.equal(windows[1], tokens[list(range(30))][0])  # epoch e's windows, as indexing gives them
    tl.close()


def test_labels_are_fresh_tensors_and_kept_images_stay_intact(packs):
    ds = dataprep.InMemoryImageDataset(packs["index"])
    loader = Loader(ds, 2, shuffle=True, num_workers=2)
    order = loader.epoch_order(0)
    kept = list(loader)  # 9 batches through a ring of 5 slots
    labels = torch.cat([y for _, y in kept])
    assert labels.tolist() == ds.labels[order].tolist()  # not overwritten by later batches
    assert len({y.data_ptr() for _, y in kept}) == len(kept)
    views = [i for x, _ in kept for i in ids(x)]
    assert views == order.tolist()  # slot views, never refilled while held (tests/test_held_batches.py)
    copies = Loader(ds, 2, shuffle=True, num_workers=2, copy=True)
    assert [i for x, _ in list(copies) for i in ids(x)] == order.tolist()
    loader.close(), copies.close()


def test_refused_at_construction(packs):
    ds = dataprep.InMemoryImageDataset(packs["index"])
    with pytest.raises(DataprepError, match="exclude each other"):
        Loader(ds, 4, shuffle=True, sampler=range(18))
    with pytest.raises(DataprepError, match="per-sample transform"):
        Loader(dataprep.InMemoryImageDataset(packs["index"], transform=lambda x: x), 4)
    with pytest.raises(DataprepError, match="torch.utils.data.DataLoader"):
        Loader(list(range(10)), 4)
    tokens = dataprep.TokenDataset(packs["tokens"], context=8)
    with pytest.raises(DataprepError, match="apply to image"):
        Loader(tokens, 4, crop=dataprep.RandomResizedCrop(8))
    with pytest.raises(DataprepError, match="apply to image"):
        Loader(dataprep.TabularDataset(packs["tables"]), 4, flip=True)
    with pytest.raises(DataprepError, match="larger than every stored image"):
        Loader(ds, 4, crop=dataprep.RandomResizedCrop(64))
    for bad in (dict(scale=(0.5, 0.1)), dict(scale=(0.0, 1.0)), dict(ratio=(2.0, 1.0)), dict(scale=(0.1, 1.5))):
        with pytest.raises(DataprepError):
            dataprep.RandomResizedCrop(16, **bad)


def test_a_center_crop_larger_than_stored_images_warns_once(packs):
    ds = dataprep.InMemoryImageDataset(packs["images"])  # shorter side 40
    with pytest.warns(UserWarning, match=r"larger than \d+ of 32 stored images"):
        loader = Loader(ds, 4, crop=(48, 48))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        next(iter(loader))  # said once, not per batch
        Loader(ds, 4, crop=(32, 32))  # a crop that fits says nothing


def test_datasets_take_slices(packs):
    ds = dataprep.InMemoryImageDataset(packs["index"])
    assert torch.equal(ds[2:6][0], ds[[2, 3, 4, 5]][0]) and ds.sources[:2] == [ds.sources[0], ds.sources[1]]
    tokens = dataprep.TokenDataset(packs["tokens"], context=8)
    assert torch.equal(tokens[1:4][0], tokens[[1, 2, 3]][0])
    assert tokens.vocab_size == 300 and 0 <= tokens.eot_id < 300


def test_len_of_a_restored_epoch_counts_the_saved_runs_batches_and_the_rest(packs):
    ds = dataprep.InMemoryImageDataset(packs["index"])
    one = Loader(ds, 2, shuffle=True)
    it = iter(one)
    for _ in range(3):
        next(it)
    state = one.state_dict()  # 6 of 18 consumed on 1 rank
    two = Loader(ds, 2, shuffle=True, rank=0, world_size=2)
    two.load_state_dict(state)
    served = len(list(two))
    assert served == 3 and len(Loader(ds, 2, rank=0, world_size=2)) == 5  # 12 left: 3 global batches of 4
    two.load_state_dict(state)
    assert len(two) == 3 + served  # the saved run's 3 batches, then this rank's 3
    list(two)
    assert len(two) == 5  # the restored epoch is over: whole epochs again
