"""`dataprep verify` of a `cache="disk:DIR"` copy: a copy holds the shard files its loads needed (never the
audit arrays a dataset does not load), so verify checks every file it holds and says it is a partial copy,
counting the files it does not hold; a held file that is damaged is still a problem. Old code: every file
the copy lacks was a problem (6 here, 94 in the issue's pack), an uninterrupted copy included, so a copy
a killed fetch resumed could not be told from a damaged one."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from dataprep import build
from dataprep.cli import main
from dataprep.images.dataset import InMemoryImageDataset
from dataprep.remote.upload import upload_pack
from dataprep.synthetic import write_tree
from dataprep.verify import verify_pack

AUDIT = ("phashes.npy", "digests.npy")  # what an image dataset never loads, so never fetches


@pytest.fixture()
def copy(tmp_path, monkeypatch) -> tuple[Path, str, Path]:
    """(a disk: copy made by one uninterrupted load, the URL it came from, the local pack uploaded there)."""
    monkeypatch.setenv("DATAPREP_CACHE_DIR", str(tmp_path / "cache"))
    tree = write_tree(tmp_path / "tree", classes=2, per_class=4, sizes=((32, 32),), kind="index", ext=".png")
    build.imagenet(tree, tmp_path / "p", size=16, workers=1, shard_size=3)
    url = f"file://{tmp_path}/store/p"
    upload_pack(tmp_path / "p", url)
    ds = InMemoryImageDataset(url, cache=f"disk:{tmp_path / 'nvme'}")
    return Path(ds.pack), url, tmp_path / "p"


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_an_uninterrupted_copy_verifies_and_says_it_is_partial(copy):
    d, url, pack = copy
    held = sorted(p.name for p in (d / "train" / "00000").iterdir())
    assert not set(AUDIT) & set(held) and "images.npy" in held  # the copy leaves the audit arrays out, by design
    rep = verify_pack(d)
    assert rep.ok, rep.problems
    assert rep.copy_of == url and rep.left_out == 3 * len(AUDIT) and rep.shards == 3 and rep.samples == 8
    r = cli("verify", d)
    assert r.exit_code == 0, r.output
    assert f"a partial copy of {url}: 6 files of the pack are not held here" in r.output, r.output
    assert verify_pack(pack).left_out == 0 and verify_pack(pack).copy_of is None  # the pack itself: no copy


def test_a_copy_a_killed_fetch_left_verifies_what_it_holds_and_a_damaged_file_is_found(copy):
    d, url, _ = copy
    cut = d / "train" / "00002" / "images.npy"
    data = cut.read_bytes()
    cut.unlink()
    (d / "train" / "00002" / "images.npy.part").write_bytes(data[: len(data) // 2])  # where a killed fetch stopped
    rep = verify_pack(d)
    assert rep.ok and rep.left_out == 3 * len(AUDIT) + 1, rep.problems
    labels = d / "train" / "00001" / "labels.npy"
    flipped = bytearray(labels.read_bytes())
    flipped[-1] ^= 1
    labels.write_bytes(bytes(flipped))
    r = cli("verify", d)
    assert r.exit_code == 1 and "labels.npy: checksum mismatch" in r.output, r.output
    assert "7 files of the pack are not held here" in r.output and r.output.count("BAD ") == 1
    # the next load resumes the copy: the missing file fetched, the damaged one fetched again; then all verify
    InMemoryImageDataset(url, cache=f"disk:{d.parent}")
    assert verify_pack(d).ok and verify_pack(d).left_out == 3 * len(AUDIT)


def test_a_file_missing_from_a_pack_built_here_is_still_a_problem(copy):
    """Only a copy (its origin file says so) may lack files; a local pack may not."""
    _, _, pack = copy
    os.unlink(pack / "train" / "00000" / "phashes.npy")
    rep = verify_pack(pack)
    assert not rep.ok and any("phashes.npy" in what for _, what in rep.problems) and rep.left_out == 0
