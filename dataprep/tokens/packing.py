"""Packing plans: takes document lengths (a token pack's offsets), a context and a strategy, gives each
epoch's rows of `context` tokens as a table of segments, without reading a token.

A document is its ids and its end-of-text id: in a token pack `tokens[doc_offsets[i]:doc_offsets[i + 1]]`,
so its length is `np.diff(doc_offsets)`. Documents are placed whole. One longer than the context is cut
into pieces that overlap by one token (piece k starts at k * (context - 1)): the token a piece ends on is
the one the next starts from, so each target within a document (token t -> t + 1) lies in exactly one
piece. A last piece of one token would hold no target and is not made. Full pieces fill a row alone; a
shorter last piece is packed like any document.

Strategies (`STRATEGIES`):
- `best_fit`: pieces longest first, each into the row it leaves the least room in (best fit decreasing);
  where first fit decreasing needs fewer rows for the same lengths (it can), its rows instead, so that
  best_fit never pads more than first_fit.
- `first_fit`: pieces longest first, each into the first row with room (first fit decreasing).
- `concat`: the documents in a shuffled order as one stream, cut into rows that overlap by one token as a
  long document is cut; no padding but in the stream's last row.

The fits place lengths, not documents: which rows hold which lengths follows from the lengths alone, so
the row count is the same every epoch. Each epoch deals the pieces of each length to that length's places
in a new order and permutes the rows, from numpy's `default_rng` keyed on (seed, epoch). The fits run over
runs of equal lengths, not piece by piece: a row a run reaches takes as many pieces as it has room for at
once, and rows wait in sorted runs of keys (`_Runs`) until a length fits them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import UsageError, brief

STRATEGIES = ("best_fit", "first_fit", "concat")
_STREAM = 0x9AC4  # keeps the plan's draws apart from a Loader's own order keyed on [seed, epoch]
_ROW = (1 << 32) - 1  # a key's low 32 bits are a row id; the bits above, a room or a rank


@dataclass(frozen=True)
class RowPlan:
    """One epoch's rows: row r is segments `row_starts[r]` to `row_starts[r + 1]` of the segment table,
    each `length` tokens of `document` from `offset` on, then padding up to `context` tokens.

    Args:
        context: Tokens a row.
        strategy: The strategy that placed the segments (`STRATEGIES`).
        row_starts: (rows + 1,) int64 offsets into the segment table.
        document: (segments,) int64: each segment's document, its index among the lengths planned.
        offset: (segments,) int64: where in its document a segment starts (0 unless the document was cut).
        length: (segments,) int64: a segment's tokens, 1 to `context`.
        documents_cut: Documents served in more than one segment.
    """

    context: int
    strategy: str
    row_starts: np.ndarray
    document: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    documents_cut: int

    @property
    def rows(self) -> int:
        """Rows in the epoch."""
        return len(self.row_starts) - 1

    @property
    def tokens(self) -> int:
        """Document tokens in the rows (a token where a cut overlaps counts in both rows)."""
        return int(self.length.sum())

    @property
    def padding(self) -> int:
        """Padding tokens: the rows' room the segments leave."""
        return self.rows * self.context - self.tokens

    @property
    def padding_share(self) -> float:
        """Padding as a share of all the rows' tokens (0 for no rows)."""
        return self.padding / (self.rows * self.context) if self.rows else 0.0


def ragged(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """`concatenate([arange(s, s + c) for s, c in zip(starts, counts)])` as int64, built in one array (a
    step of 1, a jump at each run's first place, summed in place)."""
    if len(counts) and int(counts.min()) <= 0:
        keep = counts > 0
        starts, counts = starts[keep], counts[keep]
    ends = np.cumsum(counts, dtype=np.int64)
    out = np.ones(int(ends[-1]) if len(ends) else 0, np.int64)
    if len(out):
        jump = starts[1:].astype(np.int64)
        jump -= starts[:-1]
        jump -= counts[:-1]
        out[ends[:-1]] = jump + 1
        out[0] = starts[0]
        np.cumsum(out, out=out)
    return out


def _stable_order(key: np.ndarray) -> np.ndarray:
    """`argsort(key, kind="stable")` for keys in [0, 2**32): numpy's radix sort over 16-bit halves (its
    stable sort of wider integers is a timsort, several times slower on millions of unsorted keys)."""
    if not len(key) or int(key.max()) < 1 << 16:
        return np.argsort(key.astype(np.uint16), kind="stable")
    order = np.argsort((key & 0xFFFF).astype(np.uint16), kind="stable")
    return order[np.argsort((key[order] >> 16).astype(np.uint16), kind="stable")]


def _index_type(n: int) -> type:
    """The narrowest of int32 and int64 that holds indices below n (a plan of millions of pieces keeps
    its tables in half the memory)."""
    return np.int32 if n < 1 << 31 else np.int64


def cut_documents(lengths: np.ndarray, context: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every document as the pieces it is placed in: itself, or past `context` tokens pieces of `context`
    tokens starting `context - 1` apart, the last one shorter (never of one token).

    Args:
        lengths: Each document's tokens, its end-of-text id included (>= 1), int64.
        context: Tokens a row (>= 2).

    Returns:
        The pieces in document order: each one's document, its start in the document and its length (1 to
        `context`); int32 where the values fit, else int64.
    """
    n = len(lengths)
    index = _index_type(max(n, int(lengths.max(initial=0))))
    long = lengths > context
    if not long.any():
        return np.arange(n, dtype=index), np.zeros(n, index), lengths.astype(_index_type(context + 1))
    # ceil((L - 1) / (context - 1)) pieces cover the L - 1 targets, context - 1 to a piece
    per = np.where(long, (lengths - 2) // (context - 1) + 1, 1)
    index = _index_type(max(int(per.sum()), int(lengths.max())))
    doc: np.ndarray = np.repeat(np.arange(n, dtype=index), per)
    start = ragged(np.zeros(n, np.int64), per)
    start *= context - 1
    length = np.minimum(lengths[doc] - start, context).astype(_index_type(context + 1))
    return doc, start.astype(index), length


class _Runs:
    """A set of distinct int64 keys held as a few sorted runs (a log-structured merge): a sorted chunk
    added, the smallest keys read and taken, without sorting the whole set again on every change."""

    def __init__(self) -> None:
        self.runs: list[np.ndarray] = []
        self.size = 0

    def add(self, keys: np.ndarray) -> None:
        if not len(keys):
            return
        self.runs.append(keys)
        self.size += len(keys)
        # each run at least 4x the one after it: a key is merged O(log n) times, few runs to read
        while len(self.runs) > 1 and len(self.runs[-2]) < 4 * len(self.runs[-1]):
            b, a = self.runs.pop(), self.runs.pop()
            self.runs.append(np.sort(np.concatenate([a, b]), kind="stable"))  # two sorted runs: a merge

    def smallest(self, k: int) -> np.ndarray:
        """The k smallest keys (all, where fewer), sorted."""
        cand = np.concatenate([r[:k] for r in self.runs]) if self.runs else np.zeros(0, np.int64)
        if len(cand) > k:
            cand = np.partition(cand, k - 1)[:k]
        return np.sort(cand)

    def take_upto(self, key: int) -> np.ndarray:
        """Every key <= `key`, removed from the set."""
        cut = [int(np.searchsorted(r, key, side="right")) for r in self.runs]
        out = [r[:c] for r, c in zip(self.runs, cut) if c]
        self.runs = [r[c:] for r, c in zip(self.runs, cut) if c < len(r)]
        taken = sum(cut)
        self.size -= taken
        return np.concatenate(out) if out else np.zeros(0, np.int64)


def _place(counts: np.ndarray, context: int, first: bool, keep: bool = True) -> tuple[int, list[np.ndarray], list[np.ndarray]]:
    """Pieces of the lengths counted (`counts[l]` pieces of length l) placed longest first, by first fit
    (each into the lowest row with room) or best fit (the row with the least room that fits; the lowest
    of those). The result is exactly what placing one piece at a time gives: a row a piece goes to keeps
    being the first (or best) fit for that length until it is full, so a run of equal lengths fills each
    row it reaches with room // length pieces before the next.

    Rows whose room is below the length being placed wait in `waiting` (keyed by room, largest first);
    rows with room for it are `open` (keyed by row, or by room then row for best fit).

    Returns:
        The rows, and (where `keep`) each step's rows and the pieces each took, in the order placed.
    """
    total = int(counts.sum())
    room: np.ndarray = np.zeros(total, _index_type(context + 1))  # never more rows than pieces
    waiting, open_ = _Runs(), _Runs()
    rows = 0
    took_rows: list[np.ndarray] = []
    took: list[np.ndarray] = []

    def key(r: np.ndarray) -> np.ndarray:
        return r if first else (room[r].astype(np.int64) << 32) | r

    def settle(r: np.ndarray, length: int) -> None:
        """Rows whose room just changed: open while a piece of `length` fits, else waiting for a shorter one."""
        fits = room[r] >= length
        open_.add(np.sort(key(r[fits])))
        w = r[~fits & (room[r] > 0)]
        waiting.add(np.sort(((context - room[w].astype(np.int64)) << 32) | w))

    for length in np.flatnonzero(counts)[::-1].tolist():
        n = int(counts[length])
        woken = waiting.take_upto(((context - length) << 32) | _ROW) & _ROW  # room >= length now
        open_.add(np.sort(key(woken)))
        if open_.size:
            k = min(open_.size, -(-n // max(1, (context - 1) // length)))  # no row takes more
            while True:
                head = open_.smallest(k)
                r = head & _ROW
                cum = np.cumsum(room[r] // length)
                if cum[-1] >= n or k == open_.size:
                    break
                k = min(open_.size, 2 * k)
            j = int(np.searchsorted(cum, n))  # the row the run ends in, or past the rows read
            if j < len(cum):
                head, r = head[: j + 1], r[: j + 1]
                take = np.diff(cum[: j + 1], prepend=0)
                take[-1] = n - (int(cum[j - 1]) if j else 0)
            else:
                take = np.diff(cum, prepend=0)
            open_.take_upto(int(head[-1]))
            if keep:
                took_rows.append(r)
                took.append(take)
            room[r] -= take * length
            n -= int(take.sum())
            settle(r, length)
        if n:  # new rows, each taking context // length pieces
            per = context // length
            k = -(-n // per)
            r = np.arange(rows, rows + k, dtype=np.int64)
            take = np.full(k, per, np.int64)
            take[-1] = n - (k - 1) * per
            rows += k
            room[r] = context - take * length
            if keep:
                took_rows.append(r)
                took.append(take)
            settle(r, length)
    return rows, took_rows, took


def _fit(counts: np.ndarray, context: int, first: bool) -> tuple[np.ndarray, np.ndarray]:
    """The rows `_place` makes, as a table.

    Returns:
        `row_starts` (rows + 1,) into the places, and each place's piece as its rank among the pieces
        sorted longest first (a rank, not a piece: the epoch picks which piece of that length it is).
    """
    rows, took_rows, took = _place(counts, context, first)
    total = int(counts.sum())
    index = _index_type(total)
    row_of: np.ndarray = np.concatenate(took_rows).astype(index) if took_rows else np.zeros(0, index)
    take: np.ndarray = np.concatenate(took).astype(index) if took else np.zeros(0, index)
    del took_rows, took
    # the runs went longest first, so a run's first piece is its rank among the pieces sorted so
    rank = np.cumsum(take, dtype=np.int64)
    rank -= take
    row_starts = np.zeros(rows + 1, np.int64)
    np.cumsum(np.bincount(row_of, weights=take, minlength=rows).astype(np.int64), out=row_starts[1:])
    by_row = _stable_order(row_of)  # a row's runs in the order they came: its longest pieces first
    del row_of
    return row_starts, ragged(rank[by_row], take[by_row]).astype(index)


def _lower_bound(counts: np.ndarray, context: int) -> int:
    """Rows no packing of these pieces can do with: their tokens over `context`, and one a piece longer
    than half a row (no two of those share one)."""
    lengths = np.arange(len(counts), dtype=np.int64)
    return max(-(-int(counts @ lengths) // context), int(counts[context // 2 + 1:].sum()))


class Packing:
    """The rows of a set of documents: takes their lengths, a context and a strategy; gives each epoch's
    `RowPlan` (`plan`), the row count the same in every epoch.

    The fits' rows are made once here (a function of the lengths); an epoch's plan only deals pieces to
    them and orders the rows.

    Args:
        lengths: Each document's tokens, its end-of-text id included: `np.diff(doc_offsets)` of a token
            pack's split (>= 1 each).
        context: Tokens a row (>= 2).
        strategy: "best_fit", "first_fit" or "concat" (`STRATEGIES`).
    """

    def __init__(self, lengths, context: int, strategy: str = "best_fit"):
        if isinstance(context, bool) or not isinstance(context, (int, np.integer)) or context < 2:
            raise UsageError(f"context must be an integer >= 2 (a row holds a token and its target), not {brief(context)}")
        if strategy not in STRATEGIES:
            raise UsageError(f"strategy {brief(strategy)} is not one of {', '.join(STRATEGIES)}")
        lengths = np.asarray(lengths)
        if lengths.ndim != 1 or (len(lengths) and lengths.dtype.kind not in "iu"):
            raise UsageError(f"lengths must be a 1-D array of integers, not {lengths.dtype} of shape {lengths.shape}")
        if len(lengths) and lengths.min() < 1:
            raise UsageError(f"lengths must be >= 1 (a document holds at least its end-of-text id); "
                             f"document {int(np.argmin(lengths))} has {int(lengths.min())}")
        self.context, self.strategy = int(context), strategy
        self.lengths = lengths.astype(np.int64, copy=False)
        total = int(self.lengths.sum())
        if strategy == "concat":
            self.rows = max(1, -(-(total - 1) // (self.context - 1))) if total else 0
            return
        self._doc, self._start, self._length = cut_documents(self.lengths, self.context)
        self.documents_cut = int(np.count_nonzero(self.lengths > self.context))
        counts = np.bincount(self._length, minlength=self.context + 1)
        self._row_starts, self._ranks = _fit(counts, self.context, first=strategy == "first_fit")
        if strategy == "best_fit":
            rows = len(self._row_starts) - 1  # first fit counted (not laid out) unless no packing does better
            if rows > _lower_bound(counts, self.context) and _place(counts, self.context, True, keep=False)[0] < rows:
                self._row_starts, self._ranks = _fit(counts, self.context, first=True)
        self.rows = len(self._row_starts) - 1
        # pieces longest first; each length's run is shuffled per epoch
        self._by_length = _stable_order(self.context - self._length).astype(self._doc.dtype)
        self._runs = np.cumsum(counts[::-1])[:-1]  # where each length's run ends in _by_length

    def plan(self, seed: int = 0, epoch: int = 0) -> RowPlan:
        """The epoch's rows.

        Args:
            seed: The run's seed (>= 0).
            epoch: The epoch (>= 0).

        Returns:
            A `RowPlan`: a pure function of (lengths, context, strategy, seed, epoch).
        """
        for name, value in (("seed", seed), ("epoch", epoch)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise UsageError(f"{name} must be an integer >= 0, not {brief(value)}")
        rng = np.random.default_rng([int(seed), int(epoch), _STREAM])
        if self.strategy == "concat":
            return self._concat(rng)
        by_length = self._by_length.copy()
        lo = 0
        for hi in self._runs.tolist():
            if hi - lo > 1:
                rng.shuffle(by_length[lo:hi])
            lo = hi
        row_starts, places = _reordered(self._row_starts, rng.permutation(self.rows))
        piece = by_length[self._ranks[places]]
        del by_length, places  # the plan's own tables are the most this holds at once
        return RowPlan(self.context, self.strategy, row_starts, self._doc[piece].astype(np.int64),
                       self._start[piece].astype(np.int64), self._length[piece].astype(np.int64), self.documents_cut)

    def _concat(self, rng: np.random.Generator) -> RowPlan:
        c = self.context
        order = rng.permutation(len(self.lengths))
        starts = self.lengths[order]  # the lengths in the stream's order, then where each starts in it
        ends = np.cumsum(starts)
        np.subtract(ends, starts, out=starts)
        total = int(ends[-1]) if len(ends) else 0
        # documents cut: those whose first and last tokens lie in different rows (row k holds stream
        # tokens k * (c - 1) to k * (c - 1) + c - 1; one that starts where a row ends is in both)
        last_row = (ends - 1) // (c - 1)
        np.minimum(last_row, self.rows - 1, out=last_row)
        cut = int(np.count_nonzero(last_row > np.maximum(0, -(-(starts - c + 1) // (c - 1)))))
        del last_row
        lo = np.arange(self.rows, dtype=np.int64) * (c - 1)  # row k: stream tokens lo[k] to hi[k]
        hi = np.minimum(lo + c, total)
        first = np.searchsorted(ends, lo, side="right")  # the first document ending past the row's start
        count = np.searchsorted(ends, hi, side="left") + 1 - first  # to the one that ends at or past its end
        np.minimum(count, len(ends) - first, out=count)
        rows = rng.permutation(self.rows)  # the epoch's order of rows (searched in stream order: far faster)
        lo, hi, first, count = lo[rows], hi[rows], first[rows], count[rows]
        del rows
        at = ragged(first, count)  # each segment's document, as its place in the stream
        del first
        length = np.repeat(hi, count)  # where each segment ends, then its length
        np.minimum(length, ends[at], out=length)
        del ends, hi
        offset = np.repeat(lo, count)  # where each segment starts in the stream, then in its document
        first_token = starts[at]
        np.maximum(offset, first_token, out=offset)
        length -= offset
        offset -= first_token
        del starts, first_token, lo
        document = order[at]
        del order, at
        row_starts = np.zeros(self.rows + 1, np.int64)
        np.cumsum(count, out=row_starts[1:])
        return RowPlan(c, "concat", row_starts, document, offset, length, cut)


def _reordered(row_starts: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A CSR table's rows in `order`: the new row starts, and for each new place the old place it holds."""
    counts = np.diff(row_starts)[order]
    out = np.zeros(len(order) + 1, np.int64)
    np.cumsum(counts, out=out[1:])
    return out, ragged(row_starts[order], counts)


def plan_rows(lengths, context: int, strategy: str = "best_fit", seed: int = 0, epoch: int = 0) -> RowPlan:
    """One epoch's rows of `context` tokens for documents of these lengths (`Packing(...).plan(seed, epoch)`;
    make a `Packing` once to plan many epochs).

    Args:
        lengths: Each document's tokens, its end-of-text id included (`np.diff(doc_offsets)`).
        context: Tokens a row (>= 2).
        strategy: "best_fit", "first_fit" or "concat".
        seed: The run's seed.
        epoch: The epoch.

    Returns:
        The epoch's `RowPlan`.
    """
    return Packing(lengths, context, strategy).plan(seed, epoch)
