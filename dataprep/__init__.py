"""dataprep: preprocess image, text and table data once, offline; serve it from RAM to PyTorch.

Importing the package is cheap: torch, OpenCV and Pillow load only when a name that needs them is used.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import DataprepError, PackError, UsageError  # light: no heavy imports
from .version import __version__

_LAZY = {
    "InMemoryImageDataset": ("dataprep.images.dataset", "InMemoryImageDataset"),
    "SegmentationDataset": ("dataprep.segmentation.dataset", "SegmentationDataset"),
    "VolumeDataset": ("dataprep.volumes.dataset", "VolumeDataset"),
    "DetectionDataset": ("dataprep.detection.dataset", "DetectionDataset"),
    "VideoDataset": ("dataprep.video.dataset", "VideoDataset"),  # clips of a video pack
    "detection_collate": ("dataprep.detection.dataset", "collate"),  # a DetectionDataset through the stock DataLoader
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
    "PackedDocuments": ("dataprep.tokens.packed", "PackedDocuments"),  # rows of whole documents, with document ids
    "document_mask": ("dataprep.tokens.attention", "document_mask"),  # attention within packed documents (SDPA)
    "Schedule": ("dataprep.serve.progressive", "Schedule"),
    "DataWait": ("dataprep.serve.stats", "DataWait"),
    "Normalize": ("dataprep.serve.transfer", "Normalize"),
    "to_device": ("dataprep.serve.transfer", "to_device"),
    "ResolutionBatchSampler": ("dataprep.serve.progressive", "ResolutionBatchSampler"),
    "build_images": ("dataprep.images.build", "build_images"),
    "build_segmentation": ("dataprep.segmentation.build", "build_segmentation"),
    "build_volumes": ("dataprep.volumes.build", "build_volumes"),
    "build_detection": ("dataprep.detection.build", "build_detection"),
    "write_scenes": ("dataprep.detection.scenes", "write_scenes"),  # generated detection scenes (COCO and YOLO files)
    "read_manifest": ("dataprep.pack.backends", "read_manifest"),
    "is_pack": ("dataprep.pack.backends", "is_pack"),
    "build": ("dataprep.build", None),  # the front door: dataprep.build.imagenet(src, out, size=256), ...
    "tokenize": ("dataprep.build", "tokenize"),
    "gpu": ("dataprep.gpu", None),  # the submodule, imported on first use (torch): dataprep.gpu.RandomResizedCrop
}

__all__ = ["DataprepError", "PackError", "UsageError", "__version__", *_LAZY]

if TYPE_CHECKING:  # what IDEs and type checkers see; at run time __getattr__ imports these on first use
    from . import build, gpu
    from .build import tokenize
    from .detection.build import build_detection
    from .detection.dataset import DetectionDataset
    from .detection.dataset import collate as detection_collate
    from .detection.scenes import write_scenes
    from .images.build import build_images
    from .images.crops import CenterCrop, RandomResizedCrop
    from .images.dali import DaliAugment, DaliImageLoader, DaliNormalize
    from .images.dataset import InMemoryImageDataset
    from .pack.backends import is_pack, read_manifest
    from .segmentation.build import build_segmentation
    from .segmentation.dataset import SegmentationDataset
    from .serve.loader import Loader
    from .serve.mixture import Mixture
    from .serve.partition import Partition
    from .serve.progressive import ResolutionBatchSampler, Schedule
    from .serve.stats import DataWait
    from .serve.transfer import Normalize, to_device
    from .tables.dataset import TabularDataset
    from .tokens.attention import document_mask
    from .tokens.dataset import DocumentDataset, TokenDataset
    from .tokens.packed import PackedDocuments
    from .video.dataset import VideoDataset
    from .volumes.build import build_volumes
    from .volumes.dataset import VolumeDataset


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        module = importlib.import_module(mod)
        return module if attr is None else getattr(module, attr)
    raise AttributeError(f"module 'dataprep' has no attribute {name!r}")
