"""Takes one input's bytes, gives None or an AssertionError: whether the compiled restart-segment code
(images/_jpegseg.c) and the Python path agree on them.

region(buf, y0, y1, x0, x1) is held to jpegseg.region_of(pure=True): the same None, frame size, origin and
bytes, for a fixed box, a box drawn from the input's CRC and a box at the edges of Py_ssize_t. add_restarts()
has no Python twin: without the compiled part a source JPEG is kept as it is. So what it gives must serve
what the source serves: the same frame header, a restart layout at the rule's period that region() and the
Python path then cut alike, nothing more to add on a second call, and the same pixels as the source from the
serving decoder (OpenCV), or the same refusal to decode.

fuzz/jpegseg_fuzz.c calls check() on every input under the sanitizers; tests/test_fuzz_jpegseg.py calls it
on the seeds and the regression inputs with the ordinary build.
"""
from __future__ import annotations

import os
import random
import sys
import zlib

import cv2
import numpy as np

from dataprep.images import jpegseg

BIG = 2**63 - 1  # Py_ssize_t's largest; region() takes any box that fits one
EDGE_BOXES = ((-BIG - 1, BIG, -BIG - 1, BIG), (BIG - 7, BIG, BIG - 7, BIG), (-BIG - 1, -BIG + 7, 0, 8),
              (0, BIG, -BIG - 1, 8), (2**40, 2**41, -(2**40), 2**40))
INTERVALS = (jpegseg.RESTART_MCUS, jpegseg.RESTART_MCUS, jpegseg.RESTART_MCUS, 1, 2, 3, 8, 0, -5, 1000)  # max_interval
PIXELS = 1 << 22  # frames decoded for the pixel check at most (a lying frame size asks a decoder for more)


def uses(module) -> bool:
    """Whether images/jpegseg.py calls `module` (the harness checks that it reached the instrumented copy)."""
    return jpegseg._jpegseg is module


def check(data) -> None:
    """Raise AssertionError where the C entry points and the Python path disagree on `data` (bytes, or a
    memoryview, which the C part reads in place and the Python path as a copy)."""
    c = jpegseg._jpegseg
    assert c is not None, "images/_jpegseg.c is not built"
    raw = bytes(data)
    crc = zlib.crc32(raw)
    rnd = random.Random(crc)
    head = jpegseg.jpeg_header(raw)
    h, w = (head[0], head[1]) if head else (64, 64)
    drawn = sorted(rnd.randint(-h // 4, h + h // 4) for _ in range(2)) + sorted(rnd.randint(-w // 4, w + w // 4) for _ in range(2))
    boxes = [(0, 8, 0, 8), (drawn[0], drawn[1] + 1, drawn[2], drawn[3] + 1), EDGE_BOXES[crc % len(EDGE_BOXES)]]
    for box in boxes:
        same_region(data, raw, box)
    most = INTERVALS[(crc >> 8) % len(INTERVALS)]
    out = c.add_restarts(data, most)
    if out is None:
        return
    assert isinstance(out, bytes), type(out)
    assert jpegseg.jpeg_header(out) == head, ("add_restarts changed the frame header", jpegseg.jpeg_header(out), head)
    lay = jpegseg.jpeg_layout(np.frombuffer(out, np.uint8))
    assert lay is not None, "add_restarts gave no restart layout"
    per_row = -(-lay.width // lay.mcu_w)
    rule = max([d for d in range(1, min(most, per_row) + 1) if per_row % d == 0] or [1])
    assert lay.interval == rule, ("add_restarts chose another period", lay.interval, rule)
    assert c.add_restarts(out, most) is None, "add_restarts added markers to its own output"
    same_region(out, out, boxes[1])
    if head[0] * head[1] <= PIXELS:
        src, got = decoded(raw), decoded(out)
        assert (src is None) == (got is None), ("one decodes, the other does not", src is None, got is None)
        assert src is None or (src.shape == got.shape and np.array_equal(src, got)), "add_restarts changed pixels"


def same_region(data, raw: bytes, box: tuple[int, int, int, int]) -> None:
    """region() on `data` and region_of(pure=True) on `raw`, its bytes, give the same answer for `box`."""
    c = jpegseg._jpegseg.region(data, *box)
    p = jpegseg.region_of(np.frombuffer(raw, np.uint8), *box, pure=True)
    assert (c is None) == (p is None), ("region: None on one side only", box, c is None, p is None)
    if c is None:
        return
    assert (c[0], c[1], c[3], c[4]) == (p[0], p[1], p[3], p[4]), ("region: size or origin", box, c[:2], c[3:], p[:2], p[3:])
    assert (c[2] is None) == (p[2] is None), ("region: cut on one side only", box, c[2] is None, p[2] is None)
    assert c[2] is None or c[2] == p[2].tobytes(), ("region: other bytes", box)


def decoded(data: bytes) -> np.ndarray | None:
    """The serving decoder's pixels (codec.decode_cv2), libjpeg's warnings about damaged data kept off stderr."""
    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        return cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED | cv2.IMREAD_IGNORE_ORIENTATION)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)
