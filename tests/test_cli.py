"""The command line through click's CliRunner: builds, config precedence, info, exit codes, fast help."""
import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from dataprep.cli import main
from dataprep.pack.backends import read_manifest

from .conftest import corpus_dir


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_build_imagenet_then_info(index_tree, tmp_path):
    out = tmp_path / "p"
    r = run("build", "imagenet", index_tree, "--out", out, "--size", 32, "--mode", "raw", "-j", 1, "--no-progress")
    assert r.exit_code == 0, r.output
    assert "train: 18 of 18 images written" in r.output and "val: 6 of 6" in r.output and "images/s" in r.output
    r = run("info", out)
    assert r.exit_code == 0 and "split train: 18 samples" in r.output and "raw" in r.output
    r = run("info", out, "--json")
    assert json.loads(r.output)["splits"]["val"]["count"] == 6


def test_existing_pack_is_refused_with_exit_1(index_tree, tmp_path):
    args = ["build", "folder", index_tree / "train", "--out", tmp_path / "p", "--size", 16, "-j", 1]
    assert run(*args).exit_code == 0
    r = run(*args)
    assert r.exit_code == 1 and "already holds a pack" in r.output and "--overwrite" in r.output
    assert run(*args, "--overwrite").exit_code == 0


@pytest.mark.parametrize(
    "args, code, text",
    [
        (["build", "imagenet", "/nonexistent/src", "--out", "OUT"], 1, "does not exist"),
        (["build", "imagenet", "SRC", "--out", "OUT", "--resize", "stretch"], 2, "stretch"),
        (["build", "imagenet", "SRC", "--out", "OUT", "--quality", "0"], 2, "quality"),
        (["build", "imagenet", "SRC"], 2, "--out"),
        (["info", "/nonexistent/pack"], 1, "no such pack"),
    ],
)
def test_bad_input_exit_codes(index_tree, tmp_path, args, code, text):
    args = [str(index_tree) if a == "SRC" else str(tmp_path / "o") if a == "OUT" else a for a in args]
    r = run(*args)
    assert r.exit_code == code and text in r.output


def test_config_supplies_defaults_and_the_command_line_wins(index_tree, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("size: 24\nresize: center-crop\nmode: raw\nworkers: 1\n")
    r = run("build", "imagenet", index_tree, "--config", cfg, "--out", tmp_path / "a")
    assert r.exit_code == 0, r.output
    s = read_manifest(tmp_path / "a")["settings"]["image"]
    assert (s["size"], s["resize"], s["mode"]) == (24, "center-crop", "raw")
    r = run("build", "imagenet", index_tree, "--size", 20, "--config", cfg, "--out", tmp_path / "b")
    assert read_manifest(tmp_path / "b")["settings"]["image"]["size"] == 20
    cfg.write_text("sise: 24\n")
    r = run("build", "imagenet", index_tree, "--config", cfg, "--out", tmp_path / "c")
    assert r.exit_code == 2 and "unknown option 'sise'" in r.output


def test_shipped_configs_are_valid(index_tree, tmp_path):
    from pathlib import Path

    configs = sorted((Path(__file__).parents[1] / "configs").glob("*.yaml"))
    assert configs
    for i, cfg in enumerate(configs):
        r = run("build", "imagenet", index_tree, "--config", cfg, "--out", tmp_path / str(i), "--limit", 3, "-j", 1)
        assert r.exit_code == 0, (cfg, r.output)


def test_strict_exits_1_naming_the_file(tmp_path, index_tree):
    import shutil

    shutil.copytree(index_tree / "train", tmp_path / "src")
    (tmp_path / "src" / "n00000000" / "broken.JPEG").write_bytes(b"")
    r = run("build", "folder", tmp_path / "src", "--out", tmp_path / "p", "--size", 16, "--strict", "-j", 1)
    assert r.exit_code == 1 and "broken.JPEG: empty file" in r.output
    assert not (tmp_path / "p" / "manifest.json").exists()


def test_help_is_fast_and_imports_no_torch():
    code = "import sys; from dataprep.cli import main\ntry: main(['--help'])\nexcept SystemExit: pass\n" \
           "print('torch' in sys.modules, 'cv2' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("False False")
    for args in (["-m", "dataprep", "--help"], ["-m", "dataprep", "build", "imagenet", "--help"]):
        r = subprocess.run([sys.executable, *args], capture_output=True, text=True)
        assert r.returncode == 0 and "Usage:" in r.stdout


@pytest.mark.corpus
@pytest.mark.slow
def test_real_photos_build_and_load(tmp_path):
    src = corpus_dir("images")
    r = run("build", "imagenet", src, "--out", tmp_path / "p", "--size", 128, "-j", 2, "--no-progress")
    assert r.exit_code == 0, r.output
    from dataprep.images.dataset import InMemoryImageDataset

    ds = InMemoryImageDataset(tmp_path / "p")
    assert len(ds) == 356 and ds.classes == ["lomiri", "mate", "opencv", "scenetext", "sklearn"]
    from PIL import Image

    for i in range(len(ds)):  # the shorter side is 128, or the photo's own where it is smaller (no upscale)
        with Image.open(src / ds.sources[i]) as im:
            assert min(ds.shapes[i][:2]) == min(128, min(im.size)), ds.sources[i]
    img, label = ds[100]
    assert img.shape[0] == 3 and ds.sources[100].startswith(f"train/{ds.classes[label]}/")


@pytest.mark.corpus
def test_awkward_corpus_as_a_class_folder(tmp_path):
    awk = corpus_dir("awkward")
    (tmp_path / "src" / "odd").mkdir(parents=True)
    for f in awk.iterdir():
        (tmp_path / "src" / "odd" / f.name).symlink_to(f)
    r = run("build", "folder", tmp_path / "src", "--out", tmp_path / "p", "--size", 64, "-j", 1)
    assert r.exit_code == 0 and "skipped: 1 empty file, 1 not an image, 1 truncated" in r.output
    m = read_manifest(tmp_path / "p")
    assert {s["source"]: s["reason"] for s in m["splits"]["train"]["skipped"]} == {
        "odd/empty.JPEG": "empty file", "odd/garbage.JPEG": "not an image", "odd/truncated.JPEG": "truncated"}
    assert m["splits"]["train"]["count"] == 11


def test_console_script_is_installed():
    from pathlib import Path

    script = Path(sys.executable).parent / "dataprep"
    if not script.exists():
        pytest.skip(f"no console script beside {sys.executable} (package not pip-installed in this environment)")
    r = subprocess.run([str(script), "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "build" in r.stdout and "info" in r.stdout


def test_demo_runs_on_its_own_sample(tmp_path):
    r = run("demo", "--images", 32, "--size", 32, "-j", 1, "--out", tmp_path / "d")
    assert r.exit_code == 0, r.output
    assert "32 of 32 images written" in r.output
    for name in ("JPEG files", "encoded pack in RAM", "decoded pack in RAM", "encoded pack, dataprep.Loader", "decoded pack, dataprep.Loader"):
        line = next(ln for ln in r.output.splitlines() if name in ln)
        assert float(line.split()[-4].replace(",", "")) > 0  # a measured rate
    assert (tmp_path / "d" / "pack-raw" / "manifest.json").exists()


def test_size_beside_sizes_is_a_usage_error(index_tree, tmp_path):
    src = index_tree / "train"
    for order in (["--size", 32, "--sizes", "16,24"], ["--sizes", "16,24", "--size", 32]):
        r = run("build", "folder", src, "--out", tmp_path / "p", *order, "-j", 1)
        assert r.exit_code == 2 and "--sizes replaces --size" in r.output, r.output
        assert not (tmp_path / "p").exists()  # refused before anything was listed or written
    cfg = tmp_path / "c.yaml"
    cfg.write_text("sizes: [16, 24]\n")
    r = run("build", "folder", src, "--config", cfg, "--size", 32, "--out", tmp_path / "p", "-j", 1)
    assert r.exit_code == 2 and "from the config file; --sizes 32 overrides it" in r.output
    cfg.write_text("size: 32\n")  # a config's size under the command line's --sizes is a default replaced, as documented
    r = run("build", "folder", src, "--config", cfg, "--sizes", "16,24", "--out", tmp_path / "p", "-j", 1, "--mode", "raw")
    assert r.exit_code == 0, r.output
    assert read_manifest(tmp_path / "p")["resolutions"] == [16, 24]


@pytest.mark.parametrize("where, command", [("train", "dataprep build folder"), ("", "dataprep build imagenet")])
def test_info_and_verify_of_a_source_folder_say_it_is_one(index_tree, where, command):
    src = index_tree / where if where else index_tree
    for cmd in ("info", "verify"):
        r = run(cmd, src)
        assert r.exit_code == 1
        assert f"{src}: this looks like a source folder" in r.output and f"{command} {src} --out PACK" in r.output, r.output
        assert "unfinished" not in r.output


def test_an_unfinished_build_is_still_called_one(index_tree, tmp_path):
    """Negative control for the source-folder message: shard directories without a manifest."""
    assert run("build", "folder", index_tree / "train", "--out", tmp_path / "p", "--size", 16, "-j", 1).exit_code == 0
    (tmp_path / "p" / "manifest.json").unlink()
    r = run("info", tmp_path / "p")
    assert r.exit_code == 1 and "unfinished build" in r.output and "source folder" not in r.output


def test_build_folder_on_a_dataset_root_points_to_build_imagenet(index_tree, tmp_path):
    r = run("build", "folder", index_tree, "--out", tmp_path / "p", "--size", 16, "-j", 1)
    assert r.exit_code == 1 and "(train, val) are named like splits" in r.output
    assert f"dataprep build imagenet {index_tree} --out PACK" in r.output and not (tmp_path / "p").exists()
    r = run("build", "folder", index_tree, "--out", tmp_path / "p", "--size", 16, "-j", 1, "--allow-split-named-classes")
    assert r.exit_code == 0, r.output
    assert read_manifest(tmp_path / "p")["classes"] == ["train", "val"]


def test_a_folder_of_empty_classes_says_no_images_were_found(tmp_path):
    for c in ("a", "b"):
        (tmp_path / "src" / c).mkdir(parents=True)
    r = run("build", "folder", tmp_path / "src", "--out", tmp_path / "p")
    assert r.exit_code == 1 and f"no images found under {tmp_path / 'src'} (looked for " in r.output
    assert "--allow-empty-classes" not in r.output


def test_center_crop_summary_says_how_many_were_padded(index_tree, tmp_path):
    r = run("build", "folder", index_tree / "train", "--out", tmp_path / "p", "--size", 48, "--resize", "center-crop", "-j", 1)
    assert r.exit_code == 0, r.output
    assert "train: 6 of 18 images were smaller than 48 px on the shorter side and padded with black to 48x48; " \
           "pass --upscale to enlarge them instead" in r.output
    r = run("build", "folder", index_tree / "train", "--out", tmp_path / "p", "--size", 48, "--resize", "center-crop",
            "--upscale", "--overwrite", "-j", 1)
    assert "train: 6 of 18 images were smaller than 48 px and enlarged to it (--upscale)" in r.output and "padded" not in r.output


# -- a flat val folder labelled by a Kaggle-style CSV -------------------------------------------------------
# ImageId -> the wnid of its first box, in no sorted order; the second box of another class must not count
_VAL = {"ILSVRC2012_val_00000001": "n00000002", "ILSVRC2012_val_00000002": "n00000000", "ILSVRC2012_val_00000003": "n00000001",
        "ILSVRC2012_val_00000004": "n00000002", "ILSVRC2012_val_00000005": "n00000000"}


def _kaggle_tree(root):
    """Kaggle's layout: ILSVRC/Data/CLS-LOC/{train/<wnid>/, val/*.JPEG}; val image n (in _VAL's order) is an
    index image of 100 + n, and one more val image has no row in the CSV. Gives SRC."""
    from PIL import Image

    from dataprep.synthetic import index_image, write_tree

    src = write_tree(root / "ILSVRC" / "Data" / "CLS-LOC", classes=3, per_class=2, sizes=((16, 16),), kind="index", ext=".png")
    (src / "val").mkdir()
    for n, image_id in enumerate([*_VAL, "ILSVRC2012_val_00000099"]):
        Image.fromarray(index_image(100 + n, 20, 24)).save(src / "val" / f"{image_id}.JPEG", quality=95)
    return src


def _solution_csv(path, table):
    others = {"n00000000": "n00000001", "n00000001": "n00000002", "n00000002": "n00000000"}
    path.write_text("ImageId,PredictionString\n" + "".join(f"{k},{w} 1 2 3 4 {others[w]} 5 6 7 8\n" for k, w in table.items()))
    return path


def _check_val_labels(pack):
    from dataprep.images.dataset import InMemoryImageDataset
    from dataprep.synthetic import decode_index

    ds = InMemoryImageDataset(pack, "val", as_numpy=True)
    assert len(ds) == len(_VAL) and ds.classes == ["n00000000", "n00000001", "n00000002"]
    order = list(_VAL)
    for i in range(len(ds)):
        image_id = ds.sources[i].split("/")[-1].rsplit(".", 1)[0]
        assert int(ds.labels[i]) == ds.classes.index(_VAL[image_id]), ds.sources[i]
        assert decode_index(ds[i][0]) == 100 + order.index(image_id), ds.sources[i]  # the label sits with its image


@pytest.mark.parametrize("where", ["beside SRC", "--val-labels"])
def test_build_imagenet_labels_a_flat_val_from_a_kaggle_csv(tmp_path, where):
    """`dataprep build imagenet` end to end: with LOC_val_solution.csv beside SRC (in its parent) it is found;
    three levels up (Kaggle's layout) it must be named with --val-labels, which wins over a file beside SRC.
    Every val sample's label is its row's first wnid, and sits with its own image."""
    src = _kaggle_tree(tmp_path)
    args = ["build", "imagenet", src, "--out", tmp_path / "p", "--size", 16, "--mode", "raw", "-j", 1, "--no-progress"]
    if where == "beside SRC":
        csv = _solution_csv(src.parent / "LOC_val_solution.csv", _VAL)
    else:
        csv = _solution_csv(tmp_path / "LOC_val_solution.csv", _VAL)
        r = run(*args)
        assert r.exit_code == 1 and "pass --val-labels" in r.output, r.output
        _solution_csv(src.parent / "LOC_val_solution.csv", dict.fromkeys(_VAL, "n00000001"))  # a decoy beside SRC
        args += ["--val-labels", csv]
    r = run(*args)
    assert r.exit_code == 0, r.output
    assert f"val labels: {csv}" in r.output and "val: 5 of 6 images written" in r.output and "skipped: 1 no label" in r.output, r.output
    assert read_manifest(tmp_path / "p")["source"]["val_labels"] == str(csv.resolve())
    _check_val_labels(tmp_path / "p")


def test_audit_json_help_names_every_key_a_report_row_can_have():
    """`dataprep audit --json`'s help lists the report's keys and those of a pair row, a mirror pair's "flip"
    (found with --flips) among them: the keys here are read off a report that has one."""
    import numpy as np

    from dataprep.audit import Samples, audit
    from dataprep.cli.audit import audit as command

    hashes = np.array([0x0F0F0F0F0F0F0F0F, 0xFFFF0000FFFF0000], np.uint64)
    flipped = np.array([0x1234567812345678, 0x0F0F0F0F0F0F0F0F], np.uint64)  # b mirrored is a
    report = audit(Samples.from_splits({"train": {"hashes": hashes, "sources": ["a.jpg", "b.jpg"], "flipped": flipped}}), flips=True)
    assert report["pairs"] and report["pairs"][0].get("flip") is True
    help_text = next(p.help for p in command.params if p.name == "as_json")
    missing = [k for k in [*report, *report["pairs"][0]] if f'"{k}"' not in help_text]
    assert not missing, f"--json's help leaves out {missing}: {help_text}"


# -- info --context: a token pack's packing plan --------------------------------------------------------
@pytest.fixture(scope="module")
def paragraphs_pack(tmp_path_factory):
    """A token pack of 240 paragraphs of 3 to 160 words (many past a 64-token row), train and val, in
    shards of about 2,000 tokens (cut where a 4 KiB chunk of text ends); and its copies as HDF5 and Zarr."""
    import numpy as np

    from dataprep.tokens.tokenize import TokenizeSettings, tokenize

    base = tmp_path_factory.mktemp("paragraphs")
    rng = np.random.default_rng(3)
    words = [f"w{j}" for j in range(200)]
    (base / "docs.txt").write_text("\n\n".join(" ".join(rng.choice(words, int(n))) for n in rng.integers(3, 160, 240)))
    tokenize([str(base / "docs.txt")], base / "p", TokenizeSettings(split="paragraph", val_fraction=0.2,
                                                                    shard_tokens=2000, chunk_bytes=4096),
             train_bpe_vocab=400)
    for fmt, name in (("hdf5", "p.h5"), ("zarr", "p.zarr")):
        assert run("convert", base / "p", "--to", fmt, "--out", base / name).exit_code == 0
    return base


@pytest.mark.parametrize("packing", ["best_fit", "first_fit", "concat"])
@pytest.mark.parametrize("name", ["p", "p.h5", "p.zarr"])
def test_info_context_gives_the_plan_packed_documents_serves(paragraphs_pack, name, packing):
    """Each split's rows, padding and documents cut, read from the document offsets alone, are what
    PackedDocuments plans for the split (seed 0, epoch 0), on every backend, in the text and in --json."""
    from dataprep import PackedDocuments

    pack = paragraphs_pack / name
    m = read_manifest(pack)
    assert len(m["splits"]["train"]["shards"]) > 1 and m["splits"]["val"]["count"] > 0
    r = run("info", pack, "--context", 64, "--packing", packing, "--json")
    assert r.exit_code == 0, r.output
    got = json.loads(r.output)
    assert got["splits"] == m["splits"] and got["packed_rows"]["context"] == 64 and got["packed_rows"]["packing"] == packing
    text = run("info", pack, "--context", 64, "--packing", packing)
    assert text.exit_code == 0 and f"packed:    rows of 64 tokens by {packing}" in text.output, text.output
    for split in ("train", "val"):
        want = PackedDocuments(paragraphs_pack / "p", 64, packing=packing, split=split).info()
        figures = got["packed_rows"]["splits"][split]
        assert {k: figures[k] for k in ("documents", "rows", "tokens", "padding_share", "documents_cut")} == \
            {k: want[k] for k in ("documents", "rows", "tokens", "padding_share", "documents_cut")}
        assert figures["padding"] == want["rows"] * 64 - want["tokens"] and figures["documents_cut"] > 0
        cut = want["documents_cut"]
        assert (f"  {split}: {want['documents']:,} documents in {want['rows']:,} rows, padding "
                f"{100 * want['padding_share']:.3f} % ({figures['padding']:,} tokens), {cut:,} documents cut") in text.output


def test_info_without_context_prints_no_plan_and_best_fit_is_the_default(paragraphs_pack):
    r = run("info", paragraphs_pack / "p")
    assert r.exit_code == 0 and "packed" not in r.output
    assert "packed_rows" not in json.loads(run("info", paragraphs_pack / "p", "--json").output)
    r = run("info", paragraphs_pack / "p", "--context", 64)
    assert r.exit_code == 0 and "rows of 64 tokens by best_fit" in r.output


def test_info_context_on_what_is_not_a_local_token_pack_is_a_clear_error(paragraphs_pack, index_tree, tmp_path):
    assert run("build", "folder", index_tree / "train", "--out", tmp_path / "img", "--size", 16, "-j", 1).exit_code == 0
    r = run("info", tmp_path / "img", "--context", 64)
    assert r.exit_code == 2 and f"--context: {tmp_path / 'img'} is a pack of images; rows of tokens are packed from a " \
                                "token pack's documents" in r.output, r.output
    r = run("info", paragraphs_pack / "p", "--packing", "concat")
    assert r.exit_code == 2 and "--packing says how --context's rows are packed: give --context too" in r.output
    r = run("info", paragraphs_pack / "p", "--context", 1)
    assert r.exit_code == 2 and "--context" in r.output
    url = (paragraphs_pack / "p").as_uri()
    r = run("info", url, "--context", 64)
    assert r.exit_code == 1 and f"--context: {url} is at a URL; the plan is made from a local pack's document offsets" in r.output, r.output
