"""The serving contract: what a dataset gives `dataprep.Loader` (and a `dataprep.Mixture` each of its
members), as typing.Protocols in one place, and the named checks the Loader and the Mixture make of a
dataset instead of probing it attribute by attribute.

Required (`Servable`): `__len__`, `batch_layout(request)` and `fill_batch(idx, out, request)`. A
dataset that lacks any of them is refused once, when a Loader or a Mixture is made (`check_servable`),
by a `NotServable` error naming its class and every name it lacks; nothing is checked per batch.

Everything else is optional: a hook the Loader or a Mixture calls where the dataset has one (each its
own small Protocol below: `WorkerInit`, `SetsEpoch`, `FillsRows`, `FillsRuns`, `FillsParts`,
`Addressed`, `Windowed`, `FinishesBatch`), or an attribute it reads where set (`ATTRIBUTES`). A hook set to None counts
as absent, so a subclass can opt out of one its base class offers (SegmentationDataset does of
`fill_parts`), as `isinstance` with these runtime-checkable Protocols also has it.

Public: the Protocols, `Request`, `Layout`, `REQUIRED`, `HOOKS`, `FLAGS`, `ATTRIBUTES`, `missing`,
`check_servable`, `NotServable`, `has_hook`, `hook`, `flag`, `attribute`. docs/datasets.md serves a
dataset written against this module alone.
"""
from __future__ import annotations

from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from ..errors import DataprepError
from .request import Request

__all__ = ["Servable", "WorkerInit", "SetsEpoch", "FillsRows", "FillsRuns", "FillsParts", "Addressed", "Windowed", "FinishesBatch",
           "Request", "Layout", "REQUIRED", "HOOKS", "FLAGS", "ATTRIBUTES", "NotServable", "missing", "check_servable",
           "has_hook", "hook", "flag", "attribute", "fill_parts_of"]

Layout = Mapping[str, tuple[tuple[int, ...], np.dtype]]  # batch key -> (one sample's shape, its dtype)
DOCS = "docs/datasets.md"


# -- required -----------------------------------------------------------------------------------------
@runtime_checkable
class Servable(Protocol):
    """What every dataset the Loader serves gives it (and every member a Mixture mixes)."""

    def __len__(self) -> int:
        """Samples in one epoch: the Loader's order is a permutation of range(len) (shuffle=True, drawn from
        (seed, epoch)) or range(len) itself; rank shares, padding, `len(loader)` and a resumed state's
        position all count in it."""

    def batch_layout(self, request: Request) -> Layout:
        """What one sample occupies in a batch buffer: {key: (sample shape, dtype)}; the Loader yields one
        tensor per key, in this order. Called when the Loader is made (refuse a crop, flip or resolution
        the dataset cannot serve here, with a DataprepError), at every pass's start, and for every size a
        schedule reaches (the Loader's shared ring is allocated once, for the largest). It depends on the
        request alone and is cheap."""

    def fill_batch(self, idx, out: dict[str, np.ndarray], request: Request) -> None:
        """Write samples `idx` (an integer array: int64, or int32 from a Mixture's shuffles; a `range` where
        the dataset sets `fills_runs`) into the first len(idx) rows of each `out[key]`, arrays shaped
        (rows, *shape) of `batch_layout(request)`'s dtype. `out` is a view of the Loader's ring: write into it in place, never rebind it. Called in
        the Loader's process (num_workers=0) or in a forked worker, each worker filling part of a batch:
        everything a sample's value depends on (epoch, seed of its random draws, resolution, crop, flip)
        comes in `request`, never from the dataset's attributes, and a random draw is keyed by (request.seed,
        request.epoch, the sample's index), so any number of workers and a resumed run serve the same."""


REQUIRED = ("__len__", "batch_layout", "fill_batch")


# -- optional hooks -----------------------------------------------------------------------------------
@runtime_checkable
class WorkerInit(Protocol):
    """worker_init(): run once in each Loader worker process, after it forks and before its first batch
    (dataprep's image packs turn OpenCV's own thread pool off there: the workers are the parallelism).
    A Mixture runs each of its members'. Never called with num_workers=0."""

    def worker_init(self) -> None: ...


@runtime_checkable
class SetsEpoch(Protocol):
    """set_epoch(epoch): called in the Loader's process at the start of every pass, with the epoch it
    serves, for indexing there (`dataset[i]`). Workers never see it: each request carries the epoch."""

    def set_epoch(self, epoch: int) -> None: ...


@runtime_checkable
class Settles(Protocol):
    """settle(request): move the dataset's state to what `request` asks (the resolution it holds), as its
    fill_batch would on meeting the request. A Mixture served by threads calls it on every member in the
    pass's first fill, which runs alone, so that no member's state moves while fills run in several threads
    (fills_in_threads): a member's first fill of the pass may come in any of them."""

    def settle(self, request: Request) -> None: ...


@runtime_checkable
class FillsRows(Protocol):
    """fills_rows = True: fill_batch also takes `rows=` (a slice, or an int64 array of rows of `out`) and
    writes sample idx[k] into row rows[k]. A Mixture then writes a member's scattered share of a batch
    straight into the batch; without it (or with fills_rows = False) the member fills a buffer of its own,
    which the Mixture scatters. The Loader itself never passes rows. (isinstance() sees only that the
    names exist; the Mixture reads the flag's value, `flag(dataset, "fills_rows")`.)"""

    fills_rows: bool

    def fill_batch(self, idx, out: dict[str, np.ndarray], request: Request, rows=None) -> None: ...


@runtime_checkable
class FillsRuns(Protocol):
    """fills_runs = True: where the order is the identity (shuffle=False, no sampler), a batch (or a
    worker's part of one) whose positions are consecutive reaches fill_batch as range(lo, hi), not an
    array, so the dataset need not check that they are a run. A Mixture sets it: a run is its cheap case."""

    fills_runs: bool


@runtime_checkable
class FillsParts(Protocol):
    """fill_parts(parts, out), a static method: datasets of one class filling one batch together, `parts`
    a list of (dataset, idx, rows, request), each part as that dataset's fill_batch(idx, out, request,
    rows=rows) would fill it. A Mixture looks it up on its first member's class and uses it for a batch
    of several parts, none with addresses (image packs draw every part's crop boxes and flips in one pass)."""

    @staticmethod
    def fill_parts(parts: Sequence[tuple[Any, Any, Any, Request]], out: dict[str, np.ndarray]) -> None: ...


@runtime_checkable
class Addressed(Protocol):
    """addresses(idx, epoch, seed) and fill_addresses(addresses, out, rows=None): a sample's address (a
    token pack's window start) is worked out apart from filling it, so a Mixture draws the addresses of a
    whole plan of positions at once (seed: the member's own seed under the Loader's) and then fills each
    batch from them, into out's first rows or rows `rows`. Both, or neither, are used."""

    def addresses(self, idx: np.ndarray, epoch: int, seed: int) -> np.ndarray: ...

    def fill_addresses(self, addresses: np.ndarray, out: dict[str, np.ndarray], rows=None) -> None: ...


@runtime_checkable
class Windowed(Protocol):
    """windows() and fill_raw(w, out, rows=None): every sample as a row of one 2-D view, an address being
    its row. Where every member is `Addressed` and `Windowed` and their views line up (one dtype and row
    length), a Mixture gathers a mixed batch's rows through one view spanning them all and has its first
    member convert them into the batch (fill_raw); it checks every address it draws against its member's
    len(windows()) first."""

    def windows(self) -> np.ndarray: ...

    def fill_raw(self, w: np.ndarray, out: dict[str, np.ndarray], rows=None) -> None: ...


@runtime_checkable
class FinishesBatch(Protocol):
    """finish_batch(batch) -> batch: called in the Loader's process on each batch's tensors ({key: tensor},
    in batch_layout's order), after they are made and before the batch is handed out; gives the batch to
    serve, the same keys in the same order (a dataset that `serves_dicts` may add keys after them: packed
    token rows add `cu_seqlens`). It may cut a tensor (a detection batch's boxes to the batch's
    largest count: `t[:, :m]`) or replace one, never write into one: a tensor may be a view of the Loader's
    ring, and a view of it holds its slot as the tensor itself does, so a held batch still never changes.
    The buffers keep the full layout; only what is served is cut. A Mixture uses its first member's."""

    def finish_batch(self, batch: dict[str, Any]) -> dict[str, Any]: ...


HOOKS: dict[str, type] = {"worker_init": WorkerInit, "set_epoch": SetsEpoch, "settle": Settles, "fill_parts": FillsParts,
                          "addresses": Addressed, "fill_addresses": Addressed, "windows": Windowed, "fill_raw": Windowed,
                          "finish_batch": FinishesBatch}

# flags: read as bool(getattr(dataset, name, False))
FLAGS: dict[str, str] = {
    "fills_rows": "fill_batch takes rows= (FillsRows)",
    "fills_runs": "fill_batch takes a range for a run of positions (FillsRuns)",
    "ordered": "the dataset orders its samples itself (a Mixture): the Loader refuses shuffle=True",
    "fills_in_threads": "fill_batch may run in several threads of one process at once, on disjoint rows of one request "
                        "(Loader(threads=True)); the dataset's state moves only in the first fill of a pass",
    "pads_empty": "the samples that make an epoch's last global batch a multiple of the ranks are asked for as index "
                  "-1, which fill_batch fills as a sample that counts nothing (packed rows: a row of padding), "
                  "instead of the epoch's first samples served again",
    "serves_dicts": "each batch is served as a dict (batch_layout's keys, then any finish_batch adds), not a tuple",
    "independent_samples": "samples are independent random draws keyed by (epoch, index) (random token windows): a "
                           "Mixture serves them in index order, drawing no shuffle for them",
}

# attributes: read as getattr(dataset, name, None)
ATTRIBUTES: dict[str, str] = {
    "transform": "a per-sample transform: a dataset with one that is not None is refused (the Loader serves stored "
                 "values; crop and flip through the Loader, normalise on the GPU)",
    "joint": "a joint (image, mask) transform: refused like `transform`",
    "partition": "a dataprep.Partition (or None): the node's part of a partitioned cache; the Loader takes the "
                 "rank and world size from it and draws each node its own order",
    "resolution": "the resolution a request carries where no schedule sets one (None: the dataset has one size)",
    "classes": "the names of the labels a dataset serves under the key 'labels' (a Mixture compares its members')",
    "manifest": "with `split`: the pack a Loader state records (a digest of the split's shard checksums), so a "
                "state from another pack of the same length is refused; without them only the length is checked",
    "split": "see `manifest`",
    "plan_key": "a string naming what a position counts in besides the pack (packed rows: the context, strategy and "
                "seed of their plan); a Loader state records it, and one saved under another is refused",
    "decode_paths": "a dict {path: count} the dataset adds to as it fills batches (image packs: 'full', '1/2', "
                    "'full from 256 px', ...), per process; Loader.stats() sums it over the workers, per epoch",
}


# -- the checks ---------------------------------------------------------------------------------------
class NotServable(DataprepError, TypeError):
    """A dataset lacks a method the serving contract requires (REQUIRED): refused when a Loader or a
    Mixture is made."""


def missing(dataset) -> list[str]:
    """The REQUIRED names `dataset` lacks, in REQUIRED's order: absent, None or not callable (`__len__`
    looked up on its class, as len() does)."""
    cls = type(dataset)
    return [name for name in REQUIRED if not callable(getattr(cls if name.startswith("__") else dataset, name, None))]


def check_servable(dataset, member: int | None = None) -> None:
    """Refuse a dataset the Loader cannot serve (or, with `member`, a Mixture cannot mix as its member
    number `member`): a NotServable naming its class and every REQUIRED name it lacks."""
    lack = missing(dataset)
    if not lack:
        return
    kind = type(dataset).__name__
    has = f"it has no {', '.join(lack)} (the serving contract: {DOCS}, dataprep.serve.contract)"
    if member is None:
        raise NotServable(f"Loader serves datasets that fill whole batches (InMemoryImageDataset, TokenDataset, "
                          f"TabularDataset, Mixture, ...); a {kind} does not: {has}; or serve it with "
                          "torch.utils.data.DataLoader")
    raise NotServable(f"a Mixture mixes datasets that fill whole batches; member {member}, a {kind}, cannot fill "
                      f"batches: {has}")


def hook(dataset, name: str):
    """`dataset`'s optional hook `name` (one of HOOKS), or None where it has none (or has it set to None)."""
    if name not in HOOKS:
        raise KeyError(f"{name!r} is not a hook of the serving contract ({', '.join(HOOKS)})")
    return getattr(dataset, name, None)


def has_hook(dataset, name: str) -> bool:
    """Whether `dataset` has the optional hook `name` (one of HOOKS), not set to None."""
    return hook(dataset, name) is not None


def flag(dataset, name: str) -> bool:
    """`dataset`'s flag `name` (one of FLAGS), False where it does not set it."""
    if name not in FLAGS:
        raise KeyError(f"{name!r} is not a flag of the serving contract ({', '.join(FLAGS)})")
    return bool(getattr(dataset, name, False))


def attribute(dataset, name: str):
    """`dataset`'s optional attribute `name` (one of ATTRIBUTES), None where it has none."""
    if name not in ATTRIBUTES:
        raise KeyError(f"{name!r} is not an attribute of the serving contract ({', '.join(ATTRIBUTES)})")
    return getattr(dataset, name, None)


def fill_parts_of(dataset):
    """The `fill_parts` of `dataset`'s class (FillsParts), or None: looked up on the class, since it fills
    parts of several datasets of that class and no one of them is its `self`."""
    return hook(type(dataset), "fill_parts")
