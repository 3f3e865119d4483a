"""What one source sample may cost: a cap on its bytes (--max-bytes, BuildSettings.max_bytes, recorded in the
manifest), enforced before the bytes are held, for files (folders, lists), tar members (plain and compressed,
whatever their headers declare) and volumes; a sample over it, or one whose reading runs out of memory, is
skipped with its reason and the rest of its tar or folder is built. Also: a .tar.gz whose link member shares
a later file's name builds as the plain tar does; a tar of many unusable members gives a small manifest with
exact counts; a listed path swapped for a symlink out of the root after the listing is not read.

The tar bombs are written by streaming (never held): a .tar.gz of a 1 GiB member (14 MB at gzip level 1 for
3 GiB; 1 GiB keeps this test near 10 s on two cores: old code peaked at 6.2 GB for 3 GiB, ~2 GB for 1 GiB),
and a .tar.gz whose pax header is 512 MiB (old code: 1.59 GB to list a 1.5 GiB one, 0.5 GB for this)."""
from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import tarfile
import tracemalloc
from pathlib import Path

import cv2
import numpy as np
import pytest
from click.testing import CliRunner

from dataprep.cli import main
from dataprep.errors import ImageDecodeError
from dataprep.images.build import build_images
from dataprep.images.settings import ImageSettings
from dataprep.limits import IMAGE_MAX_BYTES
from dataprep.pack.backends import read_manifest
from dataprep.settings import BuildSettings
from dataprep.synthetic import index_image

IMAGE = ImageSettings(size=16, mode="raw")


def png(i: int, h: int = 20, w: int = 24, noise: bool = False) -> bytes:
    img = index_image(i, h, w)
    if noise:
        img = np.random.default_rng(i).integers(0, 256, (h, w, 3), dtype=np.uint8)
    ok, buf = cv2.imencode(".png", cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
    assert ok
    return buf.tobytes()


def add(tf: tarfile.TarFile, name: str, data: bytes, **pax) -> None:
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    if pax:
        ti.pax_headers = {k: str(v) for k, v in pax.items()}
    tf.addfile(ti, io.BytesIO(data))


def samples(tf: tarfile.TarFile, keys) -> None:
    for i in keys:
        add(tf, f"{i:06d}.png", png(i))
        add(tf, f"{i:06d}.cls", b"1")


class Zeros(io.RawIOBase):
    """`n` zero bytes as a file, a MiB at a time (a bomb's member, never held)."""

    def __init__(self, n: int):
        self.left, self.chunk = n, bytes(1 << 20)

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        n = min(self.left if size is None or size < 0 else size, self.left, len(self.chunk))
        self.left -= n
        return self.chunk[:n]


def big_member_tgz(path: Path, size: int) -> Path:
    """Samples 0-2, sample 3 whose image member is `size` zero bytes, samples 4-6: a .tar.gz, gzip level 1."""
    with tarfile.open(path, "w:gz", compresslevel=1) as tf:
        tf.copybufsize = 1 << 20
        samples(tf, range(3))
        ti = tarfile.TarInfo("000003.png")
        ti.size = size
        tf.addfile(ti, Zeros(size))
        add(tf, "000003.cls", b"1")
        samples(tf, range(4, 7))
    return path


def pax_bomb_tgz(path: Path, size: int) -> Path:
    """Samples 0-2, then a pax extended header whose data is `size` zero bytes, describing sample 3's image,
    then samples 3-6: a .tar.gz (what tarfile reads whole to parse that header)."""

    def blocks(keys) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
            samples(tf, keys)
        b = buf.getvalue()
        while b.endswith(bytes(512)):  # drop the end-of-archive blocks: more members follow
            b = b[:-512]
        return b

    with gzip.open(path, "wb", compresslevel=1) as g:
        g.write(blocks(range(3)))
        x = tarfile.TarInfo("././@PaxHeader")
        x.type, x.size = tarfile.XHDTYPE, size
        g.write(x.tobuf(format=tarfile.USTAR_FORMAT))
        z, left = bytes(1 << 20), size + (-size % 512)
        while left:
            n = min(left, len(z))
            g.write(z[:n])
            left -= n
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
            samples(tf, range(3, 7))
        g.write(buf.getvalue())
    return path


CHILD = r"""
import json, resource, sys
from dataprep.images.build import build_images
from dataprep.images.settings import ImageSettings
from dataprep.pack.backends import read_manifest
from dataprep.settings import BuildSettings
from dataprep.sources.webdataset import scan_webdataset

tar, out = sys.argv[1], sys.argv[2]
src = scan_webdataset([tar])
got = {"listed": src.splits[0].paths, "listing_skipped": [[s["source"], s["reason"]] for s in src.splits[0].skipped]}
if out != "-":
    build_images(src, out, BuildSettings(workers=1), ImageSettings(size=16, mode="raw"))
    m = read_manifest(out)["splits"]["train"]
    got.update(count=m["count"], skipped=[[s["source"], s["reason"]] for s in m["skipped"]])
try:  # this process's own peak: ru_maxrss would count the parent's, inherited through (v)fork and exec
    with open("/proc/self/status") as f:
        peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) * 1024
except OSError:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
got["peak_mb"] = peak / 2**20
print("RESULT" + json.dumps(got))
"""


def in_child(tar: Path, out: Path | None) -> dict:
    """List (and build, on one worker: in that process) `tar` in a fresh interpreter; what it got and its peak RSS."""
    r = subprocess.run([sys.executable, "-c", CHILD, str(tar), str(out) if out else "-"], capture_output=True, text=True,
                       timeout=600)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")]
    assert r.returncode == 0 and lines, r.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT"):])


# --- 1. the byte cap -------------------------------------------------------------------------------------


def test_a_gzip_tar_member_of_a_gigabyte_is_skipped_in_bounded_memory_and_the_rest_built(tmp_path):
    """Old code: the member was read whole at build time (6.2 GB peak for 3 GiB) and then failed to decode."""
    tar = big_member_tgz(tmp_path / "big.tar.gz", 1 << 30)
    assert tar.stat().st_size < 20 << 20
    got = in_child(tar, tmp_path / "pack")
    assert got["peak_mb"] < 500, got
    assert got["count"] == 6
    assert got["skipped"] == [["big.tar.gz:000003", "too large"]]
    assert "big.tar.gz:000004" in got["listed"] and "big.tar.gz:000006" in got["listed"]


def test_a_pax_header_of_half_a_gigabyte_costs_bounded_memory_to_list(tmp_path):
    """Old code: tarfile read the whole pax header into memory (1.59 GB for a 1.5 GiB one in a 1.6 MB .tar.gz)."""
    tar = pax_bomb_tgz(tmp_path / "pax.tar.gz", 512 << 20)
    got = in_child(tar, None)
    assert got["peak_mb"] < 200, got
    assert got["listed"] == [f"pax.tar.gz:{i:06d}" for i in (0, 1, 2, 4, 5, 6)]  # the rest of the tar is listed
    assert got["listing_skipped"] == [["pax.tar.gz:000003", "bad header"]]


@pytest.mark.parametrize("gz", [False, True])
def test_a_tar_member_over_the_cap_is_skipped_from_its_declared_size(tmp_path, gz):
    """--max-bytes 2KiB: a 5 KB image (its size also declared by a pax `size` record in the plain tar) is
    skipped, never read; the rest is built; the manifest records the cap. Old code: no --max-bytes."""
    tar = tmp_path / ("t.tar.gz" if gz else "t.tar")
    big = png(9, 64, 64, noise=True)
    assert len(big) > 4096
    with tarfile.open(tar, "w:gz" if gz else "w", format=tarfile.PAX_FORMAT) as tf:
        samples(tf, range(2))
        add(tf, "000002.png", big, **({} if gz else {"size": len(big)}))
        add(tf, "000002.cls", b"1")
        samples(tf, range(3, 5))
    out = tmp_path / "pack"
    r = CliRunner().invoke(main, ["build", "webdataset", str(tar), "--out", str(out), "--size", "16", "--mode", "raw",
                                  "-j", "1", "--max-bytes", "2KiB"])
    assert r.exit_code == 0, r.output
    m = read_manifest(out)
    assert m["settings"]["max_bytes"] == 2048
    sp = m["splits"]["train"]
    assert sp["count"] == 4
    assert [(s["source"], s["reason"]) for s in sp["skipped"]] == [(f"{tar.name}:000002", "too large")]
    assert "2,048-byte cap" in sp["skipped"][0]["detail"]


@pytest.mark.parametrize("gz", [False, True])
def test_the_build_reads_no_member_over_its_readers_cap(tmp_path, gz):
    """Listed under one cap, read under a smaller one (the tar rewritten in between, or the API's reader): the
    member is a skip, not read. Old code: TarReader took no cap."""
    from dataclasses import replace

    from dataprep.sources.webdataset import scan_webdataset

    tar = tmp_path / ("t.tar.gz" if gz else "t.tar")
    with tarfile.open(tar, "w:gz" if gz else "w") as tf:
        samples(tf, range(3))
    split = scan_webdataset([tar]).splits[0]
    reader = replace(split.reader, max_bytes=len(png(1)) - 1)
    got = list(reader.open(str(tar.resolve().parent), split.paths, split.locators))
    want = [len(png(i)) > len(png(1)) - 1 for i in range(3)]
    assert [isinstance(g, ImageDecodeError) and g.reason == "too large" for g in got] == want
    assert [g for g, w in zip(got, want) if not w] == [png(i) for i, w in enumerate(want) if not w]


def test_files_over_the_cap_in_a_folder_a_list_and_volumes_are_skipped_before_they_are_read(tmp_path):
    """A 257 MiB file (sparse: it costs no disk) among images, with the default cap; a list's and a volume
    build's under --max-bytes. Old code: the folder's file was read whole (and skipped as not an image); a
    file larger than RAM ended the build with a bare MemoryError."""
    from dataprep.sources import scan_folder

    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    for i in range(3):
        (src / f"{i}.png").write_bytes(png(i))
    with open(src / "huge.png", "wb") as f:
        f.truncate(IMAGE_MAX_BYTES + (1 << 20))
    source = scan_folder(tmp_path / "src")
    build_images(source, tmp_path / "p1", BuildSettings(workers=1), IMAGE)
    sp = read_manifest(tmp_path / "p1")["splits"]["train"]
    assert sp["count"] == 3 and [(s["source"], s["reason"]) for s in sp["skipped"]] == [("a/huge.png", "too large")]

    big = png(7, 64, 64, noise=True)
    (src / "big.png").write_bytes(big)
    (tmp_path / "list.csv").write_text("path,label\n" + "".join(f"src/a/{n},1\n" for n in ("0.png", "big.png", "1.png")))
    r = CliRunner().invoke(main, ["build", "list", str(tmp_path / "list.csv"), "--out", str(tmp_path / "p2"), "--size", "16",
                                  "--mode", "raw", "-j", "1", "--max-bytes", str(len(big) - 1)])
    assert r.exit_code == 0, r.output
    m = read_manifest(tmp_path / "p2")
    assert m["settings"]["max_bytes"] == len(big) - 1
    assert [(s["source"], s["reason"]) for s in m["splits"]["train"]["skipped"]] == [("src/a/big.png", "too large")]
    assert m["splits"]["train"]["count"] == 2

    vols = tmp_path / "vols"
    vols.mkdir()
    np.save(vols / "small.npy", np.zeros((2, 4, 4), np.uint8))
    np.save(vols / "large.npy", np.zeros((8, 32, 32), np.uint16))
    r = CliRunner().invoke(main, ["build", "volumes", str(vols), "--out", str(tmp_path / "p3"), "-j", "1", "--max-bytes", "1KiB"])
    assert r.exit_code == 0, r.output
    m = read_manifest(tmp_path / "p3")
    assert m["settings"]["max_bytes"] == 1024
    assert m["splits"]["train"]["count"] == 1
    assert [(s["source"], s["reason"]) for s in m["splits"]["train"]["skipped"]] == [("large.npy", "too large")]


def test_the_default_cap_is_recorded_and_a_bad_one_refused(tmp_path, index_tree):
    r = CliRunner().invoke(main, ["build", "folder", str(index_tree / "train"), "--out", str(tmp_path / "p"), "--size", "16",
                                  "-j", "1"])
    assert r.exit_code == 0, r.output
    assert read_manifest(tmp_path / "p")["settings"]["max_bytes"] == IMAGE_MAX_BYTES
    r = CliRunner().invoke(main, ["build", "folder", str(index_tree / "train"), "--out", str(tmp_path / "q"), "--max-bytes", "lots"])
    assert r.exit_code == 2 and "not a byte count" in r.output
    assert BuildSettings(max_bytes=5).to_dict()["max_bytes"] == 5
    with pytest.raises(Exception, match="max_bytes"):
        BuildSettings(max_bytes=0)


def test_running_out_of_memory_reading_one_file_is_a_skip_naming_it(tmp_path, monkeypatch):
    """Old code: the MemoryError ended the build, naming no file."""
    from dataprep.sources import listing, scan_folder

    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    for i in range(3):
        (src / f"{i}.png").write_bytes(png(i))
    real = os.fdopen

    class Starved:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.f.close()

        def read(self, n=-1):
            raise MemoryError

    def fdopen(fd, *a, **kw):
        f = real(fd, *a, **kw)
        return Starved(f) if os.readlink(f"/proc/self/fd/{fd}").endswith("1.png") else f

    if not os.path.exists("/proc/self/fd"):
        pytest.skip("needs /proc/self/fd to pick the file")
    monkeypatch.setattr(listing.os, "fdopen", fdopen)
    build_images(scan_folder(tmp_path / "src"), tmp_path / "p", BuildSettings(workers=1), IMAGE)
    sp = read_manifest(tmp_path / "p")["splits"]["train"]
    assert sp["count"] == 2 and [(s["source"], s["reason"]) for s in sp["skipped"]] == [("a/1.png", "too large")]


@pytest.mark.parametrize("gz", [False, True])
def test_running_out_of_memory_reading_one_tar_member_is_a_skip_and_the_rest_is_built(tmp_path, monkeypatch, gz):
    from dataprep.sources import webdataset

    tar = tmp_path / ("t.tar.gz" if gz else "t.tar")
    with tarfile.open(tar, "w:gz" if gz else "w") as tf:
        samples(tf, range(4))
    source = webdataset.scan_webdataset([tar])
    at = source.splits[0].locators[1][2]  # 000001.png's data offset
    if gz:
        real = tarfile.TarFile.extractfile

        def extractfile(self, m):
            f = real(self, m)
            if m.name == "000001.png":
                f.read = lambda *a: (_ for _ in ()).throw(MemoryError())
            return f

        monkeypatch.setattr(tarfile.TarFile, "extractfile", extractfile)
    else:
        real = webdataset._open_listed

        class Starved:
            def __init__(self, f):
                self.f = f

            def __enter__(self):
                return self

            def __exit__(self, *a):
                self.f.close()

            def seek(self, n):
                return self.f.seek(n)

            def read(self, n=-1):
                if self.f.tell() == at:
                    raise MemoryError
                return self.f.read(n)

        def opened(path):
            return Starved(real(path))

        monkeypatch.setattr(webdataset, "_open_listed", opened)
    build_images(source, tmp_path / "p", BuildSettings(workers=1), IMAGE)
    sp = read_manifest(tmp_path / "p")["splits"]["train"]
    assert [(s["source"], s["reason"]) for s in sp["skipped"]] == [(f"{tar.name}:000001", "too large")]
    assert sp["count"] == 3


# --- 2. a link member named as a later file --------------------------------------------------------------


@pytest.mark.parametrize("link", [tarfile.SYMTYPE, tarfile.LNKTYPE])
def test_a_gzip_tar_whose_link_member_shares_a_later_files_name_builds_as_the_plain_tar_does(tmp_path, link):
    """Old code: the .tar.gz reader took the link for the file (matching by name), could not extract it, and
    skipped that sample and every later one as "truncated archive"; the plain tar kept them all."""
    packs = {}
    for gz in (False, True):
        tar = tmp_path / ("t.tar.gz" if gz else "t.tar")
        with tarfile.open(tar, "w:gz" if gz else "w") as tf:
            samples(tf, range(2))
            ti = tarfile.TarInfo("000002.png")
            ti.type, ti.linkname = link, "000000.png"
            tf.addfile(ti)
            samples(tf, range(2, 5))
        out = tmp_path / f"p{int(gz)}"
        r = CliRunner().invoke(main, ["build", "webdataset", str(tar), "--out", str(out), "--size", "16", "--mode", "raw", "-j", "1"])
        assert r.exit_code == 0, r.output
        packs[gz] = read_manifest(out)["splits"]["train"]
    assert packs[False]["count"] == 5 and packs[False]["skipped"] == []
    assert packs[True]["count"] == 5 and packs[True]["skipped"] == []


# --- 3. a tar of many unusable members ------------------------------------------------------------------

N_TINY = 5_000


@pytest.fixture(scope="module")
def tiny_tar(tmp_path_factory) -> Path:
    """3 samples, then N_TINY one-byte .txt members of their own keys (no image)."""
    tar = tmp_path_factory.mktemp("tiny") / "tiny.tar.gz"
    with tarfile.open(tar, "w:gz", compresslevel=1) as tf:
        samples(tf, range(3))
        ti = tarfile.TarInfo("x")
        ti.size = 1
        for i in range(N_TINY):
            ti.name = f"t{i:07d}.txt"
            tf.addfile(ti, io.BytesIO(b"x"))
    return tar


def test_many_unusable_members_are_listed_in_bounded_memory_with_exact_counts(tiny_tar):
    """Old code: every member was held as groups (~880 B each at peak) and one skip record kept per member."""
    from dataprep.sources.listing import SKIP_RECORDS, skip_counts
    from dataprep.sources.webdataset import scan_webdataset

    tracemalloc.start()
    try:
        split = scan_webdataset([tiny_tar]).splits[0]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 250 * N_TINY, peak  # old code: 17.7 MB for 20,000
    assert len(split.paths) == 3
    assert len(split.skipped) == SKIP_RECORDS + 1
    assert skip_counts(split.skipped) == {"no image": N_TINY}
    rest = split.skipped[-1]
    assert rest["count"] == N_TINY - SKIP_RECORDS and f"and {N_TINY - SKIP_RECORDS:,} more no image" in rest["detail"]


def test_many_unusable_members_give_a_small_manifest_whose_records_count_them_all(tiny_tar, tmp_path):
    """Old code: 2.3 MB of manifest for 20,000 members (119 MB for a million)."""
    from dataprep.sources.listing import skip_counts
    from dataprep.sources.webdataset import scan_webdataset

    out = tmp_path / "p"
    build_images(scan_webdataset([tiny_tar]), out, BuildSettings(workers=1), IMAGE)
    assert (out / "manifest.json").stat().st_size < 300_000
    sp = read_manifest(out)["splits"]["train"]
    assert sp["count"] == 3
    assert skip_counts(sp["skipped"]) == {"no image": N_TINY}


def test_the_summary_counts_every_unusable_member(tiny_tar, tmp_path):
    from dataprep.sources.webdataset import scan_webdataset

    out = tmp_path / "p"
    summary = build_images(scan_webdataset([tiny_tar]), out, BuildSettings(workers=1), IMAGE)
    assert read_manifest(out)["splits"]["train"]["skipped_by_reason"] == {"no image": N_TINY}
    assert summary.splits[0].planned == N_TINY + 3 and summary.splits[0].skipped == {"no image": N_TINY}


# --- 4. a listed path swapped for a symlink out of the root --------------------------------------------


@pytest.mark.parametrize("swap", ["file", "directory"])
def test_a_listed_path_swapped_for_a_symlink_out_of_the_root_is_not_read(tmp_path, swap):
    """`build list` refused paths leaving the root at listing; the build followed whatever the path was
    when it read it. Old code: the outside file's pixels were in the pack."""
    from dataprep.sources.pathlist import scan_list

    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    for i in range(3):
        (root / "sub" / f"{i}.png").write_bytes(png(i))
    (root / "kept").mkdir()  # one image the swap leaves alone: a build storing nothing is refused (NothingStored)
    (root / "kept" / "3.png").write_bytes(png(3))
    (outside / "1.png").write_bytes(png(40))  # the secret: another colour
    (root / "list.csv").write_text("".join(f"sub/{i}.png,0\n" for i in range(3)) + "kept/3.png,0\n")
    source = scan_list(root / "list.csv")
    assert len(source.splits[0].paths) == 4
    if swap == "file":
        (root / "sub" / "1.png").unlink()
        (root / "sub" / "1.png").symlink_to(outside / "1.png")
    else:
        for i in (0, 2):
            (outside / f"{i}.png").write_bytes(png(40 + i))
        (root / "sub").rename(root / "sub.old")
        (root / "sub").symlink_to(outside)
    build_images(source, tmp_path / "p", BuildSettings(workers=1), IMAGE)
    sp = read_manifest(tmp_path / "p")["splits"]["train"]
    skipped = {s["source"]: s for s in sp["skipped"]}
    want = {"sub/1.png"} if swap == "file" else {"sub/0.png", "sub/1.png", "sub/2.png"}
    assert set(skipped) == want and all(s["reason"] == "outside the root" for s in skipped.values())
    assert str(outside) in skipped["sub/1.png"]["detail"]
    assert sp["count"] == 4 - len(want)


def test_a_listed_symlink_inside_the_root_is_still_read(tmp_path):
    """The control: a symlink the listing accepted (it stays under the root) builds."""
    from dataprep.sources.pathlist import scan_list

    root = tmp_path / "root"
    root.mkdir()
    (root / "0.png").write_bytes(png(0))
    (root / "1.png").symlink_to(root / "0.png")
    (root / "list.csv").write_text("0.png,0\n1.png,0\n")
    build_images(scan_list(root / "list.csv"), tmp_path / "p", BuildSettings(workers=1), IMAGE)
    sp = read_manifest(tmp_path / "p")["splits"]["train"]
    assert sp["count"] == 2 and sp["skipped"] == []


def test_a_cap_set_only_in_the_python_settings_is_enforced(tmp_path):
    """BuildSettings(max_bytes=...) alone (no scan option): the build's readers take it, and the manifest
    records it. Without images/build.py passing it to the reader, the file over it would be built."""
    from dataprep.sources import scan_folder

    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    small, big = png(1), png(7, 64, 64, noise=True)
    (src / "0.png").write_bytes(small)
    (src / "1.png").write_bytes(big)
    build_images(scan_folder(tmp_path / "src"), tmp_path / "p", BuildSettings(workers=1, max_bytes=len(big) - 1), IMAGE)
    m = read_manifest(tmp_path / "p")
    assert m["settings"]["max_bytes"] == len(big) - 1 and m["splits"]["train"]["count"] == 1
    assert [(s["source"], s["reason"]) for s in m["splits"]["train"]["skipped"]] == [("a/1.png", "too large")]
