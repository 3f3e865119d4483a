"""The Python front door (dataprep.build) against the CLI: for every build command, the same input gives
the same pack byte for byte (manifests but for when and how long), the same summary lines, the same option
names and defaults, and the same refusals; progress is off unless asked for."""
from __future__ import annotations

import csv
import inspect
import io
import json
import subprocess
import sys
import tarfile
import types
import typing
from pathlib import Path

import click
import cv2
import numpy as np
import pytest
from click.testing import CliRunner

import dataprep
from dataprep import build
from dataprep.cli import main
from dataprep.errors import PackExistsError
from dataprep.synthetic import write_tree


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and p.name != "manifest.json"}


def same_pack(a: Path, b: Path) -> None:
    """Every file byte for byte, and the manifests but for when the build ran and how long it took."""
    fa, fb = _files(a), _files(b)
    assert fa.keys() == fb.keys() and fa
    assert [k for k in fa if fa[k] != fb[k]] == []
    ma, mb = (json.loads((p / "manifest.json").read_text()) for p in (a, b))
    for m in (ma, mb):
        m.pop("created"), m.pop("build")
    assert ma == mb


def _timeless(lines) -> list[str]:
    """Summary lines less the timing ones (the rate line, the tokens/rows line), with out paths made alike."""
    return [ln for ln in lines if not any(w in ln for w in (" s,", " s (", " s\n")) and not ln.rstrip().endswith(" s")]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    """One small input of each source kind, written once."""
    base = tmp_path_factory.mktemp("front_door_inputs")
    tree = write_tree(base / "tree", classes=3, per_class=4, val_per_class=1, sizes=((40, 60), (64, 48)), kind="index", ext=".png")
    pngs = sorted((tree / "train").rglob("*.png"))
    classes = sorted(p.name for p in (tree / "train").iterdir())
    with tarfile.open(base / "w.tar", "w") as tf:
        for i, p in enumerate(pngs):
            for name, data in ((f"{i:04d}.png", p.read_bytes()), (f"{i:04d}.cls", str(classes.index(p.parent.name)).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    with open(base / "list.csv", "w", newline="") as f:
        csv.writer(f).writerows([(str(p.relative_to(tree)), p.parent.name) for p in pngs])
    (base / "seg" / "img").mkdir(parents=True)
    (base / "seg" / "mask").mkdir()
    rng = np.random.default_rng(0)
    for i in range(6):
        cv2.imwrite(str(base / "seg" / "img" / f"s{i}.png"), rng.integers(0, 255, (40, 56, 3), dtype=np.uint8))
        cv2.imwrite(str(base / "seg" / "mask" / f"s{i}.png"), rng.integers(0, 4, (40, 56), dtype=np.uint8))
    for c in ("a", "b"):
        (base / "vol" / c).mkdir(parents=True)
        for i in range(3):
            np.save(base / "vol" / c / f"v{i}.npy", rng.integers(0, 4000, (6, 10, 12), dtype=np.uint16))
    with open(base / "t.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["x", "colour", "y"])
        w.writerows((round(float(rng.normal()), 4), ["red", "green", "blue"][i % 3], i % 2) for i in range(40))
    (base / "text").mkdir()
    for i in range(4):
        (base / "text" / f"d{i}.txt").write_text(" ".join(f"word{j % 17} thing{i}" for j in range(200)) + "\n")
    build.tokenize(base / "text", base / "bpe", train_bpe=300, workers=1)
    from dataprep.detection.scenes import write_scenes

    scenes = write_scenes(base / "scenes", n=5)
    out = {"scenes": scenes["images"], "coco": scenes["coco"], "yolo": scenes["yolo"], "tree": tree, "tar": base / "w.tar",
           "list": base / "list.csv", "seg": base / "seg", "vol": base / "vol",
           "table": base / "t.csv", "text": base / "text", "tokenizer": base / "bpe" / "tokenizer.json"}
    try:
        from dataprep.synthetic import write_video_tree
        write_video_tree(base / "videos", classes=2, per_class=1, frames=4, h=32, w=48)
        out["video"] = base / "videos"
    except ImportError:  # no PyAV: the video case skips
        pass
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"image": [p.read_bytes() for p in pngs], "label": [p.parent.name for p in pngs]}), base / "t.parquet")
        out["parquet"] = base / "t.parquet"
    except ImportError:
        pass
    return out


# Each build command as the CLI takes it and as the front door does, with options off their defaults.
CASES = {
    "imagenet": (lambda i, o: ["build", "imagenet", i["tree"], "--size", 32, "--mode", "raw", "-j", 1, "--shard-size", 5, "--out", o],
                 lambda i, o: build.imagenet(i["tree"], o, size=32, mode="raw", workers=1, shard_size=5)),
    "folder": (lambda i, o: ["build", "folder", i["tree"] / "train", "--size", 24, "--resize", "center-crop", "-j", 1, "--out", o],
               lambda i, o: build.folder(i["tree"] / "train", o, size=24, resize="center-crop", workers=1)),
    "webdataset": (lambda i, o: ["build", "webdataset", i["tar"], "--sizes", "16,32", "-j", 1, "--out", o],
                   lambda i, o: build.webdataset(i["tar"], o, sizes=(16, 32), workers=1)),
    "parquet": (lambda i, o: ["build", "parquet", i["parquet"], "--label-column", "label", "--size", 32, "-j", 1, "--out", o],
                lambda i, o: build.parquet(i["parquet"], o, label_column="label", size=32, workers=1)),
    "list": (lambda i, o: ["build", "list", i["list"], "--root", i["tree"], "--size", 32, "--grayscale", "-j", 1, "--out", o],
             lambda i, o: build.list(i["list"], o, root=i["tree"], size=32, grayscale=True, workers=1)),
    "segmentation": (lambda i, o: ["build", "segmentation", "--images", i["seg"] / "img", "--masks", i["seg"] / "mask", "--size", 32,
                                   "--num-classes", 4, "-j", 1, "--out", o],
                     lambda i, o: build.segmentation(i["seg"] / "img", i["seg"] / "mask", o, size=32, num_classes=4, workers=1)),
    "coco": (lambda i, o: ["build", "coco", i["scenes"], "--annotations", i["coco"], "--size", 48, "--mode", "raw", "--split", "val",
                           "-j", 1, "--out", o],
             lambda i, o: build.coco(i["scenes"], o, annotations=i["coco"], size=48, mode="raw", split="val", workers=1)),
    "yolo": (lambda i, o: ["build", "yolo", i["yolo"], "--size", 40, "--resize", "center-crop", "-j", 1, "--out", o],
             lambda i, o: build.yolo(i["yolo"], o, size=40, resize="center-crop", workers=1)),
    "volumes": (lambda i, o: ["build", "volumes", i["vol"], "--shape", "4,8,8", "--depth", "8", "--window", "0,4000", "-j", 1,
                              "--out", o],
                lambda i, o: build.volumes(i["vol"], o, shape=(4, 8, 8), depth=8, window=(0, 4000), workers=1)),
    "video": (lambda i, o: ["build", "video", i["video"], "--size", 16, "--fps", 5, "-j", 1, "--out", o],
              lambda i, o: build.video(i["video"], o, size=16, fps=5, workers=1)),
    "table": (lambda i, o: ["table", i["table"], "--target", "y", "--val-fraction", "0.25", "--seed", 3, "--out", o],
              lambda i, o: build.table(i["table"], o, target="y", val_fraction=0.25, seed=3)),
    "tokenize": (lambda i, o: ["tokenize", i["text"], "--tokenizer", i["tokenizer"], "--split-docs", "line", "--val-fraction", "0.2",
                               "--out", o],
                 lambda i, o: dataprep.tokenize(i["text"], o, tokenizer=i["tokenizer"], split_docs="line", val_fraction=0.2)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_front_door_builds_what_the_cli_builds_byte_for_byte(name, inputs, tmp_path, capsys):
    if name == "parquet" and "parquet" not in inputs:
        pytest.skip("needs pyarrow (the parquet extra: pip install 'dataprep[parquet]')")
    if name == "video" and "video" not in inputs:
        pytest.skip("needs PyAV (the video extra: pip install 'dataprep[video]')")
    args, call = CASES[name]
    r = cli(*args(inputs, tmp_path / "cli"), "--no-progress")
    assert r.exit_code == 0, r.output
    capsys.readouterr()
    summary = call(inputs, tmp_path / "py")
    assert capsys.readouterr().err == ""  # progress is off by default, and nothing else is said
    same_pack(tmp_path / "cli", tmp_path / "py")
    printed = [ln.replace(str(tmp_path / "cli"), "OUT") for ln in r.stdout.splitlines()]
    assert _timeless(printed) == _timeless(ln.replace(str(tmp_path / "py"), "OUT") for ln in summary.lines())
    assert len(_timeless(printed)) >= 2


def test_a_stored_as_line_comes_first_as_the_cli_prints_it(inputs, tmp_path):
    s = build.folder(inputs["tree"] / "train", tmp_path / "p.h5", size=24, workers=1, fmt="hdf5")
    assert s.lines()[0].startswith(f"stored as hdf5: {tmp_path / 'p.h5'}") and s.lines()[1] == f"pack: {tmp_path / 'p.h5'}"
    assert dataprep.is_pack(tmp_path / "p.h5")


def test_progress_true_reports_on_stderr(inputs, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DATAPREP_PROGRESS_EVERY", "0")  # a line for every step, however short the build
    build.folder(inputs["tree"] / "train", tmp_path / "p", size=24, workers=1, progress=True)
    err = capsys.readouterr().err
    assert f"build {tmp_path / 'p'}" in err and "12/12" in err.replace(",", "")


def test_an_imagenet_build_tells_which_val_labels_it_used(tmp_path, capsys):
    tree = write_tree(tmp_path / "t", classes=2, per_class=2, sizes=((32, 32),), kind="index", ext=".png")
    val = tree / "val"
    val.mkdir()
    for i, p in enumerate(sorted((tree / "train").rglob("*.png"))[:2]):
        (val / f"v{i}.png").write_bytes(p.read_bytes())
    labels = tmp_path / "labels.txt"
    labels.write_text("v0.png 0\nv1.png 1\n")
    s = build.imagenet(tree, tmp_path / "p", val_labels=labels, size=16, workers=1)
    assert s.val_labels is not None and s.notices == [f"val labels: {s.val_labels}"]
    assert capsys.readouterr().err == ""  # kept in the summary; said only with progress
    r = cli("build", "imagenet", tree, "--val-labels", labels, "--size", 16, "-j", 1, "--out", tmp_path / "q", "--no-progress")
    assert r.exit_code == 0 and f"val labels: {s.val_labels}" in r.stderr


# --- the same options, defaults and refusals -------------------------------------------------------------

def _command(name: str) -> click.Command:
    from dataprep.cli.build import build as group
    from dataprep.cli.table import table
    from dataprep.cli.tokenize import tokenize

    return {"table": table, "tokenize": tokenize}.get(name) or group.commands[name]


FRONT = {"imagenet": (build.imagenet, build.IMAGE_OPTIONS), "folder": (build.folder, build.IMAGE_OPTIONS),
         "webdataset": (build.webdataset, build.IMAGE_OPTIONS), "parquet": (build.parquet, build.IMAGE_OPTIONS),
         "list": (build.list, build.IMAGE_OPTIONS), "segmentation": (build.segmentation, build.IMAGE_OPTIONS),
         "coco": (build.coco, build.IMAGE_OPTIONS), "yolo": (build.yolo, build.IMAGE_OPTIONS),
         "volumes": (build.volumes, build.VOLUME_OPTIONS), "video": (build.video, build.VIDEO_OPTIONS),
         "table": (build.table, build.TABLE_OPTIONS), "tokenize": (build.tokenize, build.TOKENIZE_OPTIONS)}
CLI_ONLY = {"config", "profile_to"}  # a YAML of defaults and a cProfile: what a command line needs, not a call


@pytest.mark.parametrize("name", list(FRONT))
def test_every_cli_option_is_a_front_door_option_with_the_same_default(name):
    fn, table = FRONT[name]
    sig = {k: p.default for k, p in inspect.signature(fn).parameters.items() if p.kind is not p.VAR_KEYWORD}
    front = {**table, **sig}
    command = _command(name)
    params = {p.name: p for p in command.params if p.name not in CLI_ONLY}
    assert set(params) == set(front)
    ctx = click.Context(command)
    for k, p in params.items():
        if isinstance(p, click.Argument) or p.required or k == "progress":
            continue  # arguments have no default; progress is on for a command, off for a call (the one difference)
        want = p.get_default(ctx, call=False)
        assert str(want) == str(front[k]) or (want in (None, ()) and front[k] in (None, ())), (k, want, front[k])
    assert front["progress"] is False


BAD = [("size", 4, "--size", "4"), ("quality", 0, "--quality", "0"), ("workers", 0, "-j", "0"), ("mode", "bogus", "--mode", "bogus"),
       ("resize", "bogus", "--resize", "bogus"), ("fmt", "bogus", "--format", "bogus"), ("max_bytes", "lots", "--max-bytes", "lots"),
       ("sizes", "4,8", "--sizes", "4,8"), ("depth", 12, "--depth", "12"), ("compress", "bogus", "--compress", "bogus")]


@pytest.mark.parametrize("key,value,flag,text", BAD, ids=[b[0] for b in BAD])
def test_a_bad_value_is_refused_by_both_before_anything_is_built(key, value, flag, text, inputs, tmp_path):
    r = cli("build", "folder", inputs["tree"] / "train", flag, text, "--out", tmp_path / "cli")
    assert r.exit_code == 2, r.output
    with pytest.raises(dataprep.UsageError, match=key) as e:
        build.folder(inputs["tree"] / "train", tmp_path / "py", **{key: value})
    assert isinstance(e.value, ValueError) and not (tmp_path / "py").exists()


def test_size_beside_sizes_and_an_unknown_option_are_refused(inputs, tmp_path):
    with pytest.raises(dataprep.UsageError, match="sizes replaces size"):
        build.folder(inputs["tree"] / "train", tmp_path / "p", size=64, sizes=(32, 64))
    with pytest.raises(TypeError, match=r"unexpected option\(s\) sizee; its options are .*sizes"):
        build.folder(inputs["tree"] / "train", tmp_path / "p", sizee=32)
    assert not (tmp_path / "p").exists()


def test_a_ctrl_c_inside_a_build_is_build_interrupted_and_keeps_the_staging(inputs, tmp_path, monkeypatch):
    import dataprep.images.build as images

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(images, "build_images", interrupted)
    with pytest.raises(build.BuildInterrupted) as e:
        build.folder(inputs["tree"] / "train", tmp_path / "p", size=24, workers=1)
    assert str(e.value.kept_in) == str(tmp_path / "p") and isinstance(e.value, KeyboardInterrupt)
    r = cli("build", "folder", inputs["tree"] / "train", "--size", 24, "-j", 1, "--out", tmp_path / "q", "--no-progress")
    assert r.exit_code == 130
    assert f"interrupted: workers stopped, finished shards kept in {tmp_path / 'q'}; run the same command with --resume" in r.stderr


def test_every_build_command_has_its_front_door_and_its_case():
    """A build command added later (`build coco`) must join the front door and these tests."""
    from dataprep.cli.build import build as group

    commands = set(group.commands) | {"table", "tokenize"}
    assert commands == set(CASES) == set(FRONT), (commands ^ set(CASES), commands ^ set(FRONT))


OTHER_BAD = [("tokenize", "val_fraction", 1.0, ["--val-fraction", "1"]), ("tokenize", "chunk_mb", 0, ["--chunk-mb", "0"]),
             ("tokenize", "train_bpe", 100, ["--train-bpe", "100"]), ("table", "missing", "x", ["--missing", "x"]),
             ("table", "seed", "one", ["--seed", "one"]), ("volumes", "shape", "1,2", ["--shape", "1,2"]),
             ("volumes", "depth", 12, ["--depth", "12"])]


@pytest.mark.parametrize("name,key,value,flags", OTHER_BAD, ids=[f"{b[0]}-{b[1]}" for b in OTHER_BAD])
def test_the_text_table_and_volume_builds_refuse_bad_values_as_their_commands_do(name, key, value, flags, inputs, tmp_path):
    args, _ = CASES[name]
    r = cli(*args(inputs, tmp_path / "cli"), *flags)
    assert r.exit_code == 2, r.output
    fn, _ = FRONT[name]
    src = {"tokenize": inputs["text"], "table": inputs["table"], "volumes": inputs["vol"]}[name]
    extra = {"target": "y"} if name == "table" else ({"tokenizer": inputs["tokenizer"]} if name == "tokenize" else {})
    with pytest.raises(dataprep.UsageError, match=key):
        fn(src, tmp_path / "py", **extra, **{key: value})
    assert not (tmp_path / "py").exists()


def test_numpy_integers_are_integers_and_a_spelled_none_is_not_none(inputs, tmp_path):
    import numpy as np

    s = build.folder(inputs["tree"] / "train", tmp_path / "p", size=np.int64(24), workers=np.int32(1))
    assert s.written == 12
    with pytest.raises(dataprep.UsageError, match="input_format"):
        build.table(inputs["table"], tmp_path / "t", target="y", input_format="None")


def test_ctrl_c_in_tokenize_says_resume_and_in_table_aborts_as_before(inputs, tmp_path, monkeypatch):
    import dataprep.tables.build as tables
    import dataprep.tokens.tokenize as tokens

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(tokens, "tokenize", interrupted)
    r = cli("tokenize", inputs["text"], "--tokenizer", inputs["tokenizer"], "--out", tmp_path / "tok", "--no-progress")
    assert r.exit_code == 130
    assert f"interrupted: finished shards kept in {tmp_path / 'tok'}; run the same command with --resume to continue" in r.stderr
    monkeypatch.setattr(tables, "build_table", interrupted)
    with pytest.raises(KeyboardInterrupt) as e:  # a table build keeps nothing to resume: no BuildInterrupted
        build.table(inputs["table"], tmp_path / "t", target="y")
    assert not isinstance(e.value, build.BuildInterrupted)
    r = cli("table", inputs["table"], "--target", "y", "--out", tmp_path / "t2", "--no-progress")
    assert r.exit_code == 1 and "resume" not in r.output + r.stderr  # click's "Aborted!", as before the front door


def test_a_refusal_names_the_keyword_from_python_and_the_flag_from_the_cli(inputs, tmp_path):
    """What to pass is said as the caller passes it: overwrite=True / resume=True from Python, --overwrite /
    --resume from the command line (a Python user told to "pass --overwrite" has nothing to pass it to)."""
    src = inputs["tree"] / "train"
    for out, kw, flags in ((tmp_path / "p", {}, []), (tmp_path / "p.h5", {"fmt": "hdf5"}, ["--format", "hdf5"])):
        build.folder(src, out, size=16, workers=1, **kw)
        with pytest.raises(PackExistsError) as e:
            build.folder(src, out, size=16, workers=1, **kw)
        assert "pass overwrite=True to replace it" in str(e.value) and "--overwrite" not in str(e.value), str(e.value)
        r = cli("build", "folder", src, "--size", 16, "-j", 1, *flags, "--out", out)
        assert r.exit_code == 1 and "pass --overwrite to replace it" in r.output and "overwrite=True" not in r.output, r.output
    with pytest.raises(dataprep.DataprepError, match=r"^overwrite=True and resume=True contradict each other"):
        build.folder(src, tmp_path / "q", size=16, overwrite=True, resume=True)
    r = cli("build", "folder", src, "--size", 16, "--overwrite", "--resume", "--out", tmp_path / "q")
    assert r.exit_code == 1 and "--overwrite and --resume contradict each other" in r.output, r.output
    (tmp_path / "u").mkdir()
    (tmp_path / "u" / "train").mkdir()  # an unfinished build: a split folder, no manifest
    with pytest.raises(dataprep.DataprepError, match=r"pass resume=True to continue it, or overwrite=True to start again"):
        build.folder(src, tmp_path / "u", size=16, workers=1)


# --- the options typed: what an IDE completes and mypy checks ------------------------------------------------

TYPED = {"image": (build.ImageOptions, build.IMAGE_OPTIONS), "volume": (build.VolumeOptions, build.VOLUME_OPTIONS),
         "video": (build.VideoOptions, build.VIDEO_OPTIONS),
         "tokenize": (build.TokenizeOptions, build.TOKENIZE_OPTIONS), "table": (build.TableOptions, build.TABLE_OPTIONS)}


def _alternatives(hint) -> list:
    """A hint's alternatives: `int | None` gives [int, NoneType]."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return [a for h in typing.get_args(hint) for a in _alternatives(h)]
    return [hint]


def _admits(hint, value) -> bool:
    """Whether `value` is one of `hint`'s alternatives, as mypy would see it (a bool is no int here)."""
    for h in _alternatives(hint):
        origin = typing.get_origin(h)
        if origin is typing.Literal:
            ok = any(value == a and type(value) is type(a) for a in typing.get_args(h))
        elif h is type(None):
            ok = value is None
        elif h in (int, float):
            ok = isinstance(value, (int,) if h is int else (int, float)) and not isinstance(value, bool)
        else:
            ok = isinstance(value, origin or h)
        if ok:
            return True
    return False


def drift(typed, table: dict) -> list[str]:
    """Where a TypedDict and its *_OPTIONS table disagree: a key in one only, a default its type does not
    admit, a choice whose Literal is not the CLI's choices, a ranged option not typed int."""
    from dataprep.options import _RANGES, _choices

    hints = typing.get_type_hints(typed)
    problems = [f"{k}: in the table only" for k in table if k not in hints] + [f"{k}: typed only" for k in hints if k not in table]
    choices = _choices()
    for k in hints.keys() & table.keys():
        alts = _alternatives(hints[k])
        if not _admits(hints[k], table[k]):
            problems.append(f"{k}: its default {table[k]!r} is not a {hints[k]}")
        if k in choices:
            literal = {a for h in alts if typing.get_origin(h) is typing.Literal for a in typing.get_args(h)}
            if literal | ({None} if type(None) in alts else set()) != set(choices[k]):
                problems.append(f"{k}: {hints[k]} is not the CLI's choices {choices[k]}")
        if k in _RANGES and int not in alts:
            problems.append(f"{k}: ranged, but {hints[k]} is not an int")
    return problems


def _option_docs() -> dict[str, dict[str, str]]:
    """Each TypedDict of dataprep/options.py: its keys' descriptions, the strings under their annotations."""
    import ast

    from dataprep import options

    docs = {}
    for cls in (c for c in ast.parse(inspect.getsource(options)).body if isinstance(c, ast.ClassDef)):
        docs[cls.name] = {a.target.id: b.value.value for a, b in zip(cls.body, cls.body[1:])
                          if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name) and isinstance(b, ast.Expr)
                          and isinstance(b.value, ast.Constant)}
    return docs


@pytest.mark.parametrize("name", list(TYPED))
def test_each_options_typeddict_has_its_tables_keys_and_types_that_admit_its_defaults(name):
    typed, table = TYPED[name]
    assert typed.__required_keys__ == frozenset()  # every option may be left out
    assert drift(typed, table) == []
    docs = _option_docs()  # a line for each option, in the TypedDict or a base it names (pdoc reads them there)
    named = [typed, *(b for b in typed.__orig_bases__ if b.__name__ in docs)]
    said = {k: v for c in named for k, v in docs[c.__name__].items()}
    assert [k for k in table if not said.get(k, "").strip() or "\n" in said[k]] == []


def test_the_drift_check_sees_a_missing_key_a_wrong_type_and_a_wrong_choice():
    """Negative control: the image options with `mode` short of "raw", `size` typed str (its default and its
    range), `quality` gone from the TypedDict and `qualityy` in the table, `workers` typed bool (its default
    None, its range)."""
    hints = {**typing.get_type_hints(build.ImageOptions), "mode": typing.Literal["encoded"], "size": str, "workers": bool}
    del hints["quality"]
    broken = typing.TypedDict("broken", hints, total=False)
    table = {**build.IMAGE_OPTIONS, "qualityy": 90}
    problems = drift(broken, table)
    assert sorted(p.split(":")[0] for p in problems) == ["mode", "quality", "qualityy", "size", "size", "workers", "workers"], problems


FRONT_TYPED = {"imagenet": "ImageOptions", "folder": "ImageOptions", "webdataset": "ImageOptions", "parquet": "ImageOptions",
               "list": "ImageOptions", "segmentation": "ImageOptions", "coco": "ImageOptions", "yolo": "ImageOptions",
               "volumes": "VolumeOptions", "video": "VideoOptions", "tokenize": "TokenizeOptions", "table": "TableOptions"}
# Each build's arguments but its options, any path: an unknown option is refused before a path is read.
ARGS = {"segmentation": ("i", "m", "o"), "coco": ("i", "o"), "table": ("t", "o")}
KW = {"coco": {"annotations": "a.json"}, "table": {"target": "y"}}


@pytest.mark.parametrize("name", list(FRONT))
def test_each_build_types_its_options_and_still_refuses_an_unknown_one(name, tmp_path):
    fn, table = FRONT[name]
    options = inspect.signature(fn).parameters["options"]
    assert options.kind is options.VAR_KEYWORD
    assert eval(options.annotation, vars(build)) == build.Unpack[getattr(build, FRONT_TYPED[name])]
    assert set(typing.get_type_hints(getattr(build, FRONT_TYPED[name]))) == set(table)
    args = [tmp_path / a for a in ARGS.get(name, ("s", "o"))]
    with pytest.raises(TypeError, match=rf"^build\.{name}\(\) got unexpected option\(s\) sizee; its options are .*workers"):
        fn(*args, **KW.get(name, {}), sizee=32)
    assert list(tmp_path.iterdir()) == []


BAD_CALLS = '''\
import dataprep
from dataprep import build

build.folder("photos", "packs/p", size="big")
build.folder("photos", "packs/p", mode="jpeg")
build.folder("photos", "packs/p", sizee=256)
build.coco("images", "packs/c", annotations="a.json", workers="all")
build.volumes("ct", "packs/ct", depth=12)
build.table("t.csv", "packs/t", target="y", missing="drop")
dataprep.tokenize("corpus", "packs/x", split_docs="sentence")
build.folder("photos", "packs/p", size=256, workers=8, mode="raw")
'''


def _every_option_at_its_default() -> str:
    """A call of each build passing every option of its table at its default, as Python source."""
    calls = {"folder": build.IMAGE_OPTIONS, "volumes": build.VOLUME_OPTIONS, "tokenize": build.TOKENIZE_OPTIONS}
    lines = [f'build.{fn}("src", "out", {", ".join(f"{k}={v!r}" for k, v in table.items())})' for fn, table in calls.items()]
    lines.append(f'build.table("t.csv", "out", target="y", {", ".join(f"{k}={v!r}" for k, v in build.TABLE_OPTIONS.items())})')
    return "from dataprep import build\n\n" + "\n".join(lines) + "\n"


def test_mypy_refuses_a_wrong_option_and_accepts_the_documented_calls(tmp_path):
    """mypy over three files: calls with a wrong type, a value not among the choices or a misspelled name
    (an error on each of those lines, none on the right call after them); every option passed at its
    default; docs/building.md's Python example as it stands."""
    pytest.importorskip("mypy", reason="needs mypy (the test extra)")
    ROOT = Path(__file__).resolve().parents[1]
    (tmp_path / "bad.py").write_text(BAD_CALLS)
    (tmp_path / "defaults.py").write_text(_every_option_at_its_default())
    doc = (ROOT / "docs" / "building.md").read_text()
    example = doc.split("## From Python", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert "build.volumes(" in example and "dataprep.tokenize(" in example
    (tmp_path / "documented.py").write_text(example)
    # Only the front door and what it names are read (the rest is Any): seconds, not the half minute a
    # cold run over the whole package takes.
    (tmp_path / "mypy.ini").write_text("[mypy]\nfollow_imports = skip\nignore_missing_imports = true\n"
                                       "[mypy-dataprep,dataprep.build,dataprep.options,dataprep.errors]\nfollow_imports = silent\n")
    out = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(tmp_path / "mypy.ini"), "--cache-dir", str(tmp_path / "cache"),
                          "--no-error-summary", *(str(tmp_path / f) for f in ("bad.py", "defaults.py", "documented.py"))],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    errors = [ln for ln in out.stdout.splitlines() if ": error:" in ln]
    assert {Path(ln.split(":")[0]).name for ln in errors} == {"bad.py"}, out.stdout + out.stderr
    assert sorted({int(ln.split(":")[1]) for ln in errors}) == list(range(4, 11)), out.stdout
    said = "\n".join(errors)
    assert '"size" to "folder" has incompatible type "str"; expected "int"' in said and 'Unexpected keyword argument "sizee"' in said
