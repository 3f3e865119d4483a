"""Trust: kill -9 and resume, a full disk, Ctrl-C, flipped bytes, and the bad-input suite.

Builds that must be interrupted run with a hook that makes the worker reading one source wait on a
FIFO until the test decides, so "mid-way" is a state the test controls, not a race against the clock.
(The source itself stays a regular file: a FIFO among the sources is skipped as "not a regular file".)
"""
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from dataprep.cli import main
from dataprep.images.dataset import InMemoryImageDataset
from dataprep.pack.backends import read_manifest
from dataprep.synthetic import write_tree

SHARDS = 16  # 4 classes x 8 images, 2 per shard


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def tree(tmp_path):
    return write_tree(tmp_path / "src", classes=4, per_class=8, sizes=((96, 128), (120, 90))) / "train"


def build_args(src, out, *extra):
    return ["build", "folder", src, "--out", out, "--size", 64, "--shard-size", 2, "-j", 2, "--no-progress", *extra]


# Runs the CLI with read_source (sources/listing.py) patched: reading the plugged source first waits on the plug's FIFO (forked
# build workers inherit the patch).
STALLED_CLI = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (a background job inherits SIGINT ignored)
import dataprep.sources.listing as process  # the one reader of source files
victim, fifo, real = os.environ.get("DATAPREP_TEST_VICTIM"), os.environ.get("DATAPREP_TEST_PLUG"), process.read_source
def read_source(path, *args, **kw):
    if victim and os.path.samefile(path, victim):
        with open(fifo, "rb") as f:
            f.read()
    return real(path, *args, **kw)
process.read_source = read_source
from dataprep.cli import main
main(sys.argv[1:], prog_name="dataprep")
"""


def start(args, plugged: tuple[Path, Path] | None = None, **kw):
    env = {**os.environ, **({"DATAPREP_TEST_VICTIM": str(plugged[0]), "DATAPREP_TEST_PLUG": str(plugged[1])} if plugged else {})}
    return subprocess.Popen([sys.executable, "-c", STALLED_CLI, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, env=env, **kw)


def finished_shards(out: Path) -> dict[str, int]:
    d = out / "train"
    return {p.name: p.stat().st_ino for p in d.iterdir() if p.name.isdigit()} if d.is_dir() else {}


def wait_until_stable(out: Path, want: int, timeout=60) -> dict[str, int]:
    t0 = time.time()
    while time.time() - t0 < timeout:
        done = finished_shards(out)
        if len(done) >= want:
            return done
        time.sleep(0.05)
    raise AssertionError(f"only {len(finished_shards(out))} shards finished in {timeout}s")


def plug(src: Path) -> tuple[Path, Path]:
    """Choose one image (in shard 11 of 16) whose reading will wait on a FIFO beside the tree; return both."""
    victim = sorted(src.rglob("*.JPEG"))[22]
    fifo = src.parent / "plug.fifo"
    os.mkfifo(fifo)
    return victim, fifo


def unplug(plugged: tuple[Path, Path]) -> None:
    plugged[1].unlink()


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def test_kill9_then_resume_is_byte_identical(tree, tmp_path):
    assert cli(*build_args(tree, tmp_path / "ref")).exit_code == 0
    plugged = plug(tree)
    p = start(build_args(tree, tmp_path / "out"), plugged)
    before = wait_until_stable(tmp_path / "out", SHARDS - 1)  # everything but the plugged shard
    os.killpg(p.pid, signal.SIGKILL)  # the whole tree: driver and workers
    p.communicate(timeout=10)
    assert not (tmp_path / "out" / "manifest.json").exists()
    unplug(plugged)
    r = cli(*build_args(tree, tmp_path / "out"))
    assert r.exit_code == 1 and "--resume" in r.output  # no silent reuse without asking
    r = cli(*build_args(tree, tmp_path / "out", "--resume"))
    assert r.exit_code == 0, r.output
    rebuilt = SHARDS - len(before)
    assert f"resumed: {len(before)} of {SHARDS} shards were finished and intact, {rebuilt} built" in r.output
    assert rebuilt <= 2 * 2  # at most the shards in flight (the engine queues 2 per worker)
    after = finished_shards(tmp_path / "out")
    assert all(after[name] == ino for name, ino in before.items())  # finished shards were not rewritten
    ref, got = read_manifest(tmp_path / "ref"), read_manifest(tmp_path / "out")
    assert json.dumps(ref["splits"]) == json.dumps(got["splits"])  # every array's sha256 is the same
    assert not list((tmp_path / "out" / "train").glob(".tmp-*"))


def test_resume_rebuilds_a_damaged_shard(tree, tmp_path):
    out = tmp_path / "out"
    assert cli(*build_args(tree, out)).exit_code == 0
    ref = read_manifest(out)
    f = out / "train" / "00003" / "images.npy"
    raw = bytearray(f.read_bytes())
    raw[-1] ^= 1
    f.write_bytes(bytes(raw))
    r = cli(*build_args(tree, out, "--resume"))
    assert r.exit_code == 0 and f"resumed: {SHARDS - 1} of {SHARDS} shards" in r.output
    assert json.dumps(read_manifest(out)["splits"]) == json.dumps(ref["splits"])


def test_full_disk_fails_clearly_then_resume_completes(tree, tmp_path):
    out = tmp_path / "out"

    def small_disk():
        resource.setrlimit(resource.RLIMIT_FSIZE, (1500, 1500))  # enough for offsets, too little for pixels
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG, as from a full disk, not a signal

    p = start(build_args(tree, out, "--mode", "raw"), preexec_fn=small_disk)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 1
    assert "cannot write shard" in err and "--resume" in err and "train/000" in err
    assert not (out / "manifest.json").exists() and not list((out / "train").glob(".tmp-*"))
    r = cli(*build_args(tree, out, "--mode", "raw", "--resume"))
    assert r.exit_code == 0, r.output
    assert len(InMemoryImageDataset(out)) == 32


def test_ctrl_c_stops_everything_and_says_how_to_resume(tree, tmp_path):
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    plugged = plug(tree)
    out = tmp_path / "out"
    p = start(build_args(tree, out), plugged)
    wait_until_stable(out, SHARDS - 1)
    os.killpg(p.pid, signal.SIGINT)  # what a terminal sends to the foreground group
    _, err = p.communicate(timeout=60)  # it must exit; how fast is not the point (at load 6 the whole test takes 25-37 s)
    assert p.returncode == 130 and "--resume" in err
    deadline = time.time() + 5
    while not group_gone(p.pid) and time.time() < deadline:
        time.sleep(0.05)
    assert group_gone(p.pid), "a worker outlived the build"
    assert not list((out / "train").glob(".tmp-*")) and not (out / "manifest.json").exists()
    assert len(finished_shards(out)) == SHARDS - 1
    if os.path.isdir("/dev/shm"):
        assert set(os.listdir("/dev/shm")) <= shm_before  # no semaphore or segment left behind
    unplug(plugged)
    assert cli(*build_args(tree, out, "--resume")).exit_code == 0


def test_verify_names_a_flipped_shard(tree, tmp_path):
    out = tmp_path / "out"
    assert cli(*build_args(tree, out)).exit_code == 0
    r = cli("verify", out, "--decode")
    assert r.exit_code == 0 and f"{SHARDS} shards" in r.output and "32 images decoded" in r.output
    f = out / "train" / "00005" / "images.npy"
    raw = bytearray(f.read_bytes())
    raw[200] ^= 0x40
    f.write_bytes(bytes(raw))
    r = cli("verify", out)
    assert r.exit_code == 1
    bad = [ln for ln in r.output.splitlines() if ln.startswith("BAD")]
    assert len(bad) == 1 and "00005/images.npy: checksum mismatch" in bad[0]
    with pytest.raises(Exception, match="00005/images.npy: checksum"):
        InMemoryImageDataset(out, verify=True)


def test_verify_reports_every_problem_not_just_the_first(tree, tmp_path):
    out = tmp_path / "out"
    assert cli(*build_args(tree, out)).exit_code == 0
    (out / "train" / "00001" / "labels.npy").unlink()
    f = out / "train" / "00007" / "offsets.npy"
    f.write_bytes(f.read_bytes()[:-8])
    r = cli("verify", out)
    assert r.exit_code == 1
    assert "00001/labels.npy: cannot open" in r.output and "00007/offsets.npy" in r.output
    shutil.rmtree(out / "train" / "00002")
    (out / "manifest.json").write_text("{}")
    r = cli("verify", out)
    assert r.exit_code == 1 and "manifest.json" in r.output


# -- bad inputs: each with its outcome ------------------------------------------------------------
def test_bad_input_suite(tmp_path):
    from PIL import Image

    src = tmp_path / "src"
    write_tree(tmp_path / "t", classes=1, per_class=2, sizes=((96, 128),))
    good = sorted((tmp_path / "t" / "train" / "n00000000").iterdir())
    cls = src / "things"
    cls.mkdir(parents=True)
    shutil.copy(good[0], cls / "ok.JPEG")
    shutil.copy(good[1], cls / "locked.JPEG")
    os.chmod(cls / "locked.JPEG", 0)
    (cls / "loop_a.JPEG").symlink_to(cls / "loop_b.JPEG")
    (cls / "loop_b.JPEG").symlink_to(cls / "loop_a.JPEG")
    non_utf8 = os.fsencode(cls) + b"/caf\xe9.JPEG"
    shutil.copy(good[0], non_utf8)
    long_name = "x" * 240 + ".JPEG"
    shutil.copy(good[0], cls / long_name)
    (cls / "zero.JPEG").write_bytes(b"")
    import struct
    import zlib

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)

    (cls / "bomb.png").write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 80000, 80000, 8, 2, 0, 0, 0)) + chunk(b"IEND", b""))
    Image.new("RGB", (20, 10), (10, 200, 30)).save(cls / "tiny.png")
    (src / "empty_class").mkdir()

    r = cli("build", "folder", src, "--out", tmp_path / "p", "--size", 64, "-j", 1)
    assert r.exit_code == 1 and "empty_class" in r.output and "hold no images" in r.output
    r = cli("build", "folder", src, "--out", tmp_path / "p", "--size", 64, "-j", 1, "--allow-empty-classes",
            "--resize", "center-crop", "--mode", "raw")
    assert r.exit_code == 0, r.output
    m = read_manifest(tmp_path / "p")
    skipped = {s["source"]: s["reason"] for s in m["splits"]["train"]["skipped"]}
    expected_skips = {
        "things/loop_a.JPEG": "unreadable",  # symlink loop: ELOOP
        "things/loop_b.JPEG": "unreadable",
        "things/zero.JPEG": "empty file",
        "things/bomb.png": "too many pixels",  # refused from the header: 6.4 G pixels never allocated
    }
    if os.geteuid() != 0:  # root reads a mode-000 file; anyone else cannot
        expected_skips["things/locked.JPEG"] = "unreadable"
    assert skipped == expected_skips
    assert m["classes"] == ["empty_class", "things"]  # an allowed empty class keeps its label
    ds = InMemoryImageDataset(tmp_path / "p", as_numpy=True)
    names = list(ds.sources)
    assert os.fsencode(names[names.index("things/caf\udce9.JPEG")]) == b"things/caf\xe9.JPEG"  # bytes survive
    assert f"things/{long_name}" in names
    tiny = ds[names.index("things/tiny.png")][0]
    assert tiny.shape == (64, 64, 3)  # smaller than the target: not enlarged, padded to the square
    assert (tiny[27:37, 22:42] == (10, 200, 30)).all() and tiny[0, 0].tolist() == [0, 0, 0]
    assert set(ds.labels.tolist()) == {1}


def test_resume_with_other_settings_or_inputs_rebuilds_what_changed(tree, tmp_path):
    """A resume reuses a shard only when its settings and inputs are the ones it was made from: a new size
    rebuilds every shard, a smaller --limit drops the shards (and files) the new plan lacks; either way
    the result equals a fresh build with the new options."""
    out = tmp_path / "out"
    args = build_args(tree, out)
    assert cli(*args).exit_code == 0
    args48 = [a if a != 64 else 48 for a in args]
    r = cli(*args48, "--resume")
    assert r.exit_code == 0 and "resumed:" not in r.output, r.output  # no shard of size 64 was taken for one of 48
    fresh = tmp_path / "fresh"
    assert cli(*[a if a != 64 else 48 for a in build_args(tree, fresh)]).exit_code == 0
    assert json.dumps(read_manifest(out)["splits"]) == json.dumps(read_manifest(fresh)["splits"])
    r = cli(*args48, "--resume", "--limit", 8)
    assert r.exit_code == 0, r.output
    limited = tmp_path / "limited"
    assert cli(*[a if a != 64 else 48 for a in build_args(tree, limited)], "--limit", 8).exit_code == 0
    assert json.dumps(read_manifest(out)["splits"]) == json.dumps(read_manifest(limited)["splits"])
    assert sorted(p.name for p in (out / "train").iterdir()) == sorted(p.name for p in (limited / "train").iterdir())


def test_a_streamed_blob_is_the_file_np_save_writes(tmp_path):
    """ShardWriter's blob (appended piece by piece, part of it rewound) ends as the very bytes np.save writes for
    the kept bytes, with the record's size and checksum; readers take it as any other shard file."""
    import numpy as np

    from dataprep.pack.shard import ShardWriter, file_sha256

    pieces = [((np.arange(n) + n) % 256).astype(np.uint8) for n in (5, 300, 0, 7)]
    with ShardWriter(tmp_path / "s", 3) as shard:
        blob = shard.blob("images")
        for p in pieces[:2]:
            blob.append(p)
        mark = blob.n
        blob.append(b"dropped" * 10)  # longer than what follows: a rewind that only seeks leaves its tail
        blob.rewind(mark)
        for p in pieces[2:]:
            blob.append(p.tobytes())
        shard.add("offsets", np.array([0, 5], "<i8"))
        files = shard.commit({"count": 1})
    path = tmp_path / "s" / "00003" / "images.npy"
    np.save(tmp_path / "want.npy", np.concatenate(pieces))
    assert path.read_bytes() == (tmp_path / "want.npy").read_bytes()
    assert files["images.npy"] == {"bytes": path.stat().st_size, "sha256": file_sha256(path), "dtype": "|u1", "shape": [312]}
    with pytest.raises(ValueError, match="cannot rewind"), ShardWriter(tmp_path / "s", 4) as shard:
        shard.blob("x").rewind(1)
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["00003"]


def test_a_shard_an_exception_leaves_is_gone(tmp_path):
    """An error while a shard is streamed (a blob half-written) removes its temporary folder: nothing looks finished."""
    from dataprep.pack.shard import ShardWriter

    with pytest.raises(RuntimeError, match="planted"):
        with ShardWriter(tmp_path / "s", 0) as shard:
            shard.blob("images").append(b"x" * 1000)
            raise RuntimeError("planted")
    assert list((tmp_path / "s").iterdir()) == []


def test_a_full_disk_while_a_blob_grows_is_a_pack_error_and_leaves_nothing(tmp_path):
    """ENOSPC from an append (a video's frames streamed to its shard) is the PackError a whole-array write gives,
    with its hint; the half-written shard is gone, and so is one left without a commit."""
    import errno

    from dataprep.errors import PackError
    from dataprep.pack.shard import ShardWriter

    class Full:
        def __init__(self, f):
            self.f = f

        def write(self, b):
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.f, name)

    with pytest.raises(PackError, match=r"00000: cannot write shard \(No space left on device\); the disk is full"):
        with ShardWriter(tmp_path / "s", 0) as shard:
            blob = shard.blob("images")
            blob.append(b"x" * 10)
            blob.f = Full(blob.f)
            blob.append(b"y" * 10)
    with ShardWriter(tmp_path / "s", 1) as shard:
        shard.blob("images").append(b"z")
    assert list((tmp_path / "s").iterdir()) == []
