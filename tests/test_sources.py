import numpy as np
import pytest

from dataprep.errors import SourceError
from dataprep.sources import read_val_labels, scan_folder, scan_imagenet
from dataprep.synthetic import write_tree


def test_labels_follow_sorted_class_folders_like_imagefolder(tmp_path):
    for c in ("zebra", "apple", "Mango"):
        (tmp_path / "train" / c).mkdir(parents=True)
        for j in (2, 0, 1):
            (tmp_path / "train" / c / f"{j}.JPEG").write_bytes(b"x")
    (tmp_path / "train" / "apple" / "notes.txt").write_text("not an image")
    s = scan_imagenet(tmp_path)
    assert s.classes == ["Mango", "apple", "zebra"]  # plain sorted(), as ImageFolder (case-sensitive)
    train = s.splits[0]
    assert train.paths[:3] == ["train/Mango/0.JPEG", "train/Mango/1.JPEG", "train/Mango/2.JPEG"]
    assert list(train.labels) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert [sp.name for sp in s.splits] == ["train"]  # no val folder, none asked for


def test_flat_val_with_kaggle_csv_and_synset_names(tmp_path):
    write_tree(tmp_path / "ILSVRC" / "Data" / "CLS-LOC", classes=2, per_class=1, sizes=((8, 8),))
    root = tmp_path / "ILSVRC" / "Data" / "CLS-LOC"
    (root / "val").mkdir()
    for n in ("ILSVRC2012_val_00000001", "ILSVRC2012_val_00000002", "ILSVRC2012_val_00000003"):
        (root / "val" / f"{n}.JPEG").write_bytes(b"x")
    (tmp_path / "LOC_val_solution.csv").write_text(
        "ImageId,PredictionString\n"
        "ILSVRC2012_val_00000001,n00000001 1 2 3 4 n00000001 5 6 7 8\n"
        "ILSVRC2012_val_00000002,n00000000 1 2 3 4\n"
    )
    (tmp_path / "LOC_synset_mapping.txt").write_text("n00000000 tench, Tinca tinca\nn00000001 goldfish\n")
    # three levels above SRC is too far to be trusted without being named
    with pytest.raises(SourceError, match="its parent\\); pass --val-labels"):
        scan_imagenet(root)
    s = scan_imagenet(root, val_labels=tmp_path / "LOC_val_solution.csv")
    assert s.val_labels == tmp_path / "LOC_val_solution.csv"
    val = s.splits[1]
    assert val.paths == ["val/ILSVRC2012_val_00000001.JPEG", "val/ILSVRC2012_val_00000002.JPEG"]
    assert list(val.labels) == [1, 0]
    assert val.unlabeled == ["val/ILSVRC2012_val_00000003.JPEG"]
    assert s.class_names == ["tench, Tinca tinca", "goldfish"]


def test_two_column_labels_file_by_wnid_or_index(tmp_path):
    f = tmp_path / "val.txt"
    f.write_text("a.JPEG n1\nb.JPEG 0\n")
    assert read_val_labels(f, ["n0", "n1"]) == {"a": 1, "b": 0}
    f.write_text("a.JPEG n7\n")
    with pytest.raises(SourceError, match="n7"):
        read_val_labels(f, ["n0", "n1"])


def test_val_in_class_folders(tmp_path):
    write_tree(tmp_path, classes=3, per_class=1, val_per_class=1, sizes=((8, 8),))
    s = scan_imagenet(tmp_path, ("train", "val"))
    assert list(s.splits[1].labels) == [0, 1, 2]


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda p: None, "does not exist"),
        (lambda p: p.mkdir(), "train: missing"),
        (lambda p: (p / "train").mkdir(parents=True), "no class folders"),
        (lambda p: (p / "train" / "a").mkdir(parents=True), "no images found under"),
    ],
)
def test_bad_trees_name_the_path(tmp_path, make, match):
    root = tmp_path / "src"
    make(root)
    with pytest.raises(SourceError, match=match) as e:
        scan_imagenet(root)
    assert str(root) in str(e.value)


def test_empty_class_rejected_unless_allowed(tmp_path):
    write_tree(tmp_path, classes=2, per_class=1, sizes=((8, 8),))
    (tmp_path / "train" / "n99").mkdir()
    with pytest.raises(SourceError, match="n99"):
        scan_imagenet(tmp_path)
    assert scan_imagenet(tmp_path, allow_empty_classes=True).classes[-1] == "n99"


def test_explicit_val_split_must_exist(tmp_path):
    write_tree(tmp_path, classes=1, per_class=1, sizes=((8, 8),))
    with pytest.raises(SourceError, match="val"):
        scan_imagenet(tmp_path, ("train", "val"))


def test_limit_spreads_over_classes(tmp_path):
    write_tree(tmp_path, classes=4, per_class=10, sizes=((8, 8),))
    s = scan_folder(tmp_path / "train").splits[0].limited(8)
    assert len(s.paths) == 8 and set(np.asarray(s.labels)) == {0, 1, 2, 3}


def test_symlink_loop_is_not_followed_forever(tmp_path):
    write_tree(tmp_path, classes=1, per_class=2, sizes=((8, 8),))
    (tmp_path / "train" / "n00000000" / "loop").symlink_to(tmp_path / "train" / "n00000000")
    assert len(scan_folder(tmp_path / "train").splits[0].paths) == 2


def test_a_labels_file_in_the_parent_is_used_and_named_one_higher_is_not(tmp_path):
    root = tmp_path / "a" / "b"
    write_tree(root, classes=2, per_class=1, sizes=((8, 8),))
    (root / "val").mkdir()
    (root / "val" / "x1.JPEG").write_bytes(b"x")
    stray = tmp_path / "LOC_val_solution.csv"  # two levels above SRC: a leftover, not this tree's
    stray.write_text("ImageId,PredictionString\nx1,n00000001 1 2 3 4\n")
    with pytest.raises(SourceError, match="no labels file was found"):
        scan_imagenet(root)
    mine = tmp_path / "a" / "LOC_val_solution.csv"
    mine.write_text("ImageId,PredictionString\nx1,n00000000 1 2 3 4\n")
    s = scan_imagenet(root)
    assert s.val_labels == mine.resolve() and list(s.splits[1].labels) == [0]


def test_a_tree_without_images_says_so_and_names_what_was_looked_for(tmp_path):
    for c in ("a", "b"):
        (tmp_path / c).mkdir()
    (tmp_path / "a" / "notes.txt").write_text("not an image")
    for allow in (False, True):  # no flag makes an imageless tree a dataset: none is suggested
        with pytest.raises(SourceError) as e:
            scan_folder(tmp_path, allow_empty_classes=allow)
        msg = str(e.value)
        assert msg.startswith(f"no images found under {tmp_path} (looked for ")
        assert ".jpg" in msg and ".jpeg" in msg and ".png" in msg
        assert "--allow-empty-classes" not in msg and "hold no images" not in msg
    (tmp_path / "a" / "x.JPEG").write_bytes(b"x")  # now one class has an image: the flag is the answer
    with pytest.raises(SourceError, match=r"1 class folder\(s\) hold no images: b; .*--allow-empty-classes.*the other 1 hold 1 images"):
        scan_folder(tmp_path)
    assert scan_folder(tmp_path, allow_empty_classes=True).classes == ["a", "b"]


def test_class_folders_named_like_splits_are_refused_unless_allowed(tmp_path):
    write_tree(tmp_path, classes=2, per_class=1, val_per_class=1, sizes=((8, 8),))  # tmp/train/<c>, tmp/val/<c>
    with pytest.raises(SourceError, match=r"class folders \(train, val\) are named like splits.*dataprep build imagenet "
                                          r".*--allow-split-named-classes") as e:
        scan_folder(tmp_path)
    assert str(tmp_path) in str(e.value)
    s = scan_folder(tmp_path, allow_split_named_classes=True)
    assert s.classes == ["train", "val"] and len(s.splits[0].paths) == 4
    assert scan_imagenet(tmp_path).classes == ["n00000000", "n00000001"]  # what was meant
    only = tmp_path / "only"
    (only / "test" / "n0").mkdir(parents=True)
    (only / "test" / "n0" / "x.JPEG").write_bytes(b"x")
    with pytest.raises(SourceError, match=r"build folder .*only/test --split test"):  # no train: one split at a time
        scan_folder(only)
    (only / "cat").mkdir()
    (only / "cat" / "y.JPEG").write_bytes(b"x")
    assert scan_folder(only).classes == ["cat", "test"]  # one class named like a split among others is a class


def test_limit_keeps_a_small_class_between_large_ones():
    """--limit 4 over classes of 100, 2 and 100 files: an even spread over the whole split picked none of
    the middle class; every class shows up, the rest shared by size, each class spread first to last."""
    import numpy as np

    from dataprep.sources import SplitSource, spread

    labels = np.array([0] * 100 + [1] * 2 + [2] * 100)
    split = SplitSource("train", [f"c{c}/{i}" for i, c in enumerate(labels)], labels)
    naive = labels[spread(len(labels), 4)]
    assert 1 not in naive  # negative control: what the whole-split spread did
    for limit, expect in ((4, [2, 1, 1]), (3, [1, 1, 1]), (10, [5, 1, 4]), (2, [1, 0, 1])):
        got = split.limited(limit)
        assert np.bincount(got.labels, minlength=3).tolist() == expect
        assert got.paths == sorted(got.paths, key=split.paths.index)  # pack order kept
    first_class = [p for p in split.limited(10).paths if p.startswith("c0/")]
    assert first_class[0] == "c0/0" and first_class[-1] == "c0/99"  # spread from first to last
