"""Contact sheet: takes the audit's pairs and a way to load a sample's pixels, gives a PNG with one panel
per pair, the two images side by side on white, their split:index and source and the distance written
under them, panels in a grid on a dark background.

How to read it: each white panel is one pair; left is the pair's `a`, right its `b` (the order of the
JSON report); the first line under the images names a, the second b, the third gives the distance in
bits ("exact" when the pixels are identical, "mirror" for a pair found through --flips). Panels come in
the order given; the report's "shown" gives each leaking sample's closest twin first, then one pair a
group of near copies in turn (panels.py).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..safe_paths import write_file
from .panels import MAX_PANELS

THUMB = 160  # each image is fitted into THUMB x THUMB
PAD = 8
LINE = 16  # pixels per line of text
LINES = 3
COLUMNS = 4
MAX_PAIRS = MAX_PANELS  # panels drawn at most
BACKGROUND = (40, 40, 40)
PANEL = (255, 255, 255)
INK = (0, 0, 0)


@dataclass(frozen=True)
class Layout:
    """Where everything goes: the sheet's size and each panel's box (x, y, width, height)."""

    width: int
    height: int
    panel_width: int
    panel_height: int
    columns: int
    boxes: tuple[tuple[int, int, int, int], ...]


def layout(n: int, columns: int = COLUMNS) -> Layout:
    """The grid for n panels: `columns` wide (fewer when n is smaller), rows as needed."""
    pw = 2 * THUMB + 3 * PAD
    ph = THUMB + 2 * PAD + LINES * LINE + PAD
    cols = max(1, min(columns, n))
    rows = max(1, -(-n // cols))
    boxes = tuple((PAD + (k % cols) * (pw + PAD), PAD + (k // cols) * (ph + PAD), pw, ph) for k in range(n))
    return Layout(PAD + cols * (pw + PAD), PAD + rows * (ph + PAD), pw, ph, cols, boxes)


def contact_sheet(pairs: Sequence[Mapping[str, Any]], load_image: Callable[[Mapping[str, Any]], np.ndarray],
                  path: str | os.PathLike, max_pairs: int = MAX_PAIRS, columns: int = COLUMNS) -> Layout:
    """Draw the first `max_pairs` of `pairs` (the report's rows: "a", "b", "distance", "exact"; pass its
    "shown", which audit chose for panels) to the PNG at `path`; `load_image(side)` gives a side's pixels
    (HW or HWC uint8, RGB) from its split, index and source. An image that cannot be loaded is drawn as a
    grey square marked so. `path` is written as dataprep writes its outputs (safe_paths.write_file): a
    symlink, a FIFO or another user's file there is refused (UnsafeFile), never written through. Returns
    the layout."""
    import cv2

    shown = list(pairs[:max_pairs])
    lay = layout(len(shown), columns)
    sheet = np.empty((lay.height, lay.width, 3), np.uint8)
    sheet[:] = BACKGROUND
    text_width = lay.panel_width - 2 * PAD
    for (x, y, w, h), p in zip(lay.boxes, shown):
        sheet[y:y + h, x:x + w] = PANEL
        for k, side in enumerate(("a", "b")):
            _paste(sheet, _thumb(load_image, p[side]), x + PAD + k * (THUMB + PAD), y + PAD)
        tag = "exact" if p.get("exact") else ("mirror, " if p.get("flip") else "") + f"distance {p['distance']}"
        lines = [f"a {_label(p['a'])}", f"b {_label(p['b'])}", tag]
        for k, line in enumerate(lines):
            cv2.putText(sheet, _fit(line, text_width), (x + PAD, y + THUMB + 2 * PAD + (k + 1) * LINE - 4),
                        cv2.FONT_HERSHEY_SIMPLEX, 0.4, INK, 1, cv2.LINE_AA)
    ok, png = cv2.imencode(".png", sheet[:, :, ::-1])
    if not ok:
        raise OSError(f"cannot encode the contact sheet ({lay.width}x{lay.height}) as PNG")
    write_file(path, png.tobytes(), "contact sheet")  # as dataprep writes outputs: never through a symlink or into a FIFO
    return lay


def _label(side: Mapping[str, Any]) -> str:
    return f"{side['split']}:{side['index']} {side.get('source', '')}".rstrip()


def _fit(text: str, width: int) -> str:
    """The text cut (its start replaced by ...) to fit `width` pixels: a path's end says most."""
    import cv2

    text = text.encode("ascii", "replace").decode()  # Hershey fonts draw ASCII only
    if cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, 0.4, 1)[0][0] <= width:
        return text
    head = text[:text.index(" ") + 1] if " " in text else ""
    tail = text[len(head):]
    while tail and cv2.getTextSize(head + "..." + tail, cv2.FONT_HERSHEY_SIMPLEX, 0.4, 1)[0][0] > width:
        tail = tail[1:]
    return head + "..." + tail


def _thumb(load_image, side) -> np.ndarray:
    """The side's image fitted into THUMB x THUMB (aspect kept), RGB uint8; grey when it cannot load."""
    import cv2

    try:
        im = np.asarray(load_image(side))
        if im.ndim == 3 and im.shape[2] == 1:
            im = im[:, :, 0]
        if im.ndim == 2:
            im = np.repeat(im[:, :, None], 3, axis=2)
        if im.ndim != 3 or im.shape[2] not in (3, 4) or im.shape[0] == 0 or im.shape[1] == 0:
            raise ValueError(f"shape {im.shape}")
        if im.dtype == np.uint16:
            im = (im >> 8).astype(np.uint8)
        elif im.dtype != np.uint8:
            im = np.clip(im, 0, 255).astype(np.uint8)
        im = np.ascontiguousarray(im[:, :, :3])
        h, w = im.shape[:2]
        s = THUMB / max(h, w)
        size = (max(1, round(w * s)), max(1, round(h * s)))
        return cv2.resize(im, size, interpolation=cv2.INTER_AREA if s < 1 else cv2.INTER_NEAREST)
    except Exception:  # a sheet is for looking: one unreadable image is drawn as such, not the end of it
        out = np.full((THUMB, THUMB, 3), 128, np.uint8)
        cv2.putText(out, "cannot load", (PAD, THUMB // 2), cv2.FONT_HERSHEY_SIMPLEX, 0.45, (255, 255, 255), 1, cv2.LINE_AA)
        return out


def _paste(sheet: np.ndarray, im: np.ndarray, x: int, y: int) -> None:
    """`im` centred in the THUMB x THUMB square at (x, y)."""
    h, w = im.shape[:2]
    oy, ox = y + (THUMB - h) // 2, x + (THUMB - w) // 2
    sheet[oy:oy + h, ox:ox + w] = im
