"""Property-based tests (hypothesis): whatever a manifest or an offsets array holds, readers raise
PackError or give a consistent result, never another exception, a hang or a crash."""
import json
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from dataprep.errors import PackError
from dataprep.images.build import build_images
from dataprep.images.dataset import InMemoryImageDataset
from dataprep.images.settings import ImageSettings
from dataprep.pack.arrays import LoadContext, load_blob
from dataprep.pack.backends import read_manifest
from dataprep.pack.manifest import FORMAT, FORMAT_VERSION
from dataprep.pack.names import check_manifest_names
from dataprep.pack.shard import write_shard
from dataprep.settings import BuildSettings
from dataprep.sources import scan_imagenet

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
# A negative control needs the property to fail, not the smallest failing case: no shrinking (most of its time)
NO_SHRINK = [Phase.explicit, Phase.reuse, Phase.generate]
SLOW = settings(max_examples=int(__import__("os").environ.get("DATAPREP_EXAMPLES", 60)), deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def pack(index_tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("prop") / "p"
    build_images(scan_imagenet(index_tree), out, BuildSettings(shard_size=6), ImageSettings(size=32))
    return out


SKELETON = {"format": FORMAT, "format_version": FORMAT_VERSION, "kind": "images", "splits": {}, "fields": {}}
# Manifests near a valid one (each key kept, dropped or replaced by any JSON value), beside any JSON at all:
# random JSON alone is never a manifest, so the accepting branch would never run.
near_manifests = st.fixed_dictionaries({}, optional={k: st.just(v) | json_values for k, v in SKELETON.items()})


def _is_manifest(v) -> bool:
    """What a manifest must be, written out here (not the reader's check): format and version, the
    required keys, splits and fields as mappings, each split with a list of shards."""
    return (isinstance(v, dict) and v.get("format") == FORMAT and v.get("format_version") == FORMAT_VERSION
            and all(k in v for k in ("kind", "splits", "fields"))
            and isinstance(v["splits"], dict) and isinstance(v["fields"], dict)
            and all(isinstance(e, dict) and isinstance(e.get("shards"), list) for e in v["splits"].values()))


def _manifest_property(tmp_path, value) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps(value))
    try:
        m = read_manifest(tmp_path)
    except PackError:
        assert value != SKELETON  # a valid manifest is never refused
        return
    assert _is_manifest(value) and m == value  # only a manifest loads, and as written


@SLOW
@given(value=json_values | near_manifests)
@example(value=SKELETON)
def test_read_manifest_accepts_or_raises_packerror(tmp_path, value):
    _manifest_property(tmp_path, value)


def _names_only(m, where):
    if not isinstance(m, dict):
        raise PackError(f"{where}: not a mapping")
    check_manifest_names(m, where)  # splits and fields must be mappings, nothing else is checked
    return m


def test_the_manifest_property_catches_a_reader_that_ignores_format_and_version(tmp_path, monkeypatch):
    # negative control: a check_manifest that accepts any dict with mappings for splits and fields
    monkeypatch.setattr("dataprep.pack.manifest.check_manifest", _names_only)

    @settings(max_examples=200, deadline=None, database=None, phases=NO_SHRINK)
    @given(value=json_values | near_manifests)
    def prop(value):
        _manifest_property(tmp_path, value)

    with pytest.raises(AssertionError):
        prop()


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


OFFSETS_CASES = dict(
    sizes=st.lists(st.integers(0, 40), min_size=0, max_size=6),
    noise=st.lists(st.integers(-50, 50), min_size=7, max_size=7),
    replace=st.booleans(),
)


@SLOW
@given(**OFFSETS_CASES)
def test_offsets_validation(tmp_path, sizes, noise, replace):
    _offsets_property(load_blob, tmp_path, sizes, noise, replace)


def _zero_load_blob(*args, **kw):
    data, offs = load_blob(*args, **kw)
    return np.zeros_like(data), offs


def _offsets_from_sizes_load_blob(*args, **kw):
    data, offs = load_blob(*args, **kw)
    return data, np.linspace(0, len(data), len(offs)).astype(offs.dtype)  # valid, but not what was written


@pytest.mark.parametrize("wrong", [_zero_load_blob, _offsets_from_sizes_load_blob], ids=["zeros", "even_offsets"])
def test_the_offsets_property_catches_a_wrong_load_blob(tmp_path, wrong):
    # negative control: a load_blob serving zeros (or offsets it made up) must make the property fail
    @settings(max_examples=200, deadline=None, database=None, phases=NO_SHRINK)
    @given(**OFFSETS_CASES)
    def prop(sizes, noise, replace):
        _offsets_property(wrong, tmp_path, sizes, noise, replace)

    with pytest.raises(AssertionError):
        prop()


def _offsets_property(load, tmp_path, sizes, noise, replace):
    # each sample's bytes encode its index and position, so a wrong slice or zeros never match
    chunks = [((np.arange(n) + 41 * i + 1) % 256).astype(np.uint8) for i, n in enumerate(sizes)]
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
        data, offs = load(split, [shard], "images", "offsets", LoadContext(verify=True))
    except PackError:
        assert replace  # intact offsets always load
        return
    # whatever loads (intact, or damaged into other valid offsets) is exactly what was written
    assert offs[0] == 0 and offs[-1] == len(data) and (np.diff(offs) >= 0).all()
    assert np.array_equal(offs, offsets) and np.array_equal(data, blob)
    if not replace:
        assert [data[offs[i] : offs[i + 1]].tolist() for i in range(len(sizes))] == [c.tolist() for c in chunks]
