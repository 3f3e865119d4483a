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
without a byte-order mark, any line endings. A malformed line (not numbers, a class that is not a whole number or
has no name, a count of values that is no box, segment or pose) is a SourceError naming the file and the line.
Boxes reaching past the image are clipped by the build, which skips and counts those left with no area.

Every file is read only inside the root: classes.txt, data.yaml and label files that are symlinks leading out of
it (or FIFOs, devices, files over DESCRIPTION_MAX_BYTES or LABEL_MAX_BYTES) are refused before a line of them is
read, so no outside file's lines reach the manifest or a message. classes.txt and data.yaml so refused stop the
listing (SourceError); a label file so refused skips its image ("bad label file", or a SourceError under
`strict`): its boxes are unknown, and an image without them would teach that its objects are background.
data.yaml is read with the safe loader, without aliases (a 430-byte alias bomb stands for gigabytes once a value
is written out) and at most YAML_MAX_DEPTH levels deep; values in messages are cut short.
"""
from __future__ import annotations

import math
import os
import reprlib
from pathlib import Path

from ..errors import ImageDecodeError, SourceError
from .coco import box_split
from .folders import walk_images
from .listing import FileReader, Skips, Source, read_source, skip

SPLIT_FOLDERS = ("train", "val", "valid", "validation", "test")
# Without class names the names are the ids 0..max and the labels a uint16 at most: a class id past this bound
# (or an `nc` past it) is refused, never a list of billions of names made for one mistyped line.
MAX_UNNAMED_CLASS = 65535
# A float class field ("3.0") above this is no class id an exporter writes (and 1e300 would be a 997-digit int)
MAX_FLOAT_CLASS = 2 ** 31 - 1
# The most bytes read of classes.txt or data.yaml (65,536 names of 60 characters fit), and of one label file
# (400,000 box lines, or a polygon of a million points): a larger one is refused before it is read.
DESCRIPTION_MAX_BYTES = 4 << 20
LABEL_MAX_BYTES = 16 << 20
# data.yaml nests two levels (names: {0: person}); deeper is no dataset description, and libyaml's composer
# recurses in C (100,000 levels crash the interpreter), so the depth is checked on the events first.
YAML_MAX_DEPTH = 32
MAX_KEYPOINT_VALUES = 10_000  # either number of kpt_shape (COCO's is [17, 3]): a line holds their product
_SHOWN = reprlib.Repr()  # values in messages: a few items, a few levels, 60 characters of a string
_SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlevel = 60, 60, 3


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


def _bytes(path: Path, root: Path, cap: int) -> bytes:
    """A file's bytes, read only where it lies inside `root` (the dataset's folder: a symlink leading out of it
    is refused before anything is opened, and the file opened is checked again on its descriptor), is a
    regular file (a FIFO would block, /dev/zero never end) and is no larger than `cap`; else ImageDecodeError
    with its reason ("outside the root" says nothing of what lies outside)."""
    real, base = os.path.realpath(path), os.path.realpath(root)
    if not real.startswith(base.rstrip(os.sep) + os.sep):
        raise ImageDecodeError(str(path), "outside the root", f"it leads out of the dataset's folder {root} (a symlink out is not read)")
    return read_source(str(path), cap, str(root))


def _text(path: Path, root: Path, what: str, cap: int = DESCRIPTION_MAX_BYTES) -> str:
    """A text file of the dataset (`_bytes`'s checks; each refusal a SourceError naming it), `_decoded`."""
    try:
        data = _bytes(path, root, cap)
    except ImageDecodeError as e:
        raise SourceError(f"{path}: cannot read {what}: {e.reason} ({e.detail})") from None
    return _decoded(data, path, what)


def _decoded(data: bytes, path: Path, what: str) -> str:
    """A text file's bytes as text: UTF-8, a byte-order mark dropped (Windows editors write one), any line endings."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise SourceError(f"{path}: cannot read {what} (not UTF-8: {e.reason} at byte {e.start})") from None


def _there(path: Path) -> bool:
    """Whether anything is at `path`: a file, a FIFO, a dangling symlink (each then read, or refused with its reason)."""
    return path.exists() or path.is_symlink()


def read_names(root: Path) -> list[str] | None:
    """The class names of ROOT/classes.txt or ROOT/data.yaml (or .yml), None where neither is there."""
    return read_dataset(root)[0]


def read_dataset(root: Path) -> tuple[list[str] | None, tuple[int, int] | None]:
    """(the class names of ROOT/classes.txt or ROOT/data.yaml, or None; data.yaml's `kpt_shape` (K, D), or None)."""
    txt = root / "classes.txt"
    if _there(txt):
        lines = [ln.strip() for ln in _text(txt, root, "the class names").splitlines()]
        while lines and not lines[-1]:
            lines.pop()
        if "" in lines:  # skipping it would give every later class the label of the one after it
            raise SourceError(f"{txt}:{lines.index('') + 1}: an empty line among the class names (line k names class k - 1)")
        return lines, None
    for name in ("data.yaml", "data.yml"):
        path = root / name
        if _there(path):
            return _data_yaml(path, root)
    return None, None


def _load_yaml(text: str, path: Path):
    """data.yaml's document, read safely: no aliases (430 bytes of nested aliases stand for gigabytes once a
    value is written out), at most YAML_MAX_DEPTH levels, only the safe loader's tags (no Python objects).
    The events are checked first (libyaml's C parser, where installed), then the document is built."""
    import yaml

    fast = getattr(yaml, "CSafeLoader", None)
    loader = fast or yaml.SafeLoader
    depth = 0
    try:
        for ev in yaml.parse(text, Loader=loader):
            if isinstance(ev, yaml.AliasEvent):
                raise SourceError(f"{path}:{ev.start_mark.line + 1}: an alias (*{_cut(ev.anchor, 40)}); a data.yaml is read "
                                  "without aliases (nested ones repeat a value without bound)")
            if isinstance(ev, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                depth += 1
                if depth > YAML_MAX_DEPTH:
                    raise SourceError(f"{path}:{ev.start_mark.line + 1}: nested more than {YAML_MAX_DEPTH} levels deep; a data.yaml "
                                      "holds names, nc and paths")
            elif isinstance(ev, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                depth -= 1
        return yaml.load(text, Loader=loader)
    except (yaml.YAMLError, ValueError) as e:  # ValueError: an integer past Python's digit limit
        raise SourceError(f"{path}: cannot read it as YAML ({_cut(' '.join(str(e).split()), 200)})") from None


def _cut(text: str, n: int) -> str:
    """`text` cut to `n` characters for a message."""
    return text if len(text) <= n else text[: n - 3] + "..."


def _data_yaml(path: Path, root: Path) -> tuple[list[str], tuple[int, int] | None]:
    doc = _load_yaml(_text(path, root, "the dataset description"), path)
    if not isinstance(doc, dict):
        raise SourceError(f"{path}: not a mapping with 'names' (a YOLO data.yaml)")
    names, nc = doc.get("names"), doc.get("nc")
    if nc is not None and not (isinstance(nc, int) and not isinstance(nc, bool) and nc >= 0):
        raise SourceError(f"{path}: nc is {_SHOWN.repr(nc)}, not a number of classes")
    if names is None and nc is not None:
        if nc > MAX_UNNAMED_CLASS + 1:
            raise SourceError(f"{path}: nc is {_shown(nc)} with no names; at most {MAX_UNNAMED_CLASS + 1} classes are named class_0... "
                              "(list the names under 'names')")
        out = [f"class_{k}" for k in range(nc)]  # what Ultralytics names them
    elif isinstance(names, list) and all(isinstance(n, (str, int, float)) and not isinstance(n, bool) for n in names):
        out = [str(n) for n in names]
    elif isinstance(names, dict) and names:
        ids = {}
        for k, v in names.items():
            if isinstance(k, bool) or not (isinstance(k, int) or (isinstance(k, str) and k.strip().isdigit() and len(k) < 20)):
                raise SourceError(f"{path}: names has the key {_SHOWN.repr(k)}, not a class id")
            if isinstance(v, bool) or not isinstance(v, (str, int, float)):
                raise SourceError(f"{path}: names[{_SHOWN.repr(k)}] is {_SHOWN.repr(v)}, not a name")
            ids[int(k)] = str(v)
        if sorted(ids) != list(range(len(ids))):
            raise SourceError(f"{path}: names has ids {_SHOWN.repr(sorted(ids)[:10])}, not 0..{len(ids) - 1}")
        out = [ids[k] for k in range(len(ids))]
    else:
        raise SourceError(f"{path}: no 'names' list or mapping of ids to names")
    if nc is not None and nc != len(out):
        raise SourceError(f"{path}: nc is {_shown(nc)} but names lists {len(out)} classes")
    kpt = doc.get("kpt_shape")
    if kpt is not None:
        if not (isinstance(kpt, list) and len(kpt) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_KEYPOINT_VALUES for v in kpt)):
            raise SourceError(f"{path}: kpt_shape is {_SHOWN.repr(kpt)}, not [keypoints, values each] (such as [17, 3])")
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
    """One label file's objects as (x1, y1, x2, y2, class, 0), in fractions of the image's size; the file read
    as `_bytes` reads it, inside its own folder."""
    return parse_labels(_text(path, path.parent, "the label file", LABEL_MAX_BYTES), path, names, keypoints)


def parse_labels(text: str, path: Path, names: list[str] | None, keypoints: tuple[int, int] | None = None) -> list[tuple]:
    """The objects of label file `path`'s text, as `read_labels` gives them."""
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
    skipped = Skips()
    for f in files:
        rel = f.relative_to(images)
        lab = (labels / rel).with_suffix(".txt")
        if _there(lab):
            used.add(lab.relative_to(labels))
            try:
                data = _bytes(lab, root, LABEL_MAX_BYTES)
            except ImageDecodeError as e:  # the image's boxes are unknown: never kept as an image without any
                skip(skipped, {"source": str(f.relative_to(root)), "reason": "bad label file",
                               "detail": f"{lab.relative_to(root)}: {e.reason} ({e.detail})"}, strict)
                continue
            per_image.append(parse_labels(_decoded(data, lab, "the label file"), lab, names, keypoints))
        else:
            per_image.append([])
            missing += 1
        paths.append(str(f.relative_to(root)))
    if not paths:
        raise SourceError(f"{images}: no image could be listed ({skipped[0]['source']}: {skipped[0]['reason']}, {skipped[0]['detail']})")
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
    s = box_split(split, paths, per_image, [(-1, -1)] * len(paths), True, skipped, FileReader(max_bytes=max_bytes, confine=True), notes)
    return Source(layout, root, names, None, [s], details={"format": "yolo", "labels": str(labels.resolve())})
