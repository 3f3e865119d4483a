"""A Loader state is checked before any of it is used (issue 40): a hand-edited, truncated or foreign
state is an error naming what is wrong, never a raw ZeroDivisionError / KeyError / TypeError, an epoch
that serves samples twice or none, or a position in another pack of the same length."""
from __future__ import annotations

import numpy as np
import pytest

from dataprep import InMemoryImageDataset
from dataprep.errors import DataprepError
from dataprep.images.build import build_images
from dataprep.images.settings import ImageSettings
from dataprep.serve.loader import Loader
from dataprep.settings import BuildSettings
from dataprep.sources import scan_imagenet
from dataprep.synthetic import write_tree


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    """Two packs of 12 images each (the same length, other pixels), and a byte-identical rebuild of the first."""
    base = tmp_path_factory.mktemp("state")
    out = {}
    for name, seed in (("a", 0), ("b", 1), ("a_again", 0)):
        src = write_tree(base / f"src_{name}", classes=2, per_class=6, sizes=((20 + 4 * seed, 24),), kind="index", ext=".png")
        build_images(scan_imagenet(src), base / name, BuildSettings(workers=1, shard_size=4), ImageSettings(size=16, mode="raw"))
        out[name] = base / name
    return out


def loader(pack) -> Loader:
    return Loader(InMemoryImageDataset(pack), 4, shuffle=True, seed=3)


def mid_state(pack) -> dict:
    ld = loader(pack)
    it = iter(ld)
    next(it)
    state = ld.state_dict()
    it.close()
    return state


@pytest.mark.parametrize("key, value, says", [
    ("samples_consumed", -1000, "samples_consumed is -1000, outside its epoch of 12"),
    ("samples_consumed", 10 ** 18, "outside its epoch of 12"),
    ("samples_consumed", 4.0, "samples_consumed is 4.0 (float), not an integer"),
    ("world_size", 0, "world_size is 0, not an integer from 1 to 9223372036854775807"),
    ("batch_size", 0, "batch_size is 0"),
    ("batch_size", "4", "batch_size is '4' (str)"),
    ("seed", None, "seed is None"),
    ("epoch", -1, "epoch is -1"),
    ("length", [12], "length is [12] (list)"),
    ("sampler", "no", "sampler is 'no' (str), not true or false"),
    ("version", "2", "version is '2'"),
])
def test_a_bad_value_is_an_error_naming_its_key(packs, key, value, says):
    state = {**mid_state(packs["a"]), key: value}
    with pytest.raises(DataprepError, match=says.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        loader(packs["a"]).load_state_dict(state)


@pytest.mark.parametrize("key, value, says", [
    ("seed", -1, "seed is -1, not an integer of 0 or more"),
    ("seed", np.int64(-5), "seed is -5, not an integer of 0 or more"),
    ("epoch", 10 ** 30, f"epoch is {10 ** 30}, not an integer from 0 to 9223372036854775807"),
    ("batch_size", 10 ** 400, "batch_size is 1000000000000000000000000000...000000 (401 characters), not an integer from 1 to"),
    ("world_size", 2 ** 63, "world_size is 9223372036854775808, not an integer from 1 to 9223372036854775807"),
    ("version", -1, "version is -1, not an integer from 0 to 2"),
])
def test_a_value_out_of_its_range_is_an_error_naming_the_key_the_value_and_the_range(packs, key, value, says):
    """Old code: seed -1 passed the check and reached numpy's generator at the next iter() ("expected
    non-negative integer", naming nothing); a huge epoch, batch size or world size passed too."""
    state = {**mid_state(packs["a"]), key: value}
    ld = loader(packs["a"])
    with pytest.raises(DataprepError, match="^a Loader state whose " + says.replace("(", r"\(").replace(")", r"\)")):
        ld.load_state_dict(state)
        next(iter(ld))


@pytest.mark.parametrize("key", ["seed", "epoch", "samples_consumed", "world_size", "batch_size", "length", "sampler"])
def test_a_missing_key_is_an_error_naming_it(packs, key):
    state = mid_state(packs["a"])
    del state[key]
    with pytest.raises(DataprepError, match=f"a Loader state without '{key}'"):
        loader(packs["a"]).load_state_dict(state)


def test_numpy_integers_in_a_state_are_accepted(packs):
    state = {k: (np.int64(v) if isinstance(v, int) and not isinstance(v, bool) else v) for k, v in mid_state(packs["a"]).items()}
    ld = loader(packs["a"])
    ld.load_state_dict(state)
    assert sum(len(b[1]) for b in ld) == 8  # the rest of the epoch: 12 - 4


def test_a_state_from_another_pack_of_the_same_length_is_refused(packs):
    state = mid_state(packs["a"])
    assert len(InMemoryImageDataset(packs["b"])) == len(InMemoryImageDataset(packs["a"]))
    with pytest.raises(DataprepError, match="another pack of the same length"):
        loader(packs["b"]).load_state_dict(state)
    # a byte-identical rebuild is the same pack; a state saved before identities were recorded is not checked
    ld = loader(packs["a_again"])
    ld.load_state_dict(state)
    assert sum(len(b[1]) for b in ld) == 8
    old = {k: v for k, v in state.items() if k != "pack"}
    loader(packs["b"]).load_state_dict(old)
