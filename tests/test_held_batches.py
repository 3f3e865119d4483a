"""Batches a caller keeps never change: the Loader refills a ring slot only once nothing refers to what it
served from it, keeps spare slots for held batches and copies past them (one warning), and a loop that
drops each batch uses the same slots as ever. The pack's pixels encode each sample's index, so a held
image that was overwritten no longer matches the index served beside it."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import dataprep
from dataprep.images.build import build_images
from dataprep.images.settings import ImageSettings
from dataprep.serve.loader import Loader
from dataprep.serve.ring import Ring
from dataprep.settings import BuildSettings
from dataprep.sources import scan_imagenet
from dataprep.synthetic import decode_index


@pytest.fixture(scope="module")
def pack(index_tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("held") / "pack"
    build_images(scan_imagenet(index_tree), out, BuildSettings(shard_size=5),
                 ImageSettings(size=32, resize="center-crop", mode="raw"))
    return out


def loader(pack, workers, **kw):
    """workers: 0, a number of worker processes, or "threads" (two threads of this process, threads=True)."""
    if workers == "threads":
        workers, kw = 2, {**kw, "threads": True}
    return Loader(dataprep.InMemoryImageDataset(pack), 3, shuffle=True, seed=5, num_workers=workers, indices=True, **kw)


def wrong(batches) -> int:
    """Samples whose pixels no longer encode the index they were served with."""
    return sum(decode_index(im.permute(1, 2, 0).numpy()) != int(i)
               for images, _labels, idx in batches for im, i in zip(images, idx))


def in_ring(t: torch.Tensor, ld: Loader) -> bool:
    ring = next(iter(ld._ring.values()))
    lo = ring.__array_interface__["data"][0]
    return lo <= t.data_ptr() < lo + ring.nbytes


@pytest.mark.parametrize("workers", [0, 2, "threads"])
def test_a_kept_epoch_never_changes_however_many_epochs_follow(pack, workers):
    with loader(pack, workers) as ld, warnings.catch_warnings():
        warnings.simplefilter("error")  # the spare slots hold an epoch of this size: no copy, no warning
        kept = list(ld)
        assert len(kept) == len(ld) > ld._slots() and wrong(kept) == 0
        for _ in range(2):
            again = list(ld)
        assert wrong(kept) == 0 and wrong(again) == 0
        assert all(in_ring(images, ld) for images, _, _ in kept)  # zero-copy: views of the ring


@pytest.mark.parametrize("workers", [0, 2, "threads"])
def test_without_the_hold_check_kept_batches_are_overwritten(pack, workers, monkeypatch):
    """Negative control: a Loader that refills slots regardless (the old ring) fails the check above."""
    monkeypatch.setattr(Ring, "held", lambda self, slot: False)
    with loader(pack, workers) as ld:
        kept = list(ld)
        list(ld)
        assert wrong(kept) > 0


@pytest.mark.parametrize("workers", [0, 2, "threads"])
def test_views_of_a_batch_hold_it_too(pack, workers):
    with loader(pack, workers) as ld:
        it = iter(ld)
        images, _labels, idx = next(it)
        first = images[0]                       # a view of one image
        as_numpy = images[1].permute(1, 2, 0).numpy()  # numpy over a view
        want = [int(i) for i in idx[:2]]
        del images
        for _ in it:
            pass
        list(ld)
        assert decode_index(first.permute(1, 2, 0).numpy()) == want[0]
        assert decode_index(as_numpy) == want[1]


@pytest.mark.parametrize("workers", [0, 2, "threads"])
def test_a_loop_that_drops_its_batches_cycles_the_pipeline_slots_and_copies_nothing(pack, workers):
    with loader(pack, workers, hold_bytes=0) as ld, warnings.catch_warnings():
        warnings.simplefilter("error")
        ring = next(iter(ld._ring.values())) if ld._ring else None
        slots = set()
        for _ in range(3):
            for images, _labels, idx in ld:
                assert in_ring(images, ld)
                ring = next(iter(ld._ring.values()))
                base = ring.__array_interface__["data"][0]
                slots.add((images.data_ptr() - base) // ring.shape[1])
                assert wrong([(images, _labels, idx)]) == 0
        assert slots <= set(range(ld._slots()))  # the spare slot is never touched
        assert ld._total == ld._slots() + 1


@pytest.mark.parametrize("workers", [0, 2, "threads"])
def test_gradient_accumulation_that_keeps_a_few_batches_is_served_without_copies(pack, workers):
    with loader(pack, workers) as ld, warnings.catch_warnings():
        warnings.simplefilter("error")
        window = []
        for batch in ld:
            window = (window + [batch])[-4:]
            assert in_ring(batch[0], ld) and wrong(window) == 0


@pytest.mark.parametrize("workers", [0, 2, "threads"])
def test_past_the_spare_slots_batches_are_copies_and_one_warning_names_copy_true(pack, workers):
    with loader(pack, workers, hold_bytes=0) as ld:  # one spare slot
        with pytest.warns(UserWarning, match="copy=True") as caught:
            kept = list(ld) + list(ld)
        assert len([w for w in caught if "copy=True" in str(w.message)]) == 1
        assert wrong(kept) == 0
        copies = [b for b in kept if not in_ring(b[0], ld)]
        assert len(copies) >= len(kept) - ld._total  # at most the ring's slots are held as views
        assert ld._total == ld._slots() + 1          # the ring did not grow past its bound


@pytest.mark.parametrize("workers", [0, 2, "threads"])
def test_pinned_and_copied_batches_never_alias_the_ring(pack, workers):
    for kw in ({"pin_memory": True}, {"copy": True}):
        with loader(pack, workers, **kw) as ld:
            kept = list(ld)
            assert not any(in_ring(images, ld) for images, _, _ in kept)
            assert wrong(kept) == 0 and not ld._handed


def test_hold_bytes_must_not_be_negative(pack):
    with pytest.raises(dataprep.DataprepError, match="hold_bytes"):
        loader(pack, 0, hold_bytes=-1)


@pytest.mark.parametrize("threads", [False, True])
def test_a_jpeg_pack_with_random_crops_keeps_held_batches_too(photo_tree, tmp_path, threads):
    """The crop path writes into the same ring: held crops stay the crops they were when served."""
    build_images(scan_imagenet(photo_tree), tmp_path / "p", BuildSettings(shard_size=8), ImageSettings(size=48))
    ds = dataprep.InMemoryImageDataset(tmp_path / "p")
    with Loader(ds, 4, shuffle=True, num_workers=2, crop=dataprep.RandomResizedCrop(32), flip=True, threads=threads) as ld:
        kept = [(x, y) for x, y in ld]
        sums = [x.to(torch.int64).sum().item() for x, _ in kept]
        list(ld)
        ld.set_epoch(0)
        fresh = [x.clone() for x, _ in ld]
    assert [x.to(torch.int64).sum().item() for x, _ in kept] == sums
    assert all(torch.equal(a, b) for (a, _), b in zip(kept, fresh))
    assert np.unique([s for s in sums]).size > 1
