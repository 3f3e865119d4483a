"""Detection packs served as image packs are: a Mixture of detection packs (one class list; different lists
refused, or renumbered by name with the padding left at -1), resumed mid-epoch; rank sharding and exact
mid-epoch resume with workers; a node's partition of the cache. The scenes' pixels say where each box is and
which class it is (detection/scenes.py), so a label renumbered wrongly or a box moved unlike its pixels fails
`colour_check`."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dataprep import CenterCrop, DetectionDataset, Loader, Mixture, Partition, RandomResizedCrop, build
from dataprep.detection.scenes import CATEGORY_IDS, NAMES, colour_check, write_scenes
from dataprep.errors import DataprepError
from dataprep.serve.mixture import ClassListsDiffer
from dataprep.serve.ring import Ring

OTHER = [(2, "cyan"), (4, "yellow"), (5, "blue"), (6, "red"), (9, "green"), (10, "magenta")]  # another pack's list


@pytest.fixture(scope="module")
def packs(tmp_path_factory) -> dict[str, Path]:
    """"a": 10 scenes (the scenes' classes); "b": 8 other scenes whose COCO file lists six categories in another
    order (red is label 3 there, label 0 in "a"); both raw, 48 px, shards of 3."""
    base = tmp_path_factory.mktemp("det_serving")
    a = write_scenes(base / "a_src", n=10, sizes=((60, 80), (70, 50)))
    b = write_scenes(base / "b_src", n=8, sizes=((64, 64), (50, 70)), seed=100)
    doc = json.loads(b["coco"].read_text())
    new_id = {cid: dict((n, i) for i, n in OTHER)[NAMES[k]] for k, cid in enumerate(CATEGORY_IDS)}
    for ann in doc["annotations"]:
        ann["category_id"] = new_id[ann["category_id"]]
    doc["categories"] = [{"id": i, "name": n} for i, n in OTHER]
    (base / "b.json").write_text(json.dumps(doc))
    out = {"a": base / "a", "b": base / "b"}
    build.coco(a["images"], out["a"], annotations=a["coco"], size=48, mode="raw", workers=1, shard_size=3)
    build.coco(b["images"], out["b"], annotations=base / "b.json", size=48, mode="raw", workers=1, shard_size=3)
    return out


CROP = RandomResizedCrop(40, scale=(0.2, 1.0))


def _problems(batch, classes) -> list[str]:
    """colour_check over a batch whose labels name `classes` (mapped to the scenes' palette by name)."""
    images, boxes, labels, counts = batch[:4]
    palette = np.array([NAMES.index(n) if n in NAMES else -2 for n in classes])
    x = images.permute(0, 2, 3, 1).numpy()
    out = []
    for k in range(len(x)):
        c = int(counts[k])
        assert (labels[k, c:] == -1).all() and (labels[k, :c] >= 0).all()  # padding stays padding
        out += colour_check(x[k], boxes[k, :c].numpy(), palette[labels[k, :c].numpy()])
    return out


def test_a_mixture_of_one_class_list_serves_each_members_boxes_and_resumes_exactly(packs):
    mk = lambda: Mixture([DetectionDataset(packs["a"], max_boxes=8, min_size=0.5),  # noqa: E731
                          DetectionDataset(packs["a"], split="train", max_boxes=8, min_size=0.5)], [0.7, 0.3], seed=4)
    mix = mk()
    assert mix.classes == list(NAMES)
    kw = dict(batch_size=4, crop=CROP, flip=True, seed=9)
    with Loader(mix, num_workers=2, **kw) as loader:
        every = [[t.clone() for t in b] for b in loader]
    assert len(every) == 5 and not [p for b in every for p in _problems(b, mix.classes)]
    loader = Loader(mk(), **kw)
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    again = Loader(mk(), **kw)
    again.load_state_dict(state)
    rest = list(again)
    assert len(rest) == 3 and all(torch.equal(u, v) for x, y in zip(rest, every[2:]) for u, v in zip(x, y))


def test_different_class_lists_are_refused_or_renumbered_by_name_keeping_the_padding(packs):
    a, b = DetectionDataset(packs["a"], max_boxes=8, min_size=0.5), DetectionDataset(packs["b"], max_boxes=8, min_size=0.5)
    assert b.classes == ["cyan", "yellow", "blue", "red", "green", "magenta"]
    with pytest.raises(ClassListsDiffer, match="6 classes: cyan, yellow"):
        Mixture([a, b], [0.5, 0.5])
    mix = Mixture([a, b], [0.5, 0.5], labels="by_name", seed=1)
    assert mix.classes == list(NAMES) + ["cyan"]
    kw = dict(batch_size=6, crop=CROP, flip=True, seed=3)
    with Loader(mix, num_workers=2, **kw) as loader:
        batches = [[t.clone() for t in batch] for batch in loader]
    assert not [p for batch in batches for p in _problems(batch, mix.classes)]
    assert int(sum(int(bt[3].sum()) for bt in batches)) > 40
    member, _, _ = mix.locate(np.arange(len(mix)), 0)
    assert set(member.tolist()) == {0, 1}
    # resumed mid-epoch, the renumbered labels (and the boxes) are the same
    loader = Loader(Mixture([a, b], [0.5, 0.5], labels="by_name", seed=1), **kw)
    it = iter(loader)
    next(it)
    again = Loader(Mixture([a, b], [0.5, 0.5], labels="by_name", seed=1), **kw)
    again.load_state_dict(loader.state_dict())
    assert all(torch.equal(u, v) for x, y in zip(list(again), batches[1:]) for u, v in zip(x, y))
    offset = Mixture([a, b], [0.5, 0.5], labels="offset", seed=1)  # b's labels shifted past a's five classes
    assert offset.classes == list(NAMES) + [n for _, n in OTHER]
    assert not _problems(next(iter(Loader(offset, batch_size=len(offset), crop=CROP, seed=3))), offset.classes)
    # negative control: served as stored, member b's labels name the wrong colours
    as_is = next(iter(Loader(Mixture([a, b], [0.5, 0.5], labels="as_is", seed=1), batch_size=len(mix), crop=CROP, seed=3)))
    assert _problems(as_is, mix.classes)


def test_members_of_different_max_boxes_are_refused_naming_it(packs):
    with pytest.raises(DataprepError, match=r"serve different batches .*one max_boxes \(detection packs\)"):
        Loader(Mixture([DetectionDataset(packs["a"], max_boxes=8), DetectionDataset(packs["a"], max_boxes=9)], [0.5, 0.5]), 2, crop=CROP)


def test_ranks_split_each_epoch_and_a_rank_resumes_mid_epoch_with_workers(packs):
    """Two ranks serve disjoint halves of every epoch, whose boxes are the single-process loader's for the same
    samples; a rank stopped after two batches and restored serves the rest, boxes and all, unchanged."""
    kw = dict(batch_size=2, crop=CROP, flip=True, shuffle=True, seed=6, indices=True)
    ds = DetectionDataset(packs["a"], min_size=0.5)
    def rows(batch):  # each sample's pixels, boxes, labels and count (batches are cut to their own M)
        x, bx, lb, c, idx = batch
        return {int(i): (x[k], bx[k, : c[k]], lb[k, : c[k]], c[k]) for k, i in enumerate(idx)}

    whole = {i: r for b in Loader(ds, **kw) for i, r in rows(b).items()}
    got = {}
    for r in (0, 1):
        with Loader(ds, rank=r, world_size=2, num_workers=2, **kw) as loader:
            for epoch in range(2):
                served = [b for b in loader]
                if epoch == 0:
                    got[r] = served
    seen = [torch.cat([b[4] for b in got[r]]).tolist() for r in (0, 1)]
    assert sorted(seen[0] + seen[1]) == list(range(len(ds))) and not set(seen[0]) & set(seen[1])
    for r in (0, 1):
        for b in got[r]:
            for i, row in rows(b).items():
                assert all(torch.equal(u, v) for u, v in zip(row, whole[i]))
    loader = Loader(ds, rank=1, world_size=2, num_workers=2, **kw)
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    loader.close()
    with Loader(DetectionDataset(packs["a"], min_size=0.5), rank=1, world_size=2, num_workers=2, **kw) as again:
        again.load_state_dict(state)
        rest = list(again)
    assert len(rest) == len(got[1]) - 2 and all(torch.equal(u, v) for x, y in zip(rest, got[1][2:]) for u, v in zip(x, y))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_nodes_partition_serves_the_boxes_of_its_own_shards_once_an_epoch(packs, workers):
    """Two nodes of one rank each: together they serve every sample once, each sample with the boxes, labels and
    pixels the whole pack serves it with (crops keyed by the split index, not the held row)."""
    kw = dict(batch_size=2, crop=CenterCrop(40, resize=44), seed=2)
    whole = DetectionDataset(packs["a"], trim=False)  # one M for every batch: rows compare across batches
    ref = next(iter(Loader(whole, batch_size=len(whole), crop=kw["crop"], seed=2)))
    seen = []
    for node in (0, 1):
        ds = DetectionDataset(packs["a"], partition=Partition(2, node, 0, 0, 0, 1), trim=False)
        assert len(ds.shapes) < len(whole)
        with Loader(ds, num_workers=workers, indices=True, **kw) as loader:
            for *batch, idx in loader:
                for k, pos in enumerate(idx.tolist()):
                    g = int(ds._global[ds._held_row(pos, 0)])
                    seen.append(g)
                    assert all(torch.equal(t[k], r[g]) for t, r in zip(batch, ref))
    held = len(DetectionDataset(packs["a"], partition=Partition(2, 0)).shapes)
    assert sorted(set(seen)) == list(range(len(whole))) and len(seen) == 2 * max(held, len(whole) - held)


# -- batches cut to their largest count are views of the ring, and a held one never changes ----------------------------

@pytest.fixture(scope="module")
def crowded(tmp_path_factory) -> Path:
    """12 grey images with 5..100 random boxes each: at up to 100 boxes a sample, boxes and labels are over the
    Loader's 1 KiB small-field bound, so it serves them as views of its ring, not copies."""
    import cv2

    base = tmp_path_factory.mktemp("crowded")
    (base / "img").mkdir()
    rng = np.random.default_rng(1)
    images, anns = [], []
    for k in range(12):
        assert cv2.imwrite(str(base / "img" / f"{k}.png"), np.full((48, 64, 3), 100 + k, np.uint8))
        images.append({"id": k, "file_name": f"{k}.png", "width": 64, "height": 48})
        for _ in range(100 if k == 0 else int(rng.integers(5, 90))):
            x, y = rng.uniform(0, 56), rng.uniform(0, 40)
            anns.append({"id": len(anns), "image_id": k, "category_id": int(rng.integers(1, 4)), "bbox": [x, y, 8.0, 8.0]})
    (base / "a.json").write_text(json.dumps({"images": images, "annotations": anns,
                                             "categories": [{"id": i, "name": str(i)} for i in (1, 2, 3)]}))
    build.coco(base / "img", base / "p", annotations=base / "a.json", size=64, mode="raw", workers=1)
    return base / "p"


def _held_views(crowded, workers) -> tuple[list, list, list]:
    """(kept batches, their clones made when served, whether each batch's boxes lie in the ring), with two more
    epochs served after the kept one. workers: 0, worker processes, or "threads" (two, threads=True)."""
    threads = workers == "threads"
    kw = dict(batch_size=3, shuffle=True, seed=5, num_workers=2 if threads else workers, threads=threads,
              crop=RandomResizedCrop(40, scale=(0.1, 0.5)), flip=True)
    with Loader(DetectionDataset(crowded), **kw) as ld:
        kept = list(ld)
        clones = [[t.clone() for t in b] for b in kept]
        ring = ld._ring["boxes"]
        lo = ring.__array_interface__["data"][0]
        viewed = [lo <= b[1].data_ptr() < lo + ring.nbytes for b in kept]
        for _ in range(2):
            list(ld)
    return kept, clones, viewed


@pytest.mark.parametrize("workers", [0, 2, "threads"])
def test_a_held_batch_cut_to_its_largest_count_never_changes(crowded, workers):
    kept, clones, viewed = _held_views(crowded, workers)
    assert all(viewed) and len({b[1].shape[1] for b in kept}) > 1  # views of the ring, of different M
    assert all(not b[1].is_contiguous() or b[1].shape[1] == 100 for b in kept)  # cut views, not compacted copies
    assert all(torch.equal(u, v) for b, c in zip(kept, clones) for u, v in zip(b, c))


def test_without_the_hold_check_cut_batches_are_overwritten(crowded, monkeypatch):
    """Negative control: a Loader that refills slots regardless fails the check above, cut views included."""
    monkeypatch.setattr(Ring, "held", lambda self, slot: False)
    kept, clones, _ = _held_views(crowded, 0)
    assert not all(torch.equal(b[1], c[1]) for b, c in zip(kept, clones))


# -- a forged manifest: max_boxes sizes no buffer ----------------------------------------------------------------------

def _forged(pack: Path, tmp_path: Path, split_max=None, field_max=None) -> Path:
    import shutil

    out = tmp_path / "forged"
    shutil.copytree(pack, out)
    m = json.loads((out / "manifest.json").read_text())
    if split_max is not None:
        m["splits"]["train"]["max_boxes"] = split_max
    if field_max is not None:
        m["fields"]["boxes"]["max_boxes"] = field_max
    (out / "manifest.json").write_text(json.dumps(m))
    return out


def _true_max(pack: Path) -> int:
    ds = DetectionDataset(pack, as_numpy=True)
    return max(len(ds.objects(i)[0]) for i in range(len(ds)))


def test_a_forged_max_boxes_sizes_no_buffer_and_verify_refuses_it(packs, tmp_path):
    """max_boxes of 10**9 in the manifest would give each batch row a 16 GB box buffer: the dataset sizes its
    buffers by the boxes its rows hold, and verify (the field's check, and the manifest against the shards'
    box counts) says the manifest is wrong, both ways."""
    from dataprep.verify import verify_pack

    most = _true_max(packs["a"])
    assert json.loads((packs["a"] / "manifest.json").read_text())["fields"]["boxes"]["max_boxes"] == most  # the build records it
    assert verify_pack(packs["a"]).ok
    forged = _forged(packs["a"], tmp_path, split_max=10 ** 9, field_max=10 ** 9)
    ds = DetectionDataset(forged, trim=False)  # served uncut: the buffers' own width
    assert ds.max_boxes == most
    _, boxes, _, counts = next(iter(Loader(ds, batch_size=4, crop=CROP)))
    assert boxes.shape == (4, most, 4)
    rep = verify_pack(forged)
    assert not rep.ok and any("max_boxes" in what for _, what in rep.problems), rep.problems
    small = _forged(packs["a"], tmp_path / "s", field_max=1)
    rep = verify_pack(small)
    assert not rep.ok and any("max_boxes" in what and "more boxes" in what for _, what in rep.problems), rep.problems
