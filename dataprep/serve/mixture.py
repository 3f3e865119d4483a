"""Mixtures: take datasets of one kind and their weights, give one dataset whose samples interleave
them deterministically in those proportions, resumable at any position like any other dataset.

Which member serves mixture position j is fixed by an apportionment that never lags: the first c
positions hold A_m(c) samples of member m, A_m(c) = c * w_m to within a sample or two for every c
(a binary tree of roundings, each floor(c * q + 1/2), so every A_m grows by at most one per position
and exactly one member grows at each). Any window of N positions therefore holds N * w_m samples of
member m to within a few samples, and position j maps to (member, its A_m(j)-th draw) in O(log M)
arithmetic: no table is built, however long the epoch. A member's draws run through its own
permutations, epoch after epoch (serve/draws.py, keyed by seed, member and member epoch), or in index
order for members whose samples are independent draws already (random token windows).

The Loader asks for runs of positions (as ranges). A run is served from a plan of the positions this
process is about to serve (about 8,192: the next ones, or its next runs of a rank's or worker's share,
`stride` apart): which member serves each, its index in the member and, for token members, the window
start, each worked out for the whole plan at once. Token members' windows are gathered through one view
that spans every member (`Joined`), so a mixed batch costs one gather and one conversion, as one pack's
does. benchmarks/bench_resume.py compares a mixture's batches with one pack's.
"""
from __future__ import annotations

import threading
from typing import Sequence

import numpy as np

from ..errors import DataprepError, UsageError
from . import contract, draws
from .apportion import _shares, _tree
from .mixture_fills import MixtureFills, Part, member_seed
from .mixture_labels import ClassListsDiffer, _label_space, _name
from .plans import Joined, Plan
from .request import Request

__all__ = ["Mixture", "ClassListsDiffer", "Part", "member_seed"]  # the last three from their modules, importable here

PERMUTATION_LIMIT = 1 << 22  # members up to this many samples keep their shuffle as an array (int32: 16 MiB)
# Positions a plan works out at once (a few plans kept per process). Arrays of 8,192 int64 stay under
# malloc's 128 KiB mmap threshold, above which every temporary is a fresh mapping and numpy's arithmetic
# costs several times as much an element.
CHUNK = 1 << 13


class Mixture(MixtureFills):
    """Datasets of one kind served as one, in proportion to `weights`.

    Args:
        datasets: datasets of one class whose batch layouts match (token packs of one context, image
            packs of one size or served with one crop, ...), each giving serve/contract.py's `Servable`
            (and, where it has them, its optional hooks: `FillsRows`, `FillsParts`, `Addressed`,
            `Windowed`, `WorkerInit`, `independent_samples`, `classes`); one lacking a required method
            is refused here.
        weights: positive numbers, normalised to sum to 1.
        seed: the key of each member's shuffles.
        samples: positions in one mixture epoch [default: with exhausted="stop", until the first member
            runs out; with "restart", the members' total length].
        exhausted: "restart" (a member that runs out continues with its next epoch, newly shuffled) or
            "stop" (the mixture epoch ends when its first member would run out; no sample repeats).
        shuffle: each member's samples in a new order every member epoch (else in index order). Members
            whose samples are independent random draws keyed by (epoch, index), as a token pack's random
            windows are (`independent_samples`), are served in index order either way: in order, their
            samples are as random as shuffled, and no shuffle is drawn for them.

        labels: how members whose class lists differ share one label space (members of one class list,
            or none, need nothing: `classes` is that list, or None). Refused (`ClassListsDiffer`, naming
            each member and its first classes) unless said:
            "by_name": `classes` is every member's names, first seen first (member 0's in its order, then
                each new name as the members list it); each member's labels are renumbered to them, so
                "cat" is one label whichever pack it came from;
            "offset": member k's labels are shifted by the classes of the members before it; `classes`
                is their lists concatenated, names as they are (a name two members share is there twice,
                two labels);
            "as_is": the labels served as each member stores them (`classes` is None: no list names them).
            A member without labels (or without names for them) cannot be renumbered: mixed with labelled
            ones it is refused, unless "as_is". Labels in segmentation masks are never renumbered.

    `passes` gives each member's epochs per mixture epoch; `classes` the names of the labels it serves (None
    where it serves none, or the members' lists differ and labels="as_is"). The Loader serves it with
    shuffle=False (the order is the mixture's own), sharded, resumed and scheduled like any dataset.

    Members of packed token rows (`PackedDocuments`, one context) are served as they are alone: dicts, a
    finish_batch that adds cu_seqlens, rows of padding to even out the ranks (`pads_empty`), a Loader state
    refused under another plan (`plan_key`: the members' and the mixture's). Every row holds `context`
    tokens, so weights are shares of the tokens served, padding counted; member m's share of the real
    tokens is w_m f_m / sum_j w_j f_j, f being a member's fill (1 - `info()["padding_share"]`). Member m's
    document ids are numbered on past the documents of members 0..m-1 (`documents`), so an id names one
    document of one member.
    """

    ordered = True  # the Loader must not shuffle it: the interleaving is the point

    def __init__(self, datasets: Sequence, weights: Sequence[float], seed: int = 0, samples: int | None = None,
                 exhausted: str = "restart", shuffle: bool = True, labels: str | None = None):
        self.datasets = list(datasets)
        if len(self.datasets) < 1:
            raise UsageError("Mixture: datasets holds no dataset: a Mixture needs at least one")
        w = np.asarray(weights, np.float64)
        if w.shape != (len(self.datasets),) or not np.all(np.isfinite(w)) or (w <= 0).any():
            raise UsageError(f"Mixture: weights is one positive number per dataset ({len(self.datasets)}), not {list(weights)}")
        if exhausted not in ("restart", "stop"):
            raise UsageError(f"Mixture: exhausted is 'restart' or 'stop', not {exhausted!r}")
        for m, d in enumerate(self.datasets):
            contract.check_servable(d, member=m)
            if contract.attribute(d, "transform") is not None:
                raise UsageError(f"Mixture: datasets[{m}] has a per-sample transform; members must have none (the Loader crops and flips)")
            if len(d) == 0:
                raise UsageError(f"Mixture: datasets[{m}] is empty")
        kinds = [type(d).__name__ for d in self.datasets]
        odd = next((m for m, k in enumerate(kinds) if k != kinds[0]), None)
        if odd is not None:
            raise UsageError(f"a Mixture mixes datasets of one kind, not {sorted(set(kinds))}: member {odd} "
                             f"({_name(self.datasets[odd], odd)}) is a {kinds[odd]}, member 0 "
                             f"({_name(self.datasets[0], 0)}) a {kinds[0]}")
        self._classes, self._label_key, self._luts = _label_space(self.datasets, labels)
        # the first member's finish_batch (contract.FinishesBatch; members are of one class), None where it has
        # none: an instance attribute, so the hook is absent for the Loader and for isinstance alike
        self.finish_batch = contract.hook(self.datasets[0], "finish_batch")
        self.weights = w / w.sum()
        self.seed, self.exhausted, self.shuffle = int(seed), exhausted, shuffle
        self.lengths = np.array([len(d) for d in self.datasets], np.int64)
        self._tree = _tree(list(range(len(self.datasets))), self.weights)
        if exhausted == "stop":
            longest = self._longest_without_repeat()
            self.samples = min(int(samples), longest) if samples is not None else longest
        else:
            self.samples = int(samples) if samples is not None else int(self.lengths.sum())
        if self.samples < 1:
            raise DataprepError("a Mixture epoch of no samples (a member is too small for its weight?)")
        self._per_epoch = self.counts(self.samples)
        self.epoch = 0
        if self.serves_dicts:  # packed rows take no crop: their layouts are known now, and must agree now
            self.batch_layout(Request())
        # where each member's document ids start in the mixture's (`documents`), None where members have none
        documents = [getattr(d, "documents", None) for d in self.datasets]
        whole = all(isinstance(n, (int, np.integer)) and not isinstance(n, bool) for n in documents)
        self._doc_starts = np.cumsum([0] + documents[:-1]).astype(np.int64) if whole else None

    # -- the apportionment --------------------------------------------------------------------------
    def counts(self, c) -> np.ndarray:
        """How many of the first c positions each member holds.

        Args:
            c: A count of positions, or an array of counts.

        Returns:
            An array (members, *shape of c).
        """
        shares: list = [None] * len(self.datasets)
        _shares(self._tree, np.asarray(c, np.int64), shares)
        return np.stack(shares)

    def _longest_without_repeat(self) -> int:
        guess = int(np.floor(np.min(self.lengths / self.weights)))
        cand = np.arange(max(1, guess - 4 * len(self.datasets) - 64), guess + 2, dtype=np.int64)
        ok = (self.counts(cand) <= self.lengths[:, None]).all(0)
        return int(cand[ok].max()) if ok.any() else 0

    @property
    def classes(self) -> list | None:
        """The names of the labels this mixture serves (label i is classes[i]), or None: its members serve
        no labels, or labels="as_is" over members whose lists differ."""
        return None if self._classes is None else list(self._classes)

    @property
    def label_key(self) -> str | None:
        """The batch key its labels are served under ("labels", "masks", "target"), None where it serves none."""
        return self._label_key

    @property
    def fills_in_threads(self) -> bool:
        """Whether fills may run in several threads at once (the contract's `fills_in_threads`): where every
        member's may and none holds a partition (whose part moves with the epoch). The plans and shuffles
        this mixture keeps are made under a lock; its members' state is moved in the pass's first fill
        (`settle`), which the thread backend runs alone."""
        return all(contract.flag(d, "fills_in_threads") and contract.attribute(d, "partition") is None for d in self.datasets)

    def settle(self, request: Request) -> None:
        """Move every member to what `request` asks (the resolution it holds: the contract's `settle`), so that
        no member moves while fills run in several threads. A member the pass draws nothing from moves too (it
        loads that resolution where it does not keep it): the cost of a move made once, before any thread fills.

        Args:
            request: What the pass asks for.
        """
        with self._planning():
            for m, d in enumerate(self.datasets):
                settle = contract.hook(d, "settle")
                if settle is not None:
                    settle(Request(request.epoch, member_seed(request.seed, m), request.resolution, request.crop, request.flip))

    def _unsettled(self, resolution: int) -> bool:
        """Whether a member that settles holds another resolution than `resolution` (by its own state: something
        else, another Loader or `use`, may have moved it since this mixture last settled it)."""
        return any(contract.attribute(d, "resolution") != resolution for d in self.datasets if contract.has_hook(d, "settle"))

    def _planning(self):
        """The lock held while the plans, shuffles and joined view this mixture keeps are looked up or made:
        fills in several threads share them. Made on first use (not pickled with the mixture); setdefault keeps
        the first of two threads' locks."""
        lock = self.__dict__.get("_lock")
        return lock if lock is not None else self.__dict__.setdefault("_lock", threading.RLock())

    @property
    def serves_dicts(self) -> bool:
        """Whether batches are dicts (the contract's `serves_dicts`): as the members' (one class) are."""
        return contract.flag(self.datasets[0], "serves_dicts")

    @property
    def pads_empty(self) -> bool:
        """Whether position -1 is a sample that counts nothing (the contract's `pads_empty`): where the
        members' (one class) is, the first member fills it."""
        return contract.flag(self.datasets[0], "pads_empty")

    @property
    def plan_key(self) -> str | None:
        """What a Loader state's position counts in besides the packs (the contract's `plan_key`), where a
        member has one: the members' keys, the weights, seed, epoch length and how members restart and
        shuffle. A state saved over another mixture of such members is refused; None where no member has one."""
        keys = [contract.attribute(d, "plan_key") for d in self.datasets]
        if all(k is None for k in keys):
            return None
        weights = ", ".join(f"{w:.17g}" for w in self.weights)
        return (f"mixture of [{'; '.join(map(str, keys))}], weights [{weights}], seed {self.seed}, "
                f"{self.samples} samples, exhausted {self.exhausted}, shuffle {self.shuffle}")

    @property
    def documents(self) -> int | None:
        """The members' documents (packed rows), their ids numbered on from member to member; None where a
        member has no `documents`."""
        return None if self._doc_starts is None else int(self._doc_starts[-1]) + self.datasets[-1].documents

    @property
    def passes(self) -> list[float]:
        """Each member's epochs per mixture epoch (samples drawn / its length)."""
        return (self._per_epoch / self.lengths).tolist()

    def locate(self, idx, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Where positions `idx` of mixture epoch `epoch` come from.

        Args:
            idx: The positions.
            epoch: The mixture's epoch.

        Returns:
            (member, index in the member, the member's epoch), each an int64 array shaped as `idx`.
        """
        idx = np.asarray(idx, np.int64)
        member, index, m_epoch = (np.empty(idx.shape, np.int64) for _ in range(3))
        for p in self._groups(idx, epoch):
            member.reshape(-1)[p.rows], index.reshape(-1)[p.rows], m_epoch.reshape(-1)[p.rows] = p.member, p.index, p.epoch
        return member, index, m_epoch

    def _groups(self, idx: np.ndarray, epoch: int) -> list[Part]:
        """The parts of positions `idx` (flattened), their rows as arrays of rows of idx, without addresses:
        a run of positions (as the Loader asks) is sliced from a plan (`_plan`); scattered positions are
        worked out one by one."""
        idx = np.asarray(idx, np.int64).reshape(-1)
        n = idx.size
        if not n:
            return []
        run = self._run(idx)
        with self._planning():
            if run is not None:
                return [p._replace(rows=np.arange(n)[p.rows]) for p in self._run_parts(*run, epoch)]
            return self._scattered(idx, epoch)

    def _scattered(self, idx: np.ndarray, epoch: int) -> list[Part]:
        """`_groups` for positions that are no run, worked out one by one."""
        n = idx.size
        if idx.min() < 0 or idx.max() >= self.samples:
            raise IndexError(f"a position is out of range for a mixture epoch of {self.samples}")
        c = self.counts(np.concatenate([idx, idx + 1]))
        before = c[:, :n]
        member = np.argmax(c[:, n:] - before, axis=0)
        groups = []
        for m in range(len(self.datasets)):
            rows = np.flatnonzero(member == m)
            if len(rows):
                groups += self._draws(m, rows, before[m, rows], epoch, run=False)
        return groups

    def _run(self, idx: np.ndarray) -> tuple[int, int] | None:
        """(lo, hi) if positions `idx` are the run lo..hi-1, else None."""
        n = idx.size
        lo = int(idx[0])
        hi = lo + n
        if int(idx[-1]) != hi - 1 or (n > 2 and not (idx - lo == _ramp(n)).all()):
            return None
        if lo < 0 or hi > self.samples:
            raise IndexError(f"a position is out of range for a mixture epoch of {self.samples}")
        return lo, hi

    def _run_parts(self, lo: int, hi: int, epoch: int, seed: int | None = None) -> list[Part]:
        """Positions lo..hi-1 of `epoch` as parts (rows: rows of the run, a slice where they are contiguous;
        addresses: the member's under Loader seed `seed`, None where not asked or the member has none),
        sliced from the plan that holds the run: no apportionment, shuffle or draw is worked out per batch."""
        plan, i = self._plan(lo, hi, epoch)
        n = hi - lo
        member, m_epoch, index = plan.member[i : i + n], plan.m_epoch[i : i + n], plan.index[i : i + n]
        addressed = self._addressed()
        addr = self._plan_addresses(plan, seed)[i : i + n] if seed is not None and any(addressed) else None
        m0, e0 = int(member[0]), int(m_epoch[0])
        if (member == m0).all() and (m_epoch == e0).all():  # the whole run from one member epoch
            return [Part(m0, e0, slice(0, n), index, addr if addressed[m0] else None)]
        parts = []
        for m in np.flatnonzero(np.bincount(member, minlength=len(self.datasets))):
            rows = np.flatnonzero(member == m)
            epochs = m_epoch[rows]  # ascending along the run
            for e in range(int(epochs[0]), int(epochs[-1]) + 1):
                mine = rows if epochs[0] == epochs[-1] else rows[epochs == e]
                if len(mine):
                    parts.append(Part(int(m), e, mine, index[mine], addr[mine] if addr is not None and addressed[m] else None))
        return parts

    def _plan(self, lo: int, hi: int, epoch: int) -> tuple[Plan, int]:
        """The plan that holds positions lo..hi-1 of `epoch` (a few of the latest kept), and where they
        start in it. On a miss, the positions this process is about to serve are planned: if its last
        request in this epoch started `stride` positions before this one, more than a run's length (a gap
        between them: a rank's share of each global batch, a worker's part of each batch), its next runs
        `stride` apart, about CHUNK positions in all, else the next CHUNK positions. What is planned only
        decides the cost, never a sample."""
        plans = self.__dict__.setdefault("_plans", [])
        last, self.__dict__["_last"] = self.__dict__.get("_last"), (epoch, lo, hi)
        for plan in reversed(plans):
            at = plan.find(lo, hi, epoch)
            if at is not None:
                return plan, at
        n = hi - lo
        stride = lo - last[1] if last is not None and last[0] == epoch else 0
        if stride > n:  # runs of n, stride apart
            plan = self._make_plan(epoch, lo, n, stride, max(1, CHUNK // n))
        else:
            plan = self._make_plan(epoch, lo, max(CHUNK, n), max(CHUNK, n), 1)
        if len(plans) >= 4:
            plans.pop(0)
        plans.append(plan)
        return plan, 0

    def _make_plan(self, epoch: int, start: int, length: int, stride: int, runs: int) -> Plan:
        """Which member serves each of the positions `runs` runs of `length`, `stride` apart from `start`
        (those before the epoch's end), its index in the member and the member's epoch, worked out for all
        at once: the apportionment at each position and the one after it (a member serves the positions
        its count grows at), then each member's draws."""
        heads = start + stride * np.arange(runs, dtype=np.int64)
        n = int(np.clip(self.samples - heads, 0, length).sum())  # the positions in the epoch lead the grid
        shares: list = [None] * len(self.datasets)
        _shares(self._tree, heads[:, None] + np.arange(length + 1, dtype=np.int64), shares)
        plan = Plan(epoch, start, length, stride, runs, n)
        for m, held in enumerate(shares):
            before = held[:, :-1].reshape(-1)[:n]
            rows = np.flatnonzero(held[:, 1:].reshape(-1)[:n] != before)
            if len(rows):  # a member's draws ascend along the positions
                plan.member[rows] = m
                for p in self._draws(m, rows, before[rows], epoch, run=True):
                    plan.index[p.rows], plan.m_epoch[p.rows] = p.index, p.epoch
                    plan.groups.append((p.member, p.epoch, p.rows))
        return plan

    def _addressed(self) -> list[bool]:
        """Which members have addresses (contract.Addressed: a token pack's window starts)."""
        return [contract.has_hook(d, "addresses") and contract.has_hook(d, "fill_addresses") for d in self.datasets]

    def _plan_addresses(self, plan: Plan, seed: int) -> np.ndarray:
        """The addresses of a plan's positions under a Loader of `seed` (each in its member's own terms;
        members without addresses leave theirs unset), drawn for the whole plan, a call per (member,
        member epoch), the first time a batch needs them: a draw's cost is mostly per call, so one for the
        plan is cheaper a batch than one per batch."""
        got = plan.addresses.get(seed)
        if got is None:
            addressed = self._addressed()
            got = np.empty(len(plan.member), np.int64)
            for m, e, rows in plan.groups:
                if addressed[m]:
                    got[rows] = self._checked(m, self.datasets[m].addresses(plan.index[rows], e, member_seed(seed, m)))
            if len(plan.addresses) >= 2:
                plan.addresses.clear()
            plan.addresses[seed] = got
        return got

    def _checked(self, m: int, addresses: np.ndarray) -> np.ndarray:
        """Member m's addresses, refused unless they are rows of its windows (where it has them): a joined
        gather (`Joined`) must never index past a member's own rows."""
        d = self.datasets[m]
        if contract.has_hook(d, "windows") and len(addresses):
            n = len(d.windows())
            if int(addresses.min()) < 0 or int(addresses.max()) >= n:
                raise DataprepError(f"Mixture member {m} ({type(d).__name__}) gave window starts outside its {n} windows "
                                    f"({int(addresses.min())}..{int(addresses.max())}); nothing is read past them")
        return addresses

    def _draws(self, m: int, rows: np.ndarray, rank: np.ndarray, epoch: int, run: bool) -> list[Part]:
        """Member m's draws number `rank` (of mixture epoch `epoch`) at `rows` -> its parts, one per member
        epoch: a draw past the member's length falls in its next epoch (restart)."""
        if self.exhausted == "stop":
            parts = [(int(epoch), rows, rank)]
        else:
            drawn = rank + int(epoch) * int(self._per_epoch[m])
            length = int(self.lengths[m])
            if run:  # drawn grows along the rows, so its ends bound its epochs
                e0, e1 = int(drawn[0]) // length, int(drawn[-1]) // length
            else:
                e0, e1 = int(drawn.min()) // length, int(drawn.max()) // length
            if e0 == e1:
                parts = [(e0, rows, drawn - e0 * length)]
            else:
                es = drawn // length
                parts = [(int(e), rows[es == e], drawn[es == e] - int(e) * length) for e in range(e0, e1 + 1)]
        shuffled = self.shuffle and not contract.flag(self.datasets[m], "independent_samples")
        return [Part(m, e, r, self._order(m, e, k) if shuffled else k) for e, r, k in parts if len(r)]

    def _order(self, m: int, e: int, k: np.ndarray) -> np.ndarray:
        """Position k of member m's shuffle in its epoch e: a permutation array held for members of up to
        PERMUTATION_LIMIT samples (made once per member epoch, in the process that serves it), else
        computed per position (serve/draws.permuted: no memory, a few microseconds a sample more)."""
        n = int(self.lengths[m])
        if n > PERMUTATION_LIMIT:
            return draws.permuted(n, (draws.MIXTURE, self.seed, m, e), k)
        cache = self.__dict__.setdefault("_orders", {})
        if cache.get(m, (None,))[0] != e:
            key = [w & 0xFFFFFFFFFFFFFFFF for w in (draws.MIXTURE, self.seed, m, e)]  # cheaper than argsorting draws
            order = np.arange(n, dtype=np.int32)  # the permutation Generator.permutation(n) gives, cheaper
            np.random.default_rng(key).shuffle(order)
            cache[m] = (e, order)
        return cache[m][1][k]

    def __getstate__(self):
        """Without the caches (worked out again where needed)."""
        return {k: v for k, v in self.__dict__.items() if k not in ("_plans", "_last", "_orders", "_joined", "_lock")}

    # -- a dataset ------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.samples

    def set_epoch(self, epoch: int) -> None:
        """Pick the epoch `mixture[i]` serves; the Loader passes its own epoch with every batch.

        Args:
            epoch: The epoch.
        """
        self.epoch = int(epoch)

    def _join(self) -> Joined | None:
        """The members' windows joined into one view (token packs of one context and dtype), or None where
        they cannot be. Remade if a member's windows are no longer the ones joined (a member reloaded),
        its addresses then drawn and checked anew; asking each member for its windows also checks that a
        mapped pack still holds them."""
        if not contract.has_hook(self.datasets[0], "windows") or not all(self._addressed()):
            return None
        windows = [d.windows() for d in self.datasets]
        got = self.__dict__.get("_joined")
        if got is None or any(w is not v for w, v in zip(windows, got.windows)):
            self.__dict__.pop("_plans", None)
            got = self.__dict__["_joined"] = Joined(windows)
        return got if got.view is not None else None


_RAMP = np.arange(0, dtype=np.int64)


def _ramp(n: int) -> np.ndarray:
    """0..n-1, sliced from one array kept per process (a run check is then one comparison)."""
    global _RAMP
    ramp = _RAMP  # read once: a fill in another thread may replace it meanwhile
    if len(ramp) < n:
        ramp = _RAMP = np.arange(max(n, 2 * len(ramp)), dtype=np.int64)
    return ramp[:n]
