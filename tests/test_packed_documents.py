"""PackedDocuments served by the Loader: every within-document target exactly once an epoch (0 workers,
processes, threads; 2 ranks together; a state taken on 2 ranks restored on 1 and on 3), segments whole and
contiguous, labels and positions as docs/training.md says; and the batch a transformer needs.

The documents are made of unique words, one id each, counted up through the corpus: token t of the corpus
has id t + 2, so a target (id -> next id) names its document and place, and a pair across two documents,
or one served twice, is seen at once. Real text (a slice of the corpus, WordPiece) repeats ids, so there a
target is counted with its document id."""
from __future__ import annotations

import collections

import numpy as np
import pytest
import torch

import dataprep
from dataprep.errors import DataprepError, UsageError
from dataprep.tokens.dataset import DocumentDataset
from dataprep.tokens.packed import IGNORE, PackedDocuments, pad_cu_seqlens

from .conftest import corpus_dir

CONTEXT = 32
EOT = 1


@pytest.fixture(scope="module")
def coded(tmp_path_factory):
    """A token pack of 150 documents, 1 to 80 words (some longer than CONTEXT), and each document's ids."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    base = tmp_path_factory.mktemp("packed")
    rng = np.random.default_rng(5)
    lengths = np.concatenate([rng.integers(1, 12, 100), rng.integers(12, 80, 50)])
    rng.shuffle(lengths)
    docs, k = [], 0
    for n in lengths.tolist():
        docs.append(list(range(k, k + n)))
        k += n
    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(["[UNK]", "<|endoftext|>", *(f"w{j}" for j in range(k))])},
                              unk_token="[UNK]"))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.save(str(base / "tok.json"))
    (base / "docs.txt").write_text("".join(" ".join(f"w{j}" for j in d) + "\n" for d in docs))
    dataprep.build.tokenize([str(base / "docs.txt")], base / "p", tokenizer=str(base / "tok.json"), split_docs="line",
                            val_fraction=0.0)
    ids = [tuple(j + 2 for j in d) for d in docs]
    return base / "p", ids


def targets(docs, eot: int = EOT, by_document: bool = False) -> collections.Counter:
    """Every within-document target (token -> next token of the same document, its end-of-text included),
    with its document's index where `by_document`."""
    return collections.Counter((d[i], (d + (eot,))[i + 1], *((k,) if by_document else ()))
                               for k, d in enumerate(docs) for i in range(len(d)))


def served_targets(batches, by_document: bool = False) -> collections.Counter:
    got: collections.Counter = collections.Counter()
    for b in batches:
        keys = ("input_ids", "labels", "document_ids") if by_document else ("input_ids", "labels")
        cols = [b[k].reshape(-1) for k in keys]
        keep = cols[1] != IGNORE
        got.update(zip(*(c[keep].tolist() for c in cols)))
    return got


def check_rows(batch, docs_by_first: dict) -> None:
    """Each row: segments of consecutive ids of one document, positions 0.. within each, labels the next
    id of the segment (-100 on its last token), padding (document -1) labelled -100."""
    for x, y, pos, doc in zip(*(batch[k].tolist() for k in ("input_ids", "labels", "position_ids", "document_ids"))):
        for i in range(CONTEXT):
            if doc[i] < 0:
                assert y[i] == IGNORE and x[i] == EOT
                assert pos[i] == (0 if i == 0 or doc[i - 1] >= 0 else pos[i - 1] + 1)
                continue
            first = pos[i] == 0
            if not first:
                assert doc[i - 1] == doc[i] and pos[i - 1] == pos[i] - 1 and y[i - 1] == x[i]
            last = i == CONTEXT - 1 or pos[i + 1] == 0 or doc[i + 1] != doc[i]
            if last:
                assert y[i] == IGNORE
            d = docs_by_first[doc[i]] + (EOT,)
            assert x[i] in d and (last or y[i] == d[d.index(x[i]) + 1])


def loader(ds, **kw):
    return dataprep.Loader(ds, kw.pop("batch_size", 4), **kw)


@pytest.mark.parametrize("packing", ["best_fit", "first_fit", "concat"])
@pytest.mark.parametrize("workers,threads", [(0, None), (2, False), (2, True)])
def test_every_target_is_served_exactly_once_an_epoch(coded, packing, workers, threads):
    pack, docs = coded
    ds = PackedDocuments(pack, CONTEXT, packing=packing, seed=1)
    want = targets(docs)
    by_doc = dict(enumerate(docs))
    with loader(ds, num_workers=workers, threads=threads) as ld:
        epochs = []
        for _ in range(2):
            batches = list(ld)
            assert served_targets(batches) == want
            for b in batches:
                check_rows(b, by_doc)
            epochs.append(torch.cat([b["document_ids"] for b in batches]))
    assert not torch.equal(epochs[0], epochs[1])  # documents share other rows, and rows come in another order


@pytest.fixture(scope="module")
def real_text(tmp_path_factory):
    """A token pack of two of the corpus's plays (about 285 KB), a document a paragraph, encoded with the
    corpus's WordPiece tokenizer; each document's ids (DocumentDataset: without its end-of-text id), and
    that id."""
    base = tmp_path_factory.mktemp("real")
    plays = [corpus_dir("text", name) for name in ("comedy_of_errors_gut.txt", "macbeth_gut.txt")]
    dataprep.build.tokenize([str(p) for p in plays], base / "p", tokenizer=str(corpus_dir("tokenizer", "tokenizer.json")),
                            split_docs="paragraph")
    docs = DocumentDataset(base / "p")
    return base / "p", [tuple(docs[i].tolist()) for i in range(len(docs))], docs.data.eot_id


@pytest.mark.corpus
@pytest.mark.parametrize("packing", ["best_fit", "first_fit", "concat"])
def test_real_text_every_target_is_served_exactly_once_with_two_workers(real_text, packing):
    pack, docs, eot = real_text
    context = 128
    want = targets(docs, eot, by_document=True)
    assert sum(len(d) + 1 > context for d in docs) >= 10  # long paragraphs are cut
    assert max(targets(docs, eot).values()) > 1  # ids repeat: only the document id tells two targets apart
    with loader(PackedDocuments(pack, context, packing=packing, seed=1), batch_size=8, num_workers=2) as ld:
        assert served_targets(ld, by_document=True) == want
    if packing == "best_fit":
        first_fit = PackedDocuments(pack, context, packing="first_fit").info()["padding_share"]
        assert PackedDocuments(pack, context).info()["padding_share"] <= first_fit


def test_two_ranks_together_serve_every_target_once_and_pad_with_empty_rows(coded):
    pack, docs = coded
    ds = PackedDocuments(pack, CONTEXT, seed=2)
    assert len(ds) % 2 == 1 or len(ds) % 8  # the ranks' last batch is evened out
    got: collections.Counter = collections.Counter()
    rows = 0
    for rank in range(2):
        with loader(ds, num_workers=2, rank=rank, world_size=2) as ld:
            batches = list(ld)
            got += served_targets(batches)
            rows += sum(len(b["input_ids"]) for b in batches)
    assert got == targets(docs)
    with loader(ds, rank=0, world_size=2) as ld:
        assert rows == len(ds) + ld.padding()


@pytest.mark.parametrize("world", [1, 3])
def test_a_state_taken_on_two_ranks_resumes_on_another_world_size_exactly(coded, world):
    pack, docs = coded
    ds = PackedDocuments(pack, CONTEXT, seed=3)
    seen: collections.Counter = collections.Counter()
    states = []
    for rank in range(2):
        with loader(ds, num_workers=2, rank=rank, world_size=2, shuffle=True, seed=4) as ld:
            it = iter(ld)
            for _ in range(3):
                seen += served_targets([next(it)])
            states.append(ld.state_dict())
    assert states[0]["samples_consumed"] == states[1]["samples_consumed"] == 24
    for rank in range(world):
        with loader(ds, num_workers=2 if rank == 0 else 0, rank=rank, world_size=world, shuffle=True, seed=4) as ld:
            ld.load_state_dict(states[0])
            seen += served_targets(list(ld))
    assert seen == targets(docs)


def test_a_state_from_another_plan_is_refused(coded):
    pack, _ = coded
    with loader(PackedDocuments(pack, CONTEXT, seed=3)) as ld:
        next(iter(ld))
        state = ld.state_dict()
    for other in (PackedDocuments(pack, CONTEXT, seed=4), PackedDocuments(pack, CONTEXT, packing="first_fit", seed=3)):
        if len(other) != len(ld.dataset):
            continue  # refused by its length already
        with pytest.raises(DataprepError, match="another plan"):
            loader(other).load_state_dict(state)


def test_the_batch_carries_cu_seqlens_as_flash_attention_takes_them(coded):
    pack, _ = coded
    b = next(iter(loader(PackedDocuments(pack, CONTEXT), batch_size=3)))
    assert list(b) == ["input_ids", "labels", "position_ids", "document_ids", "cu_seqlens", "max_seqlen"]
    assert all(b[k].dtype == torch.int64 and b[k].shape == (3, CONTEXT) for k in list(b)[:4])
    cu = b["cu_seqlens"]
    assert cu.dtype == torch.int32 and cu[0] == 0 and cu[-1] == 3 * CONTEXT and bool((cu[1:] > cu[:-1]).all())
    flat = b["position_ids"].reshape(-1)
    assert cu[:-1].tolist() == torch.nonzero(flat == 0).reshape(-1).tolist()  # every segment and padding run starts at 0
    assert b["max_seqlen"] == int((cu[1:] - cu[:-1]).max())
    padded = pad_cu_seqlens(cu, 3 * CONTEXT + 1)
    assert len(padded) == 3 * CONTEXT + 1 and torch.equal(padded[:len(cu)], cu) and bool((padded[len(cu):] == cu[-1]).all())


def test_indexing_and_info(coded):
    pack, docs = coded
    ds = PackedDocuments(pack, CONTEXT)
    info = ds.info()
    assert info["rows"] == len(ds) and info["documents"] == len(docs) and 0 <= info["padding_share"] < 0.2
    assert info["documents_cut"] == sum(len(d) + 1 > CONTEXT for d in docs)
    row = ds[0]
    batch = next(iter(loader(ds, batch_size=1)))
    assert all(torch.equal(row[k], batch[k][0]) for k in row)


def test_bad_arguments_are_clear_errors(coded, tmp_path):
    pack, _ = coded
    with pytest.raises(UsageError, match="context"):
        PackedDocuments(pack, 1)
    with pytest.raises(UsageError, match="strategy"):
        PackedDocuments(pack, CONTEXT, packing="tightest")
    tree = dataprep.synthetic.write_tree(tmp_path / "src", classes=2, per_class=2, sizes=((32, 32),))
    dataprep.build.imagenet(tree, tmp_path / "images", size=32)
    with pytest.raises(DataprepError, match="tokens"):
        PackedDocuments(tmp_path / "images", CONTEXT)
    with pytest.raises(DataprepError, match="crop and flip"):
        loader(PackedDocuments(pack, CONTEXT), flip=True)


def test_a_mapped_shard_cut_short_under_the_loader_is_a_pack_error_not_a_crash(coded, tmp_path):
    """cache="mmap": a shard truncated while mapped is refused as the token windows refuse it (reading it
    would be SIGBUS); run in a child, which a crash would kill."""
    import shutil
    import subprocess
    import sys

    pack = tmp_path / "p"
    shutil.copytree(coded[0], pack)
    code = (f"import os, dataprep\nfrom dataprep.tokens.packed import PackedDocuments\n"
            f"ds = PackedDocuments({str(pack)!r}, {CONTEXT}, cache='mmap')\n"
            "os.truncate(ds.data.tokens.filename, 64)\n"
            "try:\n    next(iter(dataprep.Loader(ds, 4)))\nexcept Exception as e:\n    print(type(e).__name__, e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("PackError") and "while mapped" in r.stdout, (r.returncode, r.stdout, r.stderr[-300:])


def test_pack_data_module_refuses_packed_arguments_it_does_not_take(coded):
    pytest.importorskip("lightning")
    from dataprep.lightning import PackDataModule

    for bad in (dict(context=16, cache="mmap"), dict(context=16, split="val"), dict(packing="concat"), [16]):
        with pytest.raises(UsageError, match="packed="):
            PackDataModule(coded[0], batch_size=2, packed=bad)
