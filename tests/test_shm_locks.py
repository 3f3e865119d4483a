"""Shared-memory lock files go with a segment's last user, `cache clean` never touches what a live process
holds and says what it did in one line, and a killed filler's half-filled segment is reclaimed. Every test
keeps its segments in a private directory (SHM_DIR here, DATAPREP_SHM_DIR for the children): the real
/dev/shm/dataprep-UID is other processes' business."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dataprep.serve import shm as shm_mod

N = 131072  # int64s: a 1 MiB array, a segment of 1.05 MB
TOTAL = 4096 + N * 8

PRELUDE = f"""
import os, random, sys, time
from pathlib import Path
import numpy as np
from dataprep.serve import shm
N = {N}

def attach(tag, hook=None):
    def fill(alloc):
        alloc("x", (N,), "int64")[:] = np.arange(N)
        if hook:
            hook()
        return {{}}
    return shm.ShmSegment.attach(Path("/nowhere") / tag, {{"test": tag}}, "train/x", [("x", (N,), "int64")], fill)

def wait_for_parent(*_):
    print("ready", flush=True)
    sys.stdin.readline()
"""


def _attach(tag, fill=None):
    def default(alloc):
        alloc("x", (N,), "int64")[:] = np.arange(N)
        return {}

    return shm_mod.ShmSegment.attach(Path("/nowhere") / tag, {"test": tag}, "train/x", [("x", (N,), "int64")], fill or default)


def _name(tag):
    return shm_mod.segment_name({"test": tag}, "train/x")


@pytest.fixture
def shm_dir(tmp_path, monkeypatch):
    """A private SHM_DIR for this test and its children; the directory the segments go to."""
    base = tmp_path / "shm"
    base.mkdir()
    monkeypatch.setattr(shm_mod, "SHM_DIR", base)
    monkeypatch.setenv("DATAPREP_SHM_DIR", str(base))
    monkeypatch.delenv("DATAPREP_SHM_GROUP", raising=False)
    return base / f"dataprep-{os.getuid()}"


def _files(d):
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


def _run(body, *args):
    return subprocess.run([sys.executable, "-c", PRELUDE + body, *args], capture_output=True, text=True, timeout=60)


def _spawn(body, *args):
    p = subprocess.Popen([sys.executable, "-c", PRELUDE + body, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline().strip()
    assert line in ("ready", "filling"), (line, p.stderr.read() if p.poll() is not None else "")
    return p


def _finish(p):
    out, err = p.communicate("\n", timeout=30)
    assert p.returncode == 0, err[-600:]
    return out


def _kill(p):
    p.kill()
    p.communicate(timeout=30)


def test_lock_files_go_with_the_last_user(shm_dir):
    for k in range(6):  # closed explicitly, or released at exit; the same segment again, or a new one each time
        r = _run("s = attach(sys.argv[1])\nassert s.arrays['x'][-1] == N - 1\n" + ("s.close()\n" if k % 2 else ""),
                 "same" if k % 3 == 0 else f"run{k}")
        assert r.returncode == 0, r.stderr[-600:]
        assert _files(shm_dir) == [], f"run {k} left {_files(shm_dir)}"
    a, b = _attach("two"), _attach("two")
    assert a.created and not b.created
    a.close()
    name = _name("two")
    assert _files(shm_dir) == [name, f"{name}.fill", f"{name}.users"]  # b still uses it
    assert int(b.arrays["x"][-1]) == N - 1
    b.close()
    assert _files(shm_dir) == []


def test_a_failed_fill_leaves_no_lock_files(shm_dir):
    def broken(alloc):
        raise OSError("the pack went away")

    with pytest.raises(OSError, match="went away"):
        _attach("broken", broken)
    assert _files(shm_dir) == []


def test_a_killed_user_leaves_one_set_and_the_next_run_takes_it_all_away(shm_dir):
    r = _run("s = attach('crash')\nos.kill(os.getpid(), 9)\n")
    assert r.returncode == -signal.SIGKILL
    name = _name("crash")
    assert _files(shm_dir) == [name, f"{name}.fill", f"{name}.users"]  # complete: a cache for the next run
    r = _run("s = attach('crash')\nassert not s.created and s.arrays['x'][-1] == N - 1\n")
    assert r.returncode == 0, r.stderr[-600:]
    assert _files(shm_dir) == []  # its last user took segment and locks away


def test_clean_touches_nothing_a_live_process_holds(shm_dir):
    holder = _spawn("s = attach('held')\nwait_for_parent()\ns.close()\n")
    filler = _spawn("s = attach('filling', wait_for_parent)\n")  # waits inside its fill
    r = _run("s = attach('hidden')\nos.kill(os.getpid(), 9)\n")  # a complete segment...
    assert r.returncode == -signal.SIGKILL
    hidden = shm_dir / _name("hidden")
    # ...whose user holds its users lock but maps nothing this user can see (a group member's process)
    hider = _spawn(f"import fcntl\nfd = os.open({str(hidden) + '.users'!r}, os.O_RDWR)\nfcntl.flock(fd, fcntl.LOCK_SH)\n"
                   "wait_for_parent()\n")
    early = shm_dir / f"{_name('early')}.fill"  # a process checking for a segment it has not made yet
    checker = _spawn(f"import fcntl\nfd = os.open({str(early)!r}, os.O_CREAT | os.O_RDWR, 0o600)\n"
                     "fcntl.flock(fd, fcntl.LOCK_EX)\nwait_for_parent()\n")
    stale = _name("gone")
    for suffix in (".fill", ".users"):  # a segment long gone
        fd = os.open(shm_dir / f"{stale}{suffix}", os.O_CREAT | os.O_RDWR, 0o600)
        os.close(fd)
    live = set(_files(shm_dir)) - {f"{stale}.fill", f"{stale}.users"}
    assert any(".tmp-" in n for n in live) and hidden.name in live and early.name in live
    try:
        done = shm_mod.clean()
        assert set(_files(shm_dir)) == live, f"removed {live - set(_files(shm_dir))} of live processes"
        assert {str(shm_dir / _name(t)) for t in ("held", "hidden")} <= set(done.kept)
        assert any(".tmp-" in k for k in done.kept) and not done.unused and not done.half
        assert sorted(done.locks) == [str(shm_dir / f"{stale}.fill"), str(shm_dir / f"{stale}.users")]
    finally:
        for p in (holder, filler, hider, checker):
            _finish(p)
    shm_mod.clean()
    assert _files(shm_dir) == []


def test_clean_reclaims_a_half_filled_segment_of_a_killed_filler_and_the_next_run_refills(shm_dir):
    for reclaim in (True, False):
        _kill(_spawn("s = attach('half', wait_for_parent)\n"))  # SIGKILLed mid-fill
        tmp = [n for n in _files(shm_dir) if ".tmp-" in n]
        assert len(tmp) == 1
        if reclaim:
            done = shm_mod.clean()
            assert done.half == [(str(shm_dir / tmp[0]), TOTAL)] and not done.unused and not done.kept
            assert _files(shm_dir) == []  # its lock went with it
        else:
            s = _attach("half")  # the next opener replaces it
            assert s.created and int(s.arrays["x"][-1]) == N - 1 and not any(".tmp-" in n for n in _files(shm_dir))
            s.close()
            assert _files(shm_dir) == []


def test_cache_clean_prints_a_summary(shm_dir):
    from click.testing import CliRunner

    from dataprep.cli import main

    assert _run("s = attach('left')\nos.kill(os.getpid(), 9)\n").returncode == -signal.SIGKILL  # complete, unused
    _kill(_spawn("s = attach('half', wait_for_parent)\n"))  # half-filled
    for suffix in (".fill", ".users"):
        os.close(os.open(shm_dir / f"{_name('gone')}{suffix}", os.O_CREAT | os.O_RDWR, 0o600))
    mine = _attach("mine")  # in use by this process
    try:
        r = CliRunner().invoke(main, ["cache", "clean"])
        assert r.exit_code == 0, r.output
        lines = r.output.splitlines()
        assert len(lines) == 1, r.output
        assert lines[0] == ("removed 1 unused segment(s) (1.1 MB), 1 half-filled segment(s) left by a killed run (1.1 MB), "
                            "5 stale lock file(s); kept 1 segment(s) in use"), r.output
        assert _files(shm_dir) == sorted([mine.path.name, f"{mine.path.name}.fill", f"{mine.path.name}.users"])
        r = CliRunner().invoke(main, ["cache", "clean", "-v"])
        assert r.output.splitlines() == [f"kept {mine.path} (in use)", "removed 0 unused segment(s) (0.0 MB), 0 half-filled "
                                         "segment(s) left by a killed run (0.0 MB), 0 stale lock file(s); kept 1 segment(s) in use"]
    finally:
        mine.close()
    assert _files(shm_dir) == []


RACER = """
wait_for_parent()
end, n = time.monotonic() + float(sys.argv[1]), 0
while time.monotonic() < end:
    s = attach("race")
    fd = os.open(s.path, os.O_RDONLY)  # held: the inode's number cannot be reused while we look
    assert s.arrays["x"][-1] == N - 1
    time.sleep(random.random() * 0.002)
    st = os.fstat(fd)
    # a user who thought itself alone would have removed (or replaced) the segment under us
    assert st.st_nlink == 1 and os.stat(s.path).st_ino == st.st_ino, "the segment went while in use"
    os.close(fd)
    del s  # released as it is collected (no cycle holds it)
    n += 1
print(n, flush=True)
"""


def test_concurrent_open_close_and_clean_never_err_nor_remove_a_used_segment(shm_dir):
    racers = [_spawn(RACER, "1.5") for _ in range(3)]
    for p in racers:
        p.stdin.write("\n")
        p.stdin.flush()
    cleans = 0
    deadline = time.monotonic() + 30
    while any(p.poll() is None for p in racers) and time.monotonic() < deadline:
        shm_mod.clean()  # never what a racer holds
        cleans += 1
    outs = [p.communicate(timeout=30) for p in racers]
    assert all(p.returncode == 0 for p in racers), [e[-600:] for _, e in outs]
    assert all(int(o) > 0 for o, _ in outs) and cleans > 0
    assert _files(shm_dir) == []  # the last to leave took segment and locks away
