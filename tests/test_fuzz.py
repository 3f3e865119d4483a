"""Fuzz: random byte flips and truncations of every awkward corpus file and 30 real photos (fixed seed, about
300 variants). The build never aborts, stays within a fixed memory bound, and every variant is either
skipped with a reason or stored as an image that a strict second opinion agrees with: Pillow (truncated
files refused) and OpenCV both decode it; for formats decoded at full scale (PNG, TIFF, ...) the stored
pixels also match that decode band by band (a half-black or half-grey picture fails). A JPEG whose entropy
data was damaged decodes to different garbage at the reduced DCT scale a build uses than at full scale
(libjpeg recovers differently, and only warns), so for JPEGs the check is that both decoders accept it."""
import io
import json
import subprocess
import sys

import numpy as np
import pytest

from .conftest import corpus_dir

pytestmark = [pytest.mark.slow, pytest.mark.corpus]

VARIANTS = 6  # per source: byte flips of growing extent, and truncations
BUILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # every variant within one fixed bound, workers too
from dataprep.images.build import build_images
from dataprep.images.settings import ImageSettings
from dataprep.settings import BuildSettings
from dataprep.sources import scan_folder
s = build_images(scan_folder(sys.argv[1]), sys.argv[2], BuildSettings(workers=2), ImageSettings(size=64, mode="raw"))
print(s.splits[0].written, sum(s.splits[0].skipped.values()))
"""


def _variants(src, out, rng):
    made = []
    for p in src:
        data = p.read_bytes()
        (out / p.name).write_bytes(data)  # the original too: its conversions are checked the same way
        made.append(out / p.name)
        for v in range(VARIANTS):
            b = bytearray(data)
            if v < 4 and len(b) > 16:
                for _ in range(1 + v * 3):  # 1, 4, 7, 10 bytes, anywhere past the magic
                    b[int(rng.integers(4, len(b)))] ^= 1 << int(rng.integers(0, 8))
            elif len(b) > 8:
                b = b[: int(rng.integers(8, len(b)))]
            name = out / f"{p.stem}-v{v}{p.suffix}"
            name.write_bytes(bytes(b))
            made.append(name)
    return made


def _second_opinion(data: bytes, want_hw, jpeg_pixels: bool = True):
    """Pillow (strict) and OpenCV both decode the bytes; Pillow's upright RGB, area-resized to `want_hw`.
    With `jpeg_pixels` False a JPEG's pixels are None: converting and resizing a decoded picture cannot fail,
    and for a photo of many megapixels they cost more than both decodes."""
    import cv2
    from PIL import Image, ImageOps

    with Image.open(io.BytesIO(data)) as im:
        im.load()  # LOAD_TRUNCATED_IMAGES is False: a truncated file raises
        up = ImageOps.exif_transpose(im)
        mode, ref = im.format, None
        if jpeg_pixels or mode != "JPEG":
            if up.mode in ("RGBA", "LA", "PA") or (up.mode == "P" and "transparency" in up.info):
                rgba = up.convert("RGBA")
                white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
                up = Image.alpha_composite(white, rgba)
            if up.mode.startswith("I"):
                arr = np.asarray(up).astype(np.float64)
                up = Image.fromarray(np.clip(np.rint(arr / 257), 0, 255).astype(np.uint8), "L")
            ref = np.asarray(up.convert("RGB"))
    if cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED) is None:
        raise ValueError("OpenCV cannot decode it")
    return (None if ref is None else cv2.resize(ref, (want_hw[1], want_hw[0]), interpolation=cv2.INTER_AREA)), mode


def _worst_band(a, b, bands=8):
    """The largest mean absolute difference over horizontal bands: a partly decoded image shows in its bands."""
    d = np.abs(a.astype(np.int16) - b.astype(np.int16)).mean(axis=2)
    return max(float(x.mean()) for x in np.array_split(d, min(bands, d.shape[0])) if x.size)


BAND_LIMIT = 12  # reduced-scale decoding and 16-bit rounding stay far below; a partial picture is far above


def test_fuzzed_sources_are_skipped_or_stored_as_a_second_decoder_sees_them(tmp_path):
    from dataprep import InMemoryImageDataset
    from dataprep.pack.backends import read_manifest

    awkward = sorted(corpus_dir("awkward").iterdir())
    photos = sorted(corpus_dir("images", "train").rglob("*.JPEG"))
    photos = photos[:: max(1, len(photos) // 30)][:30]
    assert len(awkward) >= 10 and len(photos) == 30
    cls = tmp_path / "src" / "fuzz"
    cls.mkdir(parents=True)
    made = _variants([*awkward, *photos], cls, np.random.default_rng(20261201))
    r = subprocess.run([sys.executable, "-c", BUILD, str(tmp_path / "src"), str(tmp_path / "p")], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-1500:]  # the build never aborts, within 3 GB of address space
    written, skipped = (int(x) for x in r.stdout.split())
    assert written + skipped == len(made) >= 250
    assert written > 50 and skipped > 30  # both outcomes occur: the variants do damage, and much survives
    m = read_manifest(tmp_path / "p")
    reasons = {s["reason"] for s in m["splits"]["train"]["skipped"]}
    assert reasons and all(s["reason"] and s["source"] for s in m["splits"]["train"]["skipped"])
    ds = InMemoryImageDataset(tmp_path / "p", as_numpy=True)
    disagree, checked = [], 0
    for i in range(len(ds)):
        stored = ds[i][0]
        data = (tmp_path / "src" / ds.sources[i]).read_bytes()
        try:
            ref, mode = _second_opinion(data, stored.shape[:2], jpeg_pixels=False)
        except Exception as e:  # noqa: BLE001 - any failure of the second opinion is a disagreement
            disagree.append((ds.sources[i], f"second decoder fails: {type(e).__name__}: {e}"))
            continue
        if mode != "JPEG" and _worst_band(stored, ref) > BAND_LIMIT:
            disagree.append((ds.sources[i], f"band difference {_worst_band(stored, ref):.1f}"))
        checked += mode != "JPEG"
    assert not disagree, json.dumps(disagree[:10], indent=1)
    print(f"\nfuzz: {len(made)} variants, {written} stored, {skipped} skipped ({sorted(reasons)}), {checked} compared band by band")
    assert checked >= 8  # the PNG/TIFF sources and the variants of them that survived, compared band by band


def test_the_band_check_sees_a_partial_picture():
    """Negative control for BAND_LIMIT: a photo whose lower quarter was left grey or black fails the check,
    while the same photo decoded at reduced scale passes."""
    import cv2

    from dataprep.images.decode import decode_source
    from dataprep.images.settings import ImageSettings

    photo = sorted(corpus_dir("images", "train").rglob("*.JPEG"))[7]
    data = photo.read_bytes()
    stored = decode_source(data, str(photo), ImageSettings(size=64)).pixels
    stored = cv2.resize(stored, (64 * stored.shape[1] // stored.shape[0], 64), interpolation=cv2.INTER_AREA) if stored.shape[0] != 64 else stored
    ref, _ = _second_opinion(data, stored.shape[:2])
    assert _worst_band(stored, ref) <= BAND_LIMIT
    for fill in (0, 128):
        partial = ref.copy()
        partial[3 * len(partial) // 4 :] = fill
        assert _worst_band(partial, ref) > BAND_LIMIT
