"""JPEG both ways: `encode_jpeg` takes HWC uint8 pixels and gives the bytes a pack stores; the serving-time
decoders take a sample's stored JPEG bytes (a uint8 view of the RAM cache) and give HWC uint8 pixels.

`DECODERS` is the registry the datasets' `decode=` argument is checked against. `region_problem` holds a
JPEG's restart segments, decoded fast, to the whole image decoded fast (verify --decode). What is read from
a JPEG's marker segments, and cut from them (restart segments, regions, restart markers added), is jpegseg.py's.
"""
from __future__ import annotations

import io
from typing import Callable

import numpy as np

# jpegseg.py's names that callers (tests, benchmarks, the fuzz harness) import from here, where they lived before
from .jpegseg import (  # noqa: F401
    RESTART_MCUS,
    _jpegseg,
    compiled,
    jpeg_header,
    jpeg_layout,
    jpeg_problem,
    region_jpeg,
    region_of,
    restart_interval,
    with_restarts,
)


def encode_jpeg(pixels: np.ndarray, quality: int) -> np.ndarray:
    """JPEG-encode RGB or L pixels with OpenCV (4:2:0, as Pillow's default) with restart markers for
    region decoding (`restart_interval`); returns a uint8 byte array."""
    import cv2

    img = pixels[:, :, 0] if pixels.shape[2] == 1 else cv2.cvtColor(pixels, cv2.COLOR_RGB2BGR)
    rst = restart_interval(pixels.shape[1], 8 if pixels.shape[2] == 1 else 16)
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, int(quality), cv2.IMWRITE_JPEG_RST_INTERVAL, rst])
    if not ok:  # pragma: no cover - OpenCV only fails here on invalid input shapes
        raise ValueError(f"OpenCV could not encode a {pixels.shape} image")
    return buf.reshape(-1)


def region_problem(buf: np.ndarray, height: int, width: int, channels: int) -> str | None:
    """What the Loader's training crops would get wrong in `buf`, a `height` x `width` JPEG: the restart
    segments around its middle third, cut by `region_of` and decoded fast (as BatchFilling._cut_fast does),
    against the whole image decoded fast there. None where they agree, or where nothing is cut or the fast
    decoder reads neither (the Loader then decodes the whole image, accurately where it must)."""
    h, w = height, width
    cut = region_of(buf, h // 3, 2 * h // 3 + 1, w // 3, 2 * w // 3 + 1)
    if cut is None or cut[2] is None or not fast_decoding():
        return None
    _, _, sub, top, left = cut
    part, whole = decode_fast(np.frombuffer(sub, np.uint8) if isinstance(sub, bytes) else sub, channels), decode_fast(buf, channels)
    if part is None or whole is None:
        return None
    there = whole[top : top + part.shape[0], left : left + part.shape[1]]
    if there.shape != part.shape or not np.array_equal(there, part):
        return f"a training crop's restart segments decode to other pixels than the whole image there (rows {top} on, columns {left} on)"
    return None


def decode_fast(buf: np.ndarray, channels: int, factor: int = 1, hw: tuple[int, int] | None = None) -> np.ndarray | None:
    """Decode with libjpeg-turbo's fast integer IDCT and fast (replicating) chroma upsampling, through
    simplejpeg, at 1/factor scale (1, 2, 4 or 8: ceil(H / factor) x ceil(W / factor), as
    `decode_cv2_reduced`; `hw`, the frame's size, saves reading it again); None when the bytes do not decode. The pixels differ from the accurate
    decode's by what docs/benchmarks.md ("Fast decoding") states; the accurate path is `decode="accurate"`."""
    import simplejpeg

    try:
        if factor == 1:
            img = simplejpeg.decode_jpeg(buf, "GRAY" if channels == 1 else "RGB", fastdct=True, fastupsample=True)
        else:
            h, w = hw if hw is not None else simplejpeg.decode_jpeg_header(buf)[:2]
            img = simplejpeg.decode_jpeg(buf, "GRAY" if channels == 1 else "RGB", fastdct=True, fastupsample=True,
                                         min_height=-(-h // factor), min_width=-(-w // factor))
    except ValueError:
        return None
    return img


def fast_decoding() -> bool:
    """Whether the fast decoder (simplejpeg, a dependency with wheels for every supported platform) imports."""
    try:
        import simplejpeg  # noqa: F401
    except ImportError:
        return False
    return True


def decode_cv2(buf: np.ndarray, channels: int) -> np.ndarray | None:
    import cv2

    # The pack's JPEGs are upright already; ignoring EXIF keeps served pixels equal to the built ones.
    flags = (cv2.IMREAD_GRAYSCALE if channels == 1 else cv2.IMREAD_COLOR_RGB) | cv2.IMREAD_IGNORE_ORIENTATION
    img = cv2.imdecode(buf, flags)
    if img is None:
        return None
    return img[:, :, None] if img.ndim == 2 else img


def decode_cv2_reduced(buf: np.ndarray, channels: int, factor: int) -> np.ndarray | None:
    """Decode at 1/factor scale (1, 2, 4 or 8) in the DCT domain (libjpeg's scaled IDCT, far less work
    than a full decode and a resize): ceil(H / factor) x ceil(W / factor) pixels, pixel i covering the
    full-size pixels [i * factor, (i + 1) * factor)."""
    import cv2

    if factor == 1:
        return decode_cv2(buf, channels)
    reduced = {2: cv2.IMREAD_REDUCED_GRAYSCALE_2, 4: cv2.IMREAD_REDUCED_GRAYSCALE_4, 8: cv2.IMREAD_REDUCED_GRAYSCALE_8}[factor]
    flags = reduced | (cv2.IMREAD_COLOR_RGB if channels == 3 else 0) | cv2.IMREAD_IGNORE_ORIENTATION
    img = cv2.imdecode(buf, flags)
    if img is None:
        return None
    return img[:, :, None] if img.ndim == 2 else img


def decode_pil(buf: np.ndarray, channels: int) -> np.ndarray | None:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(buf.tobytes())) as im:
            img = np.array(im.convert("L" if channels == 1 else "RGB"))  # writable, unlike asarray
    except Exception:
        return None
    return img[:, :, None] if img.ndim == 2 else img


DECODERS: dict[str, Callable[[np.ndarray, int], np.ndarray | None] | None] = {
    # "fast": training crops (RandomResizedCrop batches) with decode_fast and region decoding; a sample
    # read alone, evaluation and fixed crops decode accurately (images/batches.py says which path is which)
    "fast": decode_cv2,
    "accurate": decode_cv2,  # every path accurate: OpenCV's libjpeg-turbo, accurate IDCT, fancy upsampling
    "cv2": decode_cv2,  # the same as "accurate" (its name before "fast" existed)
    "pil": decode_pil,
    "none": None,  # serve the stored bytes themselves
}
# names that serve what another serves, so `dataprep bench` times each way once: "cv2" is "accurate" (its name
# before "fast" existed); "accurate" serves what "fast" does except in training crops (RandomResizedCrop
# batches), where "fast" decodes only the restart segments around each box
SAME_SAMPLES_AS = {"cv2": "accurate", "accurate": "fast"}
DIFFER_IN_TRAINING_CROPS = {"accurate"}
