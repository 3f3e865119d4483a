"""Detection packs: boxes moved with every crop and flip (scenes whose pixels say where the boxes are), the build's
geometry exactly, COCO and YOLO giving the same pack, COCO's edge cases, malformed files, verify, info, the
Loader's batches (padding, max_boxes, min_size, min_visibility, crowd), mixtures, resume, ranks and backends."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from dataprep import CenterCrop, DetectionDataset, Loader, Mixture, RandomResizedCrop, build
from dataprep.cli import main
from dataprep.detection import boxes as geometry
from dataprep.detection.dataset import trim
from dataprep.detection.field import BoxesField
from dataprep.detection.scenes import NAMES, PALETTE, colour_check, write_scenes
from dataprep.errors import DataprepError, SourceError
from dataprep.images import geometry as shared
from dataprep.images.resize import plan as resize_plan
from dataprep.sources.coco import scan_coco
from dataprep.sources.yolo import scan_yolo


@pytest.fixture(scope="module")
def scenes(tmp_path_factory) -> dict:
    return write_scenes(tmp_path_factory.mktemp("det_scenes"), n=12)


@pytest.fixture(scope="module")
def packs(scenes, tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("det_packs")
    out = {"raw": base / "raw", "jpeg": base / "jpeg"}
    build.coco(scenes["images"], out["raw"], annotations=scenes["coco"], size=80, mode="raw", workers=1, shard_size=5)
    build.coco(scenes["images"], out["jpeg"], annotations=scenes["coco"], size=80, quality=95, workers=1)
    return out


# -- the acceptance check: every box holds its colour, every coloured pixel lies in a box of its class ---------------

# A box with under a pixel of width or height left inside the crop is dropped (min_size=1, as SanitizeBoundingBoxes),
# yet its sliver can still colour the border pixel it overlaps. The check serves with the defaults and, beside them,
# the same batches with min_size=0 (every clipped box): the boxes the default drops are those of min_size=0 under 1 px
# wide or high, and a class's colour within 1 px of one of them is exempt. Only such boxes: the served ones must be
# exactly the min_size=0 ones that pass the rule, and a box moved unlike its pixels is dropped in the wrong place too.
# JPEG bleeds colour a pixel or two past an edge: inner pixels judged 2 px in, coverage 1.5 px out, and only pixels
# that are the colour (within 25), not tinted towards it.
CHECKS = {"raw": {}, "jpeg": {"margin": 2.0, "slack": 1.5, "cover_tol": 25}}
CROPS = {"random+flip": (RandomResizedCrop(56, scale=(0.1, 1.0)), True), "center": (CenterCrop(64, resize=72), False)}


def _served_problems(ds, crop, flip, workers, epochs=2, exempt=True, **check) -> tuple[list[str], int, int]:
    """Problems over `epochs` epochs of served batches, the boxes checked and how many samples were flipped.
    `exempt`: pixels beside the boxes the dataset's min_size dropped are no problem (found by serving the same
    batches with min_size=0)."""
    problems, n_boxes, n_flipped = [], 0, 0
    every = DetectionDataset(ds.pack, min_size=0.0, min_visibility=ds.min_visibility)
    kw = dict(batch_size=5, num_workers=workers, crop=crop, flip=flip, shuffle=True, seed=3, indices=True)
    with Loader(ds, **kw) as loader, Loader(every, **kw) as all_boxes:
        for epoch in range(epochs):
            for (images, boxes, labels, counts, idx), (_, boxes0, labels0, counts0, idx0) in zip(loader, all_boxes, strict=True):
                assert torch.equal(idx, idx0)
                images = images.permute(0, 2, 3, 1).numpy()
                for k in range(len(images)):
                    c, c0 = int(counts[k]), int(counts0[k])
                    assert (labels[k, c:] == -1).all() and (boxes[k, c:] == 0).all()
                    b0, l0 = boxes0[k, :c0].numpy(), labels0[k, :c0].numpy()
                    keep = geometry.kept(b0.astype(np.float64), None, ds.min_size)
                    assert np.array_equal(boxes[k, :c].numpy(), b0[keep]) and np.array_equal(labels[k, :c].numpy(), l0[keep])
                    dropped = (b0[~keep], l0[~keep]) if exempt else None
                    problems += [f"epoch {epoch} sample {int(idx[k])}: {p}" for p in
                                 colour_check(images[k], boxes[k, :c].numpy(), labels[k, :c].numpy(), dropped=dropped, **check)]
                    n_boxes += c
                if flip:
                    from dataprep.images.crops import flips

                    n_flipped += int(flips((3, epoch), idx.numpy()).sum())
    return problems, n_boxes, n_flipped


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("crop_name", list(CROPS))
def test_served_boxes_hold_their_colour_and_cover_it(packs, crop_name, workers):
    crop, flip = CROPS[crop_name]
    ds = DetectionDataset(packs["raw"])  # the defaults: min_size=1, min_visibility=0
    assert (ds.min_size, ds.min_visibility) == (1.0, 0.0)
    problems, n_boxes, n_flipped = _served_problems(ds, crop, flip, workers)
    assert not problems, problems[:5]
    assert n_boxes > 60 and (n_flipped > 5 or not flip)


def test_without_the_exemption_the_dropped_boxes_slivers_are_found(packs):
    """The exemption is needed (the default drops boxes whose slivers colour pixels) and does its only job."""
    crop, flip = CROPS["random+flip"]
    problems, _, _ = _served_problems(DetectionDataset(packs["raw"]), crop, flip, 0, exempt=False)
    assert problems and all("lie in no box" in p for p in problems), problems[:5]


@pytest.mark.parametrize("crop_name", list(CROPS))
def test_jpeg_packs_pass_the_same_check_with_margins(packs, crop_name):
    crop, flip = CROPS[crop_name]
    problems, n_boxes, _ = _served_problems(DetectionDataset(packs["jpeg"]), crop, flip, 0, **CHECKS["jpeg"])
    assert not problems and n_boxes > 60, problems[:5]


@pytest.mark.parametrize("wrong", ["boxes not flipped", "boxes not clipped", "boxes not moved by the crop"])
def test_the_check_fails_for_wrong_box_geometry(packs, monkeypatch, wrong):
    """Negative controls: a wrong implementation (patched in; workers fork with it) is caught by the same check,
    the exemption for dropped boxes included (they are moved by the same wrong geometry)."""
    crop, flip = CROPS["random+flip"]
    if wrong == "boxes not flipped":  # the moves shared with pixels and masks are images/geometry.py's
        monkeypatch.setattr(shared, "flip_boxes", lambda b, w, which=None: b)
    elif wrong == "boxes not clipped":
        monkeypatch.setattr(geometry, "clip", lambda b, h, w: b)
    else:
        crop, flip = CROPS["center"]
        real = shared.crop_maps
        monkeypatch.setattr(shared, "crop_maps", lambda c, d, h, w, o: real(None, None, h, w, o))  # a window, not the resize
    problems, _, _ = _served_problems(DetectionDataset(packs["raw"]), crop, flip, 0, epochs=1)
    assert len(problems) > 10


def test_the_check_itself_rejects_wrong_boxes(scenes):
    """The check on a scene as drawn: its true boxes pass; mirrored, shifted by 2 px, relabelled or missing, they fail."""
    import cv2

    name, (boxes, labels) = next(iter(scenes["truth"].items()))
    img = cv2.cvtColor(cv2.imread(str(scenes["images"] / name)), cv2.COLOR_BGR2RGB)
    assert colour_check(img, boxes, labels) == []
    w = img.shape[1]
    assert colour_check(img, geometry.flip(boxes.copy(), w), labels)
    assert colour_check(img, boxes + [3, 0, 3, 0], labels)
    assert colour_check(img, boxes, (labels + 1) % len(PALETTE))
    assert colour_check(img, boxes[1:], labels[1:])


# -- the build's geometry, exactly -------------------------------------------------------------------------------------

@pytest.mark.parametrize("resize", ["shorter", "center-crop", "pad"])
def test_stored_boxes_follow_the_resize_exactly(scenes, tmp_path, resize):
    """Stored boxes are the true boxes through the resize mode's geometry (worked out here from the sizes alone),
    clipped; those a center crop cuts away are counted, not stored; every resolution of --sizes has its own."""
    build.coco(scenes["images"], tmp_path / "p", annotations=scenes["coco"], sizes=(64, 40), resize=resize, mode="raw", workers=1)
    m = json.loads((tmp_path / "p" / "manifest.json").read_text())
    sizes = {im["file_name"]: (im["height"], im["width"]) for im in json.loads(scenes["coco"].read_text())["images"]}
    cut = 0
    for size in (64, 40):
        ds = DetectionDataset(tmp_path / "p", resolution=size, as_numpy=True)
        for i in range(len(ds)):
            truth, labels = scenes["truth"][ds.sources[i]]
            h, w = sizes[ds.sources[i]]
            g = resize_plan(h, w, size, resize)
            (sh, sw), (oh, ow) = g.scaled, g.out
            top, left = max(0, (sh - oh) // 2), max(0, (sw - ow) // 2)
            y, x = (oh - min(oh, sh - top)) // 2, (ow - min(ow, sw - left)) // 2
            want = np.stack([truth[:, 0] * sw / w - left + x, truth[:, 1] * sh / h - top + y,
                             truth[:, 2] * sw / w - left + x, truth[:, 3] * sh / h - top + y], 1)
            want = np.clip(want, 0, [ow, oh, ow, oh])
            keep = (want[:, 2] > want[:, 0]) & (want[:, 3] > want[:, 1])
            cut += int((~keep).sum()) if size == 64 else 0
            image, got, got_labels = ds[i]
            assert image.shape[:2] == (oh, ow)
            np.testing.assert_allclose(got, want[keep].astype(np.float32), atol=1e-4)
            assert got_labels.tolist() == labels[keep].tolist()
    assert m["splits"]["train"]["boxes"]["cut_off"] == cut and (cut > 0) == (resize == "center-crop")
    assert m["fields"]["boxes@40"]["arrays"][0] == "boxes_r40"


def test_coco_and_yolo_give_the_same_pack(scenes, tmp_path):
    build.coco(scenes["images"], tmp_path / "c", annotations=scenes["coco"], size=64, mode="raw", workers=1)
    build.yolo(scenes["yolo"], tmp_path / "y", size=64, mode="raw", workers=1)
    c, y = DetectionDataset(tmp_path / "c", as_numpy=True), DetectionDataset(tmp_path / "y", as_numpy=True)
    assert c.classes == y.classes == list(NAMES) and len(c) == len(y) == 12
    by_name = {Path(y.sources[i]).name: i for i in range(len(y))}
    for i in range(len(c)):
        ic, bc, lc = c[i]
        iy, by, ly = y[by_name[c.sources[i]]]
        assert np.array_equal(ic, iy) and lc.tolist() == ly.tolist()
        np.testing.assert_allclose(bc, by, rtol=0, atol=2e-5)  # float32 rounding of 64 px coordinates: ~4e-6
    assert c.category_ids == [1, 3, 7, 8, 12] and y.category_ids is None


# -- COCO's edge cases and malformed files -----------------------------------------------------------------------------

def _coco(tmp_path: Path, images: list[dict], annotations: list[dict], categories=None, sizes=None) -> tuple[Path, Path]:
    """Images of solid grey (h, w per entry) under tmp_path/img and a COCO file of the given entries."""
    import cv2

    (tmp_path / "img").mkdir(exist_ok=True)
    for im in images:
        cv2.imwrite(str(tmp_path / "img" / im["file_name"]), np.full((im.get("height", 40), im.get("width", 50), 3), 128, np.uint8))
        if sizes is not None and im["file_name"] in sizes:
            h, w = sizes[im["file_name"]]
            cv2.imwrite(str(tmp_path / "img" / im["file_name"]), np.full((h, w, 3), 128, np.uint8))
    cats = categories if categories is not None else [{"id": 9, "name": "nine"}, {"id": 2, "name": "two"}, {"id": 40, "name": "forty"}]
    (tmp_path / "a.json").write_text(json.dumps({"images": images, "annotations": annotations, "categories": cats}))
    return tmp_path / "img", tmp_path / "a.json"


def _ann(k, image_id, cat, bbox, **kw):
    return {"id": k, "image_id": image_id, "category_id": cat, "bbox": bbox, **kw}


def test_coco_edge_cases(tmp_path):
    """Category ids with gaps (labels in id order, names as classes), crowd kept as a flag, an image without
    annotations kept with no boxes, boxes past the border clipped, zero-area boxes skipped and counted."""
    images = [{"id": 1, "file_name": "a.png", "width": 50, "height": 40}, {"id": 2, "file_name": "empty.png", "width": 50, "height": 40},
              {"id": 3, "file_name": "c.png", "width": 50, "height": 40}]
    anns = [_ann(1, 1, 9, [5, 5, 10, 10]), _ann(2, 1, 2, [30, 20, 40, 40], iscrowd=1), _ann(3, 1, 40, [-10, -5, 20, 15]),
            _ann(4, 3, 2, [10, 10, 0, 5]), _ann(5, 3, 9, [60, 10, 5, 5]), _ann(6, 3, 40, [1, 2, 3, 4])]
    src, ann = _coco(tmp_path, images, anns)
    s = build.coco(src, tmp_path / "p", annotations=ann, size=50, mode="raw", workers=1)
    ds = DetectionDataset(tmp_path / "p", as_numpy=True, crowd="flag")
    assert ds.classes == ["two", "nine", "forty"] and ds.category_ids == [2, 9, 40]
    order = {ds.sources[i]: i for i in range(len(ds))}
    _, b, lab, crowd = ds[order["a.png"]]
    assert lab.tolist() == [1, 0, 2] and crowd.tolist() == [False, True, False]
    np.testing.assert_array_equal(b, [[5, 5, 15, 15], [30, 20, 50, 40], [0, 0, 10, 10]])  # the last two clipped
    _, b, lab, _ = ds[order["empty.png"]]
    assert b.shape == (0, 4) and lab.shape == (0,)
    _, b, lab, _ = ds[order["c.png"]]
    assert lab.tolist() == [2] and b.tolist() == [[1, 2, 4, 6]]  # zero width, and wholly outside: degenerate
    m = json.loads((tmp_path / "p" / "manifest.json").read_text())
    assert m["splits"]["train"]["boxes"] == {"stored": 4, "degenerate": 2, "cut_off": 0}
    assert any("2 degenerate boxes" in line for line in s.lines())
    assert DetectionDataset(tmp_path / "p", crowd="drop")[order["a.png"]][2].tolist() == [1, 2]
    x, boxes, labels, counts, flags = next(iter(Loader(ds, batch_size=3)))
    assert counts.tolist() == [3, 0, 1] and flags.dtype == torch.bool and flags[0].tolist() == [False, True, False]


def test_coco_size_mismatch_and_missing_files_are_skipped_with_reasons(tmp_path):
    images = [{"id": 1, "file_name": "a.png", "width": 50, "height": 40}, {"id": 2, "file_name": "b.png", "width": 50, "height": 40}]
    src, ann = _coco(tmp_path, images, [_ann(1, 1, 9, [5, 5, 10, 10])], sizes={"b.png": (41, 50)})
    data = json.loads(ann.read_text())
    data["images"] += [{"id": 3, "file_name": "gone.png"}, {"id": 4, "file_name": "../up.png"}]
    ann.write_text(json.dumps(data))
    s = build.coco(src, tmp_path / "p", annotations=ann, size=50, mode="raw", workers=1)
    assert s.splits[0].written == 1 and s.splits[0].skipped == {"size mismatch": 1, "no such file": 1, "outside the root": 1}
    with pytest.raises(SourceError, match="gone.png"):
        build.coco(src, tmp_path / "q", annotations=ann, size=50, strict=True, workers=1)


MALFORMED = [
    ("not json", "{", "not a JSON file"),
    ("no images", {"annotations": []}, "no 'images' list"),
    ("bbox of three", {"images": [{"id": 1, "file_name": "a.png"}], "annotations": [_ann(7, 1, 1, [1, 2, 3])],
                       "categories": [{"id": 1, "name": "x"}]}, r"annotations\[0\] \(id 7\): bbox"),
    ("nan bbox", {"images": [{"id": 1, "file_name": "a.png"}], "annotations": [_ann(7, 1, 1, [1, 2, 3, float("nan")])],
                  "categories": [{"id": 1, "name": "x"}]}, r"annotations\[0\] \(id 7\): bbox"),
    ("unknown image", {"images": [{"id": 1, "file_name": "a.png"}], "annotations": [_ann(7, 5, 1, [1, 2, 3, 4])],
                       "categories": [{"id": 1, "name": "x"}]}, r"annotations\[0\] \(id 7\): image_id 5"),
    ("unknown category", {"images": [{"id": 1, "file_name": "a.png"}], "annotations": [_ann(7, 1, 4, [1, 2, 3, 4])],
                          "categories": [{"id": 1, "name": "x"}]}, r"annotations\[0\] \(id 7\): category_id 4"),
    ("string id", {"images": [{"id": "1", "file_name": "a.png"}]}, r"images\[0\]"),
    ("duplicate category", {"images": [{"id": 1, "file_name": "a.png"}], "annotations": [],
                            "categories": [{"id": 1, "name": "x"}, {"id": 1, "name": "y"}]}, r"categories\[0\]: category id 1"),
    ("bad crowd", {"images": [{"id": 1, "file_name": "a.png"}], "annotations": [_ann(7, 1, 1, [1, 2, 3, 4], iscrowd=2)],
                   "categories": [{"id": 1, "name": "x"}]}, "iscrowd"),
]


@pytest.mark.parametrize("doc,match", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_a_malformed_coco_file_is_an_error_naming_the_entry(tmp_path, doc, match):
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "a.png").write_bytes(b"")
    (tmp_path / "a.json").write_text(doc if isinstance(doc, str) else json.dumps(doc))
    with pytest.raises(SourceError, match=match) as e:
        scan_coco(tmp_path / "img", tmp_path / "a.json")
    assert "a.json" in str(e.value)


# -- YOLO ---------------------------------------------------------------------------------------------------------------

def test_yolo_split_folders_names_polygons_and_missing_labels(tmp_path):
    import cv2

    for split in ("train", "val"):
        (tmp_path / "images" / split).mkdir(parents=True)
        (tmp_path / "labels" / split).mkdir(parents=True)
        for k in range(2):
            cv2.imwrite(str(tmp_path / "images" / split / f"{k}.png"), np.full((40, 80, 3), 128, np.uint8))
    (tmp_path / "labels" / "val" / "0.txt").write_text("1 0.5 0.5 0.25 0.5\n\n0 0.1 0.1 0.3 0.1 0.2 0.4\n")
    (tmp_path / "data.yaml").write_text("path: .\nnames:\n  0: cat\n  1: dog\n")
    s = build.yolo(tmp_path, tmp_path / "p", split="val", size=80, mode="raw", workers=1)
    assert any("1 of 2 images have no label file" in line for line in s.lines())
    ds = DetectionDataset(tmp_path / "p", split="val", as_numpy=True)
    assert ds.classes == ["cat", "dog"] and ds.sources[0] == "images/val/0.png"
    _, b, lab = ds[0]
    assert lab.tolist() == [1, 0]
    np.testing.assert_allclose(b, [[30, 10, 50, 30], [8, 4, 24, 16]], atol=1e-4)
    assert len(ds[1][1]) == 0
    with pytest.raises(SourceError, match=r"no split 'test'.*\['train', 'val'\]"):
        scan_yolo(tmp_path, "test")
    (tmp_path / "labels" / "train" / "1.txt").write_text("0 0.5 0.5 0.2 0.2\nx 0.5 0.5 0.2 0.2\n")
    with pytest.raises(SourceError, match=r"labels/train/1.txt:2: 'x 0.5"):
        scan_yolo(tmp_path, "train")
    (tmp_path / "labels" / "train" / "1.txt").write_text("5 0.5 0.5 0.2 0.2\n")
    with pytest.raises(SourceError, match=r"1.txt:1: class 5 has no name"):
        scan_yolo(tmp_path, "train")
    (tmp_path / "labels" / "train" / "1.txt").write_text("0 0.5 0.5 0.2\n")
    with pytest.raises(SourceError, match=r"1.txt:1: 3 coordinates"):
        scan_yolo(tmp_path, "train")


# -- the Loader's batches ------------------------------------------------------------------------------------------------

def test_batches_are_padded_and_cut_to_their_largest_count_unless_max_boxes_is_given(packs):
    ds = DetectionDataset(packs["raw"])
    crop = CenterCrop(64, resize=72)
    images, boxes, labels, counts = next(iter(Loader(ds, batch_size=4, crop=crop)))
    m = max(1, int(counts.max()))
    assert images.shape == (4, 3, 64, 64) and boxes.shape == (4, m, 4) and boxes.dtype == torch.float32
    assert labels.shape == (4, m) and labels.dtype == torch.int64 and counts.dtype == torch.int64
    for k in range(4):
        assert (labels[k, : counts[k]] >= 0).all() and (labels[k, counts[k]:] == -1).all()
    fixed = DetectionDataset(packs["raw"], trim=False)
    _, bf, lf, cf = next(iter(Loader(fixed, batch_size=4, crop=crop)))
    assert bf.shape == (4, ds.max_boxes, 4) and torch.equal(bf[:, :m], boxes) and torch.equal(cf, counts)
    t = trim((images, bf, lf, cf))
    assert t[1].shape[1] == m and torch.equal(t[1], boxes) and torch.equal(t[2], labels)
    shapes = set()
    small_crops = dict(batch_size=2, crop=RandomResizedCrop(48, scale=(0.05, 0.3)), seed=4)  # counts differ by batch
    for (_, b, lab, c), (_, whole, whole_labels, _) in zip(Loader(ds, **small_crops), Loader(fixed, **small_crops)):
        mm = max(1, int(c.max()))
        assert b.shape[1] == mm and torch.equal(b, whole[:, :mm]) and torch.equal(lab, whole_labels[:, :mm])
        assert (whole_labels[:, mm:] == -1).all()
        shapes.add(mm)
    assert len(shapes) > 1 and min(shapes) < ds.max_boxes  # batches do differ in M
    small = DetectionDataset(packs["raw"], max_boxes=2)
    _, b2, l2, c2 = next(iter(Loader(small, batch_size=4, crop=crop)))
    assert b2.shape == (4, 2, 4) and c2.tolist() == np.minimum(counts.numpy(), 2).tolist()
    assert torch.equal(b2, boxes[:, :2]) and small.boxes_cut == int((counts - c2).sum())
    assert DetectionDataset(packs["raw"], max_boxes=ds.max_boxes, trim=True).finish_batch({"counts": cf, "boxes": bf})["boxes"].shape[1] == m
    with pytest.raises(DataprepError, match="max_boxes"):
        DetectionDataset(packs["raw"], max_boxes=0)
    with pytest.raises(DataprepError, match="trim"):
        DetectionDataset(packs["raw"], trim="yes")


def test_min_size_and_min_visibility_drop_boxes_as_documented(packs):
    """Against the unfiltered boxes (min_size=0: clipped, possibly empty), each filter keeps exactly what it says."""
    crop = RandomResizedCrop(48, scale=(0.1, 0.3))
    everything = DetectionDataset(packs["raw"], min_size=0.0)
    _, all_boxes, _, all_counts = next(iter(Loader(everything, batch_size=12, crop=crop, seed=1)))
    for kw, rule in (({}, lambda w, h, v: (w >= 1) & (h >= 1)), ({"min_size": 4.0}, lambda w, h, v: (w >= 4) & (h >= 4))):
        _, got, _, counts = next(iter(Loader(DetectionDataset(packs["raw"], **kw), batch_size=12, crop=crop, seed=1)))
        for k in range(12):
            b = all_boxes[k, : all_counts[k]].numpy()
            keep = rule(b[:, 2] - b[:, 0], b[:, 3] - b[:, 1], None)
            assert np.array_equal(got[k, : counts[k]].numpy(), b[keep])
    _, vis, _, vc = next(iter(Loader(DetectionDataset(packs["raw"], min_visibility=0.6), batch_size=12, crop=crop, seed=1)))
    assert int(vc.sum()) < int(all_counts.sum())  # some boxes keep less than 60 % of their area inside these small crops


def test_a_held_batch_never_changes(packs):
    ds = DetectionDataset(packs["raw"])
    with Loader(ds, batch_size=3, num_workers=2, crop=RandomResizedCrop(48), flip=True, shuffle=True) as loader:
        it = iter(loader)
        first = next(it)
        copy = [t.clone() for t in first]
        rest = list(it)
        assert len(rest) == 3 and all(torch.equal(a, b) for a, b in zip(first, copy))


def test_any_worker_count_serves_the_same_batches_and_resume_continues_them(packs):
    ds = DetectionDataset(packs["jpeg"])
    kw = dict(batch_size=4, crop=RandomResizedCrop(48), flip=True, shuffle=True, seed=5)
    with Loader(ds, num_workers=0, **kw) as a, Loader(ds, num_workers=2, **kw) as b:
        for x, y in zip(a, b):
            assert all(torch.equal(u, v) for u, v in zip(x, y))
    loader = Loader(ds, **kw)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    want = list(it)
    again = Loader(DetectionDataset(packs["jpeg"]), **kw)
    again.load_state_dict(state)
    got = list(again)
    assert len(got) == len(want) == 2 and all(torch.equal(u, v) for x, y in zip(got, want) for u, v in zip(x, y))


def test_ranks_share_an_epoch_and_a_mixture_serves_each_members_boxes(packs):
    kw = dict(batch_size=3, crop=CenterCrop(64, resize=72), shuffle=True, seed=2)
    ds = DetectionDataset(packs["raw"])
    seen = [torch.cat([b[3] for b in Loader(ds, rank=r, world_size=2, indices=True, **kw)]).tolist() for r in (0, 1)]
    assert len(seen[0]) == len(seen[1]) == 6
    mix = Mixture([DetectionDataset(packs["raw"]), DetectionDataset(packs["jpeg"])], [0.5, 0.5], seed=1)
    images, boxes, labels, counts = next(iter(Loader(mix, batch_size=len(mix), crop=CenterCrop(64, resize=72), flip=True)))
    member, index, _ = mix.locate(np.arange(len(mix)), 0)
    assert set(member.tolist()) == {0, 1}
    x = images.permute(0, 2, 3, 1).numpy()
    for k in range(len(mix)):
        c = int(counts[k])
        check = {} if member[k] == 0 else CHECKS["jpeg"]
        assert not colour_check(x[k], boxes[k, :c].numpy(), labels[k, :c].numpy(), **check)


# -- verify, info, backends, the command line ---------------------------------------------------------------------------

def test_verify_and_info_and_the_field_checks(packs):
    r = CliRunner().invoke(main, ["verify", str(packs["raw"])])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["info", str(packs["raw"])])
    assert r.exit_code == 0 and "boxes:" in r.output and "5 classes" in r.output, r.output
    f = BoxesField.for_classes(3)
    good = f.shard_arrays([np.array([[1, 2, 5, 6]]), np.zeros((0, 4))], [[2], []], [[0], []], [(10, 10), (8, 8)])
    arrays = {k: good[k] for k in good}
    assert f.check(arrays) == []
    for what, change in (("outside", ("boxes", np.array([[1, 2, 11, 6]], np.float32))),
                         ("not finite", ("boxes", np.array([[1, np.nan, 5, 6]], np.float32))),
                         ("label", ("box_labels", np.array([3], np.uint8))), ("crowd", ("box_crowd", np.array([2], np.uint8))),
                         ("inverted", ("boxes", np.array([[5, 2, 4, 6]], np.float32)))):
        bad = {**arrays, change[0]: change[1]}
        assert f.check(bad), what
    # a box of no area is no problem (an older build stored such; tests/test_trust_detection.py serves none)
    assert f.check({**arrays, "boxes": np.array([[5, 2, 5, 6]], np.float32)}) == []


@pytest.mark.parametrize("fmt", ["hdf5", "zarr"])
def test_converted_packs_and_every_cache_serve_the_same_boxes(packs, tmp_path, fmt):
    pytest.importorskip({"hdf5": "h5py", "zarr": "zarr"}[fmt])
    target = tmp_path / ("p.h5" if fmt == "hdf5" else "p.zarr")
    r = CliRunner().invoke(main, ["convert", str(packs["raw"]), "--out", str(target), "--to", fmt, "--no-progress"])
    assert r.exit_code == 0, r.output
    ref = DetectionDataset(packs["raw"], as_numpy=True)
    for ds in (DetectionDataset(target, as_numpy=True), DetectionDataset(packs["raw"], as_numpy=True, cache="mmap"),
               DetectionDataset(packs["raw"], as_numpy=True, cache="shm")):
        for i in range(len(ref)):
            a, b = ref[i], ds[i]
            assert all(np.array_equal(u, v) for u, v in zip(a, b))


def test_the_cli_builds_coco_and_yolo(scenes, tmp_path):
    r = CliRunner().invoke(main, ["build", "coco", str(scenes["images"]), "--annotations", str(scenes["coco"]), "--size", "48",
                                  "--split", "val", "-j", "1", "--out", str(tmp_path / "c"), "--no-progress"])
    assert r.exit_code == 0 and "val: 12 of 12" in r.output and "boxes stored" in r.output, r.output
    r = CliRunner().invoke(main, ["build", "yolo", str(scenes["yolo"]), "--size", "48", "-j", "1", "--out", str(tmp_path / "y"),
                                  "--no-progress"])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "y" / "manifest.json").read_text())["kind"] == "detection"


def test_the_example_prepares_a_pack_and_trains_a_few_steps(tmp_path):
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "examples" / "train_detector.py"
    run = lambda *a: subprocess.run([sys.executable, str(script), *map(str, a)], capture_output=True, text=True, timeout=120)  # noqa: E731
    r = run("prepare", tmp_path / "src", "--out", tmp_path / "pack", "--images", 16, "--size", 64)
    assert r.returncode == 0 and "16 of 16 images written" in r.stdout, r.stderr
    r = run("train", tmp_path / "pack", "--steps", 10, "--batch-size", 8, "--workers", 0)
    assert r.returncode == 0 and "step 10: loss" in r.stdout, r.stderr
    r = run("train", tmp_path / "nothing")
    assert r.returncode != 0 and "no pack there" in r.stderr


def test_a_progressive_schedule_moves_the_boxes_at_every_size(packs):
    from dataprep import Schedule

    ds = DetectionDataset(packs["raw"], min_size=0.5)
    with Loader(ds, batch_size=6, crop=RandomResizedCrop(48, scale=(0.2, 1.0)), flip=True, shuffle=True,
                schedule=Schedule.table([32, 48], {0: 32, 1: 48})) as loader:
        for epoch, size in ((0, 32), (1, 48)):
            for images, boxes, labels, counts in loader:
                assert images.shape[2:] == (size, size)
                x = images.permute(0, 2, 3, 1).numpy()
                for k in range(len(x)):
                    c = int(counts[k])
                    assert not colour_check(x[k], boxes[k, :c].numpy(), labels[k, :c].numpy()), (epoch, k)


# -- EXIF orientation: COCO boxes lie on the stored pixels ---------------------------------------------------------------

def _oriented(path: Path, orientation: int) -> None:
    """A 64 x 64 image, grey with a red 20 x 20 square at the stored top-left, tagged with `orientation`."""
    from PIL import Image

    px = np.full((64, 64, 3), 128, np.uint8)
    px[:20, :20] = PALETTE[0]
    exif = Image.Exif()
    exif[0x0112] = orientation
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(px).save(path, exif=exif.tobytes(), **({"quality": 95} if path.suffix == ".jpg" else {}))


@pytest.mark.parametrize("ext", [".jpg", ".png"])
def test_coco_boxes_on_an_exif_rotated_image_turn_with_its_pixels(tmp_path, ext, monkeypatch):
    """COCO's boxes are on the stored pixel grid (torchvision's CocoDetection reads pixels with PIL, unturned):
    the build turns the pixels upright (orientation 6: 90 degrees clockwise), so the box must turn with them
    and cover the red pixels, now at the top-right. The control: boxes left as given miss them."""
    from dataprep.detection import build as det_build

    _oriented(tmp_path / "img" / f"a{ext}", 6)
    doc = {"images": [{"id": 1, "file_name": f"a{ext}", "width": 64, "height": 64}],
           "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 20, 20]}], "categories": [{"id": 1, "name": "red"}]}
    (tmp_path / "a.json").write_text(json.dumps(doc))
    s = build.coco(tmp_path / "img", tmp_path / "p", annotations=tmp_path / "a.json", size=64, mode="raw", workers=1)
    assert any("1 images with an EXIF orientation" in n for n in s.splits[0].notes), s.splits[0].notes
    image, boxes, labels = DetectionDataset(tmp_path / "p", as_numpy=True)[0]
    red = np.argwhere(np.abs(image.astype(int) - PALETTE[0]).max(-1) <= 40)
    assert red[:, 1].min() >= 40 and red[:, 0].max() < 22  # the decoder turned it: red at the top-right
    np.testing.assert_allclose(boxes, [[44, 0, 64, 20]])
    assert colour_check(image, boxes, labels, **CHECKS["jpeg"]) == []
    monkeypatch.setattr(det_build, "source_orientation", lambda data: 1)  # the control: boxes as given
    build.coco(tmp_path / "img", tmp_path / "q", annotations=tmp_path / "a.json", size=64, mode="raw", workers=1)
    image, boxes, labels = DetectionDataset(tmp_path / "q", as_numpy=True)[0]
    assert colour_check(image, boxes, labels, **CHECKS["jpeg"])


def test_a_declared_upright_size_keeps_the_boxes_as_given_and_any_other_is_a_mismatch(tmp_path):
    """A 64 x 40 stored grid turned by orientation 6 decodes 40 x 64: width 64, height 40 (the stored grid) turns
    the boxes, width 40, height 64 (upright: the tool had turned it) keeps them, 50 x 50 is a size mismatch."""
    from PIL import Image

    exif = Image.Exif()
    exif[0x0112] = 6
    (tmp_path / "img").mkdir()
    Image.fromarray(np.full((40, 64, 3), 128, np.uint8)).save(tmp_path / "img" / "a.png", exif=exif.tobytes())
    def built(w: int, h: int, **kw):
        doc = {"images": [{"id": 1, "file_name": "a.png", "width": w, "height": h}],
               "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 10, 5]}], "categories": [{"id": 1, "name": "x"}]}
        (tmp_path / "a.json").write_text(json.dumps(doc))
        build.coco(tmp_path / "img", tmp_path / f"p{w}", annotations=tmp_path / "a.json", size=64, mode="raw", workers=1, **kw)
        return DetectionDataset(tmp_path / f"p{w}", as_numpy=True)[0][1].tolist()

    assert built(64, 40) == [[35, 0, 40, 10]] and built(40, 64) == [[0, 0, 10, 5]]
    with pytest.raises(DataprepError, match=r"size mismatch.*decodes to 40x64 \(stored 64x40, EXIF orientation 6\)"):
        built(50, 50, strict=True)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_boxes_turn_upright_exactly_as_the_decoder_turns_pixels(orientation):
    """Every orientation: a box painted on a 7 x 11 stored grid, turned by the decoder's own transposes, lies where
    from_stored puts the box."""
    from dataprep.images.decode import upright

    grid = np.zeros((7, 11, 1), np.uint8)
    box = np.array([[2.0, 1.0, 5.0, 6.0]])
    grid[1:6, 2:5] = 1
    turned = upright(grid, orientation)[:, :, 0]
    ys, xs = np.nonzero(turned)
    np.testing.assert_array_equal(geometry.from_stored(box, orientation, 7, 11), [[xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]])


# -- the audit reads a detection pack's stored hashes --------------------------------------------------------------------

def test_the_audit_reads_a_detection_packs_stored_hashes(packs):
    m = json.loads((packs["raw"] / "manifest.json").read_text())
    assert {"phash", "digest"} <= set(m["fields"]) and m["audit"]["hash"]
    r = CliRunner().invoke(main, ["audit", str(packs["raw"]), "--json"])
    assert r.exit_code == 0, r.output
    assert "on the fly" not in r.output and "rebuild" not in r.output, r.output
    from dataprep.audit.pack import PackSamples
    from dataprep.detection.field import fields_of

    with PackSamples(packs["raw"], fields_of) as ps:
        assert ps.stored


def test_a_detection_pack_built_without_hashes_is_audited_on_the_fly(scenes, tmp_path, monkeypatch):
    """The control (what every detection pack was before it stored them): no hashes, the audit's note."""
    from dataprep.images import build as image_build

    monkeypatch.setattr(image_build, "FINGERPRINTS", False)
    build.coco(scenes["images"], tmp_path / "p", annotations=scenes["coco"], size=48, mode="raw", workers=1)
    assert "phash" not in json.loads((tmp_path / "p" / "manifest.json").read_text())["fields"]
    r = CliRunner().invoke(main, ["audit", str(tmp_path / "p"), "--json"])
    assert r.exit_code == 0 and "on the fly" in r.output, r.output


def test_the_stock_dataloader_serves_a_detection_pack_through_detection_collate(packs, scenes, tmp_path):
    """dataprep.detection_collate batches the samples as the Loader lays a batch out: boxes padded with 0 and labels
    with -1 to the batch's largest count, counts, crowd flags with crowd="flag"; images stacked where they share a
    shape (then the whole batch equals ds.batch, the Loader's uncropped batch), else a list (the default collate
    fails on both: one image's boxes cannot be stacked with another's)."""
    from torch.utils.data import DataLoader

    import dataprep

    square = tmp_path / "square"
    build.coco(scenes["images"], square, annotations=scenes["coco"], size=64, resize="center-crop", mode="raw", workers=1)
    for pack, crowd in ((square, "keep"), (square, "flag"), (packs["raw"], "keep")):
        ds = DetectionDataset(pack, crowd=crowd)
        served = 0
        for step, batch in enumerate(DataLoader(ds, batch_size=5, num_workers=2, collate_fn=dataprep.detection_collate)):
            idx = list(range(5 * step, min(5 * step + 5, len(ds))))
            images, boxes, labels, counts = batch[:4]
            assert boxes.shape[1] == max(1, max(len(ds.objects(i)[0]) for i in idx))
            for k, i in enumerate(idx):
                b, lab, cr = ds.objects(i)
                n = int(counts[k])
                assert n == len(b) and np.array_equal(boxes[k, :n].numpy(), b) and np.array_equal(labels[k, :n].numpy(), lab)
                assert (boxes[k, n:] == 0).all() and (labels[k, n:] == -1).all()
                assert torch.equal(images[k], ds[i][0])
                if crowd == "flag":
                    assert np.array_equal(batch[4][k, :n].numpy(), cr) and not batch[4][k, n:].any()
            if pack == square:
                assert all(torch.equal(a, b) for a, b in zip(batch, ds.batch(idx), strict=True))
            else:
                assert isinstance(images, list)
            served += len(idx)
        assert served == len(ds) and sum(len(ds.objects(i)[0]) for i in range(len(ds))) > len(ds)
