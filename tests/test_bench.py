"""dataprep bench: every path measured with a positive rate and a named bound, a valid PNG, and a slowed
decoder reported as decode-bound. The --profile switch writes a readable profile."""
import json
import pstats
import time

import cv2
import pytest
from click.testing import CliRunner

from dataprep.bench.sweep import run_bench
from dataprep.cli import main
from dataprep.images import codec as decoders
from dataprep.images.build import build_images
from dataprep.images.settings import ImageSettings
from dataprep.settings import BuildSettings
from dataprep.sources import scan_imagenet

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
    rep = check_outputs(tmp_path / "b", ["cv2", "pil"])
    # which bound it names depends on the machine's load at the time: the printed verdict must be the measured one
    for path in ("cv2", "pil"):
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
