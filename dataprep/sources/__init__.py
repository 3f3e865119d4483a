"""Sources stage: takes where the data already is, gives the samples per split in a fixed order, with
labels (and captions), and how to read each one's bytes. One listing module per kind of source:

    folders.py     class folders, the ImageNet layout (val labels files), flat trees
    webdataset.py  WebDataset tar shards (plain or gzip), grouped by key as WebDataset does
                   (its tar members read: tar_members.py; a sample's label and caption: wds_labels.py)
    parquet.py     Parquet files, Arrow IPC files and `datasets.save_to_disk` directories with an image column
                   (what pyarrow reads checked first: arrow_checks.py, and parquet_pages.py for Parquet pages,
                   their footer and headers read by parquet_footer.py, blanked by parquet_blanks.py)
                   (its inputs and columns checked: table_inputs.py; its cells read: table_cells.py)
                   (its listing, scan_parquet, still served from it: table_listing.py)
    pathlist.py    a CSV of path,label[,caption] rows relative to a root

listing.py holds what they all give (`Source`, `SplitSource`, the `Reader` protocol) and `--limit`'s
sampling. Kind-free: images, segmentation and volumes build from these listings.
"""
from __future__ import annotations

from .folders import (  # noqa: F401
                      IMAGE_EXTENSIONS,
                      KAGGLE_VAL_LABELS,
                      SPLIT_NAMES,
                      SYNSET_MAPPING,
                      read_val_labels,
                      scan_class_folders,
                      scan_files,
                      scan_folder,
                      scan_imagenet,
                      walk_images,
)
from .listing import FILES, FileReader, Reader, Source, SplitSource, spread, spread_by_class  # noqa: F401
