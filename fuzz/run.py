"""Takes a number of seconds, gives a fuzzing run of images/_jpegseg.c and its figures (`make fuzz`).

Builds fuzz/jpegseg_fuzz.c (which includes the extension's source) with clang's libFuzzer,
AddressSanitizer and UndefinedBehaviorSanitizer against this Python, then runs it on a corpus folder
(build/fuzz/corpus unless --corpus), the committed seeds (fuzz/seeds) and the inputs of past findings
(fuzz/regressions). Every input goes through both entry points and the Python path (fuzz/agree.py). A
sanitizer report, a disagreement or a hang ends the run: the input is written to build/fuzz/crashes/ and
the exit status is not 0. The last line gives the executions and libFuzzer's coverage (cov: edges of the
instrumented C; ft: features) for the closing note.

    .venv/bin/python fuzz/run.py --seconds 30
"""
from __future__ import annotations

import argparse
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
FUZZ = ROOT / "fuzz"
SOURCE = ROOT / "dataprep" / "images" / "_jpegseg.c"
SANITIZERS = ["-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g", "-O1"]


def missing(clang: str) -> str | None:
    """Why the harness cannot be built here (None: it can): no clang, or no Python to embed."""
    if shutil.which(clang) is None:
        return f"no {clang} here (apt-get install clang): the compiled part is fuzzed where clang is"
    if not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
        return "no Python headers (Python.h) here to build the harness against"
    if not sysconfig.get_config_var("LIBDIR") or not sysconfig.get_config_var("LDLIBRARY"):
        return "this Python has no libpython to embed"
    with tempfile.TemporaryDirectory() as tmp:
        probe = pathlib.Path(tmp) / "probe.c"
        probe.write_text("int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }\n")
        done = subprocess.run([clang, *SANITIZERS, str(probe), "-o", str(probe.with_suffix(""))], capture_output=True)
        if done.returncode:
            return f"{clang} here has no libFuzzer or sanitizer runtimes (-fsanitize=fuzzer,address,undefined)"
    return None


def build(clang: str, out: pathlib.Path, flags: list[str], name: str) -> pathlib.Path:
    """The harness, compiled with `flags` and linked against this interpreter's libpython."""
    libdir = sysconfig.get_config_var("LIBDIR")
    version = sysconfig.get_config_var("LDVERSION") or sysconfig.get_config_var("VERSION")
    exe = out / name
    cmd = [clang, *flags, "-I" + sysconfig.get_paths()["include"], str(FUZZ / "jpegseg_fuzz.c"), "-o", str(exe),
           "-L" + libdir, f"-lpython{version}", "-Wl,-rpath," + libdir, "-Wl,--export-dynamic", "-lm", "-ldl"]
    subprocess.run(cmd, check=True)
    return exe


def coverage(clang: str, out: pathlib.Path, env: dict, inputs: list[pathlib.Path]) -> str | None:
    """Lines and branches of images/_jpegseg.c that `inputs` reach, by replaying them once through a build
    with clang's source-based coverage; None where llvm-profdata or llvm-cov is missing."""
    tools = [shutil.which(t) for t in ("llvm-profdata", "llvm-cov")]
    if None in tools:
        return None
    exe = build(clang, out, ["-fsanitize=fuzzer", "-fprofile-instr-generate", "-fcoverage-mapping", "-O1"], "jpegseg_cov")
    raw, merged = out / "cov.profraw", out / "cov.profdata"
    subprocess.run([str(exe), "-runs=0", "-max_len=4096", *map(str, inputs)], env=dict(env, LLVM_PROFILE_FILE=str(raw)),
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run([tools[0], "merge", "-sparse", str(raw), "-o", str(merged)], check=True)
    report = subprocess.run([tools[1], "report", str(exe), f"-instr-profile={merged}", str(SOURCE)], check=True,
                            capture_output=True, text=True).stdout
    total = next(line.split() for line in report.splitlines() if line.startswith("TOTAL"))
    # TOTAL, then regions, missed, cover; functions, missed, executed; lines, missed, cover; branches, missed, cover
    return f"lines {total[9]} ({int(total[7]) - int(total[8])} of {total[7]}), branches {total[12]} of images/_jpegseg.c"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=600)
    ap.add_argument("--corpus", type=pathlib.Path, default=ROOT / "build" / "fuzz" / "corpus")
    ap.add_argument("--clang", default=os.environ.get("CLANG", "clang"))
    ap.add_argument("--seed", type=int, default=0, help="libFuzzer's random seed (0: a new one each run)")
    args = ap.parse_args(argv)
    why = missing(args.clang)
    if why:
        print(f"fuzz: {why}", file=sys.stderr)
        return 2
    out = ROOT / "build" / "fuzz"
    crashes = out / "crashes"
    for d in (out, crashes, args.corpus):
        d.mkdir(parents=True, exist_ok=True)
    exe = build(args.clang, out, SANITIZERS, "jpegseg_fuzz")
    env = dict(os.environ,
               FUZZ_PYTHON=sys.executable,
               PYTHONPATH=os.pathsep.join([str(ROOT), str(FUZZ)]),
               # every PyMem buffer through malloc, so that AddressSanitizer sees its bounds
               PYTHONMALLOC="malloc",
               # Python keeps objects alive to the end by design: leak reports would be its, not the C part's
               ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1:abort_on_error=0",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    cmd = [str(exe), f"-max_total_time={args.seconds}", f"-seed={args.seed}", "-detect_leaks=0", "-timeout=10", "-rss_limit_mb=2048", "-max_len=4096",
           f"-dict={FUZZ / 'jpeg.dict'}", f"-artifact_prefix={crashes}/", "-print_final_stats=1",
           str(args.corpus), str(FUZZ / "seeds"), str(FUZZ / "regressions")]
    log = out / "last.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
        assert proc.stdout is not None
        for line in proc.stdout:
            fh.write(line)
            if line.startswith('"') or line.startswith("###### "):
                continue  # libFuzzer's recommended dictionary
            if not line.startswith("#") or "pulse" in line or "DONE" in line or "INITED" in line:
                sys.stdout.write(line)  # findings, tracebacks and progress, without each new-coverage line
        rc = proc.wait()
    text = log.read_text()
    runs = re.search(r"stat::number_of_executed_units: (\d+)", text)
    cov = re.findall(r"cov: (\d+) ft: (\d+)", text)
    corpus = len(list(args.corpus.iterdir()))
    if rc != 0:
        print(f"fuzz: FAILED (exit {rc}); the input is in {crashes}/, the whole log in {log}", file=sys.stderr)
        return 1
    reached = coverage(args.clang, out, env, [args.corpus, FUZZ / "seeds", FUZZ / "regressions"])
    print(f"fuzz: {runs.group(1) if runs else '?'} executions in {args.seconds} s, cov {cov[-1][0] if cov else '?'}, "
          f"ft {cov[-1][1] if cov else '?'}, corpus {corpus} inputs: no sanitizer report, no disagreement")
    if reached:
        print(f"fuzz: the corpus reaches {reached}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
