"""Stored JPEGs that a pack serves as its build decoded them, or refuses by name before a decoder allocates.

A source JPEG with junk between its marker segments (libjpeg and Pillow skip it; the pack's header walks do
not) is kept without the junk, so every serving path takes it, and `verify --decode` checks what the Loader
checks and cuts. A source whose restart markers are out of sequence keeps the picture the build decoded (the
build renumbered them into another picture; a region cut renumbered them into other crops). A frame that
declares more than its bytes, or the pack's build, allow (a 633-byte JPEG of 32767 x 32767, its shapes and
checksums forged to agree) is refused from its header by `ds[i]`, `image(i)`, `jpeg(i)` and every Loader fill.
Stored JPEG bytes tampered every way give an error naming the sample, or pixels: never a signal or a hang.
"""
from __future__ import annotations

import io
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

import dataprep
from dataprep.errors import PackError
from dataprep.images import batches, codec
from dataprep.images.build import build_images
from dataprep.images.settings import ImageSettings
from dataprep.serve.loader import Loader
from dataprep.settings import BuildSettings
from dataprep.sources import scan_imagenet
from dataprep.verify import verify_pack

from .conftest import within
from .test_verify_content import _rewrite

REPO = Path(__file__).resolve().parents[1]


def photo(h: int, w: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.stack([128 + 100 * np.sin(x / (6 + seed) + y / 17), 128 + 90 * np.cos(y / (5 + seed)), (x * 3 + y * 2) % 256], -1)
    return np.clip(img + rng.normal(0, 10, img.shape), 0, 255).astype(np.uint8)


def pil_jpeg(px: np.ndarray, **kw) -> bytes:
    out = io.BytesIO()
    Image.fromarray(px).save(out, "JPEG", **kw)
    return out.getvalue()


def pil_pixels(data: bytes) -> np.ndarray:
    """What the build decodes a source to (Pillow, as images/decode.py does)."""
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB"))


def segments(data: bytes) -> list[tuple[int, int]]:
    """(offset, marker) of each marker segment up to and including the scan's, each right after the one before."""
    out, i = [], 2
    while True:
        assert data[i] == 0xFF, f"byte {i} is no marker"
        marker, length = data[i + 1], (data[i + 2] << 8) | data[i + 3]
        out.append((i, marker))
        if marker == 0xDA:
            return out
        i += 2 + length


def with_junk(data: bytes, before: int, junk: bytes) -> bytes:
    """`junk` inserted before the marker segment `before` (0xDB: the first DQT, 0xC0: the frame header, ...)."""
    at = next(i for i, m in segments(data) if m == before)
    return data[:at] + junk + data[at:]


def restart_markers(data: bytes) -> np.ndarray:
    """Where the RST markers of a single-scan JPEG are (the offset of each 0xFF)."""
    b = np.frombuffer(data, np.uint8)
    start = segments(data)[-1][0]
    ff = np.flatnonzero(b[start:-1] == 0xFF) + start
    return ff[(b[ff + 1] & 0xF8) == 0xD0]


def misnumbered(data: bytes) -> bytes:
    """The same JPEG with its restart markers all RST0: libjpeg resynchronises (skips or pads MCUs), so it
    shows another picture than its segments in order would."""
    b = bytearray(data)
    at = restart_markers(data)
    assert len(at) > 4
    for k in at.tolist():
        b[k + 1] = 0xD0
    return bytes(b)


def tree(root: Path, files: dict[str, bytes]) -> Path:
    d = root / "train" / "a"
    d.mkdir(parents=True)
    for name, data in files.items():
        (d / name).write_bytes(data)
    (root / "train" / "b").mkdir()
    (root / "train" / "b" / "other.JPEG").write_bytes(pil_jpeg(photo(40, 56, 9), quality=90))
    return root


def build(src: Path, out: Path, **image) -> Path:
    build_images(scan_imagenet(src), out, BuildSettings(workers=1, shard_size=50), ImageSettings(**image))
    return out


def rrc_crops(ds, seed: int = 0, size: int = 24) -> np.ndarray:
    x, _ = next(iter(Loader(ds, len(ds), crop=dataprep.RandomResizedCrop(size, scale=(0.05, 1.0)), seed=seed, layout="nhwc")))
    return x.numpy()


def whole_cut(monkeypatch):
    """Region cuts made whole (the Loader's fast path then decodes every image whole): the reference."""
    real = batches.region_of
    monkeypatch.setattr(batches, "region_of", lambda buf, *box: (*real(buf, *box)[:2], None, 0, 0))


# -- junk between marker segments ------------------------------------------------------------------------------
JUNK = {"bytes before the tables": (0xDB, b"\x00junk\x12"), "FF 00 and fill before the frame": (0xC0, b"\xff\x00\x41\xff\xff"),
        "bytes after the frame": (0xC4, b"\x07" * 9), "bytes before the scan": (0xDA, b"\x01\x02")}


def test_a_source_with_junk_between_its_segments_is_kept_without_it_and_every_path_serves_it(tmp_path, monkeypatch):
    """Before: kept as it was, then refused by ds[i] ("no JPEG frame header") and by every Loader fill, so every
    epoch died at it, while `verify --decode` said ok."""
    sources = {f"j{k}.JPEG": with_junk(pil_jpeg(photo(40 + 8 * k, 64, k), quality=90), *where) for k, where in enumerate(JUNK.values())}
    pack = build(tree(tmp_path / "src", sources), tmp_path / "pack", size=64)
    assert json.loads((pack / "manifest.json").read_text())["splits"]["train"]["kept_jpeg"] == len(sources) + 1
    assert verify_pack(pack, decode=True).problems == []
    ds = dataprep.InMemoryImageDataset(pack, as_numpy=True)
    for i in range(len(ds)):
        name = Path(ds.sources[i]).name
        if name not in sources:
            continue
        stored = np.asarray(ds.stored(i)).tobytes()
        assert codec.jpeg_header(stored) is not None and codec.jpeg_problem(stored, *ds.shapes[i][:2]) is None
        assert segments(stored)[-1][1] == 0xDA  # the junk is gone: segment after segment up to the scan
        assert np.array_equal(ds[i][0], pil_pixels(sources[name])), name  # the picture the build decoded
        if codec.compiled():
            assert codec.jpeg_layout(np.asarray(ds.stored(i))) is not None, name  # and restart markers were added
    rrc = rrc_crops(ds)
    x, _ = next(iter(Loader(ds, len(ds), crop=(32, 48), layout="nhwc")))
    assert x.shape == (len(ds), 32, 48, 3)
    whole_cut(monkeypatch)
    assert np.array_equal(rrc, rrc_crops(ds))  # the region cuts give what the whole images give


def junk_pack(pack: Path, i: int) -> None:
    """Sample i of train's shard 0 given junk before its tables, as a build kept such a source before; the
    records rewritten to match (checksums say nothing)."""
    d = pack / "train" / "00000"
    blob, offsets, shapes = (np.load(d / f"{n}.npy") for n in ("images", "offsets", "shapes"))
    forge(pack, i, with_junk(blob[offsets[i] : offsets[i + 1]].tobytes(), 0xDB, b"\x00junk"), tuple(shapes[i]))


def test_verify_decode_finds_a_stored_jpeg_that_the_loader_refuses(tmp_path):
    """Before: OpenCV decoded it (skipping the junk) to its recorded shape, so verify said ok."""
    pack = build(tree(tmp_path / "src", {"x.JPEG": pil_jpeg(photo(40, 56, 1), quality=90)}), tmp_path / "pack", size=64)
    assert verify_pack(pack, decode=True).problems == []
    junk_pack(pack, 1)
    ds = dataprep.InMemoryImageDataset(pack, verify=True)
    with pytest.raises(PackError, match=r"sample 1 \(train/.*\) at 64 px holds no JPEG frame header"):
        ds[1]
    with pytest.raises(PackError, match="sample 1 "):
        rrc_crops(ds)
    problems = verify_pack(pack, decode=True).problems
    assert problems == [(str(pack / "train" / "00000"), f"sample 1 ({ds.sources[1]}): images.npy: holds no JPEG frame header, "
                         f"not the {ds.shapes[1][1]}x{ds.shapes[1][0]} JPEG its shape says (every serving path refuses it)")]


def test_verify_decode_cuts_regions_as_the_loader_does(tmp_path, monkeypatch):
    """verify --decode decodes the restart segments a training crop would cut and compares them with the
    whole image: a cut that gives other pixels is found (a cutter that places its region a block too low here)."""
    pack = build(tree(tmp_path / "src", {"x.JPEG": pil_jpeg(photo(300, 400, 1), quality=90)}), tmp_path / "pack", size=64)
    assert verify_pack(pack, decode=True).problems == []
    real = codec.region_of
    monkeypatch.setattr(codec, "region_of", lambda buf, *box: (lambda c: c if c[2] is None else (*c[:3], c[3] + 8, c[4]))(real(buf, *box)))
    problems = verify_pack(pack, decode=True).problems
    assert len(problems) == 2 and all("a training crop's restart segments decode to other pixels" in what for _, what in problems)


# -- caps from the header, before a decoder allocates ---------------------------------------------------------------
def forge(pack: Path, i: int, data: bytes, shape: tuple[int, int, int]) -> None:
    """Sample i of train's shard 0 replaced by `data` with its recorded shape `shape`, every record made to match."""
    d = pack / "train" / "00000"
    blob, offsets, shapes = (np.load(d / f"{n}.npy") for n in ("images", "offsets", "shapes"))
    new = np.concatenate([blob[: offsets[i]], np.frombuffer(data, np.uint8), blob[offsets[i + 1] :]])
    offs = offsets.copy()
    offs[i + 1 :] += len(data) - (offsets[i + 1] - offsets[i])
    shapes[i] = shape
    for name, arr in (("images", new), ("offsets", offs), ("shapes", shapes)):
        _rewrite(pack, "train", 0, name, arr)


def declaring(data: bytes, h: int, w: int) -> bytes:
    b = bytearray(data)
    sof = next(i for i, m in segments(data) if m == 0xC0)
    b[sof + 5 : sof + 9] = bytes((h >> 8, h & 255, w >> 8, w & 255))
    return bytes(b)


def paths(ds, i: int) -> dict[str, object]:
    """Every way a dataset serves sample i: alone, and in each kind of Loader fill (0 workers)."""
    def batch(crop):
        return lambda: next(iter(Loader(ds, len(ds), crop=crop)))

    return {"ds[i]": lambda: ds[i], "image(i)": lambda: ds.image(i), "jpeg(i)": lambda: ds.jpeg(i), "crop=(H, W)": batch((24, 24)),
            "RandomResizedCrop": batch(dataprep.RandomResizedCrop(24)), "CenterCrop": batch(dataprep.CenterCrop(24)),
            "RandomResizedCrop 1/2": batch(dataprep.RandomResizedCrop(8, scale=(0.9, 1)))}


def every_path(pack: Path, i: int, seconds: dict[str, float]) -> dict[str, object]:
    """Sample i through every serving path of every decode= (verify=True): each path's error, or what it gave;
    `seconds` gets how long each took."""
    out = {}
    for decode in ("fast", "accurate", "pil"):
        ds = dataprep.InMemoryImageDataset(pack, verify=True, decode=decode, as_numpy=True)
        for name, call in paths(ds, i).items():
            start = time.perf_counter()
            try:
                got: object = call()
            except Exception as e:
                got = e
            out[f"{decode} {name}"] = got
            seconds[f"{decode} {name}"] = time.perf_counter() - start
    return out


def assert_refused(pack: Path, i: int, why: str) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    seconds: dict[str, float] = {}
    for path, got in every_path(pack, i, seconds).items():
        assert isinstance(got, PackError), (path, got)
        assert f"{pack / 'train'}: sample {i} (" in str(got) and why in str(got), (path, str(got))
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 300_000, "a decoder allocated the frame"  # KiB
    slowest = max(seconds, key=seconds.__getitem__)
    within(seconds[slowest], 5, f"refusing sample {i} through {slowest}")


@pytest.fixture
def small_pack(tmp_path) -> Path:
    files = {f"x{k}.JPEG": pil_jpeg(photo(48, 64, k), quality=90) for k in range(3)}
    return build(tree(tmp_path / "src", files), tmp_path / "pack", size=64)


def test_a_633_byte_jpeg_declaring_32767_square_is_refused_from_its_header(small_pack):
    """Shapes and checksums forged to agree with the frame: before, each access decoded 3.2 GB."""
    tiny = declaring(pil_jpeg(photo(8, 8, 0), quality=90), 32767, 32767)
    assert len(tiny) < 700 and codec.jpeg_header(tiny) == (32767, 32767, 3)
    forge(small_pack, 0, tiny, (32767, 32767, 3))
    assert_refused(small_pack, 0, "bytes, fewer than a complete 32767x32767 JPEG holds")
    ds = dataprep.InMemoryImageDataset(small_pack, verify=True, as_numpy=True)
    assert ds[1][0].shape == tuple(ds.shapes[1])  # the others still serve
    problems = verify_pack(small_pack, decode=True).problems
    assert [what.split(": ", 1)[0] for _, what in problems] == [f"sample 0 ({ds.sources[0]})"], problems


def test_a_frame_over_what_the_build_makes_is_refused_even_with_the_bytes_for_it(small_pack):
    """A complete 200 x 300 JPEG in a pack built at 64 px (the shorter side at most 64): its bytes hold the
    frame, its resize mode does not make it."""
    big = pil_jpeg(photo(200, 300, 3), quality=90)
    forge(small_pack, 2, big, (200, 300, 3))
    assert_refused(small_pack, 2, "larger than its build makes at 64 px (resize 'shorter')")


def test_a_frame_over_max_pixels_is_refused_and_a_forged_manifest_does_not_lift_the_byte_floor(tmp_path):
    files = {f"x{k}.JPEG": pil_jpeg(photo(48, 64, k), quality=90) for k in range(2)}
    pack = build(tree(tmp_path / "src", files), tmp_path / "pack", size=512, max_pixels=5000)
    forge(pack, 0, pil_jpeg(photo(100, 100, 1), quality=90), (100, 100, 3))
    assert_refused(pack, 0, "10,000 pixels, over the 5,000 its build allows (max_pixels)")
    m = json.loads((pack / "manifest.json").read_text())  # the caps lifted as far as a manifest can say
    m["settings"]["image"].update(max_pixels=1 << 40, size=16384)
    (pack / "manifest.json").write_text(json.dumps(m))
    forge(pack, 1, declaring(pil_jpeg(photo(8, 8, 0), quality=90), 16384, 65500), (16384, 65500, 3))
    assert_refused(pack, 1, "bytes, fewer than a complete 65500x16384 JPEG holds")


# -- restart markers out of sequence --------------------------------------------------------------------------------
def test_a_source_whose_restart_markers_are_misnumbered_keeps_the_picture_the_build_decoded(tmp_path, monkeypatch):
    """One source at OpenCV's period of 1 MCU (the build's rule is 4: before, add_restarts read its restarts
    through and renumbered them), one at the rule's own period (kept as it was: before, a region cut
    renumbered its markers). Each is served, whole and in crops, as Pillow decoded it at the build."""
    sources = {}
    for name, period in (("one.JPEG", 1), ("rule.JPEG", 4)):
        ok, buf = cv2.imencode(".jpg", photo(96, 128, period), [cv2.IMWRITE_JPEG_QUALITY, 90, cv2.IMWRITE_JPEG_RST_INTERVAL, period])
        assert ok and codec.restart_interval(128) == 4
        sources[name] = misnumbered(buf.tobytes())
        renumbered = np.frombuffer(sources[name], np.uint8).copy()
        at = restart_markers(sources[name])
        renumbered[at + 1] = 0xD0 | (np.arange(len(at)) & 7)
        assert np.abs(pil_pixels(sources[name]).astype(int) - pil_pixels(renumbered.tobytes())).max() > 100  # the control
    pack = build(tree(tmp_path / "src", sources), tmp_path / "pack", size=128)
    ds = dataprep.InMemoryImageDataset(pack, as_numpy=True)
    rows = {Path(ds.sources[i]).name: i for i in range(len(ds))}
    for name, data in sources.items():
        assert np.array_equal(ds[rows[name]][0], pil_pixels(data)), name
        for pure in (False, True):
            if not pure and not codec.compiled():
                continue
            cut = codec.region_of(np.asarray(ds.stored(rows[name])), 0, 16, 0, 16, pure=pure)
            assert cut == (96, 128, None, 0, 0), (name, pure)  # decoded whole: no cut renumbers its markers
    got = [rrc_crops(ds, seed) for seed in range(3)]
    whole_cut(monkeypatch)
    assert all(np.array_equal(a, rrc_crops(ds, seed)) for seed, a in enumerate(got))


def test_region_cuts_refuse_markers_out_of_sequence_in_c_and_in_python():
    buf = codec.encode_jpeg(photo(64, 128, 2), 90)
    assert codec.region_of(buf, 0, 16, 0, 16, pure=True)[2] is not None  # the control: in sequence, it is cut
    bad = np.frombuffer(misnumbered(buf.tobytes()), np.uint8)
    assert codec.jpeg_layout(bad) is None
    assert codec.region_of(bad, 0, 16, 0, 16, pure=True) == (64, 128, None, 0, 0)
    if codec.compiled():
        assert codec.region_of(buf, 0, 16, 0, 16)[2] is not None
        assert codec.region_of(bad, 0, 16, 0, 16) == (64, 128, None, 0, 0)
        assert codec._jpegseg.add_restarts(bad, codec.RESTART_MCUS) is None
        swapped = bytearray(buf.tobytes())  # two markers swapped: the count adds up, the order does not
        a, b = restart_markers(bytes(swapped))[2:4].tolist()
        swapped[a + 1], swapped[b + 1] = swapped[b + 1], swapped[a + 1]
        assert codec.region_of(np.frombuffer(bytes(swapped), np.uint8), 0, 16, 0, 16)[2] is None


def test_a_standalone_marker_before_the_frame_leaves_the_jpeg_uncut_in_c_and_in_python():
    """A restart marker (FF D0) before the frame header has no length: the header walks and the decoders step
    over it. The layout walks read the next two bytes as its length: here FF FE, 64 KiB on, to the segments of
    another JPEG, and cut training crops of that picture from a sample whose header and decoders read this one.
    Now a standalone marker before the scan means no layout there: the sample is decoded whole."""
    shown = codec.encode_jpeg(photo(64, 96, 1), 90).tobytes()
    hidden = codec.encode_jpeg(photo(80, 128, 2), 90).tobytes()
    lead = b"\xff\xd8\xff\xd0" + b"\xff\xfe\x00\x10" + bytes(14)  # SOI, RST0, a 16-byte comment up to `shown`'s segments
    data = lead + shown[2:]
    data += bytes(4 + 0xFFFE - len(data)) + hidden[2:]  # where a length read at FF D0 (0xFFFE) lands: `hidden`'s segments
    buf = np.frombuffer(data, np.uint8)
    assert codec.jpeg_header(data) == (64, 96, 3) and codec.jpeg_problem(data, 64, 96) is None
    assert np.array_equal(codec.decode_cv2(buf, 3), codec.decode_cv2(np.frombuffer(shown, np.uint8), 3))  # what decoders read
    assert codec.region_of(np.frombuffer(shown, np.uint8), 0, 16, 0, 16, pure=True)[2] is not None  # the control: cut alone
    assert codec.jpeg_layout(buf) is None
    assert codec.region_of(buf, 0, 16, 0, 16, pure=True) == (64, 96, None, 0, 0)
    if codec.compiled():
        assert codec.region_of(buf, 0, 16, 0, 16) == (64, 96, None, 0, 0)


# -- stored bytes tampered every way --------------------------------------------------------------------------------
TAMPER = r'''
import json, sys
import numpy as np
import dataprep
from dataprep.errors import DataprepError
from dataprep.serve.loader import Loader
from tests.test_trust_jpeg import tampered_packs

out = []
for pack, i, what in tampered_packs(sys.argv[1]):
    for verify in (False, True):
        ds = dataprep.InMemoryImageDataset(pack, verify=verify, as_numpy=True)
        want = tuple(int(v) for v in ds.shapes[i])
        for path in ("ds[i]", "rrc"):
            try:
                if path == "ds[i]":
                    got = ds[i][0]
                    res = "pixels" if got.shape == want else f"shape {got.shape}"
                else:
                    x, _ = next(iter(Loader(ds, len(ds), crop=dataprep.RandomResizedCrop(16, scale=(0.02, 1)), seed=i)))
                    res = "pixels" if x.shape[1:] == (3, 16, 16) else f"shape {tuple(x.shape)}"
            except DataprepError as e:
                res = "named" if f"sample {i} " in str(e) else f"unnamed: {e}"
            except Exception as e:
                res = f"raw {type(e).__name__}: {e}"
            out.append((what, verify, path, res))
print(json.dumps(out))
'''


def tampered_packs(base: str):
    """Copies of one small pack, each with one sample's stored JPEG tampered one way (records made to
    match, so verify=True loads it too): (pack, sample, what was done)."""
    import shutil

    base_dir = Path(base)
    clean = base_dir / "clean"
    rng = np.random.default_rng(0)
    n = 0
    d = clean / "train" / "00000"
    blob, offsets, shapes = (np.load(d / f"{k}.npy") for k in ("images", "offsets", "shapes"))
    for i in range(len(offsets) - 1):
        data = blob[offsets[i] : offsets[i + 1]].tobytes()
        segs = segments(data)
        sof = next(at for at, m in segs if m == 0xC0)
        dri = next((at for at, m in segs if m == 0xDD), None)
        scan = segs[-1][0] + 2 + ((data[segs[-1][0] + 2] << 8) | data[segs[-1][0] + 3])
        mutants = {f"cut to {k}": data[:k] for k in (0, 1, 2, 3, 20, sof + 6, scan, scan + 5, len(data) // 2, len(data) - 2)}
        for k in rng.integers(0, scan, 12).tolist():
            mutants[f"header byte {k} flipped"] = data[:k] + bytes([data[k] ^ 0xFF]) + data[k + 1 :]
        for k in rng.integers(scan, len(data) - 2, 12).tolist():
            mutants[f"entropy byte {k} set"] = data[:k] + bytes([int(rng.integers(0, 256))]) + data[k + 1 :]
        for h, w in ((shapes[i][0] + 16, shapes[i][1]), (shapes[i][0], 1), (0, shapes[i][1]), (65535, 65535)):
            mutants[f"frame says {w}x{h}"] = declaring(data, int(h), int(w))
        if dri is not None:
            for v in (0, 1, 3, 7, 65535):
                mutants[f"restart interval {v}"] = data[: dri + 4] + bytes((v >> 8, v & 255)) + data[dri + 6 :]
        mutants["markers misnumbered"] = misnumbered(data) if len(restart_markers(data)) > 4 else data
        mutants["an EOI inside the scan"] = data[: scan + 10] + b"\xff\xd9" + data[scan + 12 :]
        mutants["a second frame header"] = data[:scan] + data[sof : sof + 19] + data[scan:]
        shape = tuple(int(v) for v in shapes[i])
        forged = {f"frame and shape say {w}x{h}": (h, w, shape[2]) for h, w in ((2 * shape[0], 2 * shape[1]), (4096, 4096))}
        for what, one in [*mutants.items(), *((what, declaring(data, h, w)) for what, (h, w, _) in forged.items())]:
            pack = base_dir / f"t{n}"
            n += 1
            shutil.copytree(clean, pack)
            forge(pack, i, one, forged.get(what, shape))
            yield pack, i, f"sample {i}: {what}"


def test_tampered_jpeg_bytes_give_an_error_naming_the_sample_or_pixels(tmp_path):
    """Truncations, flipped header bytes, set entropy bytes, frame sizes and restart intervals that lie,
    markers out of sequence, through ds[i] and the Loader's RandomResizedCrop fill (0 workers), with and
    without verify=True: in a child process with a time limit, so a signal or a hang fails the test and
    nothing else. A frame whose recorded shape was forged with it is refused, never decoded."""
    files = {"x.JPEG": pil_jpeg(photo(48, 64, 1), quality=90), "y.JPEG": pil_jpeg(photo(37, 70, 2), quality=80, subsampling=0)}
    build(tree(tmp_path / "src", files), tmp_path / "clean", size=64)
    r = subprocess.run([sys.executable, "-c", TAMPER, str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(got) > 400
    bad = [g for g in got if g[3] not in ("pixels", "named")]
    assert not bad, bad[:10]
    lies = [g for g in got if "frame and shape say" in g[0]]  # a frame its bytes or the pack's build cannot hold: never decoded
    assert len(lies) == 24 and all(g[3] == "named" for g in lies), [g for g in lies if g[3] != "named"]
    named = sum(g[3] == "named" for g in got)
    assert named > len(got) // 4, named  # most lies are caught before a decoder runs


def test_each_stored_jpeg_is_checked_once_a_process_and_a_forged_one_still_refused(tmp_path, monkeypatch):
    """The header check runs before a sample's first decode in a process, not every epoch (the held bytes do
    not change); a sample that fails it is refused on every attempt."""
    src = tree(tmp_path / "src", {f"p{k}.JPEG": pil_jpeg(photo(48, 64, k), quality=90) for k in range(5)})
    pack = build(src, tmp_path / "pack", size=40, mode="encoded")
    calls = []
    real = batches.jpeg_refusal
    monkeypatch.setattr(batches, "jpeg_refusal", lambda *a: calls.append(1) or real(*a))
    ds = dataprep.InMemoryImageDataset(pack)
    with Loader(ds, 3, crop=dataprep.RandomResizedCrop(24), flip=True) as ld:
        for _ in range(3):
            assert sum(len(x) for x, _ in ld) == len(ds)
    assert len(calls) == len(ds)  # three epochs, one check a sample
    forge(pack, 2, declaring(pil_jpeg(photo(48, 64, 9), quality=90), 30000, 30000), (48, 64, 3))
    forged = dataprep.InMemoryImageDataset(pack)
    for _ in range(2):
        with pytest.raises(PackError, match="sample 2"):
            list(Loader(forged, 3, crop=dataprep.RandomResizedCrop(24)))
