"""`dataprep build webdataset`: tars written by the real webdataset package's TarWriter and by plain tarfile
(plain and gzip, however named), brace patterns and globs, labels from .cls and JSON fields, captions from
.txt and JSON fields, the awkward samples skipped with their reasons, and every built pack read back.

Every image is a flat colour that encodes its sample number (synthetic.index_colour: levels 8 apart), so a
pack that pairs a member with another sample's label, caption or source shows it: `check_images` compares
each stored image with its own colour within TOL and also asserts that the neighbour's colour fails."""
from __future__ import annotations

import io
import json
import tarfile
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest
from click.testing import CliRunner

from dataprep.cli import main
from dataprep.pack.backends import read_manifest
from dataprep.synthetic import index_colour, index_image

# Raw PNG sources through --mode raw keep a flat colour exactly; JPEG (sources or the pack's encoding) moves
# it by a level or two. 3 is far below the 8 that separates neighbouring samples' colours (the control).
TOL = 3


@pytest.fixture
def wds():
    return pytest.importorskip("webdataset", reason="needs the webdataset package (the test extra) to write tars as WebDataset does")


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def png(i: int, h: int = 20, w: int = 24) -> bytes:
    ok, buf = cv2.imencode(".png", cv2.cvtColor(index_image(i, h, w), cv2.COLOR_RGB2BGR))
    assert ok
    return buf.tobytes()


def jpeg(i: int, h: int = 20, w: int = 24) -> bytes:
    ok, buf = cv2.imencode(".jpg", cv2.cvtColor(index_image(i, h, w), cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 95])
    assert ok
    return buf.tobytes()


def members(i: int, key: str | None = None, cls=True, txt=True, js=None, image="png") -> tuple[str, dict[str, bytes]]:
    """Sample i as (key, {extension: bytes}): its image, `.cls` label i % 3, `.txt` caption."""
    m = {image: png(i) if image == "png" else jpeg(i)}
    if cls:
        m["cls"] = str(i % 3).encode()
    if txt:
        m["txt"] = f"caption {i}: ünïcode".encode()
    if js is not None:
        m["json"] = json.dumps(js).encode()
    return (key or f"{i:06d}"), m


def write_tar(path: Path, samples, writer: str = "tarfile", gz: bool = False, wds=None) -> Path:
    """A tar of samples [(key, {ext: bytes})], by webdataset's TarWriter or by tarfile, gzip or plain
    whatever the name says."""
    if writer == "wds":
        with wds.TarWriter(str(path), compress=gz, mtime=0, encoder=False) as w:
            for key, m in samples:
                w.write({"__key__": key, **m})
        return path
    with tarfile.open(path, "w:gz" if gz else "w") as tf:
        for key, m in samples:
            for ext, data in m.items():
                ti = tarfile.TarInfo(f"{key}.{ext}")
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
    return path


def read_pack(pack: Path, split: str = "train"):
    """(dataset, captions or None) of a built pack, read back as a user reads it."""
    import dataprep
    from dataprep.images.build import CAPTION
    from dataprep.serve.cache import open_split

    ds = dataprep.InMemoryImageDataset(pack, split, as_numpy=True)
    captions = None
    if "caption" in ds.manifest["fields"]:
        c = open_split(pack, split, lambda m: {"caption": CAPTION}, kinds=("images",))
        captions = list(CAPTION.strings(c.arrays))
    return ds, captions


def check_images(ds, numbers) -> None:
    """Sample k's pixels are sample numbers[k]'s colour within TOL, and not its neighbour's."""
    assert len(ds) == len(numbers)
    for k, i in enumerate(numbers):
        img = ds.image(k).astype(np.int64)
        assert np.abs(img - index_colour(i)).max() <= TOL, (k, i, ds.sources[k])
        assert np.abs(img - index_colour(i + 1)).max() > TOL  # negative control: another sample's image fails


def skipped(pack: Path, split: str = "train") -> set[tuple[str, str]]:
    return {(s["source"], s["reason"]) for s in read_manifest(pack)["splits"][split]["skipped"]}


BUILD = ("--size", 16, "--mode", "raw", "-j", 1, "--no-progress", "--shard-size", 2)

# (writer, gzip, file name suffix): every way a tar reaches dataprep; the name never decides gzip
TARS = [("wds", False, ".tar"), ("wds", True, ".tar.gz"), ("tarfile", False, ".tar"), ("tarfile", True, ".tar.gz"),
        ("tarfile", True, ".tgz"), ("tarfile", True, ".tar"), ("wds", True, ".tar")]


@pytest.mark.parametrize("writer,gz,suffix", TARS)
def test_tars_build_into_a_pack_that_reads_back_exactly(tmp_path, writer, gz, suffix, request):
    w = request.getfixturevalue("wds") if writer == "wds" else None
    src = tmp_path / "src"
    src.mkdir()
    for t in range(3):  # 5 samples a tar, keys with directories
        write_tar(src / f"shard-{t:03d}{suffix}", [members(5 * t + j, f"part{t}/sub/{5 * t + j:06d}") for j in range(5)],
                  writer, gz, w)
    out = tmp_path / "pack"
    r = run("build", "webdataset", src / f"shard-{{000..002}}{suffix}", "--out", out, *BUILD)
    assert r.exit_code == 0, r.output
    assert "train: 15 of 15 images written" in r.output and "skipped: none" in r.output
    ds, captions = read_pack(out)
    assert list(ds.sources) == [f"shard-{t:03d}{suffix}:part{t}/sub/{5 * t + j:06d}" for t in range(3) for j in range(5)]
    assert ds.labels.tolist() == [i % 3 for i in range(15)] and ds.classes == ["0", "1", "2"]
    assert captions == [f"caption {i}: ünïcode" for i in range(15)]
    check_images(ds, range(15))
    m = read_manifest(out)
    assert m["source"]["layout"] == "webdataset" and m["source"]["tars"] == [f"shard-{t:03d}{suffix}" for t in range(3)]
    # shards never span tars: 5 samples a tar at 2 a shard are shards of 2, 2, 1 in every tar
    assert [s["count"] for s in m["splits"]["train"]["shards"]] == [2, 2, 1] * 3
    r = run("verify", out)
    assert r.exit_code == 0, r.output


def test_zero_padded_ranges_lists_and_globs_name_the_same_tars(tmp_path):
    for t in range(3):
        write_tar(tmp_path / f"s-{t:03d}.tar", [members(3 * t + j) for j in range(3)])
    (tmp_path / "s-extra.txt").write_text("not a shard")
    from dataprep.sources.webdataset import expand

    want = [tmp_path / f"s-{t:03d}.tar" for t in range(3)]
    assert expand([str(tmp_path / "s-{000..002}.tar")]) == want
    assert expand([str(tmp_path / "s-*.tar")]) == want
    assert expand([str(tmp_path / "s-{000,002}.tar"), str(tmp_path / "s-001.tar")]) == [want[0], want[2], want[1]]
    assert expand([str(tmp_path / "s-{002..000}.tar")]) == want[::-1]
    assert expand([str(tmp_path / "s-00[01].tar"), str(tmp_path / "s-*.tar")]) == want[:2] + want[2:]  # each tar once
    out = tmp_path / "pack"
    r = run("build", "webdataset", tmp_path / "s-*.tar", "--out", out, *BUILD)
    assert r.exit_code == 0 and "train: 9 of 9" in r.output, r.output
    assert list(read_pack(out)[0].sources) == [f"s-{t:03d}.tar:{3 * t + j:06d}" for t in range(3) for j in range(3)]


@pytest.mark.parametrize("pattern,named", [
    ("nothing-*.tar", "nothing-*.tar: matches no file"),
    ("s-{0..2}.tar", "s-0.tar: no such tar file"),  # not zero-padded: no s-0.tar here
    ("s-{000..003}.tar", "s-003.tar: no such tar file"),  # one shard of the range is missing: never silently dropped
    ("absent.tar", "absent.tar: no such tar file"),
])
def test_a_pattern_that_misses_is_an_error_naming_it(tmp_path, pattern, named):
    for t in range(3):
        write_tar(tmp_path / f"s-{t:03d}.tar", [members(t)])
    r = run("build", "webdataset", tmp_path / pattern, "--out", tmp_path / "pack", *BUILD)
    assert r.exit_code == 1 and named in r.output, r.output
    assert not (tmp_path / "pack" / "manifest.json").exists()


@pytest.mark.parametrize("field,value,classes", [
    ("label", lambda i: i % 3, ["0", "1", "2"]),
    ("label", lambda i: ["cat", "ant", "bee"][i % 3], ["ant", "bee", "cat"]),  # class names: sorted, labels index them
    ("meta.label", lambda i: i % 3, ["0", "1", "2"]),
])
def test_labels_and_captions_from_json_fields(tmp_path, wds, field, value, classes):
    samples = []
    for i in range(8):
        doc = {"meta": {"label": value(i)}} if "." in field else {"label": value(i)}
        doc["text"] = {"caption": f"from json {i}"}
        doc["url"] = f"http://example.invalid/{i}.png"
        samples.append(members(i, cls=False, txt=(i % 2 == 0), js=doc))  # some .txt beside, which --caption-field overrides
    write_tar(tmp_path / "a.tar", samples[:5], "wds", wds=wds)
    write_tar(tmp_path / "b.tar", samples[5:], "wds", wds=wds)
    out = tmp_path / "pack"
    r = run("build", "webdataset", tmp_path / "a.tar", tmp_path / "b.tar", "--label-field", field,
            "--caption-field", "text.caption", "--out", out, *BUILD)
    assert r.exit_code == 0 and "skipped: none" in r.output, r.output
    ds, captions = read_pack(out)
    assert ds.classes == classes
    assert [ds.classes[x] for x in ds.labels.tolist()] == [str(value(i)) for i in range(8)]
    assert captions == [f"from json {i}" for i in range(8)]
    check_images(ds, range(8))
    m = read_manifest(out)["source"]
    assert m["label_field"] == field and m["caption_field"] == "text.caption"


def test_a_named_label_field_wins_over_cls_and_the_summary_counts_disagreements(tmp_path):
    # .cls says i % 3 for every sample; the .json's names agree for samples 0-2 (ant=0, bee=1, cat=2 once sorted)
    # and disagree for 3-5: an option the user names wins, and the summary says where the two differ
    names = ["ant", "bee", "cat", "cat", "ant", "bee"]
    write_tar(tmp_path / "a.tar", [members(i, js={"label": names[i]}) for i in range(6)])
    out = tmp_path / "pack"
    r = run("build", "webdataset", tmp_path / "a.tar", "--label-field", "label", "--out", out, *BUILD)
    assert r.exit_code == 0, r.output
    ds, captions = read_pack(out)
    assert ds.classes == ["ant", "bee", "cat"] and ds.labels.tolist() == [0, 1, 2, 2, 0, 1]
    assert captions == [f"caption {i}: ünïcode" for i in range(6)]  # .txt stays the default caption
    assert "--label-field label and .cls disagree on 3 of 6 samples" in r.output, r.output
    assert "a.tar:000003: label 'cat' (class 2), .cls 0" in r.output, r.output
    assert read_manifest(out)["source"]["label_disagreements"] == 3


def test_integer_label_field_wins_and_agreeing_cls_says_nothing(tmp_path):
    write_tar(tmp_path / "a.tar", [members(i, js={"label": 7 if i == 1 else i % 3}) for i in range(4)])
    out = tmp_path / "pack"
    r = run("build", "webdataset", tmp_path / "a.tar", "--label-field", "label", "--out", out, *BUILD)
    assert r.exit_code == 0, r.output
    assert read_pack(out)[0].labels.tolist() == [0, 7, 2, 0]
    assert "disagree on 1 of 4" in r.output and "a.tar:000001: label 7, .cls 1" in r.output, r.output
    write_tar(tmp_path / "b.tar", [members(i, js={"label": i % 3}) for i in range(4)])
    r = run("build", "webdataset", tmp_path / "b.tar", "--label-field", "label", "--out", tmp_path / "p2", *BUILD)
    assert r.exit_code == 0 and "disagree" not in r.output, r.output


def test_without_the_named_field_a_sample_has_no_label_even_with_cls(tmp_path):
    samples = [members(i, js={"label": "x"}) for i in range(4)]
    samples[2] = members(2, js={"other": 1})  # a .cls but no `label`: the user asked for `label`
    write_tar(tmp_path / "a.tar", samples)
    out = tmp_path / "pack"
    r = run("build", "webdataset", tmp_path / "a.tar", "--label-field", "label", "--out", out, *BUILD)
    assert r.exit_code == 0 and "3 of 4" in r.output and "1 no label" in r.output, r.output


def test_cls_labels_when_no_field_is_named(tmp_path):
    write_tar(tmp_path / "a.tar", [members(i, js={"label": 7}) for i in range(4)])
    out = tmp_path / "pack"
    assert run("build", "webdataset", tmp_path / "a.tar", "--out", out, *BUILD).exit_code == 0
    assert read_pack(out)[0].labels.tolist() == [0, 1, 2, 0]


def test_unlabelled_and_uncaptioned_tars_build_without_those_fields(tmp_path):
    write_tar(tmp_path / "a.tar", [members(i, cls=False, txt=False) for i in range(4)])
    out = tmp_path / "pack"
    r = run("build", "webdataset", tmp_path / "a.tar", "--out", out, *BUILD)
    assert r.exit_code == 0 and "4 of 4" in r.output, r.output
    ds, captions = read_pack(out)
    assert captions is None and "caption" not in read_manifest(out)["fields"]
    check_images(ds, range(4))


def awkward_tars(d: Path) -> None:
    """good.tar: samples 0-9 of which six cannot be used, one way each; cut.tar: samples 20-24, cut in the
    middle of sample 23's image."""
    samples = [members(i) for i in range(10)]
    samples[1] = ("000001", {"cls": b"1", "txt": b"no image here"})  # no image
    samples[3] = ("000003", {**members(3)[1], "jpg": jpeg(3)})  # two images
    samples[4] = ("000004", {"jpg": b"\x00garbage, not a JPEG at all" * 20, "cls": b"1", "txt": b"x"})  # corrupt image
    samples[5] = ("000005", {"jpg": jpeg(5)[:60], "cls": b"2", "txt": b"x"})  # a JPEG cut after its header
    samples[6] = members(6, cls=False)  # no label, where every other sample has one
    samples[8] = ("000008", {**members(8)[1], "cls": b"seven"})  # a .cls that is not an integer
    write_tar(d / "good.tar", samples)
    full = write_tar(d / "full.tar", [members(i) for i in range(20, 25)]).read_bytes()
    with tarfile.open(d / "full.tar") as tf:
        img = next(m for m in tf.getmembers() if m.name == "000023.png")
    (d / "cut.tar").write_bytes(full[: img.offset_data + img.size // 2])
    (d / "full.tar").unlink()


def test_awkward_samples_are_skipped_each_with_its_reason(tmp_path):
    awkward_tars(tmp_path)
    out = tmp_path / "pack"
    r = run("build", "webdataset", tmp_path / "good.tar", tmp_path / "cut.tar", "--out", out, *BUILD)
    assert r.exit_code == 0, r.output
    reasons = {
        ("good.tar:000001", "no image"), ("good.tar:000003", "two images"), ("good.tar:000004", "not an image"),
        ("good.tar:000006", "no label"), ("good.tar:000008", "bad metadata"), ("cut.tar:000023", "truncated archive"),
    }
    got = skipped(out)
    assert reasons <= got and len(got) == len(reasons) + 1, got
    (cut_jpeg,) = got - reasons  # the JPEG cut after its header: Pillow's reason, whatever it calls it
    assert cut_jpeg[0] == "good.tar:000005"
    records = {s["source"]: s for s in read_manifest(out)["splits"]["train"]["skipped"]}
    assert "000003.jpg" in records["good.tar:000003"]["detail"] and "000003.png" in records["good.tar:000003"]["detail"]
    assert "'seven'" in records["good.tar:000008"]["detail"]
    assert "sample(s) before it are kept" in records["cut.tar:000023"]["detail"]
    kept = [0, 2, 7, 9, 20, 21, 22]  # complete samples before the cut are kept
    assert "train: 7 of 14 images written" in r.output
    for reason in ("1 no image", "1 two images", "1 not an image", "1 no label", "1 bad metadata", "1 truncated archive"):
        assert reason in r.output, r.output  # the summary counts every reason
    ds, captions = read_pack(out)
    assert list(ds.sources) == [f"{'good' if i < 20 else 'cut'}.tar:{i:06d}" for i in kept]
    assert ds.labels.tolist() == [i % 3 for i in kept] and captions == [f"caption {i}: ünïcode" for i in kept]
    check_images(ds, kept)
    assert run("verify", out).exit_code == 0


def test_strict_fails_on_the_corrupt_image_naming_tar_and_key(tmp_path):
    write_tar(tmp_path / "bad.tar", [members(0), ("000001", {"jpg": b"garbage" * 30, "cls": b"1", "txt": b"x"}), members(2)])
    r = run("build", "webdataset", tmp_path / "bad.tar", "--strict", "--out", tmp_path / "pack", *BUILD)
    assert r.exit_code == 1 and "bad.tar:000001" in r.output and "not an image" in r.output, r.output
    assert not (tmp_path / "pack" / "manifest.json").exists()


def tar_members(path: Path) -> list[tuple[str, int, int]]:
    """(name, header offset, end of data) of each member of a plain tar."""
    with tarfile.open(path) as tf:
        return [(m.name, m.offset, m.offset_data + m.size) for m in tf.getmembers()]


@pytest.mark.parametrize("member,into,cut_key", [
    ("000005.png", 512 + 100, 5),  # inside an image's data
    ("000005.cls", 100, 5),  # inside a header: tarfile itself ends the listing here without a word
    ("000005.cls", 0, 5),  # at a header's first byte: the tar simply stops
    ("000005.png", 0, 4),  # before sample 5's first header: what followed might have been sample 4's too
])
def test_a_tar_cut_short_keeps_the_samples_before_the_cut(tmp_path, member, into, cut_key):
    """Samples 0-7, members .png .cls .txt each. Every sample wholly before the cut is kept, but one whose
    members may go on past it; the sample being read at the cut is reported with the tar's truncation, never
    as "no image" or "no caption"."""
    full = write_tar(tmp_path / "full.tar", [members(i) for i in range(8)])
    start = {name: s for name, s, _ in tar_members(full)}[member]
    (tmp_path / "cut.tar").write_bytes(full.read_bytes()[: start + into])
    out = tmp_path / "pack"
    r = run("build", "webdataset", tmp_path / "cut.tar", "--out", out, *BUILD)
    assert r.exit_code == 0, r.output
    assert skipped(out) == {(f"cut.tar:{cut_key:06d}", "truncated archive")}
    assert f"train: {cut_key} of {cut_key + 1} images written" in r.output, r.output
    assert "skipped: 1 truncated archive" in r.output
    ds, captions = read_pack(out)
    assert ds.labels.tolist() == [i % 3 for i in range(cut_key)] and len(captions) == cut_key
    check_images(ds, range(cut_key))


def test_a_damaged_header_is_reported_not_taken_for_the_end(tmp_path):
    full = write_tar(tmp_path / "full.tar", [members(i) for i in range(6)])
    start = dict((n, s) for n, s, _ in tar_members(full))["000004.cls"]
    data = bytearray(full.read_bytes())
    data[start: start + 512] = b"\xff" * 512  # no longer a header, and not the end-of-archive zeros
    (tmp_path / "bad.tar").write_bytes(bytes(data))
    out = tmp_path / "pack"
    assert run("build", "webdataset", tmp_path / "bad.tar", "--out", out, *BUILD).exit_code == 0
    rec = read_manifest(out)["splits"]["train"]["skipped"]
    assert [(s["source"], s["reason"]) for s in rec] == [("bad.tar:000004", "truncated archive")], rec
    assert f"header at byte {start} is damaged" in rec[0]["detail"]
    check_images(read_pack(out)[0], range(4))  # sample 4's .png was read, but not all of it can have been


def test_a_gzip_tar_cut_short_keeps_the_members_that_decompress(tmp_path):
    samples = [members(i) for i in range(8)]
    full = write_tar(tmp_path / "full.tar", samples)
    ends = {name: end for name, _, end in tar_members(full)}
    gz = write_tar(tmp_path / "full.tar.gz", samples, gz=True).read_bytes()
    cut = gz[: len(gz) * 2 // 3]
    (tmp_path / "cut.tar.gz").write_bytes(cut)
    have = len(zlib.decompressobj(31).decompress(cut))  # the bytes of the tar that survive the cut
    whole = [i for i in range(8) if max(ends[f"{i:06d}.{e}"] for e in ("cls", "png", "txt")) <= have]
    assert 2 <= len(whole) < 8 and whole == list(range(len(whole)))
    out = tmp_path / "pack"
    r = run("build", "webdataset", tmp_path / "cut.tar.gz", "--out", out, *BUILD)
    assert r.exit_code == 0, r.output
    ds, captions = read_pack(out)
    n = len(ds)
    # every sample wholly decompressed is kept, but for the last one when the cut fell right after it
    assert n in (len(whole), len(whole) - 1), (n, whole)
    assert skipped(out) == {(f"cut.tar.gz:{n:06d}", "truncated archive")}
    check_images(ds, range(n))
    assert ds.labels.tolist() == [i % 3 for i in range(n)] and captions == [f"caption {i}: ünïcode" for i in range(n)]


@pytest.mark.parametrize("compress", ["gzip", "bz2", "lzma"])
@pytest.mark.parametrize("damage", ["cut", "garbled"])
def test_a_compressed_tar_cut_at_a_header_or_with_a_damaged_one_is_reported(tmp_path, compress, damage):
    """The compressed stream is whole, the tar inside it is cut right at sample 4's first header or has that
    header damaged: tarfile ends the listing there without a word, as for plain tars. Old code: samples 0-3
    listed, nothing skipped (the end-of-archive check ran for plain tars only)."""
    import bz2
    import gzip
    import lzma

    from dataprep.sources.webdataset import scan_webdataset

    full = write_tar(tmp_path / "full.tar", [members(i) for i in range(6)])
    start = dict((n, s) for n, s, _ in tar_members(full))["000004.png"]
    data = bytearray(full.read_bytes())
    if damage == "cut":
        data = data[:start]
    else:
        data[start + 100: start + 160] = b"\xff" * 60
    (tmp_path / "bad.tar.x").write_bytes({"gzip": gzip, "bz2": bz2, "lzma": lzma}[compress].compress(bytes(data)))
    split = scan_webdataset([tmp_path / "bad.tar.x"]).splits[0]
    assert [(s["source"], s["reason"]) for s in split.skipped] == [("bad.tar.x:000003", "truncated archive")], split.skipped
    assert ("ends at byte" if damage == "cut" else f"header at byte {start} is damaged") in split.skipped[0]["detail"]
    assert split.paths == [f"bad.tar.x:{i:06d}" for i in range(3)]


def raw_tar(path: Path, named, gz: bool = False) -> Path:
    """A tar of [(member name, bytes)] exactly in that order (repeats and all)."""
    with tarfile.open(path, "w:gz" if gz else "w") as tf:
        for name, data in named:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return path


@pytest.mark.parametrize("gz", [False, True])
def test_a_key_that_occurs_twice_in_a_tar_is_skipped_with_no_copy_kept(tmp_path, gz):
    """Key 000000 appears twice apart (as `tar -r` appends), 000002's .png twice in a row: `tar:key` would not
    name one sample, and the gzip reader (matching by name) could return the other copy. Old code: both kept,
    000000 with one copy's image and the other's label."""
    from dataprep.sources.webdataset import scan_webdataset

    named = [("000000.png", png(0)), ("000001.png", png(1)), ("000001.cls", b"1"), ("000000.png", png(5)),
             ("000000.cls", b"0"), ("000002.png", png(2)), ("000002.png", png(6)), ("000002.cls", b"2"),
             ("000003.png", png(3)), ("000003.cls", b"0")]
    split = scan_webdataset([raw_tar(tmp_path / "d.tar", named, gz)]).splits[0]
    assert split.paths == ["d.tar:000001", "d.tar:000003"]
    got = {s["source"]: s for s in split.skipped}
    assert [(s["source"], s["reason"]) for s in split.skipped] == [("d.tar:000000", "duplicate key"), ("d.tar:000002", "duplicate key")]
    assert got["d.tar:000000"]["detail"].count("000000.png") == 2 and "000000.cls" in got["d.tar:000000"]["detail"]


@pytest.mark.parametrize("option", ["label_field", "caption_field"])
def test_a_json_field_no_sample_has_is_an_error_naming_it_and_the_keys_there_are(tmp_path, option):
    """A misspelled --label-field / --caption-field. Old code: an unlabelled (uncaptioned) pack, no word."""
    from dataprep.errors import SourceError
    from dataprep.sources.webdataset import scan_webdataset

    tar = write_tar(tmp_path / "j.tar", [members(i, cls=False, txt=False, js={"label": i, "caption": f"c{i}"}) for i in range(3)])
    with pytest.raises(SourceError, match=r"'lable'.*000000.* has keys: label, caption"):
        scan_webdataset([tar], **{option: "lable"})
    assert scan_webdataset([tar], **{option: option.split("_")[0]}).splits[0].paths  # the right name still works


@pytest.mark.parametrize("ext", ["txt", "cls"])
def test_a_caption_or_label_member_over_the_metadata_limit_is_skipped_not_emptied(tmp_path, ext):
    """Old code: an oversized .txt was stored as an empty caption (a .cls as a "not an integer" label)."""
    from dataprep.sources.webdataset import META_LIMIT, scan_webdataset

    big = {0: {"png": png(0), ext: b"1" * (META_LIMIT + 5)}, 1: {"png": png(1), "txt": b"hello", "cls": b"1"}}
    if ext == "txt":
        big[0]["cls"] = b"0"
    split = scan_webdataset([write_tar(tmp_path / "b.tar", [(f"{i:06d}", m) for i, m in big.items()])]).splits[0]
    assert split.paths == ["b.tar:000001"] and split.captions in (["hello"], None)
    (rec,) = split.skipped
    assert (rec["source"], rec["reason"]) == ("b.tar:000000", "bad metadata")
    assert f"000000.{ext} is {META_LIMIT + 5} bytes" in rec["detail"]


def test_names_starting_with_underscores_are_samples_as_in_webdataset(tmp_path, wds):
    """WebDataset skips only its own `__name__` fields (top level, or a `__name__/` directory); `__a.png` and
    `d/__b.png` are samples it yields. Old code: both dropped without a record."""
    from dataprep.sources.webdataset import scan_webdataset

    named = [("__a.png", png(0)), ("d/__b.png", png(1)), ("__meta__/x.png", png(2)), ("__key__", b"k"), ("c.png", png(3))]
    tar = raw_tar(tmp_path / "u.tar", named)
    split = scan_webdataset([tar]).splits[0]
    assert split.paths == ["u.tar:__a", "u.tar:d/__b", "u.tar:c"] and split.skipped == []
    from webdataset import tariterators

    with open(tar, "rb") as f:  # what WebDataset's own tar reading yields from the same tar
        files = tariterators.tar_file_expander([{"url": str(tar), "stream": f}])
        assert [x["__key__"] for x in tariterators.group_by_keys(files)] == ["__a", "d/__b", "c"]


@pytest.mark.parametrize("head", [b"<html>404</html>\n", b"\x28\xb5\x2f\xfd" + bytes(600)])
def test_a_file_that_is_no_tar_at_all_is_an_error_naming_it(tmp_path, head):
    """An HTML page saved as a shard, a zstd tar. Old code: one "truncated archive" skip, and the build passed."""
    write_tar(tmp_path / "s-000.tar", [members(0)])
    (tmp_path / "s-001.tar").write_bytes(head)
    r = run("build", "webdataset", tmp_path / "s-{000..001}.tar", "--out", tmp_path / "pack", *BUILD)
    assert r.exit_code == 1 and "s-001.tar: not a tar file" in r.output, r.output
    assert not (tmp_path / "pack" / "manifest.json").exists()


@pytest.mark.parametrize("gz", [False, True])
def test_a_tar_gone_since_the_listing_fails_the_build_naming_it(tmp_path, gz):
    """Deleted after the listing (or not visible from a Dask worker). Old code: every sample skipped as
    unreadable (or cut), "0 of 3 images written" and a pack."""
    from dataprep.errors import SourceError
    from dataprep.images.build import build_images
    from dataprep.images.settings import ImageSettings
    from dataprep.settings import BuildSettings
    from dataprep.sources.webdataset import scan_webdataset

    tar = write_tar(tmp_path / "gone.tar", [members(i) for i in range(3)], gz=gz)
    source = scan_webdataset([tar])
    tar.unlink()
    with pytest.raises(SourceError, match="gone.tar.*cannot be opened"):
        build_images(source, tmp_path / "pack", BuildSettings(workers=1), ImageSettings(size=16))
    assert not (tmp_path / "pack" / "manifest.json").exists()


@pytest.mark.parametrize("damage", ["cut", "no label"])
def test_strict_refuses_tars_with_a_sample_the_listing_skips(tmp_path, damage):
    """--strict covers the listing's skips too: a tar cut in sample 2's image, or sample 1 with no .cls where the
    others have one (labelled_split's skip). Old code: the build passed, the sample skipped."""
    samples = [members(i, cls=not (damage == "no label" and i == 1)) for i in range(3)]
    full = write_tar(tmp_path / "full.tar", samples)
    start = {n: b for n, b, _ in tar_members(full)}["000002.png"]
    (tmp_path / "t.tar").write_bytes(full.read_bytes()[: start + 600] if damage == "cut" else full.read_bytes())
    r = run("build", "webdataset", tmp_path / "t.tar", "--strict", "--out", tmp_path / "pack", *BUILD)
    want = "t.tar:000002: truncated archive" if damage == "cut" else "t.tar:000001: no label"
    assert r.exit_code == 1 and want in r.output and "--strict" in r.output, r.output
    assert not (tmp_path / "pack" / "manifest.json").exists()
    assert run("build", "webdataset", tmp_path / "t.tar", "--out", tmp_path / "pack", *BUILD).exit_code == 0


def test_no_usable_sample_counts_the_skip_reasons(tmp_path):
    """Old code: only the first record was quoted, hiding that most samples failed for another reason."""
    from dataprep.errors import SourceError
    from dataprep.sources.webdataset import scan_webdataset

    named = [("a.cls", b"1"), ("b.txt", b"x"), ("c.png", png(0)), ("c.jpg", png(1)), ("d.cls", b"0")]
    with pytest.raises(SourceError, match=r"skipped: 3 no image, 1 two images; the first: n.tar:a: "):
        scan_webdataset([raw_tar(tmp_path / "n.tar", named)])


def three_tars(d: Path, gz: bool = False, per: int = 5) -> str:
    d.mkdir(exist_ok=True)
    suffix = ".tar.gz" if gz else ".tar"
    for t in range(3):
        write_tar(d / f"s-{t:03d}{suffix}", [members(per * t + j) for j in range(per)], gz=gz)
    return str(d / f"s-{{000..002}}{suffix}")


def files_of(pack: Path) -> dict:
    return {s["name"]: s["files"] for s in read_manifest(pack)["splits"]["train"]["shards"]}


@pytest.mark.parametrize("gz", [False, True])
def test_resume_reuses_finished_shards_and_rebuilds_a_changed_tar(tmp_path, gz):
    pattern = three_tars(tmp_path / "src", gz)
    out, fresh = tmp_path / "pack", tmp_path / "fresh"
    assert run("build", "webdataset", pattern, "--out", out, *BUILD).exit_code == 0
    first = files_of(out)
    (out / "manifest.json").unlink()  # interrupted: shard 00004 (s-001's second) never finished
    import shutil

    shutil.rmtree(out / "train" / "00004")
    r = run("build", "webdataset", pattern, "--out", out, "--resume", *BUILD)
    assert r.exit_code == 0 and "resumed: 8 of 9 shards were finished and intact, 1 built" in r.output, r.output
    assert files_of(out) == first
    # s-001 rewritten: sample 6 gone, sample 40 (larger, another label and caption) at its end; s-001's 3
    # shards rebuild, the other tars' 6 are reused
    suffix = ".tar.gz" if gz else ".tar"
    changed = [members(i) for i in (5, 7, 8, 9)] + [("000040", {"png": png(40, 30, 30), "cls": b"2", "txt": b"new"})]
    write_tar(tmp_path / "src" / f"s-001{suffix}", changed, gz=gz)
    r = run("build", "webdataset", pattern, "--out", out, "--resume", *BUILD)
    assert r.exit_code == 0 and "resumed: 6 of 9 shards were finished and intact, 3 built" in r.output, r.output
    assert run("build", "webdataset", pattern, "--out", fresh, *BUILD).exit_code == 0
    assert files_of(out) == files_of(fresh)
    ds, captions = read_pack(out)
    numbers = [i for i in range(15) if i != 6]
    numbers.insert(9, 40)
    check_images(ds, numbers)
    assert ds.labels.tolist()[9] == 2 and captions[9] == "new" and ds.sources[9] == f"s-001{suffix}:000040"


@pytest.mark.parametrize("gz", [False, True])
def test_limit_picks_the_same_samples_as_from_folders_and_keeps_each_its_own(tmp_path, gz):
    pattern = three_tars(tmp_path / "src", gz)
    out = tmp_path / "pack"
    r = run("build", "webdataset", pattern, "--out", out, "--limit", 6, *BUILD)
    assert r.exit_code == 0 and "train: 6 of 6 images written" in r.output, r.output
    ds, captions = read_pack(out)
    numbers = [int(s.split(":")[1]) for s in ds.sources]
    assert numbers == sorted(numbers) and len(set(numbers)) == 6 and set(ds.labels.tolist()) == {0, 1, 2}
    from dataprep.sources.listing import spread_by_class

    assert numbers == spread_by_class([i % 3 for i in range(15)], 6).tolist()
    check_images(ds, numbers)
    assert ds.labels.tolist() == [i % 3 for i in numbers] and captions == [f"caption {i}: ünïcode" for i in numbers]
    counts = [s["count"] for s in read_manifest(out)["splits"]["train"]["shards"]]
    tars = [sum(1 for i in numbers if i // 5 == t) for t in range(3)]
    assert counts == [c for n in tars for c in ([2] * (n // 2) + [n % 2] * (n % 2))]  # still never across tars


@pytest.mark.parametrize("gz", [False, True])
def test_two_workers_give_the_same_pack_as_one(tmp_path, gz):
    pattern = three_tars(tmp_path / "src", gz)
    one, two = tmp_path / "one", tmp_path / "two"
    assert run("build", "webdataset", pattern, "--out", one, *BUILD).exit_code == 0
    r = run("build", "webdataset", pattern, "--out", two, *BUILD, "-j", 2)
    assert r.exit_code == 0, r.output
    assert read_manifest(two)["build"]["workers"] == 2
    assert files_of(one) == files_of(two)  # every shard file byte-identical (sha256)
    check_images(read_pack(two)[0], range(15))


class Recording:
    """An engine that runs tasks in this process and keeps what it was given."""

    def __init__(self):
        self.names = []

    def map(self, fn, tasks, on_result=None, names=None):
        self.names += list(names)
        out = []
        for i, t in enumerate(tasks):
            out.append(fn(t))
            if on_result:
                on_result(i, out[-1])
        return out


@pytest.mark.parametrize("gz", [False, True])
def test_a_gzip_tar_of_several_shards_is_read_once(tmp_path, monkeypatch, gz):
    from dataprep.images.build import build_images
    from dataprep.images.settings import ImageSettings
    from dataprep.settings import BuildSettings
    from dataprep.sources.webdataset import scan_webdataset

    source = scan_webdataset([three_tars(tmp_path / "src", gz, per=7)])
    opened = []
    real = tarfile.open

    def counting(name=None, mode="r", *a, **kw):
        opened.append((Path(name if name is not None else kw["fileobj"].name).name, mode))
        return real(name, mode, *a, **kw)

    monkeypatch.setattr(tarfile, "open", counting)
    engine = Recording()
    build_images(source, tmp_path / "pack", BuildSettings(workers=1, shard_size=3), ImageSettings(size=16, mode="raw"),
                 engine=engine)
    suffix = ".tar.gz" if gz else ".tar"
    if gz:  # one task per tar, its 3 shards (3, 3, 1 samples) made in one pass
        assert engine.names == ["train/00000..00002", "train/00003..00005", "train/00006..00008"]
        assert sorted(opened) == [(f"s-{t:03d}{suffix}", "r|*") for t in range(3)]
    else:  # plain tars are read by seeking: one task per shard, tarfile never opened at build time
        assert engine.names == [f"train/{k:05d}" for k in range(9)]
        assert opened == []
    check_images(read_pack(tmp_path / "pack")[0], range(21))
