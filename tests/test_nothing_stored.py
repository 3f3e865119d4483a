"""A build that stores nothing from its inputs (every file unreadable, every row of a table skipped) fails:
exit 1 from the CLI and `dataprep.build.NothingStored` (a SourceError) from the front door, carrying the
summary, with the skips counted by reason and the first one quoted; no manifest is written and the output
the build made is removed, so nothing is left that looks like a pack. Old code: exit 0, "0 of N written"
and a complete-looking empty pack, for every build command."""
from __future__ import annotations

import csv
import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dataprep import build
from dataprep.cli import main
from dataprep.errors import SourceError

JUNK = b"this is no image, whatever its name says\n"


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def junk(tmp_path_factory) -> dict[str, Path]:
    """Inputs of every build command, listed fine, every sample unreadable."""
    base = tmp_path_factory.mktemp("junk")
    for split in ("train",):
        for c in ("n01", "n02"):
            (base / "inet" / split / c).mkdir(parents=True)
            for i in range(2):
                (base / "inet" / split / c / f"{c}_{i}.JPEG").write_bytes(JUNK)
    with tarfile.open(base / "w.tar", "w") as tf:
        for i in range(3):
            for name, data in ((f"{i:04d}.png", JUNK), (f"{i:04d}.cls", b"0")):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    with open(base / "list.csv", "w", newline="") as f:
        csv.writer(f).writerows([(f"train/n01/n01_{i}.JPEG", "n01") for i in range(2)])
    for d in ("img", "mask"):
        (base / "seg" / d).mkdir(parents=True)
        for i in range(2):
            (base / "seg" / d / f"s{i}.png").write_bytes(JUNK)
    (base / "vol" / "a").mkdir(parents=True)
    for i in range(2):
        (base / "vol" / "a" / f"v{i}.npy").write_bytes(JUNK)
    from dataprep.detection.scenes import write_scenes

    scenes = write_scenes(base / "scenes", n=3)
    for p in scenes["images"].iterdir():
        p.write_bytes(JUNK)
    (base / "text").mkdir()
    for i in range(2):
        (base / "text" / f"d{i}.txt").write_text("")
    (base / "t.csv").write_text("x,y\n")
    out = {"inet": base / "inet", "tar": base / "w.tar", "list": base / "list.csv", "seg": base / "seg", "vol": base / "vol",
           "scenes": scenes["images"], "coco": scenes["coco"], "yolo": scenes["yolo"], "text": base / "text",
           "table": base / "t.csv"}
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"image": [JUNK] * 3, "label": ["a", "b", "a"]}), base / "t.parquet")
        out["parquet"] = base / "t.parquet"
    except ImportError:
        pass
    return out


# Each build command on its junk input: the CLI's arguments, the front door's call, and what the message says
CASES = {
    "imagenet": (lambda i, o: ["build", "imagenet", i["inet"], "--out", o], lambda i, o: build.imagenet(i["inet"], o),
                 "4 not an image"),
    "folder": (lambda i, o: ["build", "folder", i["inet"] / "train", "--out", o], lambda i, o: build.folder(i["inet"] / "train", o),
               "4 not an image"),
    "webdataset": (lambda i, o: ["build", "webdataset", i["tar"], "--out", o], lambda i, o: build.webdataset(i["tar"], o),
                   "3 not an image"),
    "parquet": (lambda i, o: ["build", "parquet", i["parquet"], "--label-column", "label", "--out", o],
                lambda i, o: build.parquet(i["parquet"], o, label_column="label"), "3 not an image"),
    "list": (lambda i, o: ["build", "list", i["list"], "--root", i["inet"], "--out", o],
             lambda i, o: build.list(i["list"], o, root=i["inet"]), "2 not an image"),
    "segmentation": (lambda i, o: ["build", "segmentation", "--images", i["seg"] / "img", "--masks", i["seg"] / "mask", "--out", o],
                     lambda i, o: build.segmentation(i["seg"] / "img", i["seg"] / "mask", o), "2 not an image"),
    "coco": (lambda i, o: ["build", "coco", i["scenes"], "--annotations", i["coco"], "--out", o],
             lambda i, o: build.coco(i["scenes"], o, annotations=i["coco"]), "3 not an image"),
    "yolo": (lambda i, o: ["build", "yolo", i["yolo"], "--out", o], lambda i, o: build.yolo(i["yolo"], o), "3 not an image"),
    "volumes": (lambda i, o: ["build", "volumes", i["vol"], "--out", o], lambda i, o: build.volumes(i["vol"], o), "2 corrupt header"),
    "tokenize": (lambda i, o: ["tokenize", i["text"], "--train-bpe", 300, "--out", o],
                 lambda i, o: build.tokenize(i["text"], o, train_bpe=300), "the corpus holds no documents"),
    "table": (lambda i, o: ["table", i["table"], "--target", "y", "--out", o], lambda i, o: build.table(i["table"], o, target="y"),
              "the table is empty"),
}
SAMPLES = {"imagenet", "folder", "webdataset", "parquet", "list", "segmentation", "coco", "yolo", "volumes"}


def no_pack(out: Path) -> None:
    assert not (out / "manifest.json").exists()
    assert not out.exists() and not Path(f"{out}.staging").exists(), sorted(out.parent.iterdir())


@pytest.mark.parametrize("name", list(CASES))
def test_a_build_that_stores_nothing_exits_1_with_the_reasons_and_leaves_no_pack(name, junk, tmp_path):
    if name == "parquet" and "parquet" not in junk:
        pytest.skip("needs pyarrow (the parquet extra)")
    args, call, reason = CASES[name]
    r = cli(*args(junk, tmp_path / "cli"), "-j", 1, "--no-progress")
    assert r.exit_code == 1, r.output
    assert reason in r.output and "Traceback" not in r.output, r.output
    no_pack(tmp_path / "cli")
    with pytest.raises(SourceError) as e:
        call(junk, tmp_path / "py")
    assert reason in str(e.value)
    no_pack(tmp_path / "py")
    if name in SAMPLES:  # every build that skips samples: the summary and the first skip
        assert isinstance(e.value, build.NothingStored), repr(e.value)
        assert str(e.value).startswith(f"{tmp_path / 'py'}: nothing stored: all ") and "; the first: " in str(e.value)
        s = e.value.summary
        assert s.written == 0 and sum(sum(sp.skipped.values()) for sp in s.splits) == sum(sp.planned for sp in s.splits) > 0
        assert s.out == tmp_path / "py" and any(reason.split(" ", 1)[1] in line for line in s.lines())


@pytest.mark.parametrize("fmt", ["hdf5", "zarr"])
def test_a_staged_build_that_stores_nothing_names_the_output_and_leaves_no_staging(fmt, junk, tmp_path):
    if fmt == "zarr":
        pytest.importorskip("zarr", minversion="3")
    out = tmp_path / ("p.h5" if fmt == "hdf5" else "p.zarr")
    with pytest.raises(build.NothingStored, match=rf"^{out}: nothing stored: all 4 samples"):
        build.folder(junk["inet"] / "train", out, fmt=fmt, workers=1)
    no_pack(out)


def test_a_build_into_a_directory_that_was_there_keeps_it_empty(junk, tmp_path):
    """What the user made stays; what the build wrote in it goes."""
    out = tmp_path / "given"
    out.mkdir()
    with pytest.raises(build.NothingStored):
        build.folder(junk["inet"] / "train", out, workers=1)
    assert out.is_dir() and list(out.iterdir()) == []


def test_one_sample_stored_is_a_pack_as_before(junk, tmp_path):
    """Not a refusal of skips: one good image among the junk builds a pack that counts the rest."""
    import cv2

    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    for i in range(3):
        (src / "a" / f"x{i}.png").write_bytes(JUNK)
    cv2.imwrite(str(src / "a" / "good.png"), np.zeros((16, 16, 3), np.uint8))
    s = build.folder(src, tmp_path / "p", workers=1, size=16)
    assert s.written == 1 and s.splits[0].skipped == {"not an image": 3}
    assert json.loads((tmp_path / "p" / "manifest.json").read_text())["splits"]["train"]["count"] == 1
