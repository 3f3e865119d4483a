"""Detection under attack (issue 52, round four): boxes no float32 holds, images with more boxes than a batch row
should hold, tampered detection packs through the Loader, hostile COCO files (huge, deep, ids past 64 bits,
names leaving the folder) and hostile YOLO trees (data.yaml alias bombs and tags, symlinks out of the root,
label files too large to read). Each case is a clear error naming the file (and entry) and the reason, or a
correct result, in bounded time and memory."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from dataprep import DetectionDataset, Loader, build
from dataprep.errors import DataprepError, SourceError
from dataprep.sources.coco import scan_coco
from dataprep.sources.yolo import scan_yolo
from dataprep.verify import verify_pack

from .conftest import within


def _image(path: Path, h: int = 40, w: int = 50) -> None:
    import cv2

    path.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(path), np.full((h, w, 3), 128, np.uint8))


def _coco(base: Path, boxes_per_image: list[list[list[float]]], size: tuple[int, int] = (40, 50)) -> tuple[Path, Path]:
    """An image folder of len(boxes_per_image) grey PNGs (h, w = size) and a COCO file giving each its boxes."""
    images, anns = [], []
    for k, boxes in enumerate(boxes_per_image):
        _image(base / "img" / f"{k}.png", *size)
        images.append({"id": k + 1, "file_name": f"{k}.png", "width": size[1], "height": size[0]})
        anns += [{"id": len(anns) + 1, "image_id": k + 1, "category_id": 1, "bbox": b} for b in boxes]
    path = base / "instances.json"
    path.write_text(json.dumps({"images": images, "annotations": anns, "categories": [{"id": 1, "name": "thing"}]}))
    return base / "img", path


def _manifest(pack: Path) -> dict:
    return json.loads((pack / "manifest.json").read_text())


# -- boxes narrower than float32 resolves -----------------------------------------------------------------------------

def test_a_box_thinner_than_float32_resolves_is_skipped_at_build_and_the_split_opens(tmp_path):
    """4e-7 px at x = 30 is a positive width in float64 and none in float32 (spacing 1.9e-6 there): the build
    judged the float64 box, stored an empty one, and every open then refused the whole split. Now the build
    judges what it stores. 1.2e-6 px at x = 30 survives the source (float32 rounds it up to 1.9e-6) but not a
    10x upscale (x = 300, spacing 3e-5): cut off at that size."""
    src, ann = _coco(tmp_path, [[[30, 20, 4e-7, 5], [3, 2, 10, 5]], [[30, 20, 1.2e-6, 5]]])
    build.coco(src, tmp_path / "p", annotations=ann, size=50, mode="raw", workers=1)
    ds = DetectionDataset(tmp_path / "p", as_numpy=True)
    assert ds[0][1].tolist() == [[3, 2, 13, 7]] and len(ds[1][1]) == 1 and ds[1][1][0, 2] > 30
    assert _manifest(tmp_path / "p")["splits"]["train"]["boxes"] == {"stored": 2, "degenerate": 1, "cut_off": 0}
    build.coco(src, tmp_path / "up", annotations=ann, size=400, upscale=True, mode="raw", workers=1)
    ds = DetectionDataset(tmp_path / "up", as_numpy=True)
    assert ds[0][1].tolist() == [[30, 20, 130, 70]] and ds[1][1].shape == (0, 4)
    assert _manifest(tmp_path / "up")["splits"]["train"]["boxes"] == {"stored": 1, "degenerate": 1, "cut_off": 1}
    assert verify_pack(tmp_path / "up").ok


def _forge(pack: Path, name: str, change) -> None:
    """Rewrite one array of a pack's first shard, its manifest record (shape, dtype, bytes, sha256) made to agree:
    what a forger who knows the format writes."""
    shard = next(p for p in sorted((pack / "train").iterdir()) if p.is_dir())
    path = shard / f"{name}.npy"
    arr = change(np.load(path))
    np.save(path, arr)
    m = _manifest(pack)
    for s in m["splits"]["train"]["shards"]:
        rec = s["files"].get(f"{name}.npy") if s["name"] == shard.name else None
        if rec is not None:
            rec.update({"shape": list(arr.shape), "dtype": arr.dtype.str, "bytes": path.stat().st_size,
                        "sha256": hashlib.sha256(path.read_bytes()).hexdigest()})
    (pack / "manifest.json").write_text(json.dumps(m))


def test_a_pack_holding_a_box_of_no_area_opens_and_never_serves_it(tmp_path):
    """What an older build stored (an empty float32 box): one sample's box never refuses the split; neither
    `ds[i]` nor the Loader (even with min_size=0, which serves every clipped box) gives it."""
    src, ann = _coco(tmp_path, [[[3, 2, 10, 5], [20, 10, 8, 8]], [[1, 1, 4, 4]]])
    build.coco(src, tmp_path / "p", annotations=ann, size=50, mode="raw", workers=1)

    def empty_second(b):
        b[1, 2] = b[1, 0]
        return b

    _forge(tmp_path / "p", "boxes", empty_second)
    assert verify_pack(tmp_path / "p").ok
    for min_size in (1.0, 0.0):
        ds = DetectionDataset(tmp_path / "p", as_numpy=True, min_size=min_size)
        assert ds[0][1].tolist() == [[3, 2, 13, 7]] and ds[0][2].tolist() == [0]
        _, boxes, labels, counts = next(iter(Loader(ds, batch_size=2)))
        assert counts.tolist() == [1, 1] and boxes[0, 0].tolist() == [3, 2, 13, 7] and boxes[1, 0].tolist() == [1, 1, 5, 5]


# -- max_boxes: the most boxes one image may bring into every batch row -------------------------------------------------

def test_an_image_with_more_boxes_than_max_boxes_is_skipped_with_its_reason_and_strict_refuses(tmp_path):
    """300,000 boxes on one image padded every batch row to 300,000 (2.5 GB a batch of 64): an image over the cap
    (1000 by default) is skipped at build, recorded, and the others are built; the cap is an option of the
    Python front door and of the command line, recorded in the manifest."""
    from click.testing import CliRunner

    from dataprep.cli import main

    rng = np.random.default_rng(0)
    many = [[float(x), float(y), 2.0, 2.0] for x, y in rng.uniform(0, 40, (1001, 2))]
    src, ann = _coco(tmp_path, [many, [[1, 1, 4, 4]], many[:1000]])
    s = build.coco(src, tmp_path / "p", annotations=ann, size=50, mode="raw", workers=1)
    assert s.splits[0].skipped == {"too many boxes": 1} and s.splits[0].written == 2
    skipped = _manifest(tmp_path / "p")["splits"]["train"]["skipped"]
    assert [(r["source"], r["reason"]) for r in skipped] == [("0.png", "too many boxes")], skipped
    assert "1,001 boxes, over the cap of 1,000 on one image (--max-boxes)" in skipped[0]["detail"]
    ds = DetectionDataset(tmp_path / "p")
    assert ds.sources == ["1.png", "2.png"] and ds.max_boxes == 1000
    assert _manifest(tmp_path / "p")["settings"]["max_boxes"] == 1000
    with pytest.raises(DataprepError, match=r"0.png: too many boxes"):
        build.coco(src, tmp_path / "s", annotations=ann, size=50, mode="raw", workers=1, strict=True)
    build.coco(src, tmp_path / "all", annotations=ann, size=50, mode="raw", workers=1, max_boxes=1001)
    assert len(DetectionDataset(tmp_path / "all")) == 3
    r = CliRunner().invoke(main, ["build", "coco", str(src), "--annotations", str(ann), "--size", "50", "-j", "1", "--max-boxes", "2",
                                  "--out", str(tmp_path / "cli"), "--no-progress"])
    assert r.exit_code == 0 and "too many boxes" in r.output, r.output
    assert DetectionDataset(tmp_path / "cli").sources == ["1.png"]
    for bad in (0, -1, 1.5, True, "10"):
        with pytest.raises(DataprepError, match=r"max_boxes="):
            build.coco(src, tmp_path / "bad", annotations=ann, max_boxes=bad)
    r = CliRunner().invoke(main, ["build", "yolo", str(tmp_path), "--max-boxes", "0", "--out", str(tmp_path / "y")])
    assert r.exit_code == 2 and "--max-boxes" in r.output, r.output


# -- YOLO: data.yaml bombs and tags, symlinks out of the root, label files too large or not files ------------------------

def _yolo(root: Path, labels: str = "0 0.5 0.5 0.2 0.2\n") -> Path:
    """A flat YOLO tree: images/a.png and images/b.png, labels/a.txt holding `labels`, labels/b.txt one box."""
    _image(root / "images" / "a.png")
    _image(root / "images" / "b.png")
    (root / "labels").mkdir(parents=True, exist_ok=True)
    (root / "labels" / "a.txt").write_text(labels)
    (root / "labels" / "b.txt").write_text("0 0.25 0.25 0.1 0.1\n")
    return root


def _bomb(key: str, levels: int = 6) -> str:
    """A data.yaml whose `key` is `levels` nested aliases of 9 (9**6 = 531,441 leaves in 300 bytes: written out,
    megabytes; the round's 430 bytes were 5 GB)."""
    lines = ['l0: &l0 ["xxxx","xxxx","xxxx","xxxx","xxxx","xxxx","xxxx","xxxx","xxxx"]']
    for k in range(1, levels):
        lines.append(f"l{k}: &l{k} [" + ",".join([f"*l{k - 1}"] * 9) + "]")
    lines.append(f"{key}: *l{levels - 1}")
    return "names: [a]\n" + "\n".join(lines) + "\n"


@pytest.mark.parametrize("text,match", [
    (_bomb("nc"), r"data.yaml:\d+: an alias \(\*l0\); a data.yaml is read without aliases"),
    (_bomb("kpt_shape"), r"data.yaml:\d+: an alias"),
    ("names: " + "[" * 100_000 + "]" * 100_000 + "\n", r"data.yaml:1: nested more than 32 levels deep"),
    ("nc: 1" + "0" * 5000 + "\n", r"data.yaml: cannot read it as YAML \(.*digits"),
    ("names: !!python/object/apply:os.system ['echo pwned']\n", r"data.yaml: cannot read it as YAML \(could not determine a constructor"),
    ("names: {0: a, 99999999999999999999999999999: b}\n", r"data.yaml: names has ids \[0, 9999999999999.*\], not 0..1"),
    ("names: {0: [[[[[[deep]]]]]]}\n", r"data.yaml: names\[0\] is \[\[\[\[\.\.\.\]\]\]\], not a name"),
    ("names: [a]\nkpt_shape: [1000000000, 3]\n", r"data.yaml: kpt_shape is \[1000000000, 3\], not \[keypoints, values each\]"),
], ids=["alias-nc", "alias-kpt", "deep", "digits", "python-tag", "huge-id", "nested-name", "huge-kpt"])
def test_a_hostile_data_yaml_is_refused_cheaply_with_a_short_message(tmp_path, text, match):
    """Alias bombs are refused at their first alias (the round's 430-byte one made a 5 GB message); nesting,
    an integer past Python's digit limit and Python tags are SourceErrors (not a RecursionError, a raw
    ValueError or a crash in libyaml's C composer), and every value a message quotes is cut short."""
    import time

    root = _yolo(tmp_path)
    (root / "data.yaml").write_text(text)
    t = time.perf_counter()
    with pytest.raises(SourceError, match=match) as e:
        scan_yolo(root)
    took = time.perf_counter() - t
    assert len(str(e.value)) < 600, len(str(e.value))
    within(took, 5, "refusing the data.yaml")


def _secret(tmp_path: Path) -> Path:
    """A file outside the dataset's folder whose lines must never reach a pack or a message."""
    path = tmp_path / "outside" / "secret.txt"
    path.parent.mkdir()
    path.write_text("SECRET-LINE-1 0.5 0.5 0.1 0.1\nSECRET-LINE-2\n")
    return path


@pytest.mark.parametrize("name", ["classes.txt", "data.yaml"])
def test_a_class_list_that_is_a_symlink_out_of_the_root_is_refused_unread(tmp_path, name):
    root = _yolo(tmp_path / "ds")
    (root / name).symlink_to(_secret(tmp_path))
    with pytest.raises(SourceError, match=rf"{name}: cannot read the .*: outside the root") as e:
        scan_yolo(root)
    assert "SECRET" not in str(e.value)
    # a symlink that stays inside the root is read
    (root / name).unlink()
    (root / "meta").mkdir()
    (root / "meta" / "real").write_text("person\n" if name == "classes.txt" else "names: [person]\n")
    (root / name).symlink_to(root / "meta" / "real")
    assert scan_yolo(root).classes == ["person"]


def test_a_label_file_out_of_the_root_or_not_a_file_skips_its_image_with_the_reason(tmp_path):
    """A label file that is a symlink out of the root, a FIFO (which blocked the listing, or read as no label
    file) or larger than LABEL_MAX_BYTES skips its image, recorded ("bad label file"), never read; under
    strict the listing is refused; the other images are built."""
    from dataprep.sources.yolo import LABEL_MAX_BYTES

    secret = _secret(tmp_path)
    for k, plant in enumerate((lambda p: p.symlink_to(secret), lambda p: os.mkfifo(p),
                               lambda p: (p.write_bytes(b""), os.truncate(p, LABEL_MAX_BYTES + 1)))):
        root = _yolo(tmp_path / f"ds{k}")
        (root / "labels" / "a.txt").unlink()
        plant(root / "labels" / "a.txt")
        src = scan_yolo(root)
        split = src.splits[0]
        assert split.paths == ["images/b.png"], split.paths
        rec = split.skipped[0]
        assert (rec["source"], rec["reason"]) == ("images/a.png", "bad label file") and "SECRET" not in rec["detail"]
        assert rec["detail"].startswith("labels/a.txt: ") and ("outside the root", "not a regular file", "too large")[k] in rec["detail"]
        with pytest.raises(SourceError, match=r"images/a.png: bad label file \(labels/a.txt: "):
            scan_yolo(root, strict=True)
    build.yolo(tmp_path / "ds0", tmp_path / "p", size=50, mode="raw", workers=1)
    m = _manifest(tmp_path / "p")
    assert [r["reason"] for r in m["splits"]["train"]["skipped"]] == ["bad label file"] and "SECRET" not in json.dumps(m)
    assert DetectionDataset(tmp_path / "p").sources == ["images/b.png"]


def test_a_tree_whose_every_label_file_is_refused_is_an_error_with_the_first_reason(tmp_path):
    root = _yolo(tmp_path)
    for name in ("a.txt", "b.txt"):
        (root / "labels" / name).unlink()
        os.mkfifo(root / "labels" / name)
    with pytest.raises(SourceError, match=r"images: no image could be listed \(images/a.png: bad label file, labels/a.txt: not a "
                                          r"regular file \(it is a FIFO\)\)"):
        scan_yolo(root)


def test_a_polygon_of_half_a_million_points_gives_its_box_in_bounded_time(tmp_path):
    """Millions of polygon values on one line: read (under LABEL_MAX_BYTES) in seconds, kept as their box."""
    import time

    rng = np.random.default_rng(0)
    pts = rng.uniform(0.3, 0.7, (500_000, 2))
    pts[0], pts[1] = (0.1, 0.2), (0.9, 0.8)
    root = _yolo(tmp_path, "2 " + " ".join(f"{v:.6f}" for v in pts.ravel()) + "\n")
    t = time.perf_counter()
    src = scan_yolo(root)
    took = time.perf_counter() - t
    np.testing.assert_allclose(src.splits[0].boxes[0], [0.1, 0.2, 0.9, 0.8])
    within(took, 20, "scanning a polygon of half a million points")


# -- COCO: files too large or not files, ids at 64 bits, names leaving the folder --------------------------------------

def test_an_annotations_file_over_the_cap_is_refused_before_it_is_read(tmp_path, monkeypatch):
    """The cap (ANNOTATIONS_MAX_BYTES, 2 GiB) holds from the file's size, before json holds a byte: shown with the
    cap lowered under a valid file's size, and with a sparse file past the real cap (never read)."""
    import dataprep.sources.coco as coco

    src, ann = _coco(tmp_path, [[[1, 1, 4, 4]]])
    huge = tmp_path / "huge.json"
    huge.write_bytes(b"")
    os.truncate(huge, coco.ANNOTATIONS_MAX_BYTES + 1)
    with pytest.raises(SourceError, match=r"huge.json: the annotations file is 2,147,483,649 bytes, over the 2,147,483,648-byte cap"):
        scan_coco(src, huge)
    monkeypatch.setattr(coco, "ANNOTATIONS_MAX_BYTES", ann.stat().st_size - 1)
    with pytest.raises(SourceError, match=r"instances.json: the annotations file is \d+ bytes, over the"):
        scan_coco(src, ann)
    monkeypatch.setattr(coco, "ANNOTATIONS_MAX_BYTES", ann.stat().st_size)
    assert scan_coco(src, ann).splits[0].paths == ["0.png"]


def test_an_annotations_file_that_is_a_fifo_is_refused_not_waited_on(tmp_path):
    import threading

    src, _ = _coco(tmp_path, [[[1, 1, 4, 4]]])
    os.mkfifo(tmp_path / "fifo.json")
    got: list = []

    def scan() -> None:
        try:
            scan_coco(src, tmp_path / "fifo.json")
        except SourceError as e:
            got.append(e)

    t = threading.Thread(target=scan, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "the listing blocked on a FIFO"
    assert got and "fifo.json: cannot read the annotations file: not a regular file" in str(got[0])


HOSTILE_COCO = {
    "category id 2**63": ({"categories": [{"id": 2 ** 63, "name": "a"}]}, r"categories\[0\]: category id 9223372036854775808 is not a 64-bit"),
    "category_id 2**63": ({"annotations": [{"id": 1, "image_id": 1, "category_id": 2 ** 63, "bbox": [1, 1, 2, 2]}]},
                          r"annotations\[0\] \(id 1\): category_id 9223372036854775808 names no category of the file \(ids 1\)"),
    "NaN": ({"annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [1, float("nan"), 2, 2]}]}, r"bbox is \[1, NaN, 2, 2\], not"),
    "Infinity": ({"annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [1, 1, float("inf"), 2]}]}, r"bbox is .*Infinity"),
    "id digits": ({"annotations": [{"id": 10 ** 300, "image_id": 1, "category_id": 1, "bbox": [1, 1, 2]}]}, r"\(id 10{76}\.\.\.\): bbox"),
}


@pytest.mark.parametrize("case", list(HOSTILE_COCO))
def test_hostile_coco_entries_are_errors_naming_the_entry(tmp_path, case):
    change, match = HOSTILE_COCO[case]
    src, ann = _coco(tmp_path, [[[1, 1, 4, 4]]])
    doc = {**json.loads(ann.read_text()), **change}
    ann.write_text(json.dumps(doc))
    with pytest.raises(SourceError, match=match) as e:
        scan_coco(src, ann)
    assert len(str(e.value)) < 600


def test_file_names_that_leave_the_folder_are_skipped_with_their_reasons(tmp_path):
    """`..`, absolute paths and NUL are refused at listing; a symlink (of a file or of a folder) out of the image
    folder is refused when the build reads it, on the opened descriptor; each a recorded skip, the rest built;
    a symlink that stays inside is followed."""
    src, ann = _coco(tmp_path, [[[1, 1, 4, 4]]])
    _image(tmp_path / "outside" / "o.png")
    (src / "link.png").symlink_to(tmp_path / "outside" / "o.png")
    (src / "dir").symlink_to(tmp_path / "outside")
    (src / "inner.png").symlink_to(src / "0.png")
    names = ["../outside/o.png", str(tmp_path / "outside" / "o.png"), "a\0b.png", "link.png", "dir/o.png", "inner.png"]
    doc = json.loads(ann.read_text())
    doc["images"] += [{"id": 10 + k, "file_name": n} for k, n in enumerate(names)]
    ann.write_text(json.dumps(doc))
    build.coco(src, tmp_path / "p", annotations=ann, size=50, mode="raw", workers=1)
    skipped = {r["source"]: r["reason"] for r in _manifest(tmp_path / "p")["splits"]["train"]["skipped"]}
    assert skipped == {n: "outside the root" for n in names[:5]}, skipped
    assert DetectionDataset(tmp_path / "p").sources == ["0.png", "inner.png"]


# -- tampered detection packs through the Loader --------------------------------------------------------------------------

def _nan(b):
    b[0, 1] = np.nan
    return b


def _outside(b):
    b[0, 2] = 1e9
    return b


def _column(dtype):
    return lambda a: a.astype(dtype)


TAMPERED = {
    "boxes NaN": ("boxes", _nan, r"boxes.npy: box 0 \(sample 0\) is not finite"),
    "boxes outside": ("boxes", _outside, r"boxes.npy: box 0 of sample 0, .* is inverted or outside its 50x40 image"),
    "boxes inf": ("boxes", lambda b: b * np.float32(np.inf), r"boxes.npy: box 0 \(sample 0\) is not finite"),
    "boxes negative": ("boxes", lambda b: -b, r"boxes.npy: box 0 of sample 0, .* is inverted or outside"),
    "boxes float64": ("boxes", _column("<f8"), r"boxes"),
    "boxes 5 columns": ("boxes", lambda b: np.concatenate([b, b[:, :1]], 1), r"boxes"),
    "boxes one fewer": ("boxes", lambda b: b[:-1], r"box"),
    "offsets past the boxes": ("box_offsets", lambda o: o + np.array([0, 0, 1000], o.dtype), r"box_offsets"),
    "offsets backwards": ("box_offsets", lambda o: o[::-1].copy(), r"box_offsets"),
    "offsets negative": ("box_offsets", lambda o: o - 5, r"box_offsets"),
    "offsets huge": ("box_offsets", lambda o: np.array([0, 2 ** 62, int(o[-1])], o.dtype), r"box_offsets"),
    "labels past the classes": ("box_labels", lambda v: v + 7, r"box_labels.npy: a label is 7, but the pack has 1 classes"),
    "labels fewer": ("box_labels", lambda v: v[:-1], r"box_labels"),
    "crowd 2": ("box_crowd", lambda v: v + 2, r"box_crowd.npy: a crowd flag is 2, not 0 or 1"),
    "frames lie": ("box_frames", lambda f: f * 2, r"frames"),
    "frames zero": ("box_frames", lambda f: f * 0, r"box_frames"),
    "frames uint8": ("box_frames", _column("|u1"), r"box_frames.npy: holds \|u1 \[2, 2\], expected <i4"),
    "crowd bool": ("box_crowd", _column("|b1"), r"box_crowd.npy: holds \|b1"),
    "boxes objects": ("boxes", _column(object), r"boxes.npy: holds \|O"),
    "offsets all zero": ("box_offsets", np.zeros_like, r"box_offsets.npy: offsets are not monotonic"),
}


@pytest.mark.parametrize("case", list(TAMPERED))
def test_a_tampered_detection_pack_is_refused_naming_the_pack_or_serves_the_right_boxes(tmp_path, case):
    """One array of a shard rewritten (its manifest record made to agree, as a forger who knows the format
    writes it): opening the split, or serving it through the Loader (0 workers), is a DataprepError naming the
    pack, the array and the reason, never a raw numpy error, a crash or another sample's boxes. (A forged
    max_boxes: tests/test_detection_serving.py.)"""
    name, change, match = TAMPERED[case]
    src, ann = _coco(tmp_path, [[[3, 2, 10, 5], [20, 10, 8, 8]], [[1, 1, 4, 4]]])
    build.coco(src, tmp_path / "p", annotations=ann, size=50, mode="raw", workers=1)
    _forge(tmp_path / "p", name, change)
    with pytest.raises(DataprepError, match=match) as e:
        ds = DetectionDataset(tmp_path / "p")
        for _ in Loader(ds, batch_size=2, num_workers=0):
            pass
    assert str(tmp_path / "p") in str(e.value) and len(str(e.value)) < 1000, str(e.value)


def test_the_front_door_and_the_build_share_the_max_boxes_default():
    from dataprep.detection.build import MAX_BOXES
    from dataprep.options import DETECTION_OPTIONS

    assert DETECTION_OPTIONS["max_boxes"] == MAX_BOXES
