"""Resuming: takes a Loader (its position, seed, world and what it serves), gives the state a checkpoint
saves (torchdata's StatefulDataLoader protocol: `state_dict` / `load_state_dict`), and checks a saved
state against the Loader it is restored into: the same epoch length, kind of order and partition, or an
error saying why the position means nothing here; a different seed, batch size, shuffle, crop or flip is a
warning that says what the resumed run does.

The state names a position in one epoch: while a pass is served (and after it served its last batch, until
the pass ends) that epoch and the samples of its order consumed; once a pass has ended, the next epoch at 0.
A state saved after an epoch's last batch therefore resumes into the rest of that epoch, which is nothing,
so a training loop that saves its own epoch number beside the state stays in step with the Loader.
"""
from __future__ import annotations

import warnings
from typing import Any

from ..errors import DataprepError
from .partition import partition_state

# 2: a Mixture serves its random-window members (token packs) in index order, unshuffled; states of
# version 1 may come from a dataprep that shuffled them, whose positions name other windows.
STATE_VERSION = 2


def epoch_samples(loader) -> int:
    """Samples in one epoch of the Loader's order (its sampler's, or its dataset's)."""
    return len(loader.sampler) if loader.sampler is not None else len(loader.dataset)


def loader_state(loader) -> dict[str, Any]:
    """The Loader's state: the epoch and samples of its order consumed, and what it was serving."""
    epoch, consumed = loader._resume or loader._state
    total = epoch_samples(loader)
    return {"format": "dataprep.Loader", "version": STATE_VERSION, "seed": loader.seed, "epoch": int(epoch),
            "samples_consumed": int(consumed), "world_size": loader.world_size, "batch_size": loader.batch_size,
            "length": int(total), "shuffle": loader.shuffle, "sampler": loader.sampler is not None,
            "crop": repr(loader.crop), "flip": loader.flip, "partition": partition_state(loader.dataset),
            "resolution": loader.schedule(epoch) if loader.schedule is not None else getattr(loader.dataset, "resolution", None)}


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
    if int(state.get("version", 0)) > STATE_VERSION:
        raise DataprepError(f"a Loader state of version {state['version']}; this dataprep reads up to {STATE_VERSION}")
    total = epoch_samples(loader)
    if int(state["length"]) != total:
        raise DataprepError(f"the saved run served {state['length']} samples an epoch, this Loader {total}: "
                            "not the same dataset (or sampler), so its position means nothing here")
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
    return any((getattr(dataset, "shuffle", False) and getattr(d, "independent_samples", False))
               or _shuffles_random_windows(d) for d in members)
