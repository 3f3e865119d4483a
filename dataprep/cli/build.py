"""`dataprep build imagenet|folder`: list the source, make the settings, run the build, print the summary."""
from __future__ import annotations

import os
from pathlib import Path

import click

from ..images.resize import RESIZE_MODES
from ..images.settings import IMAGE_MODES
from .config import config_option
from .engine import engine_for, engine_options
from .profile import profile_option
from .progress import progress_option, shown
from .storage import staged_output, storage_options


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


def image_build_options(f):
    """Options shared by every image build command (one definition, so they never drift apart)."""
    f = _one_size_option(f)
    opts = [
        click.option("--out", "-o", required=True, type=click.Path(), help="Pack to create: a directory (npy, zarr) or an .h5 file (hdf5)."),
        click.option("--size", type=click.IntRange(8, 16384), default=512, show_default=True, help="Target size in pixels."),
        click.option("--sizes", default=None, callback=_sizes,
                     help="Several sizes in one pass, e.g. 128,192,256,512 (each image decoded once); replaces --size."),
        click.option(
            "--resize",
            type=click.Choice(sorted(RESIZE_MODES)),
            default="shorter",
            show_default=True,
            help="; ".join(f"{m.name}: {m.help}" for m in RESIZE_MODES.values()),
        ),
        click.option("--upscale/--no-upscale", default=False, show_default=True, help="Enlarge images smaller than SIZE."),
        click.option("--grayscale/--color", default=False, show_default=True, help="Store 1-channel images."),
        click.option("--mode", type=click.Choice(IMAGE_MODES), default="encoded", show_default=True,
                     help="encoded: JPEG bytes, decoded when served; raw: decoded uint8 pixels."),
        click.option("--depth", type=click.Choice(["8", "16"]), default="8", show_default=True,
                     help="Bits per channel stored. 16 keeps 16-bit PNG/TIFF values exactly (with --mode raw); "
                          "8 scales 16-bit sources by round(x / 257), never truncates."),
        click.option("--quality", type=click.IntRange(1, 100), default=90, show_default=True, help="JPEG quality."),
        click.option("--keep-jpeg/--reencode", default=True, show_default=True,
                     help="Store a source JPEG's bytes unchanged when it needs no resize and no conversion."),
        click.option("--workers", "-j", type=click.IntRange(1), default=None, help="Processes [default: all cores]."),
        click.option("--limit", type=click.IntRange(1), default=None, help="Build only N images per split, spread over the classes."),
        click.option("--shard-size", type=click.IntRange(1), default=None, help="Images per shard [default: from the split's size]."),
        click.option("--strict/--skip-bad", default=False, show_default=True, help="Fail on the first undecodable file instead of skipping it."),
        max_bytes_option("256MiB", "image"),
        click.option("--overwrite", is_flag=True, help="Replace a pack or unfinished build already in --out."),
        click.option("--resume", is_flag=True,
                     help="Continue an interrupted build: shards finished with the same inputs and settings, "
                          "and intact by checksum, are kept; the rest are built."),
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


def image_settings(size, sizes, resize, upscale, grayscale, mode, depth, quality, keep_jpeg, **_):
    """The image stages' settings from the image options (by name; the rest are the build's)."""
    from ..images.settings import ImageSettings

    return ImageSettings(size=size, sizes=sizes, resize=resize, upscale=upscale, grayscale=grayscale, mode=mode,
                         depth=int(depth), quality=quality, keep_jpeg=keep_jpeg)


def build_settings(workers, limit, shard_size, strict, overwrite, resume, max_bytes=None, **_):
    """The shard layout, strictness and byte cap every build command shares, from its options (by name)."""
    from ..settings import BuildSettings

    return BuildSettings(workers=workers or os.cpu_count() or 1, limit=limit, shard_size=shard_size, strict=strict,
                         overwrite=overwrite, resume=resume, max_bytes=max_bytes)


def run_build(source, build_fn, settings, out, progress=None, engine="local", address=None, scheduler_file=None,
              fmt="npy", compress="none", noun="images") -> None:
    """Run a build (`build_fn(source, out, settings, progress=..., engine=...)`, the kind's own settings
    bound) on the chosen engine, reporting progress on stderr unless `progress` is False (a bar on a
    terminal, lines in a log: dataprep/progress.py); print the summary; exit 130 on Ctrl-C after saying
    how to resume."""
    from ..progress import Progress
    from ..remote.urls import is_url, redact

    show = shown(progress)
    name = redact(str(out)) if is_url(out) else str(out)
    with engine_for(engine, settings.workers, address, scheduler_file) as eng, \
            staged_output(out, fmt, compress, settings.overwrite, eng, settings.resume, progress=show) as target:
        with Progress(f"build {name}", source.planned(settings.limit), noun, show=show, label="building") as bar:
            try:
                summary = build_fn(source, target, settings, progress=bar, engine=eng)
            except KeyboardInterrupt:
                bar.close(failed=True)
                click.echo(f"interrupted: workers stopped, finished shards kept in {target}; "
                           "run the same command with --resume to continue", err=True)
                click.get_current_context().exit(130)
    summary.out = redact(str(out)) if is_url(out) else Path(out)
    for line in summary.lines():
        click.echo(line)


def run_image_build(source, build_fn=None, noun="images", **opts) -> None:
    """`run_build` for the commands with the image options: `build_fn(source, out, settings, image, ...)`,
    the image build by default; progress counts `noun`."""
    import functools

    from ..images.build import build_images

    fn = functools.partial(_with_image, build_fn or build_images, image_settings(**opts))
    run_build(source, fn, build_settings(**opts), opts["out"], opts["progress"], opts["engine"], opts["address"],
              opts["scheduler_file"], opts["fmt"], opts["compress"], noun)


def _with_image(build_fn, image, source, out, settings, **kw):
    return build_fn(source, out, settings, image, **kw)


@click.group()
def build() -> None:
    """Build a pack from a source tree."""


allow_empty = click.option("--allow-empty-classes", is_flag=True, help="Accept class folders with no images.")
tokenize_option = click.option(
    "--tokenize", "tokenize", type=click.Path(dir_okay=False), default=None, metavar="TOKENIZER",
    help="Also store every caption as token ids (uint16, uint32 when the vocabulary needs it) of this Hugging Face "
         "tokenizers JSON file, which the pack keeps a copy of; served padded to a fixed length with "
         "InMemoryImageDataset(..., caption_length=L).")


def _tokenized(tokenize):
    """The image build with captions tokenized by `tokenize` (a tokenizers JSON file); None (the plain image
    build) without it."""
    if tokenize is None:
        return None
    import functools

    from ..images.build import build_images

    return functools.partial(build_images, tokenizer=tokenize)


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
    from ..sources import scan_imagenet

    names = tuple(s.strip() for s in splits.split(",") if s.strip()) if splits else None
    source = scan_imagenet(src, names, val_labels, allow_empty_classes, max_bytes=kw["max_bytes"])
    if source.val_labels:
        click.echo(f"val labels: {source.val_labels}", err=True)
    run_image_build(source, **kw)


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
    from ..sources import scan_folder

    run_image_build(scan_folder(src, split, allow_empty_classes, allow_split_named_classes, max_bytes=kw["max_bytes"]), **kw)


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
    from ..sources.webdataset import scan_webdataset

    run_image_build(scan_webdataset(tars, split, label_field, caption_field, strict=kw["strict"], max_bytes=kw["max_bytes"]),
                    _tokenized(tokenize), **kw)


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
    import inspect

    from ..sources.parquet import scan_parquet

    cap = {"max_bytes": kw["max_bytes"]} if "max_bytes" in inspect.signature(scan_parquet).parameters else {}
    run_image_build(scan_parquet(files, split, image_column, label_column, caption_column, strict=kw["strict"], **cap),
                    _tokenized(tokenize), **kw)


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
    from ..sources.pathlist import scan_list

    run_image_build(scan_list(csv_file, root, split, strict=kw["strict"], max_bytes=kw["max_bytes"]), _tokenized(tokenize), **kw)


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
@click.option("--num-classes", type=click.IntRange(1, 65536), default=None,
              help="Mask values at or above this (except the ignore value) are out of range [default: from the label map].")
@image_build_options
def segmentation(images, masks, pairs, image_suffix, mask_suffix, split, labels, mask_dtype, num_classes, **kw):
    """Pack image/mask pairs for semantic segmentation: the same resize, crop and pad for both, masks
    nearest-neighbour and never interpolated, stored uint8 (uint16 when needed).

    Pairs are found by relative path without extension (and --image-suffix / --mask-suffix), split by
    top-level train/val/test folders, or listed in a --pairs CSV."""
    import functools

    from ..segmentation.build import build_segmentation
    from ..segmentation.masks import LabelMap
    from ..segmentation.pairs import pair_by_stem, pair_from_file

    source = (pair_from_file(images, masks, pairs, split) if pairs
              else pair_by_stem(images, masks, image_suffix, mask_suffix, split))
    fn = functools.partial(build_segmentation, labels=LabelMap.load(labels) if labels else None,
                           mask_dtype=None if mask_dtype == "auto" else mask_dtype, num_classes=num_classes)
    run_image_build(source, build_fn=fn, noun="pairs", **kw)


def _window(ctx, param, value):
    if value is None:
        return None
    try:
        lo, hi = (float(v) for v in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not LO,HI (e.g. -1000,2000)", ctx, param) from None
    return lo, hi


def _dhw(ctx, param, value):
    if value is None:
        return None
    try:
        shape = tuple(int(v) for v in value.replace("x", ",").split(","))
    except ValueError:
        shape = ()
    if len(shape) != 3 or min(shape) < 1:
        raise click.BadParameter(f"{value!r} is not a shape D,H,W such as 64,128,128", ctx, param)
    return shape


@build.command()
@click.argument("src", type=click.Path(file_okay=False))
@click.option("--out", "-o", required=True, type=click.Path(), help="Pack to create: a directory (npy, zarr) or an .h5 file (hdf5).")
@click.option("--shape", callback=_dhw, default=None, help="Resample every volume to D,H,W [default: keep each one's shape].")
@click.option("--resample", type=click.Choice(["linear", "nearest"]), default="linear", show_default=True,
              help="linear for intensities (area average when shrinking); nearest for label volumes.")
@click.option("--depth", type=click.Choice(["8", "16"]), default="16", show_default=True, help="Bits per voxel stored.")
@click.option("--window", callback=_window, default=None,
              help="LO,HI source values mapped linearly onto the stored range (needed for float and negative values).")
@click.option("--masks", type=click.Path(file_okay=False), default=None,
              help="Label volumes, paired by relative path and stem (MASKS/a/x.npy for SRC/a/x.tif); stored beside the "
                   "volumes, resampled nearest.")
@click.option("--mask-dtype", type=click.Choice(["auto", "uint8", "uint16"]), default="auto", show_default=True,
              help="auto: uint8 unless a label above 255 occurs.")
@click.option("--split", default="train", show_default=True, help="Name of the split to write.")
@click.option("--workers", "-j", type=click.IntRange(1), default=None, help="Processes [default: all cores].")
@click.option("--limit", type=click.IntRange(1), default=None, help="Build only N volumes.")
@click.option("--shard-size", type=click.IntRange(1), default=None, help="Volumes per shard [default: from the count].")
@click.option("--strict/--skip-bad", default=False, show_default=True, help="Fail on the first unusable file.")
@max_bytes_option("8GiB", "volume")
@click.option("--overwrite", is_flag=True, help="Replace a pack or unfinished build already in --out.")
@click.option("--resume", is_flag=True, help="Continue an interrupted build, keeping its intact shards.")
@progress_option
@config_option
@profile_option
@engine_options
@storage_options
def volumes(src, out, shape, resample, depth, window, masks, mask_dtype, split, workers, limit, shard_size, strict, max_bytes,
            overwrite, resume, progress, engine, address, scheduler_file, fmt, compress):
    """Pack 3-D volumes: SRC/<class>/**/*.npy|*.tif (labelled) or SRC/**/*.npy|*.tif (unlabelled); .npy
    arrays and multi-page TIFF stacks, stored as uint16 (or uint8) with their shapes."""
    import functools

    from ..sources import scan_files
    from ..volumes.build import VolumeSettings, build_volumes
    from ..volumes.read import VOLUME_EXTENSIONS

    vs = VolumeSettings(shape, int(depth), window, resample)
    source = scan_files(src, split, VOLUME_EXTENSIONS)
    settings = build_settings(workers, limit, shard_size, strict, overwrite, resume, max_bytes)
    fn = functools.partial(build_volumes, volume=vs, masks=masks, mask_dtype=None if mask_dtype == "auto" else mask_dtype)
    run_build(source, fn, settings, out, progress, engine, address, scheduler_file, fmt, compress, "volumes")
