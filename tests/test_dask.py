"""Builds on a Dask cluster: a real scheduler and two workers on 127.0.0.1, output byte-identical to the
local engine, and a worker killed mid-build."""
from __future__ import annotations

import builtins
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dataprep.cli import main
from dataprep.errors import DataprepError
from dataprep.images.build import build_images
from dataprep.images.settings import ImageSettings
from dataprep.settings import BuildSettings
from dataprep.sources import scan_imagenet
from dataprep.verify import verify_pack

from .conftest import corpus_dir

try:
    import distributed  # noqa: F401

    HAVE_DASK = True
except ImportError:
    HAVE_DASK = False

needs_dask = pytest.mark.skipif(not HAVE_DASK, reason="needs the dask extra: pip install 'dataprep[dask]'")
pytestmark = pytest.mark.dask


def _start(args: list[str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as f:  # the child keeps its own copy of the descriptor
        return subprocess.Popen([sys.executable, "-m", "dask", *args], stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.fixture()
def cluster(tmp_path):
    """`dask scheduler` and 2 `dask worker` processes (no nanny: a killed worker stays dead), all on
    127.0.0.1; yields (address, worker processes); stops them by their process ids."""
    sched_file = tmp_path / "scheduler.json"
    procs = [_start(["scheduler", "--host", "127.0.0.1", "--port", "0", "--dashboard-address", "127.0.0.1:0",
                     "--scheduler-file", str(sched_file)], tmp_path / "scheduler.log")]
    try:
        deadline = time.time() + 60
        while not sched_file.exists() and time.time() < deadline:
            time.sleep(0.1)
        assert sched_file.exists(), (tmp_path / "scheduler.log").read_text()
        time.sleep(0.2)
        address = json.loads(sched_file.read_text())["address"]
        workers = [_start(["worker", address, "--nthreads", "1", "--no-nanny", "--host", "127.0.0.1",
                           "--dashboard-address", "127.0.0.1:0", "--name", f"w{k}"], tmp_path / f"worker{k}.log") for k in range(2)]
        procs += workers
        from distributed import Client

        with Client(address, timeout=30) as c:
            c.wait_for_workers(2, timeout=60)
        yield address, workers, sched_file
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                os.kill(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait()


def _same_pack(a: Path, b: Path) -> None:
    """Every shard file byte for byte, and the manifests but for when and how long."""
    fa = {str(p.relative_to(a)): p.read_bytes() for p in sorted(a.rglob("*")) if p.is_file() and p.name != "manifest.json"}
    fb = {str(p.relative_to(b)): p.read_bytes() for p in sorted(b.rglob("*")) if p.is_file() and p.name != "manifest.json"}
    assert fa.keys() == fb.keys() and len(fa) > 5
    assert all(fa[k] == fb[k] for k in fa), [k for k in fa if fa[k] != fb[k]][:3]
    ma, mb = (json.loads((p / "manifest.json").read_text()) for p in (a, b))
    for m in (ma, mb):
        m.pop("created"), m.pop("build")
    assert ma == mb


def _run(*args) -> object:
    from click.testing import CliRunner

    return CliRunner().invoke(main, [str(a) for a in args])


@needs_dask
@pytest.mark.corpus
def test_corpus_build_on_a_real_cluster_is_byte_identical_to_local(cluster, tmp_path):
    address, _, sched_file = cluster
    src = corpus_dir("images")
    r = _run("build", "imagenet", src, "--size", 192, "--out", tmp_path / "local", "-j", 2, "--shard-size", 32, "--no-progress")
    assert r.exit_code == 0, r.output
    r = _run("build", "imagenet", src, "--size", 192, "--out", tmp_path / "dask", "--shard-size", 32, "--no-progress",
             "--engine", "dask", "--address", address)
    assert r.exit_code == 0, r.output
    assert "356 of 356" in r.output
    _same_pack(tmp_path / "local", tmp_path / "dask")
    # the cluster is left running: it builds again, found by its scheduler file
    r = _run("build", "imagenet", src, "--size", 192, "--out", tmp_path / "again", "--shard-size", 32, "--no-progress",
             "--engine", "dask", "--scheduler-file", sched_file)
    assert r.exit_code == 0, r.output
    _same_pack(tmp_path / "local", tmp_path / "again")


@needs_dask
@pytest.mark.corpus
def test_a_worker_killed_mid_build_loses_nothing(cluster, tmp_path):
    address, workers, _ = cluster
    from dataprep.engine.dask import DaskEngine

    src = scan_imagenet(corpus_dir("images"))
    settings, image = BuildSettings(workers=2, shard_size=6), ImageSettings(size=320, resize="shorter", quality=95)
    build_images(src, tmp_path / "local", settings, image)
    out = tmp_path / "dask"
    killed = threading.Event()

    def kill_when_busy():
        deadline = time.time() + 60
        while time.time() < deadline:
            split = out / "train"
            if split.is_dir() and any(p.name.startswith(".tmp-") for p in split.iterdir()):
                os.kill(workers[0].pid, signal.SIGKILL)  # while it is writing or about to write a shard
                killed.set()
                return
            time.sleep(0.005)

    t = threading.Thread(target=kill_when_busy)
    t.start()
    with DaskEngine(address=address) as eng:
        summary = build_images(src, out, settings, image, engine=eng)
    t.join()
    assert killed.is_set() and workers[0].wait(timeout=10) == -signal.SIGKILL
    assert summary.written == 356
    assert not [p for p in (out / "train").iterdir() if p.name.startswith(".tmp-")]
    rep = verify_pack(out)
    assert rep.ok, rep.problems
    _same_pack(tmp_path / "local", out)


@needs_dask
@pytest.mark.corpus
def test_tokenize_and_table_on_the_engine_match_local(tmp_path):
    # a quarter of the corpus's text, 3.5 MB (every other play, and three folders of the Python docs): at
    # --task-mb 1 still several tasks for the two workers, and files at the top and in nested folders
    corpus, text = corpus_dir("text"), tmp_path / "text"
    docs = [f for d in ("tutorial", "faq", "howto") for f in sorted((corpus / "python-docs" / d).rglob("*")) if f.is_file()]
    for f in sorted(corpus.glob("*.txt"))[::2] + docs:
        (text / f.relative_to(corpus)).parent.mkdir(parents=True, exist_ok=True)
        (text / f.relative_to(corpus)).write_bytes(f.read_bytes())
    tok = corpus_dir("tokenizer", "tokenizer.json")
    common = ["--tokenizer", tok, "--val-fraction", 0.1, "--split-docs", "paragraph", "--task-mb", 1]
    assert _run("tokenize", text, "--out", tmp_path / "tl", *common).exit_code == 0
    r = _run("tokenize", text, "--out", tmp_path / "td", *common, "--engine", "dask", "-j", 2)
    assert r.exit_code == 0, r.output
    _same_pack(tmp_path / "tl", tmp_path / "td")
    tables = corpus_dir("tables")
    args = [tables / "linnerud_exercise.csv", tables / "linnerud_exercise.csv", "--target", "Jumps", "--val-fraction", 0.2]
    assert _run("table", *args, "--out", tmp_path / "al").exit_code == 0
    r = _run("table", *args, "--out", tmp_path / "ad", "--engine", "dask", "-j", 2)
    assert r.exit_code == 0, r.output
    _same_pack(tmp_path / "al", tmp_path / "ad")


@needs_dask
def test_unreachable_scheduler_is_a_clear_error():
    from dataprep.engine.dask import DaskEngine

    with pytest.raises(DataprepError, match="cannot reach the Dask scheduler at tcp://127.0.0.1:9"):
        with DaskEngine(address="tcp://127.0.0.1:9", connect_timeout=1):
            pass


def test_address_needs_the_dask_engine(tmp_path, index_tree):
    r = _run("build", "imagenet", index_tree, "--out", tmp_path / "p", "--address", "tcp://127.0.0.1:9")
    assert r.exit_code == 1 and "--engine dask" in r.output


def test_missing_extra_names_the_install_command(monkeypatch):
    real = builtins.__import__

    def no_dask(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and name.split(".")[0] in ("distributed", "dask"):
            raise ImportError(f"No module named {name!r}")
        return real(name, globals, locals, fromlist, level)

    monkeypatch.setattr(builtins, "__import__", no_dask)
    from dataprep.engine import make_engine

    with pytest.raises(DataprepError, match=r"pip install 'dataprep\[dask\]'"):
        make_engine("dask", 2)


@needs_dask
def test_failed_tasks_are_retried_but_bad_data_is_not(tmp_path):
    from dataprep.engine.dask import DaskEngine
    from dataprep.errors import ImageDecodeError, WorkerError

    flag = tmp_path / "failed-once"

    def flaky(x):  # defined here: cloudpickle sends it by value
        if x == 2 and not flag.exists():
            flag.write_text("1")
            raise OSError("transient: the file share blinked")
        return x * 10

    def bad(x):
        if x == 1:
            (tmp_path / f"bad-{time.time_ns()}").write_text("")
            raise ImageDecodeError("/data/x.JPEG", "truncated")
        return x

    def always(x):
        raise OSError("down")

    seen = []
    with DaskEngine(workers=1) as eng:
        assert eng.map(flaky, [0, 1, 2, 3], lambda i, r: seen.append(i)) == [0, 10, 20, 30]
        assert sorted(seen) == [0, 1, 2, 3] and flag.exists()
        with pytest.raises(ImageDecodeError, match="truncated"):
            eng.map(bad, [0, 1, 2])
        assert len(list(tmp_path.glob("bad-*"))) == 1  # raised at once, not retried
        with pytest.raises(WorkerError, match="failed 3 times"):
            eng.map(always, [0], names=["train/00000"])


@needs_dask
def test_segmentation_volumes_and_zarr_output_through_dask_match_local(tmp_path):
    """Every build kind runs its shards as engine tasks: segmentation and volume packs, and a Zarr pack
    whose chunk ranges are written by the workers, equal their local builds."""
    import numpy as np

    from dataprep.engine.dask import DaskEngine
    from dataprep.segmentation.build import build_segmentation
    from dataprep.segmentation.pairs import pair_by_stem
    from dataprep.sources import scan_files
    from dataprep.synthetic import write_segmentation_tree
    from dataprep.volumes.build import VolumeSettings, build_volumes
    from dataprep.volumes.read import VOLUME_EXTENSIONS

    i, m = write_segmentation_tree(tmp_path / "seg", {"train": 9, "val": 3})
    (tmp_path / "vol").mkdir()
    for k in range(6):
        np.save(tmp_path / "vol" / f"{k}.npy", np.random.default_rng(k).integers(0, 4000, (4, 9, 11), dtype=np.uint16))
    settings, image = BuildSettings(workers=2, shard_size=4), ImageSettings(size=48, mode="raw")
    build_segmentation(pair_by_stem(i, m), tmp_path / "seg_local", settings, image)
    build_volumes(scan_files(tmp_path / "vol", "train", VOLUME_EXTENSIONS), tmp_path / "vol_local", settings, VolumeSettings(shape=(3, 8, 8)))
    with DaskEngine(workers=2) as eng:
        build_segmentation(pair_by_stem(i, m), tmp_path / "seg_dask", settings, image, engine=eng)
        build_volumes(scan_files(tmp_path / "vol", "train", VOLUME_EXTENSIONS), tmp_path / "vol_dask", settings,
                      VolumeSettings(shape=(3, 8, 8)), engine=eng)
        from dataprep.pack.convert import convert

        convert(tmp_path / "seg_dask", tmp_path / "seg.zarr", "zarr", "zstd", eng)
    _same_pack(tmp_path / "seg_local", tmp_path / "seg_dask")
    _same_pack(tmp_path / "vol_local", tmp_path / "vol_dask")
    convert(tmp_path / "seg.zarr", tmp_path / "seg_back", "npy")
    _same_pack(tmp_path / "seg_local", tmp_path / "seg_back")


@needs_dask
def test_the_local_cluster_a_build_starts_accepts_no_stranger():
    """A build's own cluster speaks TLS with a certificate made for it: a client without it (another local
    user, a stray script) can neither connect in clear nor complete a TLS handshake."""
    from distributed import Client

    from dataprep.engine.dask import DaskEngine

    with DaskEngine(workers=1) as eng:
        addr = eng.client.scheduler.address
        assert addr.startswith("tls://127.0.0.1:")
        assert eng.map(abs, [-3]) == [3]
        for stranger in (addr.replace("tls://", "tcp://"), addr):
            with pytest.raises((OSError, TimeoutError, TypeError)):  # refused: in clear, or with no certificate
                Client(stranger, timeout=2)
        from distributed.security import Security

        # a valid TLS client whose certificate this cluster did not issue: the server refuses it (on a loaded
        # machine distributed may also give up starting that client's event loop: an AssertionError of its own)
        with pytest.raises((OSError, TimeoutError, AssertionError)):
            Client(addr, security=Security.temporary(), timeout=3)


@needs_dask
def test_tars_and_parquet_on_the_engine_match_local(tmp_path):
    """The new sources' tasks travel to Dask workers and read their own bytes there: a plain tar (shards cut
    inside it, each read by seeking), a gzip tar (its shards one task) and Parquet row groups give the same
    pack on the engine as locally, byte for byte."""
    import io
    import tarfile

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    def png(i: int) -> bytes:
        buf = io.BytesIO()
        Image.fromarray(np.full((24, 20, 3), (7 * i) % 256, np.uint8)).save(buf, "PNG")
        return buf.getvalue()

    for name, mode in (("plain.tar", "w"), ("packed.tar.gz", "w:gz")):
        with tarfile.open(tmp_path / name, mode) as tf:
            for i in range(9):
                for ext, data in (("png", png(i)), ("cls", str(i % 3).encode()), ("txt", f"sample {i}".encode())):
                    ti = tarfile.TarInfo(f"{i:03d}.{ext}")
                    ti.size = len(data)
                    tf.addfile(ti, io.BytesIO(data))
    pq.write_table(pa.table({"image": [png(i) for i in range(10)], "label": [i % 2 for i in range(10)]}),
                   tmp_path / "t.parquet", row_group_size=4)
    for cmd, inputs, extra in (("webdataset", [tmp_path / "plain.tar", tmp_path / "packed.tar.gz"], []),
                               ("parquet", [tmp_path / "t.parquet"], ["--label-column", "label"])):
        common = ["build", cmd, *inputs, *extra, "--size", 16, "--shard-size", 2, "--no-progress"]
        r = _run(*common, "--out", tmp_path / f"{cmd}-local", "-j", 2)
        assert r.exit_code == 0, r.output
        r = _run(*common, "--out", tmp_path / f"{cmd}-dask", "--engine", "dask", "-j", 2)
        assert r.exit_code == 0, r.output
        assert ("18 of 18" if cmd == "webdataset" else "10 of 10") in r.output
        _same_pack(tmp_path / f"{cmd}-local", tmp_path / f"{cmd}-dask")
