"""Segmentation packs: pairing, nearest-neighbour masks aligned with their images, mask dtypes, label maps,
bad pairs, SegmentationDataset and joint transforms."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from PIL import Image

from dataprep.cli import main
from dataprep.errors import DataprepError, ImageDecodeError, NothingStored, SourceError
from dataprep.images.settings import ImageSettings
from dataprep.segmentation import transforms as joint
from dataprep.segmentation.build import build_segmentation
from dataprep.segmentation.dataset import SegmentationDataset
from dataprep.segmentation.masks import LabelMap, resize_mask
from dataprep.segmentation.pairs import pair_by_stem, pair_from_file
from dataprep.serve.loader import Loader
from dataprep.settings import BuildSettings
from dataprep.synthetic import SEG_PALETTE, write_segmentation_tree

from .conftest import corpus_dir

REPO = Path(__file__).resolve().parents[1]


def _build(src, out, size=128, resize="center-crop", mode="raw", strict=False, workers=2, **kw):
    return build_segmentation(src, out, BuildSettings(workers=workers, strict=strict), ImageSettings(size=size, resize=resize, mode=mode), **kw)


@pytest.fixture(scope="module")
def scenes(tmp_path_factory) -> tuple[Path, Path]:
    return write_segmentation_tree(tmp_path_factory.mktemp("scenes"), {"train": 12, "val": 4},
                                   sizes=((240, 320), (300, 200), (256, 256), (97, 131)))


def _interior(mask: np.ndarray, r: int = 2) -> np.ndarray:
    """Pixels whose (2r+1)^2 neighbourhood holds one class: away from edges, where area filtering mixes colours."""
    lo = cv2.erode(mask, np.ones((2 * r + 1, 2 * r + 1), np.uint8))
    hi = cv2.dilate(mask, np.ones((2 * r + 1, 2 * r + 1), np.uint8))
    inner = lo == hi
    inner[:r], inner[-r:], inner[:, :r], inner[:, -r:] = False, False, False, False
    return inner


@pytest.mark.parametrize("mode,resize,tol", [("raw", "center-crop", 12), ("raw", "pad", 12), ("encoded", "shorter", 40)])
def test_masks_stay_aligned_with_their_images(scenes, tmp_path, mode, resize, tol):
    """Image and mask encode the same shapes (pixel colour = palette[class]); after scaling, cropping or
    padding, every interior pixel's colour still names its mask's class. Flat regions cannot show a 1-px
    shift (one scores 1.000 here): test_masks_and_images_follow_the_exact_geometry pins that exactly."""
    _build(pair_by_stem(*scenes), tmp_path / "p", 96, resize, mode)
    for split, n in (("train", 12), ("val", 4)):
        ds = SegmentationDataset(tmp_path / "p", split, as_numpy=True)
        assert len(ds) == n
        for i in range(len(ds)):
            img, msk = ds[i]
            assert img.shape[:2] == msk.shape and msk.dtype == np.uint8
            inner = _interior(msk)
            if resize == "pad":
                inner &= img.sum(-1) > 0  # padding is black (class 0's colour too)
            assert inner.sum() > 300
            err = np.abs(img.astype(int) - SEG_PALETTE[msk].astype(int)).max(-1)
            assert (err[inner] <= tol).mean() >= 0.995, f"{split} {i}: image and mask disagree"


# -- exact geometry: pixels and mask values encode their source coordinates ------------------------
# (h, w) of each source at size 64 center-crop: landscape and portrait halve exactly (the image is then the
# 2x2 block mean, the mask the pixel at (2y+1, 2x+1)), and crop 16 px off one axis; the odd-sized one
# scales by 64/97 and crops an odd margin ((87 - 64) // 2 = 11), where an off-by-one offset is likely.
_EXACT_SIZES = ((128, 160), (160, 128), (97, 131))


def _coordinate_pairs(root: Path) -> tuple[Path, Path]:
    (root / "img").mkdir(parents=True)
    (root / "msk").mkdir()
    for k, (h, w) in enumerate(_EXACT_SIZES):
        y, x = np.mgrid[0:h, 0:w]
        img = np.stack([(37 * x) % 256, (53 * y) % 256, (11 * (x + 3 * y) + k) % 256], axis=2).astype(np.uint8)
        Image.fromarray(img).save(root / "img" / f"{k}.png")
        Image.fromarray(((x + 7 * y) % 251).astype(np.uint8)).save(root / "msk" / f"{k}.png")  # 251: prime, no aliasing
    return root / "img", root / "msk"


def _check_exact_geometry(tmp_path: Path) -> None:
    """Each stored mask is the nearest-by-centres resize of its source (exact fractions, computed here), cut
    at the centre-crop offset computed here ((scaled - size) // 2); each image that halves exactly is the
    2x2 block mean under the same window. A mask 1 px off its image, or an offset off by one, changes values."""
    img_dir, msk_dir = _coordinate_pairs(tmp_path / "src")
    _build(pair_by_stem(img_dir, msk_dir), tmp_path / "p", 64, "center-crop", "raw", workers=1)
    ds = SegmentationDataset(tmp_path / "p", as_numpy=True)
    assert len(ds) == len(_EXACT_SIZES)
    for i in range(len(ds)):
        k = int(Path(ds.sources[i]).stem)
        h, w = _EXACT_SIZES[k]
        sh, sw = (64, round(w * 64 / h)) if h <= w else (round(h * 64 / w), 64)
        top, left = (sh - 64) // 2, (sw - 64) // 2
        img, msk = ds[i]
        assert img.shape == (64, 64, 3) and msk.shape == (64, 64)
        src_mask = np.asarray(Image.open(msk_dir / f"{k}.png"))
        want = _nearest_reference(src_mask, sh, sw)[top : top + 64, left : left + 64]
        assert np.array_equal(msk, want), f"{k}.png: mask differs at {np.argwhere(msk != want)[:3].tolist()}"
        if (h, w) != (2 * sh, 2 * sw):
            continue
        src = np.asarray(Image.open(img_dir / f"{k}.png")).astype(np.float64)
        blocks = src.reshape(sh, 2, sw, 2, 3).mean(axis=(1, 3))[top : top + 64, left : left + 64]
        assert np.abs(img - blocks).max() <= 0.5, f"{k}.png: image is not the block mean under the crop"


def test_masks_and_images_follow_the_exact_geometry(tmp_path):
    _check_exact_geometry(tmp_path)


def _shifted_mask(mask, geom, pad_value):
    return np.roll(resize_mask(mask, geom, pad_value), 1, axis=1)


def _off_by_one_crop(pixels, geom, fill=0):
    h, w = pixels.shape[:2]
    oh, ow = geom.out
    if (h, w) == (oh, ow):
        return np.ascontiguousarray(pixels)
    top, left = min(h - oh, (h - oh) // 2 + 1), min(w - ow, (w - ow) // 2 + 1)  # one past the centre
    return np.ascontiguousarray(pixels[top : top + oh, left : left + ow])


@pytest.mark.parametrize("wrong", ["mask shifted 1 px", "center-crop offset off by one"])
def test_exact_geometry_check_fails_for_a_wrong_implementation(wrong, tmp_path, monkeypatch):
    """Negative controls (the build runs with one forked worker, which inherits the patch)."""
    from dataprep.images import resize as resize_stage
    from dataprep.segmentation import build as seg_build

    if wrong == "mask shifted 1 px":
        monkeypatch.setattr(seg_build, "resize_mask", _shifted_mask)
    else:
        monkeypatch.setattr(resize_stage, "crop_pad", _off_by_one_crop)  # images and masks both: aligned, but off centre
    with pytest.raises(AssertionError):
        _check_exact_geometry(tmp_path)


def _real_pairs(root: Path, n: int = 10) -> tuple[Path, Path]:
    """Real photos and real-looking masks: each photo's luminance quantised into 6 classes (irregular,
    natural region boundaries), ids spread out (0, 1, 2, 7, 11, 200) as label ids are."""
    photos = sorted(corpus_dir("images", "train").rglob("*.JPEG"))
    photos = sorted(photos, key=lambda p: -p.stat().st_size)[:3] + photos[:: max(1, len(photos) // (n - 3))][: n - 3]
    ids = np.array([0, 1, 2, 7, 11, 200], np.uint8)
    (root / "img").mkdir(parents=True)
    (root / "msk").mkdir()
    for k, p in enumerate(photos):
        shutil.copy(p, root / "img" / f"{k:03d}.jpg")
        with Image.open(p) as im:
            lum = np.asarray(im.convert("L"))
        mask = ids[np.minimum(lum // 43, 5)]
        Image.fromarray(mask).save(root / "msk" / f"{k:03d}.png")
    return root / "img", root / "msk"


def _nearest_reference(src: np.ndarray, h: int, w: int) -> np.ndarray:
    """Nearest-neighbour by pixel centres, computed pixel by pixel with exact fractions: out[y, x] is the
    source pixel whose extent holds the output pixel's centre ((y + 1/2) * sh / h)."""
    from fractions import Fraction

    ys = [int((Fraction(2 * y + 1, 2) * src.shape[0]) / h) for y in range(h)]
    xs = [int((Fraction(2 * x + 1, 2) * src.shape[1]) / w) for x in range(w)]
    return src[np.ix_(ys, xs)]


@pytest.mark.corpus
def test_real_masks_hold_only_their_source_values(tmp_path):
    img_dir, msk_dir = _real_pairs(tmp_path)
    _build(pair_by_stem(img_dir, msk_dir), tmp_path / "p", 192, "shorter", "encoded")
    ds = SegmentationDataset(tmp_path / "p", as_numpy=True)
    assert len(ds) == 10
    big = 0
    for i in range(len(ds)):
        src = np.asarray(Image.open(msk_dir / Path(ds.mask_sources[i]).name))
        _, msk = ds[i]
        assert set(np.unique(msk).tolist()) <= set(np.unique(src).tolist())
        assert np.array_equal(msk, _nearest_reference(src, *msk.shape)), ds.mask_sources[i]
        big += max(src.shape) >= 2000
    assert big >= 1  # the corpus's large photos are among them


def _png16(path: Path, arr: np.ndarray) -> None:
    assert cv2.imwrite(str(path), arr)


def test_mask_dtype_is_chosen_from_the_values_and_recorded(tmp_path):
    (tmp_path / "i").mkdir(), (tmp_path / "m").mkdir()
    rng = np.random.default_rng(0)
    for k in range(3):
        cv2.imwrite(str(tmp_path / "i" / f"{k}.png"), rng.integers(0, 255, (40, 50, 3), dtype=np.uint8))
        _png16(tmp_path / "m" / f"{k}.png", np.full((40, 50), 100 + k, np.uint16))  # 16-bit files, small values
    _build(pair_by_stem(tmp_path / "i", tmp_path / "m"), tmp_path / "small", 32)
    m = json.loads((tmp_path / "small" / "manifest.json").read_text())
    assert m["fields"]["mask"]["dtype"] == "|u1" and m["mask"]["max_value"] == 102 and "16-bit" in m["mask"]["chosen_by"]

    _png16(tmp_path / "m" / "1.png", np.arange(40 * 50, dtype=np.uint16).reshape(40, 50) * 20)  # up to 39980
    _build(pair_by_stem(tmp_path / "i", tmp_path / "m"), tmp_path / "big", 40, "shorter")
    m = json.loads((tmp_path / "big" / "manifest.json").read_text())
    assert m["fields"]["mask"]["dtype"] == "<u2" and m["mask"]["max_value"] == 39980
    ds = SegmentationDataset(tmp_path / "big")
    _, msk = ds[1]
    assert msk.dtype == torch.uint16
    assert np.array_equal(msk.numpy(), np.arange(40 * 50).reshape(40, 50) * 20)  # no resize: exact values

    # forced to uint8, the mask with values above 255 is skipped with its reason; the others are kept
    s = _build(pair_by_stem(tmp_path / "i", tmp_path / "m"), tmp_path / "u8", 40, "shorter", mask_dtype="uint8")
    assert s.splits[0].written == 2 and s.splits[0].skipped == {"label out of range": 1}
    with pytest.raises(ImageDecodeError, match="label out of range"):
        _build(pair_by_stem(tmp_path / "i", tmp_path / "m"), tmp_path / "strict", 40, "shorter", strict=True, mask_dtype="uint8")


def test_cityscapes_label_map_remaps_ignores_and_pads(tmp_path):
    lm = LabelMap.load(REPO / "configs" / "labels" / "cityscapes.yaml")
    assert len(lm.classes) == 19 and lm.ignore == 255 and lm.table[26] == 13
    (tmp_path / "i").mkdir(), (tmp_path / "m").mkdir()
    ids = np.array([[7, 8, 26, 0], [33, 4, 7, 255]], np.uint8).repeat(20, 0).repeat(20, 1)  # 40 x 80
    cv2.imwrite(str(tmp_path / "i" / "a.png"), np.zeros((40, 80, 3), np.uint8))
    Image.fromarray(ids).save(tmp_path / "m" / "a.png")
    _build(pair_by_stem(tmp_path / "i", tmp_path / "m"), tmp_path / "p", 64, "pad", labels=lm)
    ds = SegmentationDataset(tmp_path / "p", as_numpy=True)
    assert ds.ignore_index == 255 and ds.num_classes == 19
    _, msk = ds[0]
    assert msk.shape == (64, 64)
    assert msk[:16].max() == 255 and msk[-16:].min() == 255  # 80 -> 64 wide, 40 -> 32 high: padded with ignore
    body = msk[16:48]
    want = np.array([[0, 1, 13, 255], [18, 255, 0, 255]], np.uint8).repeat(16, 0).repeat(16, 1)
    assert np.array_equal(body, want)


def test_colour_masks_map_through_the_label_map(tmp_path):
    (tmp_path / "i").mkdir(), (tmp_path / "m").mkdir()
    cv2.imwrite(str(tmp_path / "i" / "a.png"), np.zeros((20, 20, 3), np.uint8))
    rgb = np.zeros((20, 20, 3), np.uint8)
    rgb[:, 10:] = (128, 64, 128)
    Image.fromarray(rgb).save(tmp_path / "m" / "a.png")
    (tmp_path / "map.yaml").write_text("colors: {'0,0,0': 0, '128,64,128': 7}\nmap: {0: 0, 7: 1}\nignore: 255\n")
    _build(pair_by_stem(tmp_path / "i", tmp_path / "m"), tmp_path / "p", 20, "shorter", labels=LabelMap.load(tmp_path / "map.yaml"))
    _, msk = SegmentationDataset(tmp_path / "p", as_numpy=True)[0]
    assert (msk[:, :10] == 0).all() and (msk[:, 10:] == 1).all()
    # without colours, an RGB mask is skipped with its reason (the only pair: the build stores nothing and says why)
    with pytest.raises(NothingStored, match="the one sample listed was skipped") as e:
        _build(pair_by_stem(tmp_path / "i", tmp_path / "m"), tmp_path / "q", 20, "shorter")
    assert e.value.summary.splits[0].skipped == {"colour mask": 1}


def _bad_tree(root: Path) -> tuple[Path, Path]:
    i, m = write_segmentation_tree(root, {"train": 5}, sizes=((60, 80),))
    (m / "train" / "scene_0000.png").unlink()  # an image without a mask
    shutil.copy(m / "train" / "scene_0001.png", m / "train" / "orphan.png")  # a mask without an image
    Image.fromarray(np.zeros((61, 80), np.uint8)).save(m / "train" / "scene_0002.png")  # mismatched size
    Image.fromarray(np.full((60, 80), 9, np.uint8)).save(m / "train" / "scene_0003.png")  # class 9 of 5
    (m / "train" / "scene_0004.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 40)  # corrupt
    return i, m


def test_bad_pairs_are_skipped_with_reasons_or_stop_a_strict_build(tmp_path):
    i, m = _bad_tree(tmp_path / "t")
    s = _build(pair_by_stem(i, m), tmp_path / "p", 32, num_classes=5)
    assert s.splits[0].written == 1
    assert s.splits[0].skipped == {"no mask": 1, "no image": 1, "size mismatch": 1, "label out of range": 1, "corrupt data": 1}
    man = json.loads((tmp_path / "p" / "manifest.json").read_text())
    by_reason = {r["reason"]: r for r in man["splits"]["train"]["skipped"]}
    assert by_reason["no image"]["source"] == "train/orphan.png"
    assert "61" in by_reason["size mismatch"]["detail"] and "scene_0002.png" in by_reason["size mismatch"]["detail"]
    with pytest.raises(SourceError, match="no mask"):
        _build(pair_by_stem(i, m), tmp_path / "s", 32, strict=True)
    (m / "train" / "orphan.png").unlink()
    Image.fromarray(np.zeros((60, 80), np.uint8)).save(m / "train" / "scene_0000.png")
    with pytest.raises(ImageDecodeError, match="scene_0002.png"):
        _build(pair_by_stem(i, m), tmp_path / "s2", 32, strict=True, workers=1)
    assert not (tmp_path / "s2" / "manifest.json").exists()


def test_pairs_from_a_mapping_file_and_suffixes(tmp_path):
    i, m = write_segmentation_tree(tmp_path / "t", {"train": 3}, sizes=((50, 60),))
    for p in sorted((m / "train").iterdir()):
        p.rename(p.with_name(p.stem + "_gtFine_labelIds.png"))
    (m / "train" / "scene_0000_gtFine_color.png").write_bytes(b"not a candidate")
    src = pair_by_stem(i, m, mask_suffix="_gtFine_labelIds")
    assert [len(s.paths) for s in src.splits] == [3] and not src.splits[0].unpaired
    csv = tmp_path / "pairs.csv"
    csv.write_text("image,mask,split\ntrain/scene_0002.png,train/scene_0002_gtFine_labelIds.png,val\n"
                   "train/scene_0000.png,train/scene_0000_gtFine_labelIds.png,train\ntrain/gone.png,train/x.png,train\n")
    src = pair_from_file(i, m, csv)
    assert {s.name: s.paths for s in src.splits} == {"train": ["train/scene_0000.png"], "val": ["train/scene_0002.png"]}
    assert src.splits[0].unpaired[0]["reason"] == "no image"
    with pytest.raises(SourceError, match="mapping file"):
        (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
        pair_from_file(i, m, tmp_path / "bad.csv")


def test_joint_transforms_keep_image_and_mask_aligned(scenes, tmp_path):
    _build(pair_by_stem(*scenes), tmp_path / "p", 128, "shorter", "raw")
    t = joint.Compose([joint.RandomCrop(100, mask_fill=255), joint.RandomHorizontalFlip(), joint.RandomVerticalFlip()])
    ds = SegmentationDataset(tmp_path / "p", transform=t, as_numpy=True)
    assert len(ds) == 12  # the loop below checks every train pair
    torch.manual_seed(0)
    crops = set()
    for i in range(len(ds)):
        img, msk = ds[i]
        assert img.shape == (100, 100, 3) and msk.shape == (100, 100)
        inner = _interior(np.where(msk == 255, 0, msk).astype(np.uint8)) & (msk != 255)
        err = np.abs(img.astype(int) - SEG_PALETTE[np.where(msk == 255, 0, msk)].astype(int)).max(-1)
        assert (err[inner] <= 12).mean() >= 0.995
        crops.add(img.tobytes()[:64])
    assert len(crops) > 1
    x, y = SegmentationDataset(tmp_path / "p", transform=joint.CenterCrop(64))[[0, 1, 2]]
    assert x.shape == (3, 3, 64, 64) and y.shape == (3, 64, 64) and y.dtype == torch.uint8


@pytest.mark.parametrize("cache", ["ram", "shm"])
def test_loaders_serve_images_with_their_masks(scenes, tmp_path, cache):
    _build(pair_by_stem(*scenes), tmp_path / "p", 64, "center-crop", "raw")
    ds = SegmentationDataset(tmp_path / "p", cache=cache)
    seen = 0
    with Loader(ds, batch_size=5, num_workers=2) as loader:
        for x, y in loader:
            assert x.shape[1:] == (3, 64, 64) and y.shape[1:] == (64, 64) and y.dtype == torch.uint8
            for k in range(len(x)):
                i = seen + k
                assert torch.equal(x[k], ds[i][0]) and torch.equal(y[k], ds[i][1])
            seen += len(x)
    assert seen == len(ds)
    dl = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2)
    got = torch.cat([y for _, y in dl])
    assert torch.equal(got, torch.stack([ds[i][1] for i in range(len(ds))]))


def test_a_mixture_of_segmentation_packs_serves_each_image_with_its_mask(scenes, tmp_path):
    """Members of a mixed batch fill image and mask each (the image kind's joint fill serves no masks)."""
    from dataprep.serve.mixture import Mixture

    _build(pair_by_stem(*scenes), tmp_path / "p", 64, "center-crop", "raw")
    ds = SegmentationDataset(tmp_path / "p")
    mix = Mixture([SegmentationDataset(tmp_path / "p"), SegmentationDataset(tmp_path / "p")], [0.5, 0.5], seed=1)
    x, y = next(iter(Loader(mix, batch_size=len(mix))))
    member, index, _ = mix.locate(np.arange(len(mix)), 0)
    assert len(set(member.tolist())) == 2
    for k in range(len(mix)):
        assert torch.equal(x[k], ds[int(index[k])][0]) and torch.equal(y[k], ds[int(index[k])][1])


def test_cli_builds_a_segmentation_pack_and_verifies_it(scenes, tmp_path):
    from click.testing import CliRunner

    r = CliRunner().invoke(main, ["build", "segmentation", "--images", str(scenes[0]), "--masks", str(scenes[1]),
                                  "--size", "64", "--out", str(tmp_path / "p"), "--no-progress",
                                  "--labels", str(REPO / "configs" / "labels" / "cityscapes.yaml")])
    assert r.exit_code == 0, r.output
    assert "train: 12 of 12" in r.output
    man = json.loads((tmp_path / "p" / "manifest.json").read_text())
    assert man["kind"] == "segmentation" and man["mask"]["labels"]["name"] == "cityscapes"
    r = CliRunner().invoke(main, ["verify", str(tmp_path / "p"), "--decode"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["info", str(tmp_path / "p")])
    assert "masks:" in r.output and "cityscapes" in r.output
    with pytest.raises(DataprepError, match="segmentation"):
        from dataprep import InMemoryImageDataset

        InMemoryImageDataset(tmp_path / "p")


def test_plan_reports_image_plus_mask_and_the_saving(scenes, tmp_path):
    from click.testing import CliRunner

    _build(pair_by_stem(*scenes), tmp_path / "p", 64, "center-crop", "raw")
    r = CliRunner().invoke(main, ["plan", str(tmp_path / "p"), "-b", "8", "-w", "2", "--prefetch", "2"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert any(line.split()[:5] == ["image", "64x64x3", "uint8", "12.0", "KiB"] for line in lines), r.output
    assert any(line.split()[:5] == ["mask", "64x64", "uint8", "4.0", "KiB"] for line in lines), r.output
    # per batch of 8: (12288 + 4096) x 8 as stored; float32 images + int64 masks: (49152 + 32768) x 8
    assert "per batch of 8: 128.0 KiB   as commonly written: 640.0 KiB" in r.output
    assert "mask          32.0 KiB as uint8, 256.0 KiB as int64" in r.output
    exact = CliRunner().invoke(main, ["plan", str(tmp_path / "p"), "-b", "8", "-w", "2", "--prefetch", "2", "--json"])
    assert '131072' in exact.output.replace(" ", "") and '655360' in exact.output.replace(" ", "")  # exact bytes in JSON


def test_builds_are_byte_identical_across_workers_and_resume(scenes, tmp_path):
    src = pair_by_stem(*scenes)
    settings = dict(size=64, resize="shorter", mode="encoded")
    build_segmentation(src, tmp_path / "a", BuildSettings(workers=1, shard_size=5), ImageSettings(**settings))
    build_segmentation(src, tmp_path / "b", BuildSettings(workers=2, shard_size=5), ImageSettings(**settings))

    def files(p: Path) -> dict[str, bytes]:
        return {str(f.relative_to(p)): f.read_bytes() for f in sorted(p.rglob("*.npy"))}

    assert files(tmp_path / "a") == files(tmp_path / "b") and len(files(tmp_path / "a")) > 20
    shutil.rmtree(tmp_path / "b" / "train" / "00001")
    (tmp_path / "b" / "manifest.json").unlink()
    s = build_segmentation(src, tmp_path / "b", BuildSettings(workers=2, shard_size=5, resume=True), ImageSettings(**settings))
    assert files(tmp_path / "a") == files(tmp_path / "b")
    assert s.splits[0].reused == 2 and s.splits[0].shards == 3


def test_multi_resolution_segmentation_packs(scenes, tmp_path):
    """--sizes: images and masks at every size from one decode, each mask nearest from the full-size one,
    aligned with its image; the dataset switches resolution with its masks."""
    from dataprep.serve.progressive import ResolutionBatchSampler, Schedule

    build_segmentation(pair_by_stem(*scenes), tmp_path / "p",
                       BuildSettings(workers=2), ImageSettings(sizes=(96, 48), resize="center-crop", mode="raw"))
    man = json.loads((tmp_path / "p" / "manifest.json").read_text())
    assert man["resolutions"] == [48, 96] and {"mask@48", "mask@96", "image@48", "image@96"} <= set(man["fields"])
    ds = SegmentationDataset(tmp_path / "p", as_numpy=True, keep_resolutions=2)
    assert len(ds) == 12  # the loop below checks every train pair at each size
    for size in (96, 48):
        ds.use(size)
        for i in range(len(ds)):
            img, msk = ds[i]
            src = np.asarray(Image.open(scenes[1] / ds.mask_sources[i]))
            assert img.shape == (size, size, 3) and msk.shape == (size, size)
            assert set(np.unique(msk).tolist()) <= set(np.unique(src).tolist())
            inner = _interior(msk, 1)
            err = np.abs(img.astype(int) - SEG_PALETTE[msk].astype(int)).max(-1)
            assert (err[inner] <= 12).mean() >= 0.99
    sampler = ResolutionBatchSampler(len(ds), 4, Schedule.table([48, 96], {0: 48, 1: 96}), shuffle=False)
    loader = torch.utils.data.DataLoader(SegmentationDataset(tmp_path / "p"), batch_sampler=sampler)
    x, y = next(iter(loader))
    assert x.shape == (4, 3, 48, 48) and y.shape == (4, 48, 48)
    from click.testing import CliRunner

    r = CliRunner().invoke(main, ["plan", str(tmp_path / "p"), "-b", "2", "-w", "1"])
    assert r.exit_code == 0 and "mask" in r.output and "96x96" in r.output, r.output
    assert CliRunner().invoke(main, ["verify", str(tmp_path / "p")]).exit_code == 0


def test_16_bit_images_with_their_masks(tmp_path):
    """Depth data: 16-bit grey PNGs keep every value with --depth 16, beside their masks."""
    (tmp_path / "i").mkdir(), (tmp_path / "m").mkdir()
    rng = np.random.default_rng(2)
    want = {}
    for k in range(3):
        depth = rng.integers(0, 65536, (30, 40), dtype=np.uint16)
        assert cv2.imwrite(str(tmp_path / "i" / f"{k}.png"), depth)
        Image.fromarray((depth > 30000).astype(np.uint8) * (k + 1)).save(tmp_path / "m" / f"{k}.png")
        want[f"{k}.png"] = depth
    build_segmentation(pair_by_stem(tmp_path / "i", tmp_path / "m"), tmp_path / "p",
                       BuildSettings(workers=1), ImageSettings(size=64, mode="raw", depth=16, grayscale=True))
    ds = SegmentationDataset(tmp_path / "p", as_numpy=True)
    assert len(ds) == 3
    for i in range(len(ds)):
        img, msk = ds[i]
        depth = want[Path(ds.sources[i]).name]
        assert img.dtype == np.uint16 and np.array_equal(img[:, :, 0], depth)
        assert np.array_equal(msk > 0, depth > 30000)
