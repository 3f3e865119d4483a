"""Packs at URLs and conversions against hostile or unlucky surroundings: a manifest that lies about sizes,
directories other local users can write, a store that accepts and never answers, runs killed mid-way, a
full disk, and the local Dask cluster's HTTP server. Each test failed before its fix.

Tests that need another local user fork a child that drops to uid 65534 (as tests/test_trust.py does);
they need root and are skipped otherwise. Hostile-manifest loads run in a child process with a memory
cap and a timeout, so the code they guard against cannot take the machine down with it.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dataprep.cli import main
from dataprep.errors import DataprepError
from dataprep.images.build import build_images
from dataprep.images.dataset import InMemoryImageDataset
from dataprep.images.settings import ImageSettings
from dataprep.remote import fetch
from dataprep.remote.upload import upload_pack
from dataprep.settings import BuildSettings
from dataprep.sources import scan_imagenet
from dataprep.synthetic import write_tree

from .conftest import within
from .test_trust import _as_other_user

ROOT = Path(__file__).resolve().parents[1]
SECRET = "sEcReT-trust-remote-0d15ea5e"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to fork a child that drops to another user (uid 65534)")


# ---------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def local_pack(tmp_path_factory) -> Path:
    tree = write_tree(tmp_path_factory.mktemp("tree"), classes=3, per_class=8, val_per_class=2,
                      sizes=((40, 60), (64, 48), (50, 50)), kind="index", ext=".png")
    out = tmp_path_factory.mktemp("local") / "p"
    build_images(scan_imagenet(tree), out, BuildSettings(shard_size=8, workers=1), ImageSettings(size=32, mode="raw"),
                 progress=None)
    return out


@pytest.fixture(scope="module")
def ref_labels(local_pack) -> np.ndarray:
    return np.asarray(InMemoryImageDataset(local_pack, as_numpy=True).labels).copy()


@pytest.fixture(autouse=True)
def private_dirs(tmp_path, monkeypatch):
    """The remote cache and shared-memory segments of each test under its own tmp directory (children too)."""
    from dataprep.serve import shm as shm_mod

    shm = tmp_path / "shm"
    shm.mkdir(mode=0o700)
    monkeypatch.setattr(shm_mod, "SHM_DIR", shm)
    monkeypatch.setenv("DATAPREP_SHM_DIR", str(shm))
    monkeypatch.setenv("DATAPREP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("DATAPREP_REMOTE_DEADLINE", raising=False)
    monkeypatch.delenv("DATAPREP_DASK_DASHBOARD", raising=False)
    return tmp_path


def file_url(local_pack: Path, tmp_path: Path, name: str = "p") -> str:
    url = f"file://{tmp_path}/store/{name}"
    upload_pack(local_pack, url)
    return url


def url_dir(url: str) -> Path:
    return Path(url[len("file://"):])


def edit_manifest(url: str, fn) -> None:
    path = url_dir(url) / "manifest.json"
    m = json.loads(path.read_text())
    fn(m)
    path.write_text(json.dumps(m))


def run_child(args: list[str], timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                              env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        pytest.fail(f"still busy after {timeout} s: {args[1:3]}")


as_other_user = _as_other_user  # the one fork-and-drop helper (tests/test_trust.py)


@pytest.fixture
def shared_dir():
    """A directory in /tmp that other users can reach (the test's own tmp_path is root's 0700)."""
    d = Path(tempfile.mkdtemp(prefix="dataprep-trust-remote-", dir="/tmp"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


# -------------------------------------------------------------------- 1. a manifest that lies about sizes
HOSTILE = r"""
import json, os, resource, sys, time
from dataprep.images.dataset import InMemoryImageDataset
from dataprep.remote import fetch, store
from dataprep.remote.urls import RemoteError
from dataprep.verify import verify_remote

url, cache, block, probe = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
if block:
    fetch.BLOCK = block
reads = [0]
real = store.Store.read
def read(self, rel, start=None, end=None):
    reads[0] += 1
    return real(self, rel, start, end)
store.Store.read = read
if probe == "no-probe":  # a store that cannot tell an object's size: the first short range must stop the fetch
    def size(self, rel):
        raise RemoteError(f"{self.where(rel)}: cannot look it up (injected)")
    store.Store.size = size
vm = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + (3 << 30), vm + (3 << 30)))  # what the code under test may add
t0 = time.monotonic()
try:
    if cache == "verify":
        rep, _ = verify_remote(url)
        out = {"problems": rep.problems}
    elif cache == "memory":  # what cache='ram' and 'shm' fetch through, on its own
        from pathlib import Path
        from dataprep.remote.memory import MemoryFetch

        rp = fetch.RemotePack(url)
        items = rp.shard_files(["train"])
        class Nothing:
            def close(self):
                pass
        mf = MemoryFetch(rp.store, Path("/nonexistent"), items, Nothing())
        try:
            for rel, _ in items:
                mf._take(rel)
        finally:
            mf.close()
        out = {"loaded": True}
    else:
        InMemoryImageDataset(url, cache=cache)
        out = {"loaded": True}
except BaseException as e:
    out = {"error": f"{type(e).__name__}: {e}"}
out.update(reads=reads[0], seconds=time.monotonic() - t0)
print(json.dumps(out))
"""


def hostile(url: str, cache: str, block: int = 0, probe: str = "probe") -> dict:
    p = run_child([sys.executable, "-c", HOSTILE, url, cache, str(block), probe], timeout=60)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


LABELS = "train/00000/labels.npy"


@pytest.mark.parametrize("cache", ["ram", "disk", "verify"])
def test_hostile_record_of_2_50_bytes_without_shape_is_refused_before_any_range(local_pack, tmp_path, cache):
    url = file_url(local_pack, tmp_path)

    def lie(m):
        rec = m["splits"]["train"]["shards"][0]["files"]["labels.npy"]
        rec["bytes"] = 1 << 50
        del rec["shape"], rec["dtype"]

    edit_manifest(url, lie)
    got = hostile(url, f"disk:{tmp_path / 'nvme'}" if cache == "disk" else cache)
    text = got.get("error", "") + json.dumps(got.get("problems", []))
    assert f"{url}/{LABELS}" in text and "unusable" in text, got
    assert got["reads"] <= 2, got  # the manifest (and nothing of the pack's shards)
    within(got["seconds"], 20, f"refusing a 2**50-byte record ({cache})")


def _huge_labels(url: str, rows: int) -> None:
    """train/00000/labels.npy recorded as `rows` int64 labels, its byte count to match."""

    def lie(m):
        shard = m["splits"]["train"]["shards"][0]
        rec = shard["files"]["labels.npy"]
        header = rec["bytes"] - 8 * int(np.prod(rec["shape"]))
        rec["shape"], rec["dtype"], rec["bytes"] = [rows], "<i8", header + 8 * rows
        shard["count"] = max(shard["count"], rows >> 30)  # so that no per-sample bound refuses it: the store must

    edit_manifest(url, lie)


@pytest.mark.parametrize("probe", ["probe", "no-probe"])
@pytest.mark.parametrize("cache", ["disk", "verify"])
def test_hostile_shape_with_a_matching_byte_count_fails_at_the_first_short_range(local_pack, tmp_path, cache, probe):
    url = file_url(local_pack, tmp_path)
    _huge_labels(url, 1 << 41)  # int64: 16 TiB of labels in a shard that holds 8 samples
    got = hostile(url, f"disk:{tmp_path / 'nvme'}" if cache == "disk" else cache, block=1 << 20, probe=probe)
    text = got.get("error", "") + json.dumps(got.get("problems", []))
    assert f"{url}/{LABELS}" in text and "truncated" in text, got
    assert got["reads"] < 200, got  # not the 2**24 ranges the record spans
    within(got["seconds"], 20, f"the first short range of a 16 TiB record ({cache}, {probe})")


@pytest.mark.parametrize("probe", ["probe", "no-probe"])
def test_hostile_shape_in_a_ram_or_shm_fetch_fails_at_the_first_short_range(local_pack, tmp_path, probe):
    url = file_url(local_pack, tmp_path)
    _huge_labels(url, 1 << 29)  # 4 GiB: within this machine's memory, so only the store's answers can tell
    got = hostile(url, "memory", block=1 << 20, probe=probe)
    assert got.get("error", "").startswith(f"RemoteError: {url}/{LABELS}: truncated"), got
    assert got["reads"] < 200, got  # not the 8,192 ranges of two tries
    within(got["seconds"], 20, f"the first short range of a 4 GiB record in memory ({probe})")


def test_hostile_load_larger_than_this_machine_s_memory_is_refused_before_fetching(local_pack, tmp_path):
    url = file_url(local_pack, tmp_path)
    _huge_labels(url, 1 << 41)
    got = hostile(url, "memory", block=1 << 20)
    assert "RAM and swap" in got.get("error", "") and url in got["error"], got
    assert got["reads"] <= 1, got
    within(got["seconds"], 20, "refusing a load larger than this machine's memory")


# ------------------------------------------------------------------ 2. directories other users can write
def _pack_key(url: str) -> str:
    return fetch.RemotePack(url).key


def _planted_labels(local_pack: Path) -> bytes:
    raw = bytearray((local_pack / LABELS).read_bytes())
    for i in range(len(raw) - 16, len(raw)):  # the last labels' low bits: the same size, other classes
        raw[i] ^= 0x01
    return bytes(raw)


@needs_root
@pytest.mark.parametrize("mode", [0o777, 0o1777])
def test_a_disk_cache_where_another_user_planted_the_pack_directory_is_refused(local_pack, tmp_path, shared_dir, mode,
                                                                                ref_labels):
    url = file_url(local_pack, tmp_path)
    key = _pack_key(url)
    os.chmod(shared_dir, mode)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "config").write_bytes(b"precious")
    planted = _planted_labels(local_pack)
    me = os.getpid()

    def plant():
        d = shared_dir / key
        os.mkdir(d, 0o777)
        os.chmod(d, 0o777)
        (d / "train" / "00000").mkdir(parents=True)
        (d / "train" / "00000" / "labels.npy").write_bytes(planted)  # the right size, other labels
        os.symlink(victim / "created-by-root", d / ".lock")
        for name in ("manifest.json", ".remote.json"):
            os.symlink(victim / "config", d / f".{name}.tmp-{me}")
        return {"ok": True}

    assert as_other_user(plant) == {"ok": True}
    with pytest.raises(DataprepError) as e:
        ds = InMemoryImageDataset(url, as_numpy=True, cache=f"disk:{shared_dir}")
        assert np.array_equal(ds.labels, ref_labels), "served the planted labels"
    assert str(shared_dir) in str(e.value)
    assert not (victim / "created-by-root").exists()
    assert (victim / "config").read_bytes() == b"precious"


@needs_root
def test_a_cache_dir_where_another_user_made_the_remote_subdirectory_is_refused(local_pack, tmp_path, shared_dir,
                                                                               monkeypatch):
    url = file_url(local_pack, tmp_path)
    os.chmod(shared_dir, 0o1777)  # as /tmp: sticky, ours
    monkeypatch.setenv("DATAPREP_CACHE_DIR", str(shared_dir))

    def plant():
        os.mkdir(shared_dir / "remote", 0o777)
        os.chmod(shared_dir / "remote", 0o777)
        return {"ok": True}

    assert as_other_user(plant) == {"ok": True}
    with pytest.raises(DataprepError) as e:
        InMemoryImageDataset(url, cache="ram")
    assert str(shared_dir / "remote") in str(e.value)
    assert os.listdir(shared_dir / "remote") == []  # nothing staged in the other user's directory


def test_symlinks_at_the_temporary_and_part_names_are_never_written_through(local_pack, tmp_path, ref_labels):
    """Same user, a private directory: names a previous (or planted) run left as symlinks are never followed."""
    url = file_url(local_pack, tmp_path)
    where = tmp_path / "nvme"
    d = where / _pack_key(url)
    (d / "train" / "00000").mkdir(parents=True, mode=0o700)
    os.chmod(where, 0o700)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    for name in ("manifest.json", ".remote.json"):
        os.symlink(victim, d / f".{name}.tmp-{os.getpid()}")
    os.symlink(victim, d / "train" / "00000" / "labels.npy.part")
    ds = InMemoryImageDataset(url, as_numpy=True, cache=f"disk:{where}")
    assert np.array_equal(ds.labels, ref_labels)
    assert victim.read_bytes() == b"precious"


def test_a_lock_that_is_a_symlink_is_refused_not_followed(local_pack, tmp_path):
    url = file_url(local_pack, tmp_path)
    where = tmp_path / "nvme"
    d = where / _pack_key(url)
    d.mkdir(parents=True, mode=0o700)
    os.symlink(tmp_path / "created-through-the-lock", d / ".lock")
    with pytest.raises(DataprepError, match="symlink") as e:
        InMemoryImageDataset(url, cache=f"disk:{where}")
    assert str(d / ".lock") in str(e.value)
    assert not (tmp_path / "created-through-the-lock").exists()


def test_a_disk_copy_reuses_a_file_only_when_its_checksum_matches(local_pack, tmp_path, ref_labels):
    url = file_url(local_pack, tmp_path)
    where = tmp_path / "nvme"
    ds = InMemoryImageDataset(url, as_numpy=True, cache=f"disk:{where}")
    assert np.array_equal(ds.labels, ref_labels)
    del ds
    kept = where / _pack_key(url) / LABELS
    kept.write_bytes(_planted_labels(local_pack))  # same size, other bytes
    ds = InMemoryImageDataset(url, as_numpy=True, cache=f"disk:{where}")
    assert np.array_equal(ds.labels, ref_labels), "a kept file was trusted by its size"
    assert kept.read_bytes() == (local_pack / LABELS).read_bytes()  # fetched again


# --------------------------------------------------------------------- 3. a store that never answers in full
class Stuck:
    """A TCP server on 127.0.0.1 that accepts and never answers (or answers a header, then a byte at a time)."""

    def __init__(self, trickle: bool):
        self.trickle, self.stop = trickle, threading.Event()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            self.conns.append(c)
            if self.trickle:
                threading.Thread(target=self._drip, args=(c,), daemon=True).start()

    def _drip(self, c: socket.socket) -> None:
        try:
            c.recv(65536)
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n")
            while not self.stop.wait(0.5):
                c.sendall(b" ")
        except OSError:
            pass

    def close(self) -> None:
        self.stop.set()
        for c in self.conns:
            c.close()
        self.sock.close()


@pytest.mark.parametrize("trickle", [False, True], ids=["never-answers", "trickles"])
def test_a_store_that_hangs_is_an_error_within_the_deadline_naming_the_url(trickle):
    pytest.importorskip("aiohttp", reason="http:// stores need aiohttp")
    server = Stuck(trickle)
    try:
        url = f"http://reader:{SECRET}@127.0.0.1:{server.port}/p"
        t0 = time.monotonic()
        p = run_child([sys.executable, "-m", "dataprep", "verify", url], timeout=45, env={"DATAPREP_REMOTE_DEADLINE": "2"})
        took = time.monotonic() - t0
    finally:
        server.close()
    out = p.stdout + p.stderr
    assert p.returncode == 1, out[-2000:]
    assert f"http://***@127.0.0.1:{server.port}/p/manifest.json" in out and "DATAPREP_REMOTE_DEADLINE" in out, out[-2000:]
    assert SECRET not in out and "Traceback" not in out, out[-2000:]
    within(took, 30, "verify against a store that hangs, with a 2 s deadline")  # the child's own start included


# ------------------------------------------------------------------------- 4. what a killed run leaves
KILLED_FETCH = r"""
import os, signal, sys
print(os.getpid(), flush=True)
from dataprep.remote import store
real = store.Store.read
def read(self, rel, start=None, end=None):
    if rel.endswith("images.npy"):
        os.kill(os.getpid(), signal.SIGKILL)
    return real(self, rel, start, end)
store.Store.read = read
from dataprep.cli import main
main(sys.argv[1:])
"""


@pytest.mark.parametrize("command", ["verify", "convert"])
def test_a_copy_a_killed_run_left_is_listed_and_cleaned_and_a_live_one_kept(local_pack, tmp_path, command):
    url = file_url(local_pack, tmp_path)
    args = ["verify", url] if command == "verify" else ["convert", url, "--to", "hdf5", "--out", str(tmp_path / "o.h5")]
    p = run_child([sys.executable, "-c", KILLED_FETCH, *args], timeout=120)
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    root = fetch.cache_root()
    pid = int(p.stdout.split()[0])
    left = [d for d in root.iterdir() if d.is_dir() and f"-{pid}-" in d.name]
    assert len(left) == 1 and any(left[0].rglob("*.npy*")), list(root.iterdir())
    live = root / f"copy-{os.getpid()}-0123456789ab"
    live.mkdir()
    (live / "x.npy").write_bytes(b"x" * 1000)
    r = CliRunner().invoke(main, ["cache", "list"])
    assert r.exit_code == 0, r.output
    line = next((ln for ln in r.output.splitlines() if str(left[0]) in ln), "")
    assert "left by a killed run" in line, r.output
    assert f"pid {os.getpid()}" in next((ln for ln in r.output.splitlines() if str(live) in ln), ""), r.output
    r = CliRunner().invoke(main, ["cache", "clean", "-v"])
    assert r.exit_code == 0 and f"removed {left[0]}" in r.output, r.output
    assert not left[0].exists() and live.exists()


KILLED_CONVERT = r"""
import os, signal, sys
to = sys.argv[2]
if to == "hdf5":
    import h5py
    real = h5py.Dataset.__setitem__
    def setitem(self, key, value):
        real(self, key, value)
        os.kill(os.getpid(), signal.SIGKILL)
    h5py.Dataset.__setitem__ = setitem
else:
    from dataprep.pack.backends import zarr as zb
    real = zb.write_chunks
    def write_chunks(t):
        real(t)
        os.kill(os.getpid(), signal.SIGKILL)
    zb.write_chunks = write_chunks
from dataprep.cli import main
main(["convert", sys.argv[1], "--to", to, "--out", sys.argv[3]])
"""


def _temporaries(out: Path) -> list[Path]:
    return [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.tmp-")]


@pytest.mark.parametrize("to", ["hdf5", "zarr"])
def test_a_killed_conversion_s_temporary_goes_with_the_next_conversion_or_cache_clean(local_pack, tmp_path, to):
    pytest.importorskip("h5py" if to == "hdf5" else "zarr")
    out = tmp_path / ("o.h5" if to == "hdf5" else "o.zarr")
    p = run_child([sys.executable, "-c", KILLED_CONVERT, str(local_pack), to, str(out)], timeout=120)
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    left = _temporaries(out)
    assert len(left) == 1, left
    r = CliRunner().invoke(main, ["cache", "list"])
    line = next((ln for ln in r.output.splitlines() if str(left[0]) in ln), "")
    assert r.exit_code == 0 and "left by a killed run" in line, r.output
    r = CliRunner().invoke(main, ["cache", "clean", "-v"])
    assert r.exit_code == 0 and f"removed {left[0]}" in r.output, r.output
    assert _temporaries(out) == []
    p = run_child([sys.executable, "-c", KILLED_CONVERT, str(local_pack), to, str(out)], timeout=120)
    assert p.returncode == -signal.SIGKILL and len(_temporaries(out)) == 1
    r = CliRunner().invoke(main, ["convert", str(local_pack), "--to", to, "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert _temporaries(out) == [] and out.exists()


# ----------------------------------------------------------------------------------------- 5. a full disk
def _enospc(*_a, **_k):
    raise OSError(errno.ENOSPC, "No space left on device")


def _one_line_naming(r, path: Path) -> None:
    assert isinstance(r.exception, SystemExit) and r.exit_code == 1, repr(r.exception)
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and str(path) in lines[0] and "no space" in lines[0].lower(), r.output
    assert "Traceback" not in r.output


@pytest.mark.parametrize("to", ["hdf5", "zarr", "npy"])
def test_a_full_disk_in_a_conversion_is_one_line_naming_the_file(local_pack, tmp_path, monkeypatch, to):
    if to == "hdf5":
        h5py = pytest.importorskip("h5py")
        monkeypatch.setattr(h5py.Dataset, "__setitem__", _enospc)
        out = tmp_path / "o.h5"
    elif to == "zarr":
        zarr = pytest.importorskip("zarr")
        monkeypatch.setattr(zarr.Array, "__setitem__", _enospc)
        out = tmp_path / "o.zarr"
    else:
        from dataprep.pack.backends import npy

        monkeypatch.setattr(npy, "write_shard", _enospc)
        out = tmp_path / "o"
    r = CliRunner().invoke(main, ["convert", str(local_pack), "--to", to, "--out", str(out)])
    _one_line_naming(r, out)
    assert not out.exists() and _temporaries(out) == []


class _FullFile:
    """A file whose writes are buffered and whose flush at close finds the disk full (as a BufferedWriter)."""

    def __init__(self, real):
        self.real = real

    def write(self, data):
        return len(data)

    def close(self):
        self.real.close()
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name):
        return getattr(self.real, name)


def _full_open(real_open):
    def fake(file, mode="r", *a, **k):
        f = real_open(file, mode, *a, **k)
        return _FullFile(f) if "w" in mode or "a" in mode else f  # fetch.py opens only the .part files so
    return fake


def test_a_full_disk_in_a_disk_fetch_or_a_remote_convert_is_one_line(local_pack, tmp_path, monkeypatch):
    import builtins

    url = file_url(local_pack, tmp_path)
    monkeypatch.setattr(fetch, "open", _full_open(builtins.open), raising=False)
    where = tmp_path / "nvme"
    with pytest.raises(DataprepError) as e:
        InMemoryImageDataset(url, cache=f"disk:{where}")
    msg = str(e.value)
    assert "\n" not in msg and "no space" in msg.lower() and str(where) in msg, msg
    r = CliRunner().invoke(main, ["convert", url, "--to", "npy", "--out", str(tmp_path / "o")])
    _one_line_naming(r, fetch.cache_root())


FULL_FETCH = r"""
import sys
from dataprep.errors import DataprepError
from dataprep.images.dataset import InMemoryImageDataset
try:
    InMemoryImageDataset(sys.argv[1], cache=f"disk:{sys.argv[2]}")
except DataprepError as e:
    print(e)
"""


@needs_root
def test_a_really_full_disk_is_one_line_everywhere(local_pack, tmp_path):
    """A 48 KiB tmpfs: every writer meets a real ENOSPC (where it comes is the kernel's choice), in a child
    process as a user runs it: its whole output one line, no traceback, no "Exception ignored" from h5py."""
    full = tmp_path / "full"
    full.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(full)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        url = file_url(local_pack, tmp_path)
        runs = [(["-m", "dataprep", "convert", str(local_pack), "--to", to, "--out", str(full / name)], full / name)
                for to, name in (("hdf5", "o.h5"), ("zarr", "o.zarr"), ("npy", "o"))]
        # the free-space check passed (told the disk is empty): HDF5 itself meets the full disk mid-write
        runs += [(["-c", "import shutil, sys; shutil.disk_usage = lambda p: shutil._ntuple_diskusage(1 << 40, 0, 1 << 40)\n"
                         "from dataprep.cli import main; main(sys.argv[1:])",
                   "convert", str(local_pack), "--to", "hdf5", "--out", str(full / "o.h5")], full / "o.h5")]
        runs += [(["-c", FULL_FETCH, url, str(full)], full)]  # last: it keeps what it fetched, to resume
        for args, named in runs:
            p = run_child([sys.executable, *args], timeout=120)
            lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
            assert p.returncode in (0, 1) and len(lines) == 1, (args, p.returncode, p.stdout + p.stderr)
            assert str(named) in lines[0] and "no space" in lines[0].lower(), lines
            if args[1] != FULL_FETCH:
                assert os.listdir(full) == [], (args, os.listdir(full))
    finally:
        subprocess.run(["umount", "-l", str(full)], check=False)


# ---------------------------------------------------------------------------- 6. the Dask cluster's HTTP
def _http_answers(port: int) -> list[str]:
    got = []
    for path in ("/status", "/json/identity.json", "/info/main/workers.html", "/metrics"):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
                s.sendall(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
                s.settimeout(3)
                head = s.recv(64)
        except OSError:
            continue
        if head.startswith(b"HTTP/1.1 200") or head.startswith(b"HTTP/1.0 200"):
            got.append(f"{port}{path}")
    return got


def test_the_local_dask_cluster_has_no_dashboard_anyone_can_read(monkeypatch):
    pytest.importorskip("distributed")
    psutil = pytest.importorskip("psutil")
    from dataprep.engine.dask import DaskEngine

    with DaskEngine(workers=1) as eng:
        procs = [psutil.Process(), *psutil.Process().children(recursive=True)]
        ports = sorted({c.laddr.port for p in procs for c in p.net_connections(kind="tcp") if c.status == "LISTEN"})
        readable = [a for port in ports for a in _http_answers(port)]
        services = eng._cluster.scheduler.services
    assert ports and not readable, readable
    assert "dashboard" not in services
    monkeypatch.setenv("DATAPREP_DASK_DASHBOARD", "1")  # the opt-in still gives one
    with DaskEngine(workers=1) as eng:
        assert "dashboard" in eng._cluster.scheduler.services
