"""Storage backends: one conformance suite run against npy, HDF5 and Zarr (plain and compressed): the
same arrays, the same samples through every dataset class, exact round trips, and damaged files."""
from __future__ import annotations

import filecmp
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("h5py", reason="needs h5py (a dependency of dataprep: pip install h5py)")

from dataprep import DetectionDataset, InMemoryImageDataset, SegmentationDataset, TabularDataset, TokenDataset, VolumeDataset  # noqa: E402
from dataprep import build as front_door  # noqa: E402
from dataprep.cli import main  # noqa: E402
from dataprep.detection.scenes import write_scenes  # noqa: E402
from dataprep.errors import PackError  # noqa: E402
from dataprep.images.build import build_images  # noqa: E402
from dataprep.images.settings import ImageSettings  # noqa: E402
from dataprep.pack.backends import detect, open_reader  # noqa: E402
from dataprep.pack.convert import convert  # noqa: E402
from dataprep.segmentation.build import build_segmentation  # noqa: E402
from dataprep.segmentation.pairs import pair_by_stem  # noqa: E402
from dataprep.settings import BuildSettings  # noqa: E402
from dataprep.sources import scan_files, scan_imagenet  # noqa: E402
from dataprep.synthetic import write_segmentation_tree  # noqa: E402
from dataprep.verify import verify_pack  # noqa: E402
from dataprep.volumes.build import VolumeSettings, build_volumes  # noqa: E402
from dataprep.volumes.read import VOLUME_EXTENSIONS  # noqa: E402


def _has_zarr_3() -> bool:
    try:
        import zarr
    except ImportError:
        return False
    return int(zarr.__version__.split(".")[0]) >= 3


# Only the tests (and parametrisations) that touch Zarr skip without it (Python 3.10 has no zarr 3): HDF5 runs.
needs_zarr = pytest.mark.skipif(not _has_zarr_3(), reason="needs zarr 3, which needs Python 3.11+ (pip install 'zarr>=3')")


def _zarr(*values):
    return pytest.param(*values, marks=needs_zarr)


VARIANTS = [("hdf5", "none"), ("hdf5", "gzip"), _zarr("zarr", "none"), _zarr("zarr", "zstd"), _zarr("zarr", "blosc")]


def _run(*args):
    from click.testing import CliRunner

    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def npy_packs(tmp_path_factory, index_tree) -> dict[str, Path]:
    """One npy pack of every kind."""
    base = tmp_path_factory.mktemp("backends")
    packs = {}
    packs["encoded"] = base / "encoded"
    build_images(scan_imagenet(index_tree), packs["encoded"], BuildSettings(workers=1, shard_size=5), ImageSettings(size=40))
    packs["multires"] = base / "multires"
    build_images(scan_imagenet(index_tree), packs["multires"],
                 BuildSettings(workers=1, shard_size=4), ImageSettings(sizes=(24, 40), resize="center-crop", mode="raw"))
    i, m = write_segmentation_tree(base / "seg_src", {"train": 7, "val": 3}, sizes=((60, 80), (50, 50)))
    packs["segmentation"] = base / "segmentation"
    build_segmentation(pair_by_stem(i, m), packs["segmentation"], BuildSettings(workers=1, shard_size=3), ImageSettings(size=32, mode="raw"))
    (base / "vol_src" / "a").mkdir(parents=True)
    (base / "vol_src" / "b").mkdir()
    rng = np.random.default_rng(0)
    for k in range(5):
        np.save(base / "vol_src" / "ab"[k % 2] / f"{k}.npy", rng.integers(0, 65535, (3 + k, 6, 7), dtype=np.uint16))
    packs["volumes"] = base / "volumes"
    build_volumes(scan_files(base / "vol_src", "train", VOLUME_EXTENSIONS), packs["volumes"],
                  BuildSettings(workers=1, shard_size=2), VolumeSettings())
    (base / "vol_masks" / "a").mkdir(parents=True)
    (base / "vol_masks" / "b").mkdir()
    for k in range(5):
        np.save(base / "vol_masks" / "ab"[k % 2] / f"{k}.npy", rng.integers(0, 4, (3 + k, 6, 7), dtype=np.uint8))
    packs["volume_masks"] = base / "volume_masks"
    build_volumes(scan_files(base / "vol_src", "train", VOLUME_EXTENSIONS), packs["volume_masks"],
                  BuildSettings(workers=1, shard_size=2), VolumeSettings(shape=(4, 5, 6)), masks=base / "vol_masks")
    text = base / "text"
    text.mkdir()
    for k in range(3):
        (text / f"{k}.txt").write_text("\n\n".join(f"document {k} {j} " + "word " * (j + 3) for j in range(40)))
    packs["tokens"] = base / "tokens"
    r = _run("tokenize", text, "--out", packs["tokens"], "--train-bpe", 300, "--split-docs", "paragraph",
             "--val-fraction", 0.2, "--task-mb", 1)
    assert r.exit_code == 0, r.output
    csv = base / "t.csv"
    csv.write_text("a,b,c,y\n" + "".join(f"{k * 0.5},{k % 3},x{k % 4},{k % 2}\n" for k in range(50)))
    packs["table"] = base / "table"
    assert _run("table", csv, "--target", "y", "--categorical", "c", "--out", packs["table"], "--val-fraction", 0.2).exit_code == 0
    scenes = write_scenes(base / "det_src", n=7, sizes=((40, 52), (50, 36)))
    packs["detection"] = base / "detection"  # no crowd box: its box_crowd arrays are all zero
    front_door.coco(scenes["images"], packs["detection"], annotations=scenes["coco"], size=32, mode="raw", workers=1, shard_size=3)
    return packs


def _all_arrays(pack: Path) -> dict[tuple, bytes]:
    src = open_reader(pack)
    out = {}
    for split in src.manifest["splits"]:
        for name, p in src.plans(split).items():
            out[(split, name)] = src.global_slice(split, name, 0, p.total_rows).tobytes()
            out[(split, name, "shards")] = b"".join(src.shard_array(split, k, name).tobytes() for k in range(len(p.shard_rows)))
    src.close()
    return out


def _samples(kind: str, pack: Path, cache: str = "ram") -> list:
    """Every sample of every split through the kind's dataset class, as comparable numpy data."""
    m = open_reader(pack).manifest
    out = []
    for split in m["splits"]:
        if kind in ("encoded", "multires"):
            ds = InMemoryImageDataset(pack, split, cache=cache, as_numpy=True, resolution=24 if kind == "multires" else None)
            out += [(ds[i][0], ds[i][1], ds.sources[i]) for i in range(len(ds))]
        elif kind == "segmentation":
            ds = SegmentationDataset(pack, split, cache=cache, as_numpy=True)
            out += [(*ds[i], ds.mask_sources[i]) for i in range(len(ds))]
        elif kind in ("volumes", "volume_masks"):
            ds = VolumeDataset(pack, split, cache=cache, as_numpy=True)
            out += [ds[i] for i in range(len(ds))]
        elif kind == "detection":
            ds = DetectionDataset(pack, split, cache=cache, as_numpy=True, crowd="flag")
            out += [(*ds[i], ds.sources[i]) for i in range(len(ds))]
        elif kind == "tokens":
            ds = TokenDataset(pack, context=8, split=split, mode="sequential", cache=cache)
            out += [ds[i] for i in range(len(ds))]
        else:
            ds = TabularDataset(pack, split, cache=cache)
            out += [ds[i] for i in range(len(ds))]
    return out


def _same(a, b) -> bool:
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    return a == b


@pytest.mark.parametrize("kind", ["encoded", "multires", "segmentation", "volumes", "volume_masks", "tokens", "table", "detection"])
@pytest.mark.parametrize("fmt,compress", VARIANTS)
def test_every_backend_holds_the_same_arrays_and_serves_the_same_samples(npy_packs, tmp_path, kind, fmt, compress):
    src = npy_packs[kind]
    out = tmp_path / ("p.h5" if fmt == "hdf5" else "p.zarr")
    convert(src, out, fmt, compress)
    assert detect(out) == fmt
    assert _all_arrays(out) == _all_arrays(src)
    assert verify_pack(out).ok
    want = _samples(kind, src)
    assert _same(_samples(kind, out), want)
    if kind in ("encoded", "segmentation", "volumes", "volume_masks", "detection"):
        assert _same(_samples(kind, out, "shm"), want)
    mappable = fmt == "hdf5" and compress == "none"
    if mappable:
        assert _same(_samples(kind, out, "mmap"), want)
    elif kind in ("encoded", "volumes"):
        with pytest.raises(PackError, match="mmap"):
            _samples(kind, out, "mmap")


def _same_tree(a: Path, b: Path) -> None:
    fa = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert fa == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    mismatch = [str(f) for f in fa if not filecmp.cmp(a / f, b / f, shallow=False)]
    assert not mismatch, mismatch[:5]


@pytest.mark.parametrize("chain", [("hdf5",), _zarr(("hdf5", "zarr"))], ids=["hdf5", "hdf5-zarr"])
@pytest.mark.parametrize("kind", ["encoded", "segmentation", "volume_masks", "tokens", "detection"])
def test_npy_to_hdf5_to_zarr_to_npy_round_trips_exactly(npy_packs, tmp_path, kind, chain):
    """npy -> HDF5 (-> Zarr, zstd) -> npy; the HDF5 leg alone also where zarr is missing."""
    src = prev = npy_packs[kind]
    for k, fmt in enumerate(chain):
        nxt = tmp_path / (f"{k}.h5" if fmt == "hdf5" else f"{k}.zarr")
        convert(prev, nxt, fmt, "zstd" if fmt == "zarr" else "none")
        prev = nxt
    convert(prev, tmp_path / "c", "npy")
    _same_tree(src, tmp_path / "c")  # every shard file, shard.json and manifest.json, byte for byte


@needs_zarr
@pytest.mark.parametrize("compress", ["none", "zstd"])
def test_an_all_zero_array_is_stored_in_zarr_and_comes_back(npy_packs, tmp_path, compress):
    """zarr 3 skips writing a chunk equal to the fill value unless told otherwise, and a missing chunk is
    damage here: a detection pack without crowd boxes (every box_crowd flag 0) must convert with every chunk
    on disk, serve, verify, and convert back to npy byte for byte."""
    src = npy_packs["detection"]
    crowd = np.concatenate([np.load(p) for p in sorted((src / "train").glob("*/box_crowd.npy"))])
    assert len(crowd) > 10 and not crowd.any()
    out = tmp_path / "p.zarr"
    convert(src, out, "zarr", compress)
    assert (out / "train" / "box_crowd" / "c" / "0").is_file()
    assert verify_pack(out).ok
    assert _same(_samples("detection", out), _samples("detection", src))
    convert(out, tmp_path / "back", "npy")
    _same_tree(src, tmp_path / "back")


@pytest.mark.parametrize("fmt, name", [("hdf5", "p.h5"), _zarr("zarr", "p.zarr")])
def test_builds_write_any_format_directly(tmp_path, index_tree, fmt, name):
    r = _run("build", "imagenet", index_tree, "--size", 40, "--out", tmp_path / "npy", "-j", 1)
    assert r.exit_code == 0, r.output
    r = _run("build", "imagenet", index_tree, "--size", 40, "--out", tmp_path / name, "-j", 2, "--format", fmt)
    assert r.exit_code == 0, r.output
    assert f"stored as {fmt}" in r.output and f"pack: {tmp_path / name}" in r.output
    assert not (tmp_path / f"{name}.staging").exists()
    assert _all_arrays(tmp_path / name) == _all_arrays(tmp_path / "npy")


def test_format_options_refused_or_honoured(tmp_path, index_tree):
    r = _run("build", "imagenet", index_tree, "--size", 40, "--out", tmp_path / "p.h5", "-j", 1, "--format", "hdf5")
    assert r.exit_code == 0, r.output
    r = _run("build", "imagenet", index_tree, "--out", tmp_path / "p.h5", "--format", "hdf5")
    assert r.exit_code == 1 and "--overwrite" in r.output
    csv = tmp_path / "t.txt"
    csv.write_text("a,b,y\n" + "".join(f"{k},{k * 2},{k % 2}\n" for k in range(20)))
    for fmt, name in (("npy", "t"), ("hdf5", "t.h5")):
        r = _run("table", csv, "--input-format", "csv", "--target", "y", "--out", tmp_path / name, "--format", fmt)
        assert r.exit_code == 0, r.output
    assert _same(_samples("table", tmp_path / "t.h5"), _samples("table", tmp_path / "t"))
    r = _run("build", "imagenet", index_tree, "--out", tmp_path / "x", "--compress", "zstd")
    assert r.exit_code == 1 and "not compressed" in r.output


def test_hdf5_is_readable_with_h5py_alone(npy_packs, tmp_path):
    import h5py

    convert(npy_packs["multires"], tmp_path / "p.h5", "hdf5")
    with h5py.File(tmp_path / "p.h5", "r") as f:
        m = json.loads(f.attrs["dataprep_manifest"])
        assert f.attrs["kind"] == "images" and f.attrs["backend"] == "hdf5" and f.attrs["format_version"] == 1
        images, labels = f["train/r24/images"][...], f["train/labels"][...]
        assert images.shape == (m["splits"]["train"]["count"], 24, 24, 3) and len(labels) == len(images)
        offs, blob = f["train/source_offsets"][...], f["train/sources"][...]
        assert f["train/source_offsets"].attrs["offsets_of"] == "sources"
    ds = InMemoryImageDataset(npy_packs["multires"], resolution=24, as_numpy=True)
    assert np.array_equal(images[7], ds[7][0]) and labels[7] == ds[7][1]
    assert blob[offs[7] : offs[8]].tobytes().decode() == ds.sources[7]


@needs_zarr
def test_zarr_is_readable_with_zarr_alone(npy_packs, tmp_path):
    import zarr

    convert(npy_packs["tokens"], tmp_path / "t.zarr", "zarr", "zstd")
    g = zarr.open_group(str(tmp_path / "t.zarr"), mode="r")
    tokens, docs = g["train/tokens"][:], g["train/doc_offsets"][:]
    assert g.attrs["kind"] == "tokens" and docs[0] == 0 and docs[-1] == len(tokens)
    ds = TokenDataset(npy_packs["tokens"], context=8, mode="sequential")
    assert np.array_equal(tokens, ds.data.tokens)


def test_damaged_files_are_clear_errors(npy_packs, tmp_path):
    convert(npy_packs["encoded"], tmp_path / "p.h5", "hdf5")
    data = (tmp_path / "p.h5").read_bytes()
    for cut in (len(data) // 2, len(data) - 100, 600):
        (tmp_path / "cut.h5").write_bytes(data[:cut])
        with pytest.raises(PackError, match="cut.h5"):
            ds = InMemoryImageDataset(tmp_path / "cut.h5", as_numpy=True)
            [ds[i] for i in range(len(ds))]
    (tmp_path / "junk.h5").write_bytes(b"PK\x03\x04 not hdf5 at all")
    with pytest.raises(PackError, match="junk.h5: not a pack"):
        InMemoryImageDataset(tmp_path / "junk.h5")
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "data.bin").write_bytes(b"x")
    with pytest.raises(PackError, match="odd/manifest.json: missing"):
        InMemoryImageDataset(tmp_path / "odd")
    r = _run("convert", npy_packs["encoded"], "--to", "parquet", "--out", tmp_path / "q")
    assert r.exit_code == 2 and "parquet" in r.output


@needs_zarr
def test_damaged_zarr_groups_are_clear_errors(npy_packs, tmp_path):
    convert(npy_packs["volumes"], tmp_path / "v.zarr", "zarr")
    chunk = tmp_path / "v.zarr" / "train" / "volumes" / "c" / "0"
    assert chunk.is_file()
    chunk.unlink()
    with pytest.raises(PackError, match=r"v\.zarr/train/volumes/c/0: missing chunk"):
        VolumeDataset(tmp_path / "v.zarr")
    rep = verify_pack(tmp_path / "v.zarr")
    assert not rep.ok and "missing chunk" in rep.problems[0][1]
    shutil.copytree(tmp_path / "v.zarr", tmp_path / "w.zarr")
    meta = json.loads((tmp_path / "w.zarr" / "zarr.json").read_text())
    meta["attributes"].pop("dataprep_manifest")
    (tmp_path / "w.zarr" / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(PackError, match="w.zarr: a Zarr group without a dataprep manifest"):
        VolumeDataset(tmp_path / "w.zarr")


@pytest.mark.parametrize("kind", ["encoded", "multires", "segmentation", "volumes", "volume_masks", "tokens", "table", "detection"])
@pytest.mark.parametrize("fmt, compress, name", [("hdf5", "gzip", "p.h5"), _zarr("zarr", "zstd", "p.zarr")])
def test_info_verify_and_plan_on_every_kind_and_backend(npy_packs, tmp_path, kind, fmt, compress, name):
    convert(npy_packs[kind], tmp_path / name, fmt, compress)
    for pack, backend in ((npy_packs[kind], "npy"), (tmp_path / name, f"{fmt}, {compress}")):
        r = _run("info", pack)
        assert r.exit_code == 0 and f"storage:   {backend}" in r.output, r.output
        r = _run("verify", pack)
        assert r.exit_code == 0 and r.output.startswith("ok:"), r.output
        if kind not in ("tokens", "table"):
            r = _run("plan", pack, "-b", 4, "-w", 1)
            assert r.exit_code == 0 and "per batch of 4" in r.output, r.output


def _skip_checksums(monkeypatch):
    """Wrong implementation (negative control): the loader ignores verify=True (checksums never checked)."""
    from dataprep.pack.arrays import LoadContext

    class NoVerify(LoadContext):
        def __post_init__(self):
            object.__setattr__(self, "verify", False)
            super().__post_init__()

    monkeypatch.setattr("dataprep.serve.cache.LoadContext", NoVerify)


@pytest.mark.parametrize("fmt, mode", [("hdf5", "verify"), _zarr("zarr", "verify"), ("hdf5", "plain"), _zarr("zarr", "plain"),
                                       ("hdf5", "checksums_skipped")])
def test_damaged_bytes_load_or_raise_pack_error_never_anything_else(npy_packs, tmp_path, monkeypatch, fmt, mode):
    """Flipped or cut bytes anywhere in an HDF5 file or a Zarr group's files. With verify=True every damaged
    pack is refused with a PackError or serves exactly the original bytes and labels. Without it a pack may
    also load with damage inside JPEG bytes (no checksum is read): then `verify_pack` must report it, and
    decoding its samples raises a DataprepError or gives an image; nothing else."""
    from dataprep.errors import DataprepError

    if mode == "checksums_skipped":
        _skip_checksums(monkeypatch)
    good = tmp_path / ("p.h5" if fmt == "hdf5" else "p.zarr")
    convert(npy_packs["encoded"], good, fmt)
    ref = InMemoryImageDataset(good, as_numpy=True)
    want = ([ref.stored(i).tobytes() for i in range(len(ref))], ref.labels.tolist())
    assert len(want[0]) == len(ref) > 0
    files = [good] if fmt == "hdf5" else sorted(p for p in good.rglob("*") if p.is_file())
    rng = np.random.default_rng(7)
    outcomes = {"refused": 0, "exact": 0, "corrupted": 0}
    for trial in range(40):
        bad = tmp_path / f"bad{trial}{good.suffix}"
        shutil.copytree(good, bad) if good.is_dir() else shutil.copy(good, bad)
        f = bad if fmt == "hdf5" else bad / files[int(rng.integers(len(files)))].relative_to(good)
        data = bytearray(f.read_bytes())
        if trial % 3 == 0:
            data = data[: int(rng.integers(0, max(1, len(data))))]
        else:
            for pos in rng.integers(0, max(1, len(data)), 6):
                data[pos] ^= 0xA5
        f.write_bytes(bytes(data))
        try:
            ds = InMemoryImageDataset(bad, as_numpy=True, verify=mode != "plain")
            got = ([ds.stored(i).tobytes() for i in range(len(ds))], ds.labels.tolist())
        except PackError:
            outcomes["refused"] += 1
        else:
            if got == want:
                outcomes["exact"] += 1
            else:
                outcomes["corrupted"] += 1
                if mode == "plain":  # served without checksums: verify must find it, decoding fails cleanly
                    assert not verify_pack(bad).ok, f"trial {trial}: damage that loads and verify misses"
                    for i in range(len(ds)):
                        try:
                            ds[i]
                        except DataprepError:
                            pass
        shutil.rmtree(bad) if bad.is_dir() else bad.unlink()
    assert sum(outcomes.values()) == 40 and outcomes["refused"] > 0, outcomes
    if mode == "verify":
        assert outcomes["corrupted"] == 0, outcomes  # no pack loads and serves corrupted bytes
    elif mode == "checksums_skipped":  # negative control: the same check must catch the wrong loader
        assert outcomes["corrupted"] > 0, outcomes
