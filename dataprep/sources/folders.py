"""Folder listings: take a directory tree (class folders, the ImageNet layout, a flat tree), give the
samples per split in a fixed order, with labels.

Labels are the index of the sorted class-folder names, as torchvision's `ImageFolder` gives them,
so checkpoints trained on an ImageFolder keep their label order. Files are listed in sorted order
within each class (recursively), so the same tree always gives the same pack.
"""
from __future__ import annotations

import csv
import os
import re
import shlex
from pathlib import Path

import numpy as np

from ..errors import SourceError
from .listing import FileReader, Source, SplitSource

# The extensions ImageFolder accepts; the content is sniffed later whatever the name says.
IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".ppm", ".pgm", ".pbm", ".bmp", ".tif", ".tiff", ".webp", ".gif"})
# Folder names that name a split, not a class: class folders all named like this are a dataset's root.
SPLIT_NAMES = frozenset({"train", "training", "val", "valid", "validation", "test", "testing", "dev", "eval"})
SYNSET_MAPPING = "LOC_synset_mapping.txt"
KAGGLE_VAL_LABELS = "LOC_val_solution.csv"


def walk_images(folder: Path, extensions: frozenset[str] = IMAGE_EXTENSIONS) -> list[Path]:
    """Files with one of `extensions` (images by default) under `folder`, sorted, following symlinked
    folders once (a symlink loop is not followed twice)."""
    out: list[Path] = []
    seen: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True, onerror=None):
        real = os.path.realpath(dirpath)
        if real in seen:
            dirnames[:] = []
            continue
        seen.add(real)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        out.extend(Path(dirpath) / f for f in sorted(filenames)
                   if not f.startswith(".") and os.path.splitext(f)[1].lower() in extensions)
    return sorted(out)


def _class_dirs(root: Path) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    except OSError as e:
        raise SourceError(f"{root}: cannot list class folders ({e.strerror or e})") from None


def scan_class_folders(
    root: Path, split: str, rel_to: Path, classes: list[str] | None = None, allow_empty_classes: bool = False,
    extensions: frozenset[str] = IMAGE_EXTENSIONS,
) -> tuple[list[str], SplitSource]:
    """List `root/<class>/**/image` files. With `classes` given (a val split), folders must be among them."""
    found = _class_dirs(root)
    if not found:
        raise SourceError(f"{root}: no class folders (expected {root}/<class>/<image files>)")
    if classes is None:
        classes = found
    else:
        unknown = sorted(set(found) - set(classes))
        if unknown:
            raise SourceError(f"{root}: class folders not present in train: {unknown[:5]}")
    index = {c: i for i, c in enumerate(classes)}
    paths: list[str] = []
    labels: list[int] = []
    empty = []
    for c in found:
        files = walk_images(root / c, extensions)
        if not files:
            empty.append(c)
        paths.extend(os.path.relpath(p, rel_to) for p in files)
        labels.extend([index[c]] * len(files))
    if not paths:  # every class is empty: no flag makes that a dataset
        raise SourceError(_no_files(root, extensions))
    if empty and not allow_empty_classes:
        raise SourceError(
            f"{root}: {len(empty)} class folder(s) hold no images: {', '.join(empty[:5])}"
            + (" ..." if len(empty) > 5 else "")
            + f"; their labels would exist with no samples (pass --allow-empty-classes to accept this; "
            f"the other {len(found) - len(empty)} hold {len(paths)} {_noun(extensions)})"
        )
    return classes, SplitSource(split, paths, np.asarray(labels, np.int64))


def _no_files(root: Path, extensions: frozenset[str]) -> str:
    """What to say when a tree holds none of the files asked for: where, and which names were looked for."""
    return f"no {_noun(extensions)} found under {root} (looked for {'/'.join(sorted(extensions))})"


def _noun(extensions: frozenset[str]) -> str:
    return "images" if extensions == IMAGE_EXTENSIONS else "files"


def _capped(source: Source, max_bytes: int | None) -> Source:
    """The source with its files read under the byte cap `max_bytes` (None: the reader's default,
    `limits.IMAGE_MAX_BYTES`): a file over it is skipped, found from its size before a byte is read."""
    if max_bytes is not None:
        for s in source.splits:
            s.reader = FileReader(max_bytes=max_bytes)
    return source


def scan_folder(root: str | os.PathLike, split: str = "train", allow_empty_classes: bool = False,
                allow_split_named_classes: bool = False, max_bytes: int | None = None) -> Source:
    """Any class-folder tree: root/<class>/<images>, one split. Class folders all named like splits
    (train, val, ...) are refused unless `allow_split_named_classes`: that is a dataset's root, not a split."""
    root = _existing_dir(root)
    found = _class_dirs(root)
    if found and not allow_split_named_classes and all(c.lower() in SPLIT_NAMES for c in found):
        q = shlex.quote
        hint = (f"`dataprep build imagenet {q(str(root))} --out PACK` (train/<class>/, val/)" if "train" in found
                else f"`dataprep build folder {q(str(root / found[0]))} --split {q(found[0])} --out PACK`")
        raise SourceError(
            f"{root}: its class folders ({', '.join(found)}) are named like splits, so this is a dataset's root, "
            f"not one split's class folders (the pack would have {len(found)} class(es) named {', '.join(found)}); "
            f"build it with {hint}, or pass --allow-split-named-classes to make them classes anyway"
        )
    classes, s = scan_class_folders(root, split, root, allow_empty_classes=allow_empty_classes)
    return _capped(Source("folder", root, classes, None, [s]), max_bytes)


def scan_files(root: str | os.PathLike, split: str = "train", extensions: frozenset[str] = IMAGE_EXTENSIONS,
               allow_empty_classes: bool = False, max_bytes: int | None = None) -> Source:
    """Class folders (root/<class>/**/file, labelled) when root has subfolders; otherwise the files under
    root, unlabelled (`classes` empty)."""
    root = _existing_dir(root)
    if _class_dirs(root):
        classes, s = scan_class_folders(root, split, root, allow_empty_classes=allow_empty_classes, extensions=extensions)
        return _capped(Source("folder", root, classes, None, [s]), max_bytes)
    files = [os.path.relpath(p, root) for p in walk_images(root, extensions)]
    if not files:
        raise SourceError(_no_files(root, extensions))
    return _capped(Source("flat", root, [], None, [SplitSource(split, files, np.zeros(len(files), np.int64))]), max_bytes)


def _existing_dir(root: str | os.PathLike) -> Path:
    root = Path(root)
    if not root.exists():
        raise SourceError(f"{root}: source directory does not exist")
    if not root.is_dir():
        raise SourceError(f"{root}: source is not a directory")
    return root


def _find_up(root: Path, name: str, levels: int = 3) -> Path | None:
    """A metadata file in root or up to `levels` parents."""
    p = root.resolve()
    for _ in range(levels + 1):
        if (p / name).is_file():
            return p / name
        p = p.parent
    return None


def read_val_labels(path: Path, classes: list[str]) -> dict[str, int]:
    """Map image stem -> label from Kaggle's LOC_val_solution.csv or a two-column text file (name, wnid or index)."""
    index = {c: i for i, c in enumerate(classes)}
    out: dict[str, int] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SourceError(f"{path}: cannot read labels file ({e})") from None
    lines = text.splitlines()
    if lines and lines[0].replace(" ", "").lower().startswith("imageid,predictionstring"):
        rows = ((r[0], r[1].split()[0] if r[1].split() else "") for r in csv.reader(lines[1:]) if len(r) >= 2)
    else:
        rows = (tuple(re.split(r"[\s,]+", ln.strip(), maxsplit=1)) for ln in lines if ln.strip() and not ln.startswith("#"))
    for n, row in enumerate(rows, 1):
        if len(row) != 2:
            raise SourceError(f"{path}: line {n} is not 'name label'")
        name, lab = row[0].strip(), row[1].strip()
        if lab in index:
            label = index[lab]
        elif lab.lstrip("-").isdigit() and 0 <= int(lab) < len(classes):
            label = int(lab)
        else:
            raise SourceError(f"{path}: line {n}: label {lab!r} is neither a train class nor an index < {len(classes)}")
        out[os.path.splitext(os.path.basename(name))[0]] = label
    if not out:
        raise SourceError(f"{path}: labels file has no entries")
    return out


def scan_imagenet(
    root: str | os.PathLike,
    splits: tuple[str, ...] | None = None,
    val_labels: str | os.PathLike | None = None,
    allow_empty_classes: bool = False,
    max_bytes: int | None = None,
) -> Source:
    """ImageNet layout: root/train/<wnid>/*.JPEG; root/val either in class folders or flat with a labels file.

    `splits=None` takes train, and val where root/val exists; naming val explicitly makes it required.
    `max_bytes`: the cap on one image file's bytes (None: `limits.IMAGE_MAX_BYTES`), as for every listing.
    """
    root = _existing_dir(root)
    explicit = splits is not None
    splits = tuple(splits) if explicit else ("train", "val")
    unknown = sorted(set(splits) - {"train", "val"})
    if unknown:
        raise SourceError(f"unknown split(s) {unknown} for the imagenet layout (train, val)")
    if "train" not in splits:
        raise SourceError("the imagenet layout takes its classes from train: include 'train' in --splits")
    train_dir = root / "train"
    if not train_dir.is_dir():
        raise SourceError(f"{train_dir}: missing (expected the ImageNet layout {root}/train/<wnid>/*.JPEG)")
    classes, train = scan_class_folders(train_dir, "train", root, allow_empty_classes=allow_empty_classes)
    out = [train]
    labels_file = None
    if "val" in splits:
        val_dir = root / "val"
        if not val_dir.is_dir():
            if explicit or val_labels is not None:
                raise SourceError(f"{val_dir}: missing, but the val split was asked for")
        elif _class_dirs(val_dir):
            out.append(scan_class_folders(val_dir, "val", root, classes=classes, allow_empty_classes=True)[1])
        else:
            val, labels_file = _scan_flat_val(root, val_dir, classes, val_labels)
            out.append(val)
    names = None
    mapping = _find_up(root, SYNSET_MAPPING)
    if mapping is not None:
        names = _read_synset_names(mapping, classes)
    return _capped(Source("imagenet", root, classes, names, out, labels_file), max_bytes)


def _scan_flat_val(root: Path, val_dir: Path, classes: list[str], val_labels) -> tuple[SplitSource, Path]:
    # Without --val-labels, only SRC and its parent are searched: a stray labels file higher up must never
    # label a split silently (Kaggle's layout keeps it three levels above Data/CLS-LOC: pass --val-labels).
    labels_path = Path(val_labels) if val_labels else _find_up(root, KAGGLE_VAL_LABELS, levels=1)
    if labels_path is None:
        raise SourceError(
            f"{val_dir}: images are not in class folders and no labels file was found "
            f"(looked for {KAGGLE_VAL_LABELS} in {root} and its parent); pass --val-labels FILE or --splits train"
        )
    if not labels_path.is_file():
        raise SourceError(f"{labels_path}: labels file does not exist")
    table = read_val_labels(labels_path, classes)
    paths, labels, unlabeled = [], [], []
    for p in walk_images(val_dir):
        rel = os.path.relpath(p, root)
        lab = table.get(p.stem)
        if lab is None:
            unlabeled.append(rel)
        else:
            paths.append(rel)
            labels.append(lab)
    if not paths:
        raise SourceError(f"{val_dir}: no image matches an entry of {labels_path}")
    return SplitSource("val", paths, np.asarray(labels, np.int64), unlabeled), labels_path


def _read_synset_names(path: Path, classes: list[str]) -> list[str] | None:
    names = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        wnid, _, name = line.strip().partition(" ")
        if wnid:
            names[wnid] = name.strip()
    return [names.get(c, c) for c in classes]
