"""The examples run as a user runs them (a fresh process, examples/prepare.py first on a fresh directory,
then the training script on the pack it made, on the CPU), print their figures, and resume exactly: a run
stopped mid-epoch and resumed in a new process trains on the same batches, in the same order, as one run
that never stopped, and ends with the same weights. And they use dataprep's public names only.

Each training example is run three times on one prepared pack: uninterrupted to step N; stopped at step K
(mid-epoch, checkpoint at the end); resumed from that checkpoint to step N with a different number of Loader
workers. `--log-batches` writes one digest per step of the batch trained on.
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import dataprep

ROOT = Path(__file__).resolve().parents[1]
slow = pytest.mark.slow  # three training processes per example, ~10-20 s each on two busy cores

# The modules an example may import besides the top-level package (whose public names are dataprep.__all__);
# synthetic: the generated sets examples/prepare.py trains on where it does not draw its own (videos).
PUBLIC_MODULES = {"build", "lightning", "gpu", "synthetic"}


def run(script: str, *args, rc: int = 0) -> str:
    """Run examples/<script> in a fresh interpreter; return its output (stdout and stderr), its exit code asserted."""
    cmd = [sys.executable, str(ROOT / "examples" / script), *map(str, args)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == rc, f"{' '.join(cmd)} exited {done.returncode}:\n{out}"
    return out


# -- public names only -------------------------------------------------------------------------------
def private_uses(path: Path) -> list[str]:
    """What a file reaches of dataprep beyond its public names: `import dataprep.X` or `from dataprep.X import`
    with X not a public module, `from dataprep import name` or `dataprep.name` with name not public (nor a
    public module), as 'line: what' strings."""
    public = set(dataprep.__all__) | PUBLIC_MODULES
    tree = ast.parse(path.read_text(), str(path))
    aliases = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.Import)
               for a in node.names if a.name == "dataprep"}
    wrong = []
    for node in ast.walk(tree):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            modules = [node.module or ""]
            if node.module == "dataprep":
                wrong += [f"{node.lineno}: from dataprep import {a.name}" for a in node.names
                          if a.name not in public or (a.name.startswith("_") and not a.name.endswith("__"))]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            if node.attr not in public:
                wrong.append(f"{node.lineno}: dataprep.{node.attr}")
        wrong += [f"{node.lineno}: {m}" for m in modules if m.startswith("dataprep.") and m.split(".", 1)[1] not in PUBLIC_MODULES]
    return sorted(wrong, key=lambda w: int(w.split(":")[0]))


EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_the_examples_use_public_names_only(path):
    assert private_uses(path) == [], f"{path.name} uses what is not dataprep's public API"


def test_the_public_names_check_catches_internals(tmp_path):
    src = tmp_path / "x.py"
    src.write_text("import dataprep as dp\nimport dataprep.pack.backends\nfrom dataprep.sources import scan_imagenet\n"
                   "from dataprep import Loader, _LAZY\nfrom dataprep.build import imagenet\nimport dataprep.lightning\n"
                   "dp.Loader, dp.images, dp.build\n")
    assert private_uses(src) == ["2: dataprep.pack.backends", "3: dataprep.sources", "4: from dataprep import _LAZY",
                                 "7: dataprep.images"]


def test_a_training_example_without_a_pack_says_to_prepare_one(tmp_path):
    out = run("train_gpt.py", tmp_path / "nothing", "--device", "cpu", rc=1)
    assert f"{tmp_path / 'nothing'}: no pack there; make one first: python examples/prepare.py text DIR --out" in out, out


def three_runs(script: str, base: Path, common: list, total: int, stop: int) -> dict:
    """Uninterrupted to `total`; stopped at `stop`; resumed to `total`: their outputs, batch logs, final models."""
    out = {}
    out["full"] = run(script, *common, "--steps", total, "--workers", 2, "--checkpoint", base / "full.pt",
                      "--log-batches", base / "full.log")
    out["stopped"] = run(script, *common, "--steps", stop, "--workers", 2, "--checkpoint", base / "part.pt",
                         "--checkpoint-every", 2, "--log-batches", base / "stopped.log")
    out["resumed"] = run(script, *common, "--steps", total, "--workers", 0, "--checkpoint", base / "part.pt",
                         "--resume", "--log-batches", base / "resumed.log")
    for name in ("full", "stopped", "resumed"):
        out[f"{name}.log"] = (base / f"{name}.log").read_text().splitlines()
    out["part"] = base / "part.pt"
    out["models"] = [torch.load(base / f, weights_only=True)["model"] for f in ("full.pt", "part.pt")]
    return out


def check_resume(runs: dict, total: int, stop: int) -> None:
    full, stopped, resumed = runs["full.log"], runs["stopped.log"], runs["resumed.log"]
    assert [int(line.split()[0]) for line in full] == list(range(1, total + 1))
    assert stopped == full[:stop]
    assert resumed == full[stop:]  # the rest of the interrupted epoch, then the next ones: the same batches
    assert len(set(full)) == total  # the digests do tell batches apart


def check_weights(runs: dict) -> None:
    # Exactly equal: the same batches through the same CPU kernels with the same thread count, the optimizer's
    # momentum restored from the checkpoint, the learning rate a function of the step. (On a GPU, or with a
    # different thread count, reductions may be ordered differently: there expect allclose, not equality.)
    full, resumed = runs["models"]
    assert full.keys() == resumed.keys()
    for k in full:
        assert torch.equal(full[k], resumed[k]), k


# -- the classifier ----------------------------------------------------------------------------------
# 64 train images, batch 16: 4 steps an epoch. Stopped at step 3 (mid-epoch 0, at the progressive schedule's
# 24 px), resumed to step 10: the rest of epoch 0, epoch 1 at 32 px, half of epoch 2.
CLS_TOTAL, CLS_STOP = 10, 3


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    base = tmp_path_factory.mktemp("classifier")
    prepared = run("prepare.py", "images", base / "src", "--out", base / "pack", "--size", 32, "--images", 64)
    common = [base / "pack", "--size", 32, "--batch-size", 16, "--epochs", 3, "--progressive", "--log-every", 2, "--device", "cpu"]
    return {"prepared": prepared, **three_runs("train_classifier.py", base, common, CLS_TOTAL, CLS_STOP)}


@slow
def test_classifier_prints_its_figures(classifier):
    assert "train: 64 of 64 images written" in classifier["prepared"], classifier["prepared"]
    assert "val: 16 of 16 images written" in classifier["prepared"], classifier["prepared"]
    out = classifier["full"]
    assert "64 train images, 8 classes, 4 steps an epoch of 16" in out
    assert re.search(r"data path [\d,]+ img/s, whole step [\d,]+ img/s: (data|compute)-bound \(waiting for data [\d.]+% of the step\)", out)
    assert re.search(r"^done: 10 steps; data path [\d,]+ img/s, whole step [\d,]+ img/s: (data|compute)-bound", out, re.M)
    assert len(re.findall(r"^epoch \d: val accuracy \d+\.\d% \(16 images at 32 px\)", out, re.M)) == 3
    assert len(re.findall(r"^epoch \d: Loader.stats\(\): (data|compute)-bound: waits \d+% of the time for data", out, re.M)) == 3
    # --progressive says each epoch's crop size (0.75 x 32 = 24 px, reaching 32 px two epochs before the end)
    assert re.findall(r"^epoch (\d): crops of (\d+) px", out, re.M) == [("0", "24"), ("1", "32"), ("2", "32")], out


@slow
def test_classifier_resumes_mid_epoch_on_the_same_batches(classifier):
    assert "checkpoint:" in classifier["stopped"] and "(step 2)" in classifier["stopped"]
    assert f"step {CLS_STOP}, epoch 0, {CLS_STOP * 16} samples of it already trained on" in classifier["resumed"]
    check_resume(classifier, CLS_TOTAL, CLS_STOP)
    # the schedule: epoch 0 served at 24 px, the later epochs at 32 px (the digest covers the shape)
    assert classifier["full.log"][0] != classifier["full.log"][4]


@slow
def test_classifier_resumed_weights_equal_uninterrupted(classifier):
    check_weights(classifier)


# -- the video classifier ----------------------------------------------------------------------------
# 8 videos of 8 frames at 32 px (stored 40 px), batch 4: 2 steps an epoch. Stopped at step 3 (mid-epoch 1),
# resumed to step 6 with 0 workers instead of 2: the rest of epoch 1, then epoch 2.
VID_TOTAL, VID_STOP = 6, 3


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    pytest.importorskip("av", reason="needs the video extra (pip install 'dataprep[video]')")
    base = tmp_path_factory.mktemp("video")
    prepared = run("prepare.py", "videos", base / "src", "--out", base / "pack", "--size", 32, "--videos", 8, "--frames", 8,
                   "--workers", 1)
    common = [base / "pack", "--size", 32, "--frames", 4, "--batch-size", 4, "--epochs", 3, "--log-every", 2, "--device", "cpu"]
    return {"prepared": prepared, **three_runs("train_video.py", base, common, VID_TOTAL, VID_STOP)}


def test_video_classifier_trains_on_clips_and_resumes_mid_epoch_with_the_same_weights(video):
    assert "train: 8 of 8 videos written" in video["prepared"] and "train: 64 frames stored" in video["prepared"], video["prepared"]
    out = video["full"]
    assert "8 train clips (8 videos), 2 classes, 2 steps an epoch of 4 clips of 4 frames" in out, out
    assert len(re.findall(r"^epoch \d step \d  loss \d+\.\d{4}$", out, re.M)) == 3, out  # steps 2, 4, 6
    assert len(re.findall(r"^epoch \d: val accuracy \d+\.\d% \(2 clips at 32 px\)$", out, re.M)) == 3, out
    assert "(step 2)" in video["stopped"] and f"(step {VID_STOP})" in video["stopped"]
    assert f"step {VID_STOP}, epoch 1, 4 samples of it already trained on" in video["resumed"], video["resumed"]
    check_resume(video, VID_TOTAL, VID_STOP)
    check_weights(video)


# -- the GPT -----------------------------------------------------------------------------------------
# 40 windows an epoch, batch 8: 5 steps an epoch. Stopped at step 7 (mid-epoch 1), resumed to step 12.
GPT_TOTAL, GPT_STOP = 12, 7


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    base = tmp_path_factory.mktemp("gpt")
    run("prepare.py", "text", base / "text", "--out", base / "pack", "--docs", 200)
    common = [base / "pack", "--context", 32, "--batch-size", 8, "--samples", 40, "--log-every", 4, "--device", "cpu"]
    return three_runs("train_gpt.py", base, common, GPT_TOTAL, GPT_STOP)


@slow
def test_gpt_prints_its_figures(gpt):
    out = gpt["full"]
    assert re.search(r"5 steps an epoch of 8 x 32", out)
    assert len(re.findall(r"^step \d+  loss \d+\.\d{4}  [\d,]+ tokens/s", out, re.M)) == 3  # steps 4, 8, 12
    assert re.search(r"^sample: '.+'$", out, re.M)


@slow
def test_gpt_resumes_mid_epoch_on_the_same_windows(gpt):
    assert "(step 2)" in gpt["stopped"] and "(step 6)" in gpt["stopped"] and f"(step {GPT_STOP})" in gpt["stopped"]
    assert f"resumed from {gpt['part']} at step {GPT_STOP} (epoch 1, 16 windows of it trained on)" in gpt["resumed"]
    check_resume(gpt, GPT_TOTAL, GPT_STOP)


@slow
def test_gpt_resumed_weights_equal_uninterrupted(gpt):
    check_weights(gpt)


# -- the GPT on packed rows --------------------------------------------------------------------------
# 60 documents in 44 best-fit rows of 64 tokens, batch 8: 5 steps an epoch. Stopped at step 7 (mid-epoch 1,
# whose plan deals the documents to other rows), resumed to step 12 with 0 workers instead of 2.
@pytest.fixture(scope="module")
def packed_gpt(tmp_path_factory):
    base = tmp_path_factory.mktemp("packed_gpt")
    run("prepare.py", "text", base / "text", "--out", base / "pack", "--docs", 60)
    common = [base / "pack", "--packed", "best_fit", "--context", 64, "--batch-size", 8, "--log-every", 4, "--device", "cpu"]
    return {"pack": base / "pack", **three_runs("train_gpt.py", base, common, GPT_TOTAL, GPT_STOP)}


@slow
def test_packed_gpt_prints_its_plan_and_figures(packed_gpt):
    out = packed_gpt["full"]
    assert "packed rows: 60 documents in 44 rows of 64 tokens (best_fit; padding 11.6%, 1 document cut)" in out, out
    assert re.search(r"5 steps an epoch of 8 x 64", out)
    assert len(re.findall(r"^step \d+  loss \d+\.\d{4}  [\d,]+ tokens/s", out, re.M)) == 3  # steps 4, 8, 12
    assert re.search(r"^sample: '.+'$", out, re.M)


@slow
def test_packed_gpt_resumes_mid_epoch_on_the_same_rows(packed_gpt):
    assert "(step 2)" in packed_gpt["stopped"] and f"(step {GPT_STOP})" in packed_gpt["stopped"]
    assert f"resumed from {packed_gpt['part']} at step {GPT_STOP} (epoch 1, 16 rows of it trained on)" in packed_gpt["resumed"]
    check_resume(packed_gpt, GPT_TOTAL, GPT_STOP)
    assert packed_gpt["full.log"][:5] != packed_gpt["full.log"][5:10]  # epoch 1's plan is not epoch 0's


@slow
def test_packed_gpt_resumed_weights_equal_uninterrupted(packed_gpt):
    check_weights(packed_gpt)


@slow
def test_packed_gpt_sees_each_document_as_if_alone(packed_gpt):
    """What the example feeds its model from a packed batch (its `model_inputs`: the document mask, positions
    from 0 in each segment) gives every segment's tokens the logits that segment alone gives; without the
    mask (plain causal attention, the negative control) the later segments of a row see the ones before."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_gpt", ROOT / "examples" / "train_gpt.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    ds = dataprep.PackedDocuments(packed_gpt["pack"], 64)
    torch.manual_seed(0)
    model = example.GPT(int(ds.manifest["tokenizer"]["vocab_size"]), 64).eval()
    batch = next(iter(dataprep.Loader(ds, 4)))
    ids, labels, extra = example.model_inputs(batch)
    assert torch.equal(ids, batch["input_ids"]) and torch.equal(labels, batch["labels"])
    flat, docs, cu = ids.reshape(-1), batch["document_ids"].reshape(-1), batch["cu_seqlens"].tolist()
    with torch.no_grad():
        packed, causal = (model(ids, **extra).flatten(0, 1), model(ids, positions=extra["positions"]).flatten(0, 1))
        gaps, later = [], 0
        for a, b in zip(cu, cu[1:]):  # every segment of the batch (a row's padding run too: skipped)
            if docs[a] < 0:
                continue
            alone = model(flat[a:b].unsqueeze(0))[0]
            assert torch.allclose(packed[a:b], alone, atol=1e-5), (a, b)
            gaps.append(float((causal[a:b] - alone).abs().max()))
            later += a % 64 > 0
    assert later and max(gaps) > 1e-3  # rows held several segments, and attention across them would show
