"""A Mixture's serving side: takes a batch's positions and a request, gives the batch's rows filled by the
members that serve them (the Mixture's plans say which: serve/mixture.py), their labels renumbered into the
mixture's classes and their document ids past the members before them; also its batch layout, `mix[i]`,
worker init and decode counts. A mixin of `Mixture`; `Part` is one member's share of some positions,
`member_seed` a member's own seed under the Loader's.
"""
from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np

from ..errors import DataprepError
from . import contract, draws
from .mixture_labels import _name
from .plans import Joined
from .request import Request


class Part(NamedTuple):
    """One member's share of some positions of a mixture epoch: which member serves them, in which of its
    epochs, at which rows of the positions (a slice where they are contiguous, else an int array), their
    indices in the member and, where asked for and the member has them (contract.Addressed), its addresses
    of them (else None)."""

    member: int
    epoch: int
    rows: slice | np.ndarray
    index: np.ndarray
    addresses: np.ndarray | None = None


@lru_cache(maxsize=1024)
def member_seed(seed: int, member: int) -> int:
    """Member m's own seed for its per-sample draws (crops, flips, windows): sample i of two members in one
    member epoch must not get one box."""
    return int(draws.bits((draws.MIXTURE, int(seed), int(member)), 0)) >> 1


class MixtureFills:
    """Filling batches from a Mixture's members (the Mixture keeps the plans, shuffles and members this reads)."""

    @property
    def decode_paths(self) -> dict[str, int]:
        """The members' decode path counts in this process, summed (the contract's `decode_paths`)."""
        out: dict[str, int] = {}
        for d in self.datasets:
            for k, v in dict(contract.attribute(d, "decode_paths") or {}).items():  # a copy: fills in threads add keys
                out[k] = out.get(k, 0) + v
        return out

    def __getitem__(self, i):
        """Position i of `set_epoch`'s epoch, as the Loader (seed 0) serves it: a tuple of tensors, one per
        key of the members' batch layout (a label is a 0-d tensor); a dict of them where the members
        `serves_dicts`."""
        import torch

        if not -self.samples <= int(i) < self.samples:
            raise IndexError(f"index {i} out of range for a mixture epoch of {self.samples}")
        req = Request(epoch=self.epoch)
        out = {k: np.empty((1, *shape), np.dtype(dt)) for k, (shape, dt) in self.batch_layout(req).items()}
        self.fill_batch(np.array([int(i) % self.samples]), out, req)
        if self.serves_dicts:
            return {k: torch.from_numpy(v[0, ...]) for k, v in out.items()}
        return tuple(torch.from_numpy(v[0, ...]) for v in out.values())  # [0, ...]: a label a 0-d array, not a scalar

    def worker_init(self) -> None:
        """Each member's worker_init (contract.WorkerInit), where it has one."""
        for d in self.datasets:
            init = contract.hook(d, "worker_init")
            if init is not None:
                init()

    def batch_layout(self, request: Request | None = None):
        """What one sample occupies in a batch: the members' common layout (they must agree).

        Args:
            request: What the pass asks for (crop, flip, resolution); None is a plain request.

        Returns:
            {key: (sample shape, dtype)}, one tensor of the batch per key, in order.
        """
        request = request or Request()
        layouts = [d.batch_layout(request) for d in self.datasets]
        first = {k: (tuple(s), np.dtype(t)) for k, (s, t) in layouts[0].items()}
        for m, lay in enumerate(layouts[1:], 1):
            got = {k: (tuple(s), np.dtype(t)) for k, (s, t) in lay.items()}
            if got != first:
                key = next((k for k in first if got.get(k) != first[k]), None) or next(k for k in got if k not in first)
                raise DataprepError(
                    f"a Mixture's members serve different batches (member {m}, {_name(self.datasets[m], m)}: {key} "
                    f"{_shape(got.get(key))} vs member 0, {_name(self.datasets[0], 0)}: {_shape(first.get(key))}): one "
                    "context, one image size (or one crop), one dtype, one max_boxes (detection packs)")
        return layouts[0]

    fills_rows = True
    fills_runs = True  # the Loader passes a run of positions as a range (serve/request.py)

    def fill_batch(self, idx, out: dict[str, np.ndarray], request: Request | None = None,
                   rows: np.ndarray | None = None) -> None:
        """Fill the batch (or its rows `rows`) with positions `idx`, in place.

        A run of positions (the Loader's case) is sliced from a plan: through the members' joined view
        where they line up (`_fill_joined`), else member by member (`_fill_run`). Scattered positions are
        worked out one by one (`_fill_scattered`).

        Args:
            idx: The positions, or a range of them.
            out: The batch's arrays by key, as `batch_layout` gives them.
            request: What the pass asks for: epoch, seed, crop, flip.
            rows: The batch rows to write; None is the first len(idx).
        """
        r = request or Request()
        if r.resolution is not None and self._unsettled(r.resolution):  # a pass's first fill: run alone by the thread backend
            self.settle(r)
        if isinstance(idx, range) and idx.start < 0:  # a part of one padding position (request.as_run)
            idx = np.asarray(idx, np.int64)
        if isinstance(idx, range) and idx.step == 1:
            if not len(idx):
                return
            if idx.start < 0 or idx.stop > self.samples:
                raise IndexError(f"a position is out of range for a mixture epoch of {self.samples}")
            run = (idx.start, idx.stop)
        else:
            idx = np.asarray(idx, np.int64).reshape(-1)
            if not idx.size:
                return
            if int(idx.min()) == -1 and self.pads_empty:
                self._fill_padded(idx, out, r, rows)
                return
            run = self._run(idx)
        if run is None:
            self._fill_scattered(idx, out, r, rows)
            return
        with self._planning():
            join = self._join()
        if join is not None:
            self._fill_joined(run, join, out, r, rows)
        else:
            self._fill_run(run, out, r, rows)

    def _fill_padded(self, idx: np.ndarray, out: dict[str, np.ndarray], r: Request, rows) -> None:
        """Positions with padding among them (-1: the Loader evens out the ranks' last batch, `pads_empty`):
        the others as any positions, the padding by the first member (as its own -1), in the member epoch
        that ends the mixture epoch (a plan it holds already)."""
        at = np.arange(len(idx)) if rows is None else np.asarray(rows)
        real, pad = np.flatnonzero(idx >= 0), np.flatnonzero(idx < 0)
        if len(real):
            self.fill_batch(idx[real], out, r, at[real])
        per = int(self._per_epoch[0])
        epoch = r.epoch if self.exhausted == "stop" else max(0, (r.epoch * per + per - 1) // int(self.lengths[0]))
        self._fill_part(Part(0, epoch, pad, np.full(len(pad), -1, np.int64)), out, r, at)

    def _fill_joined(self, run: tuple[int, int], join: Joined, out: dict[str, np.ndarray], r: Request, rows) -> None:
        """Token members that line up (one dtype and context): one gather of the run's windows through the
        joined view, at the window starts drawn for the plan (each shifted to its member's rows of the view),
        converted into the batch by the first member (contract.Windowed)."""
        with self._planning():
            plan, i = self._plan(*run, r.epoch)
            at = slice(i, i + run[1] - run[0])
            addresses = self._plan_addresses(plan, r.seed)[at] + join.shift[plan.member[at]]
        self.datasets[0].fill_raw(join.view[addresses], out, rows)

    def _fill_run(self, run: tuple[int, int], out: dict[str, np.ndarray], r: Request, rows) -> None:
        """A run of positions, sliced from its plan into the members' parts (token members at the plan's
        window starts), each filled into its rows."""
        with self._planning():
            parts = self._run_parts(*run, r.epoch, r.seed)
        self._fill_members(parts, out, r, rows)

    def _fill_scattered(self, idx: np.ndarray, out: dict[str, np.ndarray], r: Request, rows) -> None:
        """Positions that are no run, their members and indices worked out one by one."""
        with self._planning():
            parts = self._scattered(idx, r.epoch)
        self._fill_members(parts, out, r, rows)

    def _fill_members(self, parts: list[Part], out: dict[str, np.ndarray], r: Request, rows) -> None:
        """The members' parts of a batch into their rows (`rows`: the batch rows the positions fill, None for
        out's first ones), then their labels renumbered into the mixture's classes where they need it."""
        self._fill_parts(parts, out, r, rows)
        if self._luts is not None and self._label_key in out:
            self._relabel(parts, out[self._label_key], rows)
        if self._doc_starts is not None and "document_ids" in out:
            self._renumber_documents(parts, out["document_ids"], rows)

    def _renumber_documents(self, parts: list[Part], docs: np.ndarray, rows) -> None:
        """Each member's document ids in the batch (packed rows) moved past the documents of the members
        before it, so an id names one document of one member; padding (-1) is kept."""
        for p in parts:
            start = int(self._doc_starts[p.member])
            if start:
                at = p.rows if rows is None else np.asarray(rows)[p.rows]
                got = docs[at]
                docs[at] = np.where(got >= 0, got + start, got)

    def _relabel(self, parts: list[Part], labels: np.ndarray, rows) -> None:
        """Each member's labels in the batch renumbered into the mixture's classes (labels="by_name" or
        "offset"), once the member has filled its rows. A label below 0 is padding (a detection row's unused
        boxes are -1), never a class: kept as it is."""
        for p in parts:
            m, lut = p.member, self._luts[p.member]
            if lut is None:
                continue
            at = p.rows if rows is None else np.asarray(rows)[p.rows]
            got = labels[at]
            real = got >= 0
            if real.any() and int(got[real].max()) >= len(lut):
                raise DataprepError(f"Mixture member {m} ({_name(self.datasets[m], m)}) served label "
                                    f"{int(got[real].max())} outside its {len(lut)} classes")
            labels[at] = np.where(real, lut[np.where(real, got, 0)], got)

    def _fill_parts(self, parts: list[Part], out: dict[str, np.ndarray], r: Request, rows) -> None:
        """The members' parts of a batch, each into its rows: all in one call where the members' class fills
        parts together (contract.FillsParts: image members, their crops and flips drawn in one pass), else
        each its own (`_fill_part`)."""
        many = contract.fill_parts_of(self.datasets[0])
        if many is not None and len(parts) > 1 and all(p.addresses is None for p in parts):
            many([(self.datasets[p.member], p.index, p.rows if rows is None else np.asarray(rows)[p.rows],
                   self._member_request(r, p)) for p in parts], out)
            return
        for p in parts:
            self._fill_part(p, out, r, rows)

    def _fill_part(self, p: Part, out: dict[str, np.ndarray], r: Request, rows) -> None:
        """One member's part into its rows: from its addresses (contract.Addressed); a contiguous share
        straight into the batch; scattered rows in place where the member can (contract.FillsRows:
        tokens, tables, mixtures), else through a buffer of its own."""
        d = self.datasets[p.member]
        at = p.rows if rows is None else np.asarray(rows)[p.rows]
        if p.addresses is not None:
            d.fill_addresses(p.addresses, out, at)
            return
        req = self._member_request(r, p)
        if isinstance(at, slice):
            d.fill_batch(p.index, {k: v[at] for k, v in out.items()}, req)
            return
        a, b = int(at[0]), int(at[-1]) + 1
        if b - a == len(at):
            d.fill_batch(p.index, {k: v[a:b] for k, v in out.items()}, req)
        elif contract.flag(d, "fills_rows"):
            d.fill_batch(p.index, out, req, rows=at)
        else:
            part = {k: np.empty((len(at), *v.shape[1:]), v.dtype) for k, v in out.items()}
            d.fill_batch(p.index, part, req)
            for k, v in out.items():
                v[at] = part[k]

    @staticmethod
    def _member_request(r: Request, p: Part) -> Request:
        """What a member is asked to fill its part with: its own epoch and seed, the batch's resolution,
        crop and flip."""
        return Request(p.epoch, member_seed(r.seed, p.member), r.resolution, r.crop, r.flip)


def _shape(spec) -> str:
    """A batch key's (sample shape, dtype) as an error says it."""
    return "absent" if spec is None else f"{spec[0]} {spec[1]}"
