"""The pass object (serve/passes.py): `iter(loader)` gives a `Pass` that owns one pass; it can be left by
`close()`, a newer pass ends one still held, and a resumed position left early is served again. Also the
rule that serving modules read no other class's private names."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import dataprep
from dataprep.images.build import build_images
from dataprep.images.settings import ImageSettings
from dataprep.serve.loader import Loader
from dataprep.serve.passes import Pass
from dataprep.settings import BuildSettings
from dataprep.sources import scan_imagenet
from dataprep.synthetic import decode_index

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pack(index_tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("passes") / "p"
    build_images(scan_imagenet(index_tree), out, BuildSettings(), ImageSettings(size=32, resize="center-crop", mode="raw"))
    return out


def samples(batch) -> list[int]:
    """The sample numbers a batch's images encode (index_tree's colours)."""
    return [decode_index(img.permute(1, 2, 0).numpy()) for img in batch[0]]


@pytest.mark.parametrize("workers", [0, 2])
def test_iter_gives_a_pass_and_close_leaves_it_to_be_served_again(pack, workers):
    with Loader(dataprep.InMemoryImageDataset(pack), 4, shuffle=True, seed=3, num_workers=workers) as ld:
        whole = [samples(b) for b in ld]  # epoch 0
        ld.set_epoch(0)
        it = iter(ld)
        assert isinstance(it, Pass) and iter(it) is it
        first = samples(next(it))
        it.close()
        assert next(it, None) is None  # a closed pass serves nothing more
        assert ld.epoch == 0 and first == whole[0]
        assert [samples(b) for b in ld] == whole  # the same epoch, whole, from its start
        assert ld.epoch == 1


@pytest.mark.parametrize("workers", [0, 2])
def test_a_newer_pass_ends_a_held_one_and_serves_a_restored_position_again(pack, workers):
    """A restored position is where a pass begins; a pass left early (still held, not yet collected)
    hands that start to the next pass, not the epoch's start."""
    ds = dataprep.InMemoryImageDataset(pack)
    with Loader(ds, 4, shuffle=True, seed=3, num_workers=workers) as ld:
        whole = [samples(b) for b in ld]
        ld.set_epoch(0)
        it = iter(ld)
        next(it), next(it)
        state = ld.state_dict()
    with Loader(ds, 4, shuffle=True, seed=3, num_workers=workers) as ld:
        ld.load_state_dict(state)
        held = iter(ld)
        assert samples(next(held)) == whole[2]
        again = iter(ld)  # `held` is still referenced: the newer pass ends it
        assert samples(next(again)) == whole[2]  # the restored position, not the epoch's start
        assert next(held, None) is None  # the older pass is over
        assert [samples(b) for b in again] == whole[3:]
        assert ld.epoch == 1


def test_a_pass_made_and_dropped_before_its_first_batch_changes_nothing(pack):
    ds = dataprep.InMemoryImageDataset(pack)
    with Loader(ds, 4, shuffle=True, seed=3) as ld:
        for _ in range(3):
            iter(ld)  # Lightning makes one and drops it
        assert ld.epoch == 0 and ld.state_dict()["samples_consumed"] == 0
        got = [samples(b) for b in ld]
    assert sorted(i for b in got for i in b) == list(range(len(ds)))


def test_an_error_ends_the_pass_and_the_next_one_serves_the_epoch_again(pack):
    class Failing(dataprep.InMemoryImageDataset):
        fail = True

        def fill_batch(self, idx, out, request=None):
            if self.fail and 5 in list(idx):
                raise RuntimeError("planted")
            return super().fill_batch(idx, out, request)

    ds = Failing(pack)
    with Loader(ds, 4, num_workers=0) as ld:
        it = iter(ld)
        with pytest.raises(RuntimeError, match="planted"):
            for _ in it:
                pass
        assert next(it, None) is None and ld.epoch == 0
        ds.fail = False
        got = [samples(b) for b in ld]
        assert [i for b in got for i in b] == list(range(len(ds))) and ld.epoch == 1
        assert torch.is_tensor(next(iter(ld))[0])


SERVING = ["passes.py", "processes.py", "threads.py", "ring.py", "cursor.py", "arguments.py", "loader.py", "workers.py"]


@pytest.mark.parametrize("name", SERVING)
def test_serving_modules_read_no_private_name_of_another_object(name):
    """`x._name` only on self, cls or super(): a backend, the ring and the pass talk through their interfaces."""
    tree = ast.parse((ROOT / "dataprep" / "serve" / name).read_text())
    bad = [f"{name}:{n.lineno} {ast.unparse(n)}" for n in ast.walk(tree)
           if isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.startswith("__")
           and not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"))
           and not (isinstance(n.value, ast.Call) and ast.unparse(n.value.func) == "super")]
    assert bad == []


def test_the_loader_keeps_configuration_in_a_short_constructor():
    """Issue 53: Loader.__init__ under 40 lines (checks in serve/arguments.py, the pass's state in Pass)."""
    tree = ast.parse((ROOT / "dataprep" / "serve" / "loader.py").read_text())
    init = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    assert init.end_lineno - init.lineno + 1 < 40
