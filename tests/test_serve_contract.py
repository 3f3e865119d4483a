"""The serving contract (dataprep/serve/contract.py): a dataset written against it alone is served by the
Loader (in process and by workers) and mixed by a Mixture, exactly and resumably; one lacking a required
method is refused when the Loader or Mixture is made, by name; docs/datasets.md runs as printed; and the
packs' own datasets keep the contract."""
from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import dataprep
from dataprep.serve import contract

DOC = Path(__file__).resolve().parents[1] / "docs" / "datasets.md"


def draw(seed: int, epoch: int, i: int) -> int:
    """A sample's own random number, keyed by (seed, epoch, index) alone."""
    return int(np.random.default_rng([seed, epoch, i]).integers(1 << 30))


class Counted:
    """Written against the public contract only. Sample i of epoch e under Loader seed s: x = (i, e, a draw
    from (s, e, i), whether worker_init ran in the filling process, the dataset's tag), y = 10 i."""

    fills_rows = True  # fill_batch takes rows= (a Mixture writes a member's scattered rows in place)

    def __init__(self, n: int, tag: int = 0):
        self.n, self.tag = n, tag
        self.in_worker = 0
        self.epochs_set: list[int] = []

    def __len__(self):
        return self.n

    def batch_layout(self, request: contract.Request):
        return {"x": ((5,), np.dtype(np.int64)), "y": ((), np.dtype(np.int64))}

    def fill_batch(self, idx, out, request: contract.Request, rows=None):
        idx = np.asarray(idx, np.int64)
        at = slice(0, len(idx)) if rows is None else rows
        x = np.stack([idx, np.full(len(idx), request.epoch), [draw(request.seed, request.epoch, int(i)) for i in idx],
                      np.full(len(idx), self.in_worker), np.full(len(idx), self.tag)], 1)
        out["x"][at] = x
        out["y"][at] = 10 * idx

    def worker_init(self):
        self.in_worker = 1

    def set_epoch(self, epoch: int):
        self.epochs_set.append(epoch)


def expected(idx, epoch: int, seed: int, in_worker: int, tag: int = 0) -> np.ndarray:
    return np.array([[i, epoch, draw(seed, epoch, i), in_worker, tag] for i in idx], np.int64).reshape(-1, 5)


def served(loader) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(x.numpy().copy(), y.numpy().copy()) for x, y in loader]


# -- (a) a dataset of one's own, served ------------------------------------------------------------------
@pytest.mark.parametrize("workers", [0, 2])
def test_a_dataset_of_ones_own_is_served_exactly(workers):
    ds = Counted(23)
    assert isinstance(ds, contract.Servable) and contract.missing(ds) == []
    loader = dataprep.Loader(ds, 5, seed=3, num_workers=workers)
    for epoch in range(2):  # the identity order: batches 0-4, 5-9, ..., 20-22, each epoch's own draws
        got = served(loader)
        assert [len(y) for _, y in got] == [5, 5, 5, 5, 3]
        for b, (x, y) in enumerate(got):
            idx = list(range(5 * b, min(23, 5 * b + 5)))
            assert np.array_equal(x, expected(idx, epoch, 3, in_worker=int(workers > 0)))
            assert x.dtype == np.int64 and np.array_equal(y, 10 * np.array(idx))
    assert ds.epochs_set == [0, 1]  # set_epoch in the Loader's process, once a pass
    loader.close()

    shuffled = dataprep.Loader(ds, 4, shuffle=True, seed=7, num_workers=workers, drop_last=True)
    firsts = []
    for epoch in range(2):
        x = np.concatenate([x for x, _ in served(shuffled)])
        assert len(x) == 20 and len(set(x[:, 0].tolist())) == 20  # 5 whole batches, no sample twice
        assert np.array_equal(x, expected(x[:, 0].tolist(), epoch, 7, in_worker=int(workers > 0)))
        firsts.append(x[:, 0].tolist())
    assert firsts[0] != firsts[1] != sorted(firsts[1])  # shuffled, anew each epoch
    shuffled.close()


def test_workers_serve_what_the_loaders_process_serves():
    ds = Counted(37)
    alone, forked = (served(dataprep.Loader(ds, 6, shuffle=True, seed=2, num_workers=w)) for w in (0, 3))
    assert len(alone) == len(forked) == 7
    for (xa, ya), (xf, yf) in zip(alone, forked):
        assert np.array_equal(xa[:, :3], xf[:, :3]) and np.array_equal(ya, yf)
        assert (xa[:, 3] == 0).all() and (xf[:, 3] == 1).all()  # worker_init ran in every worker, never here


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dataset_of_ones_own_resumes_mid_epoch_exactly(workers):
    ds = Counted(29)

    def make(w):
        return dataprep.Loader(ds, 4, shuffle=True, seed=5, num_workers=w)

    loader = make(workers)
    loader.set_epoch(1)
    whole, after = served(loader), served(loader)  # epoch 1, then epoch 2, uninterrupted
    loader.set_epoch(1)
    for step, _ in enumerate(loader):
        if step == 2:
            state = json.loads(json.dumps(loader.state_dict()))  # as a checkpoint stores it
            break
    loader.close()
    assert state["epoch"] == 1 and state["samples_consumed"] == 12
    restored = make(2 - workers)  # the other worker count: the position is in samples, not in workers
    restored.load_state_dict(state)
    rest = served(restored)
    assert len(rest) == len(whole) - 3
    for (xa, ya), (xb, yb) in zip(whole[3:], rest):
        assert np.array_equal(xa[:, :3], xb[:, :3]) and np.array_equal(ya, yb)
    nxt = served(restored)  # and the epoch after it
    assert all(np.array_equal(xa[:, :3], xb[:, :3]) for (xa, _), (xb, _) in zip(after, nxt)) and len(nxt) == len(after)
    restored.close()


def test_a_mixture_of_ones_own_datasets_serves_what_locate_names():
    """Members written against the contract, mixed: every served row is the sample `locate` names, filled
    through the member's rows= (its share of a batch is scattered), with the member's own epoch."""
    mix = dataprep.Mixture([Counted(30, tag=1), Counted(12, tag=2)], [0.6, 0.4], seed=4, samples=60)
    x = np.concatenate([x for x, _ in served(dataprep.Loader(mix, 8, num_workers=0))])
    member, index, m_epoch = mix.locate(np.arange(60), 0)
    assert len(set(member[:8].tolist())) == 2  # members interleaved within a batch
    assert np.array_equal(x[:, 0], index) and np.array_equal(x[:, 1], m_epoch) and np.array_equal(x[:, 4], member + 1)
    assert m_epoch.max() >= 1  # the small member restarted, newly shuffled


# -- (b) a required method missing -------------------------------------------------------------------
def without(*names: str) -> type:
    """Counted with `names` taken out (a class that never had them)."""
    body = {k: v for k, v in vars(Counted).items() if k not in names and k not in ("__dict__", "__weakref__")}
    return type("Unfinished", (), body)


@pytest.mark.parametrize("name", contract.REQUIRED)
def test_a_dataset_missing_a_required_method_is_refused_when_the_loader_is_made(name):
    broken = without(name)(10)
    assert contract.missing(broken) == [name] and not isinstance(broken, contract.Servable)
    with pytest.raises(dataprep.DataprepError, match=re.escape(name)) as got:
        dataprep.Loader(broken, 4)
    message = str(got.value)
    assert isinstance(got.value, TypeError) and isinstance(got.value, contract.NotServable)
    assert "Unfinished" in message and "docs/datasets.md" in message
    assert [n for n in contract.REQUIRED if n in message.split("it has no ")[1].split(" (")[0]] == [name]  # that one only
    with pytest.raises(dataprep.DataprepError, match=r"member 1, a Unfinished, cannot fill batches: it has no " + re.escape(name)):
        dataprep.Mixture([Counted(10), broken], [0.5, 0.5])


def test_every_missing_name_is_named_and_a_method_set_to_none_is_missing():
    with pytest.raises(dataprep.DataprepError, match="it has no batch_layout, fill_batch"):
        dataprep.Loader(without("batch_layout", "fill_batch")(10), 4)
    unset = Counted(10)
    unset.fill_batch = None
    with pytest.raises(dataprep.DataprepError, match="it has no fill_batch"):
        dataprep.Loader(unset, 4)


def test_the_check_runs_once_per_loader_not_per_batch(monkeypatch):
    calls = []
    check = contract.check_servable
    monkeypatch.setattr(contract, "check_servable", lambda *a, **k: (calls.append(a), check(*a, **k))[1])
    loader = dataprep.Loader(Counted(20), 4)
    assert len(calls) == 1
    assert sum(len(y) for _ in range(2) for _, y in loader) == 40 and len(calls) == 1


# -- (c) docs/datasets.md runs as printed ------------------------------------------------------------------
def blocks(kind: str) -> list[str]:
    return re.findall(rf"^```{kind}\n(.*?)^```", DOC.read_text(encoding="utf-8"), re.S | re.M)


def test_the_docs_example_runs_and_prints_the_error_it_shows():
    code, shown = blocks("python"), blocks("text")
    assert len(code) == 2 and len(shown) == 1
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile("\n".join(code), str(DOC), "exec"), {"__name__": "datasets_md"})
    assert out.getvalue().strip() == shown[0].strip()  # the page shows the message the Loader gives


def test_the_docs_name_every_part_of_the_contract():
    text = DOC.read_text(encoding="utf-8")
    names = [*contract.REQUIRED, *contract.HOOKS, *contract.FLAGS, *contract.ATTRIBUTES,
             *{p.__name__ for p in contract.HOOKS.values()}]
    assert [n for n in names if f"`{n}" not in text] == []


# -- (d) the packs' own datasets keep the contract ---------------------------------------------------
@pytest.fixture(scope="module")
def builtins(index_tree, tmp_path_factory):
    from dataprep.images.build import build_images
    from dataprep.images.settings import ImageSettings
    from dataprep.settings import BuildSettings
    from dataprep.sources import scan_imagenet
    from dataprep.tables.build import build_table
    from dataprep.tables.columns import TableSettings
    from dataprep.tokens.tokenize import TokenizeSettings, tokenize

    base = tmp_path_factory.mktemp("contract")
    build_images(scan_imagenet(index_tree), base / "images", BuildSettings(shard_size=5),
                 ImageSettings(size=32, resize="center-crop", mode="raw"), progress=False)
    docs = base / "docs.txt"
    docs.write_text("\n".join(f"line {i}: the quick brown fox {i * 7 % 13} jumps over {i % 5} lazy dogs" for i in range(200)))
    tokenize([str(docs)], base / "tokens", TokenizeSettings(), train_bpe_vocab=300)
    rng = np.random.default_rng(0)
    pd.DataFrame({"a": rng.normal(size=40), "b": rng.normal(size=40), "y": rng.normal(size=40)}).to_csv(base / "t.csv", index=False)
    build_table([str(base / "t.csv")], base / "tables", TableSettings(target="y"), {})
    images = dataprep.InMemoryImageDataset(base / "images")
    tokens = dataprep.TokenDataset(base / "tokens", context=8)
    return {"images": images, "tokens": tokens, "tables": dataprep.TabularDataset(base / "tables"),
            "image mixture": dataprep.Mixture([images, dataprep.InMemoryImageDataset(base / "images")], [0.5, 0.5]),
            "token mixture": dataprep.Mixture([tokens, dataprep.TokenDataset(base / "tokens", context=8)], [0.5, 0.5])}


# which hooks and flags each one gives: what the Loader and a Mixture find on it
HAS = {"images": ({"WorkerInit", "SetsEpoch", "Settles", "FillsParts"}, {"fills_rows", "fills_in_threads"}),
       "tokens": ({"SetsEpoch", "Addressed", "Windowed"}, {"fills_rows", "independent_samples"}),
       "tables": (set(), {"fills_rows"}),
       "image mixture": ({"WorkerInit", "SetsEpoch", "Settles"}, {"fills_rows", "fills_runs", "ordered", "fills_in_threads"}),
       "token mixture": ({"WorkerInit", "SetsEpoch", "Settles"}, {"fills_rows", "fills_runs", "ordered"})}


@pytest.mark.parametrize("kind", list(HAS))
def test_the_packs_datasets_pass_the_check_and_give_the_hooks_they_use(builtins, kind):
    ds = builtins[kind]
    contract.check_servable(ds)
    contract.check_servable(ds, member=0)
    assert contract.missing(ds) == [] and isinstance(ds, contract.Servable)
    hooks, flags = HAS[kind]
    protocols = {p.__name__: p for p in contract.HOOKS.values()}
    assert {n for n, p in protocols.items() if isinstance(ds, p)} == hooks
    for n, p in protocols.items():  # the named checks and the Protocols agree
        assert isinstance(ds, p) == all(contract.has_hook(ds, h) for h, q in contract.HOOKS.items() if q is p), n
    assert {f for f in contract.FLAGS if contract.flag(ds, f)} == flags
    layout = ds.batch_layout(contract.Request())
    assert layout and all(isinstance(s, tuple) and isinstance(np.dtype(d), np.dtype) for s, d in layout.values())
    batch = next(iter(dataprep.Loader(ds, 4)))
    assert len(batch) == len(layout) and all(isinstance(t, torch.Tensor) and len(t) == 4 for t in batch)


def test_a_hook_set_to_none_is_absent_and_unknown_names_are_refused():
    from dataprep.segmentation.dataset import SegmentationDataset

    assert contract.fill_parts_of(dataprep.InMemoryImageDataset.__new__(dataprep.InMemoryImageDataset)) is not None
    assert contract.fill_parts_of(SegmentationDataset.__new__(SegmentationDataset)) is None  # fill_parts = None: opted out
    assert not contract.flag(SegmentationDataset.__new__(SegmentationDataset), "fills_rows")
    for check in (contract.hook, contract.has_hook, contract.flag, contract.attribute):
        with pytest.raises(KeyError):
            check(Counted(3), "fill_rows")  # a misspelt name is an error, never silently absent


class CountedDicts(Counted):
    """Counted, served as dicts: finish_batch adds a key computed from the whole batch."""

    serves_dicts = True

    def finish_batch(self, batch):
        return {**batch, "total": batch["y"].sum()}


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dataset_that_serves_dicts_gets_dicts_with_what_finish_batch_adds(workers):
    ds = CountedDicts(23)
    loader = dataprep.Loader(ds, 5, seed=3, num_workers=workers, indices=True)
    got = list(loader)
    assert all(isinstance(b, dict) and list(b) == ["x", "y", "total", "indices"] for b in got)
    assert [b["indices"].tolist() for b in got] == [list(range(a, min(a + 5, 23))) for a in range(0, 23, 5)]
    assert all(torch.equal(b["y"], 10 * b["indices"]) and int(b["total"]) == int(b["y"].sum()) for b in got)
    assert np.array_equal(got[1]["x"].numpy(), expected(range(5, 10), 0, 3, workers > 0))
    plain = dataprep.Loader(Counted(23), 5, seed=3, num_workers=workers)
    assert all(isinstance(b, tuple) for b in plain)  # without the flag: tuples, as before
