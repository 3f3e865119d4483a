"""A SIGKILLed trainer: its Loader workers go quietly (no traceback in the shared log), and what it had
already logged is on disk (`examples/train_classifier.py --log-batches` flushes every line)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dataprep.images.build import build_images
from dataprep.images.settings import ImageSettings
from dataprep.settings import BuildSettings
from dataprep.sources import scan_imagenet

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Loader workers fork (Linux only)")

CHILD = textwrap.dedent("""
    import sys, time
    from dataprep.images.dataset import InMemoryImageDataset
    from dataprep.serve.loader import Loader

    loader = Loader(InMemoryImageDataset(sys.argv[1]), 2, num_workers=2, prefetch=4)
    it = iter(loader)
    next(it)
    print(" ".join(str(p.pid) for p in loader._procs), flush=True)
    print("ready", flush=True)
    time.sleep(300)  # holding the rest of the epoch: the workers have sent batches nobody reads
""")


def wait_for(predicate, timeout: float, proc: subprocess.Popen | None = None) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        if proc is not None and proc.poll() is not None:
            return predicate()
        time.sleep(0.05)
    return False


def alive(pid: int) -> bool:
    """pid is running (a zombie of a dead parent is reaped by init soon enough and counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)


def test_workers_of_a_sigkilled_trainer_exit_quietly(index_tree, tmp_path):
    pack = tmp_path / "pack"
    build_images(scan_imagenet(index_tree), pack, BuildSettings(shard_size=5), ImageSettings(size=32, mode="raw", resize="center-crop"))
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with open(out, "w") as o, open(err, "w") as e:  # the workers inherit the child's stderr: this file
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(pack)], cwd=ROOT, stdout=o, stderr=e)
    workers: list[int] = []
    try:
        assert wait_for(lambda: "ready" in out.read_text(), 60, child), f"child never got a batch:\n{err.read_text()}"
        workers = [int(p) for p in out.read_text().split()[:-1]]
        assert len(workers) == 2
        time.sleep(0.5)  # let the workers finish their prefetched batches and block on the pipe
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        assert wait_for(lambda: not any(map(alive, workers)), 5), "a worker outlived its SIGKILLed parent"
        time.sleep(0.2)  # their last words, if any, reach the file
        log = err.read_text()
        assert "Traceback" not in log and "ConnectionResetError" not in log and "BrokenPipeError" not in log, log
    finally:
        kill(child)
        for pid in workers:  # only on failure: ours, started by the child we started
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_train_classifier_batch_log_survives_sigkill(tmp_path):
    script = ROOT / "examples" / "train_classifier.py"
    if not script.exists():
        pytest.skip(f"no {script}")
    log, out = tmp_path / "batches.log", tmp_path / "stdout"
    prepare = [sys.executable, str(ROOT / "examples" / "prepare.py"), "images", tmp_path / "src", "--out", tmp_path / "pack",
               "--images", 32, "--size", 16]
    subprocess.run(list(map(str, prepare)), cwd=ROOT, check=True, capture_output=True, timeout=300)
    cmd = [sys.executable, str(script), tmp_path / "pack", "--size", 16, "--batch-size", 8, "--epochs", 100, "--log-every", 1,
           "--device", "cpu", "--workers", 0, "--log-batches", log]
    with open(out, "w") as o:
        proc = subprocess.Popen(list(map(str, cmd)), cwd=ROOT, stdout=o, stderr=subprocess.STDOUT)
    try:
        # the step-2 figures are printed (and flushed) after steps 1 and 2 were written to the batch log
        ok = wait_for(lambda: "epoch 0 step 2 " in out.read_text(), 60, proc)
        assert ok, f"the example did not reach step 2:\n{out.read_text()}"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        lines = log.read_text().splitlines()
        assert len(lines) >= 2 and lines[0].split()[0] == "1", lines
    finally:
        kill(proc)
