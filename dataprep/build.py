"""The Python front door for every build: `from dataprep import build`, then

    build.imagenet("/data/imagenet", "/fast/in256", size=256, workers=8)
    build.folder(src, out, size=160, mode="raw")
    build.webdataset(["shards/{000000..000127}.tar"], out, label_field="meta.label")
    build.parquet(files, out, image_column="image", label_column="label")
    build.list("files.csv", out)
    build.segmentation(images, masks, out, labels="configs/labels/cityscapes.yaml")
    build.coco(images, out, annotations="instances_train2017.json")
    build.yolo("datasets/coco8", out, split="val")
    build.volumes(src, out, shape=(64, 128, 128))
    build.video("clips/", out, size=128, fps=8)
    build.table("train.csv", out, target="label")
    build.tokenize(["corpus/"], out, tokenizer="tokenizer.json")      # also dataprep.tokenize

Each takes the options of its `dataprep` command, underscores for dashes, with the same defaults and the
same checks (dataprep/options.py: the *_OPTIONS tables, which the CLI takes its defaults from), typed by
the table's TypedDict (`**options: Unpack[ImageOptions]`: an IDE completes them, mypy checks them), runs the
build and returns its summary (`.lines()` is what the CLI prints). Progress is off unless `progress=True`
(a bar on a terminal, plain lines in a log); notices (where a Dask engine runs, which val labels file was
found) go to stderr with progress, and are kept in the summary's `notices` either way. The CLI
(dataprep/cli/build.py, tokenize.py, table.py) is a thin layer over these: it parses, calls, and prints.
A bad option value is a `dataprep.UsageError` (a ValueError), an unknown option name a TypeError.
The run itself (engine, staged output, progress, notices, Ctrl-C) is dataprep/build_run.py's, and the
arguments as the builds take them (settings, paths, shapes, column names) dataprep/build_args.py's.
"""
from __future__ import annotations

import builtins
import functools
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from .build_args import _image_settings, _names, _paths, _settings, _triple
from .build_run import _NOTICES, BuildInterrupted, TableSummary, TokenizeSummary, _Notices, _out_name, _running, _shown, notices_to, run  # noqa: F401
from .errors import NothingStored, UsageError
from .options import (
    DETECTION_OPTIONS,
    IMAGE_OPTIONS,
    TABLE_OPTIONS,
    TOKENIZE_OPTIONS,
    VIDEO_OPTIONS,
    VOLUME_OPTIONS,
    ImageOptions,
    RunOptions,
    ShardOptions,
    TableOptions,
    TokenizeOptions,
    VideoOptions,
    VolumeOptions,
)
from .options import check as _check
from .options import options as _options

if sys.version_info >= (3, 11):
    from typing import Unpack
else:  # PEP 692's Unpack is typing's from 3.11; before, typing_extensions' (setup.cfg requires it there)
    from typing_extensions import Unpack

if TYPE_CHECKING:
    from .driver import BuildSummary

__all__ = ["DETECTION_OPTIONS", "IMAGE_OPTIONS", "TABLE_OPTIONS", "TOKENIZE_OPTIONS", "VIDEO_OPTIONS", "VOLUME_OPTIONS", "BuildInterrupted",
           "ImageOptions", "NothingStored", "RunOptions", "ShardOptions", "TableOptions", "TableSummary", "TokenizeOptions", "TokenizeSummary",
           "VideoOptions", "VolumeOptions", "coco", "folder", "imagenet", "list", "parquet", "segmentation", "table", "tokenize", "video",
           "volumes", "webdataset", "yolo"]


def _image_build(source, o: dict[str, Any], build_fn=None, noun: str = "images", notices: _Notices | None = None) -> BuildSummary:
    from .images.build import build_images

    build_fn = build_fn or build_images
    if o.get("drop_duplicates"):  # the audit's drop rule, applied to the built shards (dataprep/audit/drop.py)
        build_fn = functools.partial(build_fn, drop_duplicates=True)
    fn = functools.partial(_with_image, build_fn, _image_settings(o))
    return run(source, fn, _settings(o), o, noun, notices)


def _with_image(build_fn, image, source, out, settings, **kw):
    return build_fn(source, out, settings, image, **kw)


def _tokenized(tokenize: str | os.PathLike | None):
    """The image build with captions tokenized by `tokenize` (a tokenizers JSON file); None without it."""
    if tokenize is None:
        return None
    from .images.build import build_images

    return functools.partial(build_images, tokenizer=tokenize)


def imagenet(src: str | os.PathLike, out: str | os.PathLike, *, splits: Sequence[str] | str | None = None,
             val_labels: str | os.PathLike | None = None, allow_empty_classes: bool = False,
             **options: Unpack[ImageOptions]) -> BuildSummary:
    """Pack an ImageNet tree: `SRC/train/<wnid>/*.JPEG` and `SRC/val/`.

    Labels are the indices of the sorted train folders (torchvision's ImageFolder order). `SRC/val/` is in
    class folders, or flat with a labels file.

    Args:
        src: The ImageNet folder.
        out: The pack's folder.
        splits: The splits to pack ("train,val" or a sequence); None packs every split found.
        val_labels: The labels file of a flat val/; None looks beside SRC.
        allow_empty_classes: Keep a class folder that holds no image.
        **options: The image options, as the command takes them: `size`, `mode`, `workers`, ... (`ImageOptions`;
            their defaults: `IMAGE_OPTIONS`).

    Returns:
        The build's summary; `.lines()` is what the CLI prints.
    """
    from .sources import scan_imagenet

    o = {**_options(options, IMAGE_OPTIONS, "imagenet"), "out": out}
    names = tuple(x.strip() for x in splits.split(",") if x.strip()) if isinstance(splits, str) else (tuple(splits) if splits else None)
    source = scan_imagenet(src, names or None, val_labels, allow_empty_classes, max_bytes=o["max_bytes"])
    notices = _Notices(o["progress"])
    if source.val_labels:
        notices(f"val labels: {source.val_labels}")
    summary = _image_build(source, o, notices=notices)
    summary.val_labels = source.val_labels
    return summary


def folder(src: str | os.PathLike, out: str | os.PathLike, *, split: str = "train", allow_empty_classes: bool = False,
           allow_split_named_classes: bool = False, **options: Unpack[ImageOptions]) -> BuildSummary:
    """Pack a class-folder tree: `SRC/<class>/**/<image files>`.

    Args:
        src: The folder of class folders.
        out: The pack's folder.
        split: The split's name.
        allow_empty_classes: Keep a class folder that holds no image.
        allow_split_named_classes: Take class folders all named like splits (train, val) as classes; without
            it such a root is refused.
        **options: The image options, as the command takes them: `size`, `mode`, `workers`, ... (`ImageOptions`;
            their defaults: `IMAGE_OPTIONS`).

    Returns:
        The build's summary; `.lines()` is what the CLI prints.
    """
    from .sources import scan_folder

    o = {**_options(options, IMAGE_OPTIONS, "folder"), "out": out}
    return _image_build(scan_folder(src, split, allow_empty_classes, allow_split_named_classes, max_bytes=o["max_bytes"]), o)


def webdataset(tars: Sequence[str | os.PathLike] | str | os.PathLike, out: str | os.PathLike, *, split: str = "train",
               label_field: str | None = None, caption_field: str | None = None, tokenize: str | os.PathLike | None = None,
               **options: Unpack[ImageOptions]) -> BuildSummary:
    """Pack WebDataset tar shards, plain or compressed.

    Args:
        tars: Files, globs or brace patterns ('shards/train-{000000..000127}.tar').
        out: The pack's folder.
        split: The split's name.
        label_field: The label's field in each sample's .json (it wins over .cls); None reads .cls.
        caption_field: The caption's field in the .json; None reads .txt.
        tokenize: A tokenizer JSON file; the captions are tokenized with it too.
        **options: The image options, as the command takes them: `size`, `mode`, `workers`, ... (`ImageOptions`;
            their defaults: `IMAGE_OPTIONS`).

    Returns:
        The build's summary; `.lines()` is what the CLI prints.
    """
    from .sources.webdataset import scan_webdataset

    o = {**_options(options, IMAGE_OPTIONS, "webdataset"), "out": out}
    source = scan_webdataset(_paths(tars, "tars"), split, label_field, caption_field, strict=o["strict"], max_bytes=o["max_bytes"])
    return _image_build(source, o, _tokenized(tokenize))


def parquet(files: Sequence[str | os.PathLike] | str | os.PathLike, out: str | os.PathLike, *, image_column: str = "image",
            label_column: str | None = None, caption_column: str | None = None, split: str = "train",
            tokenize: str | os.PathLike | None = None, **options: Unpack[ImageOptions]) -> BuildSummary:
    """Pack tables with an image column.

    Args:
        files: Parquet files, Arrow IPC files or streams, globs of them, or `datasets` save_to_disk folders.
        out: The pack's folder.
        image_column: The column of encoded images.
        label_column: The column of labels; None for none.
        caption_column: The column of captions; None for none.
        split: The split's name; it also picks a DatasetDict's split.
        tokenize: A tokenizer JSON file; the captions are tokenized with it too.
        **options: The image options, as the command takes them: `size`, `mode`, `workers`, ... (`ImageOptions`;
            their defaults: `IMAGE_OPTIONS`).

    Returns:
        The build's summary; `.lines()` is what the CLI prints.
    """
    from .sources.parquet import scan_parquet

    o = {**_options(options, IMAGE_OPTIONS, "parquet"), "out": out}
    source = scan_parquet(_paths(files, "files"), split, image_column, label_column, caption_column, strict=o["strict"],
                          max_bytes=o["max_bytes"])
    return _image_build(source, o, _tokenized(tokenize))


def list(csv_file: str | os.PathLike, out: str | os.PathLike, *, root: str | os.PathLike | None = None, split: str = "train",  # noqa: A001
         tokenize: str | os.PathLike | None = None, **options: Unpack[ImageOptions]) -> BuildSummary:
    """Pack the files a CSV lists, one `path,label[,caption]` row each.

    A row whose path leaves the root or names no file is skipped, with its reason. The name is the
    command's, `dataprep build list`; inside this module the builtin is builtins.list.

    Args:
        csv_file: The CSV.
        out: The pack's folder.
        root: The folder the paths are relative to; None is the CSV's folder.
        split: The split's name.
        tokenize: A tokenizer JSON file; the captions are tokenized with it too.
        **options: The image options, as the command takes them: `size`, `mode`, `workers`, ... (`ImageOptions`;
            their defaults: `IMAGE_OPTIONS`).

    Returns:
        The build's summary; `.lines()` is what the CLI prints.
    """
    from .sources.pathlist import scan_list

    o = {**_options(options, IMAGE_OPTIONS, "list"), "out": out}
    return _image_build(scan_list(csv_file, root, split, strict=o["strict"], max_bytes=o["max_bytes"]), o, _tokenized(tokenize))


def segmentation(images: str | os.PathLike, masks: str | os.PathLike, out: str | os.PathLike, *,
                 pairs: str | os.PathLike | None = None, image_suffix: str = "", mask_suffix: str = "", split: str = "train",
                 labels: str | os.PathLike | None = None, mask_dtype: str = "auto", num_classes: int | None = None,
                 **options: Unpack[ImageOptions]) -> BuildSummary:
    """Pack image/mask pairs for semantic segmentation.

    Masks are resized nearest, never interpolated. Pairs match by relative path and stem (less the
    suffixes), or are listed in a CSV.

    Args:
        images: The folder of images.
        masks: The folder of masks.
        out: The pack's folder.
        pairs: A CSV of image,mask pairs; None pairs by stem.
        image_suffix: What image stems end with, dropped to pair them (e.g. "_leftImg8bit").
        mask_suffix: What mask stems end with, dropped to pair them; masks without it are ignored.
        split: The split's name when `images` has no train/val/test folders.
        labels: A label map YAML: ids to stored ids, the ignore value, class names, colours.
        mask_dtype: "uint8", "uint16" or "auto" (uint8 unless a mask holds values above 255).
        num_classes: Mask values at or above it (but the ignore value) are out of range; None takes it
            from the label map.
        **options: The image options, as the command takes them: `size`, `mode`, `workers`, ... (`ImageOptions`;
            their defaults: `IMAGE_OPTIONS`).

    Returns:
        The build's summary; `.lines()` is what the CLI prints.
    """
    from .segmentation.build import build_segmentation
    from .segmentation.masks import LabelMap
    from .segmentation.pairs import pair_by_stem, pair_from_file

    o = {**_options(options, IMAGE_OPTIONS, "segmentation"), "out": out}
    _check({"mask_dtype": mask_dtype, "num_classes": num_classes})
    if labels is not None and not os.path.isfile(labels):
        raise UsageError(f"labels={os.fspath(labels)!r}: no such label map file")
    source = pair_from_file(images, masks, pairs, split) if pairs else pair_by_stem(images, masks, image_suffix, mask_suffix, split)
    fn = functools.partial(build_segmentation, labels=LabelMap.load(Path(labels)) if labels else None,
                           mask_dtype=None if mask_dtype == "auto" else mask_dtype, num_classes=num_classes)
    return _image_build(source, o, fn, noun="pairs")


def coco(images: str | os.PathLike, out: str | os.PathLike, *, annotations: str | os.PathLike, split: str = "train",
         max_boxes: int = DETECTION_OPTIONS["max_boxes"], **options: Unpack[ImageOptions]) -> BuildSummary:
    """Pack images with boxes from a COCO instances file.

    Category ids become contiguous labels in id order, their names the classes. Crowd flags are kept.
    Boxes are clipped to their image; degenerate ones are skipped and counted. An image without
    annotations is kept with no boxes.

    Args:
        images: The folder of images.
        out: The pack's folder.
        annotations: The COCO instances JSON file.
        split: The split's name.
        max_boxes: An image with more boxes is skipped ("too many boxes").
        **options: The image options (`ImageOptions`; their defaults: `IMAGE_OPTIONS`); the boxes move with the
            images.

    Returns:
        The build's summary; `.lines()` is what the CLI prints.
    """
    from .sources.coco import scan_coco

    o = {**_options(options, IMAGE_OPTIONS, "coco"), "out": out}
    fn = _detection(o, "coco", max_boxes)
    return _image_build(scan_coco(images, annotations, split, strict=o["strict"], max_bytes=o["max_bytes"]), o, fn)


def yolo(root: str | os.PathLike, out: str | os.PathLike, *, split: str = "train", max_boxes: int = DETECTION_OPTIONS["max_boxes"],
         **options: Unpack[ImageOptions]) -> BuildSummary:
    """Pack a YOLO dataset: `ROOT/images` and `ROOT/labels/*.txt` (normalised cx cy w h).

    The folders are flat or in split folders (`images/train`, `labels/train`). Class names come from
    `ROOT/classes.txt` or `ROOT/data.yaml`.

    Args:
        root: The dataset's folder.
        out: The pack's folder.
        split: The split folder to pack, and the pack's split name.
        max_boxes: An image with more boxes is skipped ("too many boxes").
        **options: The image options (`ImageOptions`; their defaults: `IMAGE_OPTIONS`); the boxes move with the
            images.

    Returns:
        The build's summary; `.lines()` is what the CLI prints.
    """
    from .sources.yolo import scan_yolo

    o = {**_options(options, IMAGE_OPTIONS, "yolo"), "out": out}
    fn = _detection(o, "yolo", max_boxes)
    return _image_build(scan_yolo(root, split, strict=o["strict"], max_bytes=o["max_bytes"]), o, fn)


def _detection(o: dict[str, Any], what: str, max_boxes: int):
    """The detection build with its cap on boxes per image, the options checked first."""
    from .detection.build import build_detection

    checked = {"max_boxes": max_boxes}
    _check(checked)
    _no_drop(o, what)
    return functools.partial(build_detection, max_boxes=checked["max_boxes"])


def _no_drop(o: dict[str, Any], what: str) -> None:
    """Refuse drop_duplicates for detection builds: their hashes are stored, but the drop's shard rewrite
    carries per-image rows only, not the boxes."""
    if o["drop_duplicates"]:
        raise UsageError(f"drop_duplicates: {what} builds cannot drop duplicates (the drop rewrites per-image rows; a detection "
                         "shard's boxes are rows of boxes, which it does not carry); build without it, audit the pack with "
                         "`dataprep audit`, and leave the duplicates out of the annotations")


def volumes(src: str | os.PathLike, out: str | os.PathLike, **options: Unpack[VolumeOptions]) -> BuildSummary:
    """Pack 3-D volumes: `SRC/<class>/**/*.npy|*.tif` (labelled) or `SRC/**/*.npy|*.tif`.

    Volumes are stored uint16 (or uint8) with their shapes.

    Args:
        src: The folder of volumes.
        out: The pack's folder.
        **options: The volume options: `shape`, `window`, `masks` (a folder of label volumes paired by
            path), ... (`VolumeOptions`; their defaults: `VOLUME_OPTIONS`).

    Returns:
        The build's summary; `.lines()` is what the CLI prints.
    """
    from .sources import scan_files
    from .volumes.build import VolumeSettings, build_volumes
    from .volumes.read import VOLUME_EXTENSIONS

    o = {**_options(options, VOLUME_OPTIONS, "volumes"), "out": out}
    shape = _triple(o["shape"], "shape", int, 3, "a shape D,H,W such as 64,128,128, each side from 1 to 16384")
    window = _triple(o["window"], "window", float, 2, "LO,HI of finite numbers (e.g. -1000,2000)")
    vs = VolumeSettings(shape, int(o["depth"]), window, o["resample"])
    source = scan_files(src, o["split"], VOLUME_EXTENSIONS)
    fn = functools.partial(build_volumes, volume=vs, masks=o["masks"], mask_dtype=None if o["mask_dtype"] == "auto" else o["mask_dtype"])
    return run(source, fn, _settings(o), o, "volumes")


def video(src: str | os.PathLike, out: str | os.PathLike, *, root: str | os.PathLike | None = None,
          **options: Unpack[VideoOptions]) -> BuildSummary:
    """Pack videos as JPEG frames at the training size: `SRC/<split>/<class>/*.mp4|mkv|webm|avi|mov`,
    `SRC/<class>/*.mp4` (one split), or a CSV of `path,label` rows.

    Every kept frame is stored as a JPEG (shorter side to `size`, as images), with each frame's timestamp and
    where each video's frames begin. Decoding needs PyAV (`pip install 'dataprep[video]'`).

    Args:
        src: A folder of split folders or class folders, or a CSV file.
        out: The pack's folder.
        root: The folder a CSV's paths are relative to; None is the CSV's folder.
        **options: The video options: `size`, `fps`, `max_frames`, `max_seconds`, `workers`, ... (`VideoOptions`;
            their defaults: `VIDEO_OPTIONS`).

    Returns:
        The build's summary; `.lines()` is what the CLI prints.
    """
    from .images.settings import ImageSettings
    from .video.build import build_video, scan_videos
    from .video.read import VideoSettings

    o = {**_options(options, VIDEO_OPTIONS, "video"), "out": out}
    image = ImageSettings(size=o["size"], sizes=o["sizes"], resize=o["resize"], upscale=o["upscale"], quality=o["quality"])
    vs = VideoSettings(o["fps"], o["max_frames"], o["max_seconds"])
    source = scan_videos(src, o["split"], root, strict=o["strict"])
    return run(source, functools.partial(build_video, image=image, video=vs), _settings(o), o, "videos")


def tokenize(src: Sequence[str | os.PathLike] | str | os.PathLike, out: str | os.PathLike,
             **options: Unpack[TokenizeOptions]) -> TokenizeSummary:
    """Tokenize text into a token pack: uint16/uint32 token arrays with a document index.

    Args:
        src: Files, directories or globs of .txt, .jsonl, .csv, .parquet, ...
        out: The pack's folder.
        **options: The options of `dataprep tokenize`: `tokenizer` (a Hugging Face tokenizers JSON file)
            or `train_bpe` (a byte-level BPE of that many tokens, trained first), ... (`TokenizeOptions`;
            their defaults: `TOKENIZE_OPTIONS`).

    Returns:
        The summary; `.lines()` is what `dataprep tokenize` prints.
    """
    from .tokens.read import expand
    from .tokens.tokenize import TokenizeSettings
    from .tokens.tokenize import tokenize as tokenize_files

    o = {**_options(options, TOKENIZE_OPTIONS, "tokenize"), "out": out}
    settings = TokenizeSettings(split=o["split_docs"], text_field=o["text_field"], eot=o["eot"], eot_id=o["eot_id"],
                                val_fraction=float(o["val_fraction"]), seed=o["seed"], chunk_bytes=o["chunk_mb"] << 20,
                                task_bytes=o["task_mb"] << 20, strict=o["strict"])
    files = expand(_paths(src, "src"))
    notices = _Notices(o["progress"])
    with _running(out, o, o["workers"], "tokenize", sum(os.path.getsize(f) for f in files), "bytes", notices,
                  o["resume"]) as (eng, target, bar, after):
        r = tokenize_files(files, target, settings, o["tokenizer"], o["train_bpe"], o["overwrite"], progress=bar, engine=eng,
                           resume=o["resume"])
    summary = TokenizeSummary(r, files=len(files))
    summary.out, summary.after, summary.notices = _shown(out), after, builtins.list(notices)
    return summary


def table(src: Sequence[str | os.PathLike] | str | os.PathLike, out: str | os.PathLike, *, target: str,
          **options: Unpack[TableOptions]) -> TableSummary:
    """Convert tables to typed arrays: floats, integer codes with vocabularies, statistics and splits.

    Args:
        src: CSV, TSV, Parquet, JSON lines, Excel, ... files.
        out: The pack's folder.
        target: The target column: a name, or a position such as -1 without a header.
        **options: The options of `dataprep table`: `val_fraction`, `missing`, `categorical`, ...
            (`TableOptions`; their defaults: `TABLE_OPTIONS`).

    Returns:
        The summary; `.lines()` is what `dataprep table` prints.
    """
    from .tables.build import build_table, input_bytes
    from .tables.columns import TableSettings

    o = {**_options(options, TABLE_OPTIONS, "table"), "out": out}
    settings = TableSettings(target=target, task=o["task"], float_dtype=o["float_dtype"], missing=o["missing"],
                             fill_value=float(o["fill_value"]), datetime=o["datetime"], categorical=_names(o["categorical"]),
                             numeric=_names(o["numeric"]), dates=_names(o["dates"]), drop=_names(o["drop"]),
                             val_fraction=float(o["val_fraction"]), split_column=o["split_column"], seed=o["seed"],
                             max_categories=o["max_categories"], drop_missing_target=o["drop_missing_target"],
                             keep_ids=o["keep_ids"])
    read = {"fmt": o["input_format"], "sep": o["sep"], "header": o["header"], "skip_rows": o["skip_rows"],
            "names": builtins.list(_names(o["names"])) or None}
    if o["target_file"] is not None and not os.path.isfile(o["target_file"]):
        raise UsageError(f"target_file={os.fspath(o['target_file'])!r}: no such file")
    paths = _paths(src, "src")
    notices = _Notices(o["progress"])
    with _running(out, o, o["workers"], "table", input_bytes(paths), "bytes", notices) as (eng, target_dir, bar, after):
        r = build_table(paths, target_dir, settings, read, o["target_file"], o["overwrite"], engine=eng, progress=bar)
    summary = TableSummary(r)
    summary.out, summary.after, summary.notices = _shown(out), after, builtins.list(notices)
    return summary
