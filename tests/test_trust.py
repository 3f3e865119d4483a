"""Trust, second round: hostile names in inputs and packs, inputs that abort builds or exhaust memory, packs
that disagree with themselves. Each case here was reproduced on the code before its fix."""
import json
import os
import shutil

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
    with pytest.raises(Exception):  # the control: Pillow itself refuses it
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
    from PIL import ImageFile

    from dataprep.images.decode import decode_source
    from dataprep.synthetic import photo_like

    import cv2

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
