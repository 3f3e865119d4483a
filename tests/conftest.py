"""Shared fixtures: synthetic trees made on the fly, and the real corpus in ../shared when it is there."""
from __future__ import annotations

import gc
import os
import time
from pathlib import Path

import pytest

from dataprep.synthetic import write_tree

CORPUS = Path(os.environ.get("DATAPREP_CORPUS", Path(__file__).resolve().parents[2] / "shared" / "corpus"))


def _fsync_checked(fd) -> None:
    """os.fsync in this process, as the tests see it: the descriptor is checked as fsync checks it (a closed
    or wrong one raises OSError, anything else TypeError), and nothing is forced to the disk."""
    if not isinstance(fd, int):
        if not hasattr(fd, "fileno"):
            raise TypeError("argument must be an int, or have a fileno() method.")
        fd = fd.fileno()
    os.fstat(fd)


def pytest_configure(config):
    """No cyclic garbage collection while the test modules are imported: collecting imports torch, lightning,
    dask and every test module, and the collector walked that growing heap again and again (a fifth of the
    time collection takes). pytest_collection_finish turns it back on.

    And no fsync to the disk in this process (DATAPREP_TEST_FSYNC=1 keeps it): every shard, manifest and
    file written in place is fsynced, some 30 a build, and a test cannot tell a synced file from one in the
    page cache (that takes a power cut); on a shared disk they cost over a tenth of a build-heavy file's
    time. Forked workers inherit this; a process started with a new interpreter still fsyncs."""
    gc.disable()
    if os.environ.get("DATAPREP_TEST_FSYNC") != "1":
        os.fsync = _fsync_checked


def pytest_collection_finish(session):
    """What is alive once the tests are collected (over half a million objects: modules, functions, the test
    items) lives to the end of the session: gc.freeze() takes it out of every later collection, so that a full
    one (automatic, or a test's own gc.collect()) walks only what the tests made. Reference counting still
    frees frozen objects; only cycles among them are never collected."""
    gc.enable()
    gc.collect()
    gc.freeze()


QUIET_LOAD = 1.0  # runnable tasks per core, over the last minute, up to which the machine counts as quiet
QUIET_SHARE = 0.8  # the share of a core a busy loop here must get for the machine to count as quiet


def machine_noise(sample_s: float = 0.2) -> tuple[bool, str]:
    """Whether this machine is quiet enough now for a bound on seconds to say something about the code, and
    the figures that say so: the 1-minute load average per core this process may run on, and the share of a
    core that a busy loop of `sample_s` seconds got (its CPU seconds over its wall seconds; under 1 when other
    work, a CPU quota or a host's other guests take turns with it).

    Returns:
        (quiet, the figures in words, for a skip reason or a failure message).
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    load = os.getloadavg()[0]
    wall, cpu = time.perf_counter(), time.process_time()
    while time.perf_counter() - wall < sample_s:
        sum(range(1000))
    share = (time.process_time() - cpu) / (time.perf_counter() - wall)
    quiet = load <= QUIET_LOAD * cores and share >= QUIET_SHARE
    return quiet, (f"load {load:.1f} over the last minute on {cores} cores (quiet: up to {QUIET_LOAD * cores:.0f}), "
                   f"a busy loop got {share:.0%} of a core over {sample_s} s (quiet: {QUIET_SHARE:.0%} or more)")


def quiet_machine(need: str) -> str:
    """Skips the test unless the machine is quiet enough to say `need` (what the test would conclude from its
    timing), naming the figures measured; returns them where it is quiet."""
    quiet, figures = machine_noise()
    if not quiet:
        pytest.skip(f"{need}: the machine is too busy to say ({figures})")
    return figures


def within(seconds: float, bound: float, what: str) -> None:
    """`what` took `seconds`, under `bound`: a bound on time that holds only where the machine is quiet enough
    to say. Under the bound it passes whatever the machine; over it, it fails on a quiet machine and skips on
    a busy one, with the seconds and the figures measured (a slow path and a slow machine look alike there)."""
    if seconds < bound:
        return
    figures = quiet_machine(f"{what} took {seconds:.2f} s, not under {bound:g} s")
    raise AssertionError(f"{what} took {seconds:.2f} s, not under {bound:g} s, on a quiet machine ({figures})")


def own_segments(base) -> set[str]:
    """This test session's shared-memory segments: those holding a pack under `base` (its temporary
    directory). Other runs on a shared machine have segments of their own, which are none of our business."""
    from dataprep.serve.shm import describe_segments

    return {s["path"] for s in describe_segments() if s["pack"].startswith(str(base))}


def corpus_dir(*parts: str) -> Path:
    p = CORPUS.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"needs the shared corpus at {p} (absent in a fresh clone; set DATAPREP_CORPUS to point at it)")
    return p


@pytest.fixture(scope="session")
def index_tree(tmp_path_factory) -> Path:
    """3 classes x 6 train + 2 val PNG images of mixed sizes whose flat colour encodes their index (lossless)."""
    root = tmp_path_factory.mktemp("index_tree")
    return write_tree(root, classes=3, per_class=6, val_per_class=2, sizes=((40, 60), (64, 48), (50, 50)), kind="index", ext=".png")


@pytest.fixture(scope="session")
def photo_tree(tmp_path_factory) -> Path:
    """4 classes x 8 photo-like JPEGs, 375x500 to 768x1024."""
    root = tmp_path_factory.mktemp("photo_tree")
    return write_tree(root, classes=4, per_class=8, sizes=((375, 500), (768, 1024), (480, 640)))
