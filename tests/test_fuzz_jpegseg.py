"""The compiled part fuzzed (fuzz/): the seeds and the inputs of past findings agree with the Python path,
and a short seeded libFuzzer run under AddressSanitizer and UndefinedBehaviorSanitizer finds nothing.

fuzz/agree.py is the check the fuzzer makes on every input: region() gives the Python path's bytes for
every box, and what add_restarts() gives serves what its source serves. Here it runs with the ordinary build
on every committed input, each its own test: fuzz/seeds/ (what a build meets, and damaged kinds of it) and
fuzz/regressions/ (inputs the fuzzer found). The short run is `make fuzz` for FUZZ_SECONDS=10 with a fixed
libFuzzer seed; it needs clang with its fuzzer and sanitizer runtimes and is skipped, with the reason,
where they are missing.
"""
from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys

import pytest

from dataprep.images import codec

FUZZ = pathlib.Path(__file__).resolve().parent.parent / "fuzz"
INPUTS = sorted(FUZZ.glob("seeds/*.jpg")) + sorted(FUZZ.glob("regressions/*.jpg"))
needs_c = pytest.mark.skipif(not codec.compiled(), reason="images/_jpegseg.c is not built (no C compiler at install)")


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"fuzz_{name}", FUZZ / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@needs_c
@pytest.mark.parametrize("path", INPUTS, ids=[f"{p.parent.name}/{p.stem}" for p in INPUTS])
def test_every_committed_input_agrees_with_the_python_path(path):
    load("agree").check(path.read_bytes())


@needs_c
def test_the_entry_points_free_what_they_allocate():
    """Leak reports are off in the fuzzer (the embedded Python's own objects would drown them): here the
    buffers and bytes objects the C part allocates are traced instead, over every committed input, the
    boxes at the edges and the outputs of add_restarts, and none may outlive a pass."""
    import gc
    import tracemalloc

    c = codec._jpegseg
    data = [p.read_bytes() for p in INPUTS]

    def one_pass():
        for d in data:
            for box in ((0, 8, 0, 8), (-(2**63), 2**63 - 1, -(2**63), 2**63 - 1), (3, 40, 5, 60)):
                c.region(d, *box)
            for most in (codec.RESTART_MCUS, 1, 1000):
                out = c.add_restarts(d, most)
                if out is not None:
                    c.add_restarts(out, most)
                    c.region(out, 0, 8, 0, 8)

    one_pass()
    tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(5):
            one_pass()
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 4096, grown  # a lost segment table or output buffer is lost on every input: 100s of kB


def test_the_seeds_cover_what_the_issue_names():
    """The seed set is not left to shrink: each kind the issue names has its seeds, and the regressions are kept."""
    names = {p.stem for p in INPUTS}
    for prefix in ("pil-444", "pil-422", "pil-420", "cv2-411", "cv2-440", "pil-grey", "pil-cmyk", "pil-progressive",
                   "sof1-12bit", "dri-claims", "rst-misnumbered", "dht-after-sos", "eoi-inside-scan", "cut-", "sof-huge",
                   "sof-length", "tem-before-app0"):
        assert any(n.startswith(prefix) for n in names), prefix


@needs_c
def test_the_regressions_are_the_findings_they_stand_for():
    """The controls of the test above: each finding's input still shows what was found, so that its passing
    means the C part was fixed, not that the input stopped reaching the code."""
    c = codec._jpegseg
    seeds = {p.stem: p.read_bytes() for p in INPUTS}
    # restart markers out of sequence: libjpeg resynchronises, so the source shows other pixels than its
    # coefficients in order; add_restarts keeps it as it is
    agree = load("agree")
    src = seeds["grey-rst-misnumbered"]
    fixed = seeds["cv2-grey-rst2"]
    assert agree.decoded(src) is not None and c.add_restarts(fixed, codec.RESTART_MCUS) is not None
    assert c.add_restarts(src, codec.RESTART_MCUS) is None
    # no EOI: every decoder refuses the source; a copy given markers (and an EOI) would decode
    assert agree.decoded(seeds["pack-cut-before-eoi"]) is None
    assert c.add_restarts(seeds["cut-4"], codec.RESTART_MCUS) is None and c.add_restarts(seeds["pil-420"], 4) is not None
    # a standalone marker (TEM) before APP0: jpeg_header walks past it, jpeg_layout does not
    tem = seeds["tem-before-app0"]
    assert tem[2:4] == b"\xff\x01" and codec.jpeg_header(tem) is not None
    assert c.add_restarts(tem, codec.RESTART_MCUS) is None
    assert c.add_restarts(tem[:2] + tem[4:], codec.RESTART_MCUS) is not None
    # a DC table with symbols 250 and 242: libjpeg refuses it when the scan starts; the DC rebuild's DHT replaced it
    bogus = seeds["dc-table-symbols-over-15"]
    assert agree.decoded(bogus) is None and c.add_restarts(bogus, codec.RESTART_MCUS) is None
    # a box at the edges of Py_ssize_t: the Python path cuts; C's rounding overflowed (UBSan) and gave the whole
    data = seeds["cv2-411-rst1"]
    box = (0, 2**63 - 1, -(2**63), 8)
    assert c.region(data, *box)[2] is not None
    agree.same_region(data, data, box)


@pytest.mark.slow
def test_a_short_seeded_fuzz_run_finds_nothing(tmp_path):
    run = load("run")
    why = run.missing("clang")
    if why:
        pytest.skip(why)
    if not codec.compiled():
        pytest.skip("images/_jpegseg.c is not built here: fuzz/agree.py compares it with the Python path")
    done = subprocess.run([sys.executable, str(FUZZ / "run.py"), "--seconds", "10", "--seed", "1", "--corpus",
                           str(tmp_path / "corpus")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "no sanitizer report, no disagreement" in done.stdout
    runs = int(done.stdout.split("fuzz: ")[1].split(" executions")[0])
    assert runs > 5000, done.stdout[-2000:]  # it fuzzed, beyond replaying the seeds
