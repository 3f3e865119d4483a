"""dataprep audit under attack: hashes that defeat the search's assumptions (thousands of near-identical
frames, a million equal hashes) in bounded time and memory, with the figures they had when the edges were
held; each bound beside a size where the code before it exceeded it (the commit bodies give the figures);
a --sheet path that is a symlink planted in a shared folder, a FIFO, another user's file or in a folder
others can write, refused without being written through or opened; hash arrays of the wrong dtype, shape
or length refused naming the split, never cast into other samples (a pack's hash file that lies is refused
by the pack's readers already, naming the file)."""
import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from dataprep.audit import index as X
from dataprep.audit.report import Samples, audit, drop_indices
from dataprep.audit.sheet import contact_sheet
from dataprep.errors import UsageError
from dataprep.safe_paths import UnsafeFile

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from test_audit_core import _messy, flooded  # noqa: E402


def frames(n, seed=0):
    """n distinct hashes, each 1 to 3 bits off one base: consecutive video frames, every one within 6 bits
    of every other (n(n-1)/2 pairs at the default distance)."""
    rng = np.random.default_rng(seed)
    base = int(rng.integers(0, 2**63, dtype=np.uint64))
    out = set()
    while len(out) < n:
        pos = rng.choice(64, int(rng.integers(1, 4)), replace=False)
        out.add(base ^ sum(1 << int(p) for p in pos))
    h = np.array(sorted(out), np.uint64)
    rng.shuffle(h)
    return h


_BOUNDED = r"""
import json, resource, sys, time
import numpy as np
sys.path.insert(0, sys.argv[2])
from test_trust_audit import frames
from dataprep.audit.index import find_matches
from dataprep.audit.report import Samples, audit, drop_indices
mode = sys.argv[1]
fr = frames(4000, seed=3)
tr = np.concatenate([np.full(1_000_000, 0x5555555555555555, np.uint64), fr[:3500]])
va = np.concatenate([np.full(1000, 0x5555555555555555, np.uint64), fr[3500:]])
parts = {"train": {"hashes": tr}, "val": {"hashes": va}}
if mode == "flips":  # mirrors far from every hash: no mirror pairs, the search made twice
    far = np.uint64(0xFFFF0000FFFF0000)
    parts = {k: {"hashes": v["hashes"], "flipped": v["hashes"] ^ far} for k, v in parts.items()}
s = Samples.from_splits(parts)
small = Samples.from_splits({k: {x: y[-50:] for x, y in v.items()} for k, v in parts.items()})
audit(small, max_pairs=10, flips=mode == "flips")  # warm imports
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
if mode == "drop":  # what a --drop-duplicates build runs over its hashes (audit/drop.py)
    out = {k: len(v) for k, v in drop_indices(s, find_matches(s.hashes, 10)).items()}
else:
    r = audit(s, max_pairs=10_000, flips=mode == "flips")
    out = {k: r["summary"][k] for k in ("pairs", "pairs_within", "pairs_across", "groups", "drop_duplicates", "leaks")}
    out["listed"] = len(r["pairs"])
seconds = time.perf_counter() - t
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
print(json.dumps({"seconds": seconds, "grown_mib": grown, "out": out}))
"""


@pytest.mark.parametrize("mode", ["plain", "flips", "drop"])
def test_near_identical_frames_beside_a_million_equal_hashes_cost_bounded_time_and_memory(mode):
    """4,000 near-identical frames (8e6 pairs of distinct hashes; 3,500 in train, 500 in val) beside a
    million equal hashes in train and 1,000 in val: every figure exact, the drop rule too, in seconds and
    in memory that does not grow with the pairs. Held as edges they took 1.25 GB (about 300 bytes a pair)."""
    from .conftest import within  # here: the child imports this module as a top-level one, without its package

    here = __file__.rsplit("/", 1)[0]
    r = subprocess.run([sys.executable, "-c", _BOUNDED, mode, here], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)
    k = lambda n: n * (n - 1) // 2  # noqa: E731
    out = got["out"]
    if mode == "drop":
        assert out == {"train": 999_999 + 3499, "val": 1000 + 500}
    else:
        assert out["pairs_within"] == {"train": k(1_000_000) + k(3500), "val": k(1000) + k(500)}
        assert out["pairs_across"] == {"train/val": 1_000_000 * 1000 + 3500 * 500}
        assert out["pairs"] == k(1_001_000) + k(4000) and out["listed"] == 10_000
        assert out["groups"] == 2 and out["drop_duplicates"] == {"train": 999_999 + 3499, "val": 1000 + 500}
        assert out["leaks"]["val"]["samples"] == 1500
    assert got["grown_mib"] < 700, got["grown_mib"]
    within(got["seconds"], 60, f"the {mode} audit of a million equal hashes beside 4,000 near-identical frames")


def _reports_equal(a, b):
    a, b = json.loads(json.dumps(a)), json.loads(json.dumps(b))
    for r in (a, b):
        r["summary"].pop("candidates_checked")
    return a == b


def _cases():
    fr = frames(300, seed=1)
    h = np.concatenate([fr, fr[:20], fr[:20] ^ np.uint64(1 << 63)])
    cut = {"train": {"hashes": h[:260], "flipped": h[:260][::-1].copy()}, "val": {"hashes": h[260:], "flipped": h[260:][::-1].copy()}}
    return [(flooded(), {}), (flooded(), {"max_pairs": 7}), (_messy(seed=0), {"max_distance": 6, "flips": True}),
            (_messy(seed=1), {"max_distance": 6, "flips": True, "max_pairs": 13}),
            (Samples.from_splits(cut), {"flips": True, "max_pairs": 40}), (Samples.from_splits(cut), {"max_pairs": 10**6})]


def test_edges_found_again_give_the_report_they_gave_held(monkeypatch):
    """Past MAX_EDGES the edges are searched again and folded a few at a time; the report is the same, cut
    listings included (the listing keeps only the closest edges it needs)."""
    want = [audit(s, **kw) for s, kw in _cases()]
    monkeypatch.setattr(X, "MAX_EDGES", 0)
    monkeypatch.setattr(X, "FOLD", 64)
    for (s, kw), w in zip(_cases(), want):
        m = X.find_matches(s.hashes, kw.get("max_distance", 10))
        assert not m.held
        assert _reports_equal(audit(s, **kw), w)
        plain = drop_indices(s, m)
        monkeypatch.setattr(X, "MAX_EDGES", 1 << 21)
        held = X.find_matches(s.hashes, kw.get("max_distance", 10))
        assert held.held and {k: list(v) for k, v in drop_indices(s, held).items()} == {k: list(v) for k, v in plain.items()}
        monkeypatch.setattr(X, "MAX_EDGES", 0)


def test_a_listing_cut_keeps_the_pairs_it_kept_from_every_edge(monkeypatch):
    """Chunks of 7 pairs and limits of 0 to 500: the pairs taken from the edges a listing keeps (the first
    limit + chunk by distance) are those taken from all of them, split or not, by up to 70 splits."""
    h = np.concatenate([frames(200, seed=2), np.zeros(3, np.uint64)])
    sp = np.random.default_rng(0).integers(0, 3, len(h))
    many = np.arange(len(h)) % 70  # split codes past 63: no bit for each in a word
    monkeypatch.setattr(X, "MAX_EDGES", 0)
    m = X.find_matches(h, 8)
    for limit in (0, 1, 10, 100, 500):
        for split, across in ((None, False), (sp, True), (sp, False), (many, True), (many, False)):
            every = X.take(m.chunks(7, split=split, across=across), limit)
            cut = X.take(m.chunks(7, split=split, across=across, limit=limit), limit)
            assert all(np.array_equal(a, b) for a, b in zip(every[:3], cut[:3])) and every.complete == cut.complete


def test_hashes_alike_on_most_bits_are_compared_all_against_all():
    """The plan assumes random hashes; near-identical frames would make each pair a candidate of several
    blocks. Counted on a sample, they are compared all against all: one candidate a pair, the same pairs."""
    h = frames(1500, seed=5)
    m = X.find_matches(h, 10)
    assert m.candidates == 1500 * 1499 // 2 and m.total == 1500 * 1499 // 2
    idx = X.find_matches(h, 10, search="index")
    assert idx.candidates > 2 * m.candidates and idx.total == m.total  # the index: more candidates, same pairs
    rnd = np.random.default_rng(0).integers(0, 2**63, 20_000, dtype=np.uint64)
    assert X.find_matches(rnd, 10).candidates < 20_000 * 19_999 // 20  # random hashes keep the index


# -- the contact sheet is written as outputs are written -------------------------------------------------
from test_audit_pack import cli, pack, tree  # noqa: E402,F401 - the small planted pack and its CLI runner


def _within(seconds, fn):
    """fn() in a daemon thread: what it returns, or a failure when it has not returned in `seconds` (a
    write that blocks would otherwise hang the test run)."""
    out = {}

    def run():
        try:
            out["r"] = fn()
        except BaseException as e:  # noqa: BLE001 - raised again below, in the test's thread
            out["e"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still blocked after {seconds} s"
    if "e" in out:
        raise out["e"]
    return out["r"]


def _shared(tmp_path):
    """A folder every user may write, sticky as /tmp is; another user's when we are root (so that the
    kernel's protected_symlinks, where on, would follow a link of theirs in it too)."""
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o1777)
    if os.geteuid() == 0:
        os.chown(d, OTHER, OTHER)
    return d


OTHER = 4242  # another user's uid (files are given to it only when the tests run as root)


def _planted(folder, name, target):
    link = folder / name
    os.symlink(target, link)
    if os.geteuid() == 0:
        os.lchown(link, OTHER, OTHER)
    return link


def test_the_sheet_is_never_written_through_a_symlink_planted_in_a_shared_folder(pack, tmp_path):  # noqa: F811
    victim = tmp_path / "victim.txt"
    victim.write_text("the victim's own file")
    link = _planted(_shared(tmp_path), "sheet.png", victim)
    r = cli("audit", pack, "--sheet", link)
    assert r.exit_code == 2 and "symlink" in r.stderr and str(link) in r.stderr, r.output
    assert len(r.stderr.strip().splitlines()) == 1  # refused before the audit: one line
    assert victim.read_text() == "the victim's own file" and os.path.islink(link)
    with pytest.raises(UnsafeFile, match="symlink"):  # the Python API too
        contact_sheet([], lambda side: None, link)
    assert victim.read_text() == "the victim's own file"


def test_a_symlink_planted_after_the_check_is_replaced_not_followed(tmp_path, monkeypatch):
    """The race: the name is free when checked and a link by the time of the write. The sheet goes to a
    temporary made with O_EXCL | O_NOFOLLOW and is renamed over the name: the link goes, its target stays."""
    import dataprep.safe_paths as sp

    victim = tmp_path / "victim.txt"
    victim.write_text("the victim's own file")
    path = _shared(tmp_path) / "sheet.png"
    real = sp.check_file
    monkeypatch.setattr(sp, "check_file", lambda p, *a, **k: (real(p, *a, **k), _planted(path.parent, path.name, victim))[0])
    lay = contact_sheet([], lambda side: None, path)
    assert victim.read_text() == "the victim's own file"
    assert not os.path.islink(path) and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and lay.width > 0


def test_a_fifo_named_as_the_sheet_is_refused_not_opened(pack, tmp_path):  # noqa: F811
    fifo = tmp_path / "s.png"
    os.mkfifo(fifo)
    r = _within(60, lambda: cli("audit", pack, "--sheet", fifo))
    assert r.exit_code == 2 and "FIFO" in r.stderr and str(fifo) in r.stderr, r.output
    with pytest.raises(UnsafeFile, match="FIFO"):
        _within(60, lambda: contact_sheet([], lambda side: None, fifo))


def test_the_sheet_goes_only_where_others_cannot_swap_it_nor_over_their_file(pack, tmp_path):  # noqa: F811
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)  # writable by all, not sticky: anyone could replace the sheet or plant one
    r = cli("audit", pack, "--sheet", open_dir / "s.png")
    assert r.exit_code == 2 and "other users" in r.stderr and not (open_dir / "s.png").exists(), r.output
    if os.geteuid() == 0:  # another user's file in a shared folder: theirs, not ours to replace
        theirs = _shared(tmp_path) / "theirs.png"
        theirs.write_bytes(b"theirs")
        os.chown(theirs, OTHER, OTHER)
        r = cli("audit", pack, "--sheet", theirs)
        assert r.exit_code == 2 and f"uid {OTHER}" in r.stderr and theirs.read_bytes() == b"theirs", r.output
    mine = tmp_path / "mine.png"  # our own file in our own folder: replaced, as before
    mine.write_bytes(b"old")
    r = cli("audit", pack, "--sheet", mine)
    assert r.exit_code == 1 and mine.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", r.output


# -- hash arrays of the wrong dtype, shape or length -----------------------------------------------------
@pytest.mark.parametrize("bad, says", [
    (np.array([1.5, 2.7]), "integers"), ([1.5, 2], "1.5"), (np.array([np.nan, 1.0]), "integers"),
    (np.array([-1, 5], np.int64), "negative"), ([-1, 5], "-1"), ([2**64, 1], "18446744073709551616"),
    (np.array([True, False]), "integers"), (np.array(["12", "13"]), "integers"), ([[1, 2], [3]], "[1, 2]"),
    (np.arange(4, dtype=np.uint64).reshape(2, 2), "1-D"), ([[1, 2], [3, 4]], "1-D")])
def test_hashes_that_are_not_one_unsigned_integer_a_sample_are_refused_naming_the_split(bad, says):
    """Cast, they were other samples: 1.5 became 1, -1 a hash of 64 ones, NaN 2**63, a (2, 2) array four
    samples; now each is a UsageError naming the split and what is wrong."""
    with pytest.raises(UsageError, match=r"split 'val': hashes") as e:
        Samples.from_splits({"train": {"hashes": [1, 2]}, "val": {"hashes": bad}})
    assert says in str(e.value)
    with pytest.raises(UsageError):
        X.find_matches(bad, 4)


def test_flipped_hashes_digests_and_sources_must_match_the_hashes():
    h = np.array([1, 2], np.uint64)
    for extra, says in (({"flipped": h[:1]}, "1 flipped"), ({"flipped": np.array([0.5, 1.0])}, "flipped hashes must be integers"),
                        ({"digests": np.zeros((2, 8), np.uint8)}, "16 bytes"), ({"digests": np.zeros((2, 16))}, "bytes (uint8)"),
                        ({"digests": np.full((2, 16), 300)}, "past 0..255"), ({"sources": ["a", "b", "c"]}, "3 sources")):
        with pytest.raises(UsageError, match="split 'train'") as e:
            Samples.from_splits({"train": {"hashes": h, **extra}})
        assert says in str(e.value), str(e.value)
    # what is right is taken: Python ints up to 2**64 - 1, int64 without negatives, uint32, an empty list, flat digests
    s = Samples.from_splits({"a": {"hashes": [2**64 - 1, 0], "digests": np.zeros(32, np.uint8)},
                             "b": {"hashes": np.array([3], np.int64), "digests": np.zeros((1, 16), np.uint8)},
                             "c": {"hashes": np.array([], np.uint32), "digests": np.zeros((0, 16), np.uint8)}})
    assert s.hashes.tolist() == [2**64 - 1, 0, 3] and s.digests.shape == (3, 16)

