"""Tokenize memory (issue 18): a generated single-line file of --mb megabytes (the corpus text, its line
breaks replaced by spaces, repeated) through `dataprep tokenize --split-docs line` in a child process; its
peak RSS (VmHWM) against the target, and for scale the same text as ordinary lines.

    .venv/bin/python benchmarks/bench_tokenize_memory.py [--mb 200] [--target-mb 600]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = HERE.parents[1] / "shared" / "corpus"

CHILD = """
import sys, time
from dataprep.tokens.tokenize import TokenizeSettings, tokenize
t0 = time.perf_counter()
r = tokenize([sys.argv[1]], sys.argv[2], TokenizeSettings(split="line"), sys.argv[3])
secs = time.perf_counter() - t0
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) // 1024
print(r["documents"], r["tokens"], f"{secs:.2f}", hwm)
"""


def run(path: Path, out: Path, tok: str) -> tuple[int, int, float, int]:
    r = subprocess.run([sys.executable, "-c", CHILD, str(path), str(out), tok], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(HERE.parent)})
    if r.returncode:
        raise SystemExit(r.stderr[-2000:])
    docs, tokens, secs, hwm = r.stdout.split()
    return int(docs), int(tokens), float(secs), int(hwm)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--target-mb", type=int, default=600)
    a = ap.parse_args()
    tok = CORPUS / "tokenizer" / "tokenizer.json"
    texts = sorted((CORPUS / "text").rglob("*.txt"))
    if not tok.is_file() or not texts:
        raise SystemExit(f"needs the shared corpus at {CORPUS}")
    base = " ".join(" ".join(p.read_text(encoding="utf-8", errors="replace").split()) for p in texts[:20]) + " "
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        one, lines = tmp / "one.txt", tmp / "lines.txt"
        with open(one, "w", encoding="utf-8") as f1, open(lines, "w", encoding="utf-8") as f2:
            written = 0
            while written < a.mb << 20:
                f1.write(base)
                for k in range(0, len(base), 4000):  # the same text as lines of ~4 kB
                    f2.write(base[k : k + 4000] + "\n")
                written += len(base.encode())
        print(f"load average at start: {os.getloadavg()[0]:.2f}; {written / 1e6:.0f} MB of corpus text, WordPiece (vocab 30,522)")
        for name, path in (("one line", one), ("4 kB lines", lines)):
            docs, tokens, secs, hwm = run(path, tmp / f"p-{name[:3]}", str(tok))
            print(f"  {name:10s}: {docs:>9,} documents, {tokens:>12,} tokens in {secs:6.1f} s ({tokens / secs:,.0f} tokens/s), "
                  f"peak RSS {hwm:,} MB")
            if name == "one line":
                verdict = "met" if hwm < a.target_mb else "NOT met"
                print(f"  single-line peak RSS {hwm:,} MB (target < {a.target_mb} MB: {verdict})")
        print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"({time.perf_counter() - t0:.0f} s)")
