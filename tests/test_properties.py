"""Property-based tests (hypothesis): whatever a manifest or an offsets array holds, readers raise
PackError or give a consistent result, never another exception, a hang or a crash."""
import json
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dataprep.images.build import build_images
from dataprep.images.dataset import InMemoryImageDataset
from dataprep.errors import PackError
from dataprep.pack.fields import LoadContext, load_blob
from dataprep.pack.backends import read_manifest
from dataprep.pack.shard import write_shard
from dataprep.settings import BuildSettings
from dataprep.images.settings import ImageSettings
from dataprep.sources import scan_imagenet

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
SLOW = settings(max_examples=int(__import__("os").environ.get("DATAPREP_EXAMPLES", 60)), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def pack(index_tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("prop") / "p"
    build_images(scan_imagenet(index_tree), out, BuildSettings(shard_size=6), ImageSettings(size=32))
    return out


@SLOW
@given(value=json_values)
def test_read_manifest_accepts_or_raises_packerror(tmp_path, value):
    (tmp_path / "manifest.json").write_text(json.dumps(value))
    try:
        m = read_manifest(tmp_path)
    except PackError:
        return
    assert isinstance(m, dict)


def _paths(obj, prefix=()):
    """Every key path in a JSON object."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield prefix + (i,)
            yield from _paths(v, prefix + (i,))


@SLOW
@given(data=st.data())
def test_a_mutated_manifest_loads_or_raises_packerror(pack, tmp_path, data):
    original = json.loads((pack / "manifest.json").read_text())
    paths = [p for p in _paths(original) if p[0] in ("fields", "splits", "classes", "kind")]
    path = data.draw(st.sampled_from(paths))
    value = data.draw(json_values)
    m = json.loads(json.dumps(original))
    node = m
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    work = tmp_path / "p"
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(pack, work)
    (work / "manifest.json").write_text(json.dumps(m))
    try:
        ds = InMemoryImageDataset(work)
    except PackError:
        return
    ncls = ds.manifest["fields"]["label"]["num_classes"]
    for i in range(len(ds)):  # whatever loaded serves every index it claims, or says which sample is bad
        try:
            img, label = ds[i]
        except PackError:
            continue
        assert img.ndim == 3 and img.shape[0] in (1, 3) and 0 <= label < ncls


@SLOW
@given(
    sizes=st.lists(st.integers(0, 40), min_size=0, max_size=6),
    noise=st.lists(st.integers(-50, 50), min_size=7, max_size=7),
    replace=st.booleans(),
)
def test_offsets_validation(tmp_path, sizes, noise, replace):
    chunks = [np.full(n, 7, np.uint8) for n in sizes]
    blob = np.concatenate(chunks) if chunks else np.zeros(0, np.uint8)
    offsets = np.zeros(len(sizes) + 1, "<i8")
    np.cumsum(sizes, out=offsets[1:])
    if replace:  # damage the offsets arbitrarily
        offsets = offsets + np.asarray(noise[: len(offsets)], "<i8")
    split = tmp_path / "s"
    if split.exists():
        shutil.rmtree(split)
    files = write_shard(split, 0, {"images": blob, "offsets": offsets}, {})
    shard = {"name": "00000", "count": len(sizes), "files": files}
    try:
        data, offs = load_blob(split, [shard], "images", "offsets", LoadContext(verify=True))
    except PackError:
        assert replace  # intact offsets always load
        return
    assert offs[0] == 0 and offs[-1] == len(data) and (np.diff(offs) >= 0).all()
    assert [data[offs[i] : offs[i + 1]].size for i in range(len(sizes))] == [int(d) for d in np.diff(offs)]
