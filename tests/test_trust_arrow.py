"""Arrow and Parquet files that lie (issue 40): an offset that points anywhere, a schema that is not its
batches', a 49 KB Parquet file holding a 1.5 GiB cell, Image structs whose path leaves the dataset, and a
fuzz of all of them. Each is safe: a clear error naming the input, or the bad rows skipped with a reason and
the rest built; never a signal, a dead worker or a wrong value. Builds run in a child process, so a crash is
a negative return code, not a dead test run."""
from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

from dataprep.synthetic import index_colour, index_image

pa = pytest.importorskip("pyarrow", reason="needs pyarrow (the parquet and test extras)")
pq = pytest.importorskip("pyarrow.parquet")
import pyarrow.feather  # noqa: E402, F401 (makes pa.feather available; pyarrow does not import it)
import pyarrow.ipc  # noqa: E402, F401 (pa.ipc)

from dataprep.sources.parquet_pages import _uvarint  # noqa: E402 (the varint the crafted pages are written with)

from .conftest import within  # noqa: E402

STRUCT = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
ROWS, BATCH = 8, 2  # rows of the small tables, in record batches (row groups) of 2


def png(i: int) -> bytes:
    ok, buf = cv2.imencode(".png", cv2.cvtColor(index_image(i, 20, 24), cv2.COLOR_RGB2BGR))
    assert ok
    return buf.tobytes()


def table(n: int = ROWS, label_type=None):
    """Row i: png(i), label i % 2 (int64 unless `label_type`), a caption of its own length."""
    if label_type is None:
        label_type = pa.int64()
    return pa.table({"image": pa.array([png(i) for i in range(n)], pa.binary()),
                     "label": pa.array([i % 2 for i in range(n)], label_type),
                     "caption": [f"caption {i}" + "x" * i for i in range(n)]})


def ipc(t, fmt: str, rows: int = BATCH, **options) -> bytes:
    """`t` as an IPC file or stream of record batches of `rows`, each of arrays of its own (a slice's buffers
    would be written from the slice's start to the parent's end: longer than the batch needs)."""
    sink = pa.BufferOutputStream()
    new = pa.ipc.new_file if fmt == "file" else pa.ipc.new_stream
    with new(sink, t.schema, options=pa.ipc.IpcWriteOptions(**options)) as w:
        for start in range(0, t.num_rows, rows):
            w.write_batch(pa.RecordBatch.from_pylist(t.slice(start, rows).to_pylist(), schema=t.schema))
    return sink.getvalue().to_pybytes()


def offsets_at(data: bytes, values, nth: int = 0) -> int:
    """Where the int32 offsets `values` are in `data` (the `nth` occurrence)."""
    needle, pos = struct.pack(f"<{len(values)}i", *values), -1
    for _ in range(nth + 1):
        pos = data.index(needle, pos + 1)
    return pos


def batch_offsets(column: list, batch: int) -> list[int]:
    """The offsets a writer gives batch `batch` of a text or binary column (each batch's start at 0)."""
    cells = column[batch * BATCH:(batch + 1) * BATCH]
    return [0, *np.cumsum([len(c) for c in cells]).tolist()]


def lie(data: bytes, values, k: int, new: int, nth: int = 0) -> bytes:
    """`data` with offset k of the offsets `values` changed to `new`."""
    pos = offsets_at(data, values, nth) + 4 * k
    return data[:pos] + struct.pack("<i", new) + data[pos + 4:]


def cli(*args, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dataprep", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def assert_clean(r: subprocess.CompletedProcess) -> None:
    """Exited by itself (no signal), 0 or a clean error that says something, and no traceback."""
    out = r.stdout + r.stderr
    assert r.returncode >= 0, f"killed by signal {-r.returncode}: {out[-2000:]}"
    assert r.returncode in (0, 1, 2), out[-2000:]
    assert "Traceback" not in out and "worker died" not in out, out[-2000:]
    if r.returncode:
        assert "Error" in out and len(out.strip()) > 20, out


def pack_rows(pack: Path) -> tuple[list[str], list[int], dict[str, tuple[str, str]]]:
    """(sources, labels, {source: (reason, detail)} skipped) of a built pack, its images checked against
    the row each came from."""
    import dataprep
    from dataprep.pack.backends import read_manifest

    ds = dataprep.InMemoryImageDataset(pack, "train", as_numpy=True)
    for k, src in enumerate(ds.sources):
        i = int(src.rsplit(":", 1)[1])
        assert np.abs(ds[k][0].astype(np.int64) - index_colour(i)).max() <= 3, src
    skipped = {s["source"]: (s["reason"], s["detail"]) for s in read_manifest(pack)["splits"]["train"]["skipped"]}
    return list(ds.sources), ds.labels.tolist(), skipped


BUILD = ("--label-column", "label", "--size", 16, "--mode", "raw", "--no-progress")


# ---------------------------------------------------------------------------------------------------------
# 1. One lying offset in the image column (or the caption column) of an Arrow IPC file or stream


LIES = {"huge": lambda offs, k: 0x7FFFFF00, "negative": lambda offs, k: -4096,
        "backwards": lambda offs, k: offs[k + 1] + 7}


@pytest.mark.parametrize("fmt", ["file", "stream"])
@pytest.mark.parametrize("how", sorted(LIES))
@pytest.mark.parametrize("workers", [1, 2])
def test_a_lying_image_offset_skips_its_batch_and_builds_the_rest(tmp_path, fmt, how, workers):
    t = table()
    cells = t.column("image").to_pylist()
    offs = batch_offsets(cells, 1)  # the second record batch: rows 2 and 3
    f = tmp_path / f"t.{fmt}"
    f.write_bytes(lie(ipc(t, fmt), offs, 1, LIES[how](offs, 1)))
    r = cli("build", "parquet", f, "--out", tmp_path / "pack", "-j", workers, *BUILD)
    assert_clean(r)
    assert r.returncode == 0, r.stdout + r.stderr
    sources, labels, skipped = pack_rows(tmp_path / "pack")
    assert sources == [f"{f.name}:{i}" for i in (0, 1, 4, 5, 6, 7)]
    assert labels == [i % 2 for i in (0, 1, 4, 5, 6, 7)]
    assert {s: reason for s, (reason, _) in skipped.items()} == {f"{f.name}:2": "unreadable", f"{f.name}:3": "unreadable"}
    assert "record batch 1 of" in skipped[f"{f.name}:2"][1] and "invalid" in skipped[f"{f.name}:2"][1]


@pytest.mark.parametrize("fmt", ["file", "stream"])
@pytest.mark.parametrize("how", sorted(LIES))
def test_a_lying_caption_offset_refuses_the_file_by_name(tmp_path, fmt, how):
    t = table()
    offs = batch_offsets(t.column("caption").to_pylist(), 2)
    f = tmp_path / f"t.{fmt}"
    f.write_bytes(lie(ipc(t, fmt), offs, 1, LIES[how](offs, 1)))
    r = cli("build", "parquet", f, "--caption-column", "caption", "--out", tmp_path / "pack", *BUILD)
    assert_clean(r)
    assert r.returncode == 1 and f"{f}: unreadable as arrow" in r.stderr and "record batch 2 of t." in r.stderr, r.stderr


# ---------------------------------------------------------------------------------------------------------
# 2. A stream whose schema is not its batches'


def messages(data: bytes) -> list[bytes]:
    """The serialized messages of an IPC stream (schema first), without its end-of-stream marker."""
    reader, out = pa.ipc.MessageReader.open_stream(pa.py_buffer(data)), []
    while True:
        try:
            out.append(reader.read_next_message().serialize().to_pybytes())
        except StopIteration:
            return out


EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"


def schema_lie(declared, actual) -> bytes:
    """A stream of `declared`'s schema and its first batch, then `actual`'s other batches: batches whose
    buffers were written for another schema than the one the stream declares."""
    a, b = messages(ipc(declared, "stream")), messages(ipc(actual, "stream"))
    return b"".join([a[0], a[1], *b[2:]]) + EOS


def test_an_int16_schema_over_int8_batches_is_refused_not_read_as_wrong_labels(tmp_path):
    f = tmp_path / "labels.arrows"
    f.write_bytes(schema_lie(table(label_type=pa.int16()), table(label_type=pa.int8())))
    with pa.ipc.open_stream(f.read_bytes()) as r:  # what pyarrow's default read makes of it: wrong values
        assert [b.column("label").to_pylist() for b in r][1] == [256, 0]  # int8 [0, 1] and the padding, as int16
    r = cli("build", "parquet", f, "--out", tmp_path / "pack", *BUILD)
    assert_clean(r)
    assert r.returncode == 1 and f"{f}: unreadable as arrow stream" in r.stderr and "record batch 1 of labels.arrows is invalid" in r.stderr


@pytest.mark.parametrize("declared, actual", [(pa.binary(), pa.large_binary()), (pa.large_binary(), pa.binary())])
@pytest.mark.parametrize("workers", [1, 2])
def test_a_binary_schema_over_large_binary_batches_or_back_skips_them(tmp_path, declared, actual, workers):
    def typed(t, kind):
        return t.set_column(0, "image", t.column("image").cast(kind))

    f = tmp_path / "images.arrows"
    f.write_bytes(schema_lie(typed(table(), declared), typed(table(), actual)))
    r = cli("build", "parquet", f, "--out", tmp_path / "pack", "-j", workers, *BUILD)
    assert_clean(r)
    assert r.returncode == 0, r.stdout + r.stderr
    sources, labels, skipped = pack_rows(tmp_path / "pack")
    assert sources == ["images.arrows:0", "images.arrows:1"] and labels == [0, 1]  # the first batch: the declared schema's own
    assert {reason for reason, _ in skipped.values()} == {"unreadable"} and len(skipped) == ROWS - BATCH


def test_validation_cost_on_a_realistic_file(tmp_path, monkeypatch):
    """Full validation of 2,000 rows of ~100 KB images (Arrow batches of 100, Parquet row groups of 500):
    the time spent validating, against reading every cell as the reader does. It checks offsets, never the
    bytes: printed, and bounded at a few percent of the read."""
    import time

    from dataprep.sources import parquet

    rng = np.random.default_rng(0)
    cells = [rng.bytes(100_000 + int(rng.integers(0, 4096))) for _ in range(2000)]
    t = pa.table({"image": pa.array(cells, pa.binary()), "label": [i % 10 for i in range(2000)]})
    (tmp_path / "big.arrow").write_bytes(ipc(t, "file", rows=100))
    pq.write_table(t, tmp_path / "big.parquet", row_group_size=500)
    spent = [0.0]

    def timed(fn):
        def wrapper(*args):
            start = time.perf_counter()
            try:
                return fn(*args)
            finally:
                spent[0] += time.perf_counter() - start
        return wrapper

    monkeypatch.setattr(parquet, "_valid", timed(parquet._valid))
    monkeypatch.setattr(parquet, "_exact_offsets", timed(parquet._exact_offsets))
    shares = {}
    for path, fmt, units in ((tmp_path / "big.arrow", parquet.ARROW_FILE, 20), (tmp_path / "big.parquet", parquet.PARQUET, 4)):
        rows = list(range(500 if fmt == parquet.PARQUET else 100))
        best = None
        for _ in range(3):
            spent[0], start, n = 0.0, time.perf_counter(), 0
            for unit in range(units):
                n += sum(map(len, parquet._read_unit(str(path), fmt, unit, "image", [str(r) for r in rows], rows)))
            total = time.perf_counter() - start
            assert n == sum(map(len, cells))
            best = (total, spent[0]) if best is None else min(best, (total, spent[0]))
        total, valid = best
        print(f"{fmt}: validation {valid * 1e3:.2f} ms of a {total * 1e3:.0f} ms read ({valid / total:.2%})")
        shares[fmt] = (valid, total)
    fmt = max(shares, key=lambda f: shares[f][0] / shares[f][1])
    valid, total = shares[fmt]
    within(valid, 0.05 * total, f"validating {fmt} (5% of its {total:.3f} s read)")


# ---------------------------------------------------------------------------------------------------------
# 3. A small Parquet file with a huge cell: skipped by the size its page declares, never decompressed


def _skip_struct(buf: bytes, pos: int, ints: dict | None = None) -> int:
    """Past a Thrift compact struct (the kinds pyarrow's page headers use); `ints` gets its top-level ints."""
    last = 0
    while True:
        head = buf[pos]
        pos += 1
        if head == 0:
            return pos
        last, kind = last + (head >> 4), head & 0x0F
        if kind in (5, 6):
            v = shift = 0
            while True:
                b = buf[pos]
                pos += 1
                v |= (b & 0x7F) << shift
                shift += 7
                if not b & 0x80:
                    break
            if ints is not None:
                ints[last] = (v >> 1) ^ -(v & 1)
        elif kind == 8:
            n = buf[pos]  # short: no statistics are written
            pos += 1 + n
        elif kind == 12:
            pos = _skip_struct(buf, pos)
        elif kind not in (1, 2):
            raise ValueError(kind)


def _pages(data: bytes, path: Path, column: str) -> list[tuple[int, int]]:
    """(start, end) of each page of `column` in row group 0."""
    rg = pq.ParquetFile(path).metadata.row_group(0)
    c = next(rg.column(j) for j in range(rg.num_columns) if rg.column(j).path_in_schema == column)
    pos, end, out = c.data_page_offset, c.data_page_offset + c.total_compressed_size, []
    while pos < end:
        ints: dict = {}
        body = _skip_struct(data, pos, ints)
        out.append((pos, body + ints[3]))
        pos = body + ints[3]
    return out


def _zstd_zeros(prefix: bytes, zeros: int, one_segment: bool = False) -> bytes:
    """A zstd frame of `prefix` and `zeros` zero bytes: RLE blocks, 4 bytes per 128 KiB. Its window is 1 MiB
    (as a zstd encoder's is), or with `one_segment` its whole size: a frame that only a decoder holding its
    whole output decodes (a stream refuses its window)."""
    header = b"\xa0" if one_segment else b"\x80\x50"  # a 4-byte size, and one segment or a 1 MiB window
    out = bytearray(b"\x28\xb5\x2f\xfd" + header + struct.pack("<I", len(prefix) + zeros))
    blocks = [(0, len(prefix))] + [(1, min(128 << 10, zeros - k)) for k in range(0, zeros, 128 << 10)]
    for k, (kind, n) in enumerate(blocks):
        out += struct.pack("<I", n << 3 | kind << 1 | (k == len(blocks) - 1))[:3] + (prefix if kind == 0 else b"\0")
    return bytes(out)


def bomb_parquet(path: Path, size: int, rows: int = 6, at: int = 2, page_rows: int | None = 1,
                 one_segment: bool = False, hf: bool = False) -> Path:
    """Row i: png(i) (label i % 2), except row `at`: `size` zero bytes, compressed to ~4 bytes per 128 KiB (a
    1.5 GiB cell in a 50 KB file); with `hf`, in Image structs {bytes, path}. Written by pyarrow with a
    random cell there (zstd, `page_rows` rows a page), whose page is then replaced by one of the same length
    declaring the huge cell."""
    filler = np.random.default_rng(0).bytes(max(20_000, size // 30_000))
    cells = [filler if i == at else png(i) for i in range(rows)]
    image = pa.array([{"bytes": c, "path": None} for c in cells], STRUCT) if hf else pa.array(cells, pa.binary())
    pq.write_table(pa.table({"label": [i % 2 for i in range(rows)], "image": image}), path,
                   compression="zstd", use_dictionary=["label"], write_statistics=False, max_rows_per_page=page_rows)
    data = bytearray(path.read_bytes())
    start, end = next(p for p in _pages(bytes(data), path, "image.bytes" if hf else "image") if filler[:64] in data[p[0]:p[1]])
    values = [c for c in cells[:at] if data.find(c[:40], start, end) >= 0]  # the cells before it in its page
    plain = b"".join(struct.pack("<I", len(c)) + c for c in values)
    n = len(values) + 1
    levels = struct.pack("<I", 2) + _uvarint(n << 1) + (b"\x02" if hf else b"\x01")  # n values, all defined (an RLE run)
    frame = _zstd_zeros(levels + plain + struct.pack("<I", size), size, one_segment)
    i32 = lambda v: bytes([1 << 4 | 5]) + _uvarint((v << 1) ^ (v >> 31))  # noqa: E731 (the next field, an i32)
    for length in range(10, 40):  # a DATA_PAGE header of sizes that make header + body the old page's length
        head = i32(0) + i32(len(levels) + len(plain) + 4 + size) + i32(end - start - length) + bytes([2 << 4 | 12]) \
            + i32(n) + i32(0) + i32(3) + i32(3) + b"\0\0"
        if len(head) == length:
            break
    pad = end - start - len(head) - len(frame)
    assert pad >= 8
    data[start:end] = head + frame + struct.pack("<II", 0x184D2A50, pad - 8) + bytes(pad - 8)  # + a skippable frame
    path.write_bytes(bytes(data))
    return path


BOMB_BUILD = """
import json, resource, sys
from dataprep.images.build import build_images
from dataprep.images.settings import ImageSettings
from dataprep.pack.backends import read_manifest
from dataprep.settings import BuildSettings
from dataprep.sources.parquet import scan_parquet
path, out, cap, workers = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
build_images(scan_parquet([path], label_column="label", **({"max_bytes": cap} if cap else {})), out,
             BuildSettings(workers=workers), ImageSettings(size=16, mode="raw"))
"""
# The build runs in a grandchild started by a small launcher: a process's peak RSS counts what it held when
# it was forked (Linux keeps ru_maxrss over exec), and this test process may hold hundreds of MB.
LAUNCH = """
import json, resource, subprocess, sys
limit = int(sys.argv[1])
r = subprocess.run([sys.executable, "-c", sys.argv[2], *sys.argv[3:]],
                   preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
print(json.dumps({"rc": r.returncode, "peak": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss << 10}))
"""


def build_bomb(path: Path, out: Path, cap: int = 0, workers: int = 1, limit: int = 3 << 30) -> int:
    """Peak RSS (bytes) of building `path` (workers included) with the byte cap `cap` (0: the default),
    under an address-space limit that the 6.4 GB peak of an unchecked read breaks."""
    r = subprocess.run([sys.executable, "-c", LAUNCH, str(limit), BOMB_BUILD, str(path), str(out), str(cap), str(workers)],
                       capture_output=True, text=True, timeout=300)
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert r.returncode == 0 and result["rc"] == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return result["peak"]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_1_5_gib_cell_in_a_50_kb_parquet_file_is_skipped_unread(tmp_path, workers):
    from dataprep.limits import IMAGE_MAX_BYTES

    f = bomb_parquet(tmp_path / "bomb.parquet", 3 << 29)  # 1.5 GiB
    assert f.stat().st_size < 100_000
    peak = build_bomb(f, tmp_path / "pack", workers=workers)  # the default cap: 256 MiB
    print(f"peak RSS {peak / 2**20:.0f} MiB")
    assert peak < 1 << 30
    sources, labels, skipped = pack_rows(tmp_path / "pack")
    assert sources == [f"bomb.parquet:{i}" for i in (0, 1, 3, 4, 5)] and labels == [0, 1, 1, 0, 1]  # the row group's others
    assert skipped == {"bomb.parquet:2": ("too large", f"{3 << 29:,} bytes, over the {IMAGE_MAX_BYTES:,}-byte cap on one "
                                                       "sample (--max-bytes)")}


@pytest.mark.parametrize("hf", [False, True])
def test_rows_sharing_the_huge_cells_page_are_streamed_and_built(tmp_path, hf):
    """pyarrow's own pages hold up to 1024 rows, the huge cell's neighbours among them: that page is streamed
    a cell at a time, never held (a binary column, or the bytes of Image structs)."""
    f = bomb_parquet(tmp_path / "bomb.parquet", 600 << 20, rows=6, at=2, page_rows=3, hf=hf)
    assert build_bomb(f, tmp_path / "pack") < 1 << 30
    sources, labels, skipped = pack_rows(tmp_path / "pack")
    assert sources == [f"bomb.parquet:{i}" for i in (0, 1, 3, 4, 5)] and labels == [0, 1, 1, 0, 1]
    assert skipped == {"bomb.parquet:2": ("too large", f"{600 << 20:,} bytes, over the {256 << 20:,}-byte cap on one "
                                                       "sample (--max-bytes)")}


def test_a_page_that_cannot_be_streamed_is_skipped_with_its_rows_unread(tmp_path):
    """A zstd frame whose window is its whole output (a decoder must hold all of it), over the cap: its
    page's rows are skipped by the size it declares, and the row group's other pages built."""
    f = bomb_parquet(tmp_path / "bomb.parquet", 600 << 20, rows=6, at=2, page_rows=3, one_segment=True)
    assert build_bomb(f, tmp_path / "pack") < 1 << 30
    sources, labels, skipped = pack_rows(tmp_path / "pack")
    assert sources == [f"bomb.parquet:{i}" for i in (3, 4, 5)] and labels == [1, 0, 1]
    assert {s: r for s, (r, _) in skipped.items()} == {f"bomb.parquet:{i}": "too large" for i in (0, 1, 2)}
    assert "the page of column 'image' that holds rows 0 to 2, which could not be streamed" in skipped["bomb.parquet:0"][1]


@pytest.mark.parametrize("codec", ["zstd", "gzip", "brotli", "none", "snappy", "lz4"])
@pytest.mark.parametrize("version", ["1.0", "2.0"])
def test_a_page_over_the_cap_as_pyarrow_writes_it_builds_its_other_rows(tmp_path, codec, version):
    """One page (pyarrow's encoding, every codec, data pages v1 and v2) of Image structs over a 1,000-byte
    cap: its cells are taken one at a time, nulls and paths as ever, the one over the cap skipped."""
    from dataprep.images.build import build_images
    from dataprep.images.settings import ImageSettings
    from dataprep.settings import BuildSettings
    from dataprep.sources.parquet import scan_parquet

    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "2.png").write_bytes(png(2))
    big = np.random.default_rng(1).bytes(5000)
    images = [{"bytes": png(0), "path": None}, None, {"bytes": None, "path": "imgs/2.png"}, {"bytes": big, "path": "x"},
              {"bytes": png(4), "path": None}, {"bytes": png(5), "path": None}, {"bytes": None, "path": None},
              {"bytes": png(7), "path": "p"}]
    pq.write_table(pa.table({"image": pa.array(images, STRUCT), "label": [i % 2 for i in range(8)]}), tmp_path / "t.parquet",
                   compression=codec, use_dictionary=False, data_page_version=version)
    source = scan_parquet([str(tmp_path / "t.parquet")], label_column="label", max_bytes=1000)
    build_images(source, tmp_path / "pack", BuildSettings(), ImageSettings(size=16, mode="raw"))
    sources, labels, skipped = pack_rows(tmp_path / "pack")
    assert sources == [f"t.parquet:{i}" for i in (0, 2, 4, 5, 7)] and labels == [0, 0, 0, 1, 1]
    assert skipped == {"t.parquet:1": ("no image", "the image column is null"),
                       "t.parquet:3": ("too large", "5,000 bytes, over the 1,000-byte cap on one sample (--max-bytes)"),
                       "t.parquet:6": ("no image", "the image's bytes and path are null")}


def test_a_dictionary_page_over_the_cap_is_read_up_to_the_page_budget(tmp_path, monkeypatch):
    """pyarrow's writer puts a row group's first images in a dictionary page (100 images of 3 MB: one page
    of 286 MiB): over the cap, it is still read, whole, up to PAGE_BUDGET; past that its row group is skipped."""
    from dataprep.sources import parquet, parquet_pages

    cells = [np.random.default_rng(i).bytes(50_000) for i in range(10)]
    pq.write_table(pa.table({"image": pa.array(cells, pa.binary()), "label": list(range(10))}), tmp_path / "d.parquet",
                   row_group_size=5)

    def read(cap):
        source = parquet.scan_parquet([str(tmp_path / "d.parquet")], label_column="label", max_bytes=cap)
        split = source.splits[0]
        return list(split.reader.open(str(source.root), split.paths, split.locators))

    assert read(100_000) == cells  # dictionary pages of 250 KB over a 100 KB cap
    monkeypatch.setattr(parquet_pages, "PAGE_BUDGET", 200_000)
    got = read(100_000)
    assert all(isinstance(g, parquet.ImageDecodeError) and g.reason == "too large" for g in got)
    assert "the size the dictionary page of column 'image' declares; its row group is not read" in got[0].detail


def test_a_big_cell_under_the_cap_costs_the_others_of_its_batch_nothing(tmp_path):
    f = bomb_parquet(tmp_path / "big.parquet", 40 << 20, rows=6, at=2, page_rows=1)
    build_bomb(f, tmp_path / "pack", 64 << 20)
    sources, labels, skipped = pack_rows(tmp_path / "pack")
    assert sources == [f"big.parquet:{i}" for i in (0, 1, 3, 4, 5)]
    assert {s: r for s, (r, _) in skipped.items()} == {"big.parquet:2": "not an image"}


def test_arrow_cells_and_captions_over_the_cap_are_skipped_by_their_offsets(tmp_path):
    from dataprep.images.build import build_images
    from dataprep.images.settings import ImageSettings
    from dataprep.settings import BuildSettings
    from dataprep.sources.parquet import scan_parquet

    t = table()
    t = t.set_column(0, "image", pa.array([png(i) if i != 5 else bytes(5000) for i in range(ROWS)], pa.binary()))
    t = t.set_column(2, "caption", pa.array([f"c{i}" if i != 6 else "y" * 5000 for i in range(ROWS)]))
    (tmp_path / "t.arrow").write_bytes(ipc(t, "file"))
    source = scan_parquet([str(tmp_path / "t.arrow")], label_column="label", caption_column="caption", max_bytes=4096)
    assert [(s["source"], s["reason"]) for s in source.splits[0].skipped] == [("t.arrow:6", "too large")]
    assert source.splits[0].skipped[0]["detail"] == "column 'caption': 5,000 bytes, over the 4,096-byte cap on one sample (--max-bytes)"
    build_images(source, tmp_path / "pack", BuildSettings(), ImageSettings(size=16, mode="raw"))
    sources, _, skipped = pack_rows(tmp_path / "pack")
    assert sources == [f"t.arrow:{i}" for i in (0, 1, 2, 3, 4, 7)]
    assert skipped["t.arrow:5"] == ("too large", "5,000 bytes, over the 4,096-byte cap on one sample (--max-bytes)")


IPC_BOMB = """
import numpy as np, pyarrow as pa, sys
from dataprep.synthetic import index_image
import cv2
def png(i):
    return cv2.imencode(".png", cv2.cvtColor(index_image(i, 20, 24), cv2.COLOR_RGB2BGR))[1].tobytes()
cells, size = [png(0), png(1), None, png(3)], int(sys.argv[2])
sizes = [len(c) if c else size for c in cells]
offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
data = np.zeros(int(offsets[-1]), np.uint8)
for c, o in zip(cells, offsets):
    if c:
        data[o:o + len(c)] = np.frombuffer(c, np.uint8)
image = pa.Array.from_buffers(pa.binary(), 4, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
batch = pa.record_batch([image, pa.array([0, 1, 0, 1])], names=["image", "label"])
small = pa.record_batch([pa.array([png(4), png(5)]), pa.array([0, 1])], names=["image", "label"])
with pa.ipc.new_file(sys.argv[1], batch.schema, options=pa.ipc.IpcWriteOptions(compression=sys.argv[3] or None)) as w:
    w.write_batch(batch)
    w.write_batch(small)
"""


@pytest.mark.parametrize("compression", ["", "lz4"])
def test_an_arrow_cell_over_the_cap_costs_nothing_to_skip(tmp_path, compression):
    """600 MiB cell in an Arrow file: uncompressed, read in place from the memory map (reading some columns
    only would copy them) and skipped by its offsets; compressed (2.4 MB of LZ4), its batch is not
    decompressed: what its buffers declare says a cell is over the cap."""
    f = tmp_path / "big.arrow"
    subprocess.run([sys.executable, "-c", IPC_BOMB, str(f), str(600 << 20), compression], check=True, timeout=120)
    peak = build_bomb(f, tmp_path / "pack")
    print(f"{compression or 'uncompressed'}: {f.stat().st_size:,} bytes, peak RSS {peak / 2**20:.0f} MiB")
    assert peak < 400 << 20
    sources, labels, skipped = pack_rows(tmp_path / "pack")
    too_large = f"{600 << 20:,} bytes, over the {256 << 20:,}-byte cap on one sample (--max-bytes)"
    if compression:  # the batch goes whole, its other rows saying why
        assert sources == ["big.arrow:4", "big.arrow:5"]
        assert skipped["big.arrow:2"] == ("too large", f"column 'image': {too_large}")
        assert {r for r, _ in skipped.values()} == {"too large"} and len(skipped) == 4
        assert "in compressed record batch 0 of big.arrow with a cell over the cap" in skipped["big.arrow:0"][1]
    else:
        assert sources == [f"big.arrow:{i}" for i in (0, 1, 3, 4, 5)] and labels == [0, 1, 1, 0, 1]
        assert skipped == {"big.arrow:2": ("too large", too_large)}


def test_the_table_reader_refuses_a_lying_feather_file_instead_of_crashing(tmp_path):
    """`dataprep table`'s reader (pandas over pyarrow) had the same flaw: SIGSEGV on a lying string offset."""
    t = pa.table({"x": [1.0, 2.0, 3.0, 4.0], "s": ["aa", "bbb", "c", "dddd"], "y": [0, 1, 0, 1]})
    pa.feather.write_feather(t, tmp_path / "t.feather", compression="uncompressed")
    f = tmp_path / "lie.feather"
    f.write_bytes(lie((tmp_path / "t.feather").read_bytes(), [0, 2, 5, 6, 10], 2, 0x7FFFFF00))
    r = cli("table", f, "--target", "y", "--out", tmp_path / "p")
    assert_clean(r)
    assert r.returncode == 1 and f"{f}: invalid table data" in r.stderr and "out of bounds" in r.stderr, r.stderr
    r = cli("table", tmp_path / "t.feather", "--target", "y", "--out", tmp_path / "p")
    assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------------------------------------------------
# 4. Image structs whose path leaves the dataset


def test_image_paths_resolve_inside_the_dataset_or_are_refused_alike(tmp_path):
    ds = tmp_path / "ds"
    (ds / "imgs").mkdir(parents=True)
    outside = tmp_path / "outside.png"
    outside.write_bytes(png(2))
    for i in (1, 8):
        (ds / "imgs" / f"{i}.png").write_bytes(png(i))
    (ds / "link.png").symlink_to(outside)  # a symlink inside, to a file outside
    (ds / "etc").symlink_to("/etc")
    with open(ds / "big.png", "wb") as f:  # sparse: over the 256 MiB cap without a byte on disk
        f.truncate(300 << 20)
    paths = {1: "imgs/1.png", 2: "../outside.png", 3: "../missing.png", 4: str(outside), 5: "/etc/passwd",
             6: "/nonexistent/x.png", 7: "link.png", 8: "imgs/../imgs/8.png", 9: "big.png", 10: "etc/passwd",
             11: "imgs/../../outside.png"}
    images = [{"bytes": png(0), "path": None}] + [{"bytes": None, "path": paths[i]} for i in range(1, 12)]
    pq.write_table(pa.table({"image": pa.array(images, STRUCT), "label": [i % 2 for i in range(12)]}), ds / "t.parquet")
    r = cli("build", "parquet", ds / "t.parquet", "--out", tmp_path / "pack", *BUILD)
    assert_clean(r)
    assert r.returncode == 0, r.stderr
    sources, labels, skipped = pack_rows(tmp_path / "pack")
    assert sources == ["t.parquet:0", "t.parquet:1", "t.parquet:8"] and labels == [0, 1, 0]
    refused = {i: skipped.pop(f"t.parquet:{i}") for i in (2, 3, 4, 5, 6, 7, 10, 11)}
    for i, (reason, detail) in refused.items():  # one reason, one detail: nothing says what is out there
        assert (reason, detail) == ("bad path", f"the image path {paths[i]!r} is not inside the dataset's folder")
    assert skipped == {"t.parquet:9": ("too large", f"{300 << 20:,} bytes, over the {256 << 20:,}-byte cap on one "
                                                    "sample (--max-bytes)")}


# ---------------------------------------------------------------------------------------------------------
# 5. Fuzz: lying buffers and bytes, every case built in one child that must survive them all

FUZZ = r"""
import json, os, sys, tempfile, traceback
import pyarrow as pa, pyarrow.ipc, pyarrow.parquet as pq
from dataprep.errors import DataprepError
from dataprep.images.build import build_images
from dataprep.images.settings import ImageSettings
from dataprep.settings import BuildSettings
from dataprep.sources.parquet import scan_parquet
import dataprep

def data_labels(path, fmt):
    # the labels as the mutated file holds them, read apart and validated, or None when they are not valid
    try:
        if fmt == "parquet":
            col = pq.read_table(path, columns=["label"]).column("label")
        else:
            opener = pa.ipc.open_file if fmt == "file" else pa.ipc.open_stream
            schema = opener(pa.memory_map(path)).schema
            r = opener(pa.memory_map(path), options=pa.ipc.IpcReadOptions(included_fields=[schema.get_field_index("label")]))
            batches = [r.get_batch(i) for i in range(r.num_record_batches)] if fmt == "file" else list(r)
            col = pa.chunked_array([b.column("label") for b in batches], schema.field("label").type)
        col.validate(full=True)
        return col.to_pylist()
    except Exception:
        return None

cases = json.load(open(sys.argv[1]))
work = tempfile.mkdtemp()
for n, (fmt, path) in enumerate(cases):
    print(json.dumps({"case": n, "start": path}), flush=True)
    out = os.path.join(work, f"p{n}")
    try:
        cap = 200 if n % 3 == 0 else None  # a cap under every page and batch (not cell): the paths around them
        src = scan_parquet([path], label_column="label", caption_column="caption", max_bytes=cap)
        build_images(src, out, BuildSettings(), ImageSettings(size=16, mode="raw"))
        ds = dataprep.InMemoryImageDataset(out, "train", as_numpy=True)
        want = data_labels(path, fmt)
        rows = [int(s.rsplit(":", 1)[1]) for s in ds.sources]
        got = [ds.classes[k] for k in ds.labels.tolist()]
        ok = not rows or (want is not None and got == [str(want[r]) for r in rows])
        print(json.dumps({"case": n, "result": "built" if ok else "wrong", "rows": rows, "got": got,
                          "want": want and [want[r] for r in rows]}), flush=True)
    except DataprepError as e:
        print(json.dumps({"case": n, "result": "error", "message": str(e)[:300]}), flush=True)
    except Exception:
        print(json.dumps({"case": n, "result": "crash", "traceback": traceback.format_exc()}), flush=True)
"""


def fuzz_cases(tmp_path: Path, count: int) -> list[tuple[str, str]]:
    """`count` mutations (seeded) of small valid tables: an IPC file, an IPC stream (one of each compressed)
    and Parquet; half rewrite one offset of a text or binary column (anything: huge, negative, off by a
    little), half flip random bytes."""
    rng = np.random.default_rng(40)
    t = table(6)
    bases = {"file": ipc(t, "file"), "stream": ipc(t, "stream"), "file-lz4": ipc(t, "file", compression="lz4"),
             "stream-zstd": ipc(t, "stream", compression="zstd")}
    pq.write_table(t, tmp_path / "base.parquet", row_group_size=BATCH, compression="none")
    bases["parquet"] = (tmp_path / "base.parquet").read_bytes()
    pq.write_table(t, tmp_path / "base-z.parquet", row_group_size=3, compression="zstd", use_dictionary=False)
    bases["parquet-zstd"] = (tmp_path / "base-z.parquet").read_bytes()
    hf = t.set_column(0, "image", pa.array([{"bytes": c, "path": None} for c in t.column("image").to_pylist()], STRUCT))
    pq.write_table(hf, tmp_path / "base-hf.parquet", row_group_size=3, max_rows_per_page=2)
    bases["parquet-hf"] = (tmp_path / "base-hf.parquet").read_bytes()
    bases["stream-hf"] = ipc(hf.set_column(2, "caption", t.column("caption").dictionary_encode()), "stream")
    names = sorted(bases)
    out = []
    for n in range(count):
        name = names[n % len(names)]
        data = bytearray(bases[name])
        uncompressed = name in ("file", "stream")
        if n % 2 == 0 and uncompressed:
            col = t.column(["image", "caption"][int(rng.integers(0, 2))]).to_pylist()
            b = int(rng.integers(0, 3))
            offs = batch_offsets([c.encode() if isinstance(c, str) else c for c in col], b)
            k = int(rng.integers(0, len(offs)))
            new = int(rng.choice([rng.integers(-2**31, 2**31), offs[-1] + int(rng.integers(1, 64)), -int(rng.integers(1, 64)),
                                  offs[k] + int(rng.integers(-8, 9))]))
            data = bytearray(lie(bytes(data), offs, k, new))
        else:
            for _ in range(int(rng.integers(1, 5))):
                data[int(rng.integers(8, len(data) - 8))] = int(rng.integers(0, 256))
        fmt = "parquet" if name.startswith("parquet") else name.split("-")[0]
        p = tmp_path / f"case{n}.{'parquet' if fmt == 'parquet' else 'arrow' if fmt == 'file' else 'arrows'}"
        p.write_bytes(bytes(data))
        out.append((fmt, str(p)))
    return out


def test_fuzzed_arrow_and_parquet_files_never_crash_nor_give_wrong_labels(tmp_path):
    cases = fuzz_cases(tmp_path, 200)
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    r = subprocess.run([sys.executable, "-c", FUZZ, str(tmp_path / "cases.json")], capture_output=True, text=True,
                       timeout=300)
    lines = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    started = [x for x in lines if "start" in x]
    assert r.returncode == 0, f"signal {-r.returncode} in case {started[-1] if started else None}: {r.stderr[-2000:]}"
    results = {x["case"]: x for x in lines if "result" in x}
    assert len(results) == len(cases)
    bad = [x for x in results.values() if x["result"] in ("crash", "wrong")]
    assert not bad, bad[:3]
    kinds = {x["result"] for x in results.values()}
    assert kinds == {"built", "error"}, kinds  # both happen: the fuzz reaches the build and the refusals
    print({k: sum(x["result"] == k for x in results.values()) for k in kinds})
