"""`dataprep build parquet` and `dataprep build list`: Parquet written by pyarrow (a bytes column, Hugging Face's
{bytes, path} struct, several row groups, ClassLabel metadata, nulls), Arrow IPC files and streams, save_to_disk
directories (written by the real `datasets`, committed in tests/fixtures/hf, and by pyarrow in that layout),
CSV path lists; every pack read back; the reader's memory against a row group's size.

Every image is a flat colour that encodes its sample number (synthetic.index_colour: levels 8 apart), so a
pack that pairs a row with another row's image, label or caption shows it: `check_images` compares each
stored image with its own colour within TOL and asserts that the neighbour's colour fails."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from click.testing import CliRunner

from dataprep.cli import main
from dataprep.pack.backends import read_manifest
from dataprep.synthetic import index_colour, index_image

pa = pytest.importorskip("pyarrow", reason="needs pyarrow (the parquet and test extras)")
pq = pytest.importorskip("pyarrow.parquet")

FIXTURES = Path(__file__).parent / "fixtures" / "hf"
# PNG sources through --mode raw keep a flat colour exactly (0 off); 3 is far below the 8 levels that
# separate neighbouring samples' colours, which the negative control in check_images fails.
TOL = 3
BUILD = ("--size", 16, "--mode", "raw", "-j", 1, "--no-progress")
STRUCT = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def png(i: int) -> bytes:
    ok, buf = cv2.imencode(".png", cv2.cvtColor(index_image(i, 20, 24), cv2.COLOR_RGB2BGR))
    assert ok
    return buf.tobytes()


def hf_metadata(names: list[str]) -> dict[bytes, bytes]:
    """The schema metadata `datasets` writes: an Image feature and a ClassLabel named `names`."""
    features = {"image": {"_type": "Image"}, "label": {"names": names, "_type": "ClassLabel"}}
    return {b"huggingface": json.dumps({"info": {"features": features}}).encode()}


def read_pack(pack: Path, split: str = "train"):
    """(dataset, captions or None) of a built pack, read back as a user reads it."""
    import dataprep
    from dataprep.images.build import CAPTION
    from dataprep.serve.cache import open_split

    ds = dataprep.InMemoryImageDataset(pack, split, as_numpy=True)
    captions = None
    if "caption" in ds.manifest["fields"]:
        captions = list(CAPTION.strings(open_split(pack, split, lambda m: {"caption": CAPTION}, kinds=("images",)).arrays))
    return ds, captions


def check_images(ds, numbers) -> None:
    """Sample k's pixels are sample numbers[k]'s colour within TOL, and not its neighbour's."""
    numbers = list(numbers)
    assert len(ds) == len(numbers)
    for k, i in enumerate(numbers):
        img = ds[k][0].astype(np.int64)
        assert np.abs(img - index_colour(i)).max() <= TOL, (k, i, ds.sources[k])
        assert np.abs(img - index_colour(i + 1)).max() > TOL  # negative control: the next row's image fails


def skipped(pack: Path, split: str = "train") -> set[tuple[str, str]]:
    return {(s["source"], s["reason"]) for s in read_manifest(pack)["splits"][split]["skipped"]}


def shard_counts(pack: Path, split: str = "train") -> list[int]:
    return [s["count"] for s in read_manifest(pack)["splits"][split]["shards"]]


# ---------------------------------------------------------------------------------------------------------
# Parquet


def test_parquet_bytes_columns_in_row_groups_read_back_row_by_row(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    a = pa.table({"image": pa.array([png(i) for i in range(10)], pa.binary()), "label": [i % 3 for i in range(10)],
                  "caption": [f"caption {i}: ünïcode" for i in range(10)]})
    pq.write_table(a, src / "a.parquet", row_group_size=4)  # row groups of 4, 4, 2
    b = pa.table({"image": pa.array([png(i) for i in range(10, 15)], pa.large_binary()), "label": [i % 3 for i in range(10, 15)],
                  "caption": [f"caption {i}: ünïcode" for i in range(10, 15)]})
    pq.write_table(b, src / "b.parquet")  # one row group of 5, large_binary
    out = tmp_path / "pack"
    r = run("build", "parquet", src / "*.parquet", "--label-column", "label", "--caption-column", "caption", "--out", out,
            *BUILD, "--shard-size", 3)
    assert r.exit_code == 0, r.output
    assert "train: 15 of 15 images written" in r.output and "skipped: none" in r.output
    ds, captions = read_pack(out)
    assert list(ds.sources) == [f"a.parquet:{i}" for i in range(10)] + [f"b.parquet:{i}" for i in range(5)]  # rows of each file
    assert ds.labels.tolist() == [i % 3 for i in range(15)] and ds.classes == ["0", "1", "2"]
    assert captions == [f"caption {i}: ünïcode" for i in range(15)]
    check_images(ds, range(15))
    assert shard_counts(out) == [3, 1, 3, 1, 2, 3, 2]  # shards never span row groups (4, 4, 2 | 5)
    m = read_manifest(out)["source"]
    assert m["layout"] == "parquet" and m["files"] == ["a.parquet", "b.parquet"] and m["formats"] == ["parquet"]
    assert (m["image_column"], m["label_column"], m["caption_column"]) == ("image", "label", "caption")
    assert run("verify", out).exit_code == 0


def test_hf_struct_column_with_class_label_nulls_and_paths(tmp_path):
    """Rows as datasets writes them, and every row that cannot be used skipped with its own reason."""
    src = tmp_path / "src"
    src.mkdir()
    names = ["zebra", "ant", "moth"]  # not sorted: the ClassLabel's order is the label order
    (src / "img3.png").write_bytes(png(3))  # a path relative to the table's folder
    elsewhere = tmp_path / "elsewhere" / "img4.png"  # an absolute path outside the table's folder: refused (issue 40)
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(png(4))
    images = [{"bytes": png(i), "path": f"img{i}.png"} for i in range(10)]
    images[3] = {"bytes": None, "path": "img3.png"}
    images[4] = {"bytes": None, "path": str(elsewhere)}
    images[5] = {"bytes": None, "path": "gone.png"}
    images[6] = None
    labels = [i % 3 for i in range(10)]
    labels[2], labels[8] = -1, None  # the hub's "no label", and a null
    captions = [f"caption {i}" for i in range(10)]
    captions[7] = None
    table = pa.table({"image": pa.array(images, STRUCT), "label": pa.array(labels, pa.int64()), "caption": captions})
    pq.write_table(table.replace_schema_metadata(hf_metadata(names)), src / "hf.parquet", row_group_size=3)
    out = tmp_path / "pack"
    r = run("build", "parquet", src / "hf.parquet", "--label-column", "label", "--caption-column", "caption", "--out", out, *BUILD)
    assert r.exit_code == 0, r.output
    kept = [0, 1, 3, 9]
    assert f"train: {len(kept)} of 10 images written" in r.output
    ds, caps = read_pack(out)
    assert list(ds.sources) == [f"hf.parquet:{i}" for i in kept]
    assert ds.classes == names and ds.labels.tolist() == [i % 3 for i in kept]
    assert caps == [f"caption {i}" for i in kept]
    check_images(ds, kept)
    assert skipped(out) == {("hf.parquet:2", "no label"), ("hf.parquet:8", "no label"), ("hf.parquet:7", "no caption"),
                            ("hf.parquet:5", "no image bytes"), ("hf.parquet:6", "no image"), ("hf.parquet:4", "bad path")}
    assert read_manifest(out)["source"]["classes_from"] == "ClassLabel"


TRAIN0, TRAIN1 = "train/data-00000-of-00002.arrow", "train/data-00001-of-00002.arrow"


@pytest.mark.parametrize("where,split,rows,refs,no_label", [
    ("images.parquet", "train", [0, 1, 2, 3, 5, 6], [f"images.parquet:{i}" for i in (0, 1, 2, 3, 5, 6)], {"images.parquet:4"}),
    ("saved", "train", [0, 1, 2, 3, 5, 6],  # two Arrow files (num_shards=2) of 4 and 3 rows, counted in each
     [f"{TRAIN0}:0", f"{TRAIN0}:1", f"{TRAIN0}:2", f"{TRAIN0}:3", f"{TRAIN1}:1", f"{TRAIN1}:2"], {f"{TRAIN1}:0"}),
    ("saved", "test", [7, 8, 9], [f"test/data-00000-of-00001.arrow:{i}" for i in range(3)], set()),
])
def test_tables_written_by_datasets(tmp_path, where, split, rows, refs, no_label):
    """Files the real `datasets` wrote (tests/fixtures/hf/make.py): to_parquet, and a DatasetDict's save_to_disk."""
    labels = [2, 0, 1, 1, -1, 0, 2, 1, 0, 2]  # make.py's LABELS; sample 4 has none
    out = tmp_path / "pack"
    r = run("build", "parquet", FIXTURES / where, "--split", split, "--label-column", "label", "--caption-column", "caption",
            "--out", out, *BUILD)
    assert r.exit_code == 0, r.output
    ds, caps = read_pack(out, split)
    assert list(ds.sources) == refs
    assert ds.classes == ["zebra", "ant", "moth"] and ds.labels.tolist() == [labels[i] for i in rows]
    assert caps == [f"caption {i}" for i in rows]
    check_images(ds, rows)
    assert skipped(out, split) == {(ref, "no label") for ref in no_label}


def test_a_dataset_dict_split_that_is_not_there_is_refused_naming_the_splits(tmp_path):
    r = run("build", "parquet", FIXTURES / "saved", "--split", "val", "--out", tmp_path / "pack", *BUILD)
    assert r.exit_code == 1 and "splits train, test, not 'val'" in r.output
    assert not (tmp_path / "pack").exists()


def test_a_column_of_urls_is_refused_naming_img2dataset(tmp_path):
    pq.write_table(pa.table({"url": [f"https://example.com/{i}.jpg" for i in range(3)], "label": [0, 1, 2]}), tmp_path / "urls.parquet")
    r = run("build", "parquet", tmp_path / "urls.parquet", "--image-column", "url", "--out", tmp_path / "pack", *BUILD)
    assert r.exit_code == 1
    assert "does not download" in r.output and "img2dataset" in r.output and "'url'" in r.output
    assert not (tmp_path / "pack").exists()
    r = run("build", "parquet", tmp_path / "urls.parquet", "--out", tmp_path / "pack", *BUILD)  # no column "image"
    assert r.exit_code == 1 and "no column 'image' (columns: url, label)" in r.output


def test_missing_table_files_are_refused(tmp_path):
    r = run("build", "parquet", tmp_path / "nope.parquet", "--out", tmp_path / "pack", *BUILD)
    assert r.exit_code == 1 and "nope.parquet: no such file" in r.output
    r = run("build", "parquet", tmp_path / "*.parquet", "--out", tmp_path / "pack", *BUILD)
    assert r.exit_code == 1 and "matches no file" in r.output
    (tmp_path / "plain").mkdir()  # a directory that save_to_disk did not write
    r = run("build", "parquet", tmp_path / "plain", "--out", tmp_path / "pack", *BUILD)
    assert r.exit_code == 1 and "not one written by datasets.save_to_disk" in r.output and "*.parquet" in r.output


def test_resume_and_limit_apply(tmp_path):
    src = tmp_path / "t.parquet"
    pq.write_table(pa.table({"image": pa.array([png(i) for i in range(12)], pa.binary()), "label": [i // 4 for i in range(12)]}),
                   src, row_group_size=6)
    out = tmp_path / "pack"
    args = ("build", "parquet", src, "--label-column", "label", "--out", out, *BUILD, "--shard-size", 4)
    assert run(*args).exit_code == 0
    r = run(*args, "--resume")
    assert r.exit_code == 0 and "resumed: 4 of 4 shards were finished and intact" in r.output  # 4, 2 | 4, 2
    r = run(*args, "--overwrite", "--limit", 3)
    assert r.exit_code == 0, r.output
    ds, _ = read_pack(out)
    assert ds.labels.tolist() == [0, 1, 2]  # one of each class, spread over both row groups
    check_images(ds, [int(s.split(":")[1]) for s in ds.sources])


# ---------------------------------------------------------------------------------------------------------
# Arrow IPC and save_to_disk layouts


def write_arrow(path: Path, table: pa.Table, fmt: str, rows_per_batch: int) -> None:
    with pa.OSFile(str(path), "wb") as f:
        w = (pa.ipc.new_file if fmt == "file" else pa.ipc.new_stream)(f, table.schema)
        for batch in table.to_batches(max_chunksize=rows_per_batch):
            w.write_batch(batch)
        w.close()


@pytest.mark.parametrize("fmt", ["file", "stream"])
def test_arrow_ipc_files_and_streams(tmp_path, fmt):
    names = ["dog", "cat"]
    table = pa.table({"image": pa.array([png(i) for i in range(10)], pa.binary()), "label": [names[i % 2] for i in range(10)]})
    write_arrow(tmp_path / "t.arrow", table, fmt, 4)  # record batches of 4, 4, 2
    out = tmp_path / "pack"
    r = run("build", "parquet", tmp_path / "t.arrow", "--label-column", "label", "--out", out, *BUILD, "--shard-size", 3)
    assert r.exit_code == 0, r.output
    ds, caps = read_pack(out)
    assert list(ds.sources) == [f"t.arrow:{i}" for i in range(10)] and caps is None
    assert ds.classes == ["cat", "dog"] and ds.labels.tolist() == [1 - i % 2 for i in range(10)]  # class names, sorted
    check_images(ds, range(10))
    assert shard_counts(out) == [3, 1, 3, 1, 2]  # units are the record batches
    assert read_manifest(out)["source"]["formats"] == [f"arrow {fmt}"]


def test_save_to_disk_layout_written_by_pyarrow(tmp_path):
    """A Dataset directory as save_to_disk lays it out (state.json, dataset_info.json with a ClassLabel, Arrow
    streams), whose files carry no schema metadata: the class names come from dataset_info.json."""
    saved = tmp_path / "saved"
    saved.mkdir()
    names = ["moth", "ant"]
    files = ["data-00000-of-00002.arrow", "data-00001-of-00002.arrow"]
    for k, rows in enumerate([range(0, 5), range(5, 8)]):
        table = pa.table({"image": pa.array([{"bytes": png(i), "path": None} for i in rows], STRUCT), "label": [i % 2 for i in rows]})
        write_arrow(saved / files[k], table, "stream", 2)
    (saved / "state.json").write_text(json.dumps({"_data_files": [{"filename": f} for f in files], "_split": None}))
    (saved / "dataset_info.json").write_text(json.dumps({"features": {"image": {"_type": "Image"},
                                                                      "label": {"names": names, "_type": "ClassLabel"}}}))
    out = tmp_path / "pack"
    r = run("build", "parquet", saved, "--label-column", "label", "--out", out, *BUILD)
    assert r.exit_code == 0, r.output
    ds, _ = read_pack(out)
    assert list(ds.sources) == [f"{files[0]}:{i}" for i in range(5)] + [f"{files[1]}:{i}" for i in range(3)]
    assert ds.classes == names and ds.labels.tolist() == [i % 2 for i in range(8)]
    check_images(ds, range(8))
    assert shard_counts(out) == [2, 2, 1, 2, 1]  # record batches of 2 in each file
    (saved / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00009-of-00010.arrow"}]}))
    r = run("build", "parquet", saved, "--out", tmp_path / "pack2", *BUILD)
    assert r.exit_code == 1 and "lists 'data-00009-of-00010.arrow', which is not a file" in r.output


# ---------------------------------------------------------------------------------------------------------
# Memory: a row group is read a few rows at a time

ROWS, CELL = 256, 128 * 1024  # one row group of 32 MiB of image bytes


@pytest.fixture
def big_row_group(tmp_path) -> Path:
    """One row group of ROWS cells of CELL bytes (row i starts with i), written in pages of 16 values."""
    rng = np.random.default_rng(0)
    cells = [i.to_bytes(8, "little") + rng.bytes(CELL - 8) for i in range(ROWS)]
    path = tmp_path / "big.parquet"
    pq.write_table(pa.table({"image": pa.array(cells, pa.binary()), "label": [i % 2 for i in range(ROWS)]}), path,
                   row_group_size=ROWS, use_dictionary=False, compression="none", write_batch_size=16)
    assert pq.ParquetFile(path).metadata.num_row_groups == 1
    return path


def held_while_reading(path: Path) -> int:
    """Arrow memory held at any yield while the reader streams every row of the file (checking each row)."""
    from dataprep.sources.parquet import scan_parquet

    s = scan_parquet([str(path)], "train", "image", "label")
    sp = s.splits[0]
    base, peak = pa.total_allocated_bytes(), 0
    for i, data in enumerate(sp.reader.open(str(s.root), sp.paths, sp.locators)):
        assert len(data) == CELL and int.from_bytes(data[:8], "little") == i
        peak = max(peak, pa.total_allocated_bytes() - base)
    assert i == ROWS - 1
    return peak


def test_the_reader_holds_a_few_batches_never_the_row_group(big_row_group, monkeypatch):
    from dataprep.sources import parquet

    limit = 4 * parquet.BATCH_ROWS * CELL  # a few batches: 8 MiB against the row group's 32 MiB
    assert held_while_reading(big_row_group) < limit
    # negative controls: pyarrow's defaults (pre-buffered, unbuffered column chunks) and a whole read_row_group
    monkeypatch.setattr(parquet, "_parquet_file", lambda p: pq.ParquetFile(p))
    assert held_while_reading(big_row_group) >= ROWS * CELL
    monkeypatch.setattr(parquet, "_unit_arrays", lambda p, f, u, c: iter([pq.ParquetFile(p).read_row_group(u, columns=[c]).column(0)]))
    assert held_while_reading(big_row_group) >= ROWS * CELL


def test_the_listing_reads_no_image(big_row_group):
    """The listing's peak Arrow memory (in a fresh process, from pyarrow's own count) is the labels', not the
    32 MiB of images; the same count after reading the image column shows the measure sees them."""
    code = ("import sys, pyarrow as pa, pyarrow.parquet as pq\n"
            "from dataprep.sources.parquet import scan_parquet\n"
            "s = scan_parquet([sys.argv[1]], 'train', 'image', 'label')\n"
            "print(len(s.splits[0].paths), pa.default_memory_pool().max_memory())\n"
            "pq.ParquetFile(sys.argv[1]).read_row_group(0, columns=['image'])\n"
            "print(pa.default_memory_pool().max_memory())\n")
    out = subprocess.run([sys.executable, "-c", code, str(big_row_group)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    (rows, listing), (after,) = (line.split() for line in out.stdout.split("\n")[:2])
    assert int(rows) == ROWS and int(listing) < 1 << 20
    assert int(after) >= ROWS * CELL  # negative control


# ---------------------------------------------------------------------------------------------------------
# Path lists


def write_images(root: Path, numbers) -> None:
    (root / "img").mkdir(parents=True, exist_ok=True)
    for i in numbers:
        (root / "img" / f"{i}.png").write_bytes(png(i))


@pytest.mark.parametrize("header", [True, False])
@pytest.mark.parametrize("labels", ["names", "ints"])
def test_list_csv_reads_back_row_by_row(tmp_path, header, labels):
    root = tmp_path / "data"
    write_images(root, range(8))
    (tmp_path / "outside.png").write_bytes(png(99))
    (root / "img" / "link.png").symlink_to(tmp_path / "outside.png")  # inside by name, outside by where it leads
    names = ["dog", "cat", "emu"]
    label = (lambda i: names[i % 3]) if labels == "names" else (lambda i: str(i % 3))
    rows = [["path", "label", "caption"]] if header else []
    rows += [[f"img/{i}.png", label(i), f"caption {i}, with a comma"] for i in range(6)]
    rows += [["img/404.png", label(0), "gone"], ["../outside.png", label(0), "out"], ["img/link.png", label(0), "out"],
             [str(root / "img" / "6.png"), label(6), "caption 6, with a comma"],
             ["img/7.png", "", "no label"], ["img/7.png", label(7), "a", "b"]]
    lst = tmp_path / "lists" / "paths.csv"
    lst.parent.mkdir()
    with open(lst, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    out = tmp_path / "pack"
    r = run("build", "list", lst, "--root", root, "--out", out, *BUILD)
    assert r.exit_code == 0, r.output
    kept = [0, 1, 2, 3, 4, 5, 6]
    ds, caps = read_pack(out)
    assert list(ds.sources) == [f"img/{i}.png" for i in kept]  # the absolute path under the root recorded relative to it
    if labels == "names":
        assert ds.classes == ["cat", "dog", "emu"] and ds.labels.tolist() == [["cat", "dog", "emu"].index(names[i % 3]) for i in kept]
    else:
        assert ds.classes == ["0", "1", "2"] and ds.labels.tolist() == [i % 3 for i in kept]
    assert caps == [f"caption {i}, with a comma" for i in kept]
    check_images(ds, kept)
    line = len(rows) - 4  # the CSV's line numbers of the rows skipped for their fields
    assert skipped(out) == {("img/404.png", "missing file"), ("../outside.png", "outside the root"), ("img/link.png", "outside the root"),
                            ("img/7.png", "no label"), (f"paths.csv:{line + 4}", "bad row")}
    m = read_manifest(out)["source"]
    assert m["layout"] == "list" and m["list"] == str(lst.resolve()) and m["root"] == str(root.resolve())


def test_list_root_defaults_to_the_csv_folder_and_no_labels_is_unlabelled(tmp_path):
    write_images(tmp_path, range(4))
    (tmp_path / "l.csv").write_text("img/0.png\nimg/1.png,\nimg/2.png\nimg/3.png,\n")
    out = tmp_path / "pack"
    r = run("build", "list", tmp_path / "l.csv", "--out", out, *BUILD)
    assert r.exit_code == 0, r.output
    ds, caps = read_pack(out)
    assert list(ds.sources) == [f"img/{i}.png" for i in range(4)] and ds.classes == [] and caps is None
    check_images(ds, range(4))


def test_a_missing_list_or_one_with_no_file_is_refused(tmp_path):
    r = run("build", "list", tmp_path / "none.csv", "--out", tmp_path / "pack", *BUILD)
    assert r.exit_code == 1 and "no such list file" in r.output
    (tmp_path / "l.csv").write_text("path,label\nimg/0.png,1\n")
    r = run("build", "list", tmp_path / "l.csv", "--out", tmp_path / "pack", *BUILD)
    assert r.exit_code == 1 and "no usable row (missing file" in r.output
    assert not os.path.exists(tmp_path / "pack")


# ---------------------------------------------------------------------------------------------------------
# Review (issue 23): strict listings, bad text, huge integer labels, messages


@pytest.mark.parametrize("row, source, reason", [
    ("img/404.png,1", "img/404.png", "missing file"), ("../out.png,1", "../out.png", "outside the root"),
    ("img/1.png,1,a,b", "l.csv:2", "bad row"), ("img/1.png,", "img/1.png", "no label")])
def test_strict_list_refuses_the_first_row_it_would_skip(tmp_path, row, source, reason):
    from dataprep.errors import SourceError
    from dataprep.sources.pathlist import scan_list

    write_images(tmp_path, range(2))
    (tmp_path / "out.png").write_bytes(png(9))
    lst = tmp_path / "l.csv"
    lst.write_text(f"img/0.png,1\n{row}\n")
    assert len(scan_list(lst, tmp_path).splits[0].skipped) == 1  # without strict: skipped
    with pytest.raises(SourceError, match=f"^{source}: {reason} "):
        scan_list(lst, tmp_path, strict=True)


def test_strict_parquet_refuses_the_first_row_it_would_skip(tmp_path):
    from dataprep.errors import SourceError
    from dataprep.sources.parquet import scan_parquet

    pq.write_table(pa.table({"image": [png(0), png(1)], "label": [1, None]}), tmp_path / "t.parquet")
    assert [s["source"] for s in scan_parquet([str(tmp_path / "t.parquet")], label_column="label").splits[0].skipped] == ["t.parquet:1"]
    with pytest.raises(SourceError, match="^t.parquet:1: no label "):
        scan_parquet([str(tmp_path / "t.parquet")], label_column="label", strict=True)


def not_utf8(values: list[bytes]):
    """A string column holding `values` as they are (pyarrow does not check them): what a careless writer stores."""
    return pa.Array.from_buffers(pa.string(), len(values), pa.array(values, pa.binary()).buffers())


def test_caption_or_label_cells_that_are_not_utf8_skip_only_their_rows(tmp_path):
    from dataprep.errors import SourceError
    from dataprep.sources.parquet import scan_parquet

    table = pa.table({"image": [png(i) for i in range(4)], "label": not_utf8([b"dog", b"cat", b"\xffemu", b"dog"]),
                      "caption": not_utf8([b"a", b"b\xc3", b"c", b"d"])})
    pq.write_table(table, tmp_path / "t.parquet")
    split = scan_parquet([str(tmp_path / "t.parquet")], label_column="label", caption_column="caption").splits[0]
    assert split.paths == ["t.parquet:0", "t.parquet:3"] and split.captions == ["a", "d"]
    assert [(s["source"], s["reason"]) for s in split.skipped] == [("t.parquet:1", "bad caption"), ("t.parquet:2", "bad label")]
    assert "column 'label': not UTF-8 text" in split.skipped[1]["detail"]
    with pytest.raises(SourceError, match="^t.parquet:1: bad caption "):
        scan_parquet([str(tmp_path / "t.parquet")], label_column="label", caption_column="caption", strict=True)


def test_integer_labels_that_are_ids_not_class_indices_are_refused(tmp_path):
    from dataprep.errors import SourceError
    from dataprep.sources.parquet import scan_parquet

    pq.write_table(pa.table({"image": [png(0), png(1), png(2)], "label": [17, 3_000_000, 0]}), tmp_path / "ids.parquet")
    with pytest.raises(SourceError, match=r"^ids.parquet:1: label 3000000 would make 3000001 classes .* give class names"):
        scan_parquet([str(tmp_path / "ids.parquet")], label_column="label")
    pq.write_table(pa.table({"image": [png(0), png(1)], "label": [3, 21_840]}), tmp_path / "few.parquet")  # ImageNet-21k's top
    assert len(scan_parquet([str(tmp_path / "few.parquet")], label_column="label").classes) == 21_841


def test_mixed_labels_name_a_sample_of_each_and_no_usable_sample_counts_the_reasons(tmp_path):
    from dataprep.errors import SourceError
    from dataprep.sources.listing import labelled_split
    from dataprep.sources.pathlist import scan_list

    write_images(tmp_path, range(3))
    (tmp_path / "l.csv").write_text("img/0.png,dog\nimg/1.png,3\nimg/2.png,cat\n")
    with pytest.raises(SourceError, match=r"mix integers and class names \(img/1.png: 3, img/0.png: 'dog'\)"):
        scan_list(tmp_path / "l.csv", tmp_path)
    pre = [{"source": "l.csv:1", "reason": "missing file", "detail": "gone"}]
    with pytest.raises(SourceError, match=r"no usable sample \(skipped: 2 bad caption, 1 missing file; the first: l.csv:1: "):
        labelled_split("list", tmp_path, "train", ["a", "b"], [None, None], ["\ud800", "x\udfff"], pre, {})
