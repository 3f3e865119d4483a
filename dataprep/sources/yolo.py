"""YOLO listing: takes a YOLO dataset root, gives one split of images with their boxes (a `BoxSplit`, as
sources/coco.py gives, the boxes as fractions of the image's size) and the class names.

Layouts, as Ultralytics writes them: ROOT/images/**/*.jpg beside ROOT/labels/**/*.txt (flat), or split folders
ROOT/images/NAME and ROOT/labels/NAME (train, val, valid, validation, test, or a name starting so: train2017,
val2017; the split `split` is read, and the pack's split is named after it; a root with split folders and none
named `split` is refused, never read as one flat split). A label file has one object a line, `class cx cy w h`
normalised to the image's size, or `class x1 y1 x2 y2 ...` (a segment's polygon, three points or more: its
bounding box is kept, as Ultralytics does); with `kpt_shape: [K, D]` in data.yaml (a pose dataset) a line is
`class cx cy w h` and K x D keypoint values, which are not read. An image without a label file has no boxes; a
label file without an image is counted in a note (refused under `strict`). Class names come from
ROOT/classes.txt (one a line) or ROOT/data.yaml (`names`: a list, or a mapping of ids to names; `nc` alone
gives the names class_0..., at most 65536 of them), else they are the ids 0..max (a class id above 65535 is
then refused, naming the file and the line: the names would be a list that long). Text is UTF-8, with or
without a byte-order mark, any line endings. A malformed line (not numbers, a class that is not a whole number or has no name, a count of
values that is no box, segment or pose) is a SourceError naming the file and the line. Boxes reaching past the
image are clipped by the build, which skips and counts those left with no area.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

from ..errors import SourceError
from .coco import box_split
from .folders import walk_images
from .listing import FileReader, Source

SPLIT_FOLDERS = ("train", "val", "valid", "validation", "test")
# Without class names the names are the ids 0..max and the labels a uint16 at most: a class id past this bound
# (or an `nc` past it) is refused, never a list of billions of names made for one mistyped line.
MAX_UNNAMED_CLASS = 65535
# A float class field ("3.0") above this is no class id an exporter writes (and 1e300 would be a 997-digit int)
MAX_FLOAT_CLASS = 2 ** 31 - 1


def _is_split_folder(name: str) -> bool:
    """Whether a folder under images/ names a split (train, val2017, test-dev, ...), as Ultralytics' layouts do."""
    return name.lower().startswith(("train", "val", "test"))


def _folders(root: Path, split: str) -> tuple[Path, Path, str]:
    """(images folder, labels folder, layout) of the split asked for."""
    images = root / "images"
    if not images.is_dir():
        raise SourceError(f"{root}: no images/ folder (a YOLO root holds images/ and labels/)")
    if (images / split).is_dir():
        return images / split, root / "labels" / split, "yolo split folders"
    have = sorted(p.name for p in images.iterdir() if p.is_dir() and _is_split_folder(p.name))
    if have:
        raise SourceError(f"{root}: no split {split!r} under images/; it has {have} (pass --split NAME)")
    return images, root / "labels", "yolo"


def _text(path: Path, what: str) -> str:
    """A text file's contents: UTF-8, a byte-order mark dropped (Windows editors write one), any line endings."""
    try:
        return path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise SourceError(f"{path}: cannot read {what} ({e})") from None


def read_names(root: Path) -> list[str] | None:
    """The class names of ROOT/classes.txt or ROOT/data.yaml (or .yml), None where neither is there."""
    return read_dataset(root)[0]


def read_dataset(root: Path) -> tuple[list[str] | None, tuple[int, int] | None]:
    """(the class names of ROOT/classes.txt or ROOT/data.yaml, or None; data.yaml's `kpt_shape` (K, D), or None)."""
    txt = root / "classes.txt"
    if txt.is_file():
        lines = [ln.strip() for ln in _text(txt, "the class names").splitlines()]
        while lines and not lines[-1]:
            lines.pop()
        if "" in lines:  # skipping it would give every later class the label of the one after it
            raise SourceError(f"{txt}:{lines.index('') + 1}: an empty line among the class names (line k names class k - 1)")
        return lines, None
    for name in ("data.yaml", "data.yml"):
        path = root / name
        if path.is_file():
            return _data_yaml(path)
    return None, None


def _data_yaml(path: Path) -> tuple[list[str], tuple[int, int] | None]:
    import yaml

    try:
        doc = yaml.safe_load(_text(path, "the dataset description"))
    except yaml.YAMLError as e:
        raise SourceError(f"{path}: cannot read it as YAML ({e})") from None
    if not isinstance(doc, dict):
        raise SourceError(f"{path}: not a mapping with 'names' (a YOLO data.yaml)")
    names, nc = doc.get("names"), doc.get("nc")
    if nc is not None and not (isinstance(nc, int) and not isinstance(nc, bool) and nc >= 0):
        raise SourceError(f"{path}: nc is {nc!r}, not a number of classes")
    if names is None and nc is not None:
        if nc > MAX_UNNAMED_CLASS + 1:
            raise SourceError(f"{path}: nc is {nc} with no names; at most {MAX_UNNAMED_CLASS + 1} classes are named class_0... "
                              "(list the names under 'names')")
        out = [f"class_{k}" for k in range(nc)]  # what Ultralytics names them
    elif isinstance(names, list) and all(isinstance(n, (str, int, float)) and not isinstance(n, bool) for n in names):
        out = [str(n) for n in names]
    elif isinstance(names, dict) and names:
        ids = {}
        for k, v in names.items():
            if isinstance(k, bool) or not (isinstance(k, int) or (isinstance(k, str) and k.strip().isdigit())):
                raise SourceError(f"{path}: names has the key {k!r}, not a class id")
            ids[int(k)] = str(v)
        if sorted(ids) != list(range(len(ids))):
            raise SourceError(f"{path}: names has ids {sorted(ids)[:10]}, not 0..{len(ids) - 1}")
        out = [ids[k] for k in range(len(ids))]
    else:
        raise SourceError(f"{path}: no 'names' list or mapping of ids to names")
    if nc is not None and nc != len(out):
        raise SourceError(f"{path}: nc is {nc} but names lists {len(out)} classes")
    kpt = doc.get("kpt_shape")
    if kpt is not None:
        if not (isinstance(kpt, list) and len(kpt) == 2 and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in kpt)):
            raise SourceError(f"{path}: kpt_shape is {kpt!r}, not [keypoints, values each] (such as [17, 3])")
        kpt = (kpt[0], kpt[1])
    return out, kpt


def _class_id(text: str) -> int:
    """A class field: an integer, or a float that is one ("3.0", as some exporters write) up to 2**31 - 1;
    else ValueError."""
    try:
        return int(text)
    except ValueError:
        v = float(text)
        if not v.is_integer() or abs(v) > MAX_FLOAT_CLASS:
            raise
        return int(v)


def _shown(cls: int) -> str:
    """A class id for a message: its digits, the first 20 of a longer one."""
    return str(cls) if abs(cls) < 10 ** 20 else f"{str(cls)[:20]}... ({len(str(abs(cls)))} digits)"


def read_labels(path: Path, names: list[str] | None, keypoints: tuple[int, int] | None = None) -> list[tuple]:
    """One label file's objects as (x1, y1, x2, y2, class, 0), in fractions of the image's size."""
    text = _text(path, "the label file")
    out = []
    pose = None if keypoints is None else 4 + keypoints[0] * keypoints[1]
    for n, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        try:
            cls = _class_id(parts[0])
            values = [float(v) for v in parts[1:]]
        except (ValueError, OverflowError):
            raise SourceError(f"{path}:{n}: {line.strip()[:60]!r} is not 'class cx cy w h' (an integer class, then numbers)") from None
        if cls < 0 or (names is not None and cls >= len(names)):
            raise SourceError(f"{path}:{n}: class {_shown(cls)} has no name ({len(names) if names is not None else 0} classes are named)")
        if names is None and cls > MAX_UNNAMED_CLASS:
            raise SourceError(f"{path}:{n}: class {_shown(cls)}: without classes.txt or data.yaml the classes are the ids "
                              f"0..max, and an id above {MAX_UNNAMED_CLASS} is refused (name the classes to use more)")
        if not all(math.isfinite(v) for v in values):
            raise SourceError(f"{path}:{n}: a coordinate is not a finite number")
        if pose is not None:
            if len(values) != pose:
                raise SourceError(f"{path}:{n}: {len(values)} values; with kpt_shape {list(keypoints)} a line is 'class cx cy w h' "
                                  f"and {pose - 4} keypoint values")
            values = values[:4]
        if len(values) == 4:
            cx, cy, w, h = values
            out.append((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2, cls, 0))
        elif len(values) >= 6 and len(values) % 2 == 0:
            xs, ys = values[0::2], values[1::2]
            out.append((min(xs), min(ys), max(xs), max(ys), cls, 0))
        else:
            raise SourceError(f"{path}:{n}: {len(values)} coordinates; a box is 'class cx cy w h', a segment 'class x1 y1 x2 y2 x3 y3 ...'")
    return out


def scan_yolo(root: str | os.PathLike, split: str = "train", strict: bool = False, max_bytes: int | None = None) -> Source:
    """One split of a YOLO dataset: its images (sorted by path) with the boxes of their label files. With
    `strict`, a label file that no image matches is an error (a renamed image, a changed extension), else a note."""
    root = Path(root)
    if not root.is_dir():
        raise SourceError(f"{root}: the YOLO root does not exist or is not a directory")
    images, labels, layout = _folders(root, split)
    names, keypoints = read_dataset(root)
    files = walk_images(images)
    if not files:
        raise SourceError(f"{images}: no image files")
    paths, per_image, missing, used = [], [], 0, set()
    for f in files:
        rel = f.relative_to(images)
        lab = (labels / rel).with_suffix(".txt")
        paths.append(str(f.relative_to(root)))
        if lab.is_file():
            per_image.append(read_labels(lab, names, keypoints))
            used.add(lab.relative_to(labels))
        else:
            per_image.append([])
            missing += 1
    # labelImg and Label Studio keep a classes.txt among the label files: it names classes, it is no image's
    listed = walk_images(labels, frozenset({".txt"})) if labels.is_dir() else []
    orphans = sorted(r for r in (p.relative_to(labels) for p in listed) if r not in used and r.name != "classes.txt")
    if orphans and strict:
        raise SourceError(f"{labels / orphans[0]}: a label file with no image beside it under {images} "
                          f"({len(orphans)} such files); --strict: refusing the source")
    if names is None:
        top = max((r[4] for b in per_image for r in b), default=-1)
        names = [str(k) for k in range(top + 1)]
    notes = [f"{missing} of {len(paths)} images have no label file under {labels}: kept with no boxes"] if missing else []
    if orphans:
        notes.append(f"{len(orphans)} label files under {labels} have no image (the first: {orphans[0]}): not read")
    s = box_split(split, paths, per_image, [(-1, -1)] * len(paths), True, [], FileReader(max_bytes=max_bytes, confine=True), notes)
    return Source(layout, root, names, None, [s], details={"format": "yolo", "labels": str(labels.resolve())})
