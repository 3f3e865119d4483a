"""`dataprep build imagenet|folder|webdataset|parquet|list|segmentation|coco|yolo|volumes|video`: parse the options, call
the front door's build of the same name (dataprep/build.py: it lists the source, makes the settings and
runs the build), print its summary. The options' defaults are the front door's (IMAGE_OPTIONS,
VOLUME_OPTIONS), so the two never drift apart."""
from __future__ import annotations

import click

from ..build import DETECTION_OPTIONS as DET
from ..build import IMAGE_OPTIONS as IMG
from ..build import VIDEO_OPTIONS as VID
from ..build import VOLUME_OPTIONS as VOL
from ..images.resize import RESIZE_MODES
from ..images.settings import IMAGE_MODES
from .config import config_option
from .engine import engine_options
from .numbers import Ranged
from .profile import profile_option
from .progress import progress_option, shown
from .storage import storage_options


def _sizes(ctx, param, value):
    if value in (None, ""):
        return ()
    try:
        sizes = tuple(int(v) for v in str(value).split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a list of sizes like 128,192,256", ctx, param) from None
    if not sizes or any(not 8 <= s <= 16384 for s in sizes):
        raise click.BadParameter("sizes must be between 8 and 16384", ctx, param)
    return sizes


def _byte_cap(ctx, param, value):
    """--max-bytes as a user writes it (268435456, 256MiB, 1.5GiB): an int."""
    from ..errors import DataprepError
    from ..limits import parse_bytes

    if value is None:
        return None
    try:
        return parse_bytes(value)
    except DataprepError as e:
        raise click.BadParameter(str(e), ctx, param) from None


def max_bytes_option(default: str, what: str):
    return click.option(
        "--max-bytes", callback=_byte_cap, default=default, show_default=True, metavar="BYTES",
        help=f"Cap on one {what}'s source bytes (256MiB, 1.5GiB, ...): a larger one is skipped with its reason, "
             "found from its declared size before it is read; recorded in the manifest.")


def run_options(defaults: dict, what: str, limit: str, shards: str, strict: str):
    """The options every non-image build command ends with (workers, limit, shards, strictness, byte cap,
    overwrite, resume, progress, config, profile, engine, storage), with the kind's defaults and wording.

    Args:
        defaults: the kind's options table (strict, max_bytes).
        what: one source, as the byte cap's help names it ("volume", "video").
        limit, shards, strict: the help of --limit, --shard-size and --strict.

    Returns:
        A decorator for the command.
    """
    opts = [
        click.option("--workers", "-j", type=Ranged("workers"), default=None, help="Processes [default: all cores]."),
        click.option("--limit", type=Ranged("limit"), default=None, help=limit),
        click.option("--shard-size", type=Ranged("shard_size"), default=None, help=shards),
        click.option("--strict/--skip-bad", default=defaults["strict"], show_default=True, help=strict),
        max_bytes_option(defaults["max_bytes"], what),
        click.option("--overwrite", is_flag=True, help="Replace a pack or unfinished build already in --out."),
        click.option("--resume", is_flag=True, help="Continue an interrupted build, keeping its intact shards."),
        progress_option, config_option, profile_option, engine_options, storage_options,
    ]

    def decorate(f):
        for o in reversed(opts):
            f = o(f)
        return f
    return decorate


def image_build_options(f):
    """Options shared by every image build command (one definition, so they never drift apart)."""
    f = _one_size_option(f)
    opts = [
        click.option("--out", "-o", required=True, type=click.Path(), help="Pack to create: a directory (npy, zarr) or an .h5 file (hdf5)."),
        click.option("--size", type=Ranged("size"), default=IMG["size"], show_default=True, help="Target size in pixels."),
        click.option("--sizes", default=None, callback=_sizes,
                     help="Several sizes in one pass, e.g. 128,192,256,512 (each image decoded once); replaces --size."),
        click.option(
            "--resize",
            type=click.Choice(sorted(RESIZE_MODES)),
            default=IMG["resize"],
            show_default=True,
            help="; ".join(f"{m.name}: {m.help}" for m in RESIZE_MODES.values()),
        ),
        click.option("--upscale/--no-upscale", default=IMG["upscale"], show_default=True, help="Enlarge images smaller than SIZE."),
        click.option("--grayscale/--color", default=IMG["grayscale"], show_default=True, help="Store 1-channel images."),
        click.option("--mode", type=click.Choice(IMAGE_MODES), default=IMG["mode"], show_default=True,
                     help="encoded: JPEG bytes, decoded when served; raw: decoded uint8 pixels."),
        click.option("--depth", type=click.Choice(["8", "16"]), default=str(IMG["depth"]), show_default=True,
                     help="Bits per channel stored. 16 keeps 16-bit PNG/TIFF values exactly (with --mode raw); "
                          "8 scales 16-bit sources by round(x / 257), never truncates."),
        click.option("--quality", type=Ranged("quality"), default=IMG["quality"], show_default=True, help="JPEG quality."),
        click.option("--keep-jpeg/--reencode", default=IMG["keep_jpeg"], show_default=True,
                     help="Store a source JPEG as it is (its coefficients, with restart markers added) when it needs no resize and no conversion."),
        click.option("--workers", "-j", type=Ranged("workers"), default=None, help="Processes [default: all cores]."),
        click.option("--limit", type=Ranged("limit"), default=None, help="Build only N images per split, spread over the classes."),
        click.option("--shard-size", type=Ranged("shard_size"), default=None, help="Images per shard [default: from the split's size]."),
        click.option("--strict/--skip-bad", default=IMG["strict"], show_default=True,
                     help="Fail on the first undecodable file instead of skipping it."),
        max_bytes_option(IMG["max_bytes"], "image"),
        click.option("--overwrite", is_flag=True, help="Replace a pack or unfinished build already in --out."),
        click.option("--resume", is_flag=True,
                     help="Continue an interrupted build: shards finished with the same inputs and settings, "
                          "and intact by checksum, are kept; the rest are built."),
        click.option("--drop-duplicates", is_flag=True, default=IMG["drop_duplicates"],
                     help="Leave out exact and near duplicates (dataprep audit's default distance): a val or test image "
                          "with a near twin in train, and within a split every copy after the first; counted in the "
                          "summary and the manifest. The shards are built, then those that lose an image rewritten."),
        progress_option,
        config_option,
        profile_option,
    ]
    for o in reversed(opts):
        f = o(f)
    return storage_options(engine_options(f))


def _one_size_option(f):
    """The command `f`, refusing --size beside --sizes (which replaces it) before anything is listed."""
    import functools

    @functools.wraps(f)
    def checked(*args, **kw):
        from click.core import ParameterSource

        ctx = click.get_current_context()
        given = ctx.get_parameter_source("size")
        if kw.get("sizes") and given in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
            where = (f" (from the config file; --sizes {kw['size']} overrides it with one size)"
                     if ctx.get_parameter_source("sizes") == ParameterSource.DEFAULT_MAP else "")
            raise click.UsageError(f"--size {kw['size']} and --sizes {','.join(map(str, kw['sizes']))}{where}: "
                                   "--sizes replaces --size; give one of them", ctx)
        return f(*args, **kw)

    return checked


def run_front_door(fn, *args, **kw) -> None:
    """Run the front door's build `fn` (dataprep/build.py) as a command does: progress shown unless
    --no-progress, notices on stderr as they happen, the summary printed; exit 130 on Ctrl-C after saying
    how to resume."""
    from .. import build as front

    kw["progress"] = shown(kw.get("progress"))
    with front.notices_to(lambda line: click.echo(line, err=True)):
        try:
            summary = fn(*args, **kw)
        except front.BuildInterrupted as e:
            stopped = "" if fn is front.tokenize else "workers stopped, "
            click.echo(f"interrupted: {stopped}finished shards kept in {e.kept_in}; run the same command with --resume to continue",
                       err=True)
            click.get_current_context().exit(130)
    for line in summary.lines():
        click.echo(line)


def _image_build(fn, *args, **kw) -> None:
    """An image command's call: --sizes replaces --size (the check that only one was given is the
    command's, made before anything is listed), so `size` is not passed beside it."""
    if kw.get("sizes"):
        kw.pop("size", None)
    run_front_door(fn, *args, **kw)


@click.group()
def build() -> None:
    """Build a pack from a source tree."""


allow_empty = click.option("--allow-empty-classes", is_flag=True, help="Accept class folders with no images.")
tokenize_option = click.option(
    "--tokenize", "tokenize", type=click.Path(dir_okay=False), default=None, metavar="TOKENIZER",
    help="Also store every caption as token ids (uint16, uint32 when the vocabulary needs it) of this Hugging Face "
         "tokenizers JSON file, which the pack keeps a copy of; served padded to a fixed length with "
         "InMemoryImageDataset(..., caption_length=L).")


@build.command()
@click.argument("src", type=click.Path(file_okay=False))
@allow_empty
@click.option("--splits", default=None, help="Comma-separated splits [default: train, and val where SRC/val exists].")
@click.option("--val-labels", type=click.Path(dir_okay=False), default=None,
              help="Labels of a flat val folder: LOC_val_solution.csv or 'name label' lines [default: found beside SRC].")
@image_build_options
def imagenet(src, splits, val_labels, allow_empty_classes, **kw):
    """Pack an ImageNet tree: SRC/train/<wnid>/*.JPEG, SRC/val/ in class folders or flat with a labels file.

    Labels are the sorted train folder names' indices (as torchvision's ImageFolder gives them)."""
    from .. import build as front

    _image_build(front.imagenet, src, splits=splits, val_labels=val_labels, allow_empty_classes=allow_empty_classes, **kw)


@build.command()
@click.argument("src", type=click.Path(file_okay=False))
@click.option("--split", default="train", show_default=True, help="Name of the split to write.")
@allow_empty
@click.option("--allow-split-named-classes", is_flag=True,
              help="Accept class folders all named like splits (train, val, ...); without it such a root is refused "
                   "(use `build imagenet`, or point at one split's folder).")
@image_build_options
def folder(src, split, allow_empty_classes, allow_split_named_classes, **kw):
    """Pack any class-folder tree: SRC/<class>/**/<image files>."""
    from .. import build as front

    _image_build(front.folder, src, split=split, allow_empty_classes=allow_empty_classes,
                 allow_split_named_classes=allow_split_named_classes, **kw)


@build.command()
@click.argument("tars", nargs=-1, required=True)
@click.option("--split", default="train", show_default=True, help="Name of the split to write.")
@click.option("--label-field", default=None,
              help="Label from this field of each sample's .json (dotted for nested: meta.label), over any .cls "
                   "(the summary counts samples where they disagree); integers, or class names (classes are then the "
                   "sorted names)  [default: the .cls member].")
@click.option("--caption-field", default=None, help="Caption from this field of the .json [default: the .txt member].")
@tokenize_option
@image_build_options
def webdataset(tars, split, label_field, caption_field, tokenize, **kw):
    """Pack WebDataset tar shards (what img2dataset writes): TARS are files, globs or brace patterns such as
    'shards/train-{000000..000127}.tar' (quote them), plain or gzip.

    Members are grouped by key as WebDataset does (key.jpg + key.cls / key.json / key.txt); each sample
    records where it came from (shard.tar:key). The tars are streamed, never unpacked; shards never span
    two tars, and a gzip tar is read in one pass."""
    from .. import build as front

    _image_build(front.webdataset, tars, split=split, label_field=label_field, caption_field=caption_field, tokenize=tokenize,
                 **kw)


@build.command()
@click.argument("files", nargs=-1, required=True)
@click.option("--image-column", default="image", show_default=True,
              help="Column of image bytes: binary, or Hugging Face's Image struct {bytes, path}.")
@click.option("--label-column", default=None,
              help="Column of labels: integers, class names, or a ClassLabel (its names become the classes) [default: unlabelled].")
@click.option("--caption-column", default=None, help="Column of captions (text) [default: none].")
@click.option("--split", default="train", show_default=True,
              help="Name of the split to write; of a DatasetDict saved to disk, also the split read.")
@tokenize_option
@image_build_options
def parquet(files, image_column, label_column, caption_column, split, tokenize, **kw):
    """Pack tables with an image column: FILES are Parquet files, Arrow IPC files (file or stream format),
    globs of them (quote them), or directories written by datasets' save_to_disk.

    Each sample records where it came from (file.parquet:ROW). Only the label and caption columns are read
    to list the rows; each row group (Arrow: record batch) is read once, a few rows at a time. A column of
    URLs is refused: dataprep does not download (img2dataset does)."""
    from .. import build as front

    _image_build(front.parquet, files, image_column=image_column, label_column=label_column, caption_column=caption_column,
                 split=split, tokenize=tokenize, **kw)


@build.command("list")
@click.argument("csv_file", metavar="CSV", type=click.Path(dir_okay=False))
@click.option("--root", type=click.Path(file_okay=False), default=None,
              help="Folder the listed paths are relative to [default: the CSV's folder].")
@click.option("--split", default="train", show_default=True, help="Name of the split to write.")
@tokenize_option
@image_build_options
def path_list(csv_file, root, split, tokenize, **kw):
    """Pack the files a CSV lists: path,label[,caption] rows (a header row is optional), paths relative
    to --root, labels integers or class names (empty: unlabelled).

    Rows whose path leaves the root or names no file are skipped with their reasons."""
    from .. import build as front

    _image_build(front.list, csv_file, root=root, split=split, tokenize=tokenize, **kw)


@build.command()
@click.option("--images", "images", required=True, type=click.Path(file_okay=False), help="Image directory.")
@click.option("--masks", "masks", required=True, type=click.Path(file_okay=False), help="Mask directory (PNG/TIFF label ids).")
@click.option("--pairs", type=click.Path(dir_okay=False), default=None,
              help="CSV with columns image,mask[,split] (paths relative to --images / --masks) instead of pairing by stem.")
@click.option("--image-suffix", default="", help="Dropped from image stems before pairing (Cityscapes: _leftImg8bit).")
@click.option("--mask-suffix", default="", help="Dropped from mask stems; masks without it are ignored (Cityscapes: _gtFine_labelIds).")
@click.option("--split", default="train", show_default=True, help="Split name when --images has no train/val/test folders.")
@click.option("--labels", "labels", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Label map YAML: ids -> stored ids, ignore value, class names, colours (see configs/labels/cityscapes.yaml).")
@click.option("--mask-dtype", type=click.Choice(["auto", "uint8", "uint16"]), default="auto", show_default=True,
              help="auto: uint8 unless a mask holds values above 255 (found from the label map, the files' bit depth, "
                   "or their values), then uint16.")
@click.option("--num-classes", type=Ranged("num_classes"), default=None,
              help="Mask values at or above this (except the ignore value) are out of range [default: from the label map].")
@image_build_options
def segmentation(images, masks, pairs, image_suffix, mask_suffix, split, labels, mask_dtype, num_classes, **kw):
    """Pack image/mask pairs for semantic segmentation: the same resize, crop and pad for both, masks
    nearest-neighbour and never interpolated, stored uint8 (uint16 when needed).

    Pairs are found by relative path without extension (and --image-suffix / --mask-suffix), split by
    top-level train/val/test folders, or listed in a --pairs CSV."""
    from .. import build as front

    _image_build(front.segmentation, images, masks, pairs=pairs, image_suffix=image_suffix, mask_suffix=mask_suffix, split=split,
                 labels=labels, mask_dtype=mask_dtype, num_classes=num_classes, **kw)


max_boxes_option = click.option(
    "--max-boxes", type=Ranged("max_boxes"), default=DET["max_boxes"], show_default=True,
    help="Most boxes one image may list: an image with more is skipped with its reason (the Loader pads every batch row "
         "to the most boxes an image holds).")


@build.command()
@click.argument("images", type=click.Path(file_okay=False))
@click.option("--annotations", required=True, type=click.Path(dir_okay=False),
              help="COCO instances JSON (images, annotations, categories; info, licenses and segmentation optional).")
@click.option("--split", default="train", show_default=True, help="Name of the split to write.")
@max_boxes_option
@image_build_options
def coco(images, annotations, split, **kw):
    """Pack images with boxes from a COCO instances file: IMAGES is the folder its file names are under.

    Category ids become contiguous labels in id order (names kept as the classes), iscrowd a flag per box;
    boxes past the border are clipped, degenerate ones skipped and counted; images without annotations are
    kept with no boxes. The boxes are moved with the images through every size and resize mode."""
    from .. import build as front

    _image_build(front.coco, images, annotations=annotations, split=split, **kw)


@build.command()
@click.argument("root", type=click.Path(file_okay=False))
@click.option("--split", default="train", show_default=True,
              help="Name of the split to write; with split folders (images/train, images/val), also the one read.")
@max_boxes_option
@image_build_options
def yolo(root, split, **kw):
    """Pack a YOLO dataset: ROOT/images and ROOT/labels/*.txt (class cx cy w h, normalised), flat or in split
    folders as Ultralytics writes them; class names from ROOT/classes.txt or ROOT/data.yaml.

    Images without a label file are kept with no boxes; the boxes are moved with the images."""
    from .. import build as front

    _image_build(front.yolo, root, split=split, **kw)


@build.command()
@click.argument("src", type=click.Path(file_okay=False))
@click.option("--out", "-o", required=True, type=click.Path(), help="Pack to create: a directory (npy, zarr) or an .h5 file (hdf5).")
@click.option("--shape", default=None, help="Resample every volume to D,H,W [default: keep each one's shape].")  # read by the front door
@click.option("--resample", type=click.Choice(["linear", "nearest"]), default=VOL["resample"], show_default=True,
              help="linear for intensities (area average when shrinking); nearest for label volumes.")
@click.option("--depth", type=click.Choice(["8", "16"]), default=str(VOL["depth"]), show_default=True, help="Bits per voxel stored.")
@click.option("--window", default=None,  # read by the front door
              help="LO,HI source values mapped linearly onto the stored range (needed for float and negative values).")
@click.option("--masks", type=click.Path(file_okay=False), default=None,
              help="Label volumes, paired by relative path and stem (MASKS/a/x.npy for SRC/a/x.tif); stored beside the "
                   "volumes, resampled nearest.")
@click.option("--mask-dtype", type=click.Choice(["auto", "uint8", "uint16"]), default="auto", show_default=True,
              help="auto: uint8 unless a label above 255 occurs.")
@click.option("--split", default="train", show_default=True, help="Name of the split to write.")
@run_options(VOL, "volume", limit="Build only N volumes.", shards="Volumes per shard [default: from the count].",
             strict="Fail on the first unusable file.")
def volumes(src, out, shape, resample, depth, window, masks, mask_dtype, split, workers, limit, shard_size, strict, max_bytes,
            overwrite, resume, progress, engine, address, scheduler_file, fmt, compress):
    """Pack 3-D volumes: SRC/<class>/**/*.npy|*.tif (labelled) or SRC/**/*.npy|*.tif (unlabelled); .npy
    arrays and multi-page TIFF stacks, stored as uint16 (or uint8) with their shapes."""
    from .. import build as front

    run_front_door(front.volumes, src, out, shape=shape, resample=resample, depth=depth, window=window, masks=masks,
                   mask_dtype=mask_dtype, split=split, workers=workers, limit=limit, shard_size=shard_size, strict=strict,
                   max_bytes=max_bytes, overwrite=overwrite, resume=resume, progress=progress, engine=engine, address=address,
                   scheduler_file=scheduler_file, fmt=fmt, compress=compress)


@build.command()
@click.argument("src", type=click.Path())
@click.option("--out", "-o", required=True, type=click.Path(), help="Pack to create: a directory (npy, zarr) or an .h5 file (hdf5).")
@click.option("--root", type=click.Path(file_okay=False), default=None, help="What a CSV's paths are relative to [default: its folder].")
@click.option("--size", type=Ranged("size"), default=VID["size"], show_default=True, help="Every frame's target size in pixels.")
@click.option("--sizes", default=None, callback=_sizes, help="Several sizes in one pass, e.g. 112,160 (each frame decoded once); replaces --size.")
@click.option("--resize", type=click.Choice(sorted(RESIZE_MODES)), default=VID["resize"], show_default=True,
              help="; ".join(f"{m.name}: {m.help}" for m in RESIZE_MODES.values()))
@click.option("--upscale/--no-upscale", default=VID["upscale"], show_default=True, help="Enlarge frames smaller than SIZE.")
@click.option("--quality", type=Ranged("quality"), default=VID["quality"], show_default=True, help="The frames' JPEG quality.")
@click.option("--fps", type=float, default=None, help="Resample every video to this frame rate by its timestamps [default: every frame].")
@click.option("--max-frames", type=Ranged("max_frames"), default=None, help="Store at most N frames a video (its first ones).")
@click.option("--max-seconds", type=float, default=None, help="Store only a video's frames before this many seconds.")
@click.option("--split", default=VID["split"], show_default=True, help="The split's name for class folders without split folders, or a CSV.")
@run_options(VID, "video", limit="Build only N videos per split, spread over the classes.",
             shards="Videos per shard [default: from the split's size].", strict="Fail on the first unusable video.")
def video(src, out, root, size, sizes, resize, upscale, quality, fps, max_frames, max_seconds, split, workers, limit, shard_size,
          strict, max_bytes, overwrite, resume, progress, engine, address, scheduler_file, fmt, compress):
    """Pack videos as JPEG frames at the training size: SRC/<split>/<class>/*.mp4|mkv|webm|avi|mov, SRC/<class>/*.mp4,
    or a CSV of path,label rows. Needs PyAV: pip install 'dataprep[video]'."""
    from .. import build as front

    _image_build(front.video, src, out, root=root, size=size, sizes=sizes, resize=resize, upscale=upscale, quality=quality, fps=fps,
                 max_frames=max_frames, max_seconds=max_seconds, split=split, workers=workers, limit=limit, shard_size=shard_size,
                 strict=strict, max_bytes=max_bytes, overwrite=overwrite, resume=resume, progress=progress, engine=engine,
                 address=address, scheduler_file=scheduler_file, fmt=fmt, compress=compress)
