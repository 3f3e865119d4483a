"""dataprep: preprocess image, text and table data once, offline; serve it from RAM to PyTorch.

Importing the package is cheap: torch, OpenCV and Pillow load only when a name that needs them is used.
"""
from __future__ import annotations

__version__ = "0.1.0"

from .errors import DataprepError, PackError  # noqa: E402  (light: no heavy imports)

_LAZY = {
    "InMemoryImageDataset": ("dataprep.images.dataset", "InMemoryImageDataset"),
    "SegmentationDataset": ("dataprep.segmentation.dataset", "SegmentationDataset"),
    "VolumeDataset": ("dataprep.volumes.dataset", "VolumeDataset"),
    "Loader": ("dataprep.serve.loader", "Loader"),
    "Mixture": ("dataprep.serve.mixture", "Mixture"),
    "Partition": ("dataprep.serve.partition", "Partition"),
    "RandomResizedCrop": ("dataprep.images.crops", "RandomResizedCrop"),
    "CenterCrop": ("dataprep.images.crops", "CenterCrop"),
    "DaliImageLoader": ("dataprep.images.dali", "DaliImageLoader"),
    "DaliAugment": ("dataprep.images.dali", "DaliAugment"),
    "DaliNormalize": ("dataprep.images.dali", "DaliNormalize"),
    "TabularDataset": ("dataprep.tables.dataset", "TabularDataset"),
    "TokenDataset": ("dataprep.tokens.dataset", "TokenDataset"),
    "DocumentDataset": ("dataprep.tokens.dataset", "DocumentDataset"),
    "Schedule": ("dataprep.serve.progressive", "Schedule"),
    "Normalize": ("dataprep.serve.transfer", "Normalize"),
    "to_device": ("dataprep.serve.transfer", "to_device"),
    "ResolutionBatchSampler": ("dataprep.serve.progressive", "ResolutionBatchSampler"),
    "build_images": ("dataprep.images.build", "build_images"),
    "build_segmentation": ("dataprep.segmentation.build", "build_segmentation"),
    "build_volumes": ("dataprep.volumes.build", "build_volumes"),
    "read_manifest": ("dataprep.pack.backends", "read_manifest"),
    "gpu": ("dataprep.gpu", None),  # the submodule, imported on first use (torch): dataprep.gpu.RandomResizedCrop
}

__all__ = ["DataprepError", "PackError", "__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        module = importlib.import_module(mod)
        return module if attr is None else getattr(module, attr)
    raise AttributeError(f"module 'dataprep' has no attribute {name!r}")
