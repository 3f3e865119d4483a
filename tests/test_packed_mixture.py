"""A Mixture of PackedDocuments served by the Loader: every within-document target of every member once a
member epoch (0 and 2 workers giving the same batches), each member epoch its own plan, document ids that
name one document of one member, rows of padding evening out 2 ranks, exact resume mid-epoch, a state of
another mixture plan refused, members of another context or kind refused by name.

Two packs of documents made of unique words, as tests/test_packed_documents.py makes one: token t of the
corpus has id t + 2, pack b's words counted on after pack a's, so a target (id -> next id) names its pack,
document and place."""
from __future__ import annotations

import collections

import numpy as np
import pytest
import torch

import dataprep
from dataprep.errors import DataprepError, UsageError
from dataprep.serve.mixture import Mixture
from dataprep.tokens.packed import PackedDocuments
from tests.test_packed_documents import CONTEXT, check_rows, served_targets, targets


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """Token packs a (90 documents, 61 rows) and b (60, 39 rows), 1 to 80 words each (some longer than
    CONTEXT), disjoint ids, and each pack's documents' ids."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    base = tmp_path_factory.mktemp("packed-mix")
    rng = np.random.default_rng(7)
    words: dict[str, list[list[int]]] = {}
    k = 0
    for name, n in (("a", 90), ("b", 60)):
        lengths = np.concatenate([rng.integers(1, 12, n * 2 // 3), rng.integers(12, 80, n - n * 2 // 3)])
        rng.shuffle(lengths)
        words[name] = []
        for m in lengths.tolist():
            words[name].append(list(range(k, k + m)))
            k += m
    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(["[UNK]", "<|endoftext|>", *(f"w{j}" for j in range(k))])},
                              unk_token="[UNK]"))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.save(str(base / "tok.json"))
    ids = {}
    for name, docs in words.items():
        (base / f"{name}.txt").write_text("".join(" ".join(f"w{j}" for j in d) + "\n" for d in docs))
        dataprep.build.tokenize([str(base / f"{name}.txt")], base / name, tokenizer=str(base / "tok.json"),
                                split_docs="line", val_fraction=0.0)
        ids[name] = [tuple(j + 2 for j in d) for d in docs]
    return base, ids


def members(two, **kw):
    base, _ = two
    return PackedDocuments(base / "a", CONTEXT, seed=1, **kw), PackedDocuments(base / "b", CONTEXT, seed=2, **kw)


def a_twice(two, seed: int) -> Mixture:
    """a twice and b once a mixture epoch (161 rows): two of a's member epochs, each its own plan."""
    a, b = members(two)
    return Mixture([a, b], [2 * len(a), len(b)], seed=seed, samples=2 * len(a) + len(b))


def by_mixture_id(two) -> dict:
    """The mixture's document id -> the document's ids: b's numbered on past a's."""
    _, ids = two
    return dict(enumerate(ids["a"] + ids["b"]))


def test_every_target_of_every_member_is_served_once_a_member_epoch(two):
    mix = a_twice(two, seed=3)
    assert mix.passes == [2.0, 1.0] and mix.serves_dicts and mix.pads_empty and mix.documents == 150
    _, ids = two
    want = targets(ids["a"]) + targets(ids["a"]) + targets(ids["b"])
    docs = by_mixture_id(two)
    served = {}
    for workers, threads in ((0, False), (2, False), (3, True)):
        with dataprep.Loader(mix, 4, num_workers=workers, threads=threads) as ld:
            served[workers] = [{k: v.clone() if torch.is_tensor(v) else v for k, v in b.items()} for b in ld]
    got = served[0]
    assert len(served[3]) == len(got) and all(torch.equal(x[k], y[k]) for x, y in zip(got, served[3]) for k in list(x)[:5])
    assert all(list(b) == ["input_ids", "labels", "position_ids", "document_ids", "cu_seqlens", "max_seqlen"] for b in got)
    assert served_targets(got) == want
    for batch in got:
        check_rows(batch, docs)  # document ids of b past a's: an id names the document its tokens are from
        flat = batch["position_ids"].reshape(-1)
        assert batch["cu_seqlens"][:-1].tolist() == torch.nonzero(flat == 0).reshape(-1).tolist()
    assert len(served[2]) == len(got) and all(torch.equal(x[k], y[k]) for x, y in zip(got, served[2]) for k in list(x)[:5])
    of_a = collections.Counter(tuple(x) for b in got for x, d in zip(b["input_ids"].tolist(), b["document_ids"].tolist())
                               if max(d) < 90)  # a's rows (ids unique through the corpus)
    assert set(of_a.values()) != {2}  # a's second member epoch packs other rows: not each of its first rows again
    mix.set_epoch(0)
    assert all(torch.equal(mix[5][k], got[1][k][1]) for k in ("input_ids", "document_ids"))  # indexing: what is served


def test_two_ranks_together_serve_every_target_once_padding_with_empty_rows(two):
    mix = a_twice(two, seed=5)
    _, ids = two
    got: collections.Counter = collections.Counter()
    rows, padding = 0, 0
    for rank in range(2):
        with dataprep.Loader(mix, 8, num_workers=2, rank=rank, world_size=2) as ld:
            assert ld.padding() == 1  # 161 rows: the last global batch is evened out with a row of padding
            batches = list(ld)
            got += served_targets(batches)
            rows += sum(len(b["input_ids"]) for b in batches)
            padding += sum(int((b["document_ids"].max(1).values < 0).sum()) for b in batches)
            assert all(bool((b["labels"][b["document_ids"] < 0] == -100).all()) for b in batches)
    assert rows == len(mix) + 1 and padding == 1
    assert got == targets(ids["a"]) + targets(ids["a"]) + targets(ids["b"])


def test_a_state_taken_mid_epoch_resumes_exactly_and_on_another_world_size(two):
    a, b = members(two)
    mix = Mixture([a, b], [len(a), len(b)], seed=4)  # each member once a mixture epoch
    _, ids = two

    def loader(**kw):
        return dataprep.Loader(mix, 4, **kw)

    with loader(num_workers=2) as ld:
        ld.set_epoch(1)
        whole = [b["input_ids"].clone() for b in ld]
    with loader(num_workers=2) as ld:
        ld.set_epoch(1)
        it = iter(ld)
        head = [next(it)["input_ids"].clone() for _ in range(5)]
        state = ld.state_dict()
    for kw in ({}, {"num_workers": 2, "threads": True}):
        with loader(**kw) as ld:
            ld.load_state_dict(state)
            rest = [b["input_ids"].clone() for b in ld]
        assert len(head + rest) == len(whole) and all(torch.equal(x, y) for x, y in zip(head + rest, whole)), kw
    seen: collections.Counter = collections.Counter()  # 2 ranks stopped after 3 steps, resumed on 1
    states = []
    for rank in range(2):
        with loader(num_workers=2, rank=rank, world_size=2) as ld:
            it = iter(ld)
            seen += served_targets([next(it) for _ in range(3)])
            states.append(ld.state_dict())
    with loader(num_workers=2) as ld:
        ld.load_state_dict(states[0])
        seen += served_targets(list(ld))
    assert mix.passes == [1.0, 1.0] and seen == targets(ids["a"]) + targets(ids["b"])


def test_a_state_from_another_mixture_plan_is_refused(two):
    a, b = members(two)
    with dataprep.Loader(Mixture([a, b], [0.5, 0.5], seed=4), 4) as ld:
        next(iter(ld))
        state = ld.state_dict()
    base, _ = two
    others = {"weights": Mixture([a, b], [0.4, 0.6], seed=4), "seed": Mixture([a, b], [0.5, 0.5], seed=5),
              "a member's plan": Mixture([a, PackedDocuments(base / "b", CONTEXT, seed=3)], [0.5, 0.5], seed=4)}
    for what, other in others.items():
        assert len(other) == len(ld.dataset), what  # not refused by its length
        with pytest.raises(DataprepError, match="another plan"):
            dataprep.Loader(other, 4).load_state_dict(state)
    dataprep.Loader(Mixture([a, b], [0.5, 0.5], seed=4), 4).load_state_dict(state)  # the same plan resumes


def test_members_of_another_context_or_kind_are_refused_by_name(two):
    base, _ = two
    a = PackedDocuments(base / "a", CONTEXT)
    with pytest.raises(DataprepError, match=rf"member 1, {base / 'b'}, train: input_ids \(64,\) int64 vs member 0.*\(32,\)"):
        Mixture([a, PackedDocuments(base / "b", 2 * CONTEXT)], [0.5, 0.5])
    with pytest.raises(UsageError, match=rf"member 1 \({base / 'b'}, train\) is a TokenDataset, member 0 .* a PackedDocuments"):
        Mixture([a, dataprep.TokenDataset(base / "b", context=CONTEXT)], [0.5, 0.5])
