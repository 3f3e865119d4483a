"""Volume packs: .npy and multi-page TIFF volumes kept at 16 (or 8) bits with their shapes, optional
resampling, VolumeDataset, 3-D transforms."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from dataprep.errors import DataprepError, ImageDecodeError, NothingStored
from dataprep.images.decode import to_depth
from dataprep.serve.loader import Loader
from dataprep.settings import BuildSettings
from dataprep.sources import scan_files
from dataprep.volumes.build import VolumeSettings, build_volumes
from dataprep.volumes.dataset import VolumeDataset
from dataprep.volumes.read import VOLUME_EXTENSIONS, to_stored
from dataprep.volumes.resample import resample
from dataprep.volumes.transforms import RandomCrop3d, RandomFlip3d


def _save_tiff(path: Path, vol: np.ndarray) -> None:
    pages = [Image.fromarray(p) for p in vol]
    pages[0].save(path, save_all=True, append_images=pages[1:])


@pytest.fixture(scope="module")
def vol_tree(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    root = tmp_path_factory.mktemp("vols")
    rng = np.random.default_rng(3)
    want = {}
    for cls in ("ct", "mr"):
        (root / cls).mkdir()
        for k in range(3):
            vol = rng.integers(0, 65536, (6 + k, 20 + 2 * k, 24), dtype=np.uint16)
            name = f"{cls}/v{k}.npy" if k < 2 else f"{cls}/v{k}.tif"
            np.save(root / name, vol) if name.endswith(".npy") else _save_tiff(root / name, vol)
            want[name] = vol
    return root, want


def _build(root, out, workers=2, strict=False, **vs) -> VolumeDataset:
    s = build_volumes(scan_files(root, "train", VOLUME_EXTENSIONS), out,
                      BuildSettings(workers=workers, strict=strict), VolumeSettings(**vs))
    _build.summary = s
    return VolumeDataset(out, as_numpy=True)


def test_npy_and_tiff_volumes_round_trip_exactly_with_labels(vol_tree, tmp_path):
    root, want = vol_tree
    ds = _build(root, tmp_path / "p")
    assert len(ds) == 6 and ds.classes == ["ct", "mr"]
    for i in range(len(ds)):
        vol, label = ds[i]
        src = want[ds.sources[i]]
        assert vol.dtype == np.uint16 and np.array_equal(vol, src), ds.sources[i]
        assert label == ds.classes.index(ds.sources[i].split("/")[0])
        assert tuple(ds.shapes[i]) == src.shape
    for cache in ("mmap", "shm"):
        other = VolumeDataset(tmp_path / "p", cache=cache)
        assert all(torch.equal(other[i][0], torch.from_numpy(ds[i][0])) for i in range(len(ds)))


def test_depth_8_scales_and_windows_map_linearly(vol_tree, tmp_path):
    root, want = vol_tree
    ds = _build(root, tmp_path / "p8", depth=8)
    assert len(ds) == 6  # the loop below checks every volume (none skipped)
    for i in range(len(ds)):
        src = want[ds.sources[i]].astype(np.float64)
        assert np.array_equal(ds[i][0], np.floor(src / 257 + 0.5).astype(np.uint8))
    (tmp_path / "ct").mkdir()
    hu = np.array([-2000, -1000, 0, 500, 1000, 3000], np.int16).reshape(1, 2, 3)
    np.save(tmp_path / "ct" / "scan.npy", hu)
    with pytest.raises(NothingStored) as e:  # its only volume skipped: no pack (tests/test_nothing_stored.py)
        build_volumes(scan_files(tmp_path / "ct", "train", VOLUME_EXTENSIONS), tmp_path / "raw",
                      BuildSettings(workers=1), VolumeSettings())
    assert e.value.summary.splits[0].written == 0 and e.value.summary.splits[0].skipped == {"values out of range": 1}
    ds = _build(tmp_path / "ct", tmp_path / "win", depth=8, window=(-1000.0, 1000.0))
    assert ds[0].ravel().tolist() == [0, 0, 128, 191, 255, 255]  # (x + 1000) * 255 / 2000, rounded, clipped


def test_resampling_to_one_shape(vol_tree, tmp_path):
    root, want = vol_tree
    ds = _build(root, tmp_path / "lin", shape=(4, 10, 12))
    m = json.loads((tmp_path / "lin" / "manifest.json").read_text())
    assert m["fields"]["volume"]["layout"] == "fixed" and m["fields"]["volume"]["shape"] == [4, 10, 12]
    assert len(ds) == 6  # the loop below checks every volume (none skipped)
    for i in range(len(ds)):
        vol, _ = ds[i]
        src = want[ds.sources[i]]
        assert vol.shape == (4, 10, 12) and vol.dtype == np.uint16
        assert _area_error(vol, src) <= 1, ds.sources[i]  # an average, not a pick (exactly: see below)
    labels = np.random.default_rng(0).choice(np.array([0, 3, 9, 400], np.uint16), (7, 13, 17))
    (tmp_path / "lab").mkdir()
    np.save(tmp_path / "lab" / "seg.npy", labels)
    ds = _build(tmp_path / "lab", tmp_path / "near", shape=(14, 6, 20), resample="nearest")
    out = ds[0]
    assert set(np.unique(out).tolist()) <= {0, 3, 9, 400}
    idx = [((2 * np.arange(n) + 1) * m) // (2 * n) for n, m in zip((14, 6, 20), labels.shape)]
    assert np.array_equal(out, labels[np.ix_(*idx)])


def _area_reference(src: np.ndarray, shape: tuple[int, int, int]) -> np.ndarray:
    """Area average computed directly, in float64: output (a, b, c) is the mean of the input box whose side
    along each axis is [floor(i m / n), ceil((i + 1) m / n)) (adaptive average pooling's windows)."""
    win = [[((i * m) // n, -((-(i + 1) * m) // n)) for i in range(n)] for n, m in zip(shape, src.shape)]
    x = src.astype(np.float64)
    out = np.empty(shape, np.float64)
    for a, (d0, d1) in enumerate(win[0]):
        for b, (h0, h1) in enumerate(win[1]):
            for c, (w0, w1) in enumerate(win[2]):
                out[a, b, c] = x[d0:d1, h0:h1, w0:w1].mean()
    return out


def _area_error(vol: np.ndarray, src: np.ndarray) -> float:
    """Largest difference from the exact area average; the code sums in float32 and rounds, so 1 is allowed."""
    return float(np.abs(vol.astype(np.float64) - np.rint(_area_reference(src, vol.shape))).max())


def _nearest_by_centres(vol, shape, mode="linear"):
    """The wrong implementation for the negative control: picks one voxel per output (by centres)."""
    idx = [((2 * np.arange(n) + 1) * m) // (2 * n) for n, m in zip(shape, vol.shape)]
    return np.ascontiguousarray(vol[np.ix_(*idx)])


# Shrinks with whole windows, uneven windows, odd windows (whose centre voxel a pick would hit) and one
# axis kept; the voxels encode their position (an odd multiple of the linear index mod 2^16: all distinct,
# not linear, so no pick equals an average).
_POSITION_CASES = [((8, 12, 16), (4, 6, 8)), ((7, 13, 17), (3, 5, 6)), ((9, 15, 21), (3, 5, 7)),
                   ((6, 10, 11), (6, 4, 5)), ((5, 19, 23), (2, 7, 9)), ((10, 10, 10), (1, 3, 10))]


@pytest.mark.parametrize("impl", ["area", "nearest_by_centres"])
def test_linear_shrink_is_the_exact_area_average(tmp_path, monkeypatch, impl):
    if impl == "nearest_by_centres":  # negative control: the check must fail on every case
        monkeypatch.setattr("dataprep.volumes.build.resample", _nearest_by_centres)
    errors = []
    for k, (src_shape, shape) in enumerate(_POSITION_CASES):
        d = tmp_path / f"c{k}" / "cls"
        d.mkdir(parents=True)
        src = ((np.arange(np.prod(src_shape), dtype=np.int64) * 40503) % 65536).astype(np.uint16).reshape(src_shape)
        np.save(d / "v.npy", src)
        ds = _build(d.parent, tmp_path / f"p{k}", workers=1, shape=shape)
        assert len(ds) == 1 and ds[0][0].shape == shape
        errors.append(_area_error(ds[0][0], src))
    assert len(errors) == len(_POSITION_CASES)
    if impl == "area":
        assert max(errors) <= 1, errors
    else:
        assert min(errors) > 1000, errors


def _centres(i: np.ndarray, n: int, m: int) -> np.ndarray:
    """Source position of output voxel i with voxel centres aligned (align_corners=False), clamped at 0."""
    return np.maximum((i + 0.5) * m / n - 0.5, 0.0)


def _corners(i: np.ndarray, n: int, m: int) -> np.ndarray:
    """The wrong mapping for a negative control: first and last voxels aligned (align_corners=True)."""
    return i * (m - 1) / max(n - 1, 1)


def _trilinear_reference(src: np.ndarray, shape: tuple[int, int, int], where=_centres) -> np.ndarray:
    """Trilinear interpolation written out per output voxel, in float64: the 8 source voxels around its
    source position (`where`, per axis; the upper neighbour clamped at the last voxel), each weighted by the
    product of its three linear weights."""
    x = src.astype(np.float64)
    pos = [where(np.arange(n, dtype=np.float64), n, m) for n, m in zip(shape, src.shape)]
    out = np.empty(shape, np.float64)
    for a, b, c in np.ndindex(*shape):
        p = (pos[0][a], pos[1][b], pos[2][c])
        lo = [min(int(np.floor(v)), m - 1) for v, m in zip(p, src.shape)]
        hi = [min(k + 1, m - 1) for k, m in zip(lo, src.shape)]
        t = [v - k for v, k in zip(p, lo)]
        total = 0.0
        for dz, dy, dx in np.ndindex(2, 2, 2):
            w = (t[0] if dz else 1 - t[0]) * (t[1] if dy else 1 - t[1]) * (t[2] if dx else 1 - t[2])
            total += w * x[(hi if dz else lo)[0], (hi if dy else lo)[1], (hi if dx else lo)[2]]
        out[a, b, c] = total
    return out


def _rounded(ref: np.ndarray, dtype) -> np.ndarray:
    """Rounded to the nearest stored value (halves to even: whole factors of 2 make exact halves), clipped."""
    return np.rint(ref).clip(0, np.iinfo(dtype).max)


# Volumes smaller than the target: every axis grows (by whole and by uneven factors), one axis kept, and
# one grows while another shrinks (still trilinear: only a shrink on every axis is an area average).
_UPSAMPLE_CASES = [((3, 4, 5), (7, 9, 11)), ((2, 5, 3), (5, 5, 8)), ((4, 6, 6), (8, 12, 18)), ((6, 4, 8), (3, 9, 8))]
_WRONG_UPSAMPLERS = {
    "nearest": lambda vol, shape, mode="linear": resample(vol, shape, "nearest"),
    "align_corners": lambda vol, shape, mode="linear": _rounded(_trilinear_reference(vol, shape, _corners), vol.dtype).astype(vol.dtype),
}


@pytest.mark.parametrize("impl", ["trilinear", *_WRONG_UPSAMPLERS])
def test_linear_upsampling_is_trilinear_with_centres_aligned(tmp_path, monkeypatch, impl):
    """A volume smaller than --shape is built to exactly the trilinear interpolation computed here (float64,
    per voxel); the code works in float32 one axis at a time, so a voxel may round the other way (1 off).
    Negative controls: nearest sampling and corner-aligned trilinear, patched in, fail the same check."""
    if impl != "trilinear":
        monkeypatch.setattr("dataprep.volumes.build.resample", _WRONG_UPSAMPLERS[impl])
    rng = np.random.default_rng(11)
    worst, off = [], []  # per case: the largest difference, and the fraction of voxels not equal
    for k, (src_shape, shape) in enumerate(_UPSAMPLE_CASES):
        d = tmp_path / f"c{k}" / "cls"
        d.mkdir(parents=True)
        src = rng.integers(0, 65536, src_shape, dtype=np.uint16)
        np.save(d / "v.npy", src)
        ds = _build(d.parent, tmp_path / f"p{k}", workers=1, shape=shape)
        assert len(ds) == 1 and ds[0][0].shape == shape and ds[0][0].dtype == np.uint16
        diff = np.abs(ds[0][0].astype(np.float64) - _rounded(_trilinear_reference(src, shape), np.uint16))
        worst.append(float(diff.max()))
        off.append(float((diff > 0).mean()))
    assert len(worst) == len(_UPSAMPLE_CASES)
    if impl == "trilinear":  # measured: at most 1 off, in under 1% of voxels
        assert max(worst) <= 1 and max(off) <= 0.02, (worst, off)
    else:  # measured: nearest 26904-38608 off in 90-100% of voxels, corner-aligned 12084-29232 in 85-100%
        assert min(worst) > 1000 and min(off) > 0.5, (worst, off)


def _window_8_bits_widened(arr, depth, window, path):
    """The wrong implementation for the negative control: the window mapped onto 0..255, then widened to 16 bits."""
    return to_depth(to_stored(arr, 8, window, path), depth)


@pytest.mark.parametrize("impl", ["right", "window_at_8_bits"])
def test_window_with_depth_16_maps_onto_every_16_bit_value(tmp_path, monkeypatch, impl):
    """`build volumes --window LO,HI` (depth 16, the default) on float CT numbers: each voxel becomes
    round((x - LO) * 65535 / (HI - LO)), clipped to 0..65535, exactly (computed here in float64)."""
    from click.testing import CliRunner

    from dataprep.cli import main

    if impl == "window_at_8_bits":
        monkeypatch.setattr("dataprep.volumes.build.to_stored", _window_8_bits_widened)
    (tmp_path / "src").mkdir()
    rng = np.random.default_rng(4)
    ct = rng.uniform(-1500, 1500, (5, 6, 7)).astype(np.float32)
    ct.flat[:4] = (-1000.0, 1000.0, -1500.0, 2500.0)  # both ends of the window, and beyond them
    np.save(tmp_path / "src" / "scan.npy", ct)
    r = CliRunner().invoke(main, ["build", "volumes", str(tmp_path / "src"), "--out", str(tmp_path / "p"),
                                  "--window=-1000,1000", "-j", "1", "--no-progress"])
    assert r.exit_code == 0, r.output
    m = json.loads((tmp_path / "p" / "manifest.json").read_text())
    assert m["fields"]["volume"]["dtype"] == "<u2" and m["settings"]["volume"]["window"] == [-1000.0, 1000.0]
    scaled = (ct.astype(np.float64) + 1000) * 65535 / 2000
    assert np.abs(scaled - np.floor(scaled) - 0.5).min() > 1e-6  # no voxel halfway between two values
    want = np.floor(scaled + 0.5).clip(0, 65535).astype(np.uint16)
    assert want.flat[:4].tolist() == [0, 65535, 0, 65535] and int((want % 257 != 0).sum()) > 100  # not 8-bit values x 257
    got = VolumeDataset(tmp_path / "p", as_numpy=True)[0]
    assert got.dtype == np.uint16 and got.shape == ct.shape
    err = int(np.abs(got.astype(np.int64) - want).max())
    assert (err == 0) if impl == "right" else (err > 0), err  # the 8-bit window is off by up to 128


def test_bad_volumes_are_skipped_with_reasons(tmp_path):
    d = tmp_path / "bad"
    d.mkdir()
    np.save(d / "good.npy", np.ones((2, 3, 4), np.uint8))
    np.save(d / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    np.save(d / "four_d.npy", np.zeros((2, 3, 4, 5), np.uint8))
    np.save(d / "floats.npy", np.zeros((2, 3, 4), np.float32))
    (d / "broken.tif").write_bytes(b"II*\x00" + b"\x00" * 20)
    (d / "cut.npy").write_bytes((d / "good.npy").read_bytes()[:-5])
    ds = _build(d, tmp_path / "p", workers=1)
    assert len(ds) == 1 and ds.sources[0] == "good.npy"
    assert _build.summary.splits[0].skipped == {"not a volume": 2, "values out of range": 1, "corrupt data": 1, "truncated": 1}
    with pytest.raises(ImageDecodeError):
        _build(d, tmp_path / "s", workers=1, strict=True)
    assert not (tmp_path / "s" / "manifest.json").exists()
    with pytest.raises(DataprepError, match="window"):
        VolumeSettings(window=(5.0, 1.0))


def test_volume_dataset_serves_batches_and_3d_transforms(vol_tree, tmp_path):
    root, _ = vol_tree
    _build(root, tmp_path / "p", shape=(4, 16, 16))
    ds = VolumeDataset(tmp_path / "p", cache="shm")
    seen = 0
    with Loader(ds, batch_size=4, num_workers=2) as loader:
        for v, y in loader:
            assert v.shape[1:] == (4, 16, 16) and v.dtype == torch.uint16
            for k in range(len(v)):
                assert torch.equal(v[k], ds[seen + k][0]) and int(y[k]) == ds[seen + k][1]
            seen += len(v)
    assert seen == len(ds)
    varied = _build(root, tmp_path / "v")  # each volume its own shape: the Loader center-crops
    with Loader(VolumeDataset(tmp_path / "v"), batch_size=3, crop=(5, 18, 18)) as loader:
        v, _ = next(iter(loader))
    assert v.shape == (3, 5, 18, 18)
    for k in range(3):
        src = torch.from_numpy(varied.volume(k))
        d, h, w = src.shape
        a, b, c = (d - 5) // 2, (h - 18) // 2, (w - 18) // 2
        assert torch.equal(v[k], src[a : a + 5, b : b + 18, c : c + 18])
    vol = varied.volume(0)
    torch.manual_seed(1)
    a, b = RandomCrop3d((3, 8, 8))(vol, vol.copy())
    assert np.array_equal(a, b) and a.shape == (3, 8, 8)
    a, b = RandomFlip3d(p=1.0)(vol, vol.copy())
    assert np.array_equal(a, vol[::-1, ::-1, ::-1]) and np.array_equal(a, b)


def test_unlabelled_volumes_and_the_cli(tmp_path):
    from click.testing import CliRunner

    from dataprep.cli import main

    for k in range(3):
        np.save(tmp_path / f"s{k}.npy", np.full((3, 4, 5), k * 1000, np.uint16))
    r = CliRunner().invoke(main, ["build", "volumes", str(tmp_path), "--out", str(tmp_path / "p"), "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "3 of 3 volumes written" in r.output
    ds = VolumeDataset(tmp_path / "p")
    assert ds.labels is None and isinstance(ds[0], torch.Tensor) and ds[0].dtype == torch.uint16
    assert int(ds[2].float().max()) == 2000  # torch has few uint16 kernels: convert before arithmetic
    r = CliRunner().invoke(main, ["plan", str(tmp_path / "p"), "-b", "2", "-w", "1"])
    assert r.exit_code == 0 and "volume" in r.output and "3x4x5 uint16" in r.output.replace("  ", " ")
    r = CliRunner().invoke(main, ["build", "volumes", str(tmp_path), "--out", str(tmp_path / "q"), "--shape", "1,2"])
    assert r.exit_code == 2 and "D,H,W" in r.output


def _scan_pairs(root: Path) -> tuple[Path, Path]:
    """Scans whose intensity is 1000 x their label, and the label volumes (a label above 255 among them)."""
    rng = np.random.default_rng(5)
    for cls in ("a", "b"):
        (root / "scans" / cls).mkdir(parents=True)
        (root / "labels" / cls).mkdir(parents=True)
    ids = np.array([0, 2, 5, 300], np.uint16)
    for k in range(5):
        cls = "ab"[k % 2]
        lab = np.zeros((8 + k, 24, 20), np.uint16)
        for _ in range(4):  # boxes of random classes
            z, y, x = (int(rng.integers(0, n - 3)) for n in lab.shape)
            lab[z : z + 6, y : y + 12, x : x + 10] = ids[int(rng.integers(0, 4))]
        np.save(root / "scans" / cls / f"s{k}.npy", (lab.astype(np.int32) * 100).astype(np.uint16))
        np.save(root / "labels" / cls / f"s{k}.npy", lab)
    np.save(root / "scans" / "a" / "orphan.npy", np.zeros((4, 4, 4), np.uint16))  # no label volume
    np.save(root / "scans" / "b" / "odd.npy", np.zeros((4, 4, 4), np.uint16))
    np.save(root / "labels" / "b" / "odd.npy", np.zeros((4, 4, 5), np.uint8))  # another shape
    return root / "scans", root / "labels"


def test_label_volumes_stay_aligned_and_keep_their_values(tmp_path):
    scans, labels = _scan_pairs(tmp_path)
    s = build_volumes(scan_files(scans, "train", VOLUME_EXTENSIONS), tmp_path / "p", BuildSettings(workers=2),
                      VolumeSettings(shape=(6, 16, 16)), masks=labels)
    assert s.splits[0].written == 5 and s.splits[0].skipped == {"no mask": 1, "size mismatch": 1}
    m = json.loads((tmp_path / "p" / "manifest.json").read_text())
    assert m["fields"]["volume_mask"]["dtype"] == "<u2"  # a label of 300 was found
    ds = VolumeDataset(tmp_path / "p", as_numpy=True)
    for i in range(len(ds)):
        vol, mask, label = ds[i]
        src = np.load(labels / ds.sources[i])
        assert mask.shape == vol.shape == (6, 16, 16) and mask.dtype == np.uint16
        assert label == ds.classes.index(ds.sources[i].split("/")[0])
        idx = [((2 * np.arange(n) + 1) * s_) // (2 * n) for n, s_ in zip(mask.shape, src.shape)]
        assert np.array_equal(mask, src[np.ix_(*idx)])  # nearest by voxel centres, values never blended
        # alignment: where the source labels under an output voxel's averaging window are one class, the
        # averaged scan there is exactly 100 x the nearest-sampled label
        checked = 0
        for z, y, x in np.ndindex(*mask.shape):
            win = src[tuple(slice(i * n // o, -(-(i + 1) * n // o)) for i, n, o in zip((z, y, x), src.shape, mask.shape))]
            if (win == win.flat[0]).all():
                assert mask[z, y, x] == win.flat[0] and abs(int(vol[z, y, x]) - 100 * int(win.flat[0])) <= 1
                checked += 1
        assert checked > mask.size // 2
    torch.manual_seed(0)
    t = VolumeDataset(tmp_path / "p", transform=lambda v, m: RandomFlip3d(p=1.0)(*RandomCrop3d((4, 8, 8))(v, m)), as_numpy=True)
    v, mk, _ = t[0]
    assert v.shape == mk.shape == (4, 8, 8) and np.all((v.astype(int) - mk.astype(int) * 100) ** 2 < 200 ** 2)
    with Loader(VolumeDataset(tmp_path / "p"), batch_size=2, num_workers=2) as loader:
        batches = list(loader)
    assert [tuple(b[1].shape) for b in batches][0] == (2, 6, 16, 16) and sum(len(b[0]) for b in batches) == 5
    assert torch.equal(batches[0][1][1], torch.from_numpy(ds[1][1]))
    from click.testing import CliRunner

    from dataprep.cli import main

    r = CliRunner().invoke(main, ["plan", str(tmp_path / "p"), "-b", "2", "-w", "1"])
    assert r.exit_code == 0 and "6x16x16 uint16" in " ".join(r.output.split()), r.output
    r = CliRunner().invoke(main, ["build", "volumes", str(scans), "--masks", str(labels), "--out", str(tmp_path / "s"), "--strict"])
    assert r.exit_code == 1 and "no mask" in r.output


def test_linear_resampling_matches_torch_interpolate():
    """Building needs no torch, so volumes are resampled in numpy; the result is torch's own `interpolate`
    ("area" when shrinking, trilinear with align_corners=False otherwise) up to float32 rounding: no voxel
    off by more than 1, at least 99% equal. Negative controls: nearest sampling and a one-voxel shift fail."""
    import torch.nn.functional as F

    from dataprep.volumes.resample import resample

    def torch_ref(vol, shape):
        x = torch.from_numpy(vol.astype(np.float32))[None, None]
        if all(n <= m for n, m in zip(shape, vol.shape)):
            y = F.interpolate(x, size=shape, mode="area")
        else:
            y = F.interpolate(x, size=shape, mode="trilinear", align_corners=False)
        return np.rint(y[0, 0].numpy()).clip(0, np.iinfo(vol.dtype).max).astype(np.int64)

    rng = np.random.default_rng(7)
    equal = total = 0
    near_equal = shift_equal = 0
    for k in range(24):
        src = tuple(int(v) for v in rng.integers(4, 30, 3))
        dst = tuple(max(1, s // 3 + 1) for s in src) if k % 2 else tuple(int(v) for v in rng.integers(2, 40, 3))
        if k % 3 == 0:
            dst = tuple(s // 2 for s in src)  # whole windows: the reshape path
        vol = (np.add.outer(np.add.outer(np.arange(src[0]) * 5, np.arange(src[1]) * 3), np.arange(src[2]) * 7)
               + rng.integers(0, 40, src)).astype(np.uint16 if k % 2 else np.uint8)
        ours, ref = resample(vol, dst).astype(np.int64), torch_ref(vol, dst)
        assert np.abs(ours - ref).max() <= 1, (src, dst)
        equal += int((ours == ref).sum())
        total += ours.size
        near_equal += int((resample(vol, dst, "nearest").astype(np.int64) == ref).sum())
        shift_equal += int((np.roll(ours, 1, axis=2) == ref).sum())
    assert equal >= 0.99 * total
    assert near_equal < 0.9 * total and shift_equal < 0.9 * total
