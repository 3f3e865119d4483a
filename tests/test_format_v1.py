"""Packs of format version 1, made by dataprep before the kind-homes layout (tests/fixtures/v1/make.py) and
committed, still load, verify and serve every sample exactly as they did when they were made."""
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from dataprep import DocumentDataset, InMemoryImageDataset, SegmentationDataset, TabularDataset, VolumeDataset, read_manifest

V1 = Path(__file__).parent / "fixtures" / "v1" / "packs"
EXPECTED = json.loads((V1 / "expected.json").read_text())


def digest(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.asarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def served(key: str) -> list[str]:
    name, split, *rest = key.split("/")
    pack = V1 / name
    if name.startswith("images"):
        res = None if rest[0] == "None" else int(rest[0])
        ds = InMemoryImageDataset(pack, split, resolution=res, as_numpy=True)
        return [digest(*ds[i], ds.sources[i].encode()) for i in range(len(ds))]
    if name == "segmentation":
        ds = SegmentationDataset(pack, split, as_numpy=True)
        return [digest(*ds[i]) for i in range(len(ds))]
    if name == "volumes":
        ds = VolumeDataset(pack, split, as_numpy=True)
        return [digest(*ds[i]) for i in range(len(ds))]
    if name == "tokens":
        ds = DocumentDataset(pack, split)
        return [digest(ds[i].numpy()) for i in range(len(ds))]
    ds = TabularDataset(pack, split)
    return [digest(*[t.numpy() for t in ds[i]]) for i in range(len(ds))]


@pytest.mark.parametrize("key", sorted(EXPECTED))
def test_v1_pack_serves_what_it_served(key):
    assert read_manifest(V1 / key.split("/")[0])["format_version"] == 1
    got = served(key)
    assert len(got) == len(EXPECTED[key]) > 0
    assert got == EXPECTED[key]


def test_the_check_sees_a_changed_sample(tmp_path):
    """Negative control: one changed byte of a stored image changes its digest."""
    import shutil

    from dataprep.pack.backends import read_manifest as rm

    pack = tmp_path / "p"
    shutil.copytree(V1 / "images-raw-multires", pack)
    m = rm(pack)
    shard = m["splits"]["train"]["shards"][0]["name"]
    path = pack / "train" / shard / "images_r8.npy"
    arr = np.load(path)
    arr[0, 3, 4, 1] ^= 1
    np.save(path, arr)  # same header, one bit of one pixel flipped (no checksum check without verify)
    ds = InMemoryImageDataset(pack, "train", resolution=8, as_numpy=True)
    got = [digest(*ds[i], ds.sources[i].encode()) for i in range(len(ds))]
    want = EXPECTED["images-raw-multires/train/8"]
    assert got[0] != want[0] and got[1:] == want[1:]


@pytest.mark.parametrize("name", ["images-encoded", "images-raw-multires", "images-raw-multires.h5", "segmentation",
                                  "volumes", "tokens", "table"])
def test_v1_pack_verifies(name):
    from dataprep.verify import verify_pack

    rep = verify_pack(V1 / name, decode=True)
    assert rep.ok, rep.problems
    assert rep.samples == sum(s["count"] for s in read_manifest(V1 / name)["splits"].values())
