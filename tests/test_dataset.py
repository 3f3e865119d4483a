"""InMemoryImageDataset: samples, batches, DataLoader workers (fork and spawn), and damaged packs."""
import json
import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from dataprep.errors import DataprepError, FormatVersionError, PackError
from dataprep.images.build import build_images
from dataprep.images.dataset import InMemoryImageDataset
from dataprep.images.settings import ImageSettings
from dataprep.settings import BuildSettings
from dataprep.sources import scan_imagenet
from dataprep.synthetic import decode_index


def _build(tree, out, **image):
    build_images(scan_imagenet(tree), out, BuildSettings(shard_size=5), ImageSettings(**{"size": 32, **image}))
    return out


@pytest.fixture(scope="module")
def packs(index_tree, tmp_path_factory):
    base = tmp_path_factory.mktemp("packs")
    return {
        "raw": _build(index_tree, base / "raw", mode="raw", resize="center-crop"),
        "jpeg": _build(index_tree, base / "jpeg", resize="center-crop", keep_jpeg=False),
        "varsize": _build(index_tree, base / "varsize", mode="raw", size=256),
    }


@pytest.mark.parametrize("kind", ["raw", "jpeg"])
@pytest.mark.parametrize("decode", ["cv2", "pil"])
def test_sample_is_a_chw_uint8_tensor_of_the_right_picture(packs, kind, decode):
    ds = InMemoryImageDataset(packs[kind], decode=decode)
    img, label = ds[7]
    assert isinstance(img, torch.Tensor) and img.dtype == torch.uint8 and img.shape == (3, 32, 32)
    assert decode_index(img.permute(1, 2, 0).numpy()) == 7 and label == 1
    hwc, _ = InMemoryImageDataset(packs[kind], decode=decode, as_numpy=True)[7]
    assert isinstance(hwc, np.ndarray) and hwc.shape == (32, 32, 3)


def test_decode_none_gives_the_stored_jpeg_bytes(packs):
    ds = InMemoryImageDataset(packs["jpeg"], decode="none")
    buf, _ = ds[0]
    assert buf.dtype == np.uint8 and buf.ndim == 1 and bytes(buf[:3]) == b"\xff\xd8\xff"


def test_batch_and_getitems(packs):
    ds = InMemoryImageDataset(packs["raw"])
    images, labels = ds[[3, 0, 17]]
    assert images.shape == (3, 3, 32, 32) and images.is_contiguous(memory_format=torch.channels_last)
    assert [decode_index(im.permute(1, 2, 0).numpy()) for im in images] == [3, 0, 17]
    assert labels.tolist() == [0, 0, 2] and labels.dtype == torch.int64
    items = ds.__getitems__([4, 5])
    assert [decode_index(x.permute(1, 2, 0).numpy()) for x, _ in items] == [4, 5]
    with pytest.raises(IndexError):
        ds[18]
    assert decode_index(ds[-1][0].permute(1, 2, 0).numpy()) == 17


def test_variable_shapes_serve_per_sample_but_refuse_a_batch(packs):
    ds = InMemoryImageDataset(packs["varsize"])
    shapes = {tuple(ds[i][0].shape) for i in range(len(ds))}
    assert shapes == {(3, 40, 60), (3, 64, 48), (3, 50, 50)}
    assert set(map(tuple, ds.shapes.tolist())) == {(40, 60, 3), (64, 48, 3), (50, 50, 3)}
    with pytest.raises(DataprepError, match="shapes"):
        ds[[0, 1]]


def test_cache_is_read_only_and_samples_are_private(packs):
    ds = InMemoryImageDataset(packs["raw"], as_numpy=True)
    img, _ = ds[2]
    img[:] = 0  # a transform that works in place must not damage the cache
    assert decode_index(ds[2][0]) == 2
    assert not ds.labels.flags.writeable


def test_pickles_as_a_recipe_not_the_cache(packs):
    ds = InMemoryImageDataset(packs["raw"])
    blob = pickle.dumps(ds)
    assert len(blob) < 1000 < ds.nbytes
    again = pickle.loads(blob)
    assert torch.equal(again[9][0], ds[9][0])


@pytest.mark.parametrize("ctx", ["fork", "spawn"])
@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_sees_every_sample_once(packs, ctx, workers):
    if workers == 0 and ctx == "spawn":
        pytest.skip("no workers: the start method does not apply")
    ds = InMemoryImageDataset(packs["jpeg"])
    kw = dict(num_workers=workers, multiprocessing_context=ctx if workers else None)
    seen = []
    for images, _labels in DataLoader(ds, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(0), **kw):
        assert images.shape[1:] == (3, 32, 32) and images.dtype == torch.uint8
        seen += [decode_index(im.permute(1, 2, 0).numpy()) for im in images]
    assert sorted(seen) == list(range(18))
    # whole batches through __getitem__(list): no collate work
    seen = []
    sampler = BatchSampler(SequentialSampler(ds), 5, drop_last=False)
    for images, _labels in DataLoader(ds, batch_size=None, sampler=sampler, **kw):
        seen += [decode_index(im.permute(1, 2, 0).numpy()) for im in images]
    assert seen == list(range(18))


# -- damaged packs: a clear PackError naming the file, never a crash deep in a worker --------------
def _copy(src, tmp_path):
    import shutil

    dst = tmp_path / "copy"
    shutil.copytree(src, dst)
    return dst


def test_truncated_shard_file(packs, tmp_path):
    p = _copy(packs["jpeg"], tmp_path)
    f = p / "train" / "00001" / "images.npy"
    f.write_bytes(f.read_bytes()[:-10])
    with pytest.raises(PackError, match="00001/images.npy"):
        InMemoryImageDataset(p)


def test_missing_shard_and_missing_manifest(packs, tmp_path):
    p = _copy(packs["raw"], tmp_path)
    (p / "train" / "00002" / "labels.npy").unlink()
    with pytest.raises(PackError, match="00002/labels.npy"):
        InMemoryImageDataset(p)
    (p / "manifest.json").unlink()
    with pytest.raises(PackError, match="manifest.json: missing"):
        InMemoryImageDataset(p)


def test_corrupt_offsets(packs, tmp_path):
    p = _copy(packs["jpeg"], tmp_path)
    f = p / "train" / "00000" / "offsets.npy"
    off = np.load(f)
    off[2], off[3] = off[3], off[2]  # same size on disk, no longer monotonic
    np.save(f, off)
    with pytest.raises(PackError, match="offsets"):
        InMemoryImageDataset(p)


def test_flipped_byte_is_caught_by_verify(packs, tmp_path):
    p = _copy(packs["raw"], tmp_path)
    f = p / "train" / "00003" / "images.npy"
    data = bytearray(f.read_bytes())
    data[-5] ^= 0xFF
    f.write_bytes(bytes(data))
    InMemoryImageDataset(p)  # the cheap checks cannot see a flipped pixel...
    with pytest.raises(PackError, match="00003/images.npy: checksum"):
        InMemoryImageDataset(p, verify=True)  # ...the checksums can


def test_label_out_of_range(packs, tmp_path):
    p = _copy(packs["raw"], tmp_path)
    m = json.loads((p / "manifest.json").read_text())
    m["fields"]["label"]["num_classes"] = 2
    m["classes"] = m["classes"][:2]  # a consistent manifest whose stored labels go past its classes
    (p / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(PackError, match="label is 2"):
        InMemoryImageDataset(p)


@pytest.mark.parametrize("classes", [None, [], "n0", ["n0", "n1"], ["n0", "n1", 2]])
def test_classes_that_do_not_name_every_label_are_refused(packs, tmp_path, classes):
    """A label field counting 3 classes beside a `classes` list that is missing, short or not names: served,
    the labels would be dropped (an empty list reads as an unlabelled pack) or misnamed, with no error."""
    p = _copy(packs["raw"], tmp_path)
    m = json.loads((p / "manifest.json").read_text())
    assert m["fields"]["label"]["num_classes"] == len(m["classes"]) == 3
    m["classes"] = classes
    (p / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(PackError, match="'classes' must list the 3 class names"):
        InMemoryImageDataset(p)


def test_other_format_version_and_split(packs, tmp_path):
    p = _copy(packs["raw"], tmp_path)
    with pytest.raises(PackError, match=r"no split 'test'.*\['train', 'val'\]"):
        InMemoryImageDataset(p, "test")
    m = json.loads((p / "manifest.json").read_text())
    m["format_version"] = 99
    (p / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(FormatVersionError, match="format version 99"):
        InMemoryImageDataset(p)
    (p / "manifest.json").write_text("{not json")
    with pytest.raises(PackError, match="unreadable manifest"):
        InMemoryImageDataset(p)


def test_unknown_decoder_is_refused(packs):
    with pytest.raises(DataprepError, match="unknown decode"):
        InMemoryImageDataset(packs["raw"], decode="turbo")
