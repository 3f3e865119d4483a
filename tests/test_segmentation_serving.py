"""Segmentation served by the Loader with the image kind's crops and flips: image and mask moved by one draw
(images/geometry.py). The scenes' pixels say each region's class (colour = SEG_PALETTE[class], dataprep.synthetic),
so every served mask label must sit on its class's colour in the served image, at any worker count and across a
resume; a mask left unflipped or cut with another box fails the same check."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from dataprep import CenterCrop, Loader, RandomResizedCrop
from dataprep.images import geometry
from dataprep.images.settings import ImageSettings
from dataprep.segmentation.build import build_segmentation
from dataprep.segmentation.dataset import SegmentationDataset
from dataprep.segmentation.pairs import pair_by_stem
from dataprep.settings import BuildSettings
from dataprep.synthetic import SEG_PALETTE, write_segmentation_tree

CROPS = {"random": RandomResizedCrop(48, scale=(0.2, 1.0)), "center": CenterCrop(48, resize=56)}
TOL = {"raw": 12, "encoded": 40}  # JPEG bleeds colour near edges and tints flat regions a little


@pytest.fixture(scope="module")
def packs(tmp_path_factory) -> dict[str, Path]:
    """16 scenes of four sizes (portrait, landscape, square, odd), built raw and as JPEG, shorter side 80 px."""
    base = tmp_path_factory.mktemp("seg_serving")
    src = write_segmentation_tree(base / "src", {"train": 16}, sizes=((120, 160), (150, 100), (128, 128), (97, 131)))
    out = {}
    for mode in ("raw", "encoded"):
        out[mode] = base / mode
        build_segmentation(pair_by_stem(*src), out[mode], BuildSettings(workers=1),
                           ImageSettings(size=80, resize="shorter", mode=mode))
    return out


def _interior(mask: np.ndarray, r: int = 2) -> np.ndarray:
    """Pixels whose (2r+1)^2 neighbourhood holds one label, off the output's edge: where no resampling blends
    another region's colour in (the build's area filter blends a stored pixel at each border, the crop's
    resample one more; at r=1, 0.3% of the pixels so placed are off colour, at r=2 none)."""
    kernel = np.ones((2 * r + 1, 2 * r + 1), np.uint8)
    inner = cv2.erode(mask, kernel) == cv2.dilate(mask, kernel)
    inner[:r], inner[-r:], inner[:, :r], inner[:, -r:] = False, False, False, False
    return inner


def _problems(images: torch.Tensor, masks: torch.Tensor, tol: int) -> list[str]:
    """Each served label whose interior pixels hold its class's colour (within `tol` in every channel) less than
    99% of the time; a batch whose interior pixels do so less than 99.5% of the time."""
    x, m = images.permute(0, 2, 3, 1).numpy(), masks.numpy()
    out, hits, total = [], 0, 0
    for k in range(len(x)):
        inner = _interior(m[k])
        good = np.abs(x[k].astype(np.int16) - SEG_PALETTE[m[k]].astype(np.int16)).max(-1) <= tol
        hits, total = hits + int(good[inner].sum()), total + int(inner.sum())
        for c in np.unique(m[k][inner]).tolist():
            sel = inner & (m[k] == c)
            if good[sel].mean() < 0.99:
                out.append(f"sample {k}, class {c}: {good[sel].mean():.3f} of {int(sel.sum())} interior pixels hold its colour")
    if hits < 0.995 * total:
        out.append(f"{hits} of {total} interior pixels hold their label's colour")
    return out


def _serve(pack: Path, crop, workers: int = 0, epochs: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    with Loader(SegmentationDataset(pack), batch_size=5, shuffle=True, seed=3, crop=crop, flip=True,
                num_workers=workers) as loader:
        out = []
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            out += [(x.clone(), y.clone()) for x, y in loader]
    return out


@pytest.mark.parametrize("mode,crop", [("raw", "random"), ("encoded", "random"), ("raw", "center")])
def test_every_served_mask_label_sits_on_its_colour(packs, mode, crop):
    batches = _serve(packs[mode], CROPS[crop])
    assert len(batches) == 8 and all(x.shape == (5 if k % 4 < 3 else 1, 3, 48, 48) for k, (x, _) in enumerate(batches))
    problems = [p for x, y in batches for p in _problems(x, y, TOL[mode])]
    assert not problems, problems[:5]
    x, y = batches[0]
    assert y.shape == (5, 48, 48) and y.dtype == torch.uint8 and len(torch.unique(y)) > 2
    if crop == "random":  # the draws differ between samples and epochs: not one box for all
        assert len({bytes(m.numpy()) for _, ys in batches for m in ys}) == 32


def test_workers_and_a_resume_serve_the_same_pairs(packs):
    """2 workers give the inline pass's pairs, and a pass resumed after two batches its last three."""
    crop = CROPS["random"]
    inline = _serve(packs["raw"], crop, 0, epochs=1)
    assert all(torch.equal(u, v) for a, b in zip(inline, _serve(packs["raw"], crop, 2, epochs=1)) for u, v in zip(a, b))
    kw = dict(batch_size=5, shuffle=True, seed=3, crop=crop, flip=True)
    loader = Loader(SegmentationDataset(packs["raw"]), **kw)
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    again = Loader(SegmentationDataset(packs["raw"]), num_workers=2, **kw)
    again.load_state_dict(state)
    rest = list(again)
    again.close()
    assert len(rest) == 2 and all(torch.equal(u, v) for a, b in zip(rest, inline[2:]) for u, v in zip(a, b))
    assert not [p for x, y in rest for p in _problems(x, y, TOL["raw"])]


@pytest.mark.parametrize("wrong", ["mask not flipped", "mask cut with another box"])
def test_the_check_fails_for_a_mask_moved_unlike_its_image(packs, monkeypatch, wrong):
    """Negative controls: the wrong apply step, patched into images/geometry.py, is caught by the same check."""
    if wrong == "mask not flipped":
        real_flip = geometry.flip_into
        monkeypatch.setattr(geometry, "flip_into", lambda d, batch, rows: None if batch.ndim == 3 else real_flip(d, batch, rows))
    else:
        real_cut = geometry.mask_into

        def other_box(d, k, mask, out, fill=0):
            boxes = d.crop.boxes(d.heights, d.widths, (99, 0), np.arange(len(d.heights)))  # another key's boxes
            real_cut(replace(d, boxes=boxes), k, mask, out, fill)

        monkeypatch.setattr(geometry, "mask_into", other_box)
    problems = [p for x, y in _serve(packs["raw"], CROPS["random"], epochs=1) for p in _problems(x, y, TOL["raw"])]
    assert len(problems) > 10, problems
