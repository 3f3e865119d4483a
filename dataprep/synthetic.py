"""Synthetic sources: takes a count and a directory, gives an ImageNet-layout tree of generated images.

Two kinds: photo-like JPEGs (gradients, shapes, noise; for the demo and throughput runs) and
index images whose pixels encode their own index, so a round trip through a pack can be checked
exactly. Nothing here needs a network or `../shared`.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np


def photo_like(seed: int, h: int, w: int) -> np.ndarray:
    """An RGB uint8 image with smooth gradients, a few filled shapes and sensor-like noise."""
    import cv2

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = rng.uniform(0, 255, 3).astype(np.float32)
    slope = rng.uniform(-0.3, 0.3, (3, 2)).astype(np.float32)
    img = np.stack([base[c] + slope[c, 0] * y + slope[c, 1] * x for c in range(3)], axis=2)
    img = np.clip(img, 0, 255).astype(np.uint8)
    for _ in range(int(rng.integers(3, 9))):
        color = tuple(int(v) for v in rng.integers(0, 256, 3))
        cx, cy = int(rng.integers(0, w)), int(rng.integers(0, h))
        if rng.random() < 0.5:
            axes = (int(rng.integers(w // 20 + 1, w // 3 + 2)), int(rng.integers(h // 20 + 1, h // 3 + 2)))
            cv2.ellipse(img, (cx, cy), axes, float(rng.uniform(0, 180)), 0, 360, color, -1)
        else:
            cv2.rectangle(img, (cx, cy), (cx + int(rng.integers(10, w // 2 + 11)), cy + int(rng.integers(10, h // 2 + 11))), color, -1)
    noise = rng.normal(0, 6, img.shape).astype(np.float32)
    return np.clip(img.astype(np.float32) + noise, 0, 255).astype(np.uint8)


def index_colour(i: int) -> np.ndarray:
    """The RGB colour of index image i (i < 1024): levels 8 apart, so JPEG's small errors cannot change the index."""
    lo, hi = 8 * (i % 32) + 4, 8 * ((i // 32) % 32) + 4
    return np.array([lo, hi, 255 - lo], np.uint8)


def index_image(i: int, h: int, w: int) -> np.ndarray:
    """A flat RGB image whose colour encodes i."""
    return np.broadcast_to(index_colour(i), (h, w, 3)).copy()


def decode_index(img: np.ndarray) -> int:
    """Read back the index from the central pixels of a colour index image."""
    h, w = img.shape[:2]
    c = img[h // 4 : 3 * h // 4 + 1, w // 4 : 3 * w // 4 + 1].reshape(-1, img.shape[2]).astype(np.float64).mean(0)
    return int(c[0] // 8) + 32 * int(c[1] // 8)


def write_tree(
    root: str | Path,
    classes: int = 4,
    per_class: int = 32,
    val_per_class: int = 0,
    sizes: tuple[tuple[int, int], ...] = ((375, 500), (480, 640), (768, 1024), (333, 500)),
    kind: str = "photo",
    ext: str = ".JPEG",
    quality: int = 90,
) -> Path:
    """Write root/train/<class>/*.JPEG (and root/val/<class>/ when val_per_class) and return root.

    With kind="index", image number k (counted over train then val, in sorted order) encodes k.
    """
    import cv2

    root = Path(root)
    k = 0
    for split, n in (("train", per_class), ("val", val_per_class)):
        for c in range(classes):
            d = root / split / f"n{c:08d}"
            if n:
                d.mkdir(parents=True, exist_ok=True)
            for j in range(n):
                h, w = sizes[(c * n + j) % len(sizes)]
                img = photo_like(k, h, w) if kind == "photo" else index_image(k, h, w)
                params = [cv2.IMWRITE_JPEG_QUALITY, quality] if ext.lower() in (".jpeg", ".jpg") else []
                if not cv2.imwrite(str(d / f"img_{j:05d}{ext}"), cv2.cvtColor(img, cv2.COLOR_RGB2BGR), params):
                    raise OSError(f"could not write {d / f'img_{j:05d}{ext}'}")
                k += 1
    return root


SEG_PALETTE = np.array([[0, 0, 0], [220, 40, 40], [40, 200, 60], [50, 80, 230], [240, 220, 30], [200, 60, 220],
                        [30, 210, 220], [255, 140, 0], [128, 128, 128], [255, 255, 255]], np.uint8)


def scene(seed: int, h: int, w: int, classes: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """A segmentation pair drawn from one layout: an RGB image whose every pixel has the colour
    SEG_PALETTE[class] of its mask value, with shapes of several classes (class 0 the background)."""
    import cv2

    rng = np.random.default_rng(seed)
    mask = np.zeros((h, w), np.uint8)
    for k in range(int(rng.integers(4, 9))):
        c = int(rng.integers(1, classes))
        cx, cy = int(rng.integers(0, w)), int(rng.integers(0, h))
        if k % 2:
            axes = (int(rng.integers(w // 12 + 2, w // 3 + 3)), int(rng.integers(h // 12 + 2, h // 3 + 3)))
            cv2.ellipse(mask, (cx, cy), axes, float(rng.uniform(0, 180)), 0, 360, c, -1)
        else:
            cv2.rectangle(mask, (cx, cy), (cx + int(rng.integers(w // 10 + 4, w // 2 + 5)), cy + int(rng.integers(h // 10 + 4, h // 2 + 5))), c, -1)
    return SEG_PALETTE[mask % len(SEG_PALETTE)], mask


def write_segmentation_tree(root: str | Path, splits: dict[str, int] | None = None,
                            sizes: tuple[tuple[int, int], ...] = ((240, 320), (300, 200), (256, 256)),
                            classes: int = 5, palette_masks: bool = True) -> tuple[Path, Path]:
    """Write root/images/<split>/scene_NNNN.png and root/masks/<split>/scene_NNNN.png (masks as palette PNGs,
    or plain 8-bit grey); return (images, masks)."""
    from PIL import Image

    root = Path(root)
    k = 0
    for split, n in (splits or {"train": 12, "val": 4}).items():
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        (root / "masks" / split).mkdir(parents=True, exist_ok=True)
        for j in range(n):
            h, w = sizes[k % len(sizes)]
            img, mask = scene(k, h, w, classes)
            Image.fromarray(img).save(root / "images" / split / f"scene_{j:04d}.png")
            m = Image.fromarray(mask)
            if palette_masks:
                m = m.convert("P")
                m.putpalette(SEG_PALETTE.reshape(-1).tolist())
            m.save(root / "masks" / split / f"scene_{j:04d}.png")
            k += 1
    return root / "images", root / "masks"


def video_frame(n: int, h: int, w: int) -> np.ndarray:
    """Frame `n` (n < 1024) of a frame-coded video: the top half one flat colour coding n (index_colour: levels 8
    apart, read back by averaging, so a lossy codec cannot change it), the bottom half a ramp, red rising with x
    and green with y (255 at the far edge), blue at 128."""
    top = h // 2
    img = np.empty((h, w, 3), np.uint8)
    img[:top] = index_colour(n)
    y, x = np.mgrid[top:h, 0:w]
    img[top:, :, 0] = (255 * x // max(w - 1, 1)).astype(np.uint8)
    img[top:, :, 1] = (255 * y // max(h - 1, 1)).astype(np.uint8)
    img[top:, :, 2] = 128
    return img


def decode_frame_number(img: np.ndarray) -> int:
    """The frame number of a frame-coded video's frame (`video_frame`), from the middle of its top half."""
    h, w = img.shape[:2]
    return decode_index(img[h // 8 : max(3 * h // 8, h // 8 + 1)].reshape(-1, w, img.shape[2]))


def write_video(path: str | Path, frames: int, h: int, w: int, fps: float = 10, codec: str = "mpeg4", first: int = 0,
                times: list[float] | None = None, rotate: int = 0) -> Path:
    """A frame-coded video (`video_frame`): frame k shows number `first + k`. Needs PyAV (the `video` extra).

    Args:
        path: The file; its extension picks the container (mp4, mkv, webm, avi, mov).
        frames: How many frames.
        h, w: The frame size (even sizes for the 4:2:0 codecs).
        fps: The frame rate, when `times` is None.
        codec: An FFmpeg encoder PyAV's wheels hold: mpeg4, libx264, libvpx-vp9 (webm), mjpeg.
        first: The first frame's number.
        times: Each frame's time in seconds (a variable frame rate); None: k / fps.
        rotate: 90, 180 or 270: an mp4 or mov whose display matrix says to turn it that many degrees clockwise.

    Returns:
        The path.
    """
    import fractions

    import av

    path = Path(path)
    tb = fractions.Fraction(1, 1000)
    with av.open(str(path), "w") as out:
        s = out.add_stream(codec, rate=fractions.Fraction(fps).limit_denominator(1000))
        s.width, s.height, s.pix_fmt = w, h, "yuv420p" if codec != "mjpeg" else "yuvj420p"
        s.codec_context.time_base = s.time_base = tb
        s.bit_rate = 20_000_000  # far above what tiny frames need: the coded colours stay within index_colour's margin
        if codec == "libx264":
            s.options = {"crf": "12"}
        for k in range(frames):
            frame = av.VideoFrame.from_ndarray(video_frame(first + k, h, w), format="rgb24")
            frame.pts = round((times[k] if times is not None else k / fps) * 1000)
            frame.time_base = tb
            for p in s.encode(frame):
                out.mux(p)
        for p in s.encode():
            out.mux(p)
    if rotate:
        _set_rotation(path, rotate)
    return path


def _set_rotation(path: Path, degrees: int) -> None:
    """Write a display matrix turning the video `degrees` clockwise into its mp4/mov track header (tkhd)."""
    import struct

    one = 0x10000  # 16.16 fixed point
    a, b = {90: (0, one), 180: (-one, 0), 270: (0, -one)}[degrees % 360]
    data = bytearray(path.read_bytes())
    k = data.find(b"tkhd")
    if k < 0:
        raise ValueError(f"{path}: no track header to rotate (only mp4 and mov have one)")
    at = k + 8 + (28 if data[k + 4] == 0 else 40) + 8  # past version/flags, the times, track id and the layer fields
    data[at : at + 36] = struct.pack(">9i", a, b, 0, -b, a, 0, 0, 0, 0x40000000)
    path.write_bytes(bytes(data))


def write_video_tree(root: str | Path, classes: int = 2, per_class: int = 2, frames: int = 12, h: int = 32, w: int = 48,
                     fps: float = 10, split: str = "train", codec: str = "mpeg4", ext: str = ".mp4") -> list[Path]:
    """Class folders of frame-coded videos: `root/<split>/class_<c>/video_<j><ext>`, video g (counted over the
    tree) numbering its frames from g * frames (keep classes * per_class * frames under 1024).

    Returns:
        The videos written, in the order the build lists them.
    """
    out = []
    for c in range(classes):
        d = Path(root) / split / f"class_{c}"
        d.mkdir(parents=True, exist_ok=True)
        for j in range(per_class):
            g = c * per_class + j
            out.append(write_video(d / f"video_{j}{ext}", frames, h, w, fps, codec, first=g * frames))
    return out
