"""Resuming: takes a Loader (its position, seed, world and what it serves), gives the state a checkpoint
saves (torchdata's StatefulDataLoader protocol: `state_dict` / `load_state_dict`), and checks a saved
state against the Loader it is restored into: every value of the right type and range, the same pack
(a digest of its shard checksums), epoch length, kind of order and partition, or an error saying why the
position means nothing here; a different seed, batch size, shuffle, crop or flip is a
warning that says what the resumed run does.

The state names a position in one epoch: while a pass is served (and after it served its last batch, until
the pass ends) that epoch and the samples of its order consumed; once a pass has ended, the next epoch at 0.
A state saved after an epoch's last batch therefore resumes into the rest of that epoch, which is nothing,
so a training loop that saves its own epoch number beside the state stays in step with the Loader.
"""
from __future__ import annotations

import hashlib
import numbers
import warnings
from typing import Any

import numpy as np

from ..errors import DataprepError, brief
from . import contract
from .partition import partition_state

# 2: a Mixture serves its random-window members (token packs) in index order, unshuffled; states of
# version 1 may come from a dataprep that shuffled them, whose positions name other windows.
STATE_VERSION = 2


def epoch_samples(loader) -> int:
    """Samples in one epoch of the Loader's order (its sampler's, or its dataset's)."""
    return len(loader.sampler) if loader.sampler is not None else len(loader.dataset)


def loader_state(loader) -> dict[str, Any]:
    """The Loader's state: the epoch and samples of its order consumed, and what it was serving."""
    epoch, consumed = loader.cursor.saved()
    total = epoch_samples(loader)
    return {"format": "dataprep.Loader", "version": STATE_VERSION, "seed": loader.seed, "epoch": int(epoch),
            "samples_consumed": int(consumed), "world_size": loader.world_size, "batch_size": loader.batch_size,
            "length": int(total), "shuffle": loader.shuffle, "sampler": loader.sampler is not None,
            "crop": repr(loader.crop), "flip": loader.flip, "partition": partition_state(loader.dataset),
            "resolution": loader.schedule(epoch) if loader.schedule is not None else contract.attribute(loader.dataset, "resolution"),
            "pack": pack_identity(loader.dataset), "plan": contract.attribute(loader.dataset, "plan_key")}


def pack_identity(dataset) -> str | None:
    """What the position counts in: a digest of the split's shard checksums (the manifest records them), so
    another pack of the same length is told apart while a byte-identical rebuild is not; a Mixture's
    combines its members'. None for a dataset that is no pack's (nothing to compare)."""
    members = getattr(dataset, "datasets", None)
    if members is not None and not hasattr(dataset, "manifest"):
        ids = [pack_identity(d) for d in members]
        return None if any(i is None for i in ids) else _digest("mixture", *ids)
    m, split = contract.attribute(dataset, "manifest"), contract.attribute(dataset, "split")
    if not isinstance(m, dict) or split not in m.get("splits", {}):
        return None
    shards = m["splits"][split].get("shards", [])
    sums = [f"{s.get('name')}:{name}:{rec.get('sha256')}" for s in shards for name, rec in sorted(s.get("files", {}).items())]
    return _digest(m.get("kind", ""), split, *sums)


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(map(str, parts)).encode()).hexdigest()[:32]


# The largest count a state may hold: epochs, samples and batch sizes meet numpy's int64 where they are used.
_COUNT = (1 << 63) - 1
# key -> (type, lowest, highest (None: no bound)): checked before any is used, so a hand-edited or foreign state
# is an error naming the key, its value and the range, not a ZeroDivisionError, KeyError, numpy's "expected
# non-negative integer" (a seed of -1 reaching the order's generator) or an epoch serving duplicates or nothing.
# A seed has no upper bound: numpy's generators take any non-negative integer, and so does a Loader.
_FIELDS: dict[str, tuple[type, int, int | None]] = {
    "seed": (int, 0, None), "epoch": (int, 0, _COUNT), "samples_consumed": (int, 0, None), "world_size": (int, 1, _COUNT),
    "batch_size": (int, 1, _COUNT), "length": (int, 0, _COUNT), "sampler": (bool, 0, 1)}


def _expected(key: str) -> str:
    """What `key` of a state must be, as a message says it."""
    kind, lo, hi = _FIELDS[key]
    if kind is bool:
        return "true or false"
    if key == "samples_consumed":
        return "an integer from 0 to the epoch's length"
    return f"an integer of {lo} or more" if hi is None else f"an integer from {lo} to {hi}"


def _check_fields(state: dict[str, Any]) -> None:
    for key, (kind, lo, hi) in _FIELDS.items():
        if key not in state:
            raise DataprepError(f"a Loader state without {key!r}: not one Loader.state_dict() made (or cut short)")
        v = state[key]
        # numpy's integers and bools count (a state passed through numpy or torch keeps them so); a float never does
        ok = isinstance(v, (bool, np.bool_)) if kind is bool else (isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)))
        if not ok:
            raise DataprepError(f"a Loader state whose {key} is {brief(v)} ({type(v).__name__}), not {_expected(key)}")
        within = lo <= int(v) and (hi is None or int(v) <= hi)
        if kind is int and key != "samples_consumed" and not within:  # samples_consumed: against its epoch, below
            raise DataprepError(f"a Loader state whose {key} is {brief(int(v))}, not {_expected(key)}")
    if not 0 <= int(state["samples_consumed"]) <= int(state["length"]):
        raise DataprepError(f"a Loader state whose samples_consumed is {state['samples_consumed']}, outside its epoch of "
                            f"{state['length']} samples: resuming there would serve samples twice or none")


def epoch_left(state: dict[str, Any], drop_last: bool) -> bool:
    """Whether a state saved mid-epoch leaves any of its epoch to serve (not so after the last batch)."""
    consumed, total = int(state["samples_consumed"]), int(state["length"])
    step = int(state["world_size"]) * int(state["batch_size"])
    return 0 < consumed < total and not (drop_last and total - consumed < step)


def check_state(loader, state: Any) -> int:
    """Refuse a state that cannot resume this Loader (warn where it can but serves differently); give the
    epoch's length."""
    if not isinstance(state, dict) or state.get("format") != "dataprep.Loader":
        raise DataprepError("not a dataprep Loader state (from Loader.state_dict())")
    version = state.get("version", 0)
    if not isinstance(version, numbers.Integral) or isinstance(version, (bool, np.bool_)):
        raise DataprepError(f"a Loader state whose version is {brief(version)}, not an integer from 0 to {STATE_VERSION}")
    if version > STATE_VERSION:
        raise DataprepError(f"a Loader state of version {brief(int(version))}; this dataprep reads up to {STATE_VERSION}")
    if version < 0:
        raise DataprepError(f"a Loader state whose version is {version}, not an integer from 0 to {STATE_VERSION}")
    _check_fields(state)
    total = epoch_samples(loader)
    if int(state["length"]) != total:
        raise DataprepError(f"the saved run served {state['length']} samples an epoch, this Loader {total}: "
                            "not the same dataset (or sampler), so its position means nothing here")
    saved, ours = state.get("pack"), pack_identity(loader.dataset)
    if saved is not None and ours is not None and saved != ours:
        raise DataprepError(f"the saved run served another pack of the same length (identity {str(saved)[:12]}..., this "
                            f"Loader's {ours[:12]}...): its position names other samples here; restore a state saved "
                            "from this pack (a state without 'pack', as older dataprep saved, is not checked)")
    plan = contract.attribute(loader.dataset, "plan_key")
    if plan is not None and state.get("plan") != plan:
        raise DataprepError(f"the saved run served rows of another plan ({state.get('plan')}), this Loader's are "
                            f"{plan}: its position names other rows here; restore it into a dataset made as the saved "
                            "run's was")
    mine = partition_state(loader.dataset)
    if state.get("partition") != mine:
        raise DataprepError(f"the saved run's partitioned cache was {state.get('partition')}, this one is "
                            f"{mine}: a position in one node's part means nothing in another's")
    if bool(state["sampler"]) != (loader.sampler is not None):
        raise DataprepError("the saved run " + ("used" if state["sampler"] else "did not use") +
                            " a sampler; resume with the same kind of order")
    if loader.sampler is not None and int(state["world_size"]) != 1 and int(state["samples_consumed"]):
        raise DataprepError("a sampler's position is per rank; resume with the same sampler and ranks")
    if int(state.get("version", 0)) < 2 and _shuffles_random_windows(loader.dataset):
        warnings.warn("a Loader state of version 1 over a Mixture with random-window members: a dataprep that wrote "
                      "version 1 may have shuffled those members, and then this run serves other windows than the "
                      "interrupted one would have (random windows all the same, so no sample is favoured, but not "
                      "the same batches); states saved from now on resume exactly", stacklevel=3)
    if int(state["seed"]) != loader.seed:
        warnings.warn(f"resuming a run saved with seed={state['seed']} into a Loader made with seed={loader.seed}: "
                      f"the saved seed is kept (its order is what the position counts in), so the rest of the epoch "
                      f"and the epochs after it are the saved run's; make the Loader with seed={state['seed']} to "
                      "silence this", stacklevel=3)
    if int(state["batch_size"]) != loader.batch_size and int(state["samples_consumed"]):
        warnings.warn(f"resuming a run saved with batch_size={state['batch_size']} with batch_size={loader.batch_size}: "
                      f"the rest of epoch {state['epoch']} is served from sample {state['samples_consumed']} of its "
                      f"order in batches of {loader.batch_size}, every remaining sample once; len() of that epoch "
                      "counts the saved run's batches plus this run's", stacklevel=3)
    for key, ours in (("shuffle", loader.shuffle), ("crop", repr(loader.crop)), ("flip", loader.flip)):
        if state.get(key) != ours:
            warnings.warn(f"resuming a run saved with {key}={state.get(key)!r} with {key}={ours!r}: the rest is "
                          f"served with {key}={ours!r}", stacklevel=3)
    return total


def _shuffles_random_windows(dataset) -> bool:
    """Whether `dataset` is a Mixture (or holds one) that shuffles random-window members: what a dataprep
    writing version 1 states may have served otherwise."""
    members = getattr(dataset, "datasets", ())
    return any((getattr(dataset, "shuffle", False) and contract.flag(d, "independent_samples"))
               or _shuffles_random_windows(d) for d in members)
