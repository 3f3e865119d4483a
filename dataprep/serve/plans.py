"""What a Mixture serves batches from: takes the positions of one mixture epoch that a process is about
to serve, or the token members' window views, gives a `Plan` (each position's member, index in it,
member epoch and address) or a `Joined` view over all members' windows (member m's window k at row
shift[m] + k), so a batch is slices of a plan and one gather. serve/mixture.py works out what goes in.
"""
from __future__ import annotations

import numpy as np


class Plan:
    """Positions of one mixture epoch that a process is about to serve, `runs` runs of `length` positions,
    `stride` apart from `start` (one run for a process that reads in order), those before the epoch's end
    kept in that order: for each, the member serving it, its index in the member and the member's epoch;
    the (member, member epoch, positions) groups; addresses per Loader seed, drawn when first needed."""

    __slots__ = ("epoch", "start", "length", "stride", "runs", "member", "index", "m_epoch", "groups", "addresses")

    def __init__(self, epoch: int, start: int, length: int, stride: int, runs: int, n: int):
        self.epoch, self.start, self.length, self.stride, self.runs = epoch, start, length, stride, runs
        self.member, self.index, self.m_epoch = np.empty(n, np.intp), np.empty(n, np.int64), np.empty(n, np.int64)
        self.groups: list[tuple[int, int, np.ndarray]] = []
        self.addresses: dict[int, np.ndarray] = {}

    def find(self, lo: int, hi: int, epoch: int) -> int | None:
        """Where positions lo..hi-1 of `epoch` start in the plan, if it holds them all (within one run)."""
        if epoch != self.epoch or lo < self.start:
            return None
        k, j = divmod(lo - self.start, self.stride)
        if k >= self.runs or j + hi - lo > self.length:
            return None
        return k * self.length + j


class Joined:
    """Members' windows as rows of one view. A token pack's windows are rows of a strided view of its
    token array (row k starts at id k); members' arrays lie apart in memory, at distances that are whole
    rows when they hold one dtype (memory is aligned to it). One view that starts at the lowest member's
    first row and ends at the highest member's last holds them all, member m's row k being row
    shift[m] + k, so a batch drawn from several members is one gather, as one member's is, instead of a
    gather per member and a copy of each into the batch's rows.
    Only members' own rows are ever indexed (serve/mixture.py's `Mixture._checked` refuses other addresses
    when they are drawn): the memory between members is never read. The view holds the lowest member's array, and the
    Mixture its members', so none is freed under it. `view` is None where members do not line up.
    The view spans whatever lies between members (terabytes of unmapped addresses between a member in
    RAM and a mapped one): index only members' rows through it; anything that reads it whole (printing
    it, a reduction, a copy) reads that gap and kills the process."""

    def __init__(self, windows: list[np.ndarray]):
        self.windows, self.view, self.shift = windows, None, None
        first = windows[0]
        if any(w.ndim != 2 or w.dtype != first.dtype or w.shape[1:] != first.shape[1:] or w.strides != first.strides
               for w in windows) or first.strides[0] <= 0:
            return
        step = first.strides[0]
        at = [w.__array_interface__["data"][0] for w in windows]
        low = min(at)
        if any((p - low) % step for p in at):
            return
        shift = np.array([(p - low) // step for p in at], np.int64)
        rows = max(int(s) + len(w) for s, w in zip(shift, windows))
        try:  # numpy sizes a view as rows x row bytes: members far apart with long windows could overflow that
            self.view = np.lib.stride_tricks.as_strided(windows[at.index(low)], (rows, *first.shape[1:]), first.strides,
                                                        writeable=False)
        except ValueError:
            return
        self.shift = shift
