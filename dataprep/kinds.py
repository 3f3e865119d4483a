"""The registry of pack kinds: each kind is one package that owns both directions of its data, and this is
the one place that lists them. `verify`, `info` and `plan` ask a pack's kind for its fields here instead
of keeping tables keyed by kind; the storage layer (pack/) and serving (serve/) never need to.

A kind's package holds `field.py` with `fields_of(manifest)` (every field of such a pack),
`served_fields(manifest, resolution)` (those a dataset holds by default, the served one first) and
`summary(manifest)` (its lines in `dataprep info`; where its samples pack into rows, as tokens do,
`packed_rows` too), a build function and a dataset class. Adding a kind is one new package and one
line below (ARCHITECTURE.md, "How to add a kind"). Nothing is imported until a kind is used.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import PackError


@dataclass(frozen=True)
class Kind:
    name: str  # the manifest's "kind"
    package: str  # the kind's package, e.g. "dataprep.images"
    build: str  # the build function in <package>/build.py (tokens: tokenize.py)
    dataset: str  # the dataset class in <package>/dataset.py
    build_module: str = "build"

    def _module(self, name: str):
        return importlib.import_module(f"{self.package}.{name}")

    def fields_of(self, manifest: dict[str, Any], where: Path | str = "manifest") -> dict[str, Any]:
        """Every field of a pack of this kind, by manifest key."""
        return self._module("field").fields_of(manifest, where)

    def served_fields(self, manifest: dict[str, Any], resolution: int | None = None, where: Path | str = "manifest") -> dict[str, Any]:
        """The fields a dataset serves by default (the served one first)."""
        return self._module("field").served_fields(manifest, resolution, where)

    def summary(self, manifest: dict[str, Any]) -> list[str]:
        """Lines `dataprep info` prints about this kind's own settings."""
        return self._module("field").summary(manifest)

    def packed_rows(self, pack: str | Path, manifest: dict[str, Any], context: int, strategy: str) -> dict[str, Any] | None:
        """What packing each split into rows of `context` tokens gives (`dataprep info --context`: the
        kind's `packed_rows`), or None for a kind whose samples are not packed into rows."""
        plan = getattr(self._module("field"), "packed_rows", None)
        return None if plan is None else plan(pack, manifest, context, strategy)

    def build_function(self):
        return getattr(self._module(self.build_module), self.build)

    def dataset_class(self):
        return getattr(self._module("dataset"), self.dataset)


KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("images", "dataprep.images", "build_images", "InMemoryImageDataset"),
    Kind("segmentation", "dataprep.segmentation", "build_segmentation", "SegmentationDataset"),
    Kind("volumes", "dataprep.volumes", "build_volumes", "VolumeDataset"),
    Kind("detection", "dataprep.detection", "build_detection", "DetectionDataset"),
    Kind("tokens", "dataprep.tokens", "tokenize", "TokenDataset", build_module="tokenize"),
    Kind("table", "dataprep.tables", "build_table", "TabularDataset"),
    Kind("video", "dataprep.video", "build_video", "VideoDataset"),
)}


def kind_of(manifest: dict[str, Any], where: Path | str = "manifest") -> Kind:
    """The registered kind of a manifest, or a PackError naming it."""
    kind = manifest.get("kind")
    if kind not in KINDS:
        raise PackError(f"{where}: unknown pack kind {kind!r}; this dataprep knows {sorted(KINDS)}")
    return KINDS[kind]
