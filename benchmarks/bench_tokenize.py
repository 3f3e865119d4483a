"""Tokenize (issue 6): tokens/s of `dataprep tokenize` against the tokenizer's own encode_batch over the
same documents and a single-process per-document encode loop (the common script), same run; peak RSS
of the tokenize command at two corpus sizes (it must not grow with the corpus).

    .venv/bin/python benchmarks/bench_tokenize.py [--mb 200] [--corpus ../shared/corpus]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import numpy as np  # noqa: E402

from dataprep.tokens.encoding import _chunks  # noqa: E402
from dataprep.tokens.read import documents, expand  # noqa: E402
from dataprep.tokens.tokenize import TokenizeSettings, load_tokenizer, tokenize  # noqa: E402

# VmHWM, not ru_maxrss: Linux carries ru_maxrss over fork and exec, so a child would report its
# parent's peak (this script's own, which holds a 55 M-token list at that point).
RSS = ("import sys; from dataprep.cli import main\ntry: main(sys.argv[1:])\nexcept SystemExit: pass\n"
       "print('maxrss_kb', [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')][0])")


def make_corpus(src: Path, dst: Path, mb: int) -> int:
    files = sorted(src.glob("*.txt"))
    dst.mkdir(parents=True, exist_ok=True)
    total, k = 0, 0
    while total < mb * 1e6:
        for f in files:
            data = f.read_bytes()
            (dst / f"{k:04d}_{f.name}").write_bytes(data)
            total += len(data)
            k += 1
    return total


def peak_rss(files_dir: Path, tok: Path, out: Path) -> int:
    cmd = [sys.executable, "-c", RSS, "tokenize", str(files_dir), "--tokenizer", str(tok), "--split-docs", "paragraph",
           "--out", str(out), "--overwrite"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE.parent)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("maxrss_kb")]
    if not line:
        raise RuntimeError(r.stderr[-2000:])
    return int(line[0].split()[1]) * 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--corpus", default=str(HERE.parents[1] / "shared" / "corpus"))
    a = ap.parse_args()
    corpus = Path(a.corpus)
    tok_path = corpus / "tokenizer" / "tokenizer.json"
    if not tok_path.is_file():
        print(f"no corpus at {corpus}", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="dataprep-bench-tok-"))
    try:
        half = make_corpus(corpus / "text", tmp / "half", a.mb // 2)
        full = make_corpus(corpus / "text", tmp / "full", a.mb)
        files = expand([str(tmp / "full")])
        tok = load_tokenizer(str(tok_path))
        load0 = os.getloadavg()

        t0 = time.perf_counter()
        r = tokenize(files, tmp / "p", TokenizeSettings(split="paragraph"), str(tok_path))
        ours = r["tokens"] / (time.perf_counter() - t0)

        t0, n = time.perf_counter(), 0
        for chunk in _chunks(documents(files, "paragraph"), 8 << 20):
            n += sum(len(e.ids) for e in tok.encode_batch(chunk, add_special_tokens=False))
        batch = n / (time.perf_counter() - t0)

        t0, ids = time.perf_counter(), []
        for d in documents(files, "paragraph"):
            ids.extend(tok.encode(d, add_special_tokens=False).ids)
            ids.append(102)
        arr = np.array(ids, dtype=np.uint16)
        loop = len(arr) / (time.perf_counter() - t0)
        del ids, arr

        rss_half = peak_rss(tmp / "half", tok_path, tmp / "q1")
        rss_full = peak_rss(tmp / "full", tok_path, tmp / "q2")
        print(f"{full / 1e6:.0f} MB of text ({r['documents']:,} paragraphs, {r['tokens']:,} tokens), WordPiece 30,522, "
              f"{os.cpu_count()} cores, load {load0[0]:.2f} -> {os.getloadavg()[0]:.2f}:")
        print(f"  dataprep tokenize            {ours:12,.0f} tokens/s")
        print(f"  encode_batch (same chunks)   {batch:12,.0f} tokens/s")
        print(f"  per-document encode loop     {loop:12,.0f} tokens/s")
        print(f"  peak RSS of `dataprep tokenize`: {rss_half / 1e6:,.0f} MB on {half / 1e6:.0f} MB, {rss_full / 1e6:,.0f} MB on {full / 1e6:.0f} MB")
        checks = [("vs encode_batch", ours / batch, 0.8), ("vs per-document loop", ours / loop, 1.5),
                  ("peak RSS growth, 2x corpus (<= 1.2x)", 1.2 / max(rss_full / rss_half, 1e-9), 1.0)]
        ok = True
        for name, ratio, target in checks:
            ok &= ratio >= target
            print(f"  {name:40s} {ratio:5.2f}  (target >= {target}: {'met' if ratio >= target else 'MISSED'})")
        return 0 if ok else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
