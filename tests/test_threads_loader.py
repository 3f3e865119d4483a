"""Loader(threads=True): batches filled by threads of this process (serve/threads.py) are the batches
num_workers=0 and worker processes serve (crops, flips, labels, every epoch, a resumed run), held ones
stay intact (tests/test_held_batches.py runs its checks on threads too), a pass left early leaves no part
writing into the next; it runs under the `spawn` start method with fork absent, where it is the default;
a dataset that does not allow concurrent fills is refused with the flag named; a failing fill names its
batch and samples."""
from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest
import torch

import dataprep
from dataprep.errors import DataprepError
from dataprep.images.build import build_images
from dataprep.images.settings import ImageSettings
from dataprep.serve.loader import Loader
from dataprep.settings import BuildSettings
from dataprep.sources import scan_imagenet


@pytest.fixture(scope="module")
def pack(photo_tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("threads") / "pack"
    build_images(scan_imagenet(photo_tree), out, BuildSettings(shard_size=8), ImageSettings(size=64))
    return out


def batches(pack, epochs: int = 2, seed: int = 11, **kw) -> list[tuple[torch.Tensor, ...]]:
    ds = dataprep.InMemoryImageDataset(pack)
    with Loader(ds, 5, shuffle=True, seed=seed, crop=dataprep.RandomResizedCrop(48), flip=True, indices=True, **kw) as ld:
        return [tuple(t.clone() for t in b) for _ in range(epochs) for b in ld]


def same(a, b) -> bool:
    return len(a) == len(b) and all(all(torch.equal(x, y) for x, y in zip(p, q)) for p, q in zip(a, b))


def test_threads_serve_what_no_workers_and_processes_serve(pack):
    ref = batches(pack, num_workers=0)
    assert same(batches(pack, num_workers=2, threads=True), ref)
    assert same(batches(pack, num_workers=3, threads=True), ref)  # parts split three ways
    assert same(batches(pack, num_workers=2, threads=False), ref)
    other = batches(pack, num_workers=0, epochs=1)
    assert not same(ref[: len(other)], batches(pack, num_workers=2, threads=True, seed=12)[: len(other)])  # seeds matter


def test_a_resumed_threaded_run_serves_the_rest_of_the_epoch(pack):
    ds = dataprep.InMemoryImageDataset(pack)
    kw = dict(shuffle=True, seed=3, crop=dataprep.RandomResizedCrop(48), num_workers=2, threads=True)
    with Loader(ds, 4, **kw) as ld:
        whole = [x.clone() for x, _ in ld]
    with Loader(ds, 4, **kw) as ld:
        it = iter(ld)
        next(it), next(it)
        state = ld.state_dict()
    with Loader(ds, 4, **kw) as ld:
        ld.load_state_dict(state)
        rest = [x.clone() for x, _ in ld]
    assert len(rest) == len(whole) - 2 and all(torch.equal(a, b) for a, b in zip(rest, whole[2:]))


def test_a_pass_left_early_leaves_nothing_writing_into_the_next(pack):
    ds = dataprep.InMemoryImageDataset(pack)
    with Loader(ds, 3, shuffle=True, seed=1, num_workers=2, threads=True, crop=dataprep.RandomResizedCrop(48)) as ld:
        first = next(iter(ld))[0].clone()  # the rest of the pass is in flight, then abandoned
        again = [x.clone() for x, _ in ld]  # the same epoch, served again (Loader.__iter__)
    with Loader(ds, 3, shuffle=True, seed=1, num_workers=0, crop=dataprep.RandomResizedCrop(48)) as ld:
        ref = [x.clone() for x, _ in ld]
    assert torch.equal(first, ref[0]) and len(again) == len(ref) and all(torch.equal(a, b) for a, b in zip(again, ref))


def _spawned(pack, q) -> None:
    """In a spawned child, with fork made unavailable: the default Loader must fill with threads."""
    import multiprocessing

    multiprocessing.get_all_start_methods = lambda: ["spawn"]  # what serve/arguments.py asks
    got = batches(pack, num_workers=2)
    ds = dataprep.InMemoryImageDataset(pack)
    q.put(([[t.numpy() for t in b] for b in got], Loader(ds, 5, num_workers=2).threads))


def test_under_spawn_without_fork_threads_are_the_default_and_serve_the_same(pack):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_spawned, args=(pack, q))
    p.start()
    got, threaded = q.get(timeout=120)
    p.join(timeout=30)
    assert p.exitcode == 0 and threaded
    ref = batches(pack, num_workers=0)
    assert len(got) == len(ref) and all(np.array_equal(a, b.numpy()) for g, r in zip(got, ref) for a, b in zip(g, r))


class NoThreads:
    """A servable dataset that does not say its fills may run concurrently."""

    def __len__(self):
        return 10

    def batch_layout(self, request):
        return {"x": ((2,), np.dtype(np.int64))}

    def fill_batch(self, idx, out, request):
        out["x"][: len(idx)] = np.asarray(idx)[:, None]


class Flagged(NoThreads):
    fills_in_threads = True

    def fill_batch(self, idx, out, request):
        if 7 in list(idx):
            raise ValueError("sample 7 is damaged")
        super().fill_batch(idx, out, request)


def test_a_dataset_that_does_not_allow_concurrent_fills_is_refused_by_name():
    with pytest.raises(DataprepError, match="fills_in_threads"):
        Loader(NoThreads(), 2, num_workers=2, threads=True)
    assert not Loader(NoThreads(), 2, num_workers=2).threads  # the default here: processes


def test_a_failing_fill_names_its_batch_and_samples():
    with Loader(Flagged(), 4, num_workers=2, threads=True) as ld, pytest.raises(DataprepError, match=r"batch 1: ValueError: sample 7"):
        list(ld)
    with Loader(Flagged(), 4, num_workers=2, threads=True) as ld:  # served up to the bad batch, then refused
        it = iter(ld)
        assert next(it)[0][:, 0].tolist() == [0, 1, 2, 3]


def test_a_schedule_over_a_multi_resolution_pack_switches_between_passes_under_threads(index_tree, tmp_path):
    """The dataset's held resolution moves with the epoch: under threads it moves once, in the pass's
    first part, and every epoch's batches are the ones num_workers=0 serves at that size."""
    from dataprep.images.dataset import InMemoryImageDataset
    from dataprep.serve.progressive import Schedule

    build_images(scan_imagenet(index_tree), tmp_path / "p", BuildSettings(shard_size=5),
                 ImageSettings(sizes=(32, 16, 24), resize="center-crop", mode="raw"))
    sched = Schedule.table([16, 24, 32], {0: 16, 1: 32, 2: 24, 3: 32})

    def epochs(**kw):
        with Loader(InMemoryImageDataset(tmp_path / "p"), 4, shuffle=True, seed=2, schedule=sched, flip=True, **kw) as ld:
            return [[x.clone() for x, _ in ld] for _ in range(4)]

    ref, got = epochs(num_workers=0), epochs(num_workers=2, threads=True)
    assert [e[0].shape[-1] for e in got] == [16, 32, 24, 32]
    assert all(torch.equal(a, b) for e, f in zip(got, ref) for a, b in zip(e, f))


# -- detection and segmentation datasets: their fills run in threads too -----------------------------------------------

@pytest.mark.parametrize("mode", ["encoded", "raw"])
def test_detection_batches_under_threads_are_those_of_no_workers_boxes_and_cut_counts_too(tmp_path, mode):
    """Pixels, boxes, labels and counts of two shuffled epochs of random crops and flips, and the boxes the
    buffers had no room for (max_boxes=2: each fill adds to one count, under a lock), equal num_workers=0's."""
    from dataprep import DetectionDataset, build
    from dataprep.detection.scenes import write_scenes

    src = write_scenes(tmp_path / "src", n=14, sizes=((60, 80), (70, 50)))
    build.coco(src["images"], tmp_path / "p", annotations=src["coco"], size=48, mode=mode, workers=1, shard_size=4)

    def served(**kw):
        ds = DetectionDataset(tmp_path / "p", max_boxes=2)
        with Loader(ds, 3, shuffle=True, seed=4, crop=dataprep.RandomResizedCrop(40, scale=(0.3, 1.0)), flip=True,
                    indices=True, **kw) as ld:
            return [tuple(t.clone() for t in b) for _ in range(2) for b in ld], ds.boxes_cut

    ref, cut = served(num_workers=0)
    got, cut_threads = served(num_workers=2, threads=True)
    assert cut > 0 and cut_threads == cut
    assert same(got, ref) and any(int(b[3].sum()) for b in ref)  # boxes served, not only empty rows


def test_segmentation_pairs_under_threads_are_those_of_no_workers(tmp_path):
    """Center-cropped image-mask pairs of an encoded pack of mixed sizes (each pair cut one by one) equal
    num_workers=0's, and each mask is its own image's."""
    from dataprep.segmentation.build import build_segmentation
    from dataprep.segmentation.dataset import SegmentationDataset
    from dataprep.segmentation.pairs import pair_by_stem
    from dataprep.synthetic import write_segmentation_tree

    scenes = write_segmentation_tree(tmp_path / "scenes", {"train": 11}, sizes=((60, 80), (75, 50), (64, 64)))
    build_segmentation(pair_by_stem(*scenes), tmp_path / "p", BuildSettings(workers=1, shard_size=4),
                       ImageSettings(size=64, resize="shorter", mode="encoded"))

    def served(**kw):
        with Loader(SegmentationDataset(tmp_path / "p"), 4, shuffle=True, seed=6, crop=(48, 48), indices=True, **kw) as ld:
            return [tuple(t.clone() for t in b) for _ in range(2) for b in ld]

    ref, got = served(num_workers=0), served(num_workers=2, threads=True)
    assert same(got, ref) and len({int(b[1].float().mean()) for b in ref}) > 1  # masks differ between batches
