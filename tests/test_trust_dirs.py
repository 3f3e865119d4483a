"""Trust, issue 40: where a build writes. An --out other users can write (or whose parent they can) is refused
before anything is written; the manifest's temporary has a random name made with O_EXCL | O_NOFOLLOW; nothing in
--out is followed when removed. A kill or a full disk between a file kept beside the manifest (tokenizer.json,
vocab.json) and the manifest leaves a build that --resume and --overwrite both continue; `dataprep tokenize` has
--resume. Each case here was reproduced on the code before its fix."""
from __future__ import annotations

import errno
import gzip
import io
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from dataprep.cli import main
from dataprep.errors import DataprepError
from dataprep.images.build import build_images
from dataprep.images.settings import ImageSettings
from dataprep.pack.manifest import write_manifest
from dataprep.settings import BuildSettings
from dataprep.sources import scan_imagenet
from dataprep.sources.webdataset import scan_webdataset
from dataprep.verify import verify_pack

from .test_captions import train_tokenizer, write_tar
from .test_trust import _as_other_user, needs_root


def _build(src, out, **kw):
    return build_images(scan_imagenet(src), out, BuildSettings(workers=1, shard_size=5, **kw), ImageSettings(size=16))


def _invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _one_clean_line(r, *words):
    """A CLI failure told in one line naming `words`, no traceback."""
    assert r.exit_code == 1, (r.exit_code, r.output, r.exception)
    assert isinstance(r.exception, SystemExit), repr(r.exception)
    lines = [ln for ln in r.output.splitlines() if ln.startswith("Error:")]
    assert len(lines) == 1 and "Traceback" not in r.output, r.output
    for w in words:
        assert w in lines[0], (w, lines[0])


# -- 1. an --out other users can write ---------------------------------------------------------------------
def test_an_out_directory_others_can_write_is_refused_before_anything_is_written(index_tree, tmp_path):
    out = tmp_path / "open"
    out.mkdir()
    os.chmod(out, 0o777)
    with pytest.raises(DataprepError, match="other users can write this output directory"):
        _build(index_tree, out)
    assert os.listdir(out) == []
    r = _invoke("build", "imagenet", index_tree, "--out", out, "--size", 16, "-j", 1, "--no-progress")
    _one_clean_line(r, str(out), "other users can write")
    assert os.listdir(out) == []


def test_an_out_created_in_a_directory_others_can_write_is_refused_and_not_created(index_tree, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # not sticky: another user could rename our --out away and plant their own
    for out in (shared / "pack", shared / "a" / "b" / "pack"):
        with pytest.raises(DataprepError, match="other users can write"):
            _build(index_tree, out)
    assert os.listdir(shared) == []


def test_a_sticky_directory_of_ours_is_a_fine_parent(index_tree, tmp_path):
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)  # as /tmp: others cannot remove or rename what we create in it
    s = _build(index_tree, sticky / "x" / "pack")
    assert (sticky / "x" / "pack" / "manifest.json").is_file() and s.written == 24
    assert not (os.stat(sticky / "x").st_mode & 0o022)  # what dataprep creates, only it can write


@pytest.fixture
def shared_base():
    """A directory as /tmp is (root's, sticky, everyone may create in it) that uid 65534 can reach."""
    base = tempfile.mkdtemp(prefix="dataprep-dirs-test-", dir="/tmp")
    os.chmod(base, 0o1777)
    yield Path(base)
    shutil.rmtree(base, ignore_errors=True)


@needs_root
def test_a_directory_another_user_owns_or_can_write_is_refused_by_root(index_tree, shared_base):
    planted = f".manifest.json.tmp-{os.getpid()}"  # the name this (root) process's manifest temporary had

    def make():
        (shared_base / "theirs").mkdir()
        os.chmod(shared_base / "theirs", 0o777)
        (shared_base / "private").mkdir(mode=0o755)
        (shared_base / "private").chmod(0o755)
        # and the attack the refusal prevents: the manifest temporary's name a root build would use
        (shared_base / "theirs" / planted).symlink_to(shared_base / "victim")
        return {"uid": os.stat(shared_base / "theirs").st_uid}

    (shared_base / "victim").write_text("root's file")
    assert _as_other_user(make) == {"uid": 65534}
    for out, why in ((shared_base / "theirs", "belongs to uid 65534"), (shared_base / "private", "belongs to uid 65534"),
                     (shared_base / "theirs" / "pack", "other users can write")):
        with pytest.raises(DataprepError, match=why):
            _build(index_tree, out)
    assert sorted(os.listdir(shared_base / "theirs")) == [planted]
    assert os.listdir(shared_base / "private") == [] and (shared_base / "victim").read_text() == "root's file"
    s = _build(index_tree, shared_base / "mine")  # our own directory in the sticky one: fine
    assert s.written == 24 and os.stat(shared_base / "mine").st_uid == 0


# -- the manifest's temporary ---------------------------------------------------------------------------------
def test_a_symlink_planted_at_the_manifest_temporarys_old_name_is_never_written_through(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    pack = tmp_path / "p"
    pack.mkdir()
    planted = pack / f".manifest.json.tmp-{os.getpid()}"
    planted.symlink_to(victim)
    final = write_manifest(pack, {"kind": "images", "splits": {}, "fields": {}})
    assert victim.read_text() == "precious"
    assert not final.is_symlink() and json.loads(final.read_text())["kind"] == "images"
    assert os.readlink(planted) == str(victim)  # left as it was, never followed
    assert not [p for p in pack.iterdir() if p.name.startswith(".manifest.json.tmp-") and p != planted]
    assert (final.stat().st_mode & 0o777) == 0o644  # readable by all, as before


def test_stale_temporaries_are_still_cleaned_by_resume_and_overwrite_and_never_followed(index_tree, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "p"
    _build(index_tree, out)
    for flag in ("resume", "overwrite"):
        (out / "manifest.json").unlink()
        (out / ".manifest.json.tmp-123").write_text("{")
        (out / ".manifest.json.tmp-123-0a1b2c3d4e5f").write_text("{")
        (out / ".manifest.json.tmp-999").symlink_to(victim)
        (out / ".tokenizer.json.tmp-7-0a1b2c3d4e5f").write_text("{")
        s = _build(index_tree, out, **{flag: True})
        assert s.written == 24 and verify_pack(out).ok
        assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "train", "val"]
        assert victim.read_text() == "precious"


@pytest.mark.parametrize("flag", ["resume", "overwrite"])
def test_a_split_directory_that_is_a_symlink_is_never_written_through_nor_emptied(index_tree, tmp_path, flag):
    victim = tmp_path / "victims"
    (victim / "00099").mkdir(parents=True)
    (victim / "00099" / "keep.txt").write_text("precious")
    out = tmp_path / "p"
    _build(index_tree, out)
    (out / "manifest.json").unlink()  # an unfinished build...
    shutil.rmtree(out / "train")
    (out / "train").symlink_to(victim)  # ...whose split leads elsewhere
    with pytest.raises(DataprepError, match="not a dataprep pack|outside"):
        _build(index_tree, out, **{flag: True})
    assert os.listdir(victim) == ["00099"] and (victim / "00099" / "keep.txt").read_text() == "precious"


# -- 2. a kill or a full disk between a file beside the manifest and the manifest -----------------------------
class _Killed(BaseException):
    pass


def _kill(*_a, **_k):
    raise _Killed("killed before the manifest")


@pytest.fixture
def captions(tmp_path):
    return write_tar(tmp_path / "a.tar", list(range(12))), train_tokenizer(tmp_path / "tok.json")


def _caption_build(tar, tok, out, **kw):
    return build_images(scan_webdataset([str(tar)]), out, BuildSettings(workers=1, shard_size=5, **kw),
                        ImageSettings(size=32), tokenizer=tok)


@pytest.mark.parametrize("flag", ["resume", "overwrite"])
def test_an_image_build_killed_after_its_tokenizer_copy_continues(captions, tmp_path, monkeypatch, flag):
    import dataprep.images.build as images_build

    tar, tok = captions
    out = tmp_path / "p"
    with monkeypatch.context() as m:
        m.setattr(images_build, "write_manifest", _kill)
        with pytest.raises(_Killed):
            _caption_build(tar, tok, out)
    assert (out / "tokenizer.json").is_file() and not (out / "manifest.json").exists()
    s = _caption_build(tar, tok, out, **{flag: True})
    assert s.written == 12 and s.splits[0].reused == (3 if flag == "resume" else 0)
    assert verify_pack(out).ok and (out / "tokenizer.json").read_bytes() == tok.read_bytes()


DOCS = [f"document {k}: " + "some words to tokenize, " * (k % 7 + 1) + "ünïcödé 🙂" for k in range(60)]


@pytest.fixture
def corpus(tmp_path):
    """Four .jsonl.gz files of 15 documents, and a tokenizer trained on them."""
    from dataprep.tokens.tokenize import train_bpe

    files = []
    for i in range(4):
        p = tmp_path / f"docs{i}.jsonl.gz"
        with gzip.open(p, "wt", encoding="utf-8") as f:
            for d in DOCS[15 * i:15 * (i + 1)]:
                f.write(json.dumps({"text": d}) + "\n")
        files.append(p)
    tok = train_bpe(iter(DOCS), 300)
    tok.save(str(tmp_path / "tok.json"))
    return files, tmp_path / "tok.json"


def _tok_args(files, tok, out, *extra):
    return ["tokenize", *files, "--tokenizer", tok, "--out", out, "--val-fraction", 0.2, "--no-progress", *extra]


SETTINGS = dict(val_fraction=0.2, task_bytes=1)  # a task per file


def _tokenize(files, tok, out, **kw):
    from dataprep.tokens.tokenize import TokenizeSettings, tokenize

    return tokenize([str(f) for f in files], out, TokenizeSettings(**SETTINGS), str(tok), **kw)


def _tokens(pack: Path) -> dict:
    """Per split: the shard records (names, counts, checksums) the manifest holds."""
    m = json.loads((pack / "manifest.json").read_text())
    return {n: [(sh["name"], sh["count"], sh["tokens"], sorted((f, r["sha256"]) for f, r in sh["files"].items()))
                for sh in sp["shards"]] for n, sp in m["splits"].items()}


@pytest.fixture
def reference(corpus, tmp_path):
    files, tok = corpus
    _tokenize(files, tok, tmp_path / "ref")
    r = _invoke(*_tok_args(files, tok, tmp_path / "ref1"))  # one task
    assert r.exit_code == 0, r.output
    return {"tasks": _tokens(tmp_path / "ref"), "cli": _tokens(tmp_path / "ref1")}


def _unfinished(tokenize_mod, monkeypatch, files, tok, out):
    with monkeypatch.context() as m:
        m.setattr(tokenize_mod, "write_manifest", _kill)
        with pytest.raises(_Killed):
            _tokenize(files, tok, out)
    assert (out / "tokenizer.json").is_file() and not (out / "manifest.json").exists()


@pytest.mark.parametrize("flag", ["resume", "overwrite"])
def test_tokenize_killed_after_its_tokenizer_copy_continues(corpus, reference, tmp_path, monkeypatch, flag):
    import dataprep.tokens.tokenize as tokenize_mod

    files, tok = corpus
    out = tmp_path / "p"
    _unfinished(tokenize_mod, monkeypatch, files, tok, out)
    r = _tokenize(files, tok, out, **{flag: True})
    assert r["reused"] == (4 if flag == "resume" else 0)
    assert _tokens(out) == reference["tasks"] and verify_pack(out).ok
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "tokenizer.json", "train", "val"]
    # and from the command line, which has both flags
    out = tmp_path / "q"
    with monkeypatch.context() as m:
        m.setattr(tokenize_mod, "write_manifest", _kill)
        with pytest.raises(_Killed):
            _invoke(*_tok_args(files, tok, out))
    r = _invoke(*_tok_args(files, tok, out, f"--{flag}"))
    assert r.exit_code == 0, r.output
    assert _tokens(out) == reference["cli"] and verify_pack(out).ok
    assert ("resumed: 1 of 1 tasks were finished and intact" in r.output) == (flag == "resume"), r.output


def test_tokenize_resume_keeps_the_finished_tasks_and_redoes_the_rest(corpus, reference, tmp_path, monkeypatch):
    import dataprep.tokens.tokenize as tokenize_mod

    files, tok = corpus
    out = tmp_path / "p"
    real, calls, killed = tokenize_mod._SplitWriter.flush, [], []

    def flush(self):  # killed while the third task writes its shards: two tasks finished, one half-written
        calls.append(self.task_no)
        if self.task_no == 2 and calls.count(2) == 2 and not killed:
            killed.append(True)
            raise _Killed("killed mid-task")
        return real(self)

    with monkeypatch.context() as m:
        m.setattr(tokenize_mod._SplitWriter, "flush", flush)
        with pytest.raises(_Killed):
            _tokenize(files, tok, out)
        assert any(p.name.startswith("00002") for p in (out / "train").iterdir())  # the killed task's first shard
        with open(files[3], "ab") as f:  # an input changed since: its task is redone
            f.write(gzip.compress(json.dumps({"text": "one more document"}).encode() + b"\n"))
        calls.clear()
        r = _tokenize(files, tok, out, resume=True)
    assert sorted(set(calls)) == [2, 3] and r["reused"] == 2 and r["tasks"] == 4
    got = _tokens(out)
    _tokenize(files, tok, tmp_path / "fresh")
    assert got == _tokens(tmp_path / "fresh") and got != reference["tasks"] and verify_pack(out).ok
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "tokenizer.json", "train", "val"]


def test_a_table_build_killed_after_its_vocabulary_is_overwritten(tmp_path, monkeypatch):
    import dataprep.tables.build as tables_build
    from dataprep.tables.build import build_table
    from dataprep.tables.columns import TableSettings

    path = tmp_path / "t.csv"
    pd.DataFrame({"x": np.arange(8.0), "city": ["paris", "lima"] * 4, "y": [0, 1] * 4}).to_csv(path, index=False)
    s = TableSettings(target="y", categorical=("city",))
    with monkeypatch.context() as m:
        m.setattr(tables_build, "write_manifest", _kill)
        with pytest.raises(_Killed):
            build_table([str(path)], tmp_path / "p", s, {})
    assert (tmp_path / "p" / "vocab.json").is_file()
    build_table([str(path)], tmp_path / "p", s, {}, overwrite=True)
    assert verify_pack(tmp_path / "p").ok


class _FullFile:
    """A file whose writes find the disk full."""

    def __init__(self, f):
        self._f = f

    def write(self, b):
        raise OSError(errno.ENOSPC, "No space left on device")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()

    def __getattr__(self, name):
        return getattr(self._f, name)


def _disk_full_for(monkeypatch, match):
    """Every file opened for writing whose name `match(name)` accepts finds the disk full."""
    import builtins

    real = io.open

    def opened(file, mode="r", *a, **k):
        f = real(file, mode, *a, **k)
        name = os.readlink(f"/proc/self/fd/{file}") if isinstance(file, int) else os.fspath(file)
        if any(c in mode for c in "wax+") and match(os.path.basename(name)):
            return _FullFile(f)
        return f

    monkeypatch.setattr(io, "open", opened)
    monkeypatch.setattr(builtins, "open", opened)


def _tokenizer_copy(name):
    return name == "tokenizer.json" or name.startswith(".tokenizer.json.tmp-")


def test_a_full_disk_while_tokenize_copies_its_tokenizer_is_one_line_then_resume(corpus, reference, tmp_path, monkeypatch):
    files, tok = corpus
    out = tmp_path / "p"
    with monkeypatch.context() as m:
        _disk_full_for(m, _tokenizer_copy)
        r = _invoke(*_tok_args(files, tok, out))
    _one_clean_line(r, str(out / "tokenizer.json"), "disk is full", "--resume")
    assert not [p for p in out.iterdir() if p.name not in ("train", "val", ".task-records")]
    r = _invoke(*_tok_args(files, tok, out, "--resume"))
    assert r.exit_code == 0, r.output
    assert _tokens(out) == reference["cli"] and "resumed: 1 of 1 tasks" in r.output


def test_a_full_disk_while_tokenize_writes_a_shard_is_one_line_then_resume(corpus, reference, tmp_path, monkeypatch):
    files, tok = corpus
    out = tmp_path / "p"
    with monkeypatch.context() as m:
        _disk_full_for(m, lambda name: name == "tokens.npy")
        r = _invoke(*_tok_args(files, tok, out))
    _one_clean_line(r, str(out / "train"), "disk is full", "--resume")
    r = _invoke(*_tok_args(files, tok, out, "--resume"))
    assert r.exit_code == 0, r.output
    assert _tokens(out) == reference["cli"]


def test_a_full_disk_while_an_image_build_copies_its_tokenizer_is_one_line_then_resume(captions, tmp_path, monkeypatch):
    tar, tok = captions
    out = tmp_path / "p"
    args = ["build", "webdataset", tar, "--out", out, "--size", 32, "-j", 1, "--shard-size", 5, "--tokenize", tok, "--no-progress"]
    with monkeypatch.context() as m:
        _disk_full_for(m, _tokenizer_copy)
        r = _invoke(*args)
    _one_clean_line(r, str(out / "tokenizer.json"), "disk is full", "--resume")
    r = _invoke(*args, "--resume")
    assert r.exit_code == 0, r.output
    assert "resumed: 3 of 3 shards" in r.output and verify_pack(out).ok


def test_the_files_kept_beside_a_manifest_are_the_ones_the_kinds_write():
    from dataprep.pack.manifest import KEPT_BESIDE
    from dataprep.tables.columns import VOCAB_FILE
    from dataprep.text import TOKENIZER_FILE

    assert set(KEPT_BESIDE) == {TOKENIZER_FILE, VOCAB_FILE}


def test_a_group_writable_directory_is_refused_unless_the_group_is_trusted(tmp_path, monkeypatch):
    """A group is many users: its write bit counts as others', unless DATAPREP_TRUST_GROUP=1 says the
    group is trusted (a team's project space), and the error says so."""
    from dataprep.safe_paths import UnsafeDirectory, check_dir

    d = tmp_path / "team"
    d.mkdir()
    os.chmod(d, 0o775)
    monkeypatch.delenv("DATAPREP_TRUST_GROUP", raising=False)
    with pytest.raises(UnsafeDirectory, match="DATAPREP_TRUST_GROUP=1"):
        check_dir(d)
    monkeypatch.setenv("DATAPREP_TRUST_GROUP", "1")
    assert check_dir(d) == d
    os.chmod(d, 0o777)  # the world is never trusted
    with pytest.raises(UnsafeDirectory, match="other users can write"):
        check_dir(d)
