"""Build stage: exact round trips, layout, skipping, strictness, atomicity and determinism."""
import json
import os
import shutil

import numpy as np
import pytest

from dataprep.engine import run_tasks
from dataprep.errors import ImageDecodeError, PackExistsError, WorkerError
from dataprep.images.build import build_images
from dataprep.images.codec import with_restarts
from dataprep.images.dataset import InMemoryImageDataset
from dataprep.images.settings import ImageSettings
from dataprep.pack.backends import read_manifest
from dataprep.pack.manifest import FORMAT_VERSION
from dataprep.settings import BuildSettings
from dataprep.sources import scan_folder, scan_imagenet
from dataprep.synthetic import decode_index, index_colour


def settings(workers=1, **image):
    overwrite = image.pop("overwrite", False)
    strict = image.pop("strict", False)
    shard_size = image.pop("shard_size", 4)
    return BuildSettings(workers=workers, shard_size=shard_size,
                         strict=strict, overwrite=overwrite), ImageSettings(**{"size": 64, **image})


def test_raw_round_trip_is_exact_and_keeps_order(index_tree, tmp_path):
    source = scan_imagenet(index_tree)
    summary = build_images(source, tmp_path / "p", *settings(mode="raw"))
    assert summary.written == 24
    ds = InMemoryImageDataset(tmp_path / "p", "train", as_numpy=True)
    assert len(ds) == 18
    for i in range(len(ds)):
        img, label = ds[i]
        assert decode_index(img) == i  # sample i of the pack is source image i
        assert (img == img[0, 0]).all()  # flat colour, exactly: no resampling, no loss
        assert label == i // 6
        assert ds.sources[i] == source.splits[0].paths[i]
    val = InMemoryImageDataset(tmp_path / "p", "val", as_numpy=True)
    assert [decode_index(val[i][0]) for i in range(len(val))] == list(range(18, 24))
    assert list(val.labels) == [0, 0, 1, 1, 2, 2]


def test_manifest_describes_the_pack(index_tree, tmp_path):
    build_images(scan_imagenet(index_tree), tmp_path / "p", *settings(mode="raw", resize="center-crop", size=32))
    m = read_manifest(tmp_path / "p")
    assert m["format_version"] == FORMAT_VERSION and m["kind"] == "images"
    assert m["fields"]["image"]["layout"] == "fixed" and m["fields"]["image"]["shape"] == [32, 32, 3]
    assert m["fields"]["label"] == {"dtype": "|u1", "num_classes": 3, "arrays": ["labels"]}
    assert m["classes"] == ["n00000000", "n00000001", "n00000002"]
    assert m["splits"]["train"]["count"] == 18 and len(m["splits"]["train"]["shards"]) == 5
    assert m["settings"]["image"]["resize"] == "center-crop"
    files = m["splits"]["train"]["shards"][0]["files"]
    assert set(files) == {"images.npy", "shapes.npy", "labels.npy", "sources.npy", "source_offsets.npy", "phashes.npy", "digests.npy"}
    arr = np.load(tmp_path / "p" / "train" / "00000" / "images.npy", allow_pickle=False)  # plain numpy reads it
    assert arr.shape == (4, 32, 32, 3) and arr.dtype == np.uint8
    assert np.load(tmp_path / "p" / "train" / "00000" / "source_offsets.npy").dtype.str == "<i8"


def test_encoded_pack_and_grayscale(index_tree, tmp_path):
    build_images(scan_imagenet(index_tree), tmp_path / "p", *settings(grayscale=True, keep_jpeg=False))
    ds = InMemoryImageDataset(tmp_path / "p")
    img, _ = ds[5]
    assert img.shape[0] == 1 and img.dtype.__str__() == "torch.uint8"
    assert ds.field.encoding == "jpeg" and ds.field.channels == 1
    raw = ds.image(5)
    r, g, b = index_colour(5).astype(float)
    assert abs(float(raw.mean()) - (0.299 * r + 0.587 * g + 0.114 * b)) < 3  # luma of the index colour


def test_bad_files_are_skipped_and_recorded(index_tree, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(index_tree / "train", src)
    (src / "n00000001" / "img_00002.png").write_bytes(b"")
    (src / "n00000002" / "zz.JPEG").write_bytes(os.urandom(300))
    summary = build_images(scan_folder(src), tmp_path / "p", *settings(mode="raw"))
    assert summary.written == 18 - 1 and dict(summary.splits[0].skipped) == {"empty file": 1, "not an image": 1}
    m = read_manifest(tmp_path / "p")
    sk = {s["source"]: s["reason"] for s in m["splits"]["train"]["skipped"]}
    assert sk == {"n00000001/img_00002.png": "empty file", "n00000002/zz.JPEG": "not an image"}
    ds = InMemoryImageDataset(tmp_path / "p", as_numpy=True)
    assert "n00000001/img_00002.png" not in list(ds.sources)
    assert [decode_index(ds[i][0]) for i in range(len(ds))] == [i for i in range(18) if i != 8]


def test_strict_fails_naming_the_file_and_writes_no_manifest(index_tree, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(index_tree / "train", src)
    (src / "n00000001" / "bad.JPEG").write_bytes(b"\xff\xd8\xff\xe0 truncated")
    with pytest.raises(ImageDecodeError, match=r"src/n00000001/bad.JPEG: corrupt"):
        build_images(scan_folder(src), tmp_path / "p", *settings(strict=True))
    assert not (tmp_path / "p" / "manifest.json").exists()


def test_refuses_existing_pack_and_foreign_dirs(index_tree, tmp_path):
    build_images(scan_imagenet(index_tree), tmp_path / "p", *settings())
    with pytest.raises(PackExistsError, match="already holds a pack"):
        build_images(scan_imagenet(index_tree), tmp_path / "p", *settings())
    build_images(scan_imagenet(index_tree), tmp_path / "p", *settings(overwrite=True, size=32))
    assert read_manifest(tmp_path / "p")["settings"]["image"]["size"] == 32
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("precious")
    with pytest.raises(PackExistsError, match="not a dataprep pack"):
        build_images(scan_imagenet(index_tree), tmp_path / "mine", *settings(overwrite=True))
    assert (tmp_path / "mine" / "thesis.tex").exists()


def test_output_is_identical_whatever_the_number_of_workers(photo_tree, tmp_path):
    source = scan_imagenet(photo_tree)
    build_images(source, tmp_path / "a", *settings(workers=1, size=128))
    build_images(source, tmp_path / "b", *settings(workers=2, size=128))
    ma, mb = read_manifest(tmp_path / "a"), read_manifest(tmp_path / "b")
    assert json.dumps(ma["splits"]) == json.dumps(mb["splits"])  # every shard's sha256 equal


def test_limit_builds_a_sample_of_every_class(photo_tree, tmp_path):
    build_images(scan_imagenet(photo_tree), tmp_path / "p", BuildSettings(limit=5), ImageSettings(size=64))
    ds = InMemoryImageDataset(tmp_path / "p")
    assert len(ds) == 5 and len(set(ds.labels.tolist())) == 4


def _die(task):
    if task == 2:
        os._exit(3)  # a worker killed mid-shard (OOM killer, segfault in a codec)
    return task


def test_a_dying_worker_is_an_error_not_a_hang():
    with pytest.raises(WorkerError, match="died"):
        run_tasks(_die, list(range(6)), workers=2)


def _raise(task):
    raise ImageDecodeError("some/file.JPEG", "truncated")


def test_a_worker_exception_reaches_the_driver():
    with pytest.raises(ImageDecodeError, match="some/file.JPEG"):
        run_tasks(_raise, [0, 1, 2], workers=2)


@pytest.mark.corpus
@pytest.mark.slow
def test_kept_real_jpegs_serve_exactly_what_pillow_decodes(tmp_path):
    from PIL import Image

    from .conftest import corpus_dir

    root = corpus_dir("images")
    summary = build_images(scan_imagenet(root), tmp_path / "p", BuildSettings(workers=2), ImageSettings(size=512))
    assert summary.splits[0].kept_jpeg > 100  # most of the corpus is already <= 512 px on the shorter side
    ds = InMemoryImageDataset(tmp_path / "p", decode="cv2", as_numpy=True)
    raw = InMemoryImageDataset(tmp_path / "p", decode="none", as_numpy=True)
    checked = 0
    for i in range(len(ds)):
        src = root / ds.sources[i]
        if raw[i][0].tobytes() == with_restarts(src.read_bytes()):  # kept: restart markers added, same pixels
            with Image.open(src) as im:
                assert np.array_equal(ds[i][0], np.asarray(im.convert("RGB"))), ds.sources[i]
            checked += 1
    assert checked == summary.splits[0].kept_jpeg


def _source_sides(root, ds):
    from PIL import Image

    out = []
    for p in ds.sources:
        with Image.open(root / p) as im:
            out.append(im.size)
    return out


def _has_black(img) -> bool:
    return bool((img == 0).all(axis=-1).any())  # index colours are never black: black is padding


@pytest.mark.parametrize("upscale", [False, True])
def test_center_crop_counts_the_images_it_pads_or_upscales(index_tree, tmp_path, upscale):
    summary = build_images(scan_imagenet(index_tree), tmp_path / "p",
                           *settings(mode="raw", resize="center-crop", size=48, upscale=upscale))
    m = read_manifest(tmp_path / "p")
    lines = "\n".join(summary.lines())
    for split in ("train", "val"):
        ds = InMemoryImageDataset(tmp_path / "p", split, as_numpy=True)
        small = sum(min(wh) < 48 for wh in _source_sides(index_tree, ds))
        padded = sum(_has_black(ds[i][0]) for i in range(len(ds)))
        assert small > 0  # the fixture has sources smaller than the size
        assert padded == (0 if upscale else small)
        assert m["splits"][split]["undersized"] == {"48": {"kept": 0 if upscale else small, "upscaled": small if upscale else 0}}
        if upscale:
            assert f"{split}: {small} of {len(ds)} images were smaller than 48 px and enlarged to it (--upscale)" in lines
        else:
            assert (f"{split}: {small} of {len(ds)} images were smaller than 48 px on the shorter side and padded with "
                    "black to 48x48; pass --upscale to enlarge them instead") in lines
    assert ("enlarged" in lines) == upscale and ("padded" in lines) != upscale


def test_pad_counts_images_framed_on_every_side_at_each_size(index_tree, tmp_path):
    summary = build_images(scan_folder(index_tree / "train"), tmp_path / "p", *settings(mode="raw", resize="pad", sizes=(56, 32)))
    m = read_manifest(tmp_path / "p")
    ds = InMemoryImageDataset(tmp_path / "p", resolution=56, as_numpy=True)
    small = sum(max(wh) < 56 for wh in _source_sides(index_tree / "train", ds))
    framed = sum(all((e == 0).all() for e in (img[0], img[-1], img[:, 0], img[:, -1])) for img in (ds[i][0] for i in range(len(ds))))
    assert 0 < small == framed < len(ds)  # every sample is padded somewhere by design; only these on all four sides
    assert m["splits"]["train"]["undersized"] == {"56": {"kept": small, "upscaled": 0}, "32": {"kept": 0, "upscaled": 0}}
    lines = summary.lines()
    assert (f"  train: at 56 px: {small} of 18 images were smaller than 56 px on both sides and padded on every side "
            "to 56x56; pass --upscale to enlarge them instead") in lines
    assert not any("at 32 px" in ln for ln in lines)


def test_shorter_records_small_images_without_a_remedy(index_tree, tmp_path):
    summary = build_images(scan_folder(index_tree / "train"), tmp_path / "p", *settings(mode="raw", size=48))
    assert read_manifest(tmp_path / "p")["splits"]["train"]["undersized"] == {"48": {"kept": 6, "upscaled": 0}}
    assert not any("--upscale" in ln for ln in summary.lines())  # kept small by design: nothing padded


def test_a_resumed_build_keeps_the_counts_and_rebuilds_a_shard_that_lacks_them(index_tree, tmp_path):
    src = scan_folder(index_tree / "train")
    b, image = settings(mode="raw", resize="center-crop", size=48)
    build_images(src, tmp_path / "p", b, image)
    first = read_manifest(tmp_path / "p")["splits"]["train"]["undersized"]
    rec = tmp_path / "p" / "train" / "00000" / "shard.json"
    old = json.loads(rec.read_text())
    assert old["counts"]["undersized@48"] == 2  # shard 0 holds class 0's first 4 images: two are 40x60
    del old["counts"]  # as an older dataprep wrote it
    rec.write_text(json.dumps(old))
    (tmp_path / "p" / "manifest.json").unlink()  # an interrupted build
    summary = build_images(src, tmp_path / "p", BuildSettings(workers=1, shard_size=4, resume=True), image)
    assert summary.splits[0].reused == summary.splits[0].shards - 1  # shard 0 was built again, the rest reused
    assert read_manifest(tmp_path / "p")["splits"]["train"]["undersized"] == first == {"48": {"kept": 6, "upscaled": 0}}


def test_a_source_folder_opened_as_a_pack_is_called_one(index_tree):
    from dataprep.errors import PackError

    with pytest.raises(PackError, match=r"looks like a source folder \(class folders of images\), not a pack.*"
                                        r"dataprep build folder .*train --out PACK") as e:
        InMemoryImageDataset(index_tree / "train")
    assert "unfinished" not in str(e.value)


@pytest.mark.corpus
@pytest.mark.slow
def test_real_photos_smaller_than_256_are_counted_as_padded(tmp_path):
    from PIL import Image

    from .conftest import corpus_dir

    root = corpus_dir("images", "train")
    small = 0
    for p in root.rglob("*"):
        if p.is_file():
            with Image.open(p) as im:
                small += min(im.size) < 256
    summary = build_images(scan_folder(root), tmp_path / "p", BuildSettings(workers=2), ImageSettings(size=256, resize="center-crop"))
    assert small > 20  # the corpus has small photos (51 of 356 when this was written)
    assert read_manifest(tmp_path / "p")["splits"]["train"]["undersized"] == {"256": {"kept": small, "upscaled": 0}}
    assert f"  train: {small} of 356 images were smaller than 256 px on the shorter side and padded" in "\n".join(summary.lines())


def test_a_units_shards_read_their_own_samples_and_reused_ones_read_nothing():
    """run_unit gives each shard of a sequential unit its own part of one stream; shards a resumed build
    reuses read nothing, and when every shard is reused the unit is not read at all."""
    from dataclasses import dataclass

    from dataprep.driver import UnitTasks, run_unit

    read = []

    @dataclass(frozen=True)
    class Reader:
        sequential: bool = True

        def open(self, root, refs, locators):
            for r in refs:
                read.append(r)
                yield r.encode()

    @dataclass(frozen=True)
    class Task:
        paths: tuple
        reused: bool
        root: str = "/"
        reader: Reader = Reader()
        locators: tuple = ()

    def shard_fn(task, samples):
        return "reused" if task.reused else [s.decode() for s in samples]

    tasks = UnitTasks((Task(("a", "b"), True), Task(("c",), False), Task(("d", "e"), True), Task(("f",), False)))
    assert run_unit(shard_fn, tasks) == ["reused", ["c"], "reused", ["f"]]
    assert read == ["a", "b", "c", "d", "e", "f"]  # skipped through, each once, in order
    read.clear()
    assert run_unit(shard_fn, UnitTasks((Task(("a",), True), Task(("b", "c"), True)))) == ["reused", "reused"]
    assert read == []  # a fully reused unit (a resumed gzip tar or row group) is not read


def test_resume_rebuilds_shards_of_a_tar_rewritten_with_the_same_layout(tmp_path):
    """A regenerated tar (or Parquet export) often keeps every member's name, offset and size: --resume
    must not serve the old pixels from it (the shard digest holds each container's size and mtime)."""
    import io
    import tarfile

    from PIL import Image

    from dataprep.images.build import build_images
    from dataprep.images.dataset import InMemoryImageDataset
    from dataprep.images.settings import ImageSettings
    from dataprep.sources.webdataset import scan_webdataset

    def write(level: int) -> None:
        with tarfile.open(tmp_path / "s.tar", "w") as tf:
            for i in range(4):
                buf = io.BytesIO()
                Image.fromarray(np.full((16, 16, 3), level + 10 * i, np.uint8)).save(buf, "PNG")
                for ext, data in (("png", buf.getvalue()), ("cls", b"0")):
                    ti = tarfile.TarInfo(f"{i:03d}.{ext}")
                    ti.size = len(data)
                    tf.addfile(ti, io.BytesIO(data))

    write(50)
    image = ImageSettings(size=16, mode="raw")
    build_images(scan_webdataset([str(tmp_path / "s.tar")]), tmp_path / "p", BuildSettings(shard_size=2), image)
    size = (tmp_path / "s.tar").stat().st_size
    st = (tmp_path / "s.tar").stat()
    write(100)  # the same members, names, offsets and sizes; other pixels
    assert (tmp_path / "s.tar").stat().st_size == size
    os.utime(tmp_path / "s.tar", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    summary = build_images(scan_webdataset([str(tmp_path / "s.tar")]), tmp_path / "p",
                           BuildSettings(shard_size=2, resume=True), image)
    assert sum(s.reused for s in summary.splits) == 0
    ds = InMemoryImageDataset(tmp_path / "p", as_numpy=True)
    assert [int(ds[i][0][0, 0, 0]) for i in range(4)] == [100, 110, 120, 130]


def test_a_reader_that_gives_fewer_samples_than_listed_is_an_error_not_a_smaller_shard(tmp_path):
    """zip() would stop at the shorter input and write a shard missing the rest, silently."""
    from dataprep.images.build import ShardTask, build_image_shard
    from dataprep.images.settings import ImageSettings
    from dataprep.synthetic import write_tree

    tree = write_tree(tmp_path / "src", classes=1, per_class=2)
    files = sorted(str(p.relative_to(tree)) for p in tree.rglob("*.*") if p.is_file())[:2]
    task = ShardTask(str(tree), str(tmp_path / "out" / "train"), 0, tuple(files), np.zeros(2, np.int64), "uint8",
                     ImageSettings(size=16), False)
    one = iter([(tree / files[0]).read_bytes()])
    with pytest.raises(ValueError):
        build_image_shard(task, samples=one)
    assert not (tmp_path / "out" / "train" / "00000").exists()
