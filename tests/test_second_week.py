"""Issue 35's smaller items, each as a user meets it: pack strings compare by value, the no-EOT error
names --eot too, the Lightning example's --help says what each option does, and `dataprep bench` names
one overall pick and how sure it is."""
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dataprep.bench.sweep import Run, overall_pick, window_rates
from dataprep.cli import main
from dataprep.pack.arrays import Strings

ROOT = Path(__file__).resolve().parents[1]


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def strings(items, lead: bytes = b""):
    """Strings over a blob that may start with bytes of no item (a later shard's view of a shared blob)."""
    data = [s.encode() for s in items]
    blob = np.frombuffer(lead + b"".join(data), np.uint8)
    offs = np.cumsum([len(lead)] + [len(d) for d in data]).astype(np.int64)
    return Strings(blob, offs)


# -- ds.sources == other.sources -----------------------------------------------------------------------
def test_strings_compare_by_value_not_identity():
    a, b = strings(["x/1.jpg", "y/2.jpg"]), strings(["x/1.jpg", "y/2.jpg"], lead=b"junk")
    assert a is not b and a == b and a == ["x/1.jpg", "y/2.jpg"] and a == ("x/1.jpg", "y/2.jpg")
    assert a != strings(["x/1.jpg", "y/3.jpg"]) and a != strings(["x/1.jpg"]) and a != ["x/1.jpg", "y/3.jpg"]
    # the same bytes cut at another place are other strings: offsets matter, not only the blob
    assert strings(["ab", "c"]) != strings(["a", "bc"])
    with pytest.raises(TypeError):
        hash(a)


def test_two_builds_of_one_tree_have_equal_sources(tmp_path):
    from dataprep import InMemoryImageDataset
    from dataprep.synthetic import write_tree

    src = write_tree(tmp_path / "src", classes=2, per_class=3, sizes=((20, 24),), kind="index", ext=".png")
    for name in ("a", "b"):
        r = cli("build", "imagenet", src, "--out", tmp_path / name, "--size", 16, "--mode", "raw", "-j", 1, "--no-progress")
        assert r.exit_code == 0, r.output
    a, b = InMemoryImageDataset(tmp_path / "a"), InMemoryImageDataset(tmp_path / "b")
    assert a.sources == b.sources and list(a.sources) == list(b.sources)


# -- tokenize without an end-of-text token ---------------------------------------------------------------
def test_the_no_eot_error_suggests_eot_with_the_tokenizers_own_special_tokens(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    tok.train_from_iterator(["some text to learn from"] * 20, trainers.BpeTrainer(vocab_size=300, special_tokens=["<EOT>"]))
    tok.save(str(tmp_path / "tok.json"))
    (tmp_path / "a.txt").write_text("hello there, some text")
    r = CliRunner().invoke(main, ["tokenize", str(tmp_path / "a.txt"), "-o", str(tmp_path / "p"), "--tokenizer",
                                  str(tmp_path / "tok.json")])
    assert r.exit_code != 0
    assert "--eot '<EOT>'" in r.output and "--eot-id" in r.output and "its special tokens: <EOT>" in r.output, r.output
    # and the option it names works
    r = cli("tokenize", tmp_path / "a.txt", "-o", tmp_path / "p", "--tokenizer", tmp_path / "tok.json", "--eot", "<EOT>")
    assert r.exit_code == 0, r.output


# -- the Lightning example's --help ----------------------------------------------------------------------
def test_the_lightning_example_help_says_what_each_option_does_and_its_default():
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "lightning_classifier.py"), "--help"],
                       capture_output=True, text=True, timeout=120)
    if r.returncode and "No module named" in r.stderr:
        pytest.skip(f"the example needs what is not installed: {r.stderr.strip().splitlines()[-1]}")
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split()).split("options:")[1]
    for opt, default in (("--size", "64"), ("--batch-size", "64"), ("--workers", "2"), ("--epochs", "2"), ("--lr", "0.1"),
                         ("--checkpoint-every", "100")):
        # the option, its metavar, a help text (no other option inside it), its default
        assert re.search(re.escape(opt) + r" [A-Z_]+ \w(?:(?! --).)*?\(default: " + re.escape(default) + r"\)", text), (opt, text)
    assert "pack an image pack" in " ".join(r.stdout.split())


# -- dataprep bench: one pick, and how sure ----------------------------------------------------------------
def setting(workers, windows, batch=64, path="pixels"):
    return Run(path, workers, batch, float(np.mean(windows)), 0.0, {"main": 1.0}, 1, 0.0, list(windows))


def test_the_pick_is_clear_only_when_its_slowest_window_beats_every_other_fastest():
    clear = overall_pick([setting(0, [100, 110, 105]), setting(1, [200, 205, 210]), setting(2, [150, 160, 170])], (0.1,), 2)
    assert (clear["workers"], clear["confidence"], clear["ties"]) == (1, "clear", [])
    close = overall_pick([setting(1, [200, 190, 215]), setting(2, [195, 210, 220]), setting(0, [100, 101, 99])], (0.1,), 2)
    assert close["workers"] == 2 and close["confidence"] == "within noise"
    assert close["ties"] == ["pixels workers=1 batch=64"], close
    busy = overall_pick([setting(1, [200, 205]), setting(0, [100, 101])], (3.5,), 2)
    assert busy["confidence"] == "clear" and busy["busy"] and "rerun on a quiet machine" in busy["why"]


def test_window_rates_split_the_timed_run_into_parts():
    marks = [(0.1 * k, 10 * k) for k in range(1, 11)]  # 100 samples/s throughout
    rates = window_rates(marks)
    assert len(rates) == 5 and np.allclose(rates, 100)
    marks = [(0.1, 10), (0.2, 20), (1.0, 30)]  # a stall at the end
    rates = window_rates(marks)
    assert max(rates) == pytest.approx(100) and min(rates) < 20


def test_bench_prints_and_saves_its_pick(tmp_path):
    from dataprep.synthetic import write_tree

    src = write_tree(tmp_path / "src", classes=2, per_class=8, sizes=((20, 24),), kind="index", ext=".png")
    r = cli("build", "imagenet", src, "--out", tmp_path / "p", "--size", 16, "--mode", "raw", "-j", 1, "--no-progress")
    assert r.exit_code == 0, r.output
    r = cli("bench", tmp_path / "p", "--workers", "0,1", "--batch-sizes", "8", "--seconds", "0.3", "--out", tmp_path / "b")
    assert r.exit_code == 0, r.output
    assert re.search(r"^pick: pixels with Loader\(num_workers=[01], batch_size=8\), [\d,]+ samples/s; (clear|within noise): ",
                     r.output, re.M), r.output
    pick = json.loads((tmp_path / "b" / "bench.json").read_text())["pick"]
    assert pick["confidence"] in ("clear", "within noise") and pick["workers"] in (0, 1)
