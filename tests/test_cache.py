"""Cache modes: ram, mmap and shm serve identical samples; shm is one segment per machine, cleaned up by
its last user, and a segment a crash left behind is reused or replaced, never a FileExistsError."""
import gc
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from dataprep.errors import DataprepError, PackError
from dataprep.images.build import build_images
from dataprep.images.dataset import InMemoryImageDataset
from dataprep.images.settings import ImageSettings
from dataprep.pack.arrays import Segments
from dataprep.pack.backends import read_manifest
from dataprep.serve import cache as cache_mod
from dataprep.serve import shm as shm_mod
from dataprep.settings import BuildSettings
from dataprep.sources import scan_imagenet
from dataprep.synthetic import decode_index

from .conftest import own_segments

MODES = ["ram", "mmap", "shm"]


@pytest.fixture(scope="module")
def packs(index_tree, tmp_path_factory):
    base = tmp_path_factory.mktemp("cache")
    out = {}
    for name, image in {
        "raw": dict(mode="raw", resize="center-crop"),
        "jpeg": dict(resize="center-crop", keep_jpeg=False),
        "varsize": dict(mode="raw", size=256),
    }.items():
        build_images(scan_imagenet(index_tree), base / name, BuildSettings(shard_size=5), ImageSettings(**{"size": 32, **image}))
        out[name] = base / name
    return out


@pytest.fixture(autouse=True)
def no_leftover_segments(tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    before = own_segments(base)
    yield
    gc.collect()
    assert own_segments(base) == before, "a test left a shared-memory segment behind"


@pytest.mark.parametrize("kind", ["raw", "jpeg", "varsize"])
@pytest.mark.parametrize("mode", MODES)
def test_every_mode_serves_the_same_samples(packs, kind, mode):
    ref = InMemoryImageDataset(packs[kind], cache="ram", as_numpy=True)
    ds = InMemoryImageDataset(packs[kind], cache=mode, as_numpy=True)
    assert len(ds) == len(ref) == 18
    for i in range(len(ds)):
        a, la = ds[i]
        b, lb = ref[i]
        assert np.array_equal(a, b) and la == lb and ds.sources[i] == ref.sources[i]
    if kind != "varsize":
        idx = [17, 0, 9, 4, 5]
        xa, ya = ds[idx]
        xb, yb = ref[idx]
        assert np.array_equal(xa, xb) and torch.equal(ya, yb)


def test_mmap_maps_the_shard_files(packs):
    ds = InMemoryImageDataset(packs["raw"], cache="mmap")
    assert isinstance(ds._pixels, Segments) and len(ds._pixels.parts) == 4
    assert all(isinstance(p, np.memmap) and not p.flags.writeable for p in ds._pixels.parts)


@pytest.mark.parametrize("mode", ["mmap", "shm"])
@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_dataloader_workers_over_shared_caches(packs, mode, ctx):
    ds = InMemoryImageDataset(packs["jpeg"], cache=mode)
    seen = []
    loader = DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, multiprocessing_context=ctx)
    for images, _ in loader:
        seen += [decode_index(im.permute(1, 2, 0).numpy()) for im in images]
    assert sorted(seen) == list(range(18))


def test_shm_is_one_segment_per_pack_and_the_last_user_removes_it(packs):
    a = InMemoryImageDataset(packs["raw"], cache="shm")
    b = InMemoryImageDataset(packs["raw"], cache="shm")
    assert a.segment == b.segment and os.path.exists(a.segment)
    assert a._cached.segment.created and not b._cached.segment.created
    path = a.segment
    del a
    gc.collect()
    assert os.path.exists(path)  # b still uses it
    del b
    gc.collect()
    assert not os.path.exists(path)


CRASH = """
import os, sys
from dataprep.images.dataset import InMemoryImageDataset
ds = InMemoryImageDataset(sys.argv[1], cache="shm")
print(ds.segment, flush=True)
os.kill(os.getpid(), 9)
"""


def test_a_segment_left_by_a_crash_is_reused(packs):
    p = subprocess.run([sys.executable, "-c", CRASH, str(packs["jpeg"])], capture_output=True, text=True)
    assert p.returncode == -signal.SIGKILL
    path = p.stdout.strip()
    assert os.path.exists(path)  # the crash left it
    ds = InMemoryImageDataset(packs["jpeg"], cache="shm")
    assert ds.segment == path and not ds._cached.segment.created  # reused, no FileExistsError
    ref = InMemoryImageDataset(packs["jpeg"])
    assert all(np.array_equal(ds.image(i), ref.image(i)) for i in range(len(ds)))
    del ds
    gc.collect()
    assert not os.path.exists(path)


def test_a_half_filled_or_damaged_segment_is_replaced(packs):
    name = shm_mod.segment_name(read_manifest(packs["raw"]), "train/image")
    half = shm_mod.segment_dir() / f"{name}.tmp-99999"
    half.write_bytes(b"\0" * 100)  # a filler that died mid-copy
    wrong = shm_mod.segment_dir() / name
    wrong.write_bytes(b"not a segment")  # a segment of the wrong size
    ds = InMemoryImageDataset(packs["raw"], cache="shm", as_numpy=True)
    assert ds._cached.segment.created and not half.exists()
    assert decode_index(ds[11][0]) == 11
    del ds
    gc.collect()


def test_shm_after_the_pack_changes_is_a_new_segment(packs, tmp_path):
    import shutil

    p = tmp_path / "p"
    shutil.copytree(packs["raw"], p)
    a = InMemoryImageDataset(p, cache="shm")
    import json

    m = json.loads((p / "manifest.json").read_text())
    m["created"] = "2001-01-01T00:00:00+00:00"  # as a rebuild would change it (and the checksums, if any byte moved)
    (p / "manifest.json").write_text(json.dumps(m))
    b = InMemoryImageDataset(p, cache="shm")
    assert a.segment != b.segment
    del a, b
    gc.collect()


def test_bad_cache_and_too_little_ram(packs, monkeypatch):
    with pytest.raises(DataprepError, match="unknown cache mode 'disk'"):
        InMemoryImageDataset(packs["raw"], cache="disk")
    monkeypatch.setattr(cache_mod, "available_ram", lambda: 1000)
    with pytest.raises(DataprepError, match=r"cache='ram' needs .* use cache='mmap'"):
        InMemoryImageDataset(packs["raw"], cache="ram")
    InMemoryImageDataset(packs["raw"], cache="mmap")  # mapping needs no free RAM up front


def test_damaged_pack_is_a_packerror_in_every_mode(packs, tmp_path):
    import shutil

    p = tmp_path / "p"
    shutil.copytree(packs["jpeg"], p)
    f = p / "train" / "00002" / "images.npy"
    f.write_bytes(f.read_bytes()[:-3])
    for mode in MODES:
        with pytest.raises(PackError, match="00002/images.npy"):
            InMemoryImageDataset(p, cache=mode)


def test_progress_is_reported_when_asked(packs, capsys):
    InMemoryImageDataset(packs["raw"], cache="ram", progress=True)
    err = capsys.readouterr().err
    # asked for by name: at least the final line, even off a terminal and for a load too quick for others
    assert re.search(r"^loading .*\(ram\): ([\d.]+)/\1 (kB|MB|B) in ", err, re.M), err


RACE = """
import os, sys, time
from pathlib import Path
from dataprep.images.dataset import InMemoryImageDataset
pack, room, n = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])

def barrier(name):  # every racer waits here until all n have arrived, however slow their start was
    (room / f"{name}-{os.getpid()}").touch()
    deadline = time.time() + 120
    while len(list(room.glob(name + "-*"))) < n and time.time() < deadline:
        time.sleep(0.002)

barrier("ready")  # past the imports: the attaches below race for real
ds = InMemoryImageDataset(pack, cache="shm")
print(ds.segment, ds._cached.segment.created, flush=True)
barrier("attached")  # nobody detaches (and so removes the segment) before all have attached
"""


def test_racing_processes_fill_once_and_never_deadlock(packs, tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", RACE, str(packs["varsize"]), str(tmp_path), "4"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    outs = [p.communicate(timeout=180) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e for _, e in outs]
    lines = [o.split() for o, _ in outs]
    assert len({seg for seg, _ in lines}) == 1
    assert sorted(created for _, created in lines) == ["False", "False", "False", "True"]


def test_describing_segments_skips_one_removed_since_the_listing(packs, monkeypatch):
    """Another run's last user may remove its segment between the listing and the look at it: the
    description (dataprep cache list, clean, the tests' own_segments) leaves it out instead of failing
    (a concurrent suite run hit FileNotFoundError here)."""
    ds = InMemoryImageDataset(packs["raw"], cache="shm")
    mine = ds.segment
    real = shm_mod.list_segments
    gone = shm_mod._segment_path() / "dataprep-0123456789abcdef01234567"  # listed, then removed by its owner
    monkeypatch.setattr(shm_mod, "list_segments", lambda: real() + [gone])
    described = [s["path"] for s in shm_mod.describe_segments()]
    assert mine in described and str(gone) not in described
    del ds
    gc.collect()
