"""--out naming a symlink: a build (any format), `dataprep convert` and the directories dataprep trusts write
through a symlink only when it is ours and sits in a directory nobody else can write. Old code followed a
symlink another user planted in a sticky folder (/tmp): the build wrote where it pointed and --overwrite
replaced the pack there (another user's, or, run as root, any pack on the machine).

Root owns every link it makes, so the planted link is shown two ways: a link in a sticky, world-writable
folder (refused whoever owns it: whoever writes there could have planted it), and, as root, a link handed
to another uid with lchown in a private folder."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from dataprep import build
from dataprep.cli import main
from dataprep.errors import DataprepError
from dataprep.safe_paths import UnsafeDirectory, check_dir, check_links


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def digest(root: Path) -> dict[str, str]:
    """Every file under `root` (or `root` itself) by its sha256: what must not change."""
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@pytest.fixture()
def places(tmp_path, index_tree):
    """A victim's pack (npy and hdf5) in a private folder, a sticky world-writable folder (as /tmp), and
    the source tree."""
    private = tmp_path / "victim"
    private.mkdir(mode=0o700)
    build.folder(index_tree / "train", private / "pack", size=16, workers=1)
    build.folder(index_tree / "train", private / "pack.h5", size=16, workers=1, fmt="hdf5")
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    return {"private": private, "shared": shared, "src": index_tree / "train"}


@pytest.mark.parametrize("fmt", ["npy", "hdf5"])
def test_an_out_symlinked_from_a_sticky_folder_is_refused_and_what_it_points_at_kept(fmt, places):
    target = places["private"] / ("pack" if fmt == "npy" else "pack.h5")
    link = places["shared"] / ("planted" if fmt == "npy" else "planted.h5")
    link.symlink_to(target)
    before = digest(target)
    r = cli("build", "folder", places["src"], "--size", 24, "-j", 1, "--format", fmt, "--out", link, "--overwrite", "--no-progress")
    assert r.exit_code == 1, r.output
    assert "is a symlink (to" in r.output and "which other users can write (mode 1777)" in r.output, r.output
    assert "give the real path" in r.output
    with pytest.raises(UnsafeDirectory, match=r"is a symlink .* in .*shared, which other users can write"):
        build.folder(places["src"], link, size=24, workers=1, fmt=fmt, overwrite=True)
    assert digest(target) == before and link.is_symlink()


def test_convert_to_an_out_symlinked_from_a_sticky_folder_is_refused(places):
    link = places["shared"] / "planted"
    link.symlink_to(places["private"] / "pack")
    before = digest(places["private"] / "pack")
    r = cli("convert", places["private"] / "pack.h5", "--to", "npy", "--out", link, "--overwrite")
    assert r.exit_code == 1 and "is a symlink (to" in r.output, r.output
    assert digest(places["private"] / "pack") == before


def test_a_folder_above_out_symlinked_from_a_sticky_folder_is_refused(places):
    (places["shared"] / "dir").symlink_to(places["private"])
    with pytest.raises(UnsafeDirectory, match=r"the directory .*shared/dir above this output is a symlink"):
        build.folder(places["src"], places["shared"] / "dir" / "new", size=24, workers=1)
    assert not (places["private"] / "new").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="lchown to another uid needs root")
def test_as_root_a_symlink_another_uid_owns_is_refused_even_in_a_private_folder(places, tmp_path):
    """Root's own check: st_uid of a planted link is its planter's (here handed over with lchown)."""
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    link = mine / "planted"
    link.symlink_to(places["private"] / "pack")
    os.lchown(link, 12345, 12345)
    before = digest(places["private"] / "pack")
    r = cli("build", "folder", places["src"], "--size", 24, "-j", 1, "--out", link, "--overwrite", "--no-progress")
    assert r.exit_code == 1 and "that uid 12345 owns, not you (uid 0)" in r.output, r.output
    with pytest.raises(UnsafeDirectory, match="uid 12345 owns"):
        check_dir(link, "cache directory")
    assert digest(places["private"] / "pack") == before


def test_our_symlink_in_a_private_folder_is_followed_as_before(places, tmp_path):
    """Not a blanket refusal: a link of ours where only we can write still names the output."""
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    (mine / "out").symlink_to(places["private"] / "pack")
    s = build.folder(places["src"], mine / "out", size=24, workers=1, overwrite=True)
    assert s.written == 18 and (places["private"] / "pack" / "manifest.json").is_file()
    assert check_links(mine / "out") == mine / "out"
    with pytest.raises(DataprepError):  # the sticky folder's link of ours is refused all the same
        (places["shared"] / "mine").symlink_to(places["private"] / "pack")
        check_links(places["shared"] / "mine")
