"""The Makefile installs what each command runs: the demo the package alone, the tests their extras; its
stamps record what is installed, so one command after another installs only what is missing (dry runs)."""
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def dry(target: str, stamp: Path, *args: str) -> list[str]:
    out = subprocess.run(["make", "--no-print-directory", "-n", target, f"STAMP={stamp}", *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def installs(lines: list[str]) -> list[str]:
    """What the pip steps of a dry run install: '.' for the package, '.[NAME]' for an extra, torch."""
    return [ln.split("install -q ")[-1].removeprefix("-e ").strip('"') for ln in lines
            if "pip install -q" in ln and "--upgrade pip" not in ln]


def touch(*paths: Path) -> None:
    later = time.time() + 5  # newer than the Makefile and setup.cfg whatever the clock's granularity
    for p in paths:
        p.touch()
        os.utime(p, (later, later))


def test_the_demo_installs_the_package_alone_and_the_tests_add_their_extras(tmp_path):
    stamp = tmp_path / ".installed"
    demo = dry("demo", stamp)
    assert not any("dali" in ln for ln in demo) and installs(demo)[-1] == "." and demo[-1].endswith("-m dataprep demo")
    assert not any(".[" in ln for ln in demo)  # no extra at all: test, dask, video and DALI are for the tests
    test = dry("test", stamp)
    dali = [".[dali]"] if (platform.system(), platform.machine()) == ("Linux", "x86_64") else []
    extras = [".[test]", ".[dask]", ".[lightning]", ".[video]"] + dali
    assert installs(test)[-len(extras) - 1:] == ["."] + extras and "-m pytest" in test[-1]
    assert installs(dry("test", stamp, "EXTRAS=test"))[-2:] == [".", ".[test]"]


def test_the_stamps_record_what_is_installed(tmp_path):
    stamp = tmp_path / ".installed"
    touch(stamp)  # after `make demo`: the package, no extras
    assert installs(dry("demo", stamp)) == []
    after_demo = installs(dry("test", stamp))
    assert after_demo[:2] == [".[test]", ".[dask]"] and "." not in after_demo  # the extras only, not the package again
    touch(*(tmp_path / f".installed-{e}" for e in ("test", "dask", "lightning", "video", "dali")))  # after `make test`
    assert installs(dry("demo", stamp)) == [] and installs(dry("test", stamp)) == []
    os.utime(stamp, (time.time() + 60, time.time() + 60))  # the package reinstalled (setup.cfg changed): extras again
    assert installs(dry("test", stamp))[:2] == [".[test]", ".[dask]"]
