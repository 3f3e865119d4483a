"""Packed rows served (issue 54): tokens/s served per worker by
`dataprep.Loader(PackedDocuments(pack, 4096), batch_size=8, num_workers=W)`, beside the same batches made
by transformers' `DataCollatorWithFlattening` in a torch `DataLoader` with the same workers, in one run.

The peer is the usual padding-free way: a dataset of documents (a piece of one, where dataprep cut it),
a batch sampler that groups them into about batch x context tokens, and the collator that flattens each
batch into one (1, tokens) row with `position_ids`, `seq_idx` and FlashAttention's `cu_seq_lens_q/k` (its
labels are the input ids, -100 at each document's first token: the model shifts them). To be fair it gets
the same batches: its sampler yields, for each batch of 8 of dataprep's rows, the (document, offset,
length) of their segments, from the same plan of (seed, epoch), so both serve the same documents, the
same tokens a batch, in the same order (checked on the first batches before timing). Its dataset gives a
piece as a numpy view of the same in-RAM token array; its workers persist across epochs, as dataprep's do.

Rounds alternate (dataprep, peer, dataprep, peer, ...); a round serves whole epochs until it has run
`--seconds`, after one warm-up epoch each (workers forked, first plans). Figures: the document tokens
served (padding not counted; the same for both) over the round's wall time, medians and ranges over the
rounds; the ratio is dataprep's median over the peer's, with the range of the rounds' own ratios.
Data sets: the corpus's text split into paragraphs (tokenized with the corpus tokenizer), and generated
documents of log-normal lengths (median 600 tokens, sigma 1; random ids, a word-level tokenizer).

transformers is not a dataprep requirement and never goes into .venv; install it apart, once:

    .venv/bin/python -m pip install --target /tmp/hf-pkgs transformers
    .venv/bin/python benchmarks/bench_packed.py --hf-path /tmp/hf-pkgs [--workers 1,2] [--rounds 3] [--seconds 3]
    .venv/bin/python benchmarks/bench_packed.py --no-peer      # dataprep alone
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

import dataprep  # noqa: E402
from dataprep.tokens.packed import IGNORE, PackedDocuments  # noqa: E402


def corpus_pack(corpus: Path, work: Path) -> Path:
    """The corpus's text, a document per paragraph (made once in `work`)."""
    out = work / "corpus_paragraphs"
    if not (out / "manifest.json").exists():
        dataprep.build.tokenize([str(corpus / "text")], out, tokenizer=str(corpus / "tokenizer" / "tokenizer.json"),
                                split_docs="paragraph", overwrite=True)
    return out


def log_normal_pack(docs: int, work: Path) -> Path:
    """`docs` documents of random words w0..w4095, log-normal lengths (median 600 tokens with the end-of-text
    id, sigma 1), one per line, through a word-level tokenizer (made once in `work`)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    out = work / f"log_normal_{docs}"
    if (out / "manifest.json").exists():
        return out
    rng = np.random.default_rng(0)
    lengths = np.maximum(1, np.exp(rng.normal(np.log(600), 1.0, docs))).astype(np.int64)
    words = np.array([f"w{i}" for i in range(4096)])
    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(["[UNK]", "<|endoftext|>", *words.tolist()])},
                              unk_token="[UNK]"))
    tok.pre_tokenizer = WhitespaceSplit()
    work.mkdir(parents=True, exist_ok=True)
    tok.save(str(work / "words.json"))
    with open(work / "log_normal.txt", "w") as f:
        for n in lengths.tolist():  # a line of n - 1 words: n tokens with its end-of-text id
            f.write(" ".join(words[rng.integers(0, 4096, max(n - 1, 1))].tolist()) + "\n")
    dataprep.build.tokenize([str(work / "log_normal.txt")], out, tokenizer=str(work / "words.json"),
                            split_docs="line", overwrite=True)
    (work / "log_normal.txt").unlink()
    return out


# -- the peer: a document dataset, a batch sampler of the same plan, DataCollatorWithFlattening ---------
class Pieces(Dataset):
    """A piece of a document by (document, offset, length): a view of the pack's token array (the ids and
    the end-of-text id that ends each document), as the collator takes it."""

    def __init__(self, ds: PackedDocuments):
        self.tokens, self.offsets = ds.data.tokens, ds.data.doc_offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, key: tuple[int, int, int]) -> dict:
        d, o, n = key
        a = int(self.offsets[d]) + o
        return {"input_ids": self.tokens[a:a + n]}


class PlanBatches:
    """A batch sampler: each epoch, the pieces of each batch of `batch` rows of the plan of (seed, epoch)."""

    def __init__(self, ds: PackedDocuments, batch: int):
        self.ds, self.batch, self.epoch = ds, batch, 0

    def __len__(self) -> int:
        return -(-len(self.ds) // self.batch)

    def __iter__(self):
        plan = self.ds.packing.plan(self.ds.seed, self.epoch)
        self.epoch += 1
        doc, off, length, starts = (a.tolist() for a in (plan.document, plan.offset, plan.length, plan.row_starts))
        for r in range(0, plan.rows, self.batch):
            a, b = starts[r], starts[min(r + self.batch, plan.rows)]
            yield list(zip(doc[a:b], off[a:b], length[a:b]))


def peer_loader(ds: PackedDocuments, batch: int, workers: int):
    from transformers import DataCollatorWithFlattening

    collate = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)
    return DataLoader(Pieces(ds), batch_sampler=PlanBatches(ds, batch), collate_fn=collate, num_workers=workers,
                      persistent_workers=workers > 0)


def same_batches(ds: PackedDocuments, batch: int, check: int) -> None:
    """The first `check` batches of epoch 0 hold the same tokens and segments in both (else exit)."""
    ours, peer = iter(dataprep.Loader(ds, batch)), iter(peer_loader(ds, batch, 0))
    for k in range(check):
        a, b = next(ours), next(peer)
        ids = a["input_ids"][a["document_ids"] >= 0]
        seg = torch.diff(a["cu_seqlens"]).tolist()
        pad = [n for n, first in zip(seg, a["cu_seqlens"][:-1].tolist()) if a["document_ids"].reshape(-1)[first] < 0]
        for n in pad:
            seg.remove(n)
        if not (torch.equal(ids.sort().values, b["input_ids"].reshape(-1).sort().values)
                and sorted(seg) == sorted(torch.diff(b["cu_seq_lens_q"]).tolist())
                and int((a["labels"] != IGNORE).sum()) == int((b["labels"] != IGNORE).sum())):
            sys.exit(f"batch {k}: dataprep and the peer do not hold the same tokens and segments")


def one_round(loader, tokens: int, seconds: float) -> float:
    """Tokens/s over whole epochs run until `seconds` have passed."""
    t0, served = time.perf_counter(), 0
    while True:
        for _ in loader:
            pass
        served += tokens
        dt = time.perf_counter() - t0
        if dt >= seconds:
            return served / dt


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs) / 1e6:.2f} M ({min(xs) / 1e6:.2f}-{max(xs) / 1e6:.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, default=HERE.parent.parent / "shared" / "corpus")
    ap.add_argument("--work", type=Path, default=Path("/tmp/dataprep-bench-packed"), help="where the packs are made, once")
    ap.add_argument("--docs", type=int, default=6000, help="log-normal documents (0: none)")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--packing", default="best_fit")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0, help="least time a round serves whole epochs for")
    ap.add_argument("--hf-path", help="a folder transformers was installed into (pip install --target)")
    ap.add_argument("--no-peer", action="store_true")
    args = ap.parse_args()
    peer = not args.no_peer
    if args.hf_path:
        sys.path.append(args.hf_path)  # after .venv's own packages: torch, numpy, tokenizers stay the project's
    if peer:
        try:
            import transformers
        except ImportError:
            sys.exit("transformers is missing: install it apart, never into .venv:\n"
                     "  .venv/bin/python -m pip install --target /tmp/hf-pkgs transformers\n"
                     "then run this with --hf-path /tmp/hf-pkgs (or --no-peer for dataprep alone)")
        print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    sets = {}
    if (args.corpus / "text").is_dir():
        sets["corpus paragraphs"] = corpus_pack(args.corpus, args.work)
    if args.docs:
        sets[f"log-normal, {args.docs:,} documents"] = log_normal_pack(args.docs, args.work)
    print(f"before: {uptime()}")
    print(f"context {args.context}, batch {args.batch}, {args.packing}; {args.rounds} rounds of >= {args.seconds} s each, "
          "dataprep and the peer alternating; tokens/s: median (range)")
    rows = []
    for name, pack in sets.items():
        ds = PackedDocuments(pack, args.context, packing=args.packing)
        info = ds.info()
        print(f"{name}: {info['documents']:,} documents, {info['tokens']:,} tokens, {info['rows']:,} rows, "
              f"padding {100 * info['padding_share']:.3f} %")
        if peer:
            same_batches(ds, args.batch, 4)
        for w in (int(x) for x in args.workers.split(",")):
            loaders = {"dataprep": dataprep.Loader(ds, args.batch, num_workers=w)}
            if peer:
                loaders["peer"] = peer_loader(ds, args.batch, w)
            for ld in loaders.values():  # warm-up: workers forked, first plans made
                for _ in ld:
                    pass
            got: dict[str, list[float]] = {k: [] for k in loaders}
            for r in range(args.rounds):
                for k, ld in loaders.items():
                    got[k].append(one_round(ld, info["tokens"], args.seconds))
                print(f"  {w} workers, round {r}: " + ", ".join(f"{k} {v[-1] / 1e6:.2f} M tokens/s" for k, v in got.items())
                      + f"; load {os.getloadavg()[0]:.2f}", flush=True)
            loaders["dataprep"].close()
            del loaders
            rows.append((name, w, got))
    print(f"after: {uptime()}\n")
    print("| documents | workers | dataprep tokens/s | per worker | peer tokens/s | per worker | ratio (rounds' range) |")
    print("|---|---|---|---|---|---|---|")
    for name, w, got in rows:
        d = got["dataprep"]
        line = f"| {name} | {w} | {spread(d)} | {statistics.median(d) / w / 1e6:.2f} M |"
        if "peer" in got:
            p = got["peer"]
            ratios = [a / b for a, b in zip(d, p)]
            line += (f" {spread(p)} | {statistics.median(p) / w / 1e6:.2f} M | {statistics.median(d) / statistics.median(p):.1f}x "
                     f"({min(ratios):.1f}-{max(ratios):.1f}) |")
        else:
            line += " | | |"
        print(line)


if __name__ == "__main__":
    main()
