"""Several resolutions in one pass, and progressive resizing that reaches persistent workers."""
import shutil

import cv2
import numpy as np
import pytest
from click.testing import CliRunner
from torch.utils.data import DataLoader

from dataprep.cli import main
from dataprep.errors import DataprepError, PackError
from dataprep.images.build import build_images
from dataprep.images.dataset import InMemoryImageDataset
from dataprep.images.process import process_levels as _real_levels  # unpatched, for a negative control
from dataprep.images.settings import ImageSettings
from dataprep.pack.backends import read_manifest
from dataprep.serve.progressive import ResolutionBatchSampler, Schedule
from dataprep.settings import BuildSettings
from dataprep.sources import scan_folder, scan_imagenet
from dataprep.synthetic import decode_index

from .conftest import corpus_dir


@pytest.fixture(scope="module")
def multires(index_tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("mr") / "p"
    build_images(scan_imagenet(index_tree), out, BuildSettings(shard_size=5), ImageSettings(sizes=(32, 16, 24), resize="center-crop", mode="raw"))
    return out


def test_every_resolution_has_the_same_samples_in_the_same_order(multires):
    m = read_manifest(multires)
    assert m["resolutions"] == [16, 24, 32] and set(m["fields"]) >= {"image@16", "image@24", "image@32"}
    ref = None
    for r in (16, 24, 32):
        ds = InMemoryImageDataset(multires, resolution=r, as_numpy=True)
        assert ds[0][0].shape == (r, r, 3)
        got = ([decode_index(ds[i][0]) for i in range(len(ds))], ds.labels.tolist(), list(ds.sources))
        assert got[0] == list(range(18))
        ref = ref or got
        assert got == ref
    assert InMemoryImageDataset(multires).resolution == 32  # default: the largest


def test_missing_resolution_names_the_ones_there(multires):
    with pytest.raises(PackError, match=r"no resolution 64; the pack has \[16, 24, 32\]"):
        InMemoryImageDataset(multires, resolution=64)
    with pytest.raises(DataprepError, match=r"\[48\].*\[16, 24, 32\]"):
        Schedule.table([16, 24, 32], {0: 48})


def test_a_skipped_file_is_skipped_at_every_size(index_tree, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(index_tree / "train", src)
    (src / "n00000001" / "img_00003.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    build_images(scan_folder(src), tmp_path / "p", BuildSettings(), ImageSettings(sizes=(16, 32), mode="raw", resize="pad"))
    m = read_manifest(tmp_path / "p")
    assert [s["source"] for s in m["splits"]["train"]["skipped"]] == ["n00000001/img_00003.png"]
    for r in (16, 32):
        ds = InMemoryImageDataset(tmp_path / "p", resolution=r, as_numpy=True)
        assert [decode_index(ds[i][0]) for i in range(len(ds))] == [i for i in range(18) if i != 9]


def test_schedules():
    ramp = Schedule.ramp([128, 160, 192, 224, 256], start=128, end=256, first_epoch=2, last_epoch=6)
    assert [ramp(e) for e in range(9)] == [128, 128, 128, 160, 192, 224, 256, 256, 256]
    table = Schedule.table([128, 192, 256], {0: 128, 3: 192, 5: 256})
    assert [table(e) for e in range(7)] == [128, 128, 128, 192, 192, 256, 256]


def test_keep_resolutions_lets_the_previous_one_go(multires):
    ds = InMemoryImageDataset(multires, resolution=16, cache="mmap")
    ds.use(24)
    assert list(ds._stores) == [24]
    ds2 = InMemoryImageDataset(multires, resolution=16, keep_resolutions=2)
    ds2.use(32)
    assert list(ds2._stores) == [16, 32]


@pytest.mark.parametrize("cache", ["mmap", "shm"])
def test_progressive_run_reaches_persistent_workers(multires, cache):
    from dataprep.serve.shm import describe_segments

    def list_segments():  # this pack's segments only: other runs on a shared machine have their own
        return {s["path"] for s in describe_segments() if str(multires) in s["pack"]}

    before = set(list_segments())
    ds = InMemoryImageDataset(multires, resolution=16, cache=cache)
    sampler = ResolutionBatchSampler(len(ds), 4, Schedule.table(ds.resolutions, {0: 16, 1: 24, 2: 32}), seed=1)
    loader = DataLoader(ds, batch_sampler=sampler, num_workers=2, persistent_workers=True)
    for epoch, size in enumerate((16, 24, 32)):
        sampler.set_epoch(epoch)
        seen = []
        for images, labels in loader:
            assert images.shape[1:] == (3, size, size)  # the workers switched, though they persist
            seen += [decode_index(im.permute(1, 2, 0).numpy()) for im in images]
            assert labels.tolist() == [i // 6 for i in seen[-len(labels):]]
        assert sorted(seen) == list(range(18))
    del loader, ds
    import gc
    import time

    gc.collect()
    deadline = time.time() + 5
    while set(list_segments()) != before and time.time() < deadline:
        time.sleep(0.05)
    assert set(list_segments()) == before  # segments the workers attached went with them


@pytest.mark.parametrize("shuffle", [True, False])
def test_resolution_batches_under_a_distributed_sampler_partition_each_epoch(multires, shuffle):
    """Two ranks, each a ResolutionBatchSampler over its own DistributedSampler: in every epoch their
    batches hold each of the 18 indices exactly once between them, every pair carries that epoch's size from
    the schedule, and what a DataLoader serves for a rank's batches is those samples at that size.
    set_epoch reaches the DistributedSampler: another order each epoch when shuffling, else rank r's
    indices r, r + 2, ... (DistributedSampler's documented split)."""
    from torch.utils.data.distributed import DistributedSampler

    ds = InMemoryImageDataset(multires, resolution=16)
    schedule = Schedule.table(ds.resolutions, {0: 16, 1: 24, 3: 32})
    sizes = [16, 24, 24, 32]  # the table above, epoch by epoch
    samplers = [ResolutionBatchSampler(DistributedSampler(range(18), num_replicas=2, rank=r, shuffle=shuffle, seed=3), 4, schedule)
                for r in range(2)]
    orders = []
    for epoch, size in enumerate(sizes):
        ranks = []
        for rank, sampler in enumerate(samplers):
            sampler.set_epoch(epoch)
            batches = list(sampler)
            assert len(batches) == len(sampler) == 3 and [len(b) for b in batches] == [4, 4, 1]  # 9 of 18 each
            assert {r for b in batches for r, _ in b} == {size}
            ranks.append([i for b in batches for _, i in b])
            if not shuffle:
                assert ranks[-1] == list(range(rank, 18, 2))
            if epoch in (0, 3):  # served: those samples, at this epoch's size
                served = list(DataLoader(ds, batch_sampler=sampler))
                assert len(served) == len(batches)
                for b, (images, labels) in zip(batches, served):
                    assert images.shape == (len(b), 3, size, size)
                    assert [decode_index(im.permute(1, 2, 0).numpy()) for im in images] == [i for _, i in b]
                    assert labels.tolist() == [i // 6 for _, i in b]
        assert sorted(ranks[0] + ranks[1]) == list(range(18))  # a partition: together every index, once
        orders.append(ranks)
    assert len(orders) == len(sizes)
    assert (len({str(o) for o in orders}) == len(sizes)) if shuffle else all(o == orders[0] for o in orders)


def test_cli_sizes_and_verify(index_tree, tmp_path):
    r = CliRunner().invoke(main, ["build", "imagenet", str(index_tree), "--sizes", "24,12", "--out", str(tmp_path / "p"), "-j", "1"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["verify", str(tmp_path / "p"), "--decode"])
    assert r.exit_code == 0 and "48 images decoded" in r.output  # 24 samples x 2 resolutions
    r = CliRunner().invoke(main, ["build", "imagenet", str(index_tree), "--sizes", "24,x", "--out", str(tmp_path / "q")])
    assert r.exit_code == 2


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


@pytest.mark.corpus
@pytest.mark.slow
def test_real_photos_look_the_same_at_every_size(tmp_path):
    # Realism only: bilinear and resizing from the source pass these PSNR bounds too. That each size is
    # made from the next larger with the area filter is pinned exactly, with negative controls, by
    # test_each_size_is_the_area_resize_of_the_next_larger.
    src = corpus_dir("images")
    build_images(scan_imagenet(src), tmp_path / "p", BuildSettings(workers=2), ImageSettings(sizes=(128, 512)))
    big = InMemoryImageDataset(tmp_path / "p", resolution=512, as_numpy=True)
    small = InMemoryImageDataset(tmp_path / "p", resolution=128, as_numpy=True)
    values = []
    for i in range(len(big)):
        s = small.image(i)
        down = cv2.resize(big.image(i), (s.shape[1], s.shape[0]), interpolation=cv2.INTER_AREA)
        values.append(psnr(down.reshape(s.shape), s))
    finite = [v for v in values if np.isfinite(v)]
    assert np.mean(finite) >= 30, f"mean PSNR {np.mean(finite):.1f} dB"
    assert np.min(values) >= 25, f"worst PSNR {np.min(values):.1f} dB"


def _levels_from_source(path, settings, data=None, fingerprint=False):
    """Wrong implementation (negative control): every size resized from the decoded source on its own."""
    from dataclasses import replace

    return [_real_levels(path, replace(settings, sizes=(), size=s), data, fingerprint)[0] for s in settings.all_sizes]


def _bilinear_scale(pixels, geom):
    """Wrong implementation (negative control): bilinear instead of the area filter."""
    h, w = geom.scaled
    if pixels.shape[:2] == (h, w):
        return pixels
    return cv2.resize(pixels, (w, h), interpolation=cv2.INTER_LINEAR).reshape(h, w, pixels.shape[2])


@pytest.mark.parametrize("impl", ["chain", "from_source", "bilinear"])
def test_each_size_is_the_area_resize_of_the_next_larger(tmp_path, monkeypatch, impl):
    # Shrink factors are not 2 (at exactly 2 bilinear is the same 2x2 mean as area); the source is noise, so
    # rounding after one big shrink differs from rounding after each step. The check is exact equality.
    if impl == "from_source":
        monkeypatch.setattr("dataprep.images.process.process_levels", _levels_from_source)
    elif impl == "bilinear":
        monkeypatch.setattr("dataprep.images.resize.scale", _bilinear_scale)
    rng = np.random.default_rng(5)
    (tmp_path / "src" / "a").mkdir(parents=True)
    for k, (h, w) in enumerate([(190, 250), (233, 177), (160, 161)]):
        cv2.imwrite(str(tmp_path / "src" / "a" / f"{k}.png"), rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
    sizes = (96, 40, 17)
    build_images(scan_folder(tmp_path / "src"), tmp_path / "p", BuildSettings(workers=1), ImageSettings(sizes=sizes, mode="raw"))
    levels = {s: InMemoryImageDataset(tmp_path / "p", resolution=s, as_numpy=True) for s in sizes}
    compared = mismatched = 0
    for larger, smaller in zip(sizes, sizes[1:]):
        assert len(levels[larger]) == len(levels[smaller]) == 3
        for i in range(3):
            big, small = levels[larger].image(i), levels[smaller].image(i)
            assert min(small.shape[:2]) == smaller  # shorter side at each size
            want = cv2.resize(big, (small.shape[1], small.shape[0]), interpolation=cv2.INTER_AREA).reshape(small.shape)
            compared += 1
            mismatched += not np.array_equal(small, want)
    assert compared == 6
    if impl == "chain":
        assert mismatched == 0
    else:  # the wrong implementations must be caught on every pair
        assert mismatched == compared


def test_a_crop_plan_transform_follows_the_sampler_on_a_pack_of_many_shapes(index_tree, tmp_path):
    """A default (shorter-side) multi-size pack holds images of several shapes at each size, which the stock
    DataLoader's collate cannot stack ("Trying to resize storage that is not resizable"). With a CenterCrop as
    the dataset's transform, each batch a ResolutionBatchSampler asks for at R is R x R, its images the plan at R
    of the stored ones, in persistent workers too; read alone (no sampler), a sample keeps the plan as given."""
    from dataprep import CenterCrop

    pack = tmp_path / "p"
    build_images(scan_imagenet(index_tree), pack, BuildSettings(shard_size=5), ImageSettings(sizes=(16, 24, 32), mode="raw"))
    shapes = {tuple(s) for s in InMemoryImageDataset(pack, resolution=24).shapes.tolist()}
    assert len(shapes) == 3  # the default resize keeps each image's aspect ratio
    plan = CenterCrop(32, resize=32)
    ds = InMemoryImageDataset(pack, cache="mmap", transform=plan)
    assert ds[0][0].shape == (3, 32, 32)
    sampler = ResolutionBatchSampler(len(ds), 4, Schedule.table(ds.resolutions, {0: 16, 1: 24, 2: 32}), seed=1)
    loader = DataLoader(ds, batch_sampler=sampler, num_workers=2, persistent_workers=True)
    for epoch, size in enumerate((16, 24, 32)):
        sampler.set_epoch(epoch)
        at = InMemoryImageDataset(pack, resolution=size, as_numpy=True)
        served = 0
        for (images, _), batch in zip(loader, iter(sampler), strict=True):
            assert images.shape[1:] == (3, size, size)
            for image, (_, i) in zip(images, batch, strict=True):
                pixels = image.permute(1, 2, 0).numpy()
                assert np.array_equal(pixels, CenterCrop(size, resize=size)(at[i][0])) and decode_index(pixels) == i
            served += len(images)
        assert served == len(ds)
    assert ds.transform is plan and InMemoryImageDataset(pack, transform=plan)[0][0].shape == (3, 32, 32)


def test_a_script_with_persistent_workers_leaves_no_segment_at_exit(multires, tmp_path):
    """Persistent DataLoader workers that switched resolution hold the parent's segment when the script
    ends: multiprocessing terminates them at exit, after the parent's own release would have found them
    still using it. The parent must release after they are gone."""
    import os
    import subprocess
    import sys
    import textwrap

    shm_dir = tmp_path / "shm"
    shm_dir.mkdir(mode=0o700)
    script = textwrap.dedent(f"""
        from torch.utils.data import DataLoader
        from dataprep.images.dataset import InMemoryImageDataset
        from dataprep.serve.progressive import ResolutionBatchSampler, Schedule
        ds = InMemoryImageDataset({str(multires)!r}, cache="shm")  # the largest size, 32, in this process
        sampler = ResolutionBatchSampler(len(ds), 4, Schedule.table(ds.resolutions, {{0: 16, 1: 24, 2: 32}}))
        loader = DataLoader(ds, batch_sampler=sampler, num_workers=2, persistent_workers=True)
        for epoch in range(3):
            sampler.set_epoch(epoch)
            for batch in loader:
                pass
    """)
    env = {**os.environ, "DATAPREP_SHM_DIR": str(shm_dir)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [p.name for p in shm_dir.rglob("*") if p.is_file()] == []
