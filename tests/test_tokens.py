"""Token packs: exact round trips with a trained byte-level BPE, the corpus WordPiece tokenizer, windows,
documents, input formats and bad input."""
import gzip
import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from dataprep.cli import main
from dataprep.errors import DataprepError, PackError, SourceError
from dataprep.pack.backends import read_manifest
from dataprep.tokens.dataset import DocumentDataset, TokenDataset
from dataprep.tokens.read import expand
from dataprep.tokens.tokenize import TokenizeSettings, load_tokenizer, token_dtype, tokenize

from .conftest import corpus_dir, within

DOCS = [
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife.",
    "Call me Ishmael.\nSome years ago - never mind how long precisely - having little or no money in my purse...",
    "  Leading spaces, tabs\tand ünïcödé survive: 日本語 and emoji 🙂 too.  ",
    "x = [i ** 2 for i in range(10)]  # code is text as well",
] * 5


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def bpe_pack(tmp_path_factory):
    base = tmp_path_factory.mktemp("bpe")
    src = base / "docs.jsonl.gz"
    with gzip.open(src, "wt", encoding="utf-8") as f:
        for d in DOCS:
            f.write(json.dumps({"text": d}) + "\n")
    tokenize([str(src)], base / "p", TokenizeSettings(), train_bpe_vocab=400)
    return base / "p"


def test_byte_level_bpe_round_trips_exactly(bpe_pack):
    m = read_manifest(bpe_pack)
    tok = load_tokenizer(str(bpe_pack / "tokenizer.json"))
    docs = DocumentDataset(bpe_pack)
    assert len(docs) == len(DOCS) and m["fields"]["tokens"]["dtype"] == "<u2"
    for i, text in enumerate(DOCS):
        assert tok.decode(docs[i].tolist(), skip_special_tokens=False) == text
    assert m["tokenizer"]["eot_id"] == tok.token_to_id("<|endoftext|>") and m["tokenizer"]["trained_here"]
    assert m["splits"]["train"]["tokens"] == sum(len(docs[i]) + 1 for i in range(len(docs)))


def test_windows(bpe_pack):
    seq = TokenDataset(bpe_pack, context=16, mode="sequential")
    x, y = seq[0]
    assert x.dtype == torch.int64 and x.shape == (16,) and torch.equal(x[1:], y[:-1])
    flat = seq.data.tokens
    assert len(seq) == (len(flat) - 1) // 16 and x.tolist() == flat[:16].tolist()
    xb, yb = seq[[0, 1, 2]]
    assert xb.shape == (3, 16) and torch.equal(xb[1], torch.from_numpy(flat[16:32].astype(np.int64)))
    r1, r2 = TokenDataset(bpe_pack, 16, seed=1), TokenDataset(bpe_pack, 16, seed=1)
    assert torch.equal(r1[[0, 1, 2, 3]][0], r2[[0, 1, 2, 3]][0])
    r2.set_epoch(1)
    assert not torch.equal(r1[[0, 1, 2, 3]][0], r2[[0, 1, 2, 3]][0])
    stored = TokenDataset(bpe_pack, 16, dtype="stored", cache="mmap")
    assert stored[0][0].dtype == torch.uint16
    items = seq.__getitems__([0, 1])
    assert len(items) == 2 and torch.equal(items[1][0], xb[1])


def test_the_fast_loader_serves_windows(bpe_pack):
    from dataprep.serve.loader import Loader

    seq = TokenDataset(bpe_pack, context=8, mode="sequential")
    got = [(x.clone(), y.clone()) for x, y in Loader(seq, 4, num_workers=2)]
    assert sum(len(x) for x, _ in got) == len(seq)
    x0, y0 = seq[[0, 1, 2, 3]]
    assert torch.equal(got[0][0], x0) and torch.equal(got[0][1], y0)


def test_dtype_choice():
    assert token_dtype(30522) == np.dtype("<u2") and token_dtype(65536) == np.dtype("<u2")
    assert token_dtype(65537) == np.dtype("<u4")


@pytest.mark.corpus
def test_wordpiece_on_the_corpus(tmp_path):
    text = sorted(corpus_dir("text").glob("*.txt"))[:3]
    tok = corpus_dir("tokenizer") / "tokenizer.json"
    r = cli("tokenize", *text, "--tokenizer", tok, "--split-docs", "paragraph", "--val-fraction", "0.1", "--out", tmp_path / "p")
    assert r.exit_code == 0, r.output
    m = read_manifest(tmp_path / "p")
    assert m["tokenizer"]["vocab_size"] == 30522 and m["fields"]["tokens"]["dtype"] == "<u2"
    assert m["tokenizer"]["eot_id"] == 102  # [SEP]
    docs = DocumentDataset(tmp_path / "p")
    assert max(len(docs[i]) for i in range(len(docs))) > 128  # the file's truncation to 128 was switched off
    assert 0 not in docs[0].tolist()  # nor its padding ([PAD] = 0)
    paragraphs = [p for f in text for p in f.read_text(encoding="utf-8").replace("\r\n", "\n").split("\n\n") if p.strip()]
    assert m["splits"]["train"]["count"] + m["splits"]["val"]["count"] == len(paragraphs)
    wp = load_tokenizer(str(tok))
    first = wp.decode(docs[0].tolist())
    assert first.split()[:3] == wp.decode(wp.encode(paragraphs[0], add_special_tokens=False).ids).split()[:3]


def test_inputs_lines_csv_globs_and_bad_bytes(tmp_path, bpe_pack):
    (tmp_path / "a.txt").write_bytes("first line\nsecond line\n\xff\xfe broken\n".encode("latin-1").replace(b"\xc3", b""))
    (tmp_path / "b.csv").write_text("id,body\n1,hello there\n2,general kenobi\n")
    tok = bpe_pack / "tokenizer.json"
    r = cli("tokenize", tmp_path / "*.txt", "--tokenizer", tok, "--split-docs", "line", "--out", tmp_path / "p")
    assert r.exit_code == 0, r.output
    assert read_manifest(tmp_path / "p")["splits"]["train"]["count"] == 3
    assert "not UTF-8, replaced" in r.output and "a.txt: 2" in r.output
    r = cli("tokenize", tmp_path / "a.txt", "--tokenizer", tok, "--strict", "--out", tmp_path / "q")
    assert r.exit_code == 1 and "a.txt: not UTF-8 at byte" in r.output
    r = cli("tokenize", tmp_path / "b.csv", "--tokenizer", tok, "--text-field", "body", "--out", tmp_path / "c")
    assert r.exit_code == 0 and read_manifest(tmp_path / "c")["splits"]["train"]["count"] == 2
    r = cli("tokenize", tmp_path / "b.csv", "--tokenizer", tok, "--text-field", "text", "--out", tmp_path / "d")
    assert r.exit_code == 1 and "no column 'text'" in r.output


def test_bad_input(tmp_path, bpe_pack):
    (tmp_path / "empty.txt").write_text("   \n\n")
    r = cli("tokenize", tmp_path / "empty.txt", "--tokenizer", bpe_pack / "tokenizer.json", "--out", tmp_path / "p")
    assert r.exit_code == 1 and "no documents" in r.output
    r = cli("tokenize", tmp_path / "empty.txt", "--tokenizer", tmp_path / "nope.json", "--out", tmp_path / "q")
    assert r.exit_code == 1 and "nope.json: tokenizer file does not exist" in r.output
    (tmp_path / "fake.json").write_text('{"not": "a tokenizer"}')
    r = cli("tokenize", tmp_path / "empty.txt", "--tokenizer", tmp_path / "fake.json", "--out", tmp_path / "r")
    assert r.exit_code == 1 and "fake.json: not a tokenizers JSON file" in r.output
    with pytest.raises(SourceError, match="no such file"):
        expand([str(tmp_path / "missing" / "*.txt")])
    with pytest.raises(DataprepError, match="fewer than one window"):
        TokenDataset(bpe_pack, context=10**7)


def test_parquet_text_column(tmp_path, bpe_pack):
    import pandas as pd

    pd.DataFrame({"body": DOCS[:4], "n": range(4)}).to_parquet(tmp_path / "d.parquet")
    r = cli("tokenize", tmp_path / "d.parquet", "--tokenizer", bpe_pack / "tokenizer.json", "--text-field", "body", "--out", tmp_path / "p")
    assert r.exit_code == 0, r.output
    tok = load_tokenizer(str(bpe_pack / "tokenizer.json"))
    docs = DocumentDataset(tmp_path / "p")
    assert [tok.decode(docs[i].tolist()) for i in range(4)] == DOCS[:4]


# -- bounded memory: files streamed, long documents in pieces -------------------------------------------------
def _whole_file_docs(text: str, split: str) -> list[str]:
    """What the reader gives reading files whole (the reference for the streamed reader)."""
    docs = [text] if split == "file" else text.splitlines() if split == "line" else [
        _text_lines(p) for p in text.replace("\r\n", "\n").split("\n\n")]
    return [d for d in docs if d and d.strip()]


def _text_lines(par: str) -> str:
    """A paragraph from its first line with text to its last, without the boundary after the last."""
    lines = par.splitlines(keepends=True)
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return "".join(lines[:-1]) + lines[-1].splitlines()[0] if lines else ""


@pytest.mark.parametrize("split", ["file", "line", "paragraph"])
def test_the_streamed_reader_gives_the_documents_a_whole_file_read_gives(tmp_path, split, monkeypatch):
    from dataprep.tokens import read

    text = ("first line\r\nsecond\rthird\u2028fourth\n\n\npara two ünï 日本語\r\n\r\n  \n\nxx\r\r\ny\r\r\n\nlast" + " word" * 50) * 3
    raw = text.encode("utf-8")[:-3] + b"\xff\xfe broken \xc3" + text.encode("utf-8")[-3:]
    f = tmp_path / "t.txt"
    f.write_bytes(raw)
    ref_text = raw.decode("utf-8", errors="replace")
    for block in (1, 2, 3, 7, 64):  # every block boundary: inside \r\n, inside a multi-byte character, ...
        monkeypatch.setattr(read, "BLOCK", block)
        stats = read.ReadStats()
        got = ["".join(doc) for doc in _docs(read.pieces([str(f)], split, stats=stats, limit=1 << 20))]
        assert got == _whole_file_docs(ref_text, split), block
        assert stats.replaced == {str(f): 3} and stats.documents == len(got)
    with pytest.raises(SourceError, match="not UTF-8 at byte"):
        list(read.pieces([str(f)], split, strict=True))


PARAGRAPHS = ("first para\n\n\nsecond para\r\n\r\n\r\n\r\nthird\r\n  kept  \n \n\t\n\n\n\n"
              "\n\n\n    indented code\n    more\r\n\r\n\r\na\n \nb\n  \n\n\r\n\r\n\r\n   \n\nlast one\n\n\n")
SEPARATED = ["first para", "second para", "third\n  kept  ", "    indented code\n    more", "a\n \nb", "last one"]


@pytest.mark.parametrize("limit", [1 << 20, 6])
def test_paragraphs_after_several_blank_lines_start_and_end_with_text(tmp_path, limit, monkeypatch):
    """Runs of blank lines (\\n\\n\\n, \\r\\n\\r\\n\\r\\n, lines of spaces) between paragraphs, at every block
    boundary, and (limit 6) in long documents handed on in pieces: no document starts or ends with a line
    boundary or a whitespace-only line; indentation, trailing spaces and blank lines inside stay."""
    from dataprep.tokens import read

    f = tmp_path / "p.txt"
    f.write_bytes(PARAGRAPHS.encode("utf-8"))
    assert _whole_file_docs(PARAGRAPHS, "paragraph") == SEPARATED
    for block in (1, 2, 3, 5, 7, 11, 64, 1 << 20):
        monkeypatch.setattr(read, "BLOCK", block)
        stats = read.ReadStats()
        docs = _docs(read.pieces([str(f)], "paragraph", stats=stats, limit=limit))
        assert ["".join(d) for d in docs] == SEPARATED, block
        assert stats.documents == len(SEPARATED)
        if limit == 6:
            assert max(len(d) for d in docs) > 1 and all(len(p) <= 2 * limit + 1 for d in docs for p in d)
    # whitespace runs longer than a piece: at the end of a paragraph, inside one, at the start of one
    f.write_text("text\n" + " \n" * 40 + "\n" + "x" + " \n" * 40 + "y\n" + "\t" * 30 + "\n \n\n" + " \n" * 40 + "  z \n \n", encoding="utf-8")
    got = ["".join(d) for d in _docs(read.pieces([str(f)], "paragraph", limit=6))]
    assert got == ["text", "x" + " \n" * 40 + "y", "  z "]


def test_trimmed_paragraphs_in_pieces_encode_to_the_ids_of_the_whole_paragraph(tmp_path, bpe_pack):
    tok = load_tokenizer(str(bpe_pack / "tokenizer.json"))  # byte-level: a cut inside a run of spaces would show
    long = "  lead" + "".join(f" w{k}{' ' * (k % 4)}" + " \n" * (k % 3) for k in range(60)) + "  end  "  # ~500 characters
    text = PARAGRAPHS + " \n" * 15 + "\n" + long + "\n\t   " * 10 + "\n\n\n" + "\n \n" * 15 + "\n\n" + long + "\n \n"
    (tmp_path / "p.txt").write_text(text, encoding="utf-8")
    tokenize([str(tmp_path / "p.txt")], tmp_path / "p", TokenizeSettings(split="paragraph", chunk_bytes=64), str(bpe_pack / "tokenizer.json"))
    docs = DocumentDataset(tmp_path / "p")
    want = SEPARATED + [long, long]
    assert [docs[i].tolist() for i in range(len(docs))] == [tok.encode(d, add_special_tokens=False).ids for d in want]


@pytest.mark.corpus
def test_no_corpus_paragraph_starts_or_ends_with_a_blank_line():
    from dataprep.tokens.read import documents

    docs = list(documents(sorted(str(p) for p in corpus_dir("text").glob("*.txt")), "paragraph"))
    lines = [d.splitlines() for d in docs]
    assert len(docs) > 30_000
    assert sum(1 for ls in lines if not ls[0].strip() or not ls[-1].strip()) == 0
    assert sum(1 for d in docs if d[-1] in "\r\n") == 0


def _docs(pieces):
    out, cur = [], []
    for p, last in pieces:
        cur.append(p)
        if last:
            out.append(cur)
            cur = []
    assert not cur
    return out


def test_a_long_document_comes_in_bounded_pieces_cut_at_whitespace(tmp_path):
    from dataprep.tokens import read

    words = [f"w{k % 977}" + "é" * (k % 3) for k in range(40_000)]
    doc = " ".join(words)
    f = tmp_path / "one.txt"
    f.write_text(doc + "\n" + "short line\n", encoding="utf-8")
    docs = _docs(read.pieces([str(f)], "line", limit=5000))
    assert len(docs) == 2 and docs[1] == ["short line"]
    assert len(docs[0]) > 40 and max(len(p) for p in docs[0]) <= 2 * 5000 and "".join(docs[0]) == doc
    assert all(p[0].isspace() for p in docs[0][1:])  # each cut is before a space: the space leads the next piece


@pytest.mark.parametrize("tokenizer", ["bpe", "wordpiece"])
@pytest.mark.corpus
def test_a_long_document_encodes_to_the_ids_of_the_whole_document(tmp_path, tokenizer, bpe_pack):
    """Pieces cut at whitespace give the ids whole-document encoding gives, for tokenizers that split words
    at whitespace (byte-level BPE, WordPiece); one end-of-text id ends the document."""
    from tokenizers import Tokenizer

    tok_file = bpe_pack / "tokenizer.json" if tokenizer == "bpe" else corpus_dir("tokenizer", "tokenizer.json")
    tok = Tokenizer.from_file(str(tok_file))
    tok.no_truncation()  # the corpus file truncates at 128 (dataprep switches that off too)
    tok.no_padding()
    # ~1 MB in one document, with runs of spaces and tabs (indented code) where pieces may be cut
    text = "".join(f"word{k % 313}{' ' * (1 + k % 5)}ünï,{k}{chr(9) * (k % 3)} " for k in range(50_000))
    (tmp_path / "long.txt").write_text(text + "\nnext document\n", encoding="utf-8")
    tokenize([str(tmp_path / "long.txt")], tmp_path / "p", TokenizeSettings(split="line", chunk_bytes=64 << 10), str(tok_file))
    docs = DocumentDataset(tmp_path / "p")
    assert len(docs) == 2
    want = tok.encode(text, add_special_tokens=False).ids
    assert docs[0].tolist() == want and len(want) > 100_000
    assert (tmp_path / "p" / "manifest.json").is_file()
    assert docs[1].tolist() == tok.encode("next document", add_special_tokens=False).ids


@pytest.mark.slow
@pytest.mark.corpus
def test_a_20_mb_single_line_document_stays_within_bounded_memory(tmp_path):
    """It peaked at 3.3 GB when a line was read and encoded whole; now pieces of --chunk-mb bound it."""
    import subprocess
    import sys

    f = tmp_path / "line.txt"
    with open(f, "w", encoding="utf-8") as out:
        for k in range(20):
            out.write(" ".join(f"w{(k * 7919 + j) % 5003}" for j in range(170_000)) + " ")
    tok = corpus_dir("tokenizer", "tokenizer.json")
    # VmHWM, not ru_maxrss: Linux keeps ru_maxrss across exec, so a child of pytest would report pytest's own size
    code = ("import sys\nfrom dataprep.tokens.tokenize import TokenizeSettings, tokenize\n"
            "r = tokenize([sys.argv[1]], sys.argv[2], TokenizeSettings(split='line'), sys.argv[3])\n"
            "hwm = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:'))\n"
            "print(r['documents'], r['tokens'], hwm // 1024)\n")
    out = subprocess.run([sys.executable, "-c", code, str(f), str(tmp_path / "p"), str(tok)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-500:]
    docs, tokens, peak_mb = (int(x) for x in out.stdout.split())
    assert docs == 1 and tokens > 3_000_000
    assert peak_mb < 600, f"peak RSS {peak_mb} MB"


def test_a_huge_jsonl_line_is_read_in_linear_time_and_text_inputs_must_be_regular_files(tmp_path, monkeypatch):
    import os
    import time

    from dataprep.tokens import read

    monkeypatch.setattr(read, "BLOCK", 4096)  # many blocks per line: a rescan per block would be quadratic
    body = "word " * 400_000  # 2 MB in one JSON line = 500 blocks
    f = tmp_path / "big.jsonl"
    f.write_text(json.dumps({"text": body}) + "\n" + json.dumps({"text": "small"}) + "\n")
    t0 = time.perf_counter()
    docs = ["".join(d) for d in _docs(read.pieces([str(f)], limit=1 << 20))]
    took = time.perf_counter() - t0
    assert docs == [body, "small"]
    os.symlink("/dev/zero", tmp_path / "zeros.txt")
    os.mkfifo(tmp_path / "pipe.txt")
    assert expand([str(tmp_path / "*")]) == [str(f)]  # a glob never yields a FIFO or a symlink to a device
    with pytest.raises(SourceError, match="not a regular file"):
        list(read.pieces([str(tmp_path / "zeros.txt")]))
    within(took, 20, "reading a 2 MB JSON line in 4 KiB blocks")


# -- the pack carries its tokenizer ---------------------------------------------------------------------------
def _tokenize_with_a_moved_tokenizer(tmp_path, tok_file, src, split="file", **kw):
    """Tokenize with a copy of `tok_file` that is deleted afterwards: the pack must not need it any more."""
    import shutil

    moved = tmp_path / "elsewhere" / "tokenizer.json"
    moved.parent.mkdir()
    shutil.copy(tok_file, moved)
    tokenize([str(src)], tmp_path / "p", TokenizeSettings(split=split, **kw), str(moved))
    shutil.rmtree(moved.parent)
    return tmp_path / "p"


def test_the_pack_carries_its_tokenizer_and_the_dataset_decodes_with_it(tmp_path, bpe_pack):
    import pickle

    from tokenizers import Tokenizer

    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS[:4]), encoding="utf-8")
    original = (bpe_pack / "tokenizer.json").read_bytes()
    pack = _tokenize_with_a_moved_tokenizer(tmp_path, bpe_pack / "tokenizer.json", src)
    m = read_manifest(pack)
    assert (pack / "tokenizer.json").read_bytes() == original  # the file's own bytes, not a re-serialisation
    assert m["tokenizer"]["file"] == "tokenizer.json" and m["attachments"]["tokenizer.json"]["bytes"] == len(original)
    ds = TokenDataset(pack, context=8)
    assert ds.data._tokenizer is None  # nothing read until asked for
    tok = ds.tokenizer
    assert isinstance(tok, Tokenizer) and tok is ds.tokenizer and tok.get_vocab_size() == ds.vocab_size
    ref = load_tokenizer(str(bpe_pack / "tokenizer.json"))
    for text in DOCS[:4] + ["unseen wörds\tand  spacing 🙂"]:
        ids = tok.encode(text, add_special_tokens=False).ids
        assert ids == ref.encode(text, add_special_tokens=False).ids
        assert tok.decode(ids) == ref.decode(ids) == text  # byte-level BPE: exact
    docs = DocumentDataset(pack)
    assert [tok.decode(docs[i].tolist()) for i in range(4)] == DOCS[:4]
    assert tok.id_to_token(ds.eot_id) == "<|endoftext|>"
    clone = pickle.loads(pickle.dumps(ds))  # what a spawned worker gets: no tokenizer until it asks
    assert clone.data._tokenizer is None and clone.tokenizer.encode("Call me").ids == tok.encode("Call me").ids


@pytest.mark.corpus
def test_the_corpus_wordpiece_round_trips_through_the_packs_copy(tmp_path):
    from tokenizers import Tokenizer

    tok_file = corpus_dir("tokenizer") / "tokenizer.json"
    src = sorted(corpus_dir("text").glob("*.txt"))[0]
    pack = _tokenize_with_a_moved_tokenizer(tmp_path, tok_file, src, "paragraph")
    ds = TokenDataset(pack, context=64)
    original = Tokenizer.from_file(str(tok_file))  # as the file is: padded and truncated to 128 ids
    texts = [p for p in src.read_text(encoding="utf-8").split("\n\n") if p.strip()][:300]
    short = [t for t in texts if original.encode(t).ids[-1] == 0]  # padded: not truncated
    assert len(short) > 200 and ds.tokenizer.get_vocab_size() == 30522
    for text in short:  # the original's decode drops the padding it added
        assert ds.tokenizer.decode(ds.tokenizer.encode(text).ids) == original.decode(original.encode(text).ids)
    original.no_padding()
    original.no_truncation()
    long = " ".join(texts)
    ids = ds.tokenizer.encode(long).ids
    assert len(ids) > 1000 and ids == original.encode(long).ids  # the copy encodes as the pack was: neither
    assert ds.tokenizer.decode(ids) == original.decode(ids)


def test_verify_catches_a_changed_or_missing_tokenizer_copy_on_every_backend(tmp_path, bpe_pack):
    from dataprep.pack.convert import convert
    from dataprep.verify import verify_pack

    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS[:4]), encoding="utf-8")
    pack = _tokenize_with_a_moved_tokenizer(tmp_path, bpe_pack / "tokenizer.json", src)
    assert verify_pack(pack).ok
    for fmt, out in (("hdf5", tmp_path / "p.h5"), ("zarr", tmp_path / "p.zarr")):  # the copy travels with conversions
        convert(pack, out, fmt)
        assert verify_pack(out).ok, verify_pack(out).problems
        assert TokenDataset(out, context=8).tokenizer.decode(DocumentDataset(out)[1].tolist()) == DOCS[1]
    copy = pack / "tokenizer.json"
    data = copy.read_bytes()
    copy.write_bytes(data.replace(b'"<|endoftext|>"', b'"<|endoftxet|>"', 1))  # same length, another tokenizer
    problems = verify_pack(pack).problems
    assert len(problems) == 1 and problems[0][0] == str(copy) and "checksum mismatch" in problems[0][1]
    with pytest.raises(PackError, match="tokenizer.json: checksum mismatch"):
        _ = TokenDataset(pack, context=8).tokenizer  # the property loads (and checks) the copy
    copy.unlink()
    assert [(p, w.split(";")[0]) for p, w in verify_pack(pack).problems] == [(str(copy), "missing")]
    with pytest.raises(PackError, match="tokenizer.json: missing"):
        _ = TokenDataset(pack, context=8).tokenizer


def test_a_pack_rebuilt_over_itself_with_its_own_tokenizer_copy(tmp_path, bpe_pack):
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS[:4]), encoding="utf-8")
    pack = _tokenize_with_a_moved_tokenizer(tmp_path, bpe_pack / "tokenizer.json", src)
    r = cli("tokenize", src, "--tokenizer", pack / "tokenizer.json", "--overwrite", "--out", pack)  # read before emptied
    assert r.exit_code == 0, r.output
    assert (pack / "tokenizer.json").read_bytes() == (bpe_pack / "tokenizer.json").read_bytes()
    assert TokenDataset(pack, context=8).tokenizer.decode(DocumentDataset(pack)[0].tolist()) == DOCS[0]


def test_packs_made_before_the_copy_still_load(tmp_path):
    import shutil
    from pathlib import Path

    v1 = Path(__file__).parent / "fixtures" / "v1" / "packs" / "tokens"
    ds = TokenDataset(v1, context=4, split="train")  # trained for the pack: its tokenizer was always beside it
    docs = DocumentDataset(v1, split="train")
    assert ds.tokenizer.get_vocab_size() == ds.vocab_size == 284
    made = {f"document {k} says " + "word " * (k + 3) for k in range(12)}  # what tests/fixtures/v1/make.py tokenized
    decoded = [ds.tokenizer.decode(docs[i].tolist()) for i in range(len(docs))]
    assert len(decoded) == 9 and set(decoded) <= made
    old = tmp_path / "old"  # a v1 pack made with a tokenizer file: the manifest held its path and hash only
    shutil.copytree(v1, old)
    (old / "tokenizer.json").unlink()
    m = json.loads((old / "manifest.json").read_text())
    m["tokenizer"].update(trained_here=False, path="/somewhere/tokenizer.json")
    (old / "manifest.json").write_text(json.dumps(m))
    ds = TokenDataset(old, context=4)
    assert len(ds) > 0 and ds.vocab_size == 284 and len(DocumentDataset(old)) == len(docs)  # it serves as before
    with pytest.raises(PackError, match="predates the tokenizer copy.*/somewhere/tokenizer.json"):
        _ = ds.tokenizer


def test_a_vocabulary_over_65536_makes_a_uint32_pack_end_to_end(tmp_path):
    """Ids above 65,535 need uint32: stored as <u4, served exactly (as int64 windows and documents), with
    the end-of-text id chosen by --eot after every document."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    vocab = {f"w{i}": i for i in range(70_000)}
    vocab.update({"[UNK]": 70_000, "[EOT]": 70_001})
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(tmp_path / "tok.json"))
    docs = ["w1 w69999 w65536 w70", "w65535 w65537 w2", "w3"]
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    tokenize([str(src)], tmp_path / "p", TokenizeSettings(split="line", eot="[EOT]"), tokenizer=str(tmp_path / "tok.json"))
    m = read_manifest(tmp_path / "p")
    assert m["fields"]["tokens"]["dtype"] == "<u4" and m["tokenizer"]["eot_id"] == 70_001
    got = DocumentDataset(tmp_path / "p")
    assert [got[i].tolist() for i in range(len(got))] == [tok.encode(d).ids for d in docs]
    flat = TokenDataset(tmp_path / "p", context=4, mode="sequential").data.tokens
    assert flat.dtype == np.uint32 and flat.tolist() == [i for d in docs for i in tok.encode(d).ids + [70_001]]
    assert token_dtype(1 << 16) == np.dtype("<u2") and token_dtype((1 << 16) + 1) == np.dtype("<u4")


def _gapped_tokenizer(path) -> str:
    """A word-level vocabulary of 5 tokens (so uint16 is chosen) whose word "big" has id 70,000."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    tok = Tokenizer(WordLevel({"a": 0, "b": 1, "[UNK]": 2, "<|endoftext|>": 3, "big": 70_000}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(path))
    assert tok.get_vocab_size(with_added_tokens=True) == 5 and token_dtype(5) == np.dtype("<u2")
    return str(path)


@pytest.mark.parametrize("chunk_bytes", [8 << 20, 5], ids=["whole_documents", "long_document_pieces"])
def test_ids_that_do_not_fit_uint16_are_an_error_never_wrapped(tmp_path, chunk_bytes):
    """A tokenizer whose vocabulary size says uint16 but which gives id 70,000, and an --eot-id of 70,001 with
    that 5-token vocabulary: tokenize refuses, naming the id and the dtype, and writes no manifest (70,000
    as uint16 would be 4,464). Both ways documents are encoded: whole, and (longer than chunk_bytes) in
    pieces, where the end-of-text id is appended in the stored dtype (it was a numpy OverflowError there,
    and with numpy 1.x a silently wrapped id). The same documents without that word build exactly."""
    tok = _gapped_tokenizer(tmp_path / "tok.json")
    (tmp_path / "big.txt").write_text("a b\na big b a\n")
    (tmp_path / "small.txt").write_text("a b a b\nb a b a\n")
    for k, (src, eot_id, bad) in enumerate((("big.txt", None, 70_000), ("small.txt", 70_001, 70_001))):
        out = tmp_path / f"p{k}"
        with pytest.raises(DataprepError, match=f"{bad} does not fit in uint16"):
            tokenize([str(tmp_path / src)], out, TokenizeSettings(split="line", eot_id=eot_id, chunk_bytes=chunk_bytes), tokenizer=tok)
        assert not (out / "manifest.json").exists()
    tokenize([str(tmp_path / "small.txt")], tmp_path / "ok", TokenizeSettings(split="line", chunk_bytes=chunk_bytes), tokenizer=tok)
    docs = DocumentDataset(tmp_path / "ok")
    assert read_manifest(tmp_path / "ok")["fields"]["tokens"]["dtype"] == "<u2"
    assert [docs[i].tolist() for i in range(len(docs))] == [[0, 1, 0, 1], [1, 0, 1, 0]]
    flat = TokenDataset(tmp_path / "ok", context=2, mode="sequential").data.tokens
    assert flat.tolist() == [0, 1, 0, 1, 3, 1, 0, 1, 0, 3]  # each document, then <|endoftext|> (id 3)


# -- the val split and --resume do not depend on memory knobs (issue 51) -----------------------------------
def _lines_corpus(base, files=4, lines=1900):
    """`files` .txt files of a document per line (about 400 kB each; 1.6 MB in all, so --task-mb 1 makes two
    tasks and --chunk-mb 1 two chunks), with texts repeated within and across files and one 300 k-character
    line (encoded in pieces). Returns the files and every document in order."""
    rng = np.random.default_rng(51)
    words = [f"w{k}" for k in range(300)] + ["the", "a", "ünï", "日本", "🙂"]
    docs = []
    for i in range(files):
        for j in range(lines):
            if docs and j % 10 == 9:
                docs.append(docs[int(rng.integers(len(docs)))])  # a repeat, maybe of another file's document
            else:
                docs.append(" ".join(rng.choice(words, int(rng.integers(5, 60)))))
        if i == 1:
            docs.append(" ".join(rng.choice(words, 90_000)))  # > PIECE_CHARS: handed on in pieces
    paths, k = [], 0
    for i in range(files):
        n = lines + (i == 1)
        p = base / f"part{i}.txt"
        p.write_text("\n".join(docs[k:k + n]) + "\n", encoding="utf-8")
        paths.append(p)
        k += n
    assert k == len(docs) and max(len(d) for d in docs) > 256 << 10
    return paths, docs


@pytest.fixture(scope="module")
def lines_corpus(tmp_path_factory):
    """The corpus and a word-level tokenizer of its words (fast; decoding gives the text back)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    base = tmp_path_factory.mktemp("lines")
    paths, docs = _lines_corpus(base)
    words = sorted({w for d in docs for w in d.split()})
    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(["[UNK]", "<|endoftext|>", *words])}, unk_token="[UNK]"))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.save(str(base / "tok.json"))
    return paths, docs, base / "tok.json"


def _split_docs(pack) -> dict[str, list[tuple[int, ...]]]:
    """Per split, every document's ids, in order."""
    out = {}
    for n in read_manifest(pack)["splits"]:
        ds = DocumentDataset(pack, split=n)
        out[n] = [tuple(ds[i].tolist()) for i in range(len(ds))]
    return out


def test_the_val_split_is_the_same_whatever_the_chunk_and_task_sizes(lines_corpus, tmp_path):
    """Default, --chunk-mb 1 and --task-mb 1 (the smallest the options allow), and far smaller chunks, tasks
    and units through TokenizeSettings: the same val and train documents in the same order, the same token
    arrays. The val documents are exactly those whose text the manifest's rule (`in_val`) picks, and no text
    is in both splits. Before, the split came from the chunk's and task's numbers: other documents each time."""
    from dataprep import build
    from dataprep.tokens.tokenize import in_val

    paths, docs, tok = lines_corpus
    opts = dict(tokenizer=str(tok), split_docs="line", val_fraction=0.05, seed=7)
    build.tokenize(paths, tmp_path / "default", **opts)
    build.tokenize(paths, tmp_path / "chunk", chunk_mb=1, **opts)
    build.tokenize(paths, tmp_path / "task", task_mb=1, **opts)
    s = TokenizeSettings(split="line", val_fraction=0.05, seed=7, chunk_bytes=3000, task_bytes=300_000, unit_bytes=50_000,
                         shard_tokens=40_000)
    tokenize([str(p) for p in reversed(paths)], tmp_path / "small", s, str(tok))  # inputs listed in another order too
    m = read_manifest(tmp_path / "default")
    assert m["val_rule"]["name"] == "blake2b-text" and (m["val_rule"]["seed"], m["val_rule"]["fraction"]) == (7, 0.05)
    assert len(m["splits"]["val"]["shards"]) < len(read_manifest(tmp_path / "small")["splits"]["val"]["shards"])
    assert len(read_manifest(tmp_path / "task")["splits"]["train"]["shards"]) == 2  # two tasks
    want = _split_docs(tmp_path / "default")
    wp = load_tokenizer(str(tok))
    val_text = [d for d in docs if in_val(d, 7, 0.05)]
    assert [wp.decode(list(ids)) for ids in want["val"]] == val_text
    assert len(want["train"]) + len(want["val"]) == len(docs) and 0.03 < len(val_text) / len(docs) < 0.08
    assert not set(want["val"]) & set(want["train"])  # a repeated text is in one split only
    for name in ("chunk", "task"):
        assert _split_docs(tmp_path / name) == want, name
        for n in ("train", "val"):
            assert np.array_equal(TokenDataset(tmp_path / name, 8, split=n, mode="sequential").data.tokens,
                                  TokenDataset(tmp_path / "default", 8, split=n, mode="sequential").data.tokens), (name, n)
    small = _split_docs(tmp_path / "small")  # its documents come in the listed order: the same sets
    assert sorted(small["val"]) == sorted(want["val"]) and sorted(small["train"]) == sorted(want["train"])


def test_in_val_is_the_rule_the_manifest_states():
    """The rule as the manifest words it, computed here from its words: blake2b of the seed and the text."""
    import hashlib

    from dataprep.tokens.tokenize import in_val, val_rule

    texts = [f"document {k}" for k in range(2000)] + ["ünï 🙂 \ud800"]  # a lone surrogate, as json can give
    for seed, fraction in ((0, 0.1), (-3, 0.5), (2**70, 0.01)):
        bound = fraction * 2**64
        want = [int.from_bytes(hashlib.blake2b(b"dataprep-val\0" + str(seed).encode() + b"\0" +
                                               t.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little") < bound
                for t in texts]
        assert [in_val(t, seed, fraction) for t in texts] == want
        assert abs(sum(want) / len(texts) - fraction) < 0.03
        assert "little-endian" in val_rule(seed, fraction)["rule"]
    assert not any(in_val(t, 0, 0.0) for t in texts)


class _Killed(Exception):
    pass


def _counting(monkeypatch, kill_in_unit: int | None = None) -> dict:
    """Count the documents encoded and the unit records saved; with `kill_in_unit` k, a kill well into unit k
    (after k - 1 records, with some of unit k's shards written)."""
    import dataprep.tokens.tokenize as tokenize_mod

    real_save, real_encode, seen = tokenize_mod._save_record, tokenize_mod._encode_chunk, {"encoded": 0, "read": []}

    def save(out, task_no, fp, done, read, chars, rec):
        real_save(out, task_no, fp, done, read, chars, rec)
        seen["read"].append(read)

    def encode_chunk(tok_, chunk, *a):
        seen["encoded"] += sum(last for _, last in chunk)
        if kill_in_unit and len(seen["read"]) == kill_in_unit - 1 and seen["encoded"] > seen["read"][-1] + 1000:
            raise _Killed
        return real_encode(tok_, chunk, *a)

    monkeypatch.setattr(tokenize_mod, "_save_record", save)
    monkeypatch.setattr(tokenize_mod, "_encode_chunk", encode_chunk)
    return seen


def test_resume_keeps_the_finished_units_of_a_corpus_under_one_task(lines_corpus, tmp_path, monkeypatch):
    """One task (the default 64 MiB holds the 1.6 MB corpus) written in units of 200 kB: killed while the fifth
    unit writes, --resume keeps the four finished units' shards (the same files), reads their documents without
    encoding them, and gives the pack an uninterrupted run gives. Before, a task was the smallest thing kept:
    nothing was. A record that disagrees with what is read again (here, its character count) starts the task over."""
    from dataprep import build
    from dataprep.verify import verify_pack

    paths, docs, tok = lines_corpus
    files, total = [str(p) for p in paths], sum(p.stat().st_size for p in paths)
    s = TokenizeSettings(split="line", val_fraction=0.05, unit_bytes=200_000, shard_tokens=20_000, chunk_bytes=20_000)
    assert s.task_bytes > total and TokenizeSettings().unit_bytes < TokenizeSettings().task_bytes
    tokenize(files, tmp_path / "fresh", s, str(tok))
    fresh = read_manifest(tmp_path / "fresh")
    out = tmp_path / "p"
    with monkeypatch.context() as mp:
        seen = _counting(mp, kill_in_unit=5)
        with pytest.raises(_Killed):
            tokenize(files, out, s, str(tok))
    kept_docs = seen["read"][-1]
    rec = json.loads((out / ".task-records" / "00000.json").read_text())["record"]
    kept = {(n, sh["name"]): (out / n / sh["name"] / "tokens.npy").stat().st_mtime_ns
            for n, sp in rec["splits"].items() for sh in sp["shards"]}
    assert len(list((out / "train").iterdir())) > len([k for k in kept if k[0] == "train"])  # the fifth unit's, half-written
    told = {"built": 0, "kept": 0}

    def progress(n):
        told["built"] += n

    progress.kept = lambda n: told.__setitem__("kept", told["kept"] + n)  # type: ignore[attr-defined]
    with monkeypatch.context() as mp:
        seen = _counting(mp)
        r = tokenize(files, out, s, str(tok), resume=True, progress=progress)
    assert r["reused"] == 0 and r["tasks"] == 1 and r["kept_units"] == 4
    assert seen["encoded"] == len(docs) - kept_docs and 0 < kept_docs < len(docs)  # the kept units were not encoded again
    assert all((out / n / name / "tokens.npy").stat().st_mtime_ns == t for (n, name), t in kept.items())
    assert told["built"] + told["kept"] == total and told["kept"] > 0 and told["built"] > 0
    summary = build.TokenizeSummary(r, files=len(files))
    summary.out, summary.after = out, []
    assert "resumed: 0 of 1 tasks were finished and intact, 1 tokenized (4 finished units of it kept)" in "\n".join(summary.lines())
    got = read_manifest(out)
    assert got["splits"] == fresh["splits"] and _split_docs(out) == _split_docs(tmp_path / "fresh")
    assert sorted(p.name for p in (out / "train").iterdir()) == [sh["name"] for sh in got["splits"]["train"]["shards"]]
    assert not (out / ".task-records").exists() and verify_pack(out).ok
    # a unit record whose count of characters is not what the files give again: the whole task is redone
    out2 = tmp_path / "q"
    with monkeypatch.context() as mp:
        _counting(mp, kill_in_unit=3)
        with pytest.raises(_Killed):
            tokenize(files, out2, s, str(tok))
    record = out2 / ".task-records" / "00000.json"
    body = json.loads(record.read_text())
    record.write_text(json.dumps({**body, "chars": body["chars"] + 1}))
    with monkeypatch.context() as mp:
        seen = _counting(mp)
        r = tokenize(files, out2, s, str(tok), resume=True)
    assert r["kept_units"] == 0 and seen["encoded"] == len(docs)
    assert read_manifest(out2)["splits"] == fresh["splits"]
