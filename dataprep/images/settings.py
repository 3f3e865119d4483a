"""Image settings: how each source image becomes a stored sample, frozen and validated, recorded in the manifest."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..errors import DataprepError

IMAGE_MODES = ("encoded", "raw")


@dataclass(frozen=True)
class ImageSettings:
    """How each source image becomes a stored sample (decode -> resize -> encode).

    Everything here changes the bytes of the pack, so all of it is recorded in the manifest.
    """

    size: int = 512
    sizes: tuple[int, ...] = ()  # several resolutions in one pass (then `size` is their largest)
    resize: str = "shorter"
    upscale: bool = False
    grayscale: bool = False
    mode: str = "encoded"
    quality: int = 90
    keep_jpeg: bool = True
    depth: int = 8  # bits per channel stored: 8 (uint8) or 16 (uint16, decoded pixels only)
    max_pixels: int = 178_956_970  # Pillow's hard decompression-bomb limit (2 x its warning limit)

    def __post_init__(self) -> None:
        from .resize import RESIZE_MODES  # registry: the only list of valid modes

        if self.sizes:
            sizes = tuple(sorted({int(x) for x in self.sizes}, reverse=True))
            object.__setattr__(self, "sizes", sizes if len(sizes) > 1 else ())
            object.__setattr__(self, "size", sizes[0])
        for size in self.all_sizes:
            if not 8 <= size <= 16384:
                raise DataprepError(f"size must be between 8 and 16384 pixels, got {size}")
        if self.resize not in RESIZE_MODES:
            raise DataprepError(f"unknown resize mode {self.resize!r}; choose one of {sorted(RESIZE_MODES)}")
        if self.mode not in IMAGE_MODES:
            raise DataprepError(f"unknown mode {self.mode!r}; choose one of {list(IMAGE_MODES)}")
        if not 1 <= self.quality <= 100:
            raise DataprepError(f"quality must be between 1 and 100, got {self.quality}")
        if self.depth not in (8, 16):
            raise DataprepError(f"depth must be 8 or 16 bits, got {self.depth}")
        if self.depth == 16 and self.mode != "raw":
            raise DataprepError("16-bit pixels are stored decoded (JPEG holds 8 bits): add --mode raw to --depth 16")
        if self.max_pixels < 1:
            raise DataprepError("max_pixels must be positive")

    @property
    def all_sizes(self) -> tuple[int, ...]:
        """Every resolution built, largest first."""
        return self.sizes or (self.size,)

    @property
    def multires(self) -> bool:
        return len(self.sizes) > 1

    @property
    def channels(self) -> int:
        return 1 if self.grayscale else 3

    @property
    def dtype(self) -> str:
        """The stored pixels' dtype, little-endian."""
        return "<u2" if self.depth == 16 else "|u1"

    def fixed_shape(self, size: int | None = None) -> tuple[int, int, int] | None:
        """The (H, W, C) every sample has at `size` (default: the largest), when the resize mode makes all
        samples one shape."""
        from .resize import RESIZE_MODES

        size = size or self.size
        return (size, size, self.channels) if RESIZE_MODES[self.resize].square else None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def over_caps(manifest: dict[str, Any], h: int, w: int, res) -> str | None:
    """Why an h x w image at `res` px is larger than a pack's build makes, by the settings its manifest records.

    Args:
        manifest: the pack's manifest; its settings["image"] gives `max_pixels` and `resize`.
        h, w: the image's recorded size.
        res: the resolution it is stored at (an int; anything else checks `max_pixels` alone).

    Returns:
        What is over: more pixels than `max_pixels` (the default where the record is missing or no positive
        count), or the side its resize mode brings to the size beyond `res` (both sides for a square mode);
        None where nothing is.
    """
    from .resize import RESIZE_MODES

    image = (manifest.get("settings") or {}).get("image") or {}
    cap = image.get("max_pixels")
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        cap = ImageSettings.max_pixels
    if h * w > cap:
        return f"{h * w:,} pixels, over the {cap:,} its build allows (max_pixels)"
    mode = RESIZE_MODES.get(image.get("resize")) if isinstance(image.get("resize"), str) else None
    if mode is not None and isinstance(res, int) and (max(h, w) if mode.square else mode.side(h, w)) > res:
        return f"larger than its build makes at {res} px (resize {mode.name!r})"
    return None
