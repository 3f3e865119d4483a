"""Packs at URLs (dataprep/remote): build to a store, info, verify, convert, and datasets loading from it, over
three stores: S3 (a moto server in this process), file:// and memory://.

Every pack here is made of index images (each pixel's colour encodes the sample's position), so a sample
served from the wrong shard, range or offset is caught, not just a wrong byte count. Store reads are counted
by wrapping `Store.read`, which is also where interruptions and damage in transit are injected.
"""
from __future__ import annotations

import fcntl
import gc
import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flask", reason="the S3 store tests need moto's server, which needs flask (pip install 'moto[server]')")
moto_server = pytest.importorskip("moto.server", reason="the S3 store tests need moto's server (pip install 'moto[server]')")
s3fs = pytest.importorskip("s3fs", reason="the S3 store tests need s3fs (pip install 'dataprep[s3]')")
boto3 = pytest.importorskip("boto3", reason="the S3 store tests need boto3 to create their bucket")

import fsspec
from click.testing import CliRunner

from dataprep.cli import main
from dataprep.errors import DataprepError, PackError
from dataprep.images.build import build_images
from dataprep.images.dataset import InMemoryImageDataset
from dataprep.images.settings import ImageSettings
from dataprep.pack.backends import read_manifest
from dataprep.remote import fetch
from dataprep.remote import store as store_mod
from dataprep.remote.upload import upload_pack
from dataprep.remote.urls import RemoteError, is_url
from dataprep.settings import BuildSettings
from dataprep.sources import scan_imagenet
from dataprep.synthetic import decode_index, write_tree

from .conftest import within

SECRET = "sEcReT-dataprep-5f3759df-never-print-me"  # AWS_SECRET_ACCESS_KEY for the whole module
KEY_ID = "AKIADATAPREPTESTKEY1"
BUCKET = "dataprep-remote-tests"
SMALL = 4096  # fetch.BLOCK in tests that want many ranges per object (images.npy is ~30 kB: 7-8 ranges)
STORES = ["s3", "file", "memory"]


# ---------------------------------------------------------------------------------------------- fixtures
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Moto:
    """moto's threaded server on a fixed port; stop() and start() again serve the same (in-process) state."""

    def __init__(self, port: int):
        self.port, self.server = port, None

    def start(self) -> None:
        self.server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


@pytest.fixture(scope="module")
def moto():
    mp = pytest.MonkeyPatch()
    port = _free_port()
    for k in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ROLE_ARN",
              "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CA_BUNDLE", "AWS_ENDPOINT_URL_S3"):
        mp.delenv(k, raising=False)
    mp.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    mp.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    mp.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
    mp.setenv("AWS_CONFIG_FILE", "/nonexistent/aws-config")  # nothing from ~/.aws
    mp.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/aws-credentials")
    mp.setenv("AWS_MAX_ATTEMPTS", "1")  # botocore's own retries off: dataprep's (fetch.ATTEMPTS) are under test
    s3fs.S3FileSystem.clear_instance_cache()  # no client made before these variables were set
    werkzeug = logging.getLogger("werkzeug")
    level = werkzeug.level
    werkzeug.setLevel(logging.WARNING)  # a line per request otherwise
    server = Moto(port)
    server.start()
    try:
        boto3.client("s3").create_bucket(Bucket=BUCKET)
        yield server
    finally:
        server.stop()
        s3fs.S3FileSystem.clear_instance_cache()
        werkzeug.setLevel(level)
        mp.undo()


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """Every test stages under its own tmp directory: nothing touches ~/.cache."""
    d = tmp_path / "cache"
    monkeypatch.setenv("DATAPREP_CACHE_DIR", str(d))
    return d


@pytest.fixture(scope="module", autouse=True)
def _part_warnings():
    """A .part file a failed fetch left open would be closed when it is garbage, with a ResourceWarning in
    whichever test that happens: recorded here instead, for test_a_failed_fetch_closes_its_part_files."""
    seen: list[str] = []
    original = sys.unraisablehook

    def hook(u):
        if ".part'" in f"{u.object!r} {u.exc_value}":
            seen.append(repr(u.object))
        else:
            original(u)

    sys.unraisablehook = hook
    try:
        yield seen
        gc.collect()
    finally:
        sys.unraisablehook = original


@pytest.fixture
def unclosed_parts(_part_warnings) -> list[str]:
    """The unclosed .part files reported during this test."""
    _part_warnings.clear()
    return _part_warnings


class Remote:
    """A store under test: fresh URLs in it and direct access to its objects (through fsspec, as a
    process other than dataprep would change them)."""

    def __init__(self, kind: str, base: str):
        self.kind, self.base = kind, base

    def url(self, name: str = "p") -> str:
        return f"{self.base}/{name}"

    def _fs(self, url: str):
        fs, root = fsspec.core.url_to_fs(url)
        return fs, root.rstrip("/")

    def get(self, url: str, rel: str) -> bytes:
        fs, root = self._fs(url)
        return fs.cat_file(f"{root}/{rel}")

    def put(self, url: str, rel: str, data: bytes) -> None:
        fs, root = self._fs(url)
        fs.pipe_file(f"{root}/{rel}", data)

    def rm(self, url: str, rel: str) -> None:
        fs, root = self._fs(url)
        fs.rm_file(f"{root}/{rel}")

    def listing(self, url: str) -> set[str]:
        fs, root = self._fs(url)
        fs.invalidate_cache()
        return {p[len(root) + 1:] for p in fs.find(root)}

    def flip(self, url: str, rel: str, at: int | None = None) -> None:
        data = bytearray(self.get(url, rel))
        i = len(data) // 2 if at is None else at
        data[i] ^= 0xFF
        self.put(url, rel, bytes(data))


@pytest.fixture(params=STORES)
def store(request, tmp_path):
    kind = request.param
    if kind == "s3":
        request.getfixturevalue("moto")
        base = f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}"
    elif kind == "file":
        (tmp_path / "store").mkdir()
        base = f"file://{tmp_path}/store"
    else:
        base = f"memory://dataprep-tests-{uuid.uuid4().hex[:12]}"
    yield Remote(kind, base)
    if kind == "memory":
        fs = fsspec.filesystem("memory")
        if fs.exists(base[len("memory://"):]):
            fs.rm(base[len("memory://"):], recursive=True)


def _module_url(kind: str, request, tmp_path_factory, name: str) -> str:
    if kind == "s3":
        request.getfixturevalue("moto")
        return f"s3://{BUCKET}/{name}-{uuid.uuid4().hex[:8]}/p"
    if kind == "file":
        return f"file://{tmp_path_factory.mktemp(name)}/p"
    return f"memory://dataprep-tests-{name}-{uuid.uuid4().hex[:8]}/p"


@pytest.fixture(scope="module")
def _uploaded(request, local_pack, tmp_path_factory):
    """get(kind, variant): local_pack uploaded once a module to that store: "pristine", or "truncated" (its
    train/00000/images.npy cut to its first 10,000 bytes), for tests that only read it."""
    urls: dict[tuple[str, str], str] = {}

    def get(kind: str, variant: str = "pristine") -> str:
        if (kind, variant) not in urls:
            url = _module_url(kind, request, tmp_path_factory, variant)
            upload_pack(local_pack, url)
            if variant == "truncated":
                fs, root = fsspec.core.url_to_fs(url)
                fs.pipe_file(f"{root}/{TRUNCATED}", (local_pack / TRUNCATED).read_bytes()[:10000])
            urls[kind, variant] = url
        return urls[kind, variant]

    yield get
    for (kind, _), url in urls.items():
        if kind == "memory":
            fsspec.filesystem("memory").rm(url[len("memory://"):], recursive=True)


@pytest.fixture
def pristine(_uploaded):
    return _uploaded


TRUNCATED = "train/00000/images.npy"


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """3 classes x 8 train + 2 val PNGs of mixed sizes; image k's colour encodes k (train, then val)."""
    return write_tree(tmp_path_factory.mktemp("tree"), classes=3, per_class=8, val_per_class=2,
                      sizes=((40, 60), (64, 48), (50, 50)), kind="index", ext=".png")


def _build(tree: Path, out: Path, shard_size: int) -> Path:
    build_images(scan_imagenet(tree), out, BuildSettings(shard_size=shard_size, workers=1), ImageSettings(size=32, mode="raw"),
                 progress=None)
    return out


@pytest.fixture(scope="module")
def local_pack(tree, tmp_path_factory) -> Path:
    """The pack the CLI builds with --size 32 --mode raw --shard-size 8: train in 3 shards, val in 1."""
    return _build(tree, tmp_path_factory.mktemp("local") / "p", 8)


@pytest.fixture(scope="module")
def pack16(tree, tmp_path_factory) -> Path:
    """The same images in shards of 16: train in 2 shards."""
    return _build(tree, tmp_path_factory.mktemp("local16") / "p", 16)


@pytest.fixture(scope="module")
def ref(local_pack):
    return InMemoryImageDataset(local_pack, as_numpy=True)


class Reads:
    """Every Store.read: `calls` (tried) and `log` (answered: rel, start, end, bytes). `before(store, rel,
    start, end)` may raise; `after(store, rel, start, end, data)` may change what comes back."""

    def __init__(self):
        self.lock = threading.Lock()
        self.calls: list[tuple] = []
        self.log: list[tuple] = []
        self.before = self.after = None

    def clear(self) -> None:
        with self.lock:
            self.calls.clear()
            self.log.clear()

    def shard_reads(self) -> list[tuple]:
        return [r for r in self.log if r[0].endswith(".npy")]

    def bytes_of(self, rel: str | None = None) -> int:
        return sum(r[3] for r in self.log if r[0].endswith(".npy") and (rel is None or r[0] == rel))


@pytest.fixture
def reads(monkeypatch) -> Reads:
    r = Reads()
    real = store_mod.Store.read

    def read(self, rel, start=None, end=None):
        with r.lock:
            r.calls.append((rel, start, end))
        if r.before:
            r.before(self, rel, start, end)
        data = real(self, rel, start, end)
        if r.after:
            data = r.after(self, rel, start, end, data)
        with r.lock:
            r.log.append((rel, start, end, len(data)))
        return data

    monkeypatch.setattr(store_mod.Store, "read", read)
    return r


# ---------------------------------------------------------------------------------------------- helpers
def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def cli_build(tree: Path, url: str, *extra, shard_size: int = 8):
    return cli("build", "imagenet", tree, "--size", 32, "--mode", "raw", "--shard-size", shard_size, "-j", 1,
               "--no-progress", "--out", url, *extra)


def bad_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("BAD ")]


def pack_files(pack: Path) -> dict[str, bytes]:
    return {p.relative_to(pack).as_posix(): p.read_bytes() for p in sorted(pack.rglob("*")) if p.is_file()}


def shard_files(pack: Path, split: str = "train") -> dict[str, int]:
    """{object name: bytes} of a split's shard arrays a dataset holds, as the manifest records them: all
    but the audit's fingerprints (phashes, digests), which only `dataprep audit` reads."""
    from dataprep.images.field import AUDIT_FIELDS

    audit = {f"{f.name}.npy" for f in AUDIT_FIELDS.values()}
    m = json.loads((pack / "manifest.json").read_text())
    return {f"{split}/{s['name']}/{f}": int(rec["bytes"]) for s in m["splits"][split]["shards"]
            for f, rec in s["files"].items() if f.endswith(".npy") and f not in audit}


def assert_same_samples(ds, ref) -> None:
    """Sample by sample, image and label, the local pack's; and each image is the one its position encodes
    (so the comparison cannot pass on two packs that are wrong the same way)."""
    assert len(ds) == len(ref) == 24
    labels = []
    for i in range(len(ref)):
        (a, la), (b, lb) = ds[i], ref[i]
        a = a.permute(1, 2, 0).numpy() if hasattr(a, "permute") else np.asarray(a)
        assert a.shape == b.shape and np.array_equal(a, b), f"sample {i}"
        assert int(la) == int(lb), f"label of sample {i}"
        assert decode_index(a) == i
        labels.append(int(la))
    assert labels == sorted(labels) and set(labels) == {0, 1, 2}


def staged_shard_files(d: Path) -> list[str]:
    return sorted(p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file() and (p.suffix == ".npy" or p.name.endswith(".part")))


def lock_is_free(d: Path) -> bool:
    """Whether another descriptor can take `d/.lock` now (a load that waits on it would hang instead)."""
    fd = os.open(d / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def staged_dir(cache_dir: Path) -> Path:
    """The one staged pack directory under $DATAPREP_CACHE_DIR/remote (ram and shm loads)."""
    dirs = [p for p in (cache_dir / "remote").iterdir() if p.is_dir() and p.name != "builds" and not p.name.startswith("copy-")]
    assert len(dirs) == 1, dirs
    return dirs[0]


def set_block(monkeypatch, n: int) -> None:
    """fetch.BLOCK, the byte range a request asks for, for every fetch path (dataprep.remote.memory, which
    ram and shm loads fetch through, binds its own copy at import)."""
    monkeypatch.setattr(fetch, "BLOCK", n)
    try:
        from dataprep.remote import memory
    except ImportError:
        return
    if hasattr(memory, "BLOCK"):
        monkeypatch.setattr(memory, "BLOCK", n)


def cache_arg(cache: str, tmp_path: Path) -> str:
    return f"disk:{tmp_path / 'nvme'}" if cache == "disk" else cache


def staged(cache: str, cache_dir: Path, tmp_path: Path) -> Path:
    """The one staged directory of a load: the kept copy (disk:) or the private one under the cache dir."""
    if cache != "disk":
        return staged_dir(cache_dir)
    dirs = [p for p in (tmp_path / "nvme").iterdir() if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


# ---------------------------------------------------------------------------------------------- build, info, verify
def test_cli_build_to_the_store_then_info_verify_and_load(store, tree, local_pack, ref, cache_dir):
    url = store.url()
    r = cli_build(tree, url)
    assert r.exit_code == 0, r.output
    assert f"uploaded to {url}" in r.output and "manifest last" in r.output
    up = re.search(r"uploaded to \S+: (\d+) objects \((\d+) files the manifest records, as `dataprep info` counts them, "
                   r"(\d+) shard records, the manifest\)", r.output)
    assert up, r.output
    # the store holds exactly the pack the library builds with the same settings, byte for byte
    want = pack_files(local_pack)
    assert store.listing(url) == set(want)
    m_store, m_local = json.loads(store.get(url, "manifest.json")), json.loads(want["manifest.json"])
    assert [s["files"] for s in m_store["splits"]["train"]["shards"]] == [s["files"] for s in m_local["splits"]["train"]["shards"]]
    assert len(m_store["splits"]["train"]["shards"]) == 3
    builds = cache_dir / "remote" / "builds"
    assert not builds.exists() or not any(builds.iterdir()), "the staged build is removed once uploaded"

    r = cli("info", url)
    assert r.exit_code == 0, r.output
    assert f"pack:      {url}" in r.output and "split train: 24 samples in 3 shards" in r.output
    assert "objects, with their recorded sizes: all present" in r.output
    # the upload's figures add up to what the store holds, and its file count is the one info checks
    objects, files, records = map(int, up.groups())
    assert objects == len(store.listing(url)) == files + records + 1
    assert f"files:     {files:,} objects, with their recorded sizes" in r.output, r.output
    r = cli("verify", url)
    assert r.exit_code == 0, r.output
    assert r.output.startswith(f"ok: {url}: 4 shards") and "30 samples" in r.output

    assert_same_samples(InMemoryImageDataset(url, as_numpy=True), ref)


def test_build_to_a_url_refuses_other_formats(store, tree):
    r = cli_build(tree, store.url(), "--format", "hdf5")
    assert r.exit_code == 1 and "packs at URLs are npy packs" in r.output
    r = cli("convert", "/nonexistent", "--to", "hdf5", "--out", store.url("q"))
    assert r.exit_code == 1 and "packs at URLs are npy packs" in r.output


def test_verify_names_the_one_corrupt_object(store, local_pack):
    url = store.url()
    upload_pack(local_pack, url)
    r = cli("verify", url)
    assert r.exit_code == 0 and not bad_lines(r.output), r.output  # control: the pack is fine before the flip
    store.flip(url, "train/00001/images.npy")
    r = cli("info", url)  # info checks sizes only: one flipped byte keeps the size
    assert r.exit_code == 0, r.output
    r = cli("verify", url)
    assert r.exit_code == 1
    bad = bad_lines(r.output)
    assert len(bad) == 1, r.output
    assert bad[0].startswith(f"BAD {url}/train/00001/images.npy: ") and "corrupt" in bad[0]
    assert "FAILED" in r.output


def test_a_missing_object_is_named_by_info_verify_and_the_dataset(store, local_pack, reads, monkeypatch):
    url = store.url()
    upload_pack(local_pack, url)
    store.rm(url, "train/00002/labels.npy")
    r = cli("info", url)
    assert r.exit_code == 1
    assert bad_lines(r.output) == [f"BAD {url}/train/00002/labels.npy: missing"], r.output
    every = sum(len(s["files"]) for sp in read_manifest(local_pack)["splits"].values() for s in sp["shards"])
    assert f"1 of {every} files missing" in r.output  # info checks every shard file, the audit's too
    r = cli("verify", url)
    assert r.exit_code == 1
    bad = bad_lines(r.output)
    assert len(bad) == 1 and bad[0].startswith(f"BAD {url}/train/00002/labels.npy: ") and "missing" in bad[0], r.output
    reads.clear()
    backoff, sleep = [], time.sleep

    def counted(seconds):
        if sys._getframe(1).f_code is fetch.retried.__code__:
            backoff.append(seconds)
        sleep(seconds)

    monkeypatch.setattr(time, "sleep", counted)
    t0 = time.perf_counter()
    with pytest.raises(RemoteError, match="missing") as e:
        InMemoryImageDataset(url)
    took = time.perf_counter() - t0
    assert f"{url}/train/00002/labels.npy" in str(e.value)
    # a missing object is not retried with backoff (ATTEMPTS tries would sleep ~8 s): no backoff slept
    assert backoff == [] and len([c for c in reads.calls if c[0] == "train/00002/labels.npy"]) in (1, 2), backoff
    within(took, 3, "InMemoryImageDataset over a missing object")


# ---------------------------------------------------------------------------------------------- datasets
@pytest.mark.parametrize("cache", ["ram", "shm", "disk"])
def test_load_from_the_store_equals_the_local_pack(store, pristine, local_pack, ref, reads, cache, cache_dir, tmp_path):
    url = pristine(store.kind)
    mode = f"disk:{tmp_path / 'nvme'}" if cache == "disk" else cache
    want = shard_files(local_pack)
    reads.clear()
    ds = InMemoryImageDataset(url, cache=mode, as_numpy=True)
    assert_same_samples(ds, ref)
    # every byte of the split's shard files read once, nothing of the other split
    assert {r[0] for r in reads.shard_reads()} == set(want)
    assert reads.bytes_of() == sum(want.values())
    if cache == "disk":
        assert ds.pack.parent == tmp_path / "nvme" and ds.cache == "mmap"
        kept = {p.relative_to(ds.pack).as_posix(): p.read_bytes() for p in ds.pack.rglob("*.npy")}
        assert kept == {rel: (local_pack / rel).read_bytes() for rel in want}
        assert not list(ds.pack.rglob("*.part")) and not (ds.pack / "val").exists()
        again = InMemoryImageDataset(url, cache=mode, as_numpy=True)
        assert again.pack == ds.pack
        assert reads.bytes_of() == sum(want.values()), "a second disk: load fetches no shard file"
        assert [r[0] for r in reads.log[-1:]] == ["manifest.json"]  # ... only the manifest, to know the copy is current
        assert_same_samples(again, ref)
        del again
    else:
        assert ds.pack.parent == cache_dir / "remote"
        assert (ds.pack / "manifest.json").is_file() and (ds.pack / ".remote.json").is_file()
        assert staged_shard_files(ds.pack) == [], "ram/shm loads remove the staged shard files"
        if cache == "shm":
            assert ds._cached.segment.created  # this load filled the segment (with what it fetched)
            seg = ds.segment
    del ds
    gc.collect()
    if cache == "shm":
        assert not os.path.exists(seg)


def test_disk_copy_of_one_split_then_the_other(store, pristine, local_pack, reads, tmp_path):
    url = pristine(store.kind)
    mode = f"disk:{tmp_path / 'nvme'}"
    train = InMemoryImageDataset(url, cache=mode, as_numpy=True)
    reads.clear()
    val = InMemoryImageDataset(url, split="val", cache=mode, as_numpy=True)
    assert len(val) == 6 and [decode_index(val[i][0]) for i in range(6)] == list(range(24, 30))
    assert {r[0] for r in reads.shard_reads()} == set(shard_files(local_pack, "val"))  # train is not fetched again
    assert train.pack == val.pack and len(staged_shard_files(val.pack)) == len(shard_files(local_pack)) + len(shard_files(local_pack, "val"))


CACHES = ["ram", "disk"]  # the two fetch paths: straight into the cache, and through .part files into a kept copy


@pytest.mark.parametrize("cache", CACHES)
def test_a_load_interrupted_by_the_store_going_away(store, pristine, local_pack, ref, reads, monkeypatch, cache_dir,
                                                    tmp_path, request, cache):
    """The store goes away mid-fetch (S3: the moto server is stopped; file:// and memory://: every read fails
    from then on): the load fails naming an object of the store. Once the store is back the next load serves
    the right samples; with disk: it resumes, reading exactly the bytes not fetched yet (each object from
    where its .part ends), nothing of the objects already whole."""
    set_block(monkeypatch, SMALL)
    monkeypatch.setattr(fetch, "ATTEMPTS", 2)
    url = pristine(store.kind)
    mode = cache_arg(cache, tmp_path)
    want = shard_files(local_pack)
    target = "train/00001/images.npy"
    assert want[target] > 5 * SMALL
    first3, down = threading.Event(), threading.Event()
    got = []
    moto = request.getfixturevalue("moto") if store.kind == "s3" else None

    def after(st, rel, start, end, data):
        if rel == target and start < 3 * SMALL:
            got.append(start)
            if len(got) == 3:
                first3.set()
        return data

    def before(st, rel, start, end):
        if rel == target and start is not None and start >= 3 * SMALL and not down.is_set():
            first3.wait(10)  # the object's first three ranges are in: its .part holds exactly them
            down.set()
            if moto:
                moto.stop()
        if down.is_set() and not moto:
            raise RemoteError(f"{st.where(rel)}: cannot read it (ConnectionError: the store is down)")

    reads.before, reads.after = before, after
    try:
        with pytest.raises(RemoteError, match="cannot read it") as e:
            InMemoryImageDataset(url, as_numpy=True, cache=mode)
        assert e.value.args[0].startswith(f"{url}/train/") and "missing" not in str(e.value)
    finally:
        reads.before = reads.after = None
        if moto and moto.server is None:
            moto.start()
    assert down.is_set() and first3.is_set()
    d = staged(cache, cache_dir, tmp_path)
    assert lock_is_free(d)  # the failed load let go of it (else the load below would wait forever)
    parts = {p.relative_to(d).as_posix()[:-5]: p.stat().st_size for p in d.rglob("*.part")}
    whole = {rel: (d / rel).stat().st_size for rel in want if (d / rel).is_file()}
    if cache == "disk":
        assert parts[target] == 3 * SMALL, parts
        for rel, n in parts.items():  # a .part is a prefix of the object
            assert (d / f"{rel}.part").read_bytes() == (local_pack / rel).read_bytes()[:n]
    have = sum(parts.values()) + sum(whole.values())
    assert have < sum(want.values()) and (have > 0 or cache != "disk")

    if moto:  # moto's state is per process: a new server on the same port serves the same objects
        s3 = boto3.client("s3")
        key = url[len(f"s3://{BUCKET}/"):]
        survived = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=key + "/").get("Contents", [])]
        if len(survived) != len(pack_files(local_pack)):  # not so in some moto version: the same bytes again
            for rel, data in pack_files(local_pack).items():
                s3.put_object(Bucket=BUCKET, Key=f"{key}/{rel}", Body=data)
        assert s3.get_object(Bucket=BUCKET, Key=f"{key}/{target}")["Body"].read() == (local_pack / target).read_bytes()

    reads.clear()
    ds = InMemoryImageDataset(url, as_numpy=True, cache=mode)
    assert_same_samples(ds, ref)
    if cache == "disk":
        assert reads.bytes_of() == sum(want.values()) - have, "the resumed fetch reads only what was missing"
        assert not any(r[0] in whole for r in reads.shard_reads()), "finished objects are not fetched again"
        for rel, n in parts.items():
            assert min(r[1] for r in reads.shard_reads() if r[0] == rel) == n  # from where its .part ended
        assert not list(d.rglob("*.part")) and len(list(d.rglob("*.npy"))) == len(want)
    else:
        assert staged_shard_files(d) == []


@pytest.mark.parametrize("cache", CACHES)
def test_a_range_that_fails_once_is_retried(store, pristine, ref, reads, monkeypatch, tmp_path, cache):
    """A read that fails once (a reset connection) is tried again, that range alone."""
    set_block(monkeypatch, SMALL)
    monkeypatch.setattr(fetch, "ATTEMPTS", 2)
    url = pristine(store.kind)
    target = ("train/00002/images.npy", 2 * SMALL)
    failed = []

    def before(st, rel, start, end):
        if (rel, start) == target and not failed:
            failed.append(start)
            raise RemoteError(f"{st.where(rel)}: cannot read it (ConnectionResetError: injected hiccup)")

    reads.before = before
    ds = InMemoryImageDataset(url, as_numpy=True, cache=cache_arg(cache, tmp_path))
    assert failed
    assert_same_samples(ds, ref)
    assert len([c for c in reads.calls if c[:2] == target]) == 2
    assert reads.bytes_of(target[0]) == shard_files(ref.pack)[target[0]]  # the object whole, once: no refetch


@pytest.mark.parametrize("cache", CACHES)
def test_a_range_that_keeps_failing_is_an_error_naming_the_object(store, pristine, reads, monkeypatch, cache_dir,
                                                                  tmp_path, cache):
    """The control of the test above: with ATTEMPTS=1 the same hiccup is the error, naming the object by its
    URL (the retry is what saved that load). Many small ranges, each a little slow, so the object still has
    ranges queued when one of them fails."""
    set_block(monkeypatch, 1000)
    monkeypatch.setattr(fetch, "ATTEMPTS", 1)
    url = pristine(store.kind)
    target = ("train/00002/images.npy", 2 * 1000)

    def before(st, rel, start, end):
        if (rel, start) == target:
            raise RemoteError(f"{st.where(rel)}: cannot read it (ConnectionResetError: injected hiccup)")
        time.sleep(0.002)

    reads.before = before
    with pytest.raises(RemoteError, match="injected hiccup") as e:
        InMemoryImageDataset(url, cache=cache_arg(cache, tmp_path))
    assert str(e.value).startswith(f"{url}/{target[0]}: ")
    assert lock_is_free(staged(cache, cache_dir, tmp_path))


@pytest.mark.parametrize("cache", CACHES)
def test_shard_files_are_fetched_in_parallel(store, pristine, reads, tmp_path, cache):
    url = pristine(store.kind)
    lock, inflight, peak = threading.Lock(), [0], [0]

    def before(st, rel, start, end):
        if rel.endswith(".npy"):
            with lock:
                inflight[0] += 1
                peak[0] = max(peak[0], inflight[0])
            time.sleep(0.02)

    def after(st, rel, start, end, data):
        if rel.endswith(".npy"):
            with lock:
                inflight[0] -= 1
        return data

    reads.before, reads.after = before, after
    assert len(InMemoryImageDataset(url, cache=cache_arg(cache, tmp_path))) == 24
    assert peak[0] >= 4, peak


def test_redact_and_safe_take_secrets_out():
    from dataprep.remote.urls import redact, safe

    assert redact("s3://KEY:SECRET@bucket/x/y?X-Amz-Signature=abc#frag") == "s3://***@bucket/x/y"
    assert redact("az://container/p?sv=2020&sig=SAS") == "az://container/p"
    assert redact("s3://bucket/x") == "s3://bucket/x" and redact("/local/path") == "/local/path"  # nothing to take out
    url = "s3://KEY:SECRET@bucket/x"
    text = safe(ValueError(f"{url}/manifest.json: denied; aws_secret_access_key=SECRET token=TOK&a=1"), url)
    assert "SECRET" not in text and "TOK" not in text
    assert text.startswith("ValueError: s3://***@bucket/x/manifest.json: denied")


def test_a_failed_load_releases_its_lock(store, local_pack, tmp_path):
    url = store.url()
    upload_pack(local_pack, url)
    store.rm(url, "train/00000/images.npy")
    with pytest.raises(RemoteError, match="missing"):
        InMemoryImageDataset(url, cache=cache_arg("disk", tmp_path))
    d = staged("disk", None, tmp_path)
    assert lock_is_free(d), "the staged directory's lock is still held after the load failed: the next load " \
                            "in this process (or any other on the node) waits forever"


def test_a_failed_fetch_closes_its_part_files(store, local_pack, reads, monkeypatch, tmp_path, unclosed_parts):
    set_block(monkeypatch, 1000)  # ~30 ranges an images.npy: many still queued when one object fails
    url = store.url()
    upload_pack(local_pack, url)
    store.rm(url, "train/00000/labels.npy")
    reads.before = lambda st, rel, start, end: time.sleep(0.005) if rel.endswith("images.npy") else None
    with pytest.raises(RemoteError, match="missing"):
        InMemoryImageDataset(url, cache=cache_arg("disk", tmp_path))
    d = staged("disk", None, tmp_path)
    gc.collect()  # an object's .part left open would be closed (and reported) now
    assert list(d.rglob("*.part"))  # control: the failure left partial objects behind
    assert not unclosed_parts, unclosed_parts[:3]


@pytest.mark.parametrize("cache", CACHES)
def test_an_object_corrupt_in_transit_once_is_fetched_again(store, pristine, local_pack, ref, reads, monkeypatch,
                                                            tmp_path, cache):
    set_block(monkeypatch, SMALL)
    url = pristine(store.kind)
    target = "train/00001/images.npy"
    flipped = []

    def after(st, rel, start, end, data):
        if rel == target and start == SMALL and not flipped:
            flipped.append(start)
            return data[:10] + bytes([data[10] ^ 0xFF]) + data[11:]
        return data

    reads.after = after
    ds = InMemoryImageDataset(url, as_numpy=True, cache=cache_arg(cache, tmp_path))
    assert flipped
    assert_same_samples(ds, ref)
    want = shard_files(local_pack)
    assert reads.bytes_of(target) == 2 * want[target]  # fetched again, whole, once
    assert all(reads.bytes_of(rel) == n for rel, n in want.items() if rel != target)


@pytest.mark.parametrize("cache", CACHES)
def test_an_object_corrupt_every_time_is_an_error_naming_it(store, pristine, reads, monkeypatch, tmp_path, cache):
    set_block(monkeypatch, SMALL)
    url = pristine(store.kind)
    target = "train/00002/shapes.npy"

    def after(st, rel, start, end, data):
        return data[:-1] + bytes([data[-1] ^ 1]) if rel == target else data

    reads.after = after
    with pytest.raises(RemoteError) as e:
        InMemoryImageDataset(url, cache=cache_arg(cache, tmp_path))
    msg = str(e.value)
    assert msg.startswith(f"{url}/{target}: corrupt") and "fetched twice" in msg
    assert len([r for r in reads.log if r[0] == target]) == 2  # one range, two tries: no more
    assert "00000" not in msg and "00001" not in msg and "images" not in msg


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("ranges", ["one-range", "many-ranges"])
def test_a_truncated_object_is_named_truncated(store, _uploaded, local_pack, monkeypatch, ranges, request, tmp_path, cache):
    if ranges == "many-ranges":  # S3 answers a range that starts past the end 416: still "truncated", at once
        set_block(monkeypatch, SMALL)
    monkeypatch.setattr(fetch, "ATTEMPTS", 2)
    url = _uploaded(store.kind, "truncated")
    size = (local_pack / TRUNCATED).stat().st_size
    assert len(store.get(url, TRUNCATED)) == 10000 < size
    with pytest.raises(RemoteError) as e:
        InMemoryImageDataset(url, cache=cache_arg(cache, tmp_path))
    assert str(e.value).startswith(f"{url}/{TRUNCATED}: truncated") and "fetched twice" in str(e.value)
    if cache == "disk" and ranges == "one-range":  # info and verify do not depend on the dataset's: once a store
        r = cli("info", url)
        assert r.exit_code == 1 and bad_lines(r.output) == [f"BAD {url}/{TRUNCATED}: 10,000 bytes, the manifest records {size:,}"]
        r = cli("verify", url)
        assert r.exit_code == 1 and len(bad_lines(r.output)) == 1 and f"{url}/{TRUNCATED}: truncated" in r.output


@pytest.mark.parametrize("cache", CACHES)
def test_a_truncated_object_s_message_counts_the_bytes_it_holds(store, _uploaded, local_pack, monkeypatch, tmp_path, cache):
    monkeypatch.setattr(fetch, "ATTEMPTS", 2)
    url = _uploaded(store.kind, "truncated")
    size = (local_pack / TRUNCATED).stat().st_size
    with pytest.raises(RemoteError, match="truncated") as e:
        InMemoryImageDataset(url, cache=cache_arg(cache, tmp_path))
    assert f"truncated: 10,000 of the {size:,} bytes" in str(e.value)


# ---------------------------------------------------------------------------------------------- overwrite, convert
def test_out_an_existing_pack_is_refused_and_overwrite_leaves_no_stale_objects(store, tree, local_pack, pack16, ref):
    url = store.url()
    assert cli_build(tree, url).exit_code == 0
    before = store.listing(url)
    manifest = store.get(url, "manifest.json")
    assert "train/00002/images.npy" in before
    r = cli_build(tree, url, shard_size=16)
    assert r.exit_code == 1 and "a pack is there already" in r.output and "--overwrite" in r.output
    assert store.listing(url) == before and store.get(url, "manifest.json") == manifest  # left as it was

    r = cli_build(tree, url, "--overwrite", shard_size=16)
    assert r.exit_code == 0, r.output
    after = store.listing(url)
    assert after == set(pack_files(pack16)), sorted(after ^ set(pack_files(pack16)))
    assert not any(rel.startswith("train/00002/") for rel in after)
    m = json.loads(store.get(url, "manifest.json"))
    assert len(m["splits"]["train"]["shards"]) == 2
    assert cli("verify", url).exit_code == 0
    assert_same_samples(InMemoryImageDataset(url, as_numpy=True), ref)


def test_upload_pack_refuses_an_existing_pack_unless_overwrite(store, local_pack, pack16):
    url = store.url()
    upload_pack(local_pack, url)
    with pytest.raises(DataprepError, match="a pack is there already"):
        upload_pack(pack16, url)
    assert store.listing(url) == set(pack_files(local_pack))
    upload_pack(pack16, url, overwrite=True)
    assert store.listing(url) == set(pack_files(pack16))


def test_convert_url_to_hdf5_and_back_to_a_url(store, pristine, local_pack, ref, tmp_path):
    url, back = pristine(store.kind), store.url("back")
    h5 = tmp_path / "p.h5"
    r = cli("convert", url, "--to", "hdf5", "--out", h5)
    assert r.exit_code == 0, r.output
    assert h5.is_file() and cli("verify", h5).exit_code == 0
    assert_same_samples(InMemoryImageDataset(h5, as_numpy=True), ref)
    r = cli("convert", h5, "--to", "npy", "--out", back)
    assert r.exit_code == 0, r.output
    r = cli("verify", back)
    assert r.exit_code == 0 and r.output.startswith(f"ok: {back}: 4 shards"), r.output
    assert "manifest.json" in store.listing(back)
    assert_same_samples(InMemoryImageDataset(back, as_numpy=True), ref)
    r = cli("convert", h5, "--to", "npy", "--out", back)
    assert r.exit_code == 1 and "a pack is there already" in r.output


def test_convert_between_a_url_and_a_local_npy_pack(store, pristine, local_pack, ref, tmp_path):
    url = pristine(store.kind)
    r = cli("convert", url, "--to", "npy", "--out", tmp_path / "copy")
    assert r.exit_code == 0, r.output
    got = pack_files(tmp_path / "copy")
    assert {k: v for k, v in got.items() if k.endswith(".npy")} == {k: v for k, v in pack_files(local_pack).items() if k.endswith(".npy")}
    up = store.url("up")
    r = cli("convert", local_pack, "--to", "npy", "--out", up)  # a local npy pack is uploaded as it is
    assert r.exit_code == 0, r.output
    assert store.listing(up) == set(pack_files(local_pack))
    assert cli("verify", up).exit_code == 0


# ---------------------------------------------------------------------------------------------- other kinds
@pytest.fixture(scope="module")
def token_pack(tmp_path_factory) -> Path:
    from dataprep.tokens.tokenize import TokenizeSettings, tokenize

    base = tmp_path_factory.mktemp("tokens")
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(300)]
    (base / "a.txt").write_text("\n".join(" ".join(rng.choice(words, 30)) for _ in range(300)))
    tokenize([str(base / "a.txt")], base / "p", TokenizeSettings(split="line", shard_tokens=3000, chunk_bytes=4000), train_bpe_vocab=400)
    return base / "p"


@pytest.mark.parametrize("cache", ["ram", "disk"])
def test_token_pack_through_token_dataset(store, token_pack, cache, tmp_path, reads):
    from dataprep.tokens.dataset import TokenDataset

    url = store.url()
    upload_pack(token_pack, url)
    m = json.loads((token_pack / "manifest.json").read_text())
    assert len(m["splits"]["train"]["shards"]) > 2 and "tokenizer.json" in (m.get("attachments") or {})
    local = TokenDataset(token_pack, context=16, mode="sequential")
    mode = f"disk:{tmp_path / 'nvme'}" if cache == "disk" else cache
    ds = TokenDataset(url, context=16, mode="sequential", cache=mode)
    assert len(ds) == len(local) > 100
    assert np.array_equal(np.asarray(ds.data.tokens), np.asarray(local.data.tokens))
    for i in (0, 1, len(ds) // 2, len(ds) - 1):
        assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(ds[i], local[i]))
    text = "w1 w22 w133"
    assert ds.tokenizer.encode(text).ids == local.tokenizer.encode(text).ids  # the attachment came along, checked
    assert "tokenizer.json" in {r[0] for r in reads.log}


def test_table_pack_through_tabular_dataset(store, tmp_path):
    from dataprep.tables.build import build_table
    from dataprep.tables.columns import TableSettings
    from dataprep.tables.dataset import TabularDataset

    build_table([str(_table_csv(tmp_path / "t.csv"))], tmp_path / "tp", TableSettings(target="label"), {})
    url = store.url()
    upload_pack(tmp_path / "tp", url)
    local, ds = TabularDataset(tmp_path / "tp"), TabularDataset(url)
    assert len(ds) == len(local) > 10
    for i in range(len(local)):
        assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(ds[i], local[i]))
    assert len({float(local[i][0][0]) for i in range(len(local))}) > 10  # rows differ: the comparison can fail


def _table_csv(path: Path) -> Path:
    rng = np.random.default_rng(1)
    path.write_text("a,b,label\n" + "".join(f"{i},{rng.normal():.6f},{i % 3}\n" for i in range(60)))
    return path


def test_tokenize_and_table_commands_publish_to_a_url(store, tmp_path):
    from dataprep.tables.dataset import TabularDataset
    from dataprep.tokens.dataset import TokenDataset

    text = tmp_path / "a.txt"
    text.write_text("\n".join(f"w{i % 50} w{(i * 7) % 50} w{(i * 13) % 50}" for i in range(400)))
    r = cli("tokenize", text, "--out", store.url("tok"), "--train-bpe", 300, "--split-docs", "line")
    assert r.exit_code == 0, r.output
    assert f"pack: {store.url('tok')}" in r.output and "uploaded to" in r.output
    r = cli("tokenize", text, "--out", tmp_path / "tok", "--train-bpe", 300, "--split-docs", "line")
    assert r.exit_code == 0, r.output
    a, b = TokenDataset(store.url("tok"), context=8, mode="sequential"), TokenDataset(tmp_path / "tok", context=8, mode="sequential")
    assert len(a) == len(b) > 50 and np.array_equal(np.asarray(a.data.tokens), np.asarray(b.data.tokens))

    csv = _table_csv(tmp_path / "t.csv")
    r = cli("table", csv, "--out", store.url("tab"), "--target", "label")
    assert r.exit_code == 0, r.output
    assert f"pack: {store.url('tab')}" in r.output
    assert cli("verify", store.url("tab")).exit_code == 0
    assert len(TabularDataset(store.url("tab"))) == 60


# ---------------------------------------------------------------------------------------------- credentials
def test_credentials_never_appear_in_output_manifests_or_errors(moto, tree, cache_dir, capfd, tmp_path):
    assert os.environ["AWS_SECRET_ACCESS_KEY"] == SECRET  # the credential in use is the one searched for
    url = f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}/p"
    said = []
    r = cli_build(tree, url)
    assert r.exit_code == 0 and "uploaded to" in r.output
    said.append(r.output)
    for args in (["info", url], ["info", url, "--json"], ["verify", url]):
        r = cli(*args)
        assert r.exit_code == 0, r.output
        said.append(r.output)
    ds = InMemoryImageDataset(url, progress=True, cache=f"disk:{tmp_path / 'nvme'}")
    staged = json.loads((ds.pack / ".remote.json").read_text())
    assert staged["url"] == url and staged["shown"] == url
    ds2 = InMemoryImageDataset(url, progress=True)
    assert len(ds) == len(ds2) == 24
    # a missing object: the errors of info, verify and a load
    fs, root = fsspec.core.url_to_fs(url)
    fs.rm_file(f"{root}/train/00001/images.npy")
    for args in (["info", url], ["verify", url]):
        r = cli(*args)
        assert r.exit_code == 1 and "missing" in r.output
        said.append(r.output)
    with pytest.raises(RemoteError, match="missing") as e:
        InMemoryImageDataset(url, cache=f"disk:{tmp_path / 'nvme2'}")
    said.append(str(e.value))
    with pytest.raises(PackError) as e:  # and a URL where no pack is
        InMemoryImageDataset(url + "-nothing-here")
    said.append(str(e.value))
    out, err = capfd.readouterr()
    said += [out, err]
    assert all(said[:-2]) and "loading" in err  # something was said everywhere searched (the loads' progress too)
    for s in said:
        assert SECRET not in s and KEY_ID not in s
    assert SECRET.encode() not in fs.cat_file(f"{root}/manifest.json")
    files = [p for p in cache_dir.rglob("*") if p.is_file()] + [p for p in (tmp_path / "nvme").rglob("*") if p.is_file()]
    assert any(p.name == ".remote.json" for p in files) and any(p.name == "manifest.json" for p in files)
    for p in files:
        assert SECRET.encode() not in p.read_bytes(), p


@pytest.mark.parametrize("kind", STORES)
def test_a_secret_in_the_url_never_shows_in_errors(kind, request, tmp_path):
    secret = "UsErInFo-SeCrEt-0451"
    if kind == "s3":
        request.getfixturevalue("moto")
        url = f"s3://{KEY_ID}:{secret}@{BUCKET}/nothing"
    elif kind == "file":
        url = f"file://user:{secret}@{tmp_path}/nothing"
    else:
        url = f"memory://user:{secret}@nowhere-{uuid.uuid4().hex[:8]}/nothing"
    with pytest.raises(DataprepError) as e:
        InMemoryImageDataset(url)
    assert "***@" in str(e.value) and secret not in str(e.value)
    for args in (["info", url], ["verify", url]):
        r = cli(*args)
        assert r.exit_code == 1 and "***@" in r.output and secret not in r.output, r.output


def _secret_memory_pack(local_pack) -> tuple[str, str]:
    """A pack at a memory:// URL with user info (memory:// keeps it in the path, so the URL works)."""
    secret = "MeMoRy-SeCrEt-" + uuid.uuid4().hex[:8]
    url = f"memory://user:{secret}@bucket-{uuid.uuid4().hex[:8]}/p"
    upload_pack(local_pack, url)
    return url, secret


def test_a_url_with_a_secret_is_not_kept_in_the_staged_origin_or_shown(local_pack, ref, cache_dir, capfd):
    url, secret = _secret_memory_pack(local_pack)
    ds = InMemoryImageDataset(url, as_numpy=True)
    assert_same_samples(ds, ref)
    staged = json.loads((ds.pack / ".remote.json").read_text())
    assert staged["url"] is None and staged["shown"] == "memory://***@" + url.split("@", 1)[1]
    for args in (["info", url], ["verify", url]):
        r = cli(*args)
        assert r.exit_code == 0 and "memory://***@" in r.output and secret not in r.output, r.output
    out, err = capfd.readouterr()
    assert secret not in out + err
    for p in cache_dir.rglob("*"):
        if p.is_file():
            assert secret.encode() not in p.read_bytes(), p


def test_convert_output_hides_a_secret_in_the_url(local_pack, tmp_path):
    url, secret = _secret_memory_pack(local_pack)
    r = cli("convert", url, "--to", "npy", "--out", tmp_path / "copy")
    assert r.exit_code == 0, r.output
    assert secret not in r.output, r.output


def test_build_output_hides_a_secret_in_the_url(tree, tmp_path):
    secret = "BuIlD-SeCrEt-" + uuid.uuid4().hex[:8]
    url = f"memory://user:{secret}@bucket-{uuid.uuid4().hex[:8]}"
    text = tmp_path / "a.txt"
    text.write_text("\n".join(f"w{i % 50} w{(i * 7) % 50}" for i in range(200)))
    for r in (cli_build(tree, f"{url}/img"),
              cli("tokenize", text, "--out", f"{url}/tok", "--train-bpe", 300, "--split-docs", "line"),
              cli("table", _table_csv(tmp_path / "t.csv"), "--out", f"{url}/tab", "--target", "label")):
        assert r.exit_code == 0 and "pack: memory://***@" in r.output, r.output
        assert secret not in r.output, r.output


# ---------------------------------------------------------------------------------------------- URL forms
@pytest.mark.parametrize("url", ["s3://bucket/x", "memory://bucket/x", "file:///tmp/x"])
def test_a_url_folded_by_pathlib_is_refused(url, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    folded = Path(url)
    assert str(folded) != url and "//" not in str(folded)
    with pytest.raises(DataprepError, match="lost its '//'") as e:
        InMemoryImageDataset(folded)
    assert url in str(e.value)  # says what to pass instead
    r = cli("info", folded)
    assert r.exit_code == 1 and "lost its '//'" in r.output
    # negative control: a real local directory named like the scheme is a local path, not a URL
    (tmp_path / str(folded).split("/")[0]).mkdir()
    assert is_url(folded) is False
    assert is_url(url) is True


@pytest.mark.parametrize("url, extra", [("gs://bucket/x", "gcs"), ("gcs://bucket/x", "gcs"), ("az://container/x", "azure"),
                                        ("abfs://container/x", "azure")])
def test_a_scheme_without_its_backend_names_the_extra(url, extra):
    module = {"gcs": "gcsfs", "azure": "adlfs"}[extra]
    try:
        __import__(module)
        pytest.skip(f"{module} is installed here: its scheme has a backend")
    except ImportError:
        pass
    want = f"pip install 'dataprep[{extra}]'"
    with pytest.raises(DataprepError) as e:
        InMemoryImageDataset(url)
    assert want in str(e.value) and not isinstance(e.value, RemoteError)
    r = cli("info", url)
    assert r.exit_code == 1 and want in r.output


def test_an_unknown_scheme_and_wrong_cache_modes(local_pack, store, pristine):
    with pytest.raises(DataprepError, match="no fsspec backend knows nosuchfs://"):
        InMemoryImageDataset("nosuchfs://bucket/x")
    url = pristine(store.kind)
    with pytest.raises(DataprepError, match="'ram', 'shm' or 'disk:DIR'"):
        InMemoryImageDataset(url, cache="mmap")
    with pytest.raises(DataprepError, match="names the directory"):
        InMemoryImageDataset(url, cache="disk:")
    with pytest.raises(DataprepError, match="is local already"):
        InMemoryImageDataset(local_pack, cache="disk:/tmp/x")
    assert len(InMemoryImageDataset(url, cache="ram")) == 24  # control: the URL itself is fine


# ---------------------------------------------------------------------------------------------- a separate process
@pytest.mark.parametrize("kind", ["s3", "file", pytest.param("memory", marks=pytest.mark.skip(
    reason="a memory:// store lives in one process: another process sees none of its objects"))])
def test_verify_in_a_separate_process(kind, request, local_pack, tmp_path):
    if kind == "s3":
        request.getfixturevalue("moto")
        url = f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}/p"
    else:
        url = f"file://{tmp_path}/store/p"
    upload_pack(local_pack, url)
    env = {**os.environ, "DATAPREP_CACHE_DIR": str(tmp_path / "cache2")}
    p = subprocess.run([sys.executable, "-m", "dataprep", "verify", url], capture_output=True, text=True, env=env, timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"ok: {url}: 4 shards") and SECRET not in p.stdout + p.stderr


# -- what an independent review found (each failed before its fix) -----------------------------------------
def _mem_url() -> str:
    return f"memory://review-{uuid.uuid4().hex[:8]}/p"


def test_a_prefix_holding_other_objects_is_never_published_to_nor_cleaned(local_pack):
    import fsspec

    from dataprep.errors import PackExistsError

    url = _mem_url()
    fs = fsspec.filesystem("memory")
    fs.pipe(url[len("memory://"):] + "/README.txt", b"keep me")
    for overwrite in (False, True):
        with pytest.raises(PackExistsError, match="not a dataprep pack"):
            upload_pack(local_pack, url, overwrite=overwrite)
    assert fs.cat(url[len("memory://"):] + "/README.txt") == b"keep me"
    empty = _mem_url()
    upload_pack(local_pack, empty)  # negative control: an empty prefix takes the pack
    assert fs.exists(empty[len("memory://"):] + "/manifest.json")


def test_an_attachment_name_that_is_a_path_is_refused(local_pack, tmp_path):
    import shutil as sh

    bad = tmp_path / "bad"
    sh.copytree(local_pack, bad)
    m = json.loads((bad / "manifest.json").read_text())
    m["attachments"] = {"../../escaped.sh": {"bytes": 3, "sha256": "0" * 64}}
    (bad / "manifest.json").write_text(json.dumps(m))
    url = _mem_url()
    upload_pack(local_pack, url)
    import fsspec

    fsspec.filesystem("memory").pipe(url[len("memory://"):] + "/manifest.json", json.dumps(m).encode())
    with pytest.raises(PackError, match="attached file"):
        InMemoryImageDataset(url)
    assert not (tmp_path.parent / "escaped.sh").exists()


def test_a_record_claiming_far_more_bytes_than_its_shape_is_refused_before_fetching(local_pack, reads, tmp_path):
    url = _mem_url()
    upload_pack(local_pack, url)
    import fsspec

    fs = fsspec.filesystem("memory")
    m = json.loads(fs.cat(url[len("memory://"):] + "/manifest.json"))
    rec = m["splits"]["train"]["shards"][0]["files"]["labels.npy"]
    rec["bytes"] = 1 << 42
    fs.pipe(url[len("memory://"):] + "/manifest.json", json.dumps(m).encode())
    for cache in ("ram", f"disk:{tmp_path / 'copy'}"):
        with pytest.raises(RemoteError, match="unusable"):
            InMemoryImageDataset(url, cache=cache)


def test_a_staged_build_missing_a_file_publishes_no_manifest(local_pack, tmp_path):
    import shutil as sh

    from dataprep.remote.upload import Publisher, claim

    staged = tmp_path / "staged"
    sh.copytree(local_pack, staged)
    (staged / "train" / "00001" / "images.npy").unlink()  # a Dask worker wrote it elsewhere
    url = _mem_url()
    pub = Publisher(staged, claim(url, False))
    with pytest.raises(RemoteError, match="does not hold it"):
        pub.finish()
    import fsspec

    assert not fsspec.filesystem("memory").exists(url[len("memory://"):] + "/manifest.json")


def test_a_shard_rebuilt_after_its_upload_is_uploaded_again(local_pack, tmp_path):
    import shutil as sh
    import time as t

    import fsspec

    from dataprep.remote.upload import Publisher, claim

    staged = tmp_path / "staged"
    sh.copytree(local_pack, staged)
    url = _mem_url()
    pub = Publisher(staged, claim(url, False))
    pub._scan()  # what the watcher sends while the build runs
    pub._wait()
    target = staged / "train" / "00002" / "labels.npy"
    good = target.read_bytes()
    t.sleep(0.01)
    target.write_bytes(good)  # the same bytes, a new file (a resumed build's rebuild)
    os.utime(target, ns=(t.time_ns(), t.time_ns()))
    before = pub._sent["train/00002/labels.npy"][0]
    pub.finish()
    assert pub._sent["train/00002/labels.npy"][0] != before  # sent again
    assert fsspec.filesystem("memory").cat(url[len("memory://"):] + "/train/00002/labels.npy") == good


def test_chained_urls_are_urls_and_unknown_backends_say_what_to_install(tmp_path, monkeypatch):
    from dataprep.remote.urls import is_url, open_store, redact

    monkeypatch.chdir(tmp_path)
    assert is_url("simplecache::s3://bucket/x") and is_url("memory://b/x") and not is_url("simplecache")
    assert redact("simplecache::s3://K:S@bucket/x?sig=1") == "simplecache::s3://***@bucket/x"
    try:
        import paramiko  # noqa: F401
    except ImportError:
        with pytest.raises(DataprepError) as e:
            open_store("sftp://host/x")
        assert "dataprep[" not in str(e.value) and "sftp://" in str(e.value)  # no extra that does not exist


def test_plan_takes_a_url(local_pack):
    url = _mem_url()
    upload_pack(local_pack, url)
    here = json.loads(cli("plan", str(local_pack), "--json", "--ram-per-node", "1G").output)
    there = json.loads(cli("plan", url, "--json", "--ram-per-node", "1G").output)
    assert there["cache_bytes"] == here["cache_bytes"] > 0 and there["partition"] == here["partition"]
