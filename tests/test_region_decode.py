"""The fast decode path of training crops: region JPEGs cut from restart segments decode to exactly the
whole image's pixels there (every scale, grey and colour, widths that are no multiple of an MCU); the
Loader's fast crops equal the same arithmetic on the whole fast-decoded image; JPEGs that cannot be cut
are decoded whole; and the pixel cost of the fast IDCT and upsampling against the accurate decode,
stated as PSNR floors that a swapped colour order or a skipped chroma upsampling fails."""
from __future__ import annotations

import glob
import math
from dataclasses import replace

import cv2
import numpy as np
import pytest

import dataprep
from dataprep.images import batches, codec
from dataprep.images.build import build_images
from dataprep.images.codec import (
    compiled,
    decode_cv2,
    decode_fast,
    encode_jpeg,
    jpeg_layout,
    region_jpeg,
    region_of,
    restart_interval,
)
from dataprep.images.crops import RandomResizedCrop
from dataprep.images.settings import ImageSettings
from dataprep.serve.loader import Loader
from dataprep.settings import BuildSettings
from dataprep.sources import scan_imagenet
from dataprep.synthetic import write_tree

from .conftest import corpus_dir


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return 99.0 if mse == 0 else 10 * math.log10(255 ** 2 / mse)


def photo(h: int, w: int, seed: int) -> np.ndarray:
    """Smooth colour gradients plus texture and edges: what JPEG and chroma subsampling act on."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.stack([128 + 100 * np.sin(x / (7 + seed) + y / 23), 128 + 90 * np.cos(y / (5 + seed)), (x * 3 + y * 2) % 256], -1)
    img += rng.normal(0, 12, img.shape)
    img[h // 3 : h // 2, w // 4 : w // 2] = (250, 20, 40)  # a saturated block: sharp chroma edges
    return np.clip(img, 0, 255).astype(np.uint8)


@pytest.mark.parametrize("h,w", [(37, 53), (64, 64), (129, 347), (256, 341), (200, 23 * 16 + 5)])
@pytest.mark.parametrize("channels", [3, 1])
def test_a_region_decodes_to_the_whole_images_pixels(h, w, channels):
    px = photo(h, w, h % 7)
    if channels == 1:
        px = cv2.cvtColor(px, cv2.COLOR_RGB2GRAY)[:, :, None]
    buf = encode_jpeg(px, 90)
    lay = jpeg_layout(buf)
    assert lay is not None and (lay.height, lay.width) == (h, w)
    assert lay.interval == restart_interval(w, lay.mcu_w) and lay.columns * lay.interval * lay.mcu_w >= w
    rng = np.random.default_rng(h * w)
    for factor in (1, 2, 4, 8):
        whole = decode_fast(buf, channels, factor)
        assert whole.shape == (-(-h // factor), -(-w // factor), channels)
        for _ in range(12):
            y0, y1 = sorted(int(v) for v in rng.integers(0, h, 2))
            x0, x1 = sorted(int(v) for v in rng.integers(0, w, 2))
            sub, top, left = region_jpeg(buf, lay, y0, y1 + 1, x0, x1 + 1)
            assert top <= y0 and left <= x0 and top % lay.mcu_h == 0 and left % (lay.interval * lay.mcu_w) == 0
            part = decode_fast(sub, channels, factor)
            assert part is not None
            assert top + part.shape[0] * factor >= y1 + 1 or top + part.shape[0] * factor >= h  # the region is covered
            assert left + part.shape[1] * factor >= x1 + 1 or left + part.shape[1] * factor >= w
            ref = whole[top // factor : top // factor + part.shape[0], left // factor : left // factor + part.shape[1]]
            assert np.array_equal(part, ref), (factor, y0, y1, x0, x1)
            if factor == 1 and part.shape[0] < h:  # negative control: the origin one MCU row off is not the region
                wrong = whole[top + lay.mcu_h : top + lay.mcu_h + part.shape[0], left : left + part.shape[1]]
                assert wrong.shape != part.shape or not np.array_equal(part, wrong)


def test_jpegs_that_cannot_be_cut_are_refused_by_the_layout():
    px = photo(96, 128, 1)
    plain = cv2.imencode(".jpg", px)[1].reshape(-1)  # no restart markers: decoded whole
    assert jpeg_layout(plain) is None
    progressive = cv2.imencode(".jpg", px, [cv2.IMWRITE_JPEG_PROGRESSIVE, 1, cv2.IMWRITE_JPEG_RST_INTERVAL, 4])[1].reshape(-1)
    assert jpeg_layout(progressive) is None
    odd = cv2.imencode(".jpg", px, [cv2.IMWRITE_JPEG_RST_INTERVAL, 3])[1].reshape(-1)  # 3 does not divide 8 MCUs a row
    assert jpeg_layout(odd) is None
    good = encode_jpeg(px, 90)
    assert jpeg_layout(good) is not None
    for cut in (10, len(good) // 2, len(good) - 3):  # truncated: the marker count no longer adds up
        assert jpeg_layout(good[:cut]) is None
    garbage = good.copy()
    garbage[len(good) // 2 : len(good) // 2 + 200] = 0xFF  # a run of 0xFF bytes in the entropy data
    assert jpeg_layout(garbage) is None or decode_fast(region_jpeg(garbage, jpeg_layout(garbage), 0, 8, 0, 8)[0], 3) is not None
    assert jpeg_layout(np.zeros(0, np.uint8)) is None and jpeg_layout(np.frombuffer(b"\xff\xd8\xff", np.uint8)) is None


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    base = tmp_path_factory.mktemp("region")
    tree = write_tree(base / "src", classes=2, per_class=5, sizes=((600, 800), (800, 640), (700, 701)))
    out = {}
    for name, image in {"jpeg": dict(size=512), "multi": dict(sizes=(128, 256, 512)), "grey": dict(size=200, grayscale=True)}.items():
        build_images(scan_imagenet(tree), base / name, BuildSettings(shard_size=5), ImageSettings(**image))
        out[name] = base / name
    small = write_tree(base / "small", classes=2, per_class=4, sizes=((300, 400), (300, 300)))  # 300 px: kept as they are
    from PIL import Image

    for k, f in enumerate(sorted(small.rglob("*.JPEG"))[::3]):  # some of them progressive: kept without markers
        with Image.open(f) as im:
            im.load()
        im.save(f.with_name(f"prog{k}.JPEG"), quality=90, progressive=True)
        f.unlink()
    build_images(scan_imagenet(small), base / "kept", BuildSettings(shard_size=4), ImageSettings(size=300))
    out["kept"], out["kept_src"] = base / "kept", small
    return out


def test_kept_source_jpegs_get_restart_markers_and_progressive_ones_are_decoded_whole(packs, monkeypatch):
    """A source JPEG the build keeps is given restart markers losslessly (images/_jpegseg.c), so its crops
    are region-decoded like any other; a progressive one cannot be, and is decoded whole, fast."""
    ds = dataprep.InMemoryImageDataset(packs["kept"])
    files = [str(packs["kept_src"] / p) for p in ds.sources]
    progressive = [i for i, f in enumerate(files) if "prog" in f]
    assert 0 < len(progressive) < len(ds)
    for i in range(len(ds)):
        stored = np.asarray(ds.stored(i))
        source = np.fromfile(files[i], np.uint8)
        assert np.array_equal(decode_cv2(stored, 3), decode_cv2(source, 3))  # the same pixels as the file
        has_markers = jpeg_layout(stored) is not None
        assert has_markers == (compiled() and i not in progressive), (files[i], has_markers)
    seen = []
    real = batches.decode_fast
    monkeypatch.setattr(batches, "decode_fast", lambda buf, *a: seen.append(len(buf)) or real(buf, *a))
    got = crops_of(ds, 96, 0)
    whole = {len(ds.stored(i)) for i in progressive}
    assert whole <= set(seen)  # progressive files: each whole, through the fast decoder
    if compiled():
        assert sum(n not in whole for n in seen) == len(ds) - len(progressive)
        assert min(n for n in seen if n not in whole) < min(len(ds.stored(i)) for i in range(len(ds)) if i not in progressive)
    acc = crops_of(dataprep.InMemoryImageDataset(packs["kept"], decode="accurate"), 96, 0)
    assert not np.array_equal(got, acc) and np.median([psnr(a, b) for a, b in zip(got, acc)]) > 30  # same crops, other decoder


def crops_of(ds, size, seed):
    x, _ = next(iter(Loader(ds, len(ds), crop=RandomResizedCrop(size, scale=(0.05, 1.0)), flip=True, seed=seed, layout="nhwc")))
    return x.numpy()


@pytest.mark.parametrize("name,resolution,size", [("jpeg", None, 224), ("jpeg", None, 64), ("multi", "all", 96), ("grey", None, 48),
                                                   ("kept", None, 96)])
@pytest.mark.parametrize("pure", [False, True])
def test_fast_crops_equal_the_whole_image_decoded_fast_and_cut_alike(packs, monkeypatch, name, resolution, size, pure):
    """Every path (full, 1/2 ... decodes, smaller stored copies) over four epochs of random boxes: the region
    decode changes nothing but the bytes read, cut in C or in Python (`pure`)."""
    if not pure and not compiled():
        pytest.skip("images/_jpegseg.c is not built here (setup.py builds it where a C compiler is)")
    cut = (lambda buf, *box: region_of(buf, *box, pure=True)) if pure else region_of
    monkeypatch.setattr(batches, "region_of", cut)
    ds = dataprep.InMemoryImageDataset(packs[name], resolution=resolution)
    assert ds.decode == "fast"
    got = [crops_of(ds, size, seed) for seed in range(4)]
    taken = dict(ds.decode_paths)
    monkeypatch.setattr(batches, "region_of", lambda buf, *box: (*cut(buf, *box)[:2], None, 0, 0))  # the whole image, every time
    whole = [crops_of(ds, size, seed) for seed in range(4)]
    assert all(np.array_equal(a, b) for a, b in zip(got, whole))
    if name in ("jpeg", "multi"):
        assert len(taken) > 1, taken  # more than one path was exercised
    monkeypatch.setattr(batches, "region_of", lambda buf, y0, y1, x0, x1: cut(buf, y0, y1 - 32, x0, x1))
    shaved = [crops_of(ds, size, seed) for seed in range(4)]  # negative control: a region short of the box's last rows
    assert not all(np.array_equal(a, b) for a, b in zip(shaved, whole))


def test_accurate_crops_and_samples_do_not_take_the_fast_path(packs, monkeypatch):
    called = []
    monkeypatch.setattr(batches, "decode_fast", lambda *a, **k: called.append(1))
    acc = dataprep.InMemoryImageDataset(packs["jpeg"], decode="accurate")
    crops_of(acc, 64, 0)
    fast = dataprep.InMemoryImageDataset(packs["jpeg"])
    x, _ = next(iter(Loader(fast, len(fast), crop=dataprep.CenterCrop(224), layout="nhwc")))  # evaluation crops: accurate
    fast[0]  # a sample read alone: accurate
    assert not called
    crops_of(fast, 64, 0)  # the patched decoder gives None: the accurate path serves the crop
    assert len(called) == len(fast)


def test_training_crops_take_the_path_the_decode_entry_names_not_its_name(packs, monkeypatch):
    """A dataset asks its decode= value's registry entry (codec.DECODE_VARIANTS), looked up once when it is made,
    whether training crops decode the box's restart segments: "fast"'s entry under another name cuts regions,
    and "fast" registered without `region_crops` decodes whole images."""
    monkeypatch.setitem(codec.DECODE_VARIANTS, "boxes", replace(codec.DECODE_VARIANTS["fast"], name="boxes"))
    monkeypatch.setitem(codec.DECODERS, "boxes", codec.DECODERS["fast"])
    boxes = dataprep.InMemoryImageDataset(packs["jpeg"], decode="boxes")
    crops_of(boxes, 64, 0)
    assert any(k.startswith("region ") for k in boxes.decode_paths), boxes.decode_paths
    assert all(k.startswith(("region ", "fast ")) for k in boxes.decode_paths), boxes.decode_paths
    monkeypatch.setitem(codec.DECODE_VARIANTS, "fast", replace(codec.DECODE_VARIANTS["fast"], region_crops=False))
    whole = dataprep.InMemoryImageDataset(packs["jpeg"])
    crops_of(whole, 64, 0)
    assert whole.decode_paths and not any(k.startswith(("region ", "fast ")) for k in whole.decode_paths), whole.decode_paths


def fast_vs_accurate(images) -> dict[str, np.ndarray]:
    """PSNR of the fast decode (and of two plausible wrong decoders) against the accurate one."""
    out = {"fast": [], "bgr": [], "chroma": []}
    for px in images:
        buf = encode_jpeg(px, 90)
        acc, fast = decode_cv2(buf, 3), decode_fast(buf, 3)
        out["fast"].append(psnr(fast, acc))
        out["bgr"].append(psnr(fast[:, :, ::-1], acc))  # a wrong colour order
        ycc = cv2.cvtColor(fast, cv2.COLOR_RGB2YCrCb)  # chroma not upsampled (kept at a quarter and replicated)
        chroma = np.repeat(np.repeat(ycc[::4, ::4, 1:], 4, 0), 4, 1)[: ycc.shape[0], : ycc.shape[1]]
        ycc[:, :, 1:] = chroma
        out["chroma"].append(psnr(cv2.cvtColor(ycc, cv2.COLOR_YCrCb2RGB), acc))
    return {k: np.array(v) for k, v in out.items()}


def check_floors(scores, median_floor, p5_floor):
    assert np.median(scores["fast"]) >= median_floor and np.percentile(scores["fast"], 5) >= p5_floor, scores["fast"]
    for wrong in ("bgr", "chroma"):  # negative controls: each plausible wrong decoder fails a floor
        assert np.median(scores[wrong]) < median_floor or np.percentile(scores[wrong], 5) < p5_floor, (wrong, scores[wrong])


def test_fast_decoding_costs_little_against_the_accurate_one_on_generated_images():
    """Noisy gradients are harder on the fast IDCT than photos are: median 31.9 dB, 5th percentile 31.0
    measured (photos: 43-45 dB, below); a swapped colour order gives 9 dB, chroma left at a quarter 23.5."""
    check_floors(fast_vs_accurate([photo(h, w, s) for s, (h, w) in enumerate([(256, 341), (300, 256), (256, 256), (512, 683)] * 3)]),
                 30.5, 29.5)


@pytest.mark.parametrize("size", [256, 512])
def test_fast_decoding_costs_little_against_the_accurate_one_on_the_corpus(size):
    """Measured on the corpus (356 photos, q90): median 43.4 dB at 256 px and 44.6 at 512, 5th percentile
    37.3 and 40.5 (docs/benchmarks.md, "Fast decoding"); the floors sit a dB or so under them."""
    files = sorted(glob.glob(str(corpus_dir("images") / "**" / "*.JPEG"), recursive=True))[:120]
    images = []
    for f in files:
        img = cv2.imread(f, cv2.IMREAD_COLOR_RGB)
        if img is None:
            continue
        s = size / min(img.shape[:2])
        images.append(cv2.resize(img, (max(1, round(img.shape[1] * s)), max(1, round(img.shape[0] * s))), interpolation=cv2.INTER_AREA))
    check_floors(fast_vs_accurate(images), 42.0, 36.0)


def test_damaged_jpegs_give_none_or_pixels_never_a_crash():
    """Flipped bytes, cut files and forged markers through the layout, the cut and the fast decoder: each
    step either refuses (None) or gives a JPEG the decoder reads or refuses; nothing raises past them."""
    good = encode_jpeg(photo(80, 112, 3), 90)
    rng = np.random.default_rng(7)
    outcomes = {"refused": 0, "decoded": 0}
    for k in range(300):
        bad = good.copy()
        at = rng.integers(2, len(bad), rng.integers(1, 6))
        bad[at] = rng.integers(0, 256, len(at)) if k % 3 else 0xD0 + rng.integers(0, 8, len(at))  # noise, or forged RSTs
        if k % 10 == 0:
            bad = bad[: rng.integers(4, len(bad))]
        lay = jpeg_layout(bad)
        if lay is None:
            outcomes["refused"] += 1
            continue
        sub, _, _ = region_jpeg(bad, lay, 8, 60, 16, 90)
        img = decode_fast(sub, 3)
        outcomes["decoded" if img is not None else "refused"] += 1
        if img is not None:
            assert img.ndim == 3 and img.shape[0] <= 80 and img.shape[1] <= 112
    assert outcomes["refused"] and outcomes["decoded"], outcomes  # both branches were exercised
