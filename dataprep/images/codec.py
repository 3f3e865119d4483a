"""JPEG both ways: `encode_jpeg` takes HWC uint8 pixels and gives the bytes a pack stores; the serving-time
decoders take a sample's stored JPEG bytes (a uint8 view of the RAM cache) and give HWC uint8 pixels.

`DECODE_VARIANTS` is the registry of the datasets' `decode=` values, an entry a value: what each serving path
decodes with. `DECODERS` gives each value's whole-image decoder by name; DALI's entry names its own loader, so
a dataset refuses it. `region_problem` holds a JPEG's restart segments, decoded fast, to the whole image decoded
fast (verify --decode). What is read from a JPEG's marker segments, and cut from them (restart segments,
regions, restart markers added), is jpegseg.py's.
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import DataprepError

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


Decoder = Callable[[np.ndarray, int], "np.ndarray | None"]


@dataclass(frozen=True)
class DecodeVariant:
    """One `decode=` value of the image datasets: what each serving path decodes a JPEG pack's samples with.

    A dataset looks its entry up once, when it is made (`decode_variant`); its paths ask the entry's fields,
    never its name.
    """

    name: str
    decoder: Decoder | None = None  # a whole image (a sample read alone, evaluation, fixed crops); None: the bytes
    region_crops: bool = False  # training crops (RandomResizedCrop batches) decode only the box's restart segments, fast
    same_samples_as: str | None = None  # the value whose samples this serves too: `dataprep bench` times one of them
    except_training_crops: bool = False  # ... but in training crops, where `same_samples_as` decodes regions
    loader: str | None = None  # decodes whole batches in this loader of its own: a dataset refuses the value


DECODE_VARIANTS: dict[str, DecodeVariant] = {v.name: v for v in (
    DecodeVariant("fast", decode_cv2, region_crops=True),  # the rest accurately (images/batches.py says which path is which)
    # every path accurate: OpenCV's libjpeg-turbo, accurate IDCT, fancy upsampling
    DecodeVariant("accurate", decode_cv2, same_samples_as="fast", except_training_crops=True),
    DecodeVariant("cv2", decode_cv2, same_samples_as="accurate"),  # "accurate"'s name before "fast" existed
    DecodeVariant("pil", decode_pil),
    DecodeVariant("none"),  # serve the stored bytes themselves
    DecodeVariant("dali", loader="DaliImageLoader"),  # nvJPEG, a batch at a time (images/dali.py)
)}
# the whole-image decoder of each value a dataset takes, by name: what `dataset.image(i)` calls and `dataprep bench`
# times. A decoder registered here alone is a value of its own that decodes every path whole (`decode_variant`).
DECODERS: dict[str, Decoder | None] = {v.name: v.decoder for v in DECODE_VARIANTS.values() if v.loader is None}


def decode_variant(decode: str) -> DecodeVariant:
    """The entry a dataset made with `decode=` serves by.

    Args:
        decode: the dataset's `decode=` value.

    Returns:
        Its `DECODE_VARIANTS` entry; for a name `DECODERS` alone holds, an entry that decodes every path whole
        with it. A DataprepError where the value names a loader of its own (DALI) or nothing.
    """
    variant = DECODE_VARIANTS.get(decode)
    if variant is not None and variant.loader is not None:
        raise DataprepError(f"{variant.name.upper()} decodes whole batches, not single samples: make the dataset with "
                            f"decode='none' and serve it with dataprep.{variant.loader}(dataset, batch_size)")
    if decode not in DECODERS:
        loaders = "".join(f" (or {v.loader} for {v.name.upper()})" for v in DECODE_VARIANTS.values() if v.loader is not None)
        raise DataprepError(f"unknown decode {decode!r}; choose one of {sorted(DECODERS)}{loaders}")
    return variant if variant is not None else DecodeVariant(decode, DECODERS[decode])
