"""The epoch rule a training loop relies on: iter() serves `loader.epoch`; the epoch advances once a pass
has served its last batch; a pass left early (a peek, a break) is served again; a state saved after an
epoch's last batch resumes into the (empty) rest of that epoch, so a loop that saves its own epoch number
beside the state trains every epoch exactly once; set_epoch after a restore keeps the restored position;
a changed seed or batch size says what the resumed run does."""
from __future__ import annotations

import json
import warnings
from collections import Counter

import pytest

from .resume_check import digests, make
from .test_resume import packs  # noqa: F401  (the module's packs fixture)


def test_a_peek_uses_up_nothing(packs):  # noqa: F811
    whole = make("tokens", str(packs["tokens"]), 0)
    e0, e1 = digests(whole), digests(whole)
    loader = make("tokens", str(packs["tokens"]), 0)
    peek = next(iter(loader))
    assert digests([peek]) == e0[:1] and loader.epoch == 0
    assert digests(loader) == e0  # the whole of epoch 0, not epoch 1
    assert digests(loader) == e1


def test_a_pass_left_early_is_served_again_and_its_state_says_where_it_stopped(packs):  # noqa: F811
    whole = make("images", str(packs["images"]), 0)
    e0 = digests(whole)
    loader = make("images", str(packs["images"]), 2)
    it = iter(loader)
    for _ in range(2):
        next(it)
    del it
    state = loader.state_dict()
    assert (state["epoch"], state["samples_consumed"]) == (0, 2 * loader.batch_size)  # break, save: resumes there
    assert digests(loader) == e0
    loader.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_saved_after_the_last_batch_resumes_into_nothing_then_the_next_epoch(packs, workers):  # noqa: F811
    whole = make("tokens", str(packs["tokens"]), 0)
    e0, e1 = digests(whole), digests(whole)
    loader = make("tokens", str(packs["tokens"]), workers)
    it = iter(loader)
    assert digests(next(it) for _ in range(len(loader))) == e0
    at_last = loader.state_dict()  # inside the last step of epoch 0, as a loop that saves every step does
    assert (at_last["epoch"], at_last["samples_consumed"]) == (0, at_last["length"])
    assert list(it) == []
    after = loader.state_dict()  # after the pass ended, as a loop that saves after each epoch does
    assert (after["epoch"], after["samples_consumed"]) == (1, 0)
    loader.close()
    for state, want in ((at_last, [[], e1]), (after, [e1])):
        fresh = make("tokens", str(packs["tokens"]), workers)
        fresh.load_state_dict(json.loads(json.dumps(state)))
        assert [digests(fresh) for _ in want] == want
        fresh.close()


@pytest.mark.parametrize("set_epoch", [True, False])
@pytest.mark.parametrize("stop", [3, 8, 9, 17])
def test_the_readme_loop_killed_at_any_step_trains_each_epoch_exactly_once(packs, stop, set_epoch):  # noqa: F811
    """The plain-PyTorch loop of docs/training.md: save {epoch, loader state} every step; restart from the last
    save; with or without set_epoch each epoch. 9 is the last step of epoch 0 (batches of 7 over 60
    windows), 17 the last but one of epoch 1."""
    epochs = 3

    def run(ckpt, stop_at=None):
        loader = make("tokens", str(packs["tokens"]), 0)
        start = 0
        if ckpt is not None:
            loader.load_state_dict(ckpt["loader"])
            start = ckpt["epoch"]
        seen, step = Counter(), 0
        for epoch in range(start, epochs):
            if set_epoch:
                loader.set_epoch(epoch)
            for batch in loader:
                seen[(epoch, digests([batch])[0])] += 1
                step += 1
                ckpt = {"epoch": epoch, "loader": json.loads(json.dumps(loader.state_dict()))}
                if step == stop_at:
                    return seen, ckpt
        return seen, ckpt

    whole, _ = run(None)
    head, ckpt = run(None, stop)
    tail, _ = run(ckpt)
    assert head + tail == whole and sum(whole.values()) == epochs * 9


def test_without_the_rule_a_last_batch_save_trains_an_epoch_too_many(packs):  # noqa: F811
    """Negative control for the loop above: a state that says `next epoch, 0 consumed` after the last
    batch (the old rule) makes the resumed loop serve one epoch more than it should."""
    loader = make("tokens", str(packs["tokens"]), 0)
    it = iter(loader)
    for _ in range(len(loader)):
        next(it)
    old_rule = {**loader.state_dict(), "epoch": 1, "samples_consumed": 0}
    fresh = make("tokens", str(packs["tokens"]), 0)
    fresh.load_state_dict(old_rule)
    served = sum(len(digests(fresh)) for _epoch in range(0, 3))  # the loop resumes at its own epoch 0
    assert served == 3 * len(loader)  # epochs 1, 2 and 3: one more than the 2 left


def test_set_epoch_after_a_restore_keeps_the_position_and_another_epoch_warns(packs):  # noqa: F811
    whole = make("images", str(packs["images"]), 0)
    e0, e1 = digests(whole), digests(whole)
    stopped = make("images", str(packs["images"]), 0)
    it = iter(stopped)
    next(it), next(it)
    state = stopped.state_dict()
    same = make("images", str(packs["images"]), 0)
    same.load_state_dict(state)
    same.set_epoch(0)
    assert digests(same) == e0[2:]
    other = make("images", str(packs["images"]), 0)
    other.load_state_dict(state)
    with pytest.warns(UserWarning, match="drops the restored position"):
        other.set_epoch(1)
    assert digests(other) == e1


def test_a_changed_seed_warns_and_the_saved_order_goes_on(packs):  # noqa: F811
    whole = make("tokens", str(packs["tokens"]), 0)
    e0 = digests(whole)
    stopped = make("tokens", str(packs["tokens"]), 0)
    it = iter(stopped)
    next(it)
    state = stopped.state_dict()
    other = make("tokens", str(packs["tokens"]), 0)
    other.seed = 99
    with pytest.warns(UserWarning, match="seed=11 into a Loader made with seed=99"):
        other.load_state_dict(state)
    assert other.seed == 11 and digests(other) == e0[1:]
    quiet = make("tokens", str(packs["tokens"]), 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quiet.load_state_dict(state)


def test_a_changed_batch_size_warns_and_serves_every_remaining_sample_once(packs):  # noqa: F811
    def samples(loader):
        return [tuple(row.tolist()) for x, y in loader for row in x]

    whole = make("tokens", str(packs["tokens"]), 0)
    e0 = samples(whole)
    stopped = make("tokens", str(packs["tokens"]), 0)
    it = iter(stopped)
    head = [tuple(row.tolist()) for _ in range(2) for row in next(it)[0]]
    state = stopped.state_dict()
    bigger = make("tokens", str(packs["tokens"]), 0)
    bigger.batch_size = 10
    with pytest.warns(UserWarning, match="served from sample 14 of its order in batches of 10"):
        bigger.load_state_dict(state)
    rest = samples(bigger)
    assert head + rest == e0


@pytest.mark.parametrize("workers", [0, 2])
def test_epoch_reads_what_the_next_pass_serves_after_a_loop_of_exactly_len_batches(packs, workers):  # noqa: F811
    """islice, zip and Lightning take len(loader) batches and never ask for the end: `epoch` must read the
    epoch the next iter() serves, not the finished one."""
    import itertools

    whole = make("tokens", str(packs["tokens"]), 0)
    e0, e1 = digests(whole), digests(whole)
    loader = make("tokens", str(packs["tokens"]), workers)
    it = iter(loader)
    assert digests(itertools.islice(it, len(loader) - 1)) == e0[:-1] and loader.epoch == 0  # a batch left
    assert digests(itertools.islice(it, 1)) == e0[-1:]
    assert loader.epoch == 1  # the last batch is out: the next iter() serves epoch 1 ...
    assert digests(loader) == e1 and loader.epoch == 2  # ... and it does
    for _ in zip(range(len(loader)), loader):
        pass
    assert loader.epoch == 3
    loader.close()
