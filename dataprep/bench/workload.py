"""What `dataprep bench` times: takes the crop and flip a user names and the pack's manifest, gives the
Loader arguments that serve that workload, the decode paths that serve it differently, and the words
and JSON that say which workload a rate, and the pick, is for.

A rate holds for the workload it was timed on only: a JPEG pack's RandomResizedCrop batches decode the
restart segments around each box with decode="fast" (the default), and the whole image with any other
decode, so a decode picked from whole images can serve training crops far slower.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError
from ..images.crops import CenterCrop, RandomResizedCrop

CROP_FORMS = "rrc:SIZE (RandomResizedCrop), center:SIZE (CenterCrop) or SIZE (a fixed center window); SIZE is N or HxW"


def parse_crop(spec: str | None) -> Any:
    """A `--crop` value as the Loader's `crop=` takes it: RandomResizedCrop, CenterCrop or (H, W); None
    for none.

    Args:
        spec: "rrc:224", "center:224", "224" or "224x192" (any of them HxW).

    Returns:
        The crop, or None where `spec` is None.
    """
    if spec is None:
        return None
    m = re.fullmatch(r"(?:(rrc|center):)?(\d+)(?:x(\d+))?", spec.strip().lower())
    if m is None or int(m.group(2)) < 1 or int(m.group(3) or 1) < 1:
        raise UsageError(f"--crop {spec!r}: give {CROP_FORMS}")
    h, w = int(m.group(2)), int(m.group(3) or m.group(2))
    size: int | tuple[int, int] = h if h == w else (h, w)
    if m.group(1) == "rrc":
        return RandomResizedCrop(size)
    if m.group(1) == "center":
        return CenterCrop(size)
    return (h, w)


def _size_text(size: tuple[int, int]) -> str:
    return str(size[0]) if size[0] == size[1] else f"({size[0]}, {size[1]})"


@dataclass(frozen=True)
class Workload:
    """What every timed setting serves: the Loader's `crop` and `flip`, cut from the pack's stored images
    (`resolution` px, resized by `resize` at build), each decode path being a JPEG pack's `decode=`.

    `picked_crop`: the crop is bench's own (a variable-size pack's median shorter side), not the user's.
    `default_decode`: the dataset's default `decode=` (JPEG packs), what a pick is compared with."""

    crop: Any = None
    flip: bool = False
    resolution: int | None = None
    resize: str | None = None
    picked_crop: bool = False
    default_decode: str | None = None

    @property
    def training_crops(self) -> bool:
        """Whether decode="fast" serves these batches differently from "accurate" (images/batches.py)."""
        return isinstance(self.crop, RandomResizedCrop)

    def crop_text(self) -> str | None:
        """The crop as the dataprep name a user writes, e.g. "RandomResizedCrop(224)"; None for none."""
        c = self.crop
        if isinstance(c, RandomResizedCrop):
            return f"RandomResizedCrop({_size_text(c.size)})"
        if isinstance(c, CenterCrop):
            return f"CenterCrop({_size_text(c.size)})" if c.resize == round(max(c.size) / 0.875) else \
                f"CenterCrop({_size_text(c.size)}, resize={c.resize})"
        return None if c is None else f"({int(c[0])}, {int(c[1])})"

    def loader_args(self) -> str:
        """The Loader's keyword arguments for this workload, as a user writes them after the batch size."""
        c = self.crop_text()
        crop = "" if c is None else f", crop={c if c.startswith('(') else 'dataprep.' + c}"
        return crop + (", flip=True" if self.flip else "")

    def describe(self, path: str | None) -> str:
        """The workload in words, e.g. "RandomResizedCrop(224) + flip of the 256 px images, decode='fast'
        (the default)"; `path` is the decode path timed (None, or a gather path, where nothing decodes)."""
        c = self.crop_text()
        what = ("whole samples" if c is None else f"a {self.crop[0]}x{self.crop[1]} center window" if c.startswith("(")
                else c) + (" + flip" if self.flip else "")
        if self.picked_crop:
            what += " (bench's crop: the median shorter side; pass --crop for yours)"
        if self.resolution:
            what += f" of the {self.resolution} px images" + (f" (resize={self.resize!r})" if self.resize else "")
        if self.default_decode is not None and path is not None:
            what += f", decode={path!r}" + (" (the default)" if path == self.default_decode else "")
        return what

    def to_dict(self, path: str | None) -> dict[str, Any]:
        """The workload for JSON: crop (its dataprep name, or [H, W]), flip, resolution, resize, decode."""
        c = self.crop_text()
        crop: Any = [int(self.crop[0]), int(self.crop[1])] if c is not None and c.startswith("(") else c
        return {"crop": crop, "flip": self.flip, "resolution": self.resolution, "resize": self.resize,
                "crop_chosen_by_bench": self.picked_crop,
                "decode": path if self.default_decode is not None else None, "default_decode": self.default_decode}


def jpeg_paths(default: str, training_crops: bool) -> list[str]:
    """The decode= values that serve a JPEG pack's batches differently, the default first: each value a dataset
    takes once, except one whose entry (images/codec.py's DECODE_VARIANTS) serves what another does on this
    workload (`same_samples_as`: "accurate" serves what "fast" does except in training crops)."""
    from ..images.codec import DECODE_VARIANTS, DECODERS

    def same(d: str) -> bool:
        v = DECODE_VARIANTS.get(d)
        return v is not None and v.same_samples_as is not None and not (training_crops and v.except_training_crops)

    names = [d for d in DECODERS if DECODERS[d] is not None and not same(d)]
    return sorted(names, key=lambda d: d != default)


def image_settings(manifest: dict[str, Any]) -> tuple[int | None, str | None]:
    """(size, resize mode) an image pack's build stored its served images at; (None, None) for other packs."""
    image = (manifest.get("settings") or {}).get("image") or {}
    size = max(manifest["resolutions"]) if manifest.get("resolutions") else image.get("size")
    return (int(size) if size else None), image.get("resize")
