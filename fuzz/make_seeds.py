"""Takes nothing, gives fuzz/seeds/: small JPEGs covering what a build meets, and damaged ones.

Baseline and progressive, 4:4:4 / 4:2:2 / 4:2:0 / 4:1:1 / 4:4:0, grayscale, CMYK, restart markers and none,
optimised tables; then headers edited by hand (12-bit, arithmetic and lossless frames), restart intervals
that lie, markers out of order or inside the entropy-coded data, segments cut short, frame headers whose
sizes lie, junk between segments. Each is under 2 kB, so the fuzzer's mutations stay cheap. The files are
committed (a new Pillow or OpenCV writes other bytes); run this again only to change the set:

    .venv/bin/python fuzz/make_seeds.py
"""
from __future__ import annotations

import io
import pathlib

import cv2
import numpy as np
from PIL import Image

HERE = pathlib.Path(__file__).parent / "seeds"


def picture(h: int, w: int, seed: int) -> np.ndarray:
    """Gradients, noise and a saturated block: AC codes, DC steps and chroma edges in a few MCUs."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.stack([128 + 100 * np.sin(x / 5 + y / 9), 128 + 90 * np.cos(y / 4), (x * 7 + y * 3) % 256], -1)
    img += rng.normal(0, 20, img.shape)
    img[h // 3 : h // 2, w // 4 : w // 2] = (250, 20, 40)
    return np.clip(img, 0, 255).astype(np.uint8)


def pil(px: np.ndarray, mode: str = "RGB", **kw) -> bytes:
    out = io.BytesIO()
    Image.fromarray(px).convert(mode).save(out, "JPEG", **kw)
    return out.getvalue()


def ocv(px: np.ndarray, sampling: int | None = None, rst: int = 0, quality: int = 60) -> bytes:
    params = [cv2.IMWRITE_JPEG_QUALITY, quality, cv2.IMWRITE_JPEG_RST_INTERVAL, rst]
    if sampling is not None:
        params += [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, sampling]
    return cv2.imencode(".jpg", px, params)[1].tobytes()


def marker(data: bytes, code: int, nth: int = 0) -> int:
    """Offset of the nth marker `code` in the marker segments or the scan (0xFF then the code)."""
    at = -1
    for _ in range(nth + 1):
        at = data.index(bytes((0xFF, code)), at + 1)
    return at


def segment(data: bytes, code: int) -> bytes:
    at = marker(data, code)
    return data[at : at + 2 + ((data[at + 2] << 8) | data[at + 3])]


def setb(data: bytes, at: int, *values: int) -> bytes:
    b = bytearray(data)
    b[at : at + len(values)] = bytes(values)
    return bytes(b)


def seeds() -> dict[str, bytes]:
    px, small = picture(24, 40, 0), picture(16, 16, 1)
    grey = cv2.cvtColor(px, cv2.COLOR_RGB2GRAY)
    out = {
        "pil-444": pil(px, subsampling=0, quality=50),
        "pil-422": pil(px, subsampling=1, quality=50),
        "pil-420": pil(px, subsampling=2, quality=50),
        "pil-420-optimized": pil(px, subsampling=2, quality=95, optimize=True),
        "pil-grey": pil(grey, "L", quality=50),
        "pil-grey-optimized": pil(grey, "L", quality=90, optimize=True),
        "pil-cmyk": pil(small, "CMYK", quality=50),
        "pil-progressive": pil(px, quality=50, progressive=True),
        "pil-progressive-grey": pil(grey, "L", quality=50, progressive=True),
        "cv2-411": ocv(px, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_411),
        "cv2-440": ocv(px, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_440),
        "cv2-411-rst1": ocv(px, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_411, rst=1),
        "cv2-440-rst2": ocv(px, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_440, rst=2),
        "cv2-444-rst1": ocv(px, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444, rst=1),
        "cv2-422-rst3": ocv(px, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_422, rst=3),
        "cv2-420-rst1-pack": ocv(px, rst=1),  # a pack's own JPEG: 3 MCUs a row, period 1 (jpegseg.restart_interval)
        "cv2-grey-rst2": ocv(grey, rst=2),
        "cv2-one-mcu": ocv(picture(8, 8, 2)),
    }
    base, pack, grey_rst = out["pil-420"], out["cv2-420-rst1-pack"], out["cv2-grey-rst2"]
    sof, sos, dri = marker(base, 0xC0), marker(base, 0xDA), marker(pack, 0xDD)
    # frames add_restarts does not transcode: 12-bit, arithmetic, lossless
    out["sof1-12bit"] = setb(setb(base, sof + 1, 0xC1), sof + 4, 12)
    out["sof1-8bit"] = setb(base, sof + 1, 0xC1)
    out["sof9-arithmetic"] = setb(base, sof + 1, 0xC9)
    out["sof3-lossless"] = setb(base, sof + 1, 0xC3)
    # restart intervals that lie
    out["dri-claims-2"] = setb(pack, dri + 5, 2)
    out["dri-claims-0"] = setb(pack, dri + 5, 0)
    out["dri-claims-65535"] = setb(pack, dri + 4, 0xFF, 0xFF)
    out["dri-length-5"] = setb(pack, dri + 3, 5)
    out["rst-misnumbered"] = setb(pack, marker(pack, 0xD0) + 1, 0xD5)
    out["rst-missing"] = pack[: marker(pack, 0xD1)] + pack[marker(pack, 0xD1) + 2 :]
    out["rst-extra"] = pack[: marker(pack, 0xD1)] + b"\xff\xd7" + pack[marker(pack, 0xD1) :]
    out["rst-in-plain-scan"] = base[: sos + 40] + b"\xff\xd0" + base[sos + 40 :]
    out["grey-rst-misnumbered"] = setb(grey_rst, marker(grey_rst, 0xD1) + 1, 0xD0)
    # markers out of order
    dht = segment(base, 0xC4)
    out["dht-after-sos"] = base.replace(dht, b"", 1)[: sos - len(dht)] + dht + base[sos:]
    out["sof-after-sos"] = base[:sof] + base[sof + len(segment(base, 0xC0)) : sos] + segment(base, 0xC0) + base[sos:]
    out["two-sof"] = base[:sos] + segment(base, 0xC0) + base[sos:]
    out["soi-twice"] = base[:2] + base
    out["eoi-before-sos"] = base[:sos] + b"\xff\xd9" + base[sos:]
    out["dri-inside-scan"] = base[: sos + 30] + segment(pack, 0xDD) + base[sos + 30 :]
    out["no-dht"] = base.replace(dht, b"")
    # markers inside the entropy-coded data
    mid = (sos + len(base)) // 2
    for name, code in (("eoi", 0xD9), ("dht", 0xC4), ("sos", 0xDA), ("tem", 0x01), ("ff-fill", 0xFF)):
        out[f"{name}-inside-scan"] = base[:mid] + bytes((0xFF, code)) + base[mid:]
    out["stuffing-dropped"] = base.replace(b"\xff\x00", b"\xff", 1) if b"\xff\x00" in base[sos:] else base[:-3] + b"\xff\xff\xd9"
    # segments cut short
    for k, cut in enumerate((sof + 6, marker(base, 0xC4) + 9, sos + 5, (sos + len(base)) // 2, len(base) - 2, len(base) - 5)):
        out[f"cut-{k}"] = base[:cut]
    out["pack-cut-before-eoi"] = pack[: len(pack) - 2]
    out["dht-length-past-end"] = setb(base, marker(base, 0xC4) + 2, 0xFF, 0xF0)
    # frame headers whose sizes lie
    out["sof-length-short"] = setb(base, sof + 3, 7)
    out["sof-length-long"] = setb(base, sof + 3, 18)
    out["sof-4-components"] = setb(base, sof + 9, 4)
    out["sof-2-components"] = setb(base, sof + 9, 2)
    out["sof-zero-size"] = setb(base, sof + 5, 0, 0, 0, 0)
    out["sof-huge"] = setb(pack, marker(pack, 0xC0) + 5, 0xFF, 0xFF, 0xFF, 0xFF)
    out["sof-taller"] = setb(pack, marker(pack, 0xC0) + 5, 0, 200)
    out["sof-wider"] = setb(base, sof + 7, 1, 0)
    out["sof-sampling-0"] = setb(base, sof + 11, 0x00)
    out["sof-sampling-4x4"] = setb(base, sof + 11, 0x44)
    out["sos-components-1"] = setb(base, sos + 4, 1)
    out["sos-table-9"] = setb(base, sos + 6, 0x99)
    out["sos-spectral"] = setb(base, len(segment(base, 0xDA)) + sos - 3, 1)
    # junk between segments (Pillow and libjpeg skip it)
    app0 = marker(base, 0xE0)
    after = app0 + len(segment(base, 0xE0))
    out["junk-between-segments"] = base[:after] + b"\x00\x11junk" + base[after:]
    out["junk-before-sos"] = base[:sos] + b"\x00\x00" + base[sos:]
    return out


def main() -> None:
    HERE.mkdir(exist_ok=True)
    for old in HERE.glob("*.jpg"):
        old.unlink()
    for name, data in seeds().items():
        assert len(data) < 2048, (name, len(data))
        (HERE / f"{name}.jpg").write_bytes(data)
    print(f"{len(list(HERE.glob('*.jpg')))} seeds in {HERE}")


if __name__ == "__main__":
    main()
