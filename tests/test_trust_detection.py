"""Detection under attack (issue 52, round four): boxes no float32 holds, images with more boxes than a batch row
should hold, tampered detection packs through the Loader, hostile COCO files (huge, deep, ids past 64 bits,
names leaving the folder) and hostile YOLO trees (data.yaml alias bombs and tags, symlinks out of the root,
label files too large to read). Each case is a clear error naming the file (and entry) and the reason, or a
correct result, in bounded time and memory."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from dataprep import DetectionDataset, Loader, build
from dataprep.errors import DataprepError
from dataprep.verify import verify_pack


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
