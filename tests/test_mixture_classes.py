"""A Mixture of members with different class lists: refused unless told how (labels="by_name", "offset",
"as_is"); told, every served label names the class its sample has in its own pack, and `classes` says
the names."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import dataprep
from dataprep.errors import DataprepError
from dataprep.serve.loader import Loader
from dataprep.serve.mixture import ClassListsDiffer, Mixture

A, B = ["cat", "dog"], ["bird", "cat", "fish"]  # "cat" is label 0 of A, label 1 of B


def image_pack(tmp_path, name: str, classes: list[str], member: int, per_class: int = 4):
    """A raw 8x8 image pack whose pixels say which member, class (its number in this pack) and image each
    sample is: (member, class, image) * 50 in the three channels."""
    import cv2

    from dataprep.images.build import build_images
    from dataprep.images.settings import ImageSettings
    from dataprep.settings import BuildSettings
    from dataprep.sources import scan_imagenet

    root = tmp_path / f"{name}_tree"
    for c, cls in enumerate(sorted(classes)):
        (root / "train" / cls).mkdir(parents=True)
        for j in range(per_class):
            img = np.empty((8, 8, 3), np.uint8)
            img[...] = (member * 50, c * 50, j * 50)
            assert cv2.imwrite(str(root / "train" / cls / f"{j}.png"), cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
    build_images(scan_imagenet(root), tmp_path / name, BuildSettings(shard_size=64), ImageSettings(size=8, mode="raw"),
                 progress=False)
    ds = dataprep.InMemoryImageDataset(tmp_path / name)
    assert ds.classes == sorted(classes)
    return ds


@pytest.fixture
def packs(tmp_path):
    return image_pack(tmp_path, "a", A, 0), image_pack(tmp_path, "b", B, 1)


def served(mix, batch=5):
    """Every (member, class number in its pack, label served) of one epoch, from the pixels of what the
    Loader serves, and from indexing the mixture."""
    images, labels = zip(*[(x.numpy(), y.numpy()) for x, y in Loader(mix, batch, num_workers=0)])
    images, labels = np.concatenate(images), np.concatenate(labels)
    assert images.shape[0] == len(mix)
    loader = np.stack([images[:, 0, 0, 0] // 50, images[:, 1, 0, 0] // 50, labels], 1)  # the Loader's N x C x H x W
    one = [mix[i] for i in range(len(mix))]  # the map-style path: one position, one member
    indexed = np.array([[int(x[0, 0, 0]) // 50, int(x[0, 0, 1]) // 50, int(y)] for x, y in one])  # H x W x C
    assert set(loader[:, 0].tolist()) == {0, 1}
    return loader, indexed


def test_different_class_lists_are_refused_naming_each_member(packs):
    with pytest.raises(ClassListsDiffer) as e:
        Mixture(packs, [0.5, 0.5])
    msg = str(e.value)
    assert isinstance(e.value, ValueError) and isinstance(e.value, DataprepError)
    for m, (d, names) in enumerate(zip(packs, (A, sorted(B)))):
        assert f"member {m} ({d.pack}, train): {len(names)} classes: " + ", ".join(names) in msg
    assert all(f'labels="{how}"' in msg for how in ("by_name", "offset", "as_is"))


def test_by_name_serves_each_sample_the_label_of_its_class_name(packs):
    mix = Mixture(packs, [0.5, 0.5], labels="by_name")
    assert mix.classes == ["cat", "dog", "bird", "fish"]  # first seen first
    names = [p.classes for p in packs]
    for rows in served(mix):
        assert all(mix.classes[y] == names[m][c] for m, c, y in rows.tolist())
        cats = rows[(rows[:, 0] == 1) & (rows[:, 1] == 1)]  # B's "cat", its label 1 in B
        assert len(cats) and (cats[:, 2] == 0).all()  # A's "cat" number


def test_offset_shifts_each_member_past_the_classes_before_it(packs):
    mix = Mixture(packs, [0.5, 0.5], labels="offset")
    assert mix.classes == ["cat", "dog", "bird", "cat", "fish"]
    for rows in served(mix):
        assert (rows[:, 2] == rows[:, 1] + np.where(rows[:, 0] == 1, 2, 0)).all()


def test_as_is_serves_the_stored_labels_and_names_none(packs):
    mix = Mixture(packs, [0.5, 0.5], labels="as_is")
    assert mix.classes is None
    for rows in served(mix):
        assert (rows[:, 2] == rows[:, 1]).all()


def test_one_class_list_needs_nothing_and_is_the_mixtures(tmp_path):
    packs = image_pack(tmp_path, "a", A, 0), image_pack(tmp_path, "c", A, 1)
    for how in (None, "by_name", "as_is"):
        mix = Mixture(packs, [0.5, 0.5], labels=how)
        assert mix.classes == A
        for rows in served(mix):
            assert (rows[:, 2] == rows[:, 1]).all()
    offset = Mixture(packs, [0.5, 0.5], labels="offset")  # asked for: two lists, even of one set of names
    assert offset.classes == A + A
    for rows in served(offset):
        assert (rows[:, 2] == rows[:, 1] + 2 * rows[:, 0]).all()


class Labelled:
    """A member serving (tag, index) and label index % len(classes)."""

    def __init__(self, tag: int, n: int, classes):
        self.tag, self.n, self.classes = tag, n, classes

    def __len__(self):
        return self.n

    def batch_layout(self, request=None):
        return {"x": ((2,), np.dtype(np.int64)), "labels": ((), np.dtype(np.int64))}

    def fill_batch(self, idx, out, request=None):
        idx = np.asarray(idx)
        out["x"][: len(idx)] = np.stack([np.full(len(idx), self.tag), idx], 1)
        out["labels"][: len(idx)] = idx % max(1, len(self.classes))


def rows_of(loader):
    return np.concatenate([np.column_stack([x.numpy(), y.numpy()]) for x, y in loader])


def test_a_member_without_labels_is_refused_unless_as_is():
    members = [Labelled(0, 10, ["a", "b"]), Labelled(1, 10, [])]
    with pytest.raises(ClassListsDiffer, match=r"member 1 \(Labelled\): no labels"):
        Mixture(members, [1, 1])
    for how in ("by_name", "offset"):
        with pytest.raises(DataprepError, match=r"member\(s\) 1 \(Labelled\) have no labels"):
            Mixture(members, [1, 1], labels=how)
    assert Mixture(members, [1, 1], labels="as_is").classes is None
    with pytest.raises(DataprepError, match="labels is 'by_name'"):
        Mixture(members, [1, 1], labels="merge")


def test_relabelled_mixtures_resume_nest_and_tables_mix_by_name(tmp_path):
    def make():
        mix = Mixture([Labelled(0, 70, ["x", "y", "z"]), Labelled(1, 40, ["z", "w"])], [0.6, 0.4], seed=2, labels="by_name")
        return Loader(mix, 8, num_workers=0)

    whole = rows_of(make())
    names = {0: ["x", "y", "z"], 1: ["z", "w"]}
    classes = Mixture([Labelled(0, 70, ["x", "y", "z"]), Labelled(1, 40, ["z", "w"])], [0.6, 0.4], labels="by_name").classes
    assert classes == ["x", "y", "z", "w"]
    assert all(classes[y] == names[t][i % len(names[t])] for t, i, y in whole.tolist())
    stopped = make()
    it = iter(stopped)
    head = np.concatenate([np.column_stack([x.numpy(), y.numpy()]) for x, y in (next(it) for _ in range(4))])
    state = stopped.state_dict()
    again = make()
    again.load_state_dict(state)
    assert np.array_equal(np.concatenate([head, rows_of(again)]), whole)

    inner = Mixture([Labelled(0, 20, ["p", "q"]), Labelled(1, 20, ["q", "r"])], [1, 1], labels="by_name")
    other = Mixture([Labelled(2, 20, ["r", "s"]), Labelled(3, 20, ["r", "s"])], [1, 1])
    outer = Mixture([inner, other], [1, 1], labels="by_name")  # members' labels renumbered twice
    assert inner.classes == ["p", "q", "r"] and other.classes == ["r", "s"] and outer.classes == ["p", "q", "r", "s"]
    own = {0: ["p", "q"], 1: ["q", "r"], 2: ["r", "s"], 3: ["r", "s"]}
    assert all(outer.classes[y] == own[t][i % 2] for t, i, y in rows_of(Loader(outer, 6, num_workers=0)).tolist())

    from dataprep.tables.build import build_table
    from dataprep.tables.columns import TableSettings
    from dataprep.tables.dataset import TabularDataset

    tables = []
    for m, targets in enumerate((["gimphelp", "numpy", "pypi"], ["class0", "class1", "class2", "class3", "class4"])):
        df = pd.DataFrame({"x": m * 1000.0 + np.arange(15), "y": [targets[i % len(targets)] for i in range(15)]})
        df.to_csv(tmp_path / f"t{m}.csv", index=False)
        build_table([str(tmp_path / f"t{m}.csv")], tmp_path / f"t{m}", TableSettings(target="y"), {})
        tables.append(TabularDataset(tmp_path / f"t{m}"))
    with pytest.raises(ClassListsDiffer, match="3 classes: gimphelp, numpy, pypi"):
        Mixture(tables, [1, 1])
    mix = Mixture(tables, [1, 1], labels="by_name")
    assert mix.classes == ["gimphelp", "numpy", "pypi", "class0", "class1", "class2", "class3", "class4"]
    x, y = (np.concatenate(v) for v in zip(*[(a.numpy(), b.numpy()) for a, b in Loader(mix, 4, num_workers=0)]))
    member, row = (x[:, 0] // 1000).astype(int), (x[:, 0] % 1000).astype(int)
    assert set(member.tolist()) == {0, 1}
    assert all(mix.classes[t] == tables[m].target_info["classes"][r % len(tables[m].target_info["classes"])]
               for m, r, t in zip(member, row, y.tolist()))
