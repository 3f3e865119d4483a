"""Pairing stage: takes an image directory and a mask directory (or a mapping file), gives image/mask
pairs per split in a fixed order, and the files that have no partner.

By stem: an image and a mask pair when their paths relative to their roots, without extension (and
without an optional suffix such as Cityscapes' `_leftImg8bit` / `_gtFine_labelIds`), are equal. Top-level
folders named like splits (train, val, test, ...) in the image directory become splits, with the same
folders expected under the mask directory; otherwise everything is one split.
By mapping file: a CSV with header `image,mask` (and optionally `split`), paths relative to the two roots.
"""
from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import SourceError
from ..sources import spread, walk_images

SPLIT_NAMES = ("train", "val", "validation", "valid", "test")


@dataclass
class PairSplit:
    name: str
    paths: list[str]  # images, relative to the image root, in pack order
    masks: list[str]  # their masks, relative to the mask root
    unpaired: list[dict] = field(default_factory=list)  # {"source", "reason", "detail"} for files with no partner

    def limited(self, limit: int | None) -> "PairSplit":
        """A deterministic sample of `limit` pairs spread evenly over the split."""
        idx = spread(len(self.paths), limit)
        if idx is None:
            return self
        return PairSplit(self.name, [self.paths[i] for i in idx], [self.masks[i] for i in idx], [])

    def skipped_before(self) -> list[dict]:
        return self.unpaired


@dataclass
class PairSource:
    layout: str  # "stems" | "mapping"
    root: Path  # the image root
    mask_root: Path
    splits: list[PairSplit]

    def planned(self, limit: int | None = None) -> int:
        return sum(len(s.limited(limit).paths) for s in self.splits)


def _dir(p: str | os.PathLike, what: str) -> Path:
    p = Path(p)
    if not p.is_dir():
        raise SourceError(f"{p}: the {what} directory does not exist or is not a directory")
    return p


def _keyed(root: Path, folder: Path, suffix: str, what: str) -> dict[str, str]:
    """{key: path relative to root} for image files under folder; the key drops the extension and `suffix`.
    With a suffix, files whose stem lacks it are not candidates (Cityscapes' _color, _instanceIds files)."""
    out: dict[str, str] = {}
    for p in walk_images(folder):
        rel = p.relative_to(folder).with_suffix("").as_posix()
        if suffix:
            if not rel.endswith(suffix):
                continue
            rel = rel[: -len(suffix)]
        if rel in out:
            raise SourceError(f"{folder}: two {what} files have the key {rel!r}: {out[rel]} and {p.relative_to(root).as_posix()}")
        out[rel] = p.relative_to(root).as_posix()
    return out


def pair_by_stem(images: str | os.PathLike, masks: str | os.PathLike, image_suffix: str = "", mask_suffix: str = "",
                 split: str = "train") -> PairSource:
    """Pair images and masks by relative path without extension (and suffixes)."""
    iroot, mroot = _dir(images, "image"), _dir(masks, "mask")
    named = sorted(d.name for d in iroot.iterdir() if d.is_dir() and d.name.lower() in SPLIT_NAMES)
    folders = [(n, iroot / n, mroot / n) for n in named] if named else [(split, iroot, mroot)]
    splits = []
    for name, ifold, mfold in folders:
        if not mfold.is_dir():
            raise SourceError(f"{mfold}: the mask directory has no {name!r} folder, which the image directory has")
        imgs = _keyed(iroot, ifold, image_suffix, "image")
        msks = _keyed(mroot, mfold, mask_suffix, "mask")
        keys = sorted(imgs.keys() & msks.keys())
        unpaired = [{"source": imgs[k], "reason": "no mask", "detail": f"no mask for {k!r} under {mfold}"}
                    for k in sorted(imgs.keys() - msks.keys())]
        unpaired += [{"source": msks[k], "reason": "no image", "detail": f"no image for {k!r} under {ifold}"}
                     for k in sorted(msks.keys() - imgs.keys())]
        splits.append(PairSplit(name, [imgs[k] for k in keys], [msks[k] for k in keys], unpaired))
    if not any(s.paths for s in splits):
        raise SourceError(f"{iroot} and {mroot}: no image has a mask (suffixes {image_suffix!r} / {mask_suffix!r})")
    return PairSource("stems", iroot, mroot, splits)


def pair_from_file(images: str | os.PathLike, masks: str | os.PathLike, mapping: str | os.PathLike,
                   split: str = "train") -> PairSource:
    """Pairs listed in a CSV file with columns image, mask and optionally split, in the file's order."""
    iroot, mroot, mapping = _dir(images, "image"), _dir(masks, "mask"), Path(mapping)
    try:
        with open(mapping, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise SourceError(f"{mapping}: cannot read the mapping file ({e})") from None
    if not rows or not {"image", "mask"} <= set(rows[0]):
        raise SourceError(f"{mapping}: a mapping file is a CSV with a header holding 'image' and 'mask' columns")
    by_split: dict[str, PairSplit] = {}
    for line, row in enumerate(rows, start=2):
        img, msk = (row.get("image") or "").strip(), (row.get("mask") or "").strip()
        s = by_split.setdefault((row.get("split") or split).strip() or split, PairSplit((row.get("split") or split).strip() or split, [], []))
        if not img or not msk:
            raise SourceError(f"{mapping}:{line}: an empty image or mask path")
        if not (iroot / img).is_file():
            s.unpaired.append({"source": msk, "reason": "no image", "detail": f"{mapping}:{line}: {iroot / img} does not exist"})
        elif not (mroot / msk).is_file():
            s.unpaired.append({"source": img, "reason": "no mask", "detail": f"{mapping}:{line}: {mroot / msk} does not exist"})
        else:
            s.paths.append(img)
            s.masks.append(msk)
    return PairSource("mapping", iroot, mroot, [by_split[k] for k in sorted(by_split)])
