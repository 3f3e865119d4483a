"""Detection sources under attack: YOLO label files with a byte-order mark, Windows line endings, extra columns
(polygons, pose keypoints, confidences), float class ids, empty files, label files without an image (a note, or
refused under strict), class lists with holes, data.yaml variants, Ultralytics' train2017/val2017 folders; COCO
files with NaN, infinite, negative, huge and zero-area boxes, odd category ids, a crowd-only category and one
image holding thousands of boxes."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dataprep import DetectionDataset, Loader, build
from dataprep.errors import DataprepError, SourceError
from dataprep.sources.coco import scan_coco
from dataprep.sources.yolo import read_dataset, read_labels, scan_yolo


def _image(path: Path, h: int = 40, w: int = 80) -> None:
    import cv2

    path.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(path), np.full((h, w, 3), 128, np.uint8))


def _boxes(path: Path, text: str, names=None, keypoints=None) -> np.ndarray:
    path.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    return np.array([r[:5] for r in read_labels(path, names, keypoints)], np.float64).reshape(-1, 5)


# -- YOLO label files -----------------------------------------------------------------------------------------------

def test_a_byte_order_mark_and_windows_line_endings_are_read_as_plain_lines(tmp_path):
    want = [[0.4, 0.3, 0.6, 0.7, 1], [0.0, 0.0, 0.2, 0.2, 0]]
    got = _boxes(tmp_path / "a.txt", b"\xef\xbb\xbf1 0.5 0.5 0.2 0.4\r\n0 0.1 0.1 0.2 0.2\r\n\r\n")
    np.testing.assert_allclose(got, want, atol=1e-12)
    # negative control: read as plain UTF-8 (BOM kept), the first class field is not a number
    with pytest.raises(ValueError):
        int("\ufeff1")


def test_segments_keep_their_bounding_box_and_odd_columns_are_errors_naming_the_line(tmp_path):
    got = _boxes(tmp_path / "s.txt", "2 0.1 0.2 0.5 0.1 0.4 0.9 0.2 0.6\n")
    np.testing.assert_allclose(got, [[0.1, 0.1, 0.5, 0.9, 2]])
    for text, count in (("0 0.5 0.5 0.2 0.2 0.93\n", 5), ("0 0.1 0.2 0.5 0.1 0.4 0.3\n0 0.5 0.5 0.2 0.2 0.1 0.2 0.3\n", 7)):
        with pytest.raises(SourceError, match=rf"e.txt:\d: {count} coordinates"):
            _boxes(tmp_path / "e.txt", text)


def test_pose_lines_give_their_box_and_not_a_polygon_of_keypoints(tmp_path):
    """kpt_shape [2, 2]: class cx cy w h then 4 keypoint values. Read as a polygon (8 values), the box would
    span the keypoints: (0.0, 0.0)-(0.9, 0.95), not the box the line states."""
    line = "0 0.5 0.5 0.2 0.2 0.9 0.95 0.0 0.0\n"
    np.testing.assert_allclose(_boxes(tmp_path / "p.txt", line, keypoints=(2, 2)), [[0.4, 0.4, 0.6, 0.6, 0]])
    np.testing.assert_allclose(_boxes(tmp_path / "p.txt", line), [[0.0, 0.0, 0.9, 0.95, 0]])  # the control
    with pytest.raises(SourceError, match=r"p.txt:1: 6 values; with kpt_shape \[2, 2\]"):
        _boxes(tmp_path / "p.txt", "0 0.5 0.5 0.2 0.2 0.9 0.95\n", keypoints=(2, 2))


def test_class_fields_and_coordinates_are_checked(tmp_path):
    np.testing.assert_allclose(_boxes(tmp_path / "c.txt", "3.0 0.5 0.5 0.2 0.2\n")[:, 4], [3])  # as some exporters write
    for text, match in (("1.5 0.5 0.5 0.2 0.2\n", "is not 'class cx cy w h'"), ("-1 0.5 0.5 0.2 0.2\n", "class -1 has no name"),
                        ("0 nan 0.5 0.2 0.2\n", "not a finite number"), ("0 0.5 inf 0.2 0.2\n", "not a finite number"),
                        ("0 0.5 0.5 0.2 1e999\n", "not a finite number"), ("2 0.5 0.5 0.2 0.2\n", "class 2 has no name"),
                        ("0 0,5 0,5 0,2 0,2\n", "is not 'class cx cy w h'")):
        with pytest.raises(SourceError, match=match):
            _boxes(tmp_path / "c.txt", text, names=["a", "b"])
    assert _boxes(tmp_path / "empty.txt", "").shape == (0, 5)
    assert _boxes(tmp_path / "blank.txt", "\n  \r\n").shape == (0, 5)


# -- YOLO class names ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,want", [
    ("names: [cat, dog]\n", ["cat", "dog"]),
    ("names:\n  0: cat\n  1: dog\n", ["cat", "dog"]),
    ("names:\n  '0': cat\n  '1': dog\n", ["cat", "dog"]),
    ("nc: 2\nnames: ['cat', 'dog']\n", ["cat", "dog"]),
    ("nc: 3\n", ["class_0", "class_1", "class_2"]),
    ("\ufeffnames: [cat]\r\n", ["cat"]),
])
def test_data_yaml_variants_give_the_names(tmp_path, text, want):
    (tmp_path / "data.yaml").write_text(text, encoding="utf-8")
    assert read_dataset(tmp_path)[0] == want


@pytest.mark.parametrize("text,match", [
    ("names:\n  0: cat\n  2: dog\n", r"ids \[0, 2\], not 0..1"),
    ("nc: 3\nnames: [cat, dog]\n", "nc is 3 but names lists 2"),
    ("names:\n  a: cat\n", "the key 'a', not a class id"),
    ("train: images/train\n", "no 'names'"),
    ("- a\n- b\n", "not a mapping"),
    ("names: [cat\n", "cannot read it as YAML"),
    ("names: [a]\nkpt_shape: [17]\n", "kpt_shape is"),
])
def test_a_bad_data_yaml_is_an_error_naming_it(tmp_path, text, match):
    (tmp_path / "data.yaml").write_text(text)
    with pytest.raises(SourceError, match=match) as e:
        read_dataset(tmp_path)
    assert "data.yaml" in str(e.value)


def test_classes_txt_with_a_hole_is_refused_and_trailing_blank_lines_are_not(tmp_path):
    (tmp_path / "classes.txt").write_bytes(b"\xef\xbb\xbfcat\r\ndog\r\n\r\n")
    assert read_dataset(tmp_path)[0] == ["cat", "dog"]  # no BOM in the first name, no empty third class
    (tmp_path / "classes.txt").write_text("cat\n\ndog\n")
    with pytest.raises(SourceError, match=r"classes.txt:2: an empty line"):
        read_dataset(tmp_path)


# -- YOLO layouts ---------------------------------------------------------------------------------------------------

def test_ultralytics_train2017_and_val2017_folders_are_splits_never_one_flat_split(tmp_path):
    for split in ("train2017", "val2017"):
        _image(tmp_path / "images" / split / "a.png")
        (tmp_path / "labels" / split).mkdir(parents=True)
        (tmp_path / "labels" / split / "a.txt").write_text("0 0.5 0.5 0.5 0.5\n")
    with pytest.raises(SourceError, match=r"no split 'train'.*\['train2017', 'val2017'\]"):
        scan_yolo(tmp_path)
    s = scan_yolo(tmp_path, "val2017")
    assert s.splits[0].paths == ["images/val2017/a.png"] and s.splits[0].name == "val2017"


def test_a_label_file_without_an_image_is_a_note_and_refused_under_strict(tmp_path):
    _image(tmp_path / "images" / "a.png")
    (tmp_path / "labels").mkdir()
    (tmp_path / "labels" / "a.txt").write_text("0 0.5 0.5 0.5 0.5\n")
    (tmp_path / "labels" / "b.txt").write_text("0 0.5 0.5 0.5 0.5\n")  # its image was renamed b.jpeg.bak, say
    (tmp_path / "labels" / "classes.txt").write_text("thing\n")  # labelImg's: not a label file
    s = scan_yolo(tmp_path)
    assert s.splits[0].notes == [f"1 label files under {tmp_path / 'labels'} have no image (the first: b.txt): not read"]
    with pytest.raises(SourceError, match=r"labels/b.txt: a label file with no image .*1 such files.*--strict"):
        scan_yolo(tmp_path, strict=True)
    (tmp_path / "labels" / "b.txt").unlink()
    assert scan_yolo(tmp_path, strict=True).splits[0].notes == []


def test_strict_stops_a_yolo_build_at_an_image_that_does_not_decode(tmp_path):
    _image(tmp_path / "images" / "a.png")
    (tmp_path / "images" / "b.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    (tmp_path / "labels").mkdir()
    (tmp_path / "labels" / "b.txt").write_text("0 0.5 0.5 0.5 0.5\n")
    s = build.yolo(tmp_path, tmp_path / "p", size=40, mode="raw", workers=1)
    assert s.splits[0].written == 1 and sum(s.splits[0].skipped.values()) == 1
    with pytest.raises(DataprepError, match="b.png"):
        build.yolo(tmp_path, tmp_path / "q", size=40, mode="raw", workers=1, strict=True)
    assert not (tmp_path / "q" / "manifest.json").exists()


def test_yolo_boxes_past_the_image_are_clipped_and_empty_ones_counted(tmp_path):
    _image(tmp_path / "images" / "a.png", 40, 80)
    (tmp_path / "labels").mkdir()
    (tmp_path / "labels" / "a.txt").write_text("0 0.0 0.0 0.5 0.5\n0 1.5 0.5 0.2 0.2\n0 0.5 0.5 -0.2 0.2\n0 0.5 0.5 0 0.2\n")
    build.yolo(tmp_path, tmp_path / "p", size=80, mode="raw", workers=1)
    _, boxes, labels = DetectionDataset(tmp_path / "p", as_numpy=True)[0]
    np.testing.assert_allclose(boxes, [[0, 0, 20, 10]])  # the first clipped; past the edge, negative, zero width skipped
    m = json.loads((tmp_path / "p" / "manifest.json").read_text())
    assert m["splits"]["train"]["boxes"]["degenerate"] == 3


# -- COCO ------------------------------------------------------------------------------------------------------------

def _coco(tmp_path: Path, anns: list[dict], categories=None, images=None) -> tuple[Path, Path]:
    _image(tmp_path / "img" / "a.png", 40, 50)
    images = images or [{"id": 1, "file_name": "a.png", "width": 50, "height": 40}]
    cats = categories if categories is not None else [{"id": 0, "name": "zero"}, {"id": -4, "name": "minus"},
                                                      {"id": 10 ** 12, "name": "big"}]
    path = tmp_path / "a.json"
    path.write_text(json.dumps({"images": images, "annotations": anns, "categories": cats}, allow_nan=True))
    return tmp_path / "img", path


@pytest.mark.parametrize("bbox", [[1, 2, float("inf"), 3], [float("-inf"), 2, 3, 4], [1, 2, 3, float("nan")],
                                  ["1", 2, 3, 4], [True, 2, 3, 4], [1, 2, 3, 4, 5], None, {"x": 1}])
def test_a_box_that_is_not_four_finite_numbers_is_an_error_naming_the_annotation(tmp_path, bbox):
    src, ann = _coco(tmp_path, [{"id": 77, "image_id": 1, "category_id": 0, "bbox": bbox}])
    with pytest.raises(SourceError, match=r"a.json: annotations\[0\] \(id 77\): bbox is"):
        scan_coco(src, ann)


def test_odd_category_ids_negative_huge_and_zero_map_in_id_order(tmp_path):
    anns = [{"id": 1, "image_id": 1, "category_id": 10 ** 12, "bbox": [0, 0, 10, 10]},
            {"id": 2, "image_id": 1, "category_id": -4, "bbox": [10, 10, 10, 10]},
            {"id": 3, "image_id": 1, "category_id": 0, "bbox": [20, 20, 10, 10]}]
    src, ann = _coco(tmp_path, anns)
    build.coco(src, tmp_path / "p", annotations=ann, size=50, mode="raw", workers=1)
    ds = DetectionDataset(tmp_path / "p", as_numpy=True)
    assert ds.classes == ["minus", "zero", "big"] and ds.category_ids == [-4, 0, 10 ** 12]
    assert ds[0][2].tolist() == [2, 0, 1]
    for bad, match in (([{"id": 1.0, "name": "x"}], r"categories\[0\]"), ([{"id": True, "name": "x"}], r"categories\[0\]"),
                       ([{"id": 1, "name": 5}], r"categories\[0\]")):
        src, ann = _coco(tmp_path / "bad", [], bad)
        with pytest.raises(SourceError, match=match):
            scan_coco(src, ann)


def test_negative_overflowing_and_far_away_boxes_are_degenerate_or_clipped(tmp_path):
    anns = [{"id": k, "image_id": 1, "category_id": 0, "bbox": b} for k, b in enumerate(
        [[10, 10, -5, 5],            # negative width: degenerate
         [1e308, 1e308, 1e308, 1e308],  # x + w overflows to inf: far outside, degenerate
         [-1e308, -1e308, 1e308, 1e308],  # reaches (0, 0): no area inside
         [-1e300, 5, 2e300, 10],       # spans the whole width
         [49.5, 39.5, 100, 100]])]     # half a pixel inside
    src, ann = _coco(tmp_path, anns)
    build.coco(src, tmp_path / "p", annotations=ann, size=50, mode="raw", workers=1)
    _, boxes, _ = DetectionDataset(tmp_path / "p", as_numpy=True)[0]
    np.testing.assert_allclose(boxes, [[0, 5, 50, 15], [49.5, 39.5, 50, 40]])
    m = json.loads((tmp_path / "p" / "manifest.json").read_text())
    assert m["splits"]["train"]["boxes"] == {"stored": 2, "degenerate": 3, "cut_off": 0}


def test_an_image_with_thousands_of_boxes_is_stored_and_served_whole(tmp_path):
    rng = np.random.default_rng(0)
    xy = rng.uniform(0, [45, 37], (3000, 2))  # every box inside the 50 x 40 image
    anns = [{"id": k, "image_id": 1, "category_id": 0, "bbox": [float(x), float(y), 3.0, 2.0]} for k, (x, y) in enumerate(xy)]
    images = [{"id": 1, "file_name": "a.png", "width": 50, "height": 40}, {"id": 2, "file_name": "b.png"}]
    _image(tmp_path / "img" / "b.png", 40, 50)
    src, ann = _coco(tmp_path, anns, images=images)
    build.coco(src, tmp_path / "p", annotations=ann, size=50, mode="raw", workers=1, max_boxes=3000)  # over the default cap
    ds = DetectionDataset(tmp_path / "p")
    assert ds.max_boxes == 3000
    _, boxes, labels, counts = next(iter(Loader(ds, batch_size=2)))
    assert counts.tolist() == [3000, 0] and boxes.shape == (2, 3000, 4) and (labels[1] == -1).all()
    want = np.clip(np.stack([xy[:, 0], xy[:, 1], xy[:, 0] + 3, xy[:, 1] + 2], 1), 0, [50, 40, 50, 40]).astype(np.float32)
    np.testing.assert_allclose(boxes[0].numpy(), want, atol=1e-5)


# -- image options on a detection build: --limit, --resume, workers ---------------------------------------------------

def _arrays(pack: Path) -> dict[str, bytes]:
    return {str(p.relative_to(pack)): p.read_bytes() for p in sorted(pack.rglob("*.npy"))}


def test_limit_resume_and_workers_keep_each_images_boxes(tmp_path):
    from dataprep.detection.scenes import write_scenes

    sc = write_scenes(tmp_path / "src", n=9, sizes=((40, 52), (50, 36)))
    kw = dict(annotations=sc["coco"], size=32, mode="raw", shard_size=3)
    build.coco(sc["images"], tmp_path / "one", workers=1, **kw)
    build.coco(sc["images"], tmp_path / "two", workers=2, **kw)
    assert _arrays(tmp_path / "one") == _arrays(tmp_path / "two")  # byte-identical whatever the worker count
    build.coco(sc["images"], tmp_path / "few", workers=1, limit=4, **{**kw, "shard_size": 2})
    few, full = DetectionDataset(tmp_path / "few", as_numpy=True), DetectionDataset(tmp_path / "one", as_numpy=True)
    at = {full.sources[i]: i for i in range(len(full))}
    assert len(few) == 4
    for i in range(len(few)):  # --limit picks images, and each keeps its own boxes
        assert all(np.array_equal(u, v) for u, v in zip(few[i], full[at[few.sources[i]]]))
    import shutil

    shutil.rmtree(next((tmp_path / "one" / "train").glob("00001")))
    (tmp_path / "one" / "manifest.json").unlink()  # a build stopped before its manifest
    s = build.coco(sc["images"], tmp_path / "one", workers=1, resume=True, **kw)
    assert _arrays(tmp_path / "one") == _arrays(tmp_path / "two") and s.splits[0].written == 9


# -- hostile sources: ids and sizes that would allocate without bound, numbers no float holds, deep nesting ------------

@pytest.mark.parametrize("cls,match", [("5000000000", r"class 5000000000: .*above 65535"), ("65536", r"class 65536: .*above 65535"),
                                       ("9" * 30, r"class 99999999999999999999\.\.\. \(30 digits\): .*above 65535"),
                                       ("1e10", "'1e10 .*' is not 'class cx cy w h'"), ("3e9", "'3e9 .*' is not 'class cx cy w h'")])
def test_a_huge_class_id_without_names_is_an_error_naming_the_line_not_a_list_of_its_size(tmp_path, cls, match):
    """Without classes.txt or data.yaml the names are the ids 0..max: a class of 10**10 would make that list
    (hundreds of GB) before anything is built. A float id past 2**31 is no class at all."""
    _image(tmp_path / "images" / "a.png")
    (tmp_path / "labels").mkdir()
    (tmp_path / "labels" / "a.txt").write_text(f"0 0.5 0.5 0.2 0.2\n{cls} 0.5 0.5 0.2 0.2\n")
    with pytest.raises(SourceError, match=r"a.txt:2: " + match):
        scan_yolo(tmp_path)


def test_the_largest_unnamed_class_id_is_kept_and_named_by_its_number(tmp_path):
    """The bound's edge: 65535 (a uint16 label) is a class, with 65536 names 0..65535."""
    _image(tmp_path / "images" / "a.png")
    (tmp_path / "labels").mkdir()
    (tmp_path / "labels" / "a.txt").write_text("65535 0.5 0.5 0.2 0.2\n")
    src = scan_yolo(tmp_path)
    assert len(src.classes) == 65536 and src.classes[-1] == "65535"


@pytest.mark.parametrize("text", ["1e10", "2147483648.0", "1e300"])
def test_a_float_class_id_beyond_int32_is_not_a_class(text):
    from dataprep.sources.yolo import _class_id

    with pytest.raises(ValueError):
        _class_id(text)
    assert _class_id("2147483647.0") == 2 ** 31 - 1


def test_nc_too_large_to_name_is_refused(tmp_path):
    (tmp_path / "data.yaml").write_text(f"nc: {10 ** 12}\n")
    with pytest.raises(SourceError, match=r"data.yaml: nc is 1000000000000"):
        read_dataset(tmp_path)


def _hostile(tmp_path: Path, text: str) -> tuple[Path, Path]:
    _image(tmp_path / "img" / "a.png", 40, 50)
    path = tmp_path / "h.json"
    path.write_text(text)
    return tmp_path / "img", path


HUGE = "1" + "0" * 400  # a JSON integer no float holds


@pytest.mark.parametrize("what,text,match", [
    ("bbox", '{"images":[{"id":1,"file_name":"a.png"}],"annotations":[{"id":5,"image_id":1,"category_id":1,"bbox":[0,0,%s,4]}],'
             '"categories":[{"id":1,"name":"a"}]}' % HUGE, r"h.json: annotations\[0\] \(id 5\): bbox is .*four finite numbers"),
    ("width", '{"images":[{"id":1,"file_name":"a.png","width":%d}],"annotations":[],"categories":[]}' % 10 ** 30,
     r"h.json: images\[0\] \(id 1\): width is 1000000000000000000000000000000, not a positive integer below 2\*\*31"),
    ("height", '{"images":[{"id":1,"file_name":"a.png","height":%s}],"annotations":[],"categories":[]}' % HUGE,
     r"h.json: images\[0\] \(id 1\): height is 10{76}\.\.\., not a positive integer below 2\*\*31"),
    ("nesting", '{"images":' + "[" * 200_000 + "]" * 200_000 + "}", r"h.json: nested too deep"),
    ("category id", '{"images":[{"id":1,"file_name":"a.png"}],"annotations":[],"categories":[{"id":%s,"name":"a"}]}' % HUGE,
     r"h.json: categories\[0\]: category id 10{76}\.\.\. is not a 64-bit integer"),
], ids=lambda v: v if isinstance(v, str) and len(v) < 12 else "")
def test_hostile_coco_numbers_and_nesting_are_errors_naming_the_file_and_entry(tmp_path, what, text, match):
    src, ann = _hostile(tmp_path, text)
    with pytest.raises(SourceError, match=match):
        scan_coco(src, ann)


def test_the_reviewers_hostile_coco_files_are_source_errors():
    """The review's reproductions (/tmp/review/c1, c2), where present."""
    base = Path("/tmp/review")
    files = [base / "c1" / "deep.json", base / "c2" / "a.json", base / "c2" / "b.json"]
    if not all(f.is_file() for f in files):
        pytest.skip("the review's files are not on this machine")
    for f in files:
        with pytest.raises(SourceError, match=str(f.name)):
            scan_coco(f.parent / "img", f)
