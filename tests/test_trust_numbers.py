"""Numbers a build takes (byte caps, sizes in MB, counts, seeds, fractions, fill values), given as inf, nan,
1e400 or 400 digits, from the command line, a --config file or the Python front door: a usage error naming
the option and the range it takes, before anything is listed or written; never a raw OverflowError, a
build that runs on, or a hang (old code: `--max-bytes inf` an OverflowError traceback, `--skip-rows` of 400
digits a hang, `--workers` of 400 digits a build, `seed=-1` numpy's "expected non-negative integer")."""
from __future__ import annotations

import math

import pytest
from click.testing import CliRunner

from dataprep import build
from dataprep.cli import main
from dataprep.errors import DataprepError, UsageError
from dataprep.limits import parse_bytes
from dataprep.settings import BuildSettings

HUGE = "9" * 400
MAX_BYTES = 1 << 50  # 1024TiB: the largest byte count taken
SHORT = "(400 characters)"  # how a message shows a 400-digit value: cut short, never 400 digits


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def refused(r, flag: str, *words: str) -> None:
    """Exit 2 (a usage error) naming `flag` and `words` (the range), with no traceback."""
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert f"'{flag}'" in r.output and all(w in r.output for w in words), r.output
    assert HUGE not in r.output  # a long value is shown cut short


@pytest.fixture()
def src(tmp_path):
    (tmp_path / "src" / "a").mkdir(parents=True)
    (tmp_path / "t.csv").write_text("x,y\n1,0\n2,1\n")
    (tmp_path / "t.txt").write_text("some text\n")
    return tmp_path


CAPS = ["inf", "-inf", "nan", "1e400", HUGE, "1e30", "0", "infMiB"]


@pytest.mark.parametrize("value", CAPS, ids=["inf", "-inf", "nan", "1e400", "400digits", "1e30", "0", "infMiB"])
def test_a_byte_cap_of_inf_nan_or_huge_is_a_usage_error_naming_the_range(value, src):
    for args, flag in ((["build", "folder", src / "src", "--out", src / "p"], "--max-bytes"),
                       (["build", "volumes", src / "src", "--out", src / "v"], "--max-bytes"),
                       (["plan", "--shape", "8x8x3", "--samples", "4"], "--ram-per-node")):
        refused(cli(*args, flag, value), flag, "from 1 to 1024TiB")
    with pytest.raises(UsageError, match=r"^max_bytes: .*not a byte count from 1 to 1024TiB"):
        build.folder(src / "src", src / "q", max_bytes=value)
    assert not (src / "p").exists() and not (src / "q").exists()


def test_parse_bytes_and_build_settings_take_1_to_1024tib_only():
    assert parse_bytes("256MiB") == 256 << 20 and parse_bytes("1.5GiB") == 3 << 29 and parse_bytes(MAX_BYTES) == MAX_BYTES
    assert parse_bytes("1024TiB") == MAX_BYTES
    for bad in (math.inf, math.nan, 10**400, MAX_BYTES + 1, True, "1025TiB", -5):
        with pytest.raises(DataprepError, match="not a byte count from 1 to 1024TiB"):
            parse_bytes(bad)
    for bad in (10**400, MAX_BYTES + 1):
        with pytest.raises(DataprepError, match=r"max_bytes must be a byte count from 1 to 1,125,899,906,842,624"):
            BuildSettings(max_bytes=bad)


# (command arguments before the option, the option, its front-door call, the range the message gives)
COUNTS = [
    (["build", "folder", "SRC/src"], "--workers", "folder", "workers", "from 1 to 4096"),
    (["build", "folder", "SRC/src"], "--limit", "folder", "limit", "from 1 to 9223372036854775807"),
    (["build", "folder", "SRC/src"], "--shard-size", "folder", "shard_size", "from 1 to 9223372036854775807"),
    (["build", "folder", "SRC/src"], "--size", "folder", "size", "from 8 to 16384"),
    (["build", "volumes", "SRC/src"], "--workers", "volumes", "workers", "from 1 to 4096"),
    (["tokenize", "SRC/t.txt", "--train-bpe", "300"], "--chunk-mb", "tokenize", "chunk_mb", "from 1 to 1048576"),
    (["tokenize", "SRC/t.txt", "--train-bpe", "300"], "--task-mb", "tokenize", "task_mb", "from 1 to 1048576"),
    (["tokenize", "SRC/t.txt"], "--train-bpe", "tokenize", "train_bpe", "from 256 to 4294967296"),
    (["tokenize", "SRC/t.txt", "--train-bpe", "300"], "--eot-id", "tokenize", "eot_id", "from 0 to 4294967295"),
    (["tokenize", "SRC/t.txt", "--train-bpe", "300"], "--seed", "tokenize", "seed", "from 0 to 18446744073709551615"),
    (["table", "SRC/t.csv", "--target", "y"], "--skip-rows", "table", "skip_rows", "from 0 to 1000000"),
    (["table", "SRC/t.csv", "--target", "y"], "--max-categories", "table", "max_categories", "from 0 to 9223372036854775807"),
    (["table", "SRC/t.csv", "--target", "y"], "--seed", "table", "seed", "from 0 to 18446744073709551615"),
]


@pytest.mark.parametrize("before,flag,fn,key,span", COUNTS, ids=[f"{c[0][0]}{c[1]}" for c in COUNTS])
def test_a_count_of_400_digits_or_inf_is_refused_by_the_cli_and_the_front_door_with_its_range(before, flag, fn, key, span, src):
    args = [str(a).replace("SRC", str(src)) for a in before]
    r = cli(*args, "--out", src / "p", flag, HUGE)
    refused(r, flag, span, SHORT)
    refused(cli(*args, "--out", src / "p", flag, "1e400"), flag, span)
    call = getattr(build, fn)
    extra = {"target": "y"} if fn == "table" else ({"train_bpe": 300} if fn == "tokenize" and key != "train_bpe" else {})
    for value in (10**400, math.inf, math.nan, 1.5):
        with pytest.raises(UsageError, match=rf"^{key}=.*must be an integer {span}"):
            call(args[1], src / "q", **extra, **{key: value})
    assert not (src / "p").exists() and not (src / "q").exists()


def test_a_negative_table_seed_is_a_usage_error_not_numpys(src):
    """Old code: ValueError('expected non-negative integer') from numpy, naming no option."""
    with pytest.raises(UsageError, match=r"^seed=-1: must be an integer from 0 to 18446744073709551615"):
        build.table(src / "t.csv", src / "q", target="y", seed=-1, val_fraction=0.5)
    refused(cli("table", src / "t.csv", "--target", "y", "--seed", "-1", "--out", src / "p"), "--seed", "from 0 to")


@pytest.mark.parametrize("value", ["inf", "nan", "1e300", HUGE])
def test_a_table_fill_value_must_be_finite_and_fit_the_column_dtype(value, src):
    """Old code: inf and nan stored as the fill of missing values; 1e300 stored as inf in float32."""
    r = cli("table", src / "t.csv", "--target", "y", "--fill-value", value, "--out", src / "p")
    assert r.exit_code == 2 and "fill" in r.output.replace("-", "_") and "finite number" in r.output, r.output
    with pytest.raises(UsageError, match=r"^fill_value=.*must be a finite number"):
        build.table(src / "t.csv", src / "q", target="y", fill_value=float(value) if value != HUGE else int(value))
    assert build.TABLE_OPTIONS["fill_value"] == 0.0 and not (src / "p").exists() and not (src / "q").exists()


@pytest.mark.parametrize("flag,value", [("--shape", f"4,8,{HUGE}"), ("--shape", "4,8,1e400"), ("--window", "-inf,inf"),
                                        ("--window", "0,1e400")])
def test_a_volume_shape_or_window_past_its_range_is_a_usage_error(flag, value, src):
    """Old code: a shape of 400 digits an OverflowError; a window of -inf,inf built volumes of nan scaled to 0."""
    r = cli("build", "volumes", src / "src", "--out", src / "p", flag, value)
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), (r.output, r.exception)
    assert f"{flag[2:]}=" in r.output and ("from 1 to 16384" in r.output or "finite numbers" in r.output), r.output
    with pytest.raises(UsageError, match=flag[2:]):
        build.volumes(src / "src", src / "q", **{flag[2:]: value})


# --config files: YAML's .inf, .nan and floats reach the same checks (old code: click's int() of inf raised
# a raw OverflowError; 50.5 became 50)
CONFIGS = [("build", "max_bytes: .inf", "--max-bytes", "from 1 to 1024TiB"), ("build", "size: .inf", "--size", "from 8 to 16384"),
           ("build", "workers: .inf", "--workers", "from 1 to 4096"), ("build", "quality: 50.5", "--quality", "from 1 to 100"),
           ("build", f"shard-size: {HUGE}", "--shard-size", SHORT), ("build", "limit: .nan", "--limit", "must be an integer"),
           ("table", "seed: .inf", "--seed", "from 0 to"), ("table", "skip_rows: 1.0e+400", "--skip-rows", "from 0 to 1000000"),
           ("table", "fill_value: .inf", "--fill-value", "finite number"),
           ("table", "val_fraction: .nan", "--val-fraction", "finite number from 0 up to (not including) 1")]


@pytest.mark.parametrize("command,text,flag,span", CONFIGS, ids=[c[1].split(":")[0] for c in CONFIGS])
def test_a_config_value_of_inf_nan_or_huge_is_a_usage_error_naming_the_option(command, text, flag, span, src):
    (src / "c.yaml").write_text(text + "\n")
    args = ["build", "folder", src / "src"] if command == "build" else ["table", src / "t.csv", "--target", "y"]
    refused(cli(*args, "--config", src / "c.yaml", "--out", src / "p"), flag, span)
    assert not (src / "p").exists()


@pytest.mark.parametrize("raw, want", [("nan", None), ("inf", math.inf), ("0", 0.0), ("12.5", 12.5), ("soon", None)])
def test_the_remote_deadline_refuses_nan_and_takes_inf_as_none(raw, want, monkeypatch):
    """DATAPREP_REMOTE_DEADLINE: nan is refused (old code: nan > 0 is false, so the deadline was silently off);
    inf and 0 are no deadline; a number of seconds is the deadline."""
    from dataprep.remote.store import DEADLINE_ENV, deadline

    monkeypatch.setenv(DEADLINE_ENV, raw)
    if raw in ("nan", "soon"):
        with pytest.raises(DataprepError, match=rf"^{DEADLINE_ENV}='{raw}': not a number of seconds \(0 or inf: no deadline\)"):
            deadline()
    else:
        assert deadline() == (None if want in (0.0, math.inf) else want)
