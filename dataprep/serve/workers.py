"""A Loader worker: takes batch requests from its pipe, fills the requested rows of the shared ring
with the dataset's `fill_batch`, and says which it finished (with the seconds it took and the decode paths
it counted, for Loader.stats()) or why it could not, until told to stop or its parent goes. Forked by
serve/loader.py; nothing it needs comes from the dataset's state at fork time except the data itself
(each epoch's first message to it carries serve/request.py's Request, the batch layout and whether to
measure; the parts that follow carry only where they go).
"""
from __future__ import annotations

import math
import time

import numpy as np
import torch

from ..engine.local import default_signals, exit_with_parent
from . import contract
from .stats import decode_snapshot, paths_since


def serve_requests(dataset, ring: dict[str, np.ndarray], conn, parent_ends: list, parent: int) -> None:
    """The worker's life: close the parent's pipe ends, die with the parent, fill batches until told to stop."""
    default_signals()  # the parent's handlers (Lightning's SIGTERM one) would keep us alive at its exit
    for end in parent_ends:
        end.close()
    exit_with_parent(parent)  # a SIGKILLed trainer leaves no worker behind
    init = contract.hook(dataset, "worker_init")
    if init is not None:
        init()  # e.g. OpenCV's own thread pool off, for datasets that decode with it
    torch.set_num_threads(1)
    # A closed or reset pipe means the parent is gone (SIGKILLed, crashed) or closing: there is no one to
    # report to, so the worker just ends, with no traceback in the log the trainer's output shares.
    # (ConnectionResetError: the parent died with our results unread; BrokenPipeError: sending to it.)
    epochs: dict[int, tuple] = {}  # generation -> (request, layout, measure), sent once per generation
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        if msg[0] == "epoch":
            epochs[msg[1]] = msg[2:]
            if len(epochs) > 4:  # an iterator of an earlier pass, still held, may send parts of its own
                del epochs[min(epochs)]
            continue
        gen, b, slot, start, idx = msg
        req, layout, measure = epochs[gen]
        try:
            t0, before = time.perf_counter(), decode_snapshot(dataset) if measure else None
            dataset.fill_batch(idx, rows(ring, layout, slot, start, len(idx)), req)
            reply = ("ok", gen, b, time.perf_counter() - t0, paths_since(before, decode_snapshot(dataset)) if measure else {})
        except Exception as e:  # reported with the batch; the main process raises it
            reply = ("err", gen, b, f"{type(e).__name__}: {e} (samples {np.asarray(idx[:8]).tolist()})")
        try:
            conn.send(reply)
        except OSError:
            return


def rows(ring: dict[str, np.ndarray], layout: dict, slot: int, start: int, n: int) -> dict[str, np.ndarray]:
    """Rows start..start+n of ring slot `slot`, shaped as `layout` says (one batch is one contiguous block)."""
    out = {}
    for k, (shape, dt) in layout.items():
        per = math.prod(shape) * dt.itemsize
        out[k] = ring[k][slot, start * per : (start + n) * per].view(dt).reshape(n, *shape)
    return out

