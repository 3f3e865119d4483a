"""Trust: tampered packs through Loader(threads=True), and the thread backend under faults.

A small JPEG pack and a small decoded (raw) pack are built here, then copied and tampered with: shard files
cut short, bytes flipped inside one JPEG's segments, offsets that lie (out of range, decreasing,
overlapping), shapes that lie, manifest records that lie (sha256, counts, channels). Each copy is served by
two loader threads with and without a crop (RandomResizedCrop, and a center crop or none) and with
`verify` True and False, in a child process watched from here: every case ends in a DataprepError naming
the pack (and, at serve time, the sample), or serves each sample's right pixels (a sample whose own bytes
were changed may serve changed pixels: a JPEG has no checksum), never a raw error, a hang or a signal.

Then the backend itself: a pass that raised shuts its pool at once (no thread left for the garbage
collector to find), Ctrl-C in the consumer mid-pass leaves no thread running and the Loader serving again,
and a batch held across a failed pass keeps its pixels while the next pass serves the right ones.
"""
from __future__ import annotations

import gc
import hashlib
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import dataprep
from dataprep.errors import DataprepError, PackError, WorkerError
from dataprep.images.build import build_images
from dataprep.images.settings import ImageSettings
from dataprep.serve.loader import Loader
from dataprep.settings import BuildSettings
from dataprep.sources import scan_imagenet
from dataprep.synthetic import write_tree

from .conftest import within

VICTIM = 5  # the sample tampered with: shard 1's second (shards of 4)
SHARD = "00001"


@pytest.fixture(scope="module")
def packs(tmp_path_factory) -> dict[str, Path]:
    """"jpeg": 12 JPEGs of 48x48 (center-crop, one size); "raw": 12 decoded images of 32 px on the shorter side."""
    root = tmp_path_factory.mktemp("threads_trust")
    src = write_tree(root / "src", classes=2, per_class=6, sizes=((40, 60), (64, 48)), kind="index", ext=".png")
    out = {"jpeg": root / "jpeg", "raw": root / "raw"}
    build_images(scan_imagenet(src), out["jpeg"], BuildSettings(workers=1, shard_size=4), ImageSettings(size=48, resize="center-crop"))
    build_images(scan_imagenet(src), out["raw"], BuildSettings(workers=1, shard_size=4), ImageSettings(size=32, mode="raw"))
    return out


# -- the tampering --------------------------------------------------------------------------------------------
def _manifest(pack: Path) -> dict:
    return json.loads((pack / "manifest.json").read_text())


def _write_manifest(pack: Path, m: dict) -> None:
    (pack / "manifest.json").write_text(json.dumps(m))


def _record(m: dict, name: str) -> dict:
    shard = next(s for s in m["splits"]["train"]["shards"] if s["name"] == SHARD)
    return shard["files"][name]


def _array(pack: Path, name: str) -> np.ndarray:
    return np.load(pack / "train" / SHARD / name)


def _save(pack: Path, name: str, a: np.ndarray, forge: bool = True) -> None:
    """Write shard 1's array `name`; `forge`: the manifest's record (shape, dtype, bytes, sha256) made to match,
    so that verify=True loads it too and the lie reaches serving."""
    path = pack / "train" / SHARD / name
    np.save(path, a)
    if forge:
        m = _manifest(pack)
        rec = _record(m, name)
        rec.update(shape=list(a.shape), dtype=a.dtype.str, bytes=path.stat().st_size,
                   sha256=hashlib.sha256(path.read_bytes()).hexdigest())
        _write_manifest(pack, m)


def _sample_span(pack: Path, k: int) -> tuple[int, int]:
    """Sample k of shard 1: where its bytes lie in the shard's blob."""
    offs = _array(pack, "offsets.npy")
    return int(offs[k]), int(offs[k + 1])


def _segment(blob: np.ndarray, lo: int, hi: int, marker: int) -> int:
    """Where the first `marker` (0xC0, 0xC4, 0xDA, ...) segment of the JPEG in blob[lo:hi] starts."""
    b = blob[lo:hi].tobytes()
    i = b.find(bytes([0xFF, marker]))
    assert i >= 0, f"no FF{marker:02X} in the sample"
    return lo + i


def _edit_victim(pack: Path, edit, forge: bool = True) -> None:
    """edit(blob, lo, hi) changes the victim's bytes of shard 1's blob in place (same length)."""
    blob = _array(pack, "images.npy")
    lo, hi = _sample_span(pack, VICTIM - 4)
    edit(blob, lo, hi)
    _save(pack, "images.npy", blob, forge)


def _flip_scan(blob, lo, hi):
    sos = _segment(blob, lo, hi, 0xDA)
    at = (sos + hi) // 2
    blob[at] ^= 0x5A
    if blob[at] == 0xFF or blob[at - 1] == 0xFF:  # not a marker of our own making
        blob[at] ^= 0x01


def _sof_size(h: int, w: int):
    def edit(blob, lo, hi):
        i = _segment(blob, lo, hi, 0xC0)
        blob[i + 5 : i + 9] = [h >> 8, h & 255, w >> 8, w & 255]
    return edit


def _sof_byte(offset: int, value: int):
    def edit(blob, lo, hi):
        blob[_segment(blob, lo, hi, 0xC0) + offset] = value
    return edit


def _dht_counts(blob, lo, hi):
    i = _segment(blob, lo, hi, 0xC4)
    blob[i + 5 : i + 21] = 255  # 16 code counts of 255: more codes than any table holds


def _sos_selector(blob, lo, hi):
    i = _segment(blob, lo, hi, 0xDA)
    blob[i + 5] = 9  # the first scan component names a component the frame does not have


def _zero(blob, lo, hi):
    blob[lo:hi] = 0


def _junk(blob, lo, hi):
    blob[lo:hi] = np.random.default_rng(0).integers(0, 256, hi - lo, dtype=np.uint8)


def _scan_cut(blob, lo, hi):
    sos = _segment(blob, lo, hi, 0xDA)
    blob[(sos + hi) // 2 : hi] = 0  # the second half of the entropy data and the EOI gone


def _restart_markers(blob, lo, hi):
    b = blob[lo:hi]
    rst = [k for k in range(len(b) - 1) if b[k] == 0xFF and 0xD0 <= b[k + 1] <= 0xD7]
    if not rst:
        _flip_scan(blob, lo, hi)
        return
    for k in rst[: len(rst) // 2 + 1]:
        b[k + 1] = 0xD0 + (b[k + 1] - 0xD0 + 3) % 8  # misnumbered


def _offset(k: int, value):
    """Shard 1's offset k set to value(offsets), the offsets' record forged."""
    def tamper(pack: Path) -> None:
        offs = _array(pack, "offsets.npy")
        offs[k] = value(offs)
        _save(pack, "offsets.npy", offs)
    return tamper


def _shape(value):
    def tamper(pack: Path) -> None:
        shapes = _array(pack, "shapes.npy")
        shapes[VICTIM - 4] = value(shapes[VICTIM - 4]) if callable(value) else value
        _save(pack, "shapes.npy", shapes)
    return tamper


def _truncate(name: str, keep: float):
    def tamper(pack: Path) -> None:
        path = pack / "train" / SHARD / name
        os.truncate(path, int(path.stat().st_size * keep))
    return tamper


def _blob_cut(pack: Path) -> None:
    blob = _array(pack, "images.npy")
    _save(pack, "images.npy", blob[: _sample_span(pack, VICTIM - 4)[0] + 40])


def _sha(pack: Path) -> None:
    m = _manifest(pack)
    _record(m, "images.npy")["sha256"] = "0" * 64
    _write_manifest(pack, m)


def _count(pack: Path) -> None:
    m = _manifest(pack)
    shard = next(s for s in m["splits"]["train"]["shards"] if s["name"] == SHARD)
    shard["count"] += 1
    m["splits"]["train"]["count"] += 1
    _write_manifest(pack, m)


def _entry(section: str, **change):
    """The manifest's `section` ("fields" or "settings") entry for the image, changed."""
    def tamper(pack: Path) -> None:
        m = _manifest(pack)
        m[section]["image"].update(change)
        _write_manifest(pack, m)
    return tamper


def _victim(edit, forge: bool = True):
    return lambda pack: _edit_victim(pack, edit, forge)


def _raw_bytes(pack: Path) -> None:
    blob = _array(pack, "images.npy")
    lo, hi = _sample_span(pack, VICTIM - 4)
    blob[lo : lo + 30] ^= 0xFF
    _save(pack, "images.npy", blob)


ROW = 32 * 3  # bytes of one row of a raw image 32 px wide

# name -> (pack, tamper, samples whose own stored bytes change: they may serve changed pixels)
VARIANTS = {
    "jpeg: images.npy cut short on disk": ("jpeg", _truncate("images.npy", 0.5), ()),
    "jpeg: offsets.npy cut short on disk": ("jpeg", _truncate("offsets.npy", 0.7), ()),
    "jpeg: images.npy rewritten shorter, its record forged": ("jpeg", _blob_cut, ()),
    "jpeg: a byte flipped in a scan": ("jpeg", _victim(_flip_scan), (VICTIM,)),
    "jpeg: a byte flipped in a scan, no record forged": ("jpeg", _victim(_flip_scan, forge=False), (VICTIM,)),
    "jpeg: a frame header of 12000x12000": ("jpeg", _victim(_sof_size(12000, 12000)), ()),
    "jpeg: a frame header of 0x0": ("jpeg", _victim(_sof_size(0, 0)), ()),
    "jpeg: a frame of no components": ("jpeg", _victim(_sof_byte(9, 0)), ()),
    "jpeg: a frame of 4 components": ("jpeg", _victim(_sof_byte(9, 4)), ()),
    "jpeg: sampling factors of 0": ("jpeg", _victim(_sof_byte(11, 0)), ()),
    "jpeg: a quantisation table id of 7": ("jpeg", _victim(_sof_byte(12, 7)), ()),
    "jpeg: a huffman table of too many codes": ("jpeg", _victim(_dht_counts), ()),
    "jpeg: a scan naming no frame component": ("jpeg", _victim(_sos_selector), ()),
    "jpeg: a sample of zeros": ("jpeg", _victim(_zero), ()),
    "jpeg: a sample of random bytes": ("jpeg", _victim(_junk), ()),
    "jpeg: a scan cut in half": ("jpeg", _victim(_scan_cut), (VICTIM,)),
    "jpeg: restart markers misnumbered": ("jpeg", _victim(_restart_markers), (VICTIM,)),
    "jpeg: offsets past the blob's end": ("jpeg", _offset(-1, lambda o: o[-1] + 1000), ()),
    "jpeg: an offset far out of range": ("jpeg", _offset(2, lambda o: 10**12), ()),
    "jpeg: a negative offset": ("jpeg", _offset(1, lambda o: -5), ()),
    "jpeg: decreasing offsets": ("jpeg", _offset(2, lambda o: o[1] - 1), ()),
    "jpeg: overlapping samples (an offset moved on)": ("jpeg", _offset(2, lambda o: o[2] + 100), (VICTIM + 1,)),
    "jpeg: a sample cut short (an offset moved back)": ("jpeg", _offset(2, lambda o: o[2] - 100), (VICTIM + 1,)),
    "jpeg: an empty sample": ("jpeg", _offset(2, lambda o: o[1]), ()),
    "jpeg: offsets of int32": ("jpeg", lambda p: _save(p, "offsets.npy", _array(p, "offsets.npy").astype(np.int32)), ()),
    "jpeg: a shape one row taller": ("jpeg", _shape((49, 48, 3)), ()),
    "jpeg: a shape of zeros": ("jpeg", _shape((0, 0, 3)), ()),
    "jpeg: a negative shape": ("jpeg", _shape((-48, -48, 3)), ()),
    "jpeg: a shape of 32767x32767": ("jpeg", _shape((32767, 32767, 3)), ()),
    "jpeg: a shape of 1 channel": ("jpeg", _shape((48, 48, 1)), ()),
    "jpeg: a manifest sha256 that lies": ("jpeg", _sha, ()),
    "jpeg: a shard count that lies": ("jpeg", _count, ()),
    "jpeg: a field of 1 channel": ("jpeg", _entry("fields", channels=1, shape=[None, None, 1]), ()),
    "jpeg: a field of 4 channels": ("jpeg", _entry("fields", channels=4, shape=[None, None, 4]), ()),
    "jpeg: a build size of 16": ("jpeg", _entry("settings", size=16), ()),
    "jpeg: a label past the classes": ("jpeg", lambda p: _save(p, "labels.npy", _array(p, "labels.npy") + np.uint8(200)), ()),
    "jpeg: source names of invalid UTF-8": ("jpeg", lambda p: _save(p, "sources.npy", np.full_like(_array(p, "sources.npy"), 0xFF)), ()),
    "jpeg: source offsets that lie": ("jpeg", lambda p: _save(p, "source_offsets.npy", _array(p, "source_offsets.npy")[::-1].copy()), ()),
    "raw: images.npy cut short on disk": ("raw", _truncate("images.npy", 0.5), ()),
    "raw: pixels flipped": ("raw", _raw_bytes, (VICTIM,)),
    "raw: a shape one row taller": ("raw", _shape(lambda s: s + [1, 0, 0]), ()),
    "raw: a shape of zeros": ("raw", _shape((0, 0, 3)), ()),
    "raw: a negative shape": ("raw", _shape((-32, -48, 3)), ()),
    "raw: height and width swapped": ("raw", _shape(lambda s: s[[1, 0, 2]]), (VICTIM,)),
    "raw: overlapping samples (an offset moved on a row)": ("raw", _offset(2, lambda o: o[2] + ROW), ()),
    "raw: an empty sample": ("raw", _offset(2, lambda o: o[1]), ()),
    "raw: a field of 2-byte pixels": ("raw", _entry("fields", dtype="<u2"), ()),
    "raw: a field of 1 channel": ("raw", _entry("fields", channels=1, shape=[None, None, 1]), ()),
}


# -- serving each copy, in a child watched from here ------------------------------------------------------------
RUNNER = r"""
import faulthandler, gc, json, sys, threading
faulthandler.enable()  # a signal's stack in the stderr the watcher reads
import numpy as np
import dataprep
from dataprep.serve.loader import Loader

def crop_of(kind, name):
    if name == "rrc":
        return dataprep.RandomResizedCrop(24, scale=(0.3, 1.0))
    return None if kind == "jpeg" else (24, 24)  # a raw pack of several sizes needs a crop to batch

def serve(pack, kind, crop, verify, threads, got):
    ds = dataprep.InMemoryImageDataset(pack, verify=verify)
    ld = Loader(ds, 4, shuffle=True, seed=1, num_workers=2 if threads else 0, threads=True if threads else None,
                crop=crop_of(kind, crop), flip=True, indices=True, timeout=30)
    for images, labels, idx in ld:
        for im, lab, i in zip(images, labels, idx.tolist()):
            got[i] = (im.numpy().copy(), int(lab))
    ld.close()  # a pass that raised is not closed here: its Loader lives on in the traceback

def loader_threads():
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("dataprep-loader"))

refs = {}
for line in sys.stdin:
    case = json.loads(line)
    print(json.dumps({"start": case["id"]}), flush=True)
    key = (case["kind"], case["crop"])
    if key not in refs:
        serve(case["intact"], case["kind"], case["crop"], False, False, refs.setdefault(key, {}))
    out, got = {"id": case["id"], "outcome": "served"}, {}
    try:
        serve(case["pack"], case["kind"], case["crop"], case["verify"], True, got)
    except BaseException as e:
        tb = e.__traceback__
        while tb.tb_next is not None:
            tb = tb.tb_next
        out.update(outcome="raised", types=[c.__name__ for c in type(e).__mro__], message=str(e),
                   where=f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}", threads=loader_threads())
        del tb  # it holds the failed pass's frames
    gc.collect()  # whatever a case left for the collector is not the next case's
    ref = refs[key]
    out["wrong"] = sorted(i for i, (im, lab) in got.items() if not (np.array_equal(im, ref[i][0]) and lab == ref[i][1]))
    out["served"] = len(got)
    print(json.dumps(out), flush=True)
"""


def _cases(packs: dict[str, Path], root: Path) -> list[dict]:
    """Every variant, tampered in a copy of its pack, by every crop and verify setting."""
    cases = []
    for n, (name, (kind, tamper, _own)) in enumerate(VARIANTS.items()):
        pack = root / f"v{n:02d}"
        shutil.copytree(packs[kind], pack)
        tamper(pack)
        for crop in ("plain", "rrc"):
            for verify in (False, True):
                cases.append({"id": len(cases), "name": name, "kind": kind, "pack": str(pack), "intact": str(packs[kind]),
                              "crop": crop, "verify": verify})
    return cases


def _lines(stream, out: queue.Queue) -> None:
    for line in stream:
        out.put(line)
    out.put(None)


def _run_all(cases: list[dict], deadline: float = 60.0) -> dict[int, dict]:
    """Each case's result line from RUNNER; a case that outlives `deadline` (a hang) or whose child dies
    (a signal) is recorded so, and a new child serves the cases after it. The child's stderr goes to a file:
    libjpeg's warnings would fill a pipe no one reads."""
    results: dict[int, dict] = {}
    left = list(cases)
    while left:
        with tempfile.TemporaryFile("w+") as err:
            p = subprocess.Popen([sys.executable, "-c", RUNNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=err, text=True)
            lines: queue.Queue = queue.Queue()
            threading.Thread(target=_lines, args=(p.stdout, lines), daemon=True).start()
            p.stdin.write("".join(json.dumps(c) + "\n" for c in left))
            p.stdin.close()
            running, why = None, None
            while True:
                try:
                    line = lines.get(timeout=deadline)
                except queue.Empty:
                    p.kill()
                    why = f"hang (no result in {deadline:.0f} s)"
                    break
                if line is None:
                    why = f"died (exit {p.wait()})"
                    break
                msg = json.loads(line)
                if "start" in msg:
                    running = msg["start"]
                else:
                    results[msg["id"]] = msg
            p.wait()
            p.stdout.close()
            err.seek(0)
            tail = err.read()[-2000:]
        if running is None or running in results:  # no case left running: the child failed outside any
            assert not [c for c in left if c["id"] not in results], f"{why}: {tail}"
        else:
            results[running] = {"outcome": why, "stderr": tail}
        left = [c for c in left if c["id"] not in results]
    return results


def _judge(case: dict, r: dict, own: tuple[int, ...]) -> str | None:
    """Why a case's result is not acceptable, or None."""
    if r["outcome"] not in ("served", "raised"):
        return r["outcome"] + (": " + r["stderr"] if r.get("stderr") else "")
    wrong = [i for i in r["wrong"] if i not in own]
    if wrong:
        return f"served other pixels for samples {wrong} ({r['outcome']}: {r.get('message', '')})"
    if r["outcome"] == "served":
        return None if r["served"] == 12 else f"served {r['served']} of 12 samples without an error"
    if "DataprepError" not in r["types"]:
        return f"a raw {r['types'][0]}: {r['message']} (at {r['where']})"
    msg = r["message"]
    if case["pack"] not in msg:
        return f"the error does not name the pack: {msg}"
    if "batch" in msg and not re.search(r"\bsample \d+ .*\(samples \[", msg):  # raised while serving
        return f"the error does not name the sample: {msg}"
    if r["threads"]:
        return f"loader threads left running after the error: {r['threads']}"
    return None


def test_tampered_packs_through_loader_threads_end_in_a_clear_error_or_the_right_pixels(packs, tmp_path):
    cases = _cases(packs, tmp_path)
    results = _run_all(cases)
    bad = []
    for c in cases:
        why = _judge(c, results[c["id"]], VARIANTS[c["name"]][2])
        if why is not None:
            bad.append(f"{c['name']} (crop {c['crop']}, verify={c['verify']}): {why}")
    assert not bad, f"{len(bad)} of {len(cases)} cases:\n" + "\n".join(bad)


# -- the thread backend under faults: errors, Ctrl-C, hangs, close() ---------------------------------------------
@pytest.fixture(scope="module")
def index_pack(index_tree, tmp_path_factory) -> Path:
    """18 decoded 32x32 images whose pixels encode their index (tests/test_held_batches.py's pack)."""
    out = tmp_path_factory.mktemp("threads_faults") / "pack"
    build_images(scan_imagenet(index_tree), out, BuildSettings(workers=1, shard_size=5),
                 ImageSettings(size=32, resize="center-crop", mode="raw"))
    return out


class Faulty(dataprep.InMemoryImageDataset):
    """The index pack, whose fill raises for the samples in `bad`, or waits at `gate` (set: it passes) for those
    in `slow`, saying so by setting `entered`."""

    bad: set = set()
    slow: set = set()

    def fill_batch(self, idx, out, request=None, rows=None):
        got = set(np.asarray(idx).tolist())
        if got & self.slow:
            self.entered.set()
            self.gate.wait(30)
        if got & self.bad:
            raise PackError(f"{self.pack}/{self.split}: sample {min(got & self.bad)} is damaged")
        super().fill_batch(idx, out, request, rows)


def faulty(pack: Path, bad=(), slow=()) -> Faulty:
    ds = Faulty(pack)
    ds.bad, ds.slow, ds.gate, ds.entered = set(bad), set(slow), threading.Event(), threading.Event()
    return ds


def loader_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("dataprep-loader")]


def wrong(batches) -> int:
    """Samples whose pixels do not encode the index they were served with."""
    from dataprep.synthetic import decode_index

    return sum(decode_index(im.permute(1, 2, 0).numpy()) != int(i) for images, _labels, idx in batches for im, i in zip(images, idx))


def epoch(ld) -> list:
    return [tuple(t.clone() for t in b) for b in ld]


def served_order(pack: Path) -> list[list[int]]:
    """The samples of each batch of epoch 0 (batches of 3, shuffled with seed 5), as num_workers=0 serves them."""
    return [b[2].tolist() for b in epoch(Loader(dataprep.InMemoryImageDataset(pack), 3, shuffle=True, seed=5, indices=True))]


def test_a_failed_pass_shuts_its_threads_at_once_and_held_batches_keep_their_pixels(index_pack):
    """Forty failed passes over Loaders that stay referenced (as a traceback keeps them), the collector off: no
    loader thread is left after any. A batch held across the failures keeps its pixels, and the next pass of
    the Loader that failed serves the whole epoch right."""
    order = served_order(index_pack)
    bad = order[3][0]  # in the fourth batch: three are served first
    ds = faulty(index_pack, bad={bad})
    kept, held = [], None
    gc.disable()
    try:
        for _ in range(40):
            ld = Loader(ds, 3, shuffle=True, seed=5, num_workers=2, threads=True, indices=True)
            kept.append(ld)
            with pytest.raises(DataprepError, match=rf"batch 3: PackError: .* sample {bad} is damaged .*samples \[") as e:
                for batch in ld:
                    if held is None:  # the first batch of the first pass, a view of its ring
                        held, pixels = batch, batch[0].clone()
            assert str(index_pack) in str(e.value)
            assert loader_threads() == [], f"after {len(kept)} failed passes"
    finally:
        gc.enable()
    ld = kept[0]
    assert torch.equal(held[0], pixels) and wrong([held]) == 0
    ds.bad = set()
    again = epoch(ld)
    assert len(again) == len(ld) and wrong(again) == 0 and torch.equal(held[0], pixels)
    assert torch.equal(torch.cat([b[2] for b in again]).sort().values, torch.arange(len(ds)))
    ld.close()


def test_ctrl_c_while_the_consumer_waits_stops_every_thread_and_the_loader_serves_again(index_pack):
    """SIGINT to this process while the consumer waits in next() for a part a thread is filling: the
    KeyboardInterrupt reaches the caller once no loader thread is left, and the Loader then serves the same
    epoch again, whole and right. Ctrl-C in the loop's own body (between batches) leaves the pool to the
    Loader, and its next pass is right too."""
    import signal

    ds = faulty(index_pack)
    ld = Loader(ds, 3, shuffle=True, seed=5, num_workers=2, threads=True, indices=True)
    order = served_order(index_pack)
    ds.slow = set(order[2])  # the third batch's fill waits at the gate

    main = threading.get_ident()

    def waiting() -> bool:  # the consumer is inside next(), in the pass scheduler (serve/passes.py)
        f = sys._current_frames().get(main)
        while f is not None and f.f_code.co_name != "_schedule":
            f = f.f_back
        return f is not None

    def interrupt():
        ds.entered.wait(30)
        while not waiting():
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)
        threading.Timer(0.3, ds.gate.set).start()  # the part finishes once the consumer is interrupted

    threading.Thread(target=interrupt, daemon=True).start()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            for _ in ld:
                pass
    finally:
        signal.signal(signal.SIGINT, previous)
    assert loader_threads() == []
    ds.slow = set()
    again = epoch(ld)
    assert [b[2].tolist() for b in again] == order and wrong(again) == 0
    seen = []
    with pytest.raises(KeyboardInterrupt):  # in the loop's body: the pass is left as a break leaves it
        for _images, _labels, idx in ld:
            seen.append(idx.tolist())
            if len(seen) == 2:
                raise KeyboardInterrupt
    again = epoch(ld)  # the same epoch (left early), served whole
    assert [b[2].tolist() for b in again[:2]] == seen and wrong(again) == 0
    assert torch.equal(torch.cat([b[2] for b in again]).sort().values, torch.arange(len(ds)))
    ld.close()
    assert loader_threads() == []


def test_a_fill_that_never_returns_is_a_timeout_naming_its_batch_and_its_late_write_lands_nowhere(index_pack):
    """A part stuck past the Loader's timeout: WorkerError names the batch and samples, without waiting for the
    part again. When it returns, after the next pass (another epoch) was served and kept, its write lands in no
    ring that pass's batches live in."""
    order = served_order(index_pack)
    ds = faulty(index_pack, slow=order[1])
    ld = Loader(ds, 3, shuffle=True, seed=5, num_workers=2, threads=True, indices=True, timeout=1)
    t0 = time.perf_counter()
    with pytest.raises(WorkerError, match=r"no batch from the loader threads in 1 s \(batch 1, samples \[\d+"):
        epoch(ld)
    took = time.perf_counter() - t0
    stuck = [t for t in threading.enumerate() if t.name.startswith("dataprep-loader")]
    ds.slow = set()
    ld.set_epoch(1)
    kept = list(ld)  # views of the ring, other samples in the slots the failed pass used
    ds.gate.set()
    for t in stuck:
        t.join(30)
    assert not any(t.is_alive() for t in stuck)
    assert wrong(kept) == 0 and torch.equal(torch.cat([b[2] for b in kept]).sort().values, torch.arange(len(ds)))
    ld.close()
    within(took, 10, "the 1 s timeout's error")  # not waiting for the stuck part; checked last: it may skip


@pytest.mark.parametrize("threads", [True, False])
def test_a_pass_whose_loader_was_closed_under_it_says_so(index_pack, threads):
    """Threads or worker processes: next() after close() says the Loader was closed (processes waited out
    the timeout for replies that went with the workers), and the next pass serves the epoch whole."""
    ds = dataprep.InMemoryImageDataset(index_pack)
    ld = Loader(ds, 3, num_workers=2, threads=threads, indices=True, timeout=5)
    it = iter(ld)
    next(it)
    ld.close()
    with pytest.raises(DataprepError, match=r"Loader was closed .* during this pass"):
        next(it)
    again = epoch(ld)  # the same epoch, whole, from new threads or workers
    assert wrong(again) == 0 and torch.equal(torch.cat([b[2] for b in again]), torch.arange(len(ds)))
    ld.close()
    assert loader_threads() == [] and not ld._procs


def test_worker_processes_name_the_batch_a_timeout_waited_for(index_pack):
    """The process backend's timeout names its batch and samples, as the threads' does."""
    order = served_order(index_pack)
    ds = faulty(index_pack, slow=order[1])  # a forked worker's gate is its own: never set
    with Loader(ds, 3, shuffle=True, seed=5, num_workers=2, threads=False, indices=True, timeout=1) as ld:
        with pytest.raises(WorkerError, match=rf"no batch from the loader workers in 1 s \(batch 1, samples {re.escape(str(order[1]))}"):
            epoch(ld)
        assert not ld._procs
