"""dataprep bench: every path measured with a positive rate and a named bound, a valid PNG, and a slowed
decoder reported as decode-bound; the workload training runs (a RandomResizedCrop and flip through the
Loader, region-decoded by the default decode) timed and named with the pick, which never prefers a
decode the run did not measure faster on it. The --profile switch writes a readable profile."""
import json
import pstats
import re
import time

import cv2
import numpy as np
import pytest
from click.testing import CliRunner

from dataprep.bench.sweep import Run, overall_pick, run_bench
from dataprep.bench.workload import jpeg_paths
from dataprep.cli import main
from dataprep.images import batches
from dataprep.images import codec as decoders
from dataprep.images.build import build_images
from dataprep.images.settings import ImageSettings
from dataprep.settings import BuildSettings
from dataprep.sources import scan_imagenet
from dataprep.synthetic import write_tree

from .conftest import corpus_dir

# "unknown": every limit measured was below the best rate (a loaded machine); the rate is then its own limit
BOUNDS = {"decode-bound", "gather-bound", "memory-bandwidth-bound", "I/O-bound", "worker-starved", "loader overhead", "unknown"}


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def check_outputs(out, paths):
    rep = json.loads((out / "bench.json").read_text())
    assert set(rep["verdicts"]) == set(paths)
    for p in paths:
        runs = [r for r in rep["runs"] if r["path"] == p]
        assert runs and all(r["samples_s"] > 0 and r["pss_bytes"] > 0 for r in runs)
        v = rep["verdicts"][p]
        assert v["bound"] in BOUNDS and v["limit_samples_s"] > 0
        assert v["best_samples_s"] <= v["limit_samples_s"] and v["fraction_of_limit"] <= 1.0  # a bound is never beaten
    img = cv2.imread(str(out / "bench.png"))
    assert img is not None and img.shape == (560, 900, 3)
    return rep


@pytest.mark.corpus
@pytest.mark.slow
def test_quick_bench_on_the_corpus_pack(tmp_path):
    r = cli("build", "imagenet", corpus_dir("images"), "--size", "256", "--out", tmp_path / "p", "-j", "2")
    assert r.exit_code == 0
    r = cli("bench", tmp_path / "p", "--quick", "--out", tmp_path / "b")
    assert r.exit_code == 0, r.output
    rep = check_outputs(tmp_path / "b", ["fast", "pil"])  # whole images: "accurate" serves what "fast" does
    # which bound it names depends on the machine's load at the time: the printed verdict must be the measured one
    for path in ("fast", "pil"):
        assert f": {rep['verdicts'][path]['bound']}. Use" in r.output


def test_bench_of_a_decoded_pack(index_tree, tmp_path):
    build_images(scan_imagenet(index_tree), tmp_path / "p", BuildSettings(), ImageSettings(size=32, resize="center-crop", mode="raw"))
    r = cli("bench", tmp_path / "p", "--workers", "0,1", "--batch-sizes", "8", "--seconds", "0.3", "--out", tmp_path / "b")
    assert r.exit_code == 0, r.output
    rep = check_outputs(tmp_path / "b", ["pixels"])
    from dataprep.pack.convert import convert

    convert(tmp_path / "p", tmp_path / "p.h5", "hdf5")
    r = cli("bench", tmp_path / "p.h5", "--workers", "0", "--batch-sizes", "8", "--seconds", "0.3", "--out", tmp_path / "h")
    assert r.exit_code == 0, r.output
    h5 = check_outputs(tmp_path / "h", ["pixels"])
    assert h5["limits"]["read_mb_s"] > 0  # the one .h5 file is what is read
    assert h5["limits"]["stored_bytes_per_sample"] >= 0.9 * rep["limits"]["stored_bytes_per_sample"]


def test_a_slowed_decoder_is_reported_decode_bound(index_tree, tmp_path, monkeypatch):
    def slow(buf, channels):
        time.sleep(0.01)  # ~100 images/s per core, far below anything else on the path
        return decoders.decode_cv2(buf, channels)

    monkeypatch.setitem(decoders.DECODERS, "slow", slow)
    build_images(scan_imagenet(index_tree), tmp_path / "p", BuildSettings(), ImageSettings(size=32, resize="center-crop"))
    rep = run_bench(tmp_path / "p", workers=[0, 1, 2], batches=[8], paths=["slow"], seconds=0.6, warmup=0.2)
    v = rep.verdicts["slow"]
    assert v["bound"] == "decode-bound", v
    # Not a timing guess: a verdict never reports above 100% of its bound (a limit the Loader beat within noise is
    # taken as the rate), and "decode-bound" means at least 60% of it (below, it is worker-starved or overhead).
    # What keeps this from depending on the machine's load is the 10 ms sleep: it dominates every other cost on
    # the path, so 2 workers reach ~95% of 2 x the one-core decode rate (measured 0.95 at load average 2;
    # 0.84-0.92 with the 4 ms sleep this test had before).
    assert 0.6 <= v["fraction_of_limit"] <= 1.0, v


def test_profile_switch_writes_a_readable_profile(index_tree, tmp_path):
    prof = tmp_path / "build.prof"
    r = cli("build", "imagenet", index_tree, "--size", "16", "--out", tmp_path / "p", "-j", "1", "--profile", prof)
    assert r.exit_code == 0, r.output
    stats = pstats.Stats(str(prof))
    assert any("build_images" in fn for (_, _, fn) in stats.stats)


# -- the workload training runs ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def jpeg_pack(tmp_path_factory):
    """A variable-size JPEG pack (96 px on the shorter side), whose RandomResizedCrop batches region-decode."""
    base = tmp_path_factory.mktemp("bench_jpeg")
    tree = write_tree(base / "src", classes=2, per_class=6, sizes=((120, 160), (160, 128), (140, 140)))
    build_images(scan_imagenet(tree), base / "p", BuildSettings(), ImageSettings(size=96))
    return base / "p"


def runs_of(rep, path):
    return [r for r in rep["runs"] if r["path"] == path]


def test_bench_times_the_loaders_random_resized_crop_and_flip_and_names_the_workload(jpeg_pack, tmp_path):
    r = cli("bench", jpeg_pack, "--crop", "rrc:64", "--flip", "--paths", "fast,accurate", "--workers", "0,1",
            "--batch-sizes", "4", "--seconds", "0.2", "--out", tmp_path / "b")
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "b" / "bench.json").read_text())
    want = {"crop": "RandomResizedCrop(64)", "flip": True, "resolution": 96, "resize": "shorter", "default_decode": "fast"}
    assert {k: rep["workload"][k] for k in want} == want
    pick = rep["pick"]
    assert {k: pick["workload"][k] for k in want} == want and pick["workload"]["decode"] == pick["path"]
    assert pick["loader"] == f"Loader(num_workers={pick['workers']}, batch_size=4, crop=dataprep.RandomResizedCrop(64), flip=True)"
    # the crops went through the Loader's crop path, workers' counts included: "fast" decoded every one of them fast,
    # most as regions (a box near the whole image decodes whole), "accurate" none (as a whole-image decode would not)
    for path, fast in (("fast", True), ("accurate", False)):
        for run in runs_of(rep, path):
            counts = run["decode_paths"]
            assert sum(counts.values()) >= 4, run
            assert all(k.startswith(("region ", "fast ")) == fast for k in counts), (path, counts)
            region = sum(v for k, v in counts.items() if k.startswith("region "))
            assert (region > sum(counts.values()) / 2) == fast, (path, counts)
    # each path's limit is its own decode and crop on one core, not a whole-image decode
    assert rep["limits"]["fill_fast_samples_s"] > 0 and rep["limits"]["fill_accurate_samples_s"] > 0
    assert not any(k.startswith("decode_") for k in rep["limits"])
    assert f"pick: {pick['path']} with {pick['loader']}, " in r.output
    assert f"  for RandomResizedCrop(64) + flip of the 96 px images (resize='shorter'), decode={pick['path']!r}" in r.output
    assert re.search(r"^  fast: region ", r.output, re.M), r.output  # the table says how the crops were decoded


def test_paths_fast_is_accepted_with_a_crop_and_json_names_the_workload(jpeg_pack, tmp_path):
    r = cli("bench", jpeg_pack, "--crop", "rrc:64", "--paths", "fast", "--workers", "0", "--batch-sizes", "4",
            "--seconds", "0.2", "--json", "--out", tmp_path / "b")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)  # only JSON on stdout
    assert rep["paths"] == ["fast"] and rep["pick"]["path"] == "fast"
    assert rep["pick"]["workload"] == {"crop": "RandomResizedCrop(64)", "flip": False, "resolution": 96, "resize": "shorter",
                                       "crop_chosen_by_bench": False, "decode": "fast", "default_decode": "fast"}
    assert rep == json.loads((tmp_path / "b" / "bench.json").read_text())
    r = cli("bench", jpeg_pack, "--crop", "center:64", "--paths", "fast", "--workers", "0", "--batch-sizes", "4",
            "--seconds", "0.2", "--json", "--out", tmp_path / "c")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["workload"]["crop"] == "CenterCrop(64)" and rep["pick"]["loader"].endswith("crop=dataprep.CenterCrop(64))")
    assert all(not k.startswith(("region ", "fast ")) for run in rep["runs"] for k in run["decode_paths"])  # evaluation: accurate
    r = cli("bench", jpeg_pack, "--crop", "rrc:sixty", "--out", tmp_path / "d")
    assert r.exit_code == 2 and "--crop 'rrc:sixty'" in r.output


def test_the_paths_that_serve_a_workload_differently_are_timed_by_default():
    # training crops: "fast" region-decodes, "accurate" (alias "cv2") decodes whole images; elsewhere both decode alike
    assert jpeg_paths("fast", True) == ["fast", "accurate", "pil"]
    assert jpeg_paths("fast", False) == ["fast", "pil"]
    assert jpeg_paths("pil", False) == ["pil", "fast"]


def setting(path, workers, windows):
    return Run(path, workers, 64, float(np.mean(windows)), 0.0, {"main": 1.0}, 1, 0.0, list(windows))


def test_the_pick_prefers_another_decode_only_when_it_beat_every_setting_of_the_default():
    faster = overall_pick([setting("fast", 0, [100, 104]), setting("fast", 2, [180, 190]), setting("accurate", 2, [230, 240])],
                          (0.1,), 2, default="fast")
    assert faster["path"] == "accurate" and faster["default"]["path"] == "fast"
    assert faster["default"]["samples_s"] == 185 and faster["default"]["speedup"] == pytest.approx(235 / 185)
    # the default's fastest window reaches the other decode's slowest: within noise, the default's best setting is kept
    close = overall_pick([setting("fast", 0, [100, 104]), setting("fast", 2, [200, 226]), setting("accurate", 1, [220, 240])],
                         (0.1,), 2, default="fast")
    assert (close["path"], close["workers"], close["confidence"]) == ("fast", 2, "within noise") and "default" not in close
    assert "within noise of the default 'fast': the default kept" in close["why"]
    # negative control: without a default to compare with, the same runs pick the other decode
    assert overall_pick([setting("fast", 2, [200, 226]), setting("accurate", 1, [220, 240])], (0.1,), 2)["path"] == "accurate"


def slowed(fn, seconds=0.004):
    def slow(*args, **kwargs):
        time.sleep(seconds)
        return fn(*args, **kwargs)

    return slow


@pytest.mark.parametrize("slow_path", ["accurate", "fast"])
def test_the_pick_follows_the_decode_that_is_faster_on_the_timed_workload(jpeg_pack, monkeypatch, slow_path):
    """A 4 ms sleep in one path's decode (far above a 96 px decode's cost) makes the other path faster on these
    crops whatever the machine's load: the pick is that path, and "accurate" is picked only against the default."""
    if slow_path == "accurate":  # whole images, and reduced ones (DCT scaling), decoded accurately
        monkeypatch.setitem(decoders.DECODERS, "accurate", slowed(decoders.decode_cv2))
        monkeypatch.setattr(batches, "decode_cv2_reduced", slowed(decoders.decode_cv2_reduced))
    else:
        monkeypatch.setattr(batches, "decode_fast", slowed(decoders.decode_fast))
    from dataprep.images.crops import RandomResizedCrop

    rep = run_bench(jpeg_pack, workers=[0], batches=[4], paths=["fast", "accurate"], seconds=0.3, warmup=0.1,
                    crop=RandomResizedCrop(64), flip=True)
    other = "fast" if slow_path == "accurate" else "accurate"
    assert rep.pick["path"] == other, rep.pick
    assert rep.pick["workload"]["crop"] == "RandomResizedCrop(64)" and rep.pick["workload"]["decode"] == other
    if other == "accurate":
        assert rep.pick["default"]["path"] == "fast" and rep.pick["default"]["speedup"] > 1
    else:
        assert "default" not in rep.pick
