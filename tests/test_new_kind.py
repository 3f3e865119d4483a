"""ARCHITECTURE.md's "How to add a kind", followed by a test: a kind this repository has never seen (captions:
a UTF-8 caption and a label per sample) is one package written outside dataprep plus one registry entry, and
the kind-free layers (the shard driver, every storage backend, the cache in every mode, verify, info,
convert) serve it without a line of them changed."""
import sys
import textwrap

import numpy as np
import pytest
from click.testing import CliRunner

from dataprep import kinds
from dataprep.cli import main

FIELD = '''
from dataprep.pack.fields import LabelField, StringsField

CAPTIONS = StringsField("caption", "captions", "caption_offsets", "the caption list")


def fields_of(m, where="manifest"):
    return {"caption": StringsField.from_manifest("caption", m["fields"]["caption"], where),
            "label": LabelField.from_manifest(m["fields"]["label"], where)}


def served_fields(m, resolution=None, where="manifest"):
    return fields_of(m, where)


def summary(m):
    return [f"captions:  {m['captioned']} captioned samples"]
'''

BUILD = '''
from dataclasses import dataclass
from pathlib import Path

from dataprep.driver import build_shards, finish_shard, pack_header, reused_shard, task_fingerprint
from dataprep.pack.fields import LabelField
from dataprep.pack.manifest import write_manifest

from .field import CAPTIONS


@dataclass(frozen=True)
class Task:
    split_dir: str
    index: int
    captions: tuple
    labels: tuple
    resume: bool = False


def build_shard(task):
    fp = task_fingerprint(["captions", task.index], zip(task.captions, task.labels))
    rec = reused_shard(task, fp)
    if rec is not None:
        return rec
    arrays = {**CAPTIONS.shard_arrays(task.captions), **LabelField(dtype="|u1").shard_arrays(task.labels)}
    return finish_shard(task, fp, arrays, len(task.captions), [], 0, sum(len(c) for c in task.captions))


@dataclass
class Split:
    name: str
    paths: list
    labels: list

    def skipped_before(self):
        return []


def build_captions(splits, out, settings):
    out = Path(out)

    def make_task(split, k, start, stop):
        return Task(str(out / split.name), k, tuple(split.paths[start:stop]), tuple(split.labels[start:stop]))

    _, entries, seconds = build_shards(out, settings, splits, make_task, build_shard)
    write_manifest(out, {**pack_header("captions", settings, {"layout": "list"}, seconds),
                         "captioned": sum(len(s.paths) for s in splits),
                         "fields": {"caption": CAPTIONS.to_manifest(),
                                    "label": {**LabelField(dtype="|u1").to_manifest(), "num_classes": 3}},
                         "splits": entries})
'''

DATASET = '''
from pathlib import Path

from dataprep.serve.cache import open_split

from .field import served_fields


class CaptionDataset:
    def __init__(self, pack, split="train", cache="ram", verify=False):
        self.pack = Path(pack)
        c = open_split(self.pack, split, served_fields, cache, verify, False, kinds=("captions",))
        self._store = c
        self.captions = c.fields["caption"].strings(c.arrays)
        self.labels = c.arrays["labels"]

    def __len__(self):
        return len(self.captions)

    def __getitem__(self, i):
        return self.captions[i], int(self.labels[i])
'''

CAPTIONS = [f"caption {k}: " + "ünïcode " * (k % 5) + "🙂" * (k % 3) for k in range(23)]


@pytest.fixture
def captions_kind(tmp_path, monkeypatch):
    pkg = tmp_path / "kindpkg" / "captions_kind"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""A pack kind written outside dataprep."""\n')
    for name, src in (("field", FIELD), ("build", BUILD), ("dataset", DATASET)):
        (pkg / f"{name}.py").write_text(textwrap.dedent(src))
    monkeypatch.syspath_prepend(str(tmp_path / "kindpkg"))
    # the one registry line
    monkeypatch.setitem(kinds.KINDS, "captions", kinds.Kind("captions", "captions_kind", "build_captions", "CaptionDataset"))
    yield
    for m in [m for m in sys.modules if m.startswith("captions_kind")]:
        del sys.modules[m]


def build(out):
    from captions_kind.build import Split, build_captions

    from dataprep.settings import BuildSettings

    labels = [k % 3 for k in range(len(CAPTIONS))]
    build_captions([Split("train", CAPTIONS[:17], labels[:17]), Split("val", CAPTIONS[17:], labels[17:])], out,
                   BuildSettings(workers=1, shard_size=5))


def served(pack, split="train", cache="ram"):
    cls = kinds.KINDS["captions"].dataset_class()
    ds = cls(pack, split, cache)
    return [ds[i] for i in range(len(ds))]


def test_a_new_kind_is_one_package_and_one_registry_line(captions_kind, tmp_path):
    from dataprep.pack.convert import convert
    from dataprep.verify import verify_pack

    pack = tmp_path / "p"
    build(pack)
    want = [(c, k % 3) for k, c in enumerate(CAPTIONS)]
    assert served(pack) == want[:17] and served(pack, "val") == want[17:]
    rep = verify_pack(pack)
    assert rep.ok and rep.samples == len(CAPTIONS) and rep.shards == 4 + 2, rep.problems
    # every backend rebases the caption offsets, which no table in pack/ names: the manifest says which they are
    convert(pack, tmp_path / "p.h5", "hdf5")
    convert(tmp_path / "p.h5", tmp_path / "p.zarr", "zarr", "zstd")
    convert(tmp_path / "p.zarr", tmp_path / "back", "npy")
    for p, modes in ((tmp_path / "p.h5", ("ram", "mmap", "shm")), (tmp_path / "p.zarr", ("ram", "shm")), (tmp_path / "back", ("ram",))):
        for mode in modes:
            assert served(p, "train", mode) + served(p, "val", mode) == want, (p, mode)
    for f in (pack / "train").rglob("*.npy"):
        assert f.read_bytes() == (tmp_path / "back" / f.relative_to(pack)).read_bytes()
    r = CliRunner().invoke(main, ["info", str(tmp_path / "p.h5")])
    assert r.exit_code == 0 and "23 captioned samples" in r.output and "caption_offsets" in r.output, r.output


def test_the_new_kind_is_checked_like_the_others(captions_kind, tmp_path):
    """Negative controls: a label out of range and a damaged caption blob are found by the kind-free layers."""
    from dataprep.errors import PackError
    from dataprep.verify import verify_pack

    pack = tmp_path / "p"
    build(pack)
    labels = pack / "train" / "00001" / "labels.npy"
    arr = np.load(labels)
    arr[0] = 7  # the pack declares 3 classes
    np.save(labels, arr)
    with pytest.raises(PackError, match="label is 7"):
        served(pack)
    rep = verify_pack(pack)
    assert not rep.ok and any("00001" in p and "checksum" in w for p, w in rep.problems)
    blob = pack / "val" / "00000" / "captions.npy"
    raw = bytearray(blob.read_bytes())
    raw[-3] ^= 0x20
    blob.write_bytes(bytes(raw))
    rep = verify_pack(pack)
    assert any("val/00000" in p and "captions.npy" in w for p, w in rep.problems), rep.problems
