"""`verify` finds wrong contents that every checksum vouches for: labels outside the classes, mask values
outside the classes that are not the ignore value, and JPEGs whose frame header or decode gives a shape
other than the one recorded. Each pack here is a valid build with one array rewritten and its records (bytes, sha256, in the
manifest and in shard.json) rewritten to match, so only the content checks can catch it."""
from __future__ import annotations

import hashlib
import io
import json
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from dataprep.cli import main
from dataprep.errors import PackError
from dataprep.images.build import build_images
from dataprep.images.settings import ImageSettings
from dataprep.settings import BuildSettings
from dataprep.sources import scan_imagenet
from dataprep.verify import verify_pack

REPO = Path(__file__).resolve().parents[1]


def _rewrite(pack: Path, split: str, k: int, name: str, arr: np.ndarray, field_dtype: str | None = None) -> None:
    """Replace shard k's NAME.npy with `arr`, its records made to match (as a build would have written them);
    `field_dtype` also changes the dtype the manifest's field declares for that array."""
    m = json.loads((pack / "manifest.json").read_text())
    shard = m["splits"][split]["shards"][k]
    d = pack / split / shard["name"]
    b = io.BytesIO()
    np.lib.format.write_array(b, np.ascontiguousarray(arr), allow_pickle=False)
    data = b.getvalue()
    (d / f"{name}.npy").write_bytes(data)
    rec = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "dtype": arr.dtype.str, "shape": list(arr.shape)}
    shard["files"][f"{name}.npy"] = rec
    if field_dtype:
        for spec in m["fields"].values():
            if name in spec.get("arrays", []):
                spec["dtype"] = field_dtype
    (pack / "manifest.json").write_text(json.dumps(m))
    sj = json.loads((d / "shard.json").read_text())
    sj["files"][f"{name}.npy"] = rec
    (d / "shard.json").write_text(json.dumps(sj))


def _shards(pack: Path) -> list[tuple[str, int, str]]:
    m = json.loads((pack / "manifest.json").read_text())
    return [(split, k, s["name"]) for split, e in m["splits"].items() for k, s in enumerate(e["shards"])]


@pytest.fixture(scope="module")
def built(index_tree, tmp_path_factory) -> Path:
    """An encoded image pack: 3 classes, train in 4 shards of 5 (18 images), val 6."""
    out = tmp_path_factory.mktemp("verify") / "pack"
    build_images(scan_imagenet(index_tree), out, BuildSettings(workers=1, shard_size=5), ImageSettings(size=32))
    return out


@pytest.fixture
def pack(built, tmp_path) -> Path:
    shutil.copytree(built, tmp_path / "p")
    return tmp_path / "p"


def _problems(pack: Path, decode: bool = False) -> list[tuple[str, str]]:
    rep = verify_pack(pack, decode=decode)
    assert not any("checksum" in what for _, what in rep.problems), rep.problems  # the records were made to match
    return rep.problems


def test_the_untouched_pack_verifies(pack):
    """Control: nothing below is flagged for what the rewrite itself does (same bytes rewritten are fine)."""
    assert _problems(pack, decode=True) == []
    _rewrite(pack, "train", 0, "labels", np.load(pack / "train" / "00000" / "labels.npy"))
    _rewrite(pack, "train", 0, "shapes", np.load(pack / "train" / "00000" / "shapes.npy"))
    assert _problems(pack, decode=True) == []


def test_a_label_at_the_class_count_is_found(pack):
    labels = np.load(pack / "train" / "00000" / "labels.npy")
    labels[1] = 3  # 3 classes: 0, 1, 2
    _rewrite(pack, "train", 0, "labels", labels)
    assert _problems(pack) == [(str(pack / "train" / "00000"), "labels.npy: a label is 3, but the pack has 3 classes (0 to 2)")]
    with pytest.raises(PackError, match="labels.npy: a label is 3"):  # and the datasets refuse it on load
        from dataprep import InMemoryImageDataset

        InMemoryImageDataset(pack)
    r = CliRunner().invoke(main, ["verify", str(pack)])
    assert r.exit_code == 1 and "train/00000" in r.output and "a label is 3" in r.output, r.output


def test_a_negative_label_is_found(pack):
    """A manifest may declare a signed label dtype (a build never does): every shard's labels rewritten as int8,
    one of them -1. Before the check looked at the minimum, verify passed this pack and it served label -1."""
    for split, k, name in _shards(pack):
        labels = np.load(pack / split / name / "labels.npy").astype("|i1")
        _rewrite(pack, split, k, "labels", labels, field_dtype="|i1")
    assert _problems(pack) == []  # control: int8 labels in range are fine
    labels = np.load(pack / "train" / "00001" / "labels.npy")
    labels[2] = -1
    _rewrite(pack, "train", 1, "labels", labels, field_dtype="|i1")
    assert _problems(pack) == [(str(pack / "train" / "00001"), "labels.npy: a label is -1, but the pack has 3 classes (0 to 2)")]


def test_a_jpeg_whose_recorded_shape_is_another_is_found_by_decoding(pack):
    """shapes.npy of shard 0 says w x h for its first landscape JPEG, which is h x w: verify --decode names the
    sample, its source and both shapes."""
    from dataprep import InMemoryImageDataset

    shapes = np.load(pack / "train" / "00000" / "shapes.npy")
    i = next(k for k, (h, w, _) in enumerate(shapes) if h != w)
    h, w, c = (int(v) for v in shapes[i])
    source = InMemoryImageDataset(pack, as_numpy=True).sources[i]
    shapes[i] = [w, h, c]
    _rewrite(pack, "train", 0, "shapes", shapes)
    assert _problems(pack, decode=True) == [  # its frame header says so, read before any decoder runs
        (str(pack / "train" / "00000"), f"sample {i} ({source}): images.npy: holds a {w}x{h} JPEG, not the {h}x{w} JPEG "
         "its shape says (every serving path refuses it)")]
    r = CliRunner().invoke(main, ["verify", str(pack), "--decode"])
    assert r.exit_code == 1 and f"sample {i} ({source})" in r.output and f"holds a {w}x{h} JPEG" in r.output, r.output


def test_a_jpeg_replaced_by_one_of_another_size_is_found_by_decoding(pack):
    """Sample 4 of val's shard: its bytes replaced by a 20x30 JPEG (images.npy and offsets.npy rewritten
    together, shapes.npy left saying what the build made)."""
    d = pack / "val" / "00000"
    blob, offsets, shapes = (np.load(d / f"{n}.npy") for n in ("images", "offsets", "shapes"))
    ok, other = cv2.imencode(".jpg", np.full((20, 30, 3), 99, np.uint8))
    assert ok
    new = np.concatenate([blob[: offsets[4]], other.reshape(-1), blob[offsets[5]:]]).astype(np.uint8)
    offs = offsets.copy()
    offs[5:] += len(other) - (offsets[5] - offsets[4])
    _rewrite(pack, "val", 0, "images", new)
    _rewrite(pack, "val", 0, "offsets", offs)
    h, w, _ = (int(v) for v in shapes[4])
    got = _problems(pack, decode=True)
    assert len(got) == 1 and got[0][0] == str(d), got
    assert got[0][1].startswith("sample 4 (val/") and got[0][1].endswith(
        f"images.npy: holds a 30x20 JPEG, not the {w}x{h} JPEG its shape says (every serving path refuses it)")


# -- masks ---------------------------------------------------------------------------------------------------
def _mask_pack(root: Path, labels=None, num_classes=None, mode="raw", resize="center-crop") -> Path:
    """A segmentation pack of 3 pairs, masks of classes 0-4 (or Cityscapes ids 7, 8, 0 with its label map)."""
    from dataprep.segmentation.build import build_segmentation
    from dataprep.segmentation.pairs import pair_by_stem

    (root / "i").mkdir(parents=True)
    (root / "m").mkdir()
    y, x = np.mgrid[0:40, 0:48]
    for k in range(3):
        Image.fromarray(np.stack([x * 5, y * 6, (x + y + k) * 2], 2).astype(np.uint8)).save(root / "i" / f"{k}.png")
        ids = (x // 10 + y // 10 + k) % 5
        if labels is not None:
            ids = np.array([7, 8, 0, 7, 8], np.uint8)[ids]  # road, sidewalk, unlabeled (ignored)
        Image.fromarray(ids.astype(np.uint8)).save(root / "m" / f"{k}.png")
    out = root / "p"
    build_segmentation(pair_by_stem(root / "i", root / "m"), out, BuildSettings(workers=1),
                       ImageSettings(size=32, resize=resize, mode=mode), labels=labels, num_classes=num_classes)
    return out


def _set_mask_pixel(pack: Path, value: int) -> None:
    masks = np.load(pack / "train" / "00000" / "masks.npy")
    masks.reshape(-1)[100] = value
    _rewrite(pack, "train", 0, "masks", masks)


@pytest.mark.parametrize("mode, resize", [("raw", "center-crop"), ("encoded", "shorter")])  # fixed and blob masks
def test_a_mask_value_at_the_class_count_is_found(tmp_path, mode, resize):
    pack = _mask_pack(tmp_path, num_classes=5, mode=mode, resize=resize)
    assert _problems(pack) == []
    for value in (5, 255):  # no ignore value declared: 255 is out of range too
        _set_mask_pixel(pack, value)
        assert _problems(pack) == [(str(pack / "train" / "00000"),
                                    f"masks.npy: mask values [{value}] are neither below 5 classes nor the ignore value")]


def test_the_ignore_value_is_not_a_bad_mask_value(tmp_path):
    """Cityscapes' map: 19 classes, ignore 255. 255 is allowed (the control); 19, the class count, is not."""
    from dataprep.segmentation.masks import LabelMap

    pack = _mask_pack(tmp_path, labels=LabelMap.load(REPO / "configs" / "labels" / "cityscapes.yaml"))
    masks = np.load(pack / "train" / "00000" / "masks.npy")
    assert 255 in masks and _problems(pack) == []
    _set_mask_pixel(pack, 255)
    assert _problems(pack) == []
    _set_mask_pixel(pack, 19)
    assert _problems(pack) == [(str(pack / "train" / "00000"),
                                "masks.npy: mask values [19] are neither below 19 classes nor the ignore value")]
