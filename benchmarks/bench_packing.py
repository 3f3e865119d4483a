"""Packed rows (issue 54): for each strategy (best_fit, first_fit, concat), the padding share, rows,
documents cut, the time to plan (the fit, made once, and one epoch's plan) and the peak memory, for
log-normal document lengths (median 600 tokens, sigma 1: 11 % past 2048, 3 % past 4096) at context 2048
and 4096, and for the corpus's text split into paragraphs (counted with the corpus tokenizer, each
paragraph's ids plus its end-of-text id).

Each case runs in a fresh interpreter: `peak RSS` is its high-water mark (VmHWM: Python, numpy, the
lengths and the planning), `planning` that less its resident memory before planning began.

    .venv/bin/python benchmarks/bench_packing.py [--docs 1000000] [--corpus ../shared/corpus] [--no-text]
    .venv/bin/python benchmarks/bench_packing.py --docs 10000000 --no-text   # the 10 s / 1 GiB figure
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import numpy as np  # noqa: E402

from dataprep.tokens.packing import STRATEGIES, Packing  # noqa: E402


def log_normal(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.maximum(1, np.exp(rng.normal(np.log(600), 1.0, n))).astype(np.int64)


def one(lengths_file: str, context: int, strategy: str) -> dict:
    """Plan one case in this interpreter: the figures as a dict."""
    lengths = np.load(lengths_file)
    before = status("VmRSS")
    t0 = time.perf_counter()
    packing = Packing(lengths, context, strategy)
    t1 = time.perf_counter()
    plan = packing.plan(seed=0, epoch=1)
    t2 = time.perf_counter()
    rss = status("VmHWM")
    return {"rows": plan.rows, "padding": plan.padding_share, "cut": plan.documents_cut, "fit_s": t1 - t0,
            "plan_s": t2 - t1, "peak": rss - before, "rss": rss, "docs": len(lengths), "tokens": int(lengths.sum())}


def status(field: str) -> int:
    """A /proc/self/status memory line, in bytes."""
    with open("/proc/self/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith(field + ":"))) * 1024


def run_case(lengths_file: str, context: int, strategy: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--one", lengths_file, str(context), strategy],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def paragraph_lengths(corpus: Path) -> np.ndarray:
    from dataprep.text import encode
    from dataprep.tokens.read import documents, expand
    from dataprep.tokens.tokenize import load_tokenizer

    docs = list(documents(expand([str(corpus / "text")]), "paragraph"))
    tok = load_tokenizer(str(corpus / "tokenizer" / "tokenizer.json"))
    return encode(tok, docs, end_id=0)[1]  # each paragraph's ids and its end-of-text id


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=1_000_000, help="log-normal documents")
    ap.add_argument("--contexts", default="2048,4096")
    ap.add_argument("--corpus", type=Path, default=HERE.parent.parent / "shared" / "corpus")
    ap.add_argument("--no-text", action="store_true", help="skip the corpus's paragraphs")
    ap.add_argument("--one", nargs=3, metavar=("LENGTHS", "CONTEXT", "STRATEGY"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]), args.one[2])))
        return
    with tempfile.TemporaryDirectory() as tmp:
        sets = {f"log-normal, {args.docs:,} documents": log_normal(args.docs)}
        if not args.no_text and (args.corpus / "text").is_dir():
            t = time.perf_counter()
            sets["corpus paragraphs"] = paragraph_lengths(args.corpus)
            print(f"(corpus paragraphs tokenized in {time.perf_counter() - t:.1f} s)")
        print("| lengths | context | strategy | padding | rows | documents cut | fit | one epoch's plan | planning | peak RSS |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for name, lengths in sets.items():
            path = str(Path(tmp) / "lengths.npy")
            np.save(path, lengths)
            for context in (int(c) for c in args.contexts.split(",")):
                for strategy in STRATEGIES:
                    r = run_case(path, context, strategy)
                    print(f"| {name} ({r['tokens']:,} tokens) | {context} | {strategy} | {100 * r['padding']:.3f} % | "
                          f"{r['rows']:,} | {r['cut']:,} | {r['fit_s']:.2f} s | {r['plan_s']:.2f} s | "
                          f"{r['peak'] / 2**20:.0f} MiB | {r['rss'] / 2**20:.0f} MiB |", flush=True)


if __name__ == "__main__":
    main()
