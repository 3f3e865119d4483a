"""The compiled restart-segment code (images/_jpegseg.c) against what it must equal or keep.

region(): the same bytes as the Python cut (codec.region_jpeg on codec.jpeg_layout) for any box, on
pack JPEGs and on JPEGs given markers by add_restarts, and a cut decodes to the whole image's pixels
there. add_restarts(): restart markers put into Pillow's and OpenCV's JPEGs without a pixel changing
(a plain re-encode, the negative control, changes them), at codec.restart_interval's period, rebuilding
the DC tables where an optimised table has no code for a new difference; None for what it cannot do,
quickly and in bounded memory for frames that claim more than their bytes hold; no crash on damaged
bytes. The pure fallbacks, the shared corpus, and a build that keeps source JPEGs with markers added.
"""
from __future__ import annotations

import glob
import io
import json
import time
import tracemalloc

import cv2
import numpy as np
import pytest
from PIL import Image

import dataprep
from dataprep.images import codec, jpegseg
from dataprep.images.build import build_images
from dataprep.images.settings import ImageSettings
from dataprep.settings import BuildSettings
from dataprep.sources import scan_imagenet
from dataprep.synthetic import write_tree

from .conftest import corpus_dir, within

needs_c = pytest.mark.skipif(not codec.compiled(), reason="images/_jpegseg.c is not built (no C compiler at install)")
MAX = codec.RESTART_MCUS


def photo(h: int, w: int, seed: int) -> np.ndarray:
    """Gradients, noise and a saturated block: texture for the AC codes, sharp chroma edges."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.stack([128 + 100 * np.sin(x / (7 + seed) + y / 23), 128 + 90 * np.cos(y / (5 + seed)), (x * 3 + y * 2) % 256], -1)
    img += rng.normal(0, 12, img.shape)
    img[h // 3 : h // 2, w // 4 : w // 2] = (250, 20, 40)
    return np.clip(img, 0, 255).astype(np.uint8)


def pil_jpeg(px: np.ndarray, **kw) -> bytes:
    out = io.BytesIO()
    Image.fromarray(px[:, :, 0] if px.ndim == 3 and px.shape[2] == 1 else px).save(out, "JPEG", **kw)
    return out.getvalue()


def u8(b) -> np.ndarray:
    return np.frombuffer(bytes(b), np.uint8)


def decoded(b, flags=cv2.IMREAD_UNCHANGED) -> np.ndarray | None:
    return cv2.imdecode(u8(b), flags)


def same_pixels(a, b) -> bool:
    x, y = decoded(a), decoded(b)
    return x is not None and y is not None and x.shape == y.shape and np.array_equal(x, y)


def flat_then_step(mode: str) -> np.ndarray:
    """A flat 138 image but for its first 8x8 block at 133: at Pillow's quality 95 (DC step 2) the luma DC
    differences are 20 and 20 (size 5), so an optimised table has codes for sizes 0 and 5 only, while the
    first block of every new restart segment codes its whole DC of 40 (size 6): no code for it."""
    px = np.full((64, 128), 138, np.uint8)
    px[:8, :8] = 133
    return px if mode == "L" else np.repeat(px[:, :, None], 3, 2)


def boxes(h: int, w: int, rng: np.random.Generator, n: int) -> list[tuple[int, int, int, int]]:
    """Random boxes inside, partly outside and wholly outside the image, and empty, inverted and whole ones."""
    out = [(0, h, 0, w), (-5, h + 9, -3, w + 20), (0, 0, 0, w), (3, 3, 4, 4), (h, h + 5, 0, w), (0, h, w + 1, w + 9),
           (5, 2, 9, 1), (h - 1, h, w - 1, w), (0, 1, 0, 1), (-40, 1, -40, 1)]
    for _ in range(n):
        y0, y1 = sorted(int(v) for v in rng.integers(-h // 4, h + h // 4, 2))
        x0, x1 = sorted(int(v) for v in rng.integers(-w // 4, w + w // 4, 2))
        out.append((y0, y1 + int(rng.integers(0, 2)), x0, x1 + int(rng.integers(0, 2))))
    return out


def assert_same_region(buf, box) -> tuple:
    """C's region() and the Python path agree on this box (None, whole, or the very bytes and origin)."""
    c, p = codec.region_of(buf, *box), codec.region_of(buf, *box, pure=True)
    assert (c is None) == (p is None), (box, c, p)
    if c is None:
        return c
    assert (c[0], c[1], c[3], c[4]) == (p[0], p[1], p[3], p[4]), (box, c[:2], p[:2], c[3:], p[3:])
    assert (c[2] is None) == (p[2] is None), (box, c[2] is None, p[2] is None)
    if c[2] is not None:
        assert isinstance(c[2], bytes) and c[2] == p[2].tobytes(), box
    return c


def with_markers() -> list[tuple[str, np.ndarray]]:
    """Pack-style JPEGs (codec.encode_jpeg) at odd sizes, colour and grey, and Pillow JPEGs of each
    subsampling (and grey) given markers by add_restarts."""
    out = []
    for h, w in ((37, 53), (129, 347), (256, 341), (200, 373)):
        px = photo(h, w, h % 5)
        out.append((f"encode_jpeg {h}x{w}", codec.encode_jpeg(px, 90)))
        out.append((f"encode_jpeg grey {h}x{w}", codec.encode_jpeg(cv2.cvtColor(px, cv2.COLOR_RGB2GRAY)[:, :, None], 85)))
    for sub in (0, 1, 2):
        px = photo(123, 8 * 16 * 3 + 9, sub)
        out.append((f"pillow {sub}", u8(codec._jpegseg.add_restarts(pil_jpeg(px, quality=90, subsampling=sub), MAX))))
    grey = cv2.cvtColor(photo(77, 250, 3), cv2.COLOR_RGB2GRAY)
    out.append(("pillow L", u8(codec._jpegseg.add_restarts(pil_jpeg(grey, quality=80, optimize=True), MAX))))
    return out


@needs_c
def test_region_gives_the_python_paths_bytes_for_every_box():
    rng = np.random.default_rng(7)
    cut = 0
    for name, buf in with_markers():
        lay = codec.jpeg_layout(buf)
        assert lay is not None, name
        for box in boxes(lay.height, lay.width, rng, 25):
            got = assert_same_region(buf, box)
            assert got[:2] == (lay.height, lay.width)
            cut += got[2] is not None
        # bytes and bytearray are read through the buffer protocol as the array is
        assert codec._jpegseg.region(buf.tobytes(), 0, 8, 0, 8)[2] == codec._jpegseg.region(bytearray(buf), 0, 8, 0, 8)[2]
    assert cut > 300  # most boxes are cut, not decoded whole: the equality is not that of two Nones


@needs_c
@pytest.mark.parametrize("subsampling", [0, 1, 2, "L"])
def test_a_cut_decodes_to_the_whole_images_pixels_there(subsampling):
    """4:2:2, 4:2:0: the fast decode (replicating upsampling, which stays inside an MCU) of a cut equals that of the
    whole image there; 4:4:4 and grey need no upsampling, so the accurate decode equals too."""
    px = photo(150, 16 * 12 + 5, 4)
    if subsampling == "L":
        px = cv2.cvtColor(px, cv2.COLOR_RGB2GRAY)
    src = pil_jpeg(px, quality=92, **({} if subsampling == "L" else {"subsampling": subsampling}))
    buf = u8(codec._jpegseg.add_restarts(src, MAX))
    channels = 1 if subsampling == "L" else 3
    flags = cv2.IMREAD_GRAYSCALE if channels == 1 else cv2.IMREAD_COLOR
    fast_whole, cv_whole = codec.decode_fast(buf, channels), decoded(buf, flags)
    rng = np.random.default_rng(1)
    for y0, y1, x0, x1 in boxes(150, px.shape[1], rng, 10)[10:]:
        h, w, sub, top, left = codec.region_of(buf, y0, y1, x0, x1)
        if sub is None:
            continue
        part = decoded(sub, flags)
        assert part is not None
        fast = codec.decode_fast(u8(sub), channels)
        assert fast.shape[:2] == part.shape[:2]
        assert top <= max(0, y0) and top + part.shape[0] >= min(h, y1)  # the box (clipped) is covered
        assert left <= max(0, x0) and left + part.shape[1] >= min(w, x1)
        assert np.array_equal(fast, fast_whole[top : top + part.shape[0], left : left + part.shape[1]])
        if subsampling in (0, "L"):  # no chroma upsampling: the accurate decode is the same there too
            assert np.array_equal(part, cv_whole[top : top + part.shape[0], left : left + part.shape[1]])
        # negative control: one MCU row lower is other pixels
        lower = fast_whole[top + 16 : top + 16 + part.shape[0], left : left + part.shape[1]]
        assert lower.shape != fast.shape or not np.array_equal(fast, lower)


PILLOW_CASES = [dict(quality=q, optimize=o, subsampling=s) for q in (50, 95) for o in (False, True) for s in (0, 1, 2)]


@needs_c
@pytest.mark.parametrize("grey", [False, True], ids=["colour", "grey"])
def test_add_restarts_keeps_every_pixel_of_pillows_jpegs(grey):
    n = 0
    for h, w in ((75, 203), (50, 120), (61, 100), (40, 16), (33, 8)):  # 203 and 100: no multiple of 16; 16 and 8: one MCU
        px = photo(h, w, w % 7)
        if grey:
            px = cv2.cvtColor(px, cv2.COLOR_RGB2GRAY)
        for kw in PILLOW_CASES if not grey else [dict(quality=q, optimize=o) for q in (50, 95) for o in (False, True)]:
            src = pil_jpeg(px, **kw)
            out = codec._jpegseg.add_restarts(src, MAX)
            assert isinstance(out, bytes), (h, w, kw)
            assert same_pixels(src, out), (h, w, kw)
            assert np.array_equal(decoded(out, cv2.IMREAD_COLOR), decoded(src, cv2.IMREAD_COLOR)), (h, w, kw)
            lay = codec.jpeg_layout(u8(out))
            mcu_w = 8 if grey or kw["subsampling"] == 0 else 16
            assert lay is not None and (lay.height, lay.width, lay.mcu_w) == (h, w, mcu_w), (h, w, kw)
            assert lay.interval == codec.restart_interval(w, mcu_w), (h, w, kw, lay.interval)
            assert codec.jpeg_header(out) == codec.jpeg_header(src)
            n += 1
    assert n == 5 * (4 if grey else 12)


@needs_c
@pytest.mark.parametrize("source_interval,width", [(1, 128), (3, 128), (3, 16 * 11 + 3), (5, 160), (2, 16 * 13)])
def test_add_restarts_changes_another_restart_period(source_interval, width):
    """OpenCV's markers at a period that is not the rule's (128 px: 8 MCUs, the rule's 4): the source's
    restarts are read through and the new ones written, the pixels unchanged."""
    px = photo(90, width, 2)
    src = cv2.imencode(".jpg", px, [cv2.IMWRITE_JPEG_QUALITY, 88, cv2.IMWRITE_JPEG_RST_INTERVAL, source_interval])[1]
    rule = codec.restart_interval(width, 16)
    assert rule != source_interval
    out = codec._jpegseg.add_restarts(src, MAX)
    assert out is not None and same_pixels(src, out)
    lay = codec.jpeg_layout(u8(out))
    assert lay is not None and lay.interval == rule
    assert_same_region(u8(out), (20, 50, 30, 90))


@needs_c
@pytest.mark.parametrize("mode,subsampling", [("L", None), ("RGB", 0), ("RGB", 1), ("RGB", 2)])
def test_add_restarts_rebuilds_dc_tables_an_optimised_file_lacks(mode, subsampling):
    src = pil_jpeg(flat_then_step(mode), quality=95, optimize=True, **({} if subsampling is None else {"subsampling": subsampling}))
    out = codec._jpegseg.add_restarts(src, MAX)
    assert out is not None and same_pixels(src, out)
    assert out.count(b"\xff\xc4") == src.count(b"\xff\xc4") + 1  # a DHT redefining the DC tables: the rebuild ran
    lay = codec.jpeg_layout(u8(out))
    assert lay is not None and lay.interval == codec.restart_interval(128, lay.mcu_w)
    # the same pixels without optimised tables: the file's standard table has every size, no rebuild
    plain = pil_jpeg(flat_then_step(mode), quality=95, **({} if subsampling is None else {"subsampling": subsampling}))
    again = codec._jpegseg.add_restarts(plain, MAX)
    assert again.count(b"\xff\xc4") == plain.count(b"\xff\xc4") and same_pixels(plain, again)


@needs_c
def test_a_plain_re_encode_is_not_pixel_identical():
    """The negative control of the pixel checks above: re-encoding decoded pixels with markers (what
    add_restarts avoids) changes them, even at quality 95."""
    src = pil_jpeg(photo(75, 203, 1), quality=90)
    pixels = decoded(src)
    reencoded = cv2.imencode(".jpg", pixels, [cv2.IMWRITE_JPEG_QUALITY, 95, cv2.IMWRITE_JPEG_RST_INTERVAL, 1])[1]
    assert codec.jpeg_layout(reencoded) is not None
    assert not same_pixels(src, reencoded)
    assert same_pixels(src, codec._jpegseg.add_restarts(src, MAX))


def huge_claim(height: int, width: int) -> bytes:
    """A small pack JPEG (restart markers every 3 MCUs) whose frame header claims height x width."""
    b = bytearray(codec.encode_jpeg(photo(32, 48, 0), 80).tobytes())
    sof = b.index(b"\xff\xc0")
    b[sof + 5 : sof + 9] = bytes((height >> 8, height & 255, width >> 8, width & 255))
    return bytes(b)


@needs_c
def test_add_restarts_refuses_what_it_cannot_do():
    px = photo(80, 120, 3)
    refused = {
        "progressive": pil_jpeg(px, quality=90, progressive=True),
        "png": cv2.imencode(".png", px)[1].tobytes(),
        "garbage": np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8).tobytes(),
        "soi only": b"\xff\xd8",
        "empty": b"",
        "cmyk": pil_jpeg_cmyk(px),
        "12-bit claim": twelve_bit(pil_jpeg(px, quality=90)),
    }
    src = pil_jpeg(px, quality=90)
    scan = src.index(b"\xff\xda")
    for k, cut in enumerate((scan + 30, (scan + len(src)) // 2, len(src) - 40, len(src) - 12)):
        refused[f"truncated {k}"] = src[:cut]
    for name, data in refused.items():
        assert codec._jpegseg.add_restarts(data, MAX) is None, name
        assert codec.with_restarts(data) is data
    out = codec._jpegseg.add_restarts(src, MAX)
    assert out is not None and codec._jpegseg.add_restarts(out, MAX) is None  # its own output: the period is right
    pack = codec.encode_jpeg(px, 90).tobytes()
    assert codec._jpegseg.add_restarts(pack, MAX) is None  # a pack's own JPEG: already right
    ocv = cv2.imencode(".jpg", photo(40, 96, 0), [cv2.IMWRITE_JPEG_RST_INTERVAL, 3])[1].tobytes()  # 6 MCUs: 3 is the rule's
    assert codec._jpegseg.add_restarts(ocv, MAX) is None
    # only EOI cut: every MCU is there, but OpenCV, Pillow and simplejpeg refuse the file, so its copy with
    # markers (and an EOI) must not decode either (fuzz/agree.py: the same refusal)
    assert codec._jpegseg.add_restarts(src[: len(src) - 2], MAX) is None
    assert decoded(src[: len(src) - 2]) is None


def pil_jpeg_cmyk(px: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(px).convert("CMYK").save(out, "JPEG", quality=90)
    return out.getvalue()


def twelve_bit(data: bytes) -> bytes:
    b = bytearray(data)
    b[b.index(b"\xff\xc0") + 4] = 12
    return bytes(b)


@needs_c
def test_frames_that_claim_more_than_their_bytes_are_refused_quickly_in_bounded_memory():
    slowest = (0.0, "")
    for h, w in ((65535, 65535), (4096, 4096), (65535, 16)):
        data = huge_claim(h, w)
        tracemalloc.start()
        t0 = time.perf_counter()
        restarts = codec._jpegseg.add_restarts(data, MAX)
        region = codec._jpegseg.region(data, 0, 8, 0, 8)
        seconds = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert restarts is None and region == (h, w, None, 0, 0), (h, w)
        assert peak < 1 << 20, (h, w, seconds, peak)  # per-MCU arrays would be 100s of MB
        assert_same_region(u8(data), (0, 8, 0, 8))
        slowest = max(slowest, (seconds, f"{h}x{w}"))
    # the controls: the real size is cut, so what is refused is the claim; and tracemalloc sees what the
    # compiled part allocates (its output buffer, for a file of some size)
    assert codec._jpegseg.region(huge_claim(32, 48), 0, 8, 0, 8)[2] is not None
    big = pil_jpeg(np.random.default_rng(0).integers(0, 256, (640, 640, 3), dtype=np.uint8), quality=100, subsampling=0)
    tracemalloc.start()
    assert codec._jpegseg.add_restarts(big, MAX) is not None
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak > len(big) > 1 << 20
    within(slowest[0], 0.2, f"refusing a frame that claims {slowest[1]}")


@needs_c
def test_region_refuses_as_the_python_path_does():
    px = photo(80, 120, 3)
    src = pil_jpeg(px, quality=90)
    cases = [src, pil_jpeg(px, quality=90, progressive=True), cv2.imencode(".png", px)[1].tobytes(), b"", b"\xff\xd8",
             np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8).tobytes(), pil_jpeg_cmyk(px),
             cv2.imencode(".jpg", px, [cv2.IMWRITE_JPEG_RST_INTERVAL, 3])[1].tobytes()]  # 3 does not divide 8 MCUs
    pack = codec.encode_jpeg(px, 90).tobytes()
    cases += [pack[:cut] for cut in (3, 20, pack.index(b"\xff\xda") + 10, len(pack) // 2, len(pack) - 2)]
    for data in cases:
        for box in ((0, 8, 0, 8), (10, 60, 20, 100), (0, 80, 0, 120)):
            assert_same_region(u8(data), box)
    assert codec._jpegseg.region(b"\x89PNG", 0, 1, 0, 1) is None
    assert codec._jpegseg.region(src, 0, 8, 0, 8) == (80, 120, None, 0, 0)


def one_byte_changed(data: bytes, at: int, value: int) -> bytes:
    b = bytearray(data)
    b[at] = value
    return bytes(b)


def malformed(kind: str) -> bytes:
    """A pack JPEG with one byte of its marker segments changed; no decoder reads any of them."""
    data = codec.encode_jpeg(photo(72, 149, 6), 85).tobytes()
    if kind == "soi before the frame":  # APP0's marker made a second SOI: jpeg_header walks it as a segment
        assert data[2:4] == b"\xff\xe0"
        return one_byte_changed(data, 3, 0xD8)
    if kind == "huffman counts past the segment":  # the first DHT's count of 4-bit codes set to 255
        dht = data.index(b"\xff\xc4")
        return one_byte_changed(data, dht + 8, 0xFF)
    scan = data.index(b"\xff\xda")  # "scan header length": 13 where 3 components make it 12
    assert data[scan + 3] == 12
    return one_byte_changed(data, scan + 3, 13)


@needs_c
@pytest.mark.parametrize("kind", ["soi before the frame", "huffman counts past the segment", "scan header length"])
def test_region_agrees_with_the_python_path_on_malformed_marker_segments(kind):
    """region() must give what region_of(pure=True) gives (the module docstring of _jpegseg.c: "the same
    bytes codec.region_jpeg makes from codec.jpeg_layout"; None only where jpeg_header is None), also
    where the marker segments are malformed: damaged files reach a pack's reader as any others do."""
    data = malformed(kind)
    assert codec.jpeg_header(data) == (72, 149, 3)
    assert cv2.imdecode(u8(data), cv2.IMREAD_COLOR) is None  # unreadable: only the agreement is at stake
    assert_same_region(u8(data), (0, 8, 0, 8))


def mutants(data: bytes, n: int, seed: int):
    """Copies of `data` with 1-4 bytes replaced (a third of them in the marker segments) or cut short."""
    rng = np.random.default_rng(seed)
    scan = data.index(b"\xff\xda")
    for k in range(n):
        b = bytearray(data)
        if k % 5 == 4:
            yield bytes(b[: int(rng.integers(2, len(b)))])
            continue
        for _ in range(int(rng.integers(1, 5))):
            at = int(rng.integers(2, scan + 12)) if rng.random() < 0.33 else int(rng.integers(scan, len(b)))
            b[at] = int(rng.integers(0, 256)) if rng.random() < 0.7 else b[at] ^ (1 << int(rng.integers(0, 8)))
        yield bytes(b)


@needs_c
def test_damaged_bytes_do_not_crash_and_agree_with_the_python_path():
    """Every disagreement is collected (and named by the bytes changed) so that one kind of it does not
    hide the checks of the others."""
    px = photo(72, 16 * 9 + 5, 6)
    sources = [codec.encode_jpeg(px, 85).tobytes(), pil_jpeg(px, quality=85, optimize=True, subsampling=1),
               cv2.imencode(".jpg", cv2.cvtColor(px, cv2.COLOR_RGB2GRAY), [cv2.IMWRITE_JPEG_RST_INTERVAL, 2])[1].tobytes()]
    produced = cut = 0
    disagree = []
    for s, data in enumerate(sources):
        for m in mutants(data, 150, s):
            out = codec._jpegseg.add_restarts(m, MAX)
            if out is not None:
                produced += 1
                assert codec.jpeg_header(out) == codec.jpeg_header(m)
                lay = codec.jpeg_layout(u8(out))
                assert lay is not None and lay.interval == codec.restart_interval(lay.width, lay.mcu_w)
                assert codec._jpegseg.add_restarts(out, MAX) is None
            for box in ((0, 8, 0, 8), (20, 50, 40, 120), (-4, 100, 100, 400)):
                try:
                    got = assert_same_region(u8(m), box)
                except AssertionError as e:
                    changed = [(i, data[i], m[i]) for i in range(min(len(m), len(data))) if m[i] != data[i]]
                    disagree.append((s, len(m), changed, str(e).splitlines()[0][:80]))
                    break
                cut += got is not None and got[2] is not None
    assert produced > 50 and cut > 200  # damaged entropy data mostly still transcodes and cuts: the checks ran
    assert not disagree, f"{len(disagree)} of 450 mutants, e.g. {disagree[:3]}"


@needs_c
def test_the_corpus_gets_markers_without_a_pixel_changing():
    files = sorted(glob.glob(str(corpus_dir("images") / "**" / "*.JPEG"), recursive=True))
    if not files:
        pytest.skip("no JPEG files in the shared corpus")
    files = files[:: max(1, len(files) // 60)][:60]
    kinds = {"progressive": 0, "marked": 0}
    for f in files:
        with open(f, "rb") as fh:
            data = fh.read()
        with Image.open(f) as im:
            progressive = bool(im.info.get("progressive"))
        out = codec._jpegseg.add_restarts(data, MAX)
        if out is None:
            assert progressive, f
            kinds["progressive"] += 1
            continue
        assert not progressive and same_pixels(data, out), f
        lay = codec.jpeg_layout(u8(out))
        assert lay is not None and lay.interval == codec.restart_interval(lay.width, lay.mcu_w), f
        kinds["marked"] += 1
    assert kinds["marked"] > 10, kinds


def test_without_the_compiled_part_sources_stay_as_they_are_and_regions_are_cut_in_python(monkeypatch):
    px = photo(100, 16 * 7 + 3, 2)
    buf = codec.encode_jpeg(px, 90)
    src = pil_jpeg(px, quality=90)
    box_list = boxes(100, px.shape[1], np.random.default_rng(3), 10)
    compiled = codec.compiled()
    with_c = [codec.region_of(buf, *b) for b in box_list] if compiled else None
    if compiled:
        assert codec.with_restarts(src) is not src  # the control: with it, markers are added
    monkeypatch.setattr(jpegseg, "_jpegseg", None)  # where region_of and with_restarts look for it
    assert not codec.compiled()
    assert codec.with_restarts(src) is src
    lay = codec.jpeg_layout(buf)
    for k, b in enumerate(box_list):
        got = codec.region_of(buf, *b)
        sub, top, left = codec.region_jpeg(buf, lay, *b)
        assert got[:2] == (100, px.shape[1]) and got[3:] == (top, left)
        assert (got[2] is None) == (sub is buf) and (got[2] is None or np.array_equal(got[2], sub))
        if compiled:
            c = with_c[k]
            assert c[:2] == got[:2] and c[3:] == got[3:] and (c[2] is None) == (got[2] is None)
            assert c[2] is None or c[2] == got[2].tobytes()
    assert codec.region_of(u8(src), 0, 8, 0, 8) == (100, px.shape[1], None, 0, 0)
    assert codec.region_of(u8(b"not a jpeg"), 0, 8, 0, 8) is None


@needs_c
def test_a_build_keeps_source_jpegs_with_markers_and_their_pixels(tmp_path):
    src = write_tree(tmp_path / "src", classes=2, per_class=2, sizes=((120, 150), (100, 100)))  # OpenCV 4:2:0
    extra = src / "train" / "n00000000"
    Image.fromarray(photo(110, 133, 1)).save(extra / "p444.JPEG", quality=95, subsampling=0, optimize=True)
    Image.fromarray(flat_then_step("RGB")).save(extra / "flat.JPEG", quality=95, optimize=True)  # the DC rebuild
    Image.fromarray(photo(100, 140, 2)).save(extra / "prog.JPEG", quality=90, progressive=True)
    summary = build_images(scan_imagenet(src), tmp_path / "pack", BuildSettings(shard_size=3), ImageSettings(size=160))
    ds = dataprep.InMemoryImageDataset(tmp_path / "pack")
    assert len(ds) == 7
    for i in range(len(ds)):
        stored = np.asarray(ds.stored(i))
        path = src / ds.sources[i]
        source = path.read_bytes()
        assert same_pixels(stored, source), path
        if "prog" in path.name:
            assert stored.tobytes() == source  # kept as it was, decoded whole
        else:
            lay = codec.jpeg_layout(stored)
            assert lay is not None and lay.interval == codec.restart_interval(lay.width, lay.mcu_w), path
            assert stored.tobytes() != source
    assert sum(s.kept_jpeg for s in summary.splits) == 7
    manifest = json.loads((tmp_path / "pack" / "manifest.json").read_text())
    assert sum(sp["kept_jpeg"] for sp in manifest["splits"].values()) == 7


def test_the_compiled_part_is_built_where_a_c_compiler_is():
    """setup.py declares the extension optional so that an install without a compiler goes on; this is the
    check that an install with one did build it (a wrong path or name in setup.py installs silently)."""
    import os
    import shutil
    import sysconfig

    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    headers = os.path.join(sysconfig.get_paths()["include"], "Python.h")
    if shutil.which(cc) is None or not os.path.exists(headers):
        pytest.skip(f"no C compiler ({cc}) or no Python headers here: the pure path serves")
    assert codec.compiled(), "a C compiler is here but dataprep.images._jpegseg did not build: `pip install -e .`"
