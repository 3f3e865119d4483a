"""Stored JPEGs that a pack serves as its build decoded them, or refuses by name before a decoder allocates.

A frame that declares more than its bytes, or the pack's build, allow (a 633-byte JPEG of 32767 x
32767, its shapes and checksums forged to agree) is refused from its header by `ds[i]`, `image(i)`, `jpeg(i)`
and every Loader fill.
"""
from __future__ import annotations

import io
import json
import resource
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import dataprep
from dataprep.errors import PackError
from dataprep.images import codec
from dataprep.images.build import build_images
from dataprep.images.settings import ImageSettings
from dataprep.serve.loader import Loader
from dataprep.settings import BuildSettings
from dataprep.sources import scan_imagenet

from .test_verify_content import _rewrite

REPO = Path(__file__).resolve().parents[1]


def photo(h: int, w: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.stack([128 + 100 * np.sin(x / (6 + seed) + y / 17), 128 + 90 * np.cos(y / (5 + seed)), (x * 3 + y * 2) % 256], -1)
    return np.clip(img + rng.normal(0, 10, img.shape), 0, 255).astype(np.uint8)


def pil_jpeg(px: np.ndarray, **kw) -> bytes:
    out = io.BytesIO()
    Image.fromarray(px).save(out, "JPEG", **kw)
    return out.getvalue()


def segments(data: bytes) -> list[tuple[int, int]]:
    """(offset, marker) of each marker segment up to and including the scan's, each right after the one before."""
    out, i = [], 2
    while True:
        assert data[i] == 0xFF, f"byte {i} is no marker"
        marker, length = data[i + 1], (data[i + 2] << 8) | data[i + 3]
        out.append((i, marker))
        if marker == 0xDA:
            return out
        i += 2 + length


def tree(root: Path, files: dict[str, bytes]) -> Path:
    d = root / "train" / "a"
    d.mkdir(parents=True)
    for name, data in files.items():
        (d / name).write_bytes(data)
    (root / "train" / "b").mkdir()
    (root / "train" / "b" / "other.JPEG").write_bytes(pil_jpeg(photo(40, 56, 9), quality=90))
    return root


def build(src: Path, out: Path, **image) -> Path:
    build_images(scan_imagenet(src), out, BuildSettings(workers=1, shard_size=50), ImageSettings(**image))
    return out


# -- caps from the header, before a decoder allocates ---------------------------------------------------------------
def forge(pack: Path, i: int, data: bytes, shape: tuple[int, int, int]) -> None:
    """Sample i of train's shard 0 replaced by `data` with its recorded shape `shape`, every record made to match."""
    d = pack / "train" / "00000"
    blob, offsets, shapes = (np.load(d / f"{n}.npy") for n in ("images", "offsets", "shapes"))
    new = np.concatenate([blob[: offsets[i]], np.frombuffer(data, np.uint8), blob[offsets[i + 1] :]])
    offs = offsets.copy()
    offs[i + 1 :] += len(data) - (offsets[i + 1] - offsets[i])
    shapes[i] = shape
    for name, arr in (("images", new), ("offsets", offs), ("shapes", shapes)):
        _rewrite(pack, "train", 0, name, arr)


def declaring(data: bytes, h: int, w: int) -> bytes:
    b = bytearray(data)
    sof = next(i for i, m in segments(data) if m == 0xC0)
    b[sof + 5 : sof + 9] = bytes((h >> 8, h & 255, w >> 8, w & 255))
    return bytes(b)


def paths(ds, i: int) -> dict[str, object]:
    """Every way a dataset serves sample i: alone, and in each kind of Loader fill (0 workers)."""
    def batch(crop):
        return lambda: next(iter(Loader(ds, len(ds), crop=crop)))

    return {"ds[i]": lambda: ds[i], "image(i)": lambda: ds.image(i), "jpeg(i)": lambda: ds.jpeg(i), "crop=(H, W)": batch((24, 24)),
            "RandomResizedCrop": batch(dataprep.RandomResizedCrop(24)), "CenterCrop": batch(dataprep.CenterCrop(24)),
            "RandomResizedCrop 1/2": batch(dataprep.RandomResizedCrop(8, scale=(0.9, 1)))}


def every_path(pack: Path, i: int) -> dict[str, object]:
    """Sample i through every serving path of every decode= (verify=True): each path's error, or what it gave."""
    out = {}
    for decode in ("fast", "accurate", "pil"):
        ds = dataprep.InMemoryImageDataset(pack, verify=True, decode=decode, as_numpy=True)
        for name, call in paths(ds, i).items():
            start = time.perf_counter()
            try:
                got: object = call()
            except Exception as e:
                got = e
            out[f"{decode} {name}"] = got
            assert time.perf_counter() - start < 5, (decode, name)
    return out


def assert_refused(pack: Path, i: int, why: str) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for path, got in every_path(pack, i).items():
        assert isinstance(got, PackError), (path, got)
        assert f"{pack / 'train'}: sample {i} (" in str(got) and why in str(got), (path, str(got))
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 300_000, "a decoder allocated the frame"  # KiB


@pytest.fixture
def small_pack(tmp_path) -> Path:
    files = {f"x{k}.JPEG": pil_jpeg(photo(48, 64, k), quality=90) for k in range(3)}
    return build(tree(tmp_path / "src", files), tmp_path / "pack", size=64)


def test_a_633_byte_jpeg_declaring_32767_square_is_refused_from_its_header(small_pack):
    """Shapes and checksums forged to agree with the frame: before, each access decoded 3.2 GB."""
    tiny = declaring(pil_jpeg(photo(8, 8, 0), quality=90), 32767, 32767)
    assert len(tiny) < 700 and codec.jpeg_header(tiny) == (32767, 32767, 3)
    forge(small_pack, 0, tiny, (32767, 32767, 3))
    assert_refused(small_pack, 0, "bytes, fewer than a complete 32767x32767 JPEG holds")
    ds = dataprep.InMemoryImageDataset(small_pack, verify=True, as_numpy=True)
    assert ds[1][0].shape == tuple(ds.shapes[1])  # the others still serve


def test_a_frame_over_what_the_build_makes_is_refused_even_with_the_bytes_for_it(small_pack):
    """A complete 200 x 300 JPEG in a pack built at 64 px (the shorter side at most 64): its bytes hold the
    frame, its resize mode does not make it."""
    big = pil_jpeg(photo(200, 300, 3), quality=90)
    forge(small_pack, 2, big, (200, 300, 3))
    assert_refused(small_pack, 2, "larger than its build makes at 64 px (resize 'shorter')")


def test_a_frame_over_max_pixels_is_refused_and_a_forged_manifest_does_not_lift_the_byte_floor(tmp_path):
    files = {f"x{k}.JPEG": pil_jpeg(photo(48, 64, k), quality=90) for k in range(2)}
    pack = build(tree(tmp_path / "src", files), tmp_path / "pack", size=512, max_pixels=5000)
    forge(pack, 0, pil_jpeg(photo(100, 100, 1), quality=90), (100, 100, 3))
    assert_refused(pack, 0, "10,000 pixels, over the 5,000 its build allows (max_pixels)")
    m = json.loads((pack / "manifest.json").read_text())  # the caps lifted as far as a manifest can say
    m["settings"]["image"].update(max_pixels=1 << 40, size=16384)
    (pack / "manifest.json").write_text(json.dumps(m))
    forge(pack, 1, declaring(pil_jpeg(photo(8, 8, 0), quality=90), 16384, 65500), (16384, 65500, 3))
    assert_refused(pack, 1, "bytes, fewer than a complete 65500x16384 JPEG holds")
