"""Trust, second round: hostile names in inputs and packs, inputs that abort builds or exhaust memory, packs
that disagree with themselves. Each case here was reproduced on the code before its fix."""
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dataprep.errors import DataprepError, PackError
from dataprep.images.build import build_images
from dataprep.images.settings import ImageSettings
from dataprep.settings import BuildSettings
from dataprep.sources import scan_imagenet


@pytest.fixture
def pack(index_tree, tmp_path):
    out = tmp_path / "pack"
    build_images(scan_imagenet(index_tree), out, BuildSettings(workers=1, shard_size=5), ImageSettings(size=32))
    return out


# -- names that would lead outside the pack ----------------------------------------------------------
@pytest.mark.parametrize("cell", ["../../victim", "/abs/dir", "a/b", "..", ".hidden"])
def test_a_split_column_cell_cannot_name_a_path(tmp_path, cell):
    from dataprep.tables.build import build_table
    from dataprep.tables.columns import TableSettings

    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    cell = cell.replace("/abs/dir", str(tmp_path / "abs"))
    csv = tmp_path / "t.csv"
    pd.DataFrame({"x": [1.0, 2.0, 3.0], "y": [0, 1, 0], "s": ["train", cell, "train"]}).to_csv(csv, index=False)
    (tmp_path / "out").mkdir()
    with pytest.raises(DataprepError, match=r"column 's' \(the split column\): split name"):
        build_table([str(csv)], tmp_path / "out" / "p", TableSettings(target="y", split_column="s"), {})
    assert (victim / "keep.txt").read_text() == "mine" and sorted(p.name for p in victim.iterdir()) == ["keep.txt"]
    assert not (tmp_path / "abs").exists() and not (tmp_path / "out" / "p").exists()


def test_an_ordinary_split_column_still_works(tmp_path):
    from dataprep.tables.build import build_table
    from dataprep.tables.columns import TableSettings

    csv = tmp_path / "t.csv"
    pd.DataFrame({"x": [1.0, 2.0, 3.0, 4.0], "y": [0, 1, 0, 1], "s": ["train", "fold-2", "train", "val_1"]}).to_csv(csv, index=False)
    r = build_table([str(csv)], tmp_path / "p", TableSettings(target="y", split_column="s"), {})
    assert r["splits"] == {"fold-2": 1, "train": 2, "val_1": 1}


def _edit_manifest(pack, change):
    m = json.loads((pack / "manifest.json").read_text())
    change(m)
    (pack / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize("where", ["split", "split-abs", "shard", "file", "field"])
def test_a_manifest_cannot_point_outside_its_pack(pack, tmp_path, where):
    from dataprep import InMemoryImageDataset
    from dataprep.verify import verify_pack

    outside = tmp_path / "elsewhere"
    shutil.copytree(pack / "train", outside)  # a well-formed split that is not the pack's

    def change(m):
        if where == "split":
            m["splits"]["../elsewhere"] = m["splits"].pop("train")
        elif where == "split-abs":
            m["splits"][str(outside)] = m["splits"].pop("train")
        elif where == "shard":
            m["splits"]["train"]["shards"][0]["name"] = "../../elsewhere/00000"
        elif where == "file":
            s = m["splits"]["train"]["shards"][0]
            s["files"]["../../../elsewhere/00000/labels.npy"] = s["files"].pop("labels.npy")
        else:
            m["fields"]["../label"] = m["fields"].pop("label")

    _edit_manifest(pack, change)
    with pytest.raises(PackError, match="name .* is not allowed"):
        InMemoryImageDataset(pack, split="../elsewhere" if where == "split" else str(outside) if where == "split-abs" else "train")
    rep = verify_pack(pack)
    assert not rep.ok and "not allowed" in rep.problems[0][1]


def test_a_symlinked_split_directory_is_not_followed_out_of_the_pack(pack, tmp_path):
    from dataprep import InMemoryImageDataset

    shutil.move(pack / "val", tmp_path / "val-elsewhere")
    os.symlink(tmp_path / "val-elsewhere", pack / "val")
    with pytest.raises(PackError, match="outside"):
        InMemoryImageDataset(pack, split="val")


def test_convert_of_an_hdf5_pack_with_a_dotdot_group_touches_nothing_outside(pack, tmp_path):
    """HDF5 allows a group literally named '..'; its manifest then names a split '..'."""
    import h5py

    from dataprep.pack.convert import convert

    convert(pack, tmp_path / "p.h5", "hdf5")
    with h5py.File(tmp_path / "p.h5", "r+") as f:
        f.move("val", "..")
        m = json.loads(f.attrs["dataprep_manifest"])
        m["splits"][".."] = m["splits"].pop("val")
        f.attrs["dataprep_manifest"] = json.dumps(m)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "00000").mkdir()  # what a conversion into out/.. would replace
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(PackError, match="split name '..' is not allowed"):
        convert(tmp_path / "p.h5", tmp_path / "out" / "back", "npy")
    assert sorted(p.name for p in tmp_path.iterdir()) == before and (tmp_path / "out" / "00000").is_dir()


def test_a_bad_split_name_from_the_command_line_is_a_usage_level_error(index_tree, tmp_path):
    from click.testing import CliRunner

    from dataprep.cli import main

    r = CliRunner().invoke(main, ["build", "folder", str(index_tree / "train"), "--split", "../up", "--size", "16",
                                  "--out", str(tmp_path / "p"), "--no-progress"])
    assert r.exit_code == 1 and "split name '../up' is not allowed" in r.output
    assert not (tmp_path / "up").exists()


# -- one bad input never aborts a build, nor exhausts its memory -------------------------------------------
def _tree_with(tmp_path, bad: dict):
    """A one-class tree of two good photos plus the `bad` files (name -> a function that makes it at a path)."""
    from PIL import Image

    from dataprep.synthetic import photo_like

    cls = tmp_path / "src" / "train" / "n0"
    cls.mkdir(parents=True)
    for k in range(2):
        Image.fromarray(photo_like(k, 60, 80)).save(cls / f"good{k}.png")
    for name, make in bad.items():
        make(cls / name)
    return tmp_path / "src"


def _build(src, out, **image):
    s = build_images(scan_imagenet(src), out, BuildSettings(workers=1), ImageSettings(**{"size": 32, **image}))
    split = s.splits[0]
    return split.written, dict(split.skipped)


def test_an_image_jpeg_cannot_hold_is_skipped_not_the_build(tmp_path):
    from PIL import Image

    src = _tree_with(tmp_path, {"long.png": lambda p: Image.fromarray(np.zeros((1, 100_000, 3), np.uint8)).save(p)})
    written, skipped = _build(src, tmp_path / "p")  # encoded, shorter side 32: 1 x 100000 stays as it is
    assert written == 2 and skipped == {"too large for JPEG": 1}


def test_a_planned_output_gets_the_pixel_limit_of_sources(tmp_path):
    """With --upscale and center-crop, a 1 x 100000 image would be resized to 256 x 25.6 M (19.7 GB)."""
    from PIL import Image

    src = _tree_with(tmp_path, {"thin.png": lambda p: Image.fromarray(np.zeros((100_000, 1, 3), np.uint8)).save(p)})
    written, skipped = _build(src, tmp_path / "p", size=256, resize="center-crop", upscale=True, mode="raw")
    assert written == 2 and skipped == {"too many pixels": 1}


def test_files_that_are_not_regular_are_skipped_and_never_read_forever(tmp_path):
    def fifo(p):
        os.mkfifo(p)

    def zero(p):
        os.symlink("/dev/zero", p)

    src = _tree_with(tmp_path, {"pipe.png": fifo, "zeros.png": zero})
    written, skipped = _build(src, tmp_path / "p")
    assert written == 2 and skipped == {"not a regular file": 2}


def _broken_png(path, seed=3):
    """A PNG whose zlib stream is damaged two thirds of the way in (Pillow's own load() raises)."""
    import io

    from PIL import Image

    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray((rng.random((200, 300, 3)) * 255).astype(np.uint8)).save(buf, "PNG")
    data = bytearray(buf.getvalue())
    pos = data.find(b"IDAT") + 2 * len(data) // 3
    data[pos : pos + 200] = rng.integers(0, 256, 200, dtype=np.uint8).tobytes()
    path.write_bytes(bytes(data))


def test_a_png_with_a_broken_data_stream_is_skipped_not_stored_half_black(tmp_path):
    from PIL import Image

    from dataprep.images.decode import decode_source

    bad = tmp_path / "bad.png"
    _broken_png(bad)
    with pytest.raises(OSError):  # the control: Pillow itself refuses it ("broken data stream when reading image file")
        Image.open(bad).load()
    with pytest.raises(DataprepError, match="broken data stream|corrupt data|truncated"):
        decode_source(bad.read_bytes(), str(bad), ImageSettings(size=64))
    src = _tree_with(tmp_path, {"bad.png": lambda p: _broken_png(p)})
    written, skipped = _build(src, tmp_path / "p", mode="raw")
    assert written == 2 and sum(skipped.values()) == 1 and set(skipped) <= {"truncated", "corrupt data"}


def test_dataprep_leaves_pillows_globals_alone_and_still_refuses_truncated_files(tmp_path):
    import subprocess
    import sys

    code = ("from PIL import ImageFile\nImageFile.LOAD_TRUNCATED_IMAGES = True\n"
            "import dataprep.images.decode, dataprep.images.build\nprint(ImageFile.LOAD_TRUNCATED_IMAGES)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True", out.stderr
    import cv2
    from PIL import ImageFile

    from dataprep.images.decode import decode_source
    from dataprep.synthetic import photo_like

    ok, jpg = cv2.imencode(".jpg", photo_like(1, 120, 160))
    cut = jpg.tobytes()[: len(jpg) // 2]
    old = ImageFile.LOAD_TRUNCATED_IMAGES
    ImageFile.LOAD_TRUNCATED_IMAGES = True  # a user's choice for their own code
    try:
        with pytest.raises(DataprepError, match="truncated"):
            decode_source(cut, "cut.jpg", ImageSettings(size=64))
        assert ImageFile.LOAD_TRUNCATED_IMAGES is True
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = old


def test_volume_sources_that_are_not_regular_files_are_skipped(tmp_path):
    from dataprep.sources import scan_files
    from dataprep.volumes.build import VolumeSettings, build_volumes
    from dataprep.volumes.read import VOLUME_EXTENSIONS

    (tmp_path / "v").mkdir()
    np.save(tmp_path / "v" / "a.npy", np.arange(60, dtype=np.uint16).reshape(3, 4, 5))
    os.mkfifo(tmp_path / "v" / "b.npy")
    s = build_volumes(scan_files(tmp_path / "v", "train", VOLUME_EXTENSIONS), tmp_path / "p", BuildSettings(workers=1), VolumeSettings())
    assert s.splits[0].written == 1 and dict(s.splits[0].skipped) == {"not a regular file": 1}


# -- a pack that disagrees with itself --------------------------------------------------------------------
def test_a_jpeg_whose_header_disagrees_with_the_manifest_is_not_decoded(pack):
    """A tiny JPEG that declares 12000 x 12000 would decode to 432 MB; the recorded shape says 32 x h."""
    from dataprep import InMemoryImageDataset
    from dataprep.images.codec import jpeg_header

    ds = InMemoryImageDataset(pack, as_numpy=True)
    want0, want1 = ds[0][0], ds[1][0]
    m = json.loads((pack / "manifest.json").read_text())
    f = pack / "train" / m["splits"]["train"]["shards"][0]["name"] / "images.npy"
    blob = np.load(f)
    i = next(k for k in range(len(blob) - 9) if blob[k] == 0xFF and blob[k + 1] == 0xC0)
    blob[i + 5 : i + 9] = [12000 >> 8, 12000 & 255, 12000 >> 8, 12000 & 255]  # frame header: 12000 x 12000
    np.save(f, blob)  # same size: only verify=True would see it
    assert jpeg_header(blob[: len(blob)])[:2] == (12000, 12000)
    ds = InMemoryImageDataset(pack, as_numpy=True)
    with pytest.raises(PackError, match=r"sample 0 .* holds a 12000x12000 JPEG, but the pack records"):
        ds[0]
    assert np.array_equal(ds[1][0], want1) and want0.shape[:2] != (12000, 12000)  # the others still serve


def test_an_hdf5_dataset_shorter_than_the_manifest_is_an_error(pack, tmp_path):
    import h5py

    from dataprep import InMemoryImageDataset
    from dataprep.pack.convert import convert

    for comp in ("none", "gzip"):
        h5 = tmp_path / f"p-{comp}.h5"
        convert(pack, h5, "hdf5", comp)
        with h5py.File(h5, "r+") as f:
            labels = f["train/labels"][...]
            del f["train/labels"]
            f.create_dataset("train/labels", data=labels[:-3])
        with pytest.raises(PackError, match="labels is stored as .* the manifest needs"):
            InMemoryImageDataset(h5)
        assert len(InMemoryImageDataset(h5, split="val")) == 6  # the untouched split still loads


def test_a_manifest_cut_short_by_a_full_disk_leaves_nothing_that_blocks_resume(index_tree, tmp_path, monkeypatch):
    import errno

    from dataprep.pack import manifest as manifest_mod

    out = tmp_path / "p"

    class FullDisk:  # json as the manifest writer sees it: the disk fills up while the manifest is written
        @staticmethod
        def dump(obj, f, **kw):
            f.write("{")
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(manifest_mod, "json", FullDisk)
    with pytest.raises(PackError, match="manifest.json: cannot write the manifest .*disk is full.*--resume"):
        build_images(scan_imagenet(index_tree), out, BuildSettings(workers=1, shard_size=5), ImageSettings(size=16))
    monkeypatch.setattr(manifest_mod, "json", json)
    assert not list(out.glob(".manifest.json.tmp-*")) and not (out / "manifest.json").exists()
    # one a crash left behind (a kill while writing) is no reason to refuse either
    (out / ".manifest.json.tmp-99999").write_text("{")
    s = build_images(scan_imagenet(index_tree), out, BuildSettings(workers=1, shard_size=5, resume=True), ImageSettings(size=16))
    assert s.splits[0].reused == s.splits[0].shards == 4 and (out / "manifest.json").is_file()
    (out / ".manifest.json.tmp-99999").write_text("{")
    build_images(scan_imagenet(index_tree), out, BuildSettings(workers=1, shard_size=5, overwrite=True), ImageSettings(size=16))
    assert not list(out.glob(".manifest.json.tmp-*"))


TRUNCATE_WHILE_MAPPED = """
import os, sys
from pathlib import Path
from dataprep import InMemoryImageDataset
from dataprep.errors import PackError
pack = Path(sys.argv[1])
ds = InMemoryImageDataset(pack, cache="mmap", as_numpy=True)
first = ds[0][0].copy()
os.truncate(pack / "train" / "00001" / "images.npy", 200)  # samples 5-9 lived there
try:
    ds[6]
    print("read")
except PackError as e:
    print("PackError", e)
assert (ds[0][0] == first).all()  # the intact shards still serve
try:
    ds[[0, 7]]
    print("read")
except PackError as e:
    print("PackError", e)
"""


def test_a_shard_file_truncated_while_mapped_is_an_error_not_sigbus(index_tree, tmp_path):
    import subprocess
    import sys

    out = tmp_path / "raw"
    build_images(scan_imagenet(index_tree), out, BuildSettings(workers=1, shard_size=5), ImageSettings(size=16, resize="center-crop", mode="raw"))
    r = subprocess.run([sys.executable, "-c", TRUNCATE_WHILE_MAPPED, str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr[-500:])  # -7 is SIGBUS
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and all(ln.startswith("PackError") and "truncated to 200 bytes while mapped" in ln for ln in lines), r.stdout


@pytest.mark.parametrize("cache", ["ram", "mmap"])
def test_a_huge_declared_count_is_a_clear_error(pack, cache):
    from dataprep import InMemoryImageDataset

    def change(m):
        for s in m["splits"]["train"]["shards"]:
            s["count"] = 10**13  # labels alone would need 10 TB
        m["splits"]["train"]["count"] = 10**13 * len(m["splits"]["train"]["shards"])

    _edit_manifest(pack, change)
    with pytest.raises(DataprepError, match=r"\.npy: holds .* expected|does not fit|available") as e:
        InMemoryImageDataset(pack, cache=cache)
    assert not isinstance(e.value, MemoryError)


# -- processes that outlive their parent, segments that outlive their users -----------------------------
TRAINER = """
import os, sys, time
from dataprep import InMemoryImageDataset, Loader
ds = InMemoryImageDataset(sys.argv[1], cache=sys.argv[2])
loader = Loader(ds, 4, shuffle=True, num_workers=2, crop=(16, 16))
next(iter(loader))
print(" ".join(str(p.pid) for p in loader._procs), flush=True)
if sys.argv[3] == "hang":
    time.sleep(600)
# else: a normal exit, without loader.close()
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _gone_within(pids, seconds=10.0) -> bool:
    import time

    deadline = time.time() + seconds
    while time.time() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


def _reap(pids) -> None:
    import signal

    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_loader_workers_exit_when_the_trainer_is_killed(pack):
    import signal
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", TRAINER, str(pack), "ram", "hang"], stdout=subprocess.PIPE, text=True)
    workers = [int(x) for x in p.stdout.readline().split()]
    assert len(workers) == 2 and all(_alive(w) for w in workers)
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=10)
    p.stdout.close()
    try:
        assert _gone_within(workers), "loader workers outlived the trainer"
    finally:
        _reap(workers)


def test_a_shm_segment_is_released_on_a_normal_exit_without_close(pack, tmp_path):
    import subprocess
    import sys

    shm = tmp_path / "shm"
    shm.mkdir()
    env = {**os.environ, "DATAPREP_SHM_DIR": str(shm)}
    r = subprocess.run([sys.executable, "-c", TRAINER, str(pack), "shm", "exit"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-400:]
    workers = [int(x) for x in r.stdout.split()]
    assert _gone_within(workers)
    left = [p.name for p in shm.rglob("dataprep-*") if p.is_file() and not p.name.endswith((".fill", ".users"))]
    assert not left, "the segment outlived its last user"


def test_build_workers_exit_when_the_driver_is_killed(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from dataprep.synthetic import write_tree

    tree = write_tree(tmp_path / "src", classes=2, per_class=8, sizes=((64, 80),)) / "train"
    victim = sorted(tree.rglob("*.JPEG"))[9]
    fifo = tmp_path / "plug.fifo"
    os.mkfifo(fifo)
    from .test_faults import STALLED_CLI

    env = {**os.environ, "DATAPREP_TEST_VICTIM": str(victim), "DATAPREP_TEST_PLUG": str(fifo)}
    p = subprocess.Popen([sys.executable, "-c", STALLED_CLI, "build", "folder", str(tree), "--out", str(tmp_path / "out"),
                          "--size", "32", "--shard-size", "2", "-j", "2", "--no-progress"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    kids = []
    while time.time() < deadline and len(kids) < 2:
        try:
            with open(f"/proc/{p.pid}/task/{p.pid}/children") as f:
                kids = [int(x) for x in f.read().split()]
        except FileNotFoundError:
            pass
        time.sleep(0.1)
    assert len(kids) == 2
    time.sleep(1.0)  # one worker now waits on the plug, the other on the queue
    os.kill(p.pid, signal.SIGKILL)  # the driver alone, as an OOM killer would
    p.wait(timeout=10)
    try:
        assert _gone_within(kids), "build workers outlived their driver"
    finally:
        _reap(kids)


# -- the /dev/shm cache across local users --------------------------------------------------------------------
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to fork a child that drops to another user (uid 65534)")


def _as_other_user(fn) -> dict:
    """Run fn() in a forked child that has dropped to uid/gid 65534 (nobody); give what it returned."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            out = fn()
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            out = {"error": f"{type(e).__name__}: {e}"}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data)


def _try(fn) -> str:
    try:
        fn()
        return "ok"
    except OSError as e:
        return type(e).__name__


@pytest.fixture
def shm_base(monkeypatch):
    import tempfile

    from dataprep.serve import shm as shm_mod

    base = tempfile.mkdtemp(prefix="dataprep-shm-test-", dir="/tmp")
    os.chmod(base, 0o1777)  # as /dev/shm: everyone may create, nobody may remove what is not theirs
    monkeypatch.setattr(shm_mod, "SHM_DIR", Path(base))
    yield Path(base)
    shutil.rmtree(base, ignore_errors=True)


@needs_root
def test_another_user_can_neither_read_plant_truncate_nor_block(pack, shm_base):
    import gc

    from dataprep import InMemoryImageDataset
    from dataprep.serve import shm as shm_mod

    ds = InMemoryImageDataset(pack, cache="shm")
    seg = Path(ds.segment)
    mine = seg.parent
    assert mine.name == f"dataprep-{os.getuid()}" and (os.stat(mine).st_mode & 0o777) == 0o700
    assert (os.stat(seg).st_mode & 0o777) == 0o600
    locks = [mine / f"{seg.name}.fill", mine / f"{seg.name}.users"]
    assert all((os.stat(p).st_mode & 0o777) == 0o600 for p in locks)

    def attack():
        import fcntl

        return {"list": _try(lambda: os.listdir(mine)),
                "read": _try(lambda: open(seg, "rb").read(10)),
                "truncate": _try(lambda: os.truncate(seg, 10)),
                "plant": _try(lambda: open(mine / "dataprep-planted", "wb").write(b"x")),
                "block": _try(lambda: fcntl.flock(os.open(locks[0], os.O_RDWR), fcntl.LOCK_EX))}

    got = _as_other_user(attack)
    assert got == {k: "PermissionError" for k in ("list", "read", "truncate", "plant", "block")}, got
    labels = ds.labels.copy()
    del ds
    gc.collect()
    assert not seg.exists()
    # a second attach after the attempts: the victim's data, intact
    assert np.array_equal(InMemoryImageDataset(pack, cache="shm").labels, labels)
    assert shm_mod.segment_dir() == mine


@needs_root
@pytest.mark.parametrize("planted", ["directory", "symlink"])
def test_a_directory_planted_under_the_victims_name_is_refused(pack, shm_base, planted):
    from dataprep import InMemoryImageDataset

    target = shm_base / f"dataprep-{os.getuid()}"

    def plant():
        if planted == "directory":
            os.mkdir(target, 0o777)
            os.chmod(target, 0o777)
        else:
            os.mkdir(shm_base / "attacker", 0o777)
            os.symlink(shm_base / "attacker", target)
        return {"ok": True}

    assert _as_other_user(plant) == {"ok": True}
    with pytest.raises(DataprepError, match="refusing"):
        InMemoryImageDataset(pack, cache="shm")


def test_a_segment_of_other_content_under_the_right_name_is_not_trusted(pack, tmp_path, shm_base, index_tree):
    """Same user: a segment whose header names another manifest is replaced; one whose bytes were changed
    after filling is caught by verify=True on attach (it used to be checked only when filling)."""
    import gc

    from dataprep import InMemoryImageDataset

    other = tmp_path / "other"
    build_images(scan_imagenet(index_tree), other, BuildSettings(workers=1, shard_size=5), ImageSettings(size=24))
    ds = InMemoryImageDataset(pack, cache="shm")
    seg = Path(ds.segment)
    theirs = InMemoryImageDataset(other, cache="shm")
    keep = seg.read_bytes()
    del ds
    gc.collect()
    shutil.copyfile(theirs.segment, seg)  # well formed, the other pack's, under this pack's name
    os.chmod(seg, 0o600)
    ds = InMemoryImageDataset(pack, cache="shm")
    assert ds._cached.segment.created  # not trusted: filled anew
    labels = ds.labels.copy()
    del ds
    gc.collect()
    seg.write_bytes(keep)  # the right header...
    os.chmod(seg, 0o600)
    with open(seg, "r+b") as f:  # ...and one changed label
        raw = bytearray(f.read())
        i = len(raw) - 1
        while raw[i] == 0:
            i -= 1
        f.seek(i)
        f.write(bytes([raw[i] ^ 1]))
    ds = InMemoryImageDataset(pack, cache="shm")  # without verify the header is trusted
    assert not ds._cached.segment.created
    with pytest.raises(PackError, match="differs from the pack's checksum"):
        InMemoryImageDataset(pack, cache="shm", verify=True)
    del ds, theirs
    gc.collect()
    assert np.array_equal(InMemoryImageDataset(pack, cache="shm", verify=True).labels, labels)


def test_a_lock_held_forever_is_a_timeout_naming_its_holder(pack, shm_base, monkeypatch):
    import subprocess
    import sys

    from dataprep import InMemoryImageDataset
    from dataprep.pack.backends import read_manifest
    from dataprep.serve import shm as shm_mod

    name = shm_mod.segment_name(read_manifest(pack), "train/image")
    lock = shm_mod.segment_dir() / f"{name}.fill"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(lock)!r}, os.O_CREAT | os.O_RDWR, 0o600)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, str(os.getpid()).encode()); print('held', flush=True)\n"
        "time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setenv("DATAPREP_SHM_TIMEOUT", "1")
        with pytest.raises(DataprepError, match=rf"waited 1 s for this lock; it is held by pid {holder.pid}"):
            InMemoryImageDataset(pack, cache="shm")
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    assert len(InMemoryImageDataset(pack, cache="shm")) == 18  # free again: no timeout


def test_cache_list_and_clean_show_and_remove_this_users_segments(pack, index_tree, tmp_path, shm_base, monkeypatch):
    import gc
    import signal
    import subprocess
    import sys

    from click.testing import CliRunner

    from dataprep import InMemoryImageDataset
    from dataprep.cli import main
    from dataprep.serve import shm as shm_mod

    other = tmp_path / "other"
    build_images(scan_imagenet(index_tree), other, BuildSettings(workers=1, shard_size=5), ImageSettings(size=24))
    monkeypatch.setenv("DATAPREP_SHM_DIR", str(shm_base))  # for the child
    crash = ("import os, signal, sys\nfrom dataprep import InMemoryImageDataset\n"
             "ds = InMemoryImageDataset(sys.argv[1], cache='shm')\nprint(ds.segment, flush=True)\nos.kill(os.getpid(), signal.SIGKILL)\n")
    p = subprocess.run([sys.executable, "-c", crash, str(other)], capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGKILL
    left = Path(p.stdout.strip())  # complete, unused: its user was killed
    ds = InMemoryImageDataset(pack, cache="shm")  # in use by this process
    half = shm_mod.segment_dir() / f"{left.name}.tmp-12345-abcd"
    half.write_bytes(b"\0" * 64)
    r = CliRunner().invoke(main, ["cache", "list"])
    assert r.exit_code == 0 and "3 segment(s)" in r.output, r.output
    line = next(ln for ln in r.output.splitlines() if ds.segment in ln)
    assert f"used by pid {os.getpid()}" in line and str(pack.resolve()) in line and "complete" in line
    assert "unused" in next(ln for ln in r.output.splitlines() if str(left) + " " in ln)
    r = CliRunner().invoke(main, ["cache", "clean", "-v"])
    assert r.exit_code == 0 and f"removed {left}\n" in r.output and f"removed {half}" in r.output, r.output
    assert Path(ds.segment).exists() and not left.exists() and not half.exists()
    assert not (shm_mod.segment_dir() / f"{left.name}.users").exists()  # its locks went with it
    r = CliRunner().invoke(main, ["cache", "clean", "--all-mine", "-v"])
    assert f"removed {ds.segment}" in r.output and not Path(ds.segment).exists()
    assert ds.labels.sum() >= 0  # this process keeps what it mapped
    del ds
    gc.collect()


# -- tables: no fixed-width strings, a stated policy for many categories, vocabularies beside the manifest ----
WIDE_CELL = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1536 << 20, 1536 << 20))  # the old code asked for 3.7 GiB here
from dataprep.tables.build import build_table
from dataprep.tables.columns import TableSettings
r = build_table([sys.argv[1]], sys.argv[2], TableSettings(target="y"), {})
print(r["splits"]["train"])
"""


def test_one_wide_cell_does_not_make_every_row_that_wide(tmp_path):
    import subprocess
    import sys

    rows = [f"{k % 7},note{k % 13},{k % 2}" for k in range(30_000)]
    rows[4321] = f"1,{'x' * 50_000},0"
    csv = tmp_path / "t.csv"
    csv.write_text("a,note,y\n" + "\n".join(rows) + "\n")
    assert 300_000 < csv.stat().st_size < 500_000
    r = subprocess.run([sys.executable, "-c", WIDE_CELL, str(csv), str(tmp_path / "p")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "30000", r.stderr[-600:]
    from dataprep import TabularDataset

    ds = TabularDataset(tmp_path / "p")
    assert "x" * 50_000 in ds.vocab["note"] and len(ds.vocab["note"]) == 14


def test_many_distinct_values_follow_a_stated_policy_and_stay_out_of_the_manifest(tmp_path):
    from dataprep import TabularDataset
    from dataprep.pack.backends import read_manifest
    from dataprep.tables.build import build_table
    from dataprep.tables.columns import TableSettings

    n = 200_000
    ids = [f"id{k:06d}" for k in range(n)]
    ids[:30] = ["id000007"] * 30  # one frequent value among 199 971 singletons
    csv = tmp_path / "t.csv"
    pd.DataFrame({"user": ids, "x": np.arange(n) % 5, "y": np.arange(n) % 2}).to_csv(csv, index=False)
    build_table([str(csv)], tmp_path / "capped", TableSettings(target="y", max_categories=1000), {})
    m = read_manifest(tmp_path / "capped")
    ds = TabularDataset(tmp_path / "capped")
    assert len(ds.vocab["user"]) == 1000 and ds.vocab["user"][-1] == "<other>" and "id000007" in ds.vocab["user"]
    _, codes, _ = ds[list(range(40))]
    assert codes[:30, 0].tolist() == [ds.vocab["user"].index("id000007")] * 30
    assert "rarer than the 999 most frequent" in m["fields"]["conversions"]["user"]
    build_table([str(csv)], tmp_path / "all", TableSettings(target="y", max_categories=0), {})
    ds = TabularDataset(tmp_path / "all")
    assert len(ds.vocab["user"]) == n - 29
    manifest_bytes = (tmp_path / "all" / "manifest.json").stat().st_size
    assert manifest_bytes < csv.stat().st_size / 50, manifest_bytes  # it used to be twice the CSV
    with pytest.raises(DataprepError, match="max_categories"):
        TableSettings(target="y", max_categories=1)


def test_the_rare_bucket_never_collides_and_missing_keeps_its_code(tmp_path):
    from dataprep.tables.columns import _codes

    col = pd.Series(["a"] * 4 + ["<other>"] * 5 + ["b", "c", None])  # <missing> is the rarest value
    codes, vocab, rare = _codes(col, "c", "mask", max_categories=3)
    assert vocab == ["<missing>", "<other>", "<other*>"] and rare == 3  # the real "<other>" and <missing> kept
    assert codes[-1] == 0 and codes[4] == 1 and codes[0] == 2 and codes[9] == 2  # "a", "b" share the bucket


def test_hdf5_mapped_and_truncated_is_an_error_not_sigbus(index_tree, tmp_path):
    import subprocess
    import sys

    from dataprep.pack.convert import convert

    out = tmp_path / "raw"
    build_images(scan_imagenet(index_tree), out, BuildSettings(workers=1, shard_size=5), ImageSettings(size=16, resize="center-crop", mode="raw"))
    convert(out, tmp_path / "p.h5", "hdf5")
    code = ("import os, sys\nfrom dataprep import InMemoryImageDataset\nfrom dataprep.errors import PackError\n"
            "ds = InMemoryImageDataset(sys.argv[1], cache='mmap', as_numpy=True)\nds[0]\n"
            "os.truncate(sys.argv[1], 4096)\n"
            "try:\n    ds[len(ds) - 1]\n    print('read')\nexcept PackError as e:\n    print('PackError', e)\n")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "p.h5")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("PackError") and "while mapped" in r.stdout, (r.returncode, r.stdout, r.stderr[-300:])


def test_a_shard_file_that_is_a_symlink_out_of_the_pack_is_refused(pack, tmp_path):
    from dataprep import InMemoryImageDataset

    f = pack / "train" / "00000" / "labels.npy"
    shutil.copyfile(f, tmp_path / "elsewhere.npy")
    f.unlink()
    os.symlink(tmp_path / "elsewhere.npy", f)  # same bytes, checksums and all: only the link gives it away
    with pytest.raises(PackError, match="labels.npy: cannot open shard file .*symlink"):
        InMemoryImageDataset(pack)
