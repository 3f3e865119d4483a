"""16-bit images: kept exactly with --depth 16, scaled (never truncated) to 8 bits otherwise."""
from __future__ import annotations

import io
import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from PIL import Image

from dataprep import InMemoryImageDataset
from dataprep.errors import DataprepError
from dataprep.images.build import build_images
from dataprep.images.decode import decode_source, to_depth
from dataprep.images.settings import ImageSettings
from dataprep.serve.transfer import Normalize
from dataprep.settings import BuildSettings
from dataprep.sources import scan_folder

from .conftest import corpus_dir


def _scaled(x: np.ndarray) -> np.ndarray:
    """The documented 16 -> 8 bit scaling, round(x / 257), computed in floating point."""
    return np.floor(x.astype(np.float64) / 257 + 0.5).astype(np.uint8)


@pytest.fixture(scope="module")
def deep_tree(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    """Class folders of 16-bit PNG and TIFF files, grey and RGB; the first of each holds every value 0..65535."""
    root = tmp_path_factory.mktemp("deep")
    rng = np.random.default_rng(7)
    want = {}
    for cls, ext in (("png", ".png"), ("tif", ".tif")):
        (root / cls).mkdir()
        for k, channels in enumerate((1, 3, 1, 3)):
            arr = rng.integers(0, 65536, (64 + 8 * k, 96, channels), dtype=np.uint16)
            if k == 0:  # every 16-bit value once
                arr = np.arange(65536, dtype=np.uint16).reshape(256, 256, 1)
            name = f"{cls}/{k}{ext}"
            assert cv2.imwrite(str(root / name), arr[:, :, ::-1] if channels == 3 else arr[:, :, 0])
            want[name] = arr
    return root, want


def _build(root: Path, out: Path, **image) -> InMemoryImageDataset:
    build_images(scan_folder(root), out, BuildSettings(workers=2), ImageSettings(size=256, resize="shorter", **image))
    return InMemoryImageDataset(out, as_numpy=True)


def test_depth_16_round_trips_every_value_exactly(deep_tree, tmp_path):
    root, want = deep_tree
    ds = _build(root, tmp_path / "p16", mode="raw", depth=16)
    m = json.loads((tmp_path / "p16" / "manifest.json").read_text())
    assert m["fields"]["image"]["dtype"] == "<u2" and m["settings"]["image"]["depth"] == 16
    assert len(ds) == len(want)
    for i in range(len(ds)):
        img, _ = ds[i]
        src = want[ds.sources[i]]
        assert img.dtype == np.uint16
        assert np.array_equal(img, np.repeat(src, 3, axis=2) if src.shape[2] == 1 else src), ds.sources[i]
    gray = _build(root, tmp_path / "g16", mode="raw", depth=16, grayscale=True)
    for i in range(len(gray)):
        src = want[gray.sources[i]]
        if src.shape[2] == 1:
            assert np.array_equal(gray[i][0], src)


def test_reduction_to_8_bits_is_round_x_over_257_for_every_pixel(deep_tree, tmp_path):
    root, want = deep_tree
    ds = _build(root, tmp_path / "p8", mode="raw")
    for i in range(len(ds)):
        img, _ = ds[i]
        src = want[ds.sources[i]]
        assert img.dtype == np.uint8
        assert np.array_equal(img, _scaled(np.repeat(src, 3, axis=2) if src.shape[2] == 1 else src)), ds.sources[i]
    assert np.array_equal(to_depth(np.arange(65536, dtype=np.uint16), 8), _scaled(np.arange(65536)))
    assert np.array_equal(to_depth(np.arange(256, dtype=np.uint8), 16).astype(np.int64), np.arange(256) * 257)


@pytest.mark.corpus
def test_corpus_16_bit_files(tmp_path):
    """The corpus's 16-bit grey PNG and TIFF decode exactly (checked against Pillow's own I;16 decode), and
    its 16-bit RGB PNG is read at 16 bits (Pillow's RGB mode would have cut them) and scaled to 8 as documented."""
    aw = corpus_dir("awkward")
    s16 = ImageSettings(size=4096, mode="raw", depth=16, grayscale=True)
    for name in ("gray16.png", "gray16.tif"):
        data = (aw / name).read_bytes()
        ref = np.asarray(Image.open(io.BytesIO(data))).astype(np.uint16)
        got = decode_source(data, name, s16).pixels[:, :, 0]
        assert np.array_equal(got, ref), name
        g8 = decode_source(data, name, ImageSettings(size=4096, mode="raw", grayscale=True)).pixels[:, :, 0]
        assert np.array_equal(g8, _scaled(ref)), name
    rgb = decode_source((aw / "rgb16.png").read_bytes(), "rgb16.png", ImageSettings(size=4096, mode="raw", depth=16)).pixels
    assert rgb.dtype == np.uint16 and rgb.shape[2] == 3 and int(rgb.max()) > 255
    rgb8 = decode_source((aw / "rgb16.png").read_bytes(), "rgb16.png", ImageSettings(size=4096, mode="raw")).pixels
    assert np.array_equal(rgb8, _scaled(rgb))


def _normalize_at_8_bits(self, x: torch.Tensor) -> torch.Tensor:
    """Wrong implementation (negative control): the 16-bit batch brought to 8 bits (round(x / 257)) and
    normalised with the mean and std scaled to 8-bit units. Every value still lies in [-1, 1]."""
    x8 = torch.from_numpy(_scaled(x.numpy())).to(torch.float32)
    return torch.addcmul(self.shift, x8, self.scale * 257)


@pytest.mark.parametrize("impl", ["right", "at_8_bits"])
def test_depth_16_needs_raw_mode_and_serves_uint16_batches(deep_tree, tmp_path, monkeypatch, impl):
    with pytest.raises(DataprepError, match="--mode raw"):
        ImageSettings(depth=16)
    root, _ = deep_tree
    build_images(scan_folder(root), tmp_path / "p", BuildSettings(workers=1), ImageSettings(size=48, resize="center-crop", mode="raw", depth=16))
    ds = InMemoryImageDataset(tmp_path / "p")
    x, y = ds[[0, 1, 2]]
    assert x.dtype == torch.uint16 and x.shape == (3, 3, 48, 48)
    stored = np.stack([InMemoryImageDataset(tmp_path / "p", as_numpy=True)[i][0] for i in range(3)]).transpose(0, 3, 1, 2)
    assert np.array_equal(x.numpy(), stored) and int(stored.max()) > 255  # the batch holds the 16-bit values
    if impl == "at_8_bits":
        monkeypatch.setattr(Normalize, "forward", _normalize_at_8_bits)
    out = Normalize(mean=(32767.5,) * 3, std=(32767.5,) * 3)(x)
    want = (stored.astype(np.float64) - 32767.5) / 32767.5  # in float64, here
    err = float(np.abs(out.double().numpy() - want).max())
    assert out.dtype == torch.float32 and out.shape == x.shape
    # float32: a few ulps of values in [-1, 1]; the 8-bit path is off by up to 128 / 32767.5 = 0.0039
    assert (err <= 1e-6) if impl == "right" else (err > 1e-3), err
    assert -1.0 <= float(out.min()) and float(out.max()) <= 1.0  # all the old check asked: the wrong path passes it


def test_cli_depth_option(deep_tree, tmp_path):
    from click.testing import CliRunner

    from dataprep.cli import main

    root, _ = deep_tree
    r = CliRunner().invoke(main, ["build", "folder", str(root), "--out", str(tmp_path / "a"), "--depth", "16", "--no-progress"])
    assert r.exit_code == 1 and "--mode raw" in r.output
    r = CliRunner().invoke(main, ["build", "folder", str(root), "--out", str(tmp_path / "b"), "--depth", "16", "--mode", "raw", "--no-progress"])
    assert r.exit_code == 0, r.output
    assert InMemoryImageDataset(tmp_path / "b")[0][0].dtype == torch.uint16
