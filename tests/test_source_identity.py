"""The same photos through every source give the same pack: class folders (`build folder`), WebDataset
tars (`build webdataset`, written by webdataset's TarWriter), Parquet (`build parquet`, written by pyarrow:
a bytes column, a label column, a caption column) and a path list (`build list`). Every sample's stored
image (raw pixels, or JPEG bytes: re-encoded ones and source JPEGs kept as they were), label, class list,
caption (where the source carries one: folders have none) and skip record is the same, in the same order;
so are the shard files' checksums, where the shards hold the same samples.

The photos are the first 10 of 4 of the shared corpus's classes (40 real JPEGs of mixed sizes)."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from dataprep.cli import main
from dataprep.images.codec import with_restarts
from dataprep.pack.backends import read_manifest

from .conftest import corpus_dir

pytestmark = [pytest.mark.corpus, pytest.mark.slow]  # 8 builds of 40 photos: about 8 s together

CLASSES, PER_CLASS = 4, 10
# raw pixels at 64 (reduced-scale decode, area resize); JPEG at 400 on the shorter side: the corpus's 500x375
# and 333x250 photos need no resize and are kept byte for byte, 640x480 and 500x500 ones are re-encoded
OPTIONS = {"raw": ("--size", 64, "--mode", "raw"), "encoded": ("--size", 400, "--mode", "encoded", "--keep-jpeg")}
COMMON = ("-j", 1, "--no-progress", "--shard-size", PER_CLASS)  # a shard per class: every source cuts the same shards


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def caption(rel: str) -> str:
    cls, name = rel.split("/")
    return f"a {cls} picture, «{name}»"


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """{source name: (build arguments, each sample's path in the folder order)}: the same 40 photos as class
    folders (links to the corpus), tars, Parquet files and a list of the corpus's own files."""
    from dataprep.sources import scan_folder

    corpus = corpus_dir("images", "train")
    d = tmp_path_factory.mktemp("identity")
    tree = d / "folders"
    for cls in sorted(p.name for p in corpus.iterdir() if p.is_dir())[:CLASSES]:
        (tree / cls).mkdir(parents=True)
        for f in sorted((corpus / cls).glob("*.JPEG"))[:PER_CLASS]:
            (tree / cls / f.name).symlink_to(f)
    order = scan_folder(tree).splits[0].paths  # the folder source's order, which every other source follows
    assert len(order) == CLASSES * PER_CLASS
    by_class: dict[str, list[str]] = {}
    for rel in order:
        by_class.setdefault(rel.split("/")[0], []).append(rel)
    return {"folder": (("folder", tree), order), **_tars(d, tree, by_class), **_parquet(d, tree, by_class),
            **_list(d, corpus, order)}


def _tars(d: Path, tree: Path, by_class) -> dict:
    wds = pytest.importorskip("webdataset", reason="needs the webdataset package (the test extra) to write the tars")
    (d / "tars").mkdir()
    for k, (cls, rels) in enumerate(by_class.items()):
        with wds.TarWriter(str(d / "tars" / f"part-{k:03d}.tar"), mtime=0, encoder=False) as w:
            for rel in rels:
                key = rel.rsplit(".", 1)[0]  # lomiri/abc.JPEG -> key lomiri/abc, member lomiri/abc.jpg
                w.write({"__key__": key, "jpg": (tree / rel).read_bytes(), "json": json.dumps({"label": cls}).encode(),
                         "txt": caption(rel).encode()})
    return {"webdataset": (("webdataset", d / "tars" / f"part-{{000..{len(by_class) - 1:03d}}}.tar", "--label-field", "label"),
                           None)}


def _parquet(d: Path, tree: Path, by_class) -> dict:
    pa = pytest.importorskip("pyarrow", reason="needs pyarrow (the test extra) to write the Parquet files")
    import pyarrow.parquet as pq

    (d / "parquet").mkdir()
    classes = list(by_class)
    for half in range(2):  # two files of two classes, a row group per class
        rels = [r for cls in classes[2 * half: 2 * half + 2] for r in by_class[cls]]
        table = pa.table({"image": pa.array([(tree / r).read_bytes() for r in rels], pa.binary()),
                          "label": [r.split("/")[0] for r in rels], "caption": [caption(r) for r in rels]})
        pq.write_table(table, d / "parquet" / f"part-{half}.parquet", row_group_size=PER_CLASS)
    return {"parquet": (("parquet", d / "parquet" / "part-*.parquet", "--label-column", "label", "--caption-column", "caption"),
                        None)}


def _list(d: Path, corpus: Path, order) -> dict:
    """A list of the same files relative to the corpus itself (the folder tree's links would lead out of
    the root, which a list refuses)."""
    with open(d / "list.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["path", "label", "caption"])
        for rel in order:
            w.writerow([rel, rel.split("/")[0], caption(rel)])
    return {"list": (("list", d / "list.csv", "--root", corpus), None)}


@pytest.fixture(scope="module", params=list(OPTIONS))
def packs(sources, tmp_path_factory, request):
    """Every source built with the same options: {source name: pack}."""
    d = tmp_path_factory.mktemp(f"packs-{request.param}")
    out = {}
    for name, (args, _) in sources.items():
        pack = d / name
        r = run("build", *args, "--out", pack, *OPTIONS[request.param], *COMMON)
        assert r.exit_code == 0, (name, r.output)
        out[name] = pack
    return request.param, out


def read(pack: Path):
    import dataprep
    from dataprep.images.build import CAPTION
    from dataprep.serve.cache import open_split

    ds = dataprep.InMemoryImageDataset(pack, as_numpy=True, decode="none")
    captions = None
    if "caption" in ds.manifest["fields"]:
        captions = list(CAPTION.strings(open_split(pack, "train", lambda m: {"caption": CAPTION}, kinds=("images",)).arrays))
    return ds, captions


def origin(name: str, source: str, order: list[str]) -> str:
    """The folder path a sample of source `name` was made from, from what its pack records."""
    if name in ("folder", "list"):
        return source
    where, within = source.rsplit(":", 1)
    if name == "webdataset":
        return next(r for r in order if r.rsplit(".", 1)[0] == within)
    part, row = int(where.split("-")[1].split(".")[0]), int(within)  # part-H.parquet:ROW: classes 2H, 2H+1
    return order[2 * PER_CLASS * part + row]


def test_every_source_gives_the_same_images_labels_and_captions(sources, packs):
    mode, built = packs
    order = sources["folder"][1]
    folder, none = read(built["folder"])
    assert none is None  # class folders carry no caption
    n = len(folder)
    assert n >= len(order) - 2, read_manifest(built["folder"])["splits"]["train"]["skipped"]  # the corpus is photos
    want_images = [bytes(folder.stored(i)) for i in range(n)]
    kept = read_manifest(built["folder"])["splits"]["train"]["kept_jpeg"]
    if mode == "encoded":  # both ways of storing a JPEG are compared: kept as it was, and re-encoded
        assert 0 < kept < n
        # kept: the source's bytes, restart markers added where the compiled part is (codec.with_restarts)
        assert sum(want_images[i] == with_restarts((sources["folder"][0][1] / folder.sources[i]).read_bytes())
                   for i in range(n)) == kept
    want_skipped = sorted((s["source"], s["reason"]) for s in read_manifest(built["folder"])["splits"]["train"]["skipped"])
    captions_seen = []
    for name in ("webdataset", "parquet", "list"):
        ds, captions = read(built[name])
        assert len(ds) == n, name
        assert [origin(name, s, order) for s in ds.sources] == list(folder.sources), name  # the same samples, in order
        assert ds.classes == folder.classes == sorted(folder.classes), name
        assert ds.labels.tolist() == folder.labels.tolist() and ds.labels.dtype == folder.labels.dtype, name
        assert ds.shapes.tolist() == folder.shapes.tolist(), name
        same = [bytes(ds.stored(i)) == want_images[i] for i in range(n)]
        assert all(same), (name, [folder.sources[i] for i, s in enumerate(same) if not s][:5])
        assert captions == [caption(rel) for rel in folder.sources], name
        captions_seen.append(captions)
        m, f = read_manifest(built[name])["splits"]["train"], read_manifest(built["folder"])["splits"]["train"]
        assert m["kept_jpeg"] == f["kept_jpeg"] and m["undersized"] == f["undersized"], name
        assert sorted((origin(name, s["source"], order), s["reason"]) for s in m["skipped"]) == want_skipped, name
        # shards of the same samples hold the same bytes: every array but the sources (and the captions)
        for a, b in zip(m["shards"], f["shards"], strict=True):
            assert a["count"] == b["count"], name
            for array, rec in b["files"].items():
                if array not in ("sources.npy", "source_offsets.npy"):
                    assert a["files"][array]["sha256"] == rec["sha256"], (name, a["name"], array)
        # negative control: the neighbour's image fails the check (a pack off by one sample cannot pass it)
        assert not any(bytes(ds.stored(i + 1)) == want_images[i] for i in range(n - 1)), name
    assert captions_seen[0] == captions_seen[1] == captions_seen[2]
