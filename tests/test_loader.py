"""The fast Loader: the same batches a DataLoader gives, every sample once, deterministic epochs, and
worker failures as prompt errors."""
import os
import signal
import time

import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler

from dataprep.errors import DataprepError, WorkerError
from dataprep.images.build import build_images
from dataprep.images.dataset import InMemoryImageDataset
from dataprep.images.settings import ImageSettings
from dataprep.serve.loader import Loader
from dataprep.settings import BuildSettings
from dataprep.sources import scan_imagenet
from dataprep.synthetic import decode_index

from .conftest import within


@pytest.fixture(scope="module")
def packs(index_tree, tmp_path_factory):
    base = tmp_path_factory.mktemp("loader")
    out = {}
    for name, image in {"raw": dict(mode="raw", resize="center-crop"), "jpeg": dict(resize="center-crop", keep_jpeg=False),
                        "varsize": dict(size=256)}.items():
        build_images(scan_imagenet(index_tree), base / name, BuildSettings(shard_size=5), ImageSettings(**{"size": 32, **image}))
        out[name] = base / name
    return out


def ids(images: torch.Tensor) -> list[int]:
    return [decode_index(im.permute(1, 2, 0).numpy()) for im in images]


@pytest.mark.parametrize("kind", ["raw", "jpeg"])
@pytest.mark.parametrize("workers", [0, 2])
def test_same_batches_as_the_dataset_gives(packs, kind, workers):
    ds = InMemoryImageDataset(packs[kind])
    got = [(x.clone(), y.clone()) for x, y in Loader(ds, 5, num_workers=workers)]
    assert [len(y) for _, y in got] == [5, 5, 5, 3]
    for b, (x, y) in enumerate(got):
        ref_x, ref_y = ds[list(range(5 * b, min(18, 5 * b + 5)))]
        assert x.shape[1:] == (3, 32, 32) and x.dtype == torch.uint8 and y.dtype == torch.int64
        assert torch.equal(x, ref_x) and torch.equal(y, ref_y)


@pytest.mark.parametrize("workers", [0, 2])
def test_shuffled_epochs_see_every_sample_once_and_are_deterministic(packs, workers):
    ds = InMemoryImageDataset(packs["jpeg"])
    loader = Loader(ds, 4, shuffle=True, seed=3, num_workers=workers)
    first = [i for x, _ in loader for i in ids(x)]
    assert sorted(first) == list(range(18)) and first != list(range(18))
    second = [i for x, _ in loader for i in ids(x)]  # a new iter() is the next epoch, as DataLoader reshuffles
    assert sorted(second) == list(range(18)) and second != first and loader.epoch == 2
    loader.set_epoch(1)
    assert [i for x, _ in loader for i in ids(x)] == second  # set_epoch selects one
    loader.set_epoch(1)
    assert [i for x, _ in loader for i in ids(x)] == second  # ... and repeats it
    other = Loader(ds, 4, shuffle=True, seed=3, num_workers=2 - workers)
    assert [i for x, _ in other for i in ids(x)] == first  # the order depends on (seed, epoch) only
    assert len(loader) == 5 and len(Loader(ds, 4, drop_last=True)) == 4
    assert sum(len(y) for _, y in Loader(ds, 4, drop_last=True, num_workers=workers)) == 16


def test_distributed_sampler_shares_are_disjoint(packs):
    ds = InMemoryImageDataset(packs["raw"])
    seen = []
    for rank in (0, 1):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=5)
        loader = Loader(ds, 4, sampler=sampler, num_workers=2)
        loader.set_epoch(2)
        seen.append([i for x, _ in loader for i in ids(x)])
    assert not set(seen[0]) & set(seen[1]) and sorted(seen[0] + seen[1]) == list(range(18))


def test_variable_sizes_need_a_crop_and_layout_options(packs):
    ds = InMemoryImageDataset(packs["varsize"])
    with pytest.raises(DataprepError, match="crop"):
        Loader(ds, 4)
    x, y = next(iter(Loader(ds, 4, crop=(40, 40), layout="nhwc", num_workers=2)))
    assert x.shape == (4, 40, 40, 3)
    assert [decode_index(im.numpy()) for im in x] == [0, 1, 2, 3]


def test_pinned_batches_are_copies(packs):
    ds = InMemoryImageDataset(packs["raw"])
    batches = [x for x, _ in Loader(ds, 6, pin_memory=True)]
    assert [ids(x) for x in batches] == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11], [12, 13, 14, 15, 16, 17]]


class Exploding(InMemoryImageDataset):
    """Dies (SIGKILL, as the OOM killer does) or raises when asked for sample 13."""

    how = "kill"

    def fill_batch(self, idx, out, request=None):
        if 13 in idx:
            if self.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise ValueError("sample 13 is cursed")
        super().fill_batch(idx, out, request)


def test_a_killed_worker_is_an_error_within_seconds(packs):
    ds = Exploding(packs["raw"])
    t0 = time.time()
    with pytest.raises(WorkerError, match=r"died \(exit code -9\) while filling batch 3 .*13"):
        for _ in Loader(ds, 4, num_workers=2):
            pass
    # the death is noticed, not the 300 s timeout waited out: where the machine is quiet enough to say
    within(time.time() - t0, 60, "a killed worker's error")


def test_a_worker_exception_names_the_batch(packs):
    ds = Exploding(packs["raw"])
    ds.how = "raise"
    loader = Loader(ds, 4, num_workers=2)
    with pytest.raises(DataprepError, match="batch 3: ValueError: sample 13 is cursed"):
        for _ in loader:
            pass
    assert not loader._procs  # the error stopped the workers


def test_leaving_early_stops_the_workers(packs):
    import multiprocessing as mp

    ds = InMemoryImageDataset(packs["jpeg"])
    loader = Loader(ds, 2, num_workers=2)
    it = iter(loader)
    next(it)
    assert len(mp.active_children()) >= 2
    it.close()  # leaving an epoch early: the workers stay for the next epoch...
    assert sorted(i for x, _ in loader for i in ids(x)) == list(range(18))  # ...which is whole
    loader.close()
    deadline = time.time() + 5
    while mp.active_children() and time.time() < deadline:
        time.sleep(0.05)
    assert not mp.active_children()


CTRL_C = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (a background job inherits SIGINT ignored)
from dataprep.images.dataset import InMemoryImageDataset
from dataprep.serve.loader import Loader

class Slow(InMemoryImageDataset):
    def fill_batch(self, idx, out, request=None):
        time.sleep(0.2)
        super().fill_batch(idx, out, request)

loader = Loader(Slow(sys.argv[1]), 2, num_workers=2)
print("started", flush=True)
while True:
    for _ in loader:
        pass
"""


def test_ctrl_c_stops_the_workers(packs):
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", CTRL_C, str(packs["raw"])], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "started"
    deadline, kids = time.time() + 60, []
    while len(kids) < 2 and time.time() < deadline:  # the workers are up (however slow the machine)
        kids = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
        time.sleep(0.05)
    assert len(kids) >= 2
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)  # it must exit; how fast is not the point (at load 6 the whole test takes 25-37 s)
    assert "KeyboardInterrupt" in err
    deadline = time.time() + 5
    while time.time() < deadline and any(os.path.exists(f"/proc/{k}") for k in kids):
        time.sleep(0.05)
    assert not any(os.path.exists(f"/proc/{k}") for k in kids), "a loader worker outlived Ctrl-C"


class Sleepy(InMemoryImageDataset):
    def fill_batch(self, idx, out, request=None):
        time.sleep(30)


def test_workers_that_send_nothing_are_a_timeout_error(packs):
    loader = Loader(Sleepy(packs["raw"]), 4, num_workers=2, timeout=1.0)
    t0 = time.time()
    with pytest.raises(WorkerError, match=r"no batch from the loader workers in 1 s"):
        next(iter(loader))
    within(time.time() - t0, 20, "the 1 s timeout's error")  # the timeout, not the 30 s sleep
    loader.close()


def test_a_crop_larger_than_a_sample_pads_it_with_zeros_around_the_centre(packs):
    ds = InMemoryImageDataset(packs["raw"])  # 32 x 32 samples
    with pytest.warns(UserWarning, match="padded with zeros"):
        loader = Loader(ds, 18, crop=(40, 36), layout="nhwc")
    x, _ = next(iter(loader))
    assert x.shape == (18, 40, 36, 3)
    for i in range(18):
        inner = x[i, 4:36, 2:34].numpy()
        assert np.array_equal(inner, ds.image(i))  # (40-32)/2 rows, (36-32)/2 columns of padding each side
        assert x[i, :4].sum() == x[i, 36:].sum() == x[i, :, :2].sum() == x[i, :, 34:].sum() == 0
