"""A process that used the Loader exits by itself: each case runs as a script in a subprocess, which must end
within 20 s of its last statement, with its workers gone and no traceback but its own.

Every script but Lightning's installs a SIGTERM handler that does not exit, as a preemptible job's checkpoint
hook does: multiprocessing's exit hook SIGTERMs daemonic children and waits, so a worker that inherited the
handler and ignored the signal kept the parent waiting forever. Lightning installs such a handler inside
`fit()`, where its Loader's workers are forked.
"""
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

from .conftest import within
from .test_worker_exit import alive

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Loader workers fork (Linux only)")
DEADLINE = 20.0  # seconds from the script's last statement to its exit
TIMEOUT = 120.0  # seconds for a whole script (Lightning imports and trains for a few)

# What every script starts with: the pack, a handler that swallows SIGTERM, and `done()`, its last statement,
# which prints the moment (CLOCK_MONOTONIC is one clock for every process) and the workers' pids.
PRELUDE = """
import os, signal, sys, time
import dataprep
from dataprep.images.dataset import InMemoryImageDataset
PACK = sys.argv[1]
if os.environ.get("OWN_SIGTERM") == "1":
    signal.signal(signal.SIGTERM, lambda s, f: print("SIGTERM swallowed", flush=True))

SEEN = set()  # worker pids seen while training (a Lightning run closes its loaders before done())

def children():
    # this process's children now (the Loader's workers); a thread may end between listing and reading
    tasks, out = f"/proc/{os.getpid()}/task", set()
    for t in os.listdir(tasks):
        try:
            out |= {int(c) for c in open(f"{tasks}/{t}/children").read().split()}
        except FileNotFoundError:
            pass
    return out

def done(*loaders):
    pids = {p.pid for L in loaders for p in getattr(L, "_procs", [])} | SEEN | children()
    print("WORKERS", *sorted(pids), flush=True)
    print("LAST", time.monotonic(), flush=True)
"""

LIGHTNING = """
import torch
import lightning.pytorch as pl

class Model(pl.LightningModule):
    def __init__(self, loader=None):
        super().__init__()
        self.layer, self.loader = torch.nn.Linear(3, 3), loader
    def training_step(self, batch, i):
        SEEN.update(children())
        x, y = batch
        return torch.nn.functional.cross_entropy(self.layer(x.float().mean((2, 3))), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

def trainer():
    return pl.Trainer(accelerator="cpu", max_epochs=2, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
"""

CASES = {
    "own SIGTERM handler, whole epochs": """
        loader = dataprep.Loader(InMemoryImageDataset(PACK), 4, shuffle=True, num_workers=2)
        for _ in range(2):
            for batch in loader:
                pass
        done(loader)
    """,
    "an iterator left mid-epoch": """
        loader = dataprep.Loader(InMemoryImageDataset(PACK), 2, num_workers=2, prefetch=4)
        it = iter(loader)
        next(it)
        time.sleep(0.3)  # the workers have filled batches nobody will read
        done(loader)
    """,
    "an exception at top level": """
        loader = dataprep.Loader(InMemoryImageDataset(PACK), 2, num_workers=2)
        it = iter(loader)
        next(it)
        done(loader)
        raise RuntimeError("the user's own error")
    """,
    "threads": """
        loader = dataprep.Loader(InMemoryImageDataset(PACK), 2, num_workers=2, threads=True, prefetch=4)
        it = iter(loader)
        next(it)
        done(loader)
    """,
    "own LightningModule": """
        class Own(Model):
            def train_dataloader(self):  # as docs/training.md recommends
                self.loader = dataprep.Loader(InMemoryImageDataset(PACK), 4, shuffle=True, num_workers=2)
                return self.loader
        model = Own()
        trainer().fit(model)
        done(model.loader)
    """,
    "PackDataModule": """
        from dataprep.lightning import PackDataModule
        dm = PackDataModule(PACK, batch_size=4, num_workers=2, normalize=None)
        trainer().fit(Model(), dm)
        done()
    """,
}
LIGHTNING_CASES = {"own LightningModule", "PackDataModule"}


@pytest.fixture(scope="module")
def pack(index_tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("exit") / "p"
    build_images(scan_imagenet(index_tree), out, BuildSettings(shard_size=5), ImageSettings(size=32, resize="center-crop", mode="raw"))
    return out


def run_case(body: str, pack: Path, tmp_path: Path, own_sigterm: bool,
             lightning: bool = False) -> tuple[subprocess.CompletedProcess, float, list[int]]:
    """Run the script; return it, the seconds from its last statement to its exit, and its workers' pids."""
    script = tmp_path / "script.py"
    script.write_text(PRELUDE + (LIGHTNING if lightning else "") + textwrap.dedent(body))
    env = {**os.environ, "OWN_SIGTERM": "1" if own_sigterm else "0", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen([sys.executable, str(script), str(pack)], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the script and the workers it forked: its own session
        out, err = proc.communicate()
        pytest.fail(f"the script did not exit within {TIMEOUT:.0f} s:\n{out}\n{err}")
    ended = time.monotonic()
    lines = {ln.split()[0]: ln.split()[1:] for ln in out.splitlines() if ln.split()}
    assert "LAST" in lines, f"the script did not reach its last statement:\n{out}\n{err}"
    workers = [int(p) for p in lines.get("WORKERS", [])]
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), ended - float(lines["LAST"][0]), workers


@pytest.mark.parametrize("case", list(CASES))
def test_a_script_that_used_the_loader_exits_by_itself(case, pack, tmp_path):
    if case in LIGHTNING_CASES:  # Lightning's own SIGTERM handler is the one under test there
        pytest.importorskip("lightning.pytorch", reason="needs the lightning extra (pip install 'dataprep[lightning]')")
    lightning = case in LIGHTNING_CASES
    done, after, workers = run_case(CASES[case], pack, tmp_path, own_sigterm=not lightning, lightning=lightning)
    try:
        assert not [p for p in workers if alive(p)], f"{case}: workers outlived the script"
        if case == "an exception at top level":
            assert done.returncode == 1 and done.stderr.count("Traceback") == 1, done.stderr
            assert "RuntimeError: the user's own error" in done.stderr
        else:
            assert done.returncode == 0, done.stderr
            assert "Traceback" not in done.stderr, done.stderr
        within(after, DEADLINE, f"{case}: the exit after the last statement")  # a hang: run_case's TIMEOUT
    finally:
        for p in workers:  # only on failure: ours, forked by the script we started
            if alive(p):
                os.kill(p, signal.SIGKILL)


def test_a_worker_dies_of_sigterm_though_its_parent_swallows_it(pack, tmp_path):
    """The worker's own dispositions: SIGTERM ends it while the parent's handler keeps the parent alive."""
    body = """
        loader = dataprep.Loader(InMemoryImageDataset(PACK), 2, num_workers=2)
        next(iter(loader))
        w = loader._procs[0]
        os.kill(w.pid, signal.SIGTERM)
        w.join(timeout=10)
        print("EXITCODE", w.exitcode, flush=True)
        done()
    """
    done, _, _ = run_case(body, pack, tmp_path, own_sigterm=True)
    assert f"EXITCODE {-signal.SIGTERM}" in done.stdout, done.stdout + done.stderr
