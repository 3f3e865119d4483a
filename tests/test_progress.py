"""Progress when stderr is not a terminal (nohup, SLURM, CI): plain lines on stderr (count, rate, ETA) for every
long operation, stdout left clean; and a resumed build's rate over the samples it built, not those it kept.

Every command here runs under CliRunner, whose stderr is not a terminal; DATAPREP_PROGRESS_EVERY=0 asks for a
line per update, so tiny inputs give lines."""
from __future__ import annotations

import io
import json
import re
import shutil
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from dataprep.cli import main
from dataprep.synthetic import write_tree


def cli(*args, every: str | None = "0"):
    env = {"DATAPREP_PROGRESS_EVERY": every} if every is not None else {}
    return CliRunner().invoke(main, [str(a) for a in args], env=env, catch_exceptions=False)


def lines_of(text: str, what: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith(f"{what}: ")]


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """2 classes x 6 PNGs: 12 images, 3 shards of 4."""
    return write_tree(tmp_path_factory.mktemp("tree"), classes=2, per_class=6, sizes=((40, 60), (50, 50)), kind="index", ext=".png")


def build(tree: Path, out: Path, *extra, every: str | None = "0"):
    return cli("build", "folder", tree / "train", "--out", out, "--size", 32, "--mode", "raw", "-j", 1, "--shard-size", 4,
               *extra, every=every)


@pytest.fixture(scope="module")
def pack(tree, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pack") / "p"
    r = build(tree, out, "--no-progress")
    assert r.exit_code == 0, r.output
    return out


def test_a_build_prints_plain_lines_on_stderr_and_none_on_stdout(tree, tmp_path):
    out = tmp_path / "p"
    r = build(tree, out)
    assert r.exit_code == 0, r.output
    lines = lines_of(r.stderr, f"build {out}")
    assert len(lines) >= 4, r.stderr  # a line per shard, then the final one
    assert re.fullmatch(r"build .*: 4/12 images \(33%\), [\d,.]+ images/s, ETA [\d.]+ s", lines[0]), lines[0]
    assert re.fullmatch(r"build .*: 12/12 images in [\d.]+ s, [\d,.]+ images/s", lines[-1]), lines[-1]
    assert "\r" not in r.stderr and "building" not in r.stderr
    assert "pack:" in r.stdout and not lines_of(r.stdout, f"build {out}") and "ETA" not in r.stdout

    r = build(tree, tmp_path / "q", "--no-progress")
    assert r.exit_code == 0 and r.stderr == "", r.stderr


def test_progress_lines_are_the_default_off_a_terminal_and_with_progress(tree, tmp_path):
    r = build(tree, tmp_path / "p", "--progress")
    assert r.exit_code == 0 and lines_of(r.stderr, f"build {tmp_path / 'p'}"), r.stderr


def test_lines_come_every_n_seconds_or_tenth_and_a_quick_operation_prints_none():
    from dataprep.progress import Progress

    now = [0.0]
    s = io.StringIO()
    p = Progress("x", 100, "images", every=30, stream=s, clock=lambda: now[0])
    for k in range(1, 9):  # 8 % in 8 s: neither 30 s nor a tenth
        now[0] = k
        p.update(1)
    assert s.getvalue() == ""
    now[0] = 11.0
    p.update(2)  # a tenth done and a third of 30 s gone
    now[0] = 12.0
    p.update(50)  # 60 %, but a second after the last line
    now[0] = 41.0
    p.update(1)  # 30 s after the last line
    p.close()
    got = s.getvalue().splitlines()
    assert got == ["x: 10/100 images (10%), 0.9 images/s, ETA 1 min 39 s",
                   "x: 61/100 images (61%), 1.5 images/s, ETA 26 s",
                   "x: 61/100 images in 41 s, 1.5 images/s"], got

    s = io.StringIO()
    with Progress("quick", 10, "images", every=30, stream=s, clock=lambda: 1.0) as q:
        q.update(10)
    assert s.getvalue() == ""  # its summary follows at once

    s = io.StringIO()
    p = Progress("off", 10, "images", show=False, every=0, stream=s)
    p.update(10)
    p.close()
    assert s.getvalue() == ""


def test_a_bad_every_is_an_error_naming_the_variable(tree, tmp_path):
    r = build(tree, tmp_path / "p", every="soon")
    assert r.exit_code == 1 and "DATAPREP_PROGRESS_EVERY='soon'" in r.output, r.output


def test_resume_counts_kept_shards_apart_from_the_rate(tree, tmp_path):
    out = tmp_path / "p"
    assert build(tree, out, "--no-progress").exit_code == 0
    r = build(tree, out, "--resume")
    assert r.exit_code == 0, r.output
    last = r.stdout.splitlines()[-1]
    assert re.fullmatch(r"  0 images built, 12 kept from an earlier run, in [\d.]+ s", last), last
    assert "images/s" not in last
    assert re.fullmatch(r"build .*: 12/12 images \(12 kept from an earlier run\) in [\d.]+ s", lines_of(r.stderr, f"build {out}")[-1])

    shutil.rmtree(out / "train" / "00001")
    r = build(tree, out, "--resume")
    assert r.exit_code == 0, r.output
    last = r.stdout.splitlines()[-1]
    assert re.fullmatch(r"  4 images built in [\d.]+ s, [\d,]+ images/s; 8 kept from an earlier run", last), last
    lines = lines_of(r.stderr, f"build {out}")
    assert any(re.search(r"\(\d+%; \d kept from an earlier run\)", ln) for ln in lines), lines


def test_the_summary_of_a_resumed_build_rates_only_what_it_built(tree, tmp_path):
    from dataprep.driver import BuildSummary, SplitSummary

    s = SplitSummary("train", 5000, written=5000, shards=10, reused=10, kept=5000)
    lines = BuildSummary(Path("p"), [s], 0.2).lines()
    assert lines[-1] == "  0 images built, 5,000 kept from an earlier run, in 0.2 s"
    s = SplitSummary("train", 5000, written=5000, shards=10, reused=8, kept=4000)
    assert BuildSummary(Path("p"), [s], 2.0).lines()[-1] == "  1,000 images built in 2.0 s, 500 images/s; 4,000 kept from an earlier run"


def test_tokenize_reports_bytes_read(tmp_path):
    src = tmp_path / "docs.txt"
    src.write_text("".join(f"document {k} says " + "word " * (k + 3) + "\n" for k in range(40)), encoding="utf-8")
    out = tmp_path / "t"
    r = cli("tokenize", src, "--train-bpe", 300, "--split-docs", "line", "--out", out)
    assert r.exit_code == 0, r.output
    lines = lines_of(r.stderr, f"tokenize {out}")
    assert lines and re.fullmatch(r"tokenize .*: [\d.]+/[\d.]+ kB \(100%\), [\d.]+ [kMG]?B/s", lines[0]), r.stderr
    assert re.fullmatch(r"tokenize .*: [\d.]+/[\d.]+ kB in [\d.]+ s, [\d.]+ [kMG]?B/s", lines[-1]), lines
    assert "tokens/s" in r.stdout and not lines_of(r.stdout, f"tokenize {out}")


def test_table_reports_files_read(tmp_path):
    src = [tmp_path / f"t{k}.csv" for k in range(2)]
    for k, p in enumerate(src):
        p.write_text("a,b,y\n" + "".join(f"{i},{i * 2},{i % 2}\n" for i in range(200 * k, 200 * k + 200)))
    out = tmp_path / "p"
    r = cli("table", *src, "--target", "y", "--out", out)
    assert r.exit_code == 0, r.output
    lines = lines_of(r.stderr, f"table {out}")
    assert len(lines) == 3 and re.match(r"table .*: [\d.]+/[\d.]+ kB \((4\d|5\d)%\)", lines[0]), r.stderr
    assert "rows in" in r.stdout and not lines_of(r.stdout, f"table {out}")


@pytest.mark.parametrize("to", ["zarr", "hdf5", "npy"])
def test_convert_reports_bytes_copied(pack, tmp_path, to):
    src = pack
    if to == "npy":
        src = tmp_path / "p.h5"
        assert cli("convert", pack, "--to", "hdf5", "--out", src, "--no-progress").exit_code == 0
    out = tmp_path / "q"
    r = cli("convert", src, "--to", to, "--out", out)
    assert r.exit_code == 0, r.output
    lines = lines_of(r.stderr, f"convert {src}")
    assert len(lines) >= 2 and re.fullmatch(r"convert .*: [\d.]+/[\d.]+ kB in [\d.]+ s, [\d.]+ [kMG]?B/s", lines[-1]), r.stderr
    assert re.fullmatch(r"convert .*: [\d.]+/[\d.]+ kB \(\d+%\), .*", lines[0]), lines
    assert " -> " in r.stdout and not lines_of(r.stdout, f"convert {src}")


def test_a_build_to_hdf5_reports_its_conversion(tree, tmp_path):
    out = tmp_path / "p.h5"
    r = build(tree, out, "--format", "hdf5")
    assert r.exit_code == 0, r.output
    assert lines_of(r.stderr, f"build {out}") and lines_of(r.stderr, f"store {out} (hdf5)"), r.stderr


def test_verify_reports_shards_and_leaves_stdout_to_the_verdict(pack):
    r = cli("verify", pack)
    assert r.exit_code == 0 and r.stdout.startswith("ok:"), r.output
    lines = lines_of(r.stderr, f"verify {pack}")
    assert lines[0].startswith(f"verify {pack}: 1/3 shards (33%), ") and "ETA" in lines[0], lines
    assert re.fullmatch(r"verify .*: 3/3 shards in [\d.]+ s, [\d,.]+ shards/s", lines[-1]), lines
    r = cli("verify", pack, "--no-progress")
    assert r.exit_code == 0 and r.stderr == "", r.stderr


@pytest.fixture
def url(pack):
    import fsspec

    from dataprep.remote.upload import upload_pack

    u = f"memory://dataprep-progress-{uuid.uuid4().hex[:12]}/p"
    upload_pack(pack, u)
    yield u
    fsspec.filesystem("memory").rm(u[len("memory://"):].rsplit("/", 1)[0], recursive=True)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("DATAPREP_CACHE_DIR", str(d))
    return d


def test_remote_verify_and_convert_report_the_fetch(url, cache_dir, tmp_path):
    r = cli("verify", url)
    assert r.exit_code == 0 and r.stdout.startswith(f"ok: {url}"), r.output
    fetched = lines_of(r.stderr, f"fetch {url}")
    assert fetched and re.fullmatch(r"fetch .*: [\d.]+/[\d.]+ kB in [\d.]+ s, [\d.]+ [kMG]?B/s", fetched[-1]), r.stderr
    assert lines_of(r.stderr, f"verify {url}")[-1].startswith(f"verify {url}: 3/3 shards in ")
    r = cli("convert", url, "--to", "hdf5", "--out", tmp_path / "q.h5")
    assert r.exit_code == 0, r.output
    assert lines_of(r.stderr, f"fetch {url}") and lines_of(r.stderr, f"convert {url}"), r.stderr


def test_plan_json_stays_parseable_beside_fetch_lines(url, cache_dir):
    r = cli("plan", url, "--json")
    assert r.exit_code == 0, r.output
    assert isinstance(json.loads(r.stdout), dict)
    assert lines_of(r.stderr, f"fetch {url}"), r.stderr


def test_a_fetch_into_memory_reports_in_a_log(url, cache_dir, monkeypatch, capsys):
    """What a RAM or shm cache of a pack at a URL loads: lines on stderr when it is a log, none on a terminal."""
    from dataprep.pack.backends import open_reader
    from dataprep.remote.fetch import RemotePack
    from dataprep.remote.memory import MemoryFetch

    monkeypatch.setenv("DATAPREP_PROGRESS_EVERY", "0")
    rp = RemotePack(url)
    dest = rp.stage(cache_dir / "staged")
    items = rp.shard_files(["train"])
    mf = MemoryFetch(rp.store, dest, items, open_reader(dest))
    try:
        for rel, rec in items:
            assert mf.read(dest / rel, rec).nbytes > 0
    finally:
        mf.close()
    err = capsys.readouterr().err
    lines = lines_of(err, f"fetch {url}")
    assert len(lines) >= 2 and re.fullmatch(r"fetch .*: [\d.]+/[\d.]+ kB in [\d.]+ s, [\d.]+ [kMG]?B/s", lines[-1]), err


def test_loading_a_pack_prints_plain_lines_in_a_log(pack, monkeypatch, capfd):
    """progress=True while loading a split into RAM: off a terminal, lines (never a carriage return), and
    the final one with the rate."""
    import dataprep

    monkeypatch.setenv("DATAPREP_PROGRESS_EVERY", "0")
    dataprep.InMemoryImageDataset(pack, progress=True)
    err = capfd.readouterr().err
    assert "\r" not in err, repr(err)
    lines = lines_of(err, f"loading {pack}/train (ram)")
    assert lines and re.fullmatch(r"loading .*: [\d.,]+/[\d.,]+ (kB|MB|B) in [\d.]+ s(, [\d.,]+ (kB|MB|GB|B)/s)?", lines[-1]), err
