"""Serving a video pack as clips (VideoDataset through the Loader): frame-coded generated videos (dataprep.synthetic:
each frame's top half codes its number, its bottom half ramps red with x and green with y), so every served frame
says which frame it is, and its bottom row says where it was cut and whether it was flipped."""
from __future__ import annotations

import gc
import os
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("av", reason="needs the video extra (pip install 'dataprep[video]')")

import dataprep  # noqa: E402
from dataprep import build  # noqa: E402
from dataprep.synthetic import write_video, write_video_tree  # noqa: E402

from .conftest import own_segments  # noqa: E402

FRAMES, PER_CLASS, CLASSES = 12, 3, 2  # frames a video, videos a class: video g numbers its frames from 12 g
T, STRIDE = 4, 2
CROP = dataprep.RandomResizedCrop(32, scale=(0.6, 1.0))  # a box at least 0.6 of the frame tall: it spans both halves


@pytest.fixture(scope="module")
def pack(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("clips")
    write_video_tree(root / "src", classes=CLASSES, per_class=PER_CLASS, frames=FRAMES, h=64, w=96)
    build.video(root / "src", root / "pack", size=64, workers=1)
    return root / "pack"


def numbers(clip: torch.Tensor) -> list[int]:
    """The frame number of each frame of a served clip (T, 3, H, W), from its top two rows (they come from the coded
    half): index_colour's low part is red and 255 - blue, its high part green, levels 8 apart from 4 (read from red
    and blue together, as the codecs' colour conversion moves each by a few levels)."""
    out = []
    for f in clip:
        r, g, b = f[:, :2].to(torch.float64).mean((1, 2)).tolist()
        out.append(round(((r + 255 - b) / 2 - 4) / 8) + 32 * round((g - 4) / 8))
    return out


def ramp(frame: torch.Tensor) -> tuple[int, int, int]:
    """Where a served frame (3, H, W) was cut: its bottom row's red at the left and right ends (the box's left and
    right edges, in the order served: a flipped frame's left is redder) and its green (the box's bottom)."""
    row = frame[:, -1].to(torch.int64)
    return int(row[0, 0]), int(row[0, -1]), int(row[1].median())


def check_clips(clips: torch.Tensor, labels: torch.Tensor) -> list[tuple[int, int, int]]:
    """Every clip's frames consecutive at the stride within one video, its label the video's class, one crop and one
    flip across its frames (the ramp equal on every frame, within the codecs' error); gives each clip's cut."""
    cuts = []
    for clip, label in zip(clips, labels.tolist()):
        got = numbers(clip)
        video = got[0] // FRAMES
        assert got == [got[0] + STRIDE * k for k in range(T)] and got[-1] < FRAMES * (video + 1), got
        assert label == video // PER_CLASS
        first = ramp(clip[0])
        for frame in clip[1:]:
            assert np.abs(np.subtract(ramp(frame), first)).max() <= 8, ("one box and one flip a clip", first, ramp(frame))
        cuts.append(first)
    return cuts


def served(pack: Path, epochs=(0,), **kw) -> list[tuple[torch.Tensor, torch.Tensor]]:
    ds = dataprep.VideoDataset(pack, frames=T, stride=STRIDE, clips_per_video=kw.pop("clips_per_video", 1))
    opts = {"batch_size": 4, "shuffle": True, "seed": 5, "crop": CROP, "flip": True, **kw}
    out = []
    with_loader = dataprep.Loader(ds, **opts)
    for e in epochs:
        with_loader.set_epoch(e)
        out += [(x.clone(), y.clone()) for x, y in with_loader]
    with_loader.close()
    return out


def test_clips_are_consecutive_frames_at_the_stride_with_one_crop_and_one_flip_and_their_labels(pack):
    batches = served(pack, epochs=(0, 1, 2))
    assert batches[0][0].shape == (4, T, 3, 32, 32) and batches[0][0].dtype == torch.uint8
    cuts = [c for x, y in batches for c in check_clips(x, y)]
    assert {left > right for left, right, _ in cuts} == {True, False}  # both flipped and unflipped clips served


def test_every_video_appears_once_an_epoch_and_starts_and_crops_vary_across_epochs(pack):
    seen = {}
    for epoch in range(3):
        clips = [(c, n) for x, y in served(pack, epochs=(epoch,)) for c, n in zip(check_clips(x, y), (numbers(k)[0] for k in x))]
        assert sorted(n // FRAMES for _, n in clips) == list(range(CLASSES * PER_CLASS))
        for cut, n in clips:
            seen.setdefault(n // FRAMES, []).append((n % FRAMES, cut))
    starts = [len({s for s, _ in v}) for v in seen.values()]
    cuts = [len({c for _, c in v}) for v in seen.values()]
    assert max(starts) > 1 and sum(starts) > len(seen) + 2  # starts change with the epoch
    assert min(cuts) > 1  # and every video's crop does
    twice = [n // FRAMES for x, y in served(pack, clips_per_video=2) for n in (numbers(k)[0] for k in x)]
    assert sorted(twice) == sorted(list(range(CLASSES * PER_CLASS)) * 2)


def test_zero_and_two_workers_and_threads_serve_identical_batches(pack):
    ref = served(pack, epochs=(0, 1))
    for kw in ({"num_workers": 2}, {"num_workers": 2, "threads": True}):
        got = served(pack, epochs=(0, 1), **kw)
        assert len(got) == len(ref)
        assert all(torch.equal(a, b) and torch.equal(la, lb) for (a, la), (b, lb) in zip(ref, got)), kw


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resumed_run_serves_what_the_uninterrupted_run_would(pack, workers):
    ds = dataprep.VideoDataset(pack, frames=T, stride=STRIDE)
    opts = {"batch_size": 2, "shuffle": True, "seed": 9, "crop": CROP, "flip": True, "num_workers": workers}
    loader = dataprep.Loader(ds, **opts)
    loader.set_epoch(3)
    whole = [(x.clone(), y.clone()) for x, y in loader]
    loader.set_epoch(3)
    for k, _ in enumerate(loader):
        if k == 1:
            state = loader.state_dict()
            break
    loader.close()
    restored = dataprep.Loader(dataprep.VideoDataset(pack, frames=T, stride=STRIDE), **opts)
    restored.load_state_dict(state)
    rest = [(x.clone(), y.clone()) for x, y in restored]
    restored.close()
    assert len(rest) == len(whole) - 2
    assert all(torch.equal(a, b) and torch.equal(la, lb) for (a, la), (b, lb) in zip(whole[2:], rest))


def test_layouts_and_center_crops_serve_the_same_clips(pack):
    plain = served(pack, crop=dataprep.CenterCrop(48), flip=False)
    x, y = plain[0]
    assert x.shape == (4, T, 3, 48, 48)
    check_clips(x, y)
    ds = dataprep.VideoDataset(pack, frames=T, stride=STRIDE, layout="cthw")
    loader = dataprep.Loader(ds, batch_size=4, shuffle=True, seed=5, crop=dataprep.CenterCrop(48))
    c, _ = next(iter(loader))
    assert c.shape == (4, 3, T, 48, 48) and torch.equal(c, x.transpose(1, 2))
    loader.close()
    last = dataprep.Loader(dataprep.VideoDataset(pack, frames=T, stride=STRIDE), batch_size=4, shuffle=True, seed=5,
                           layout="nhwc")
    whole, _ = next(iter(last))
    assert whole.shape == (4, T, 64, 96, 3)
    last.close()


def test_a_short_video_repeats_its_last_frame_and_videos_of_two_sizes_need_a_crop(tmp_path):
    (tmp_path / "src" / "a").mkdir(parents=True)
    (tmp_path / "src" / "b").mkdir(parents=True)
    write_video(tmp_path / "src" / "a" / "short.mp4", frames=3, h=32, w=48)
    write_video(tmp_path / "src" / "b" / "square.mp4", frames=12, h=48, w=48, first=100)
    build.video(tmp_path / "src", tmp_path / "p", size=32, workers=1)
    ds = dataprep.VideoDataset(tmp_path / "p", frames=T, stride=STRIDE)
    with pytest.raises(dataprep.DataprepError, match="2 sizes"):
        dataprep.Loader(ds, batch_size=2)
    loader = dataprep.Loader(ds, batch_size=2, crop=(32, 32))
    for _ in range(3):  # three epochs
        x, y = next(iter(loader))
        assert numbers(x[0]) == [0, 2, 2, 2] and y.tolist() == [0, 1]
        n = numbers(x[1])
        assert n == [n[0] + STRIDE * k for k in range(T)] and 100 <= n[0] <= 100 + FRAMES - 1 - STRIDE * (T - 1)
    loader.close()
    clip, label = ds[0]
    assert clip.shape == (T, 3, 32, 48) and numbers(clip) == [0, 2, 2, 2] and label == 0


def test_a_pack_data_module_serves_a_video_pack_with_its_crop_and_flip(pack):
    pytest.importorskip("lightning")
    from dataprep.lightning import PackDataModule

    dm = PackDataModule.video(pack, batch_size=4, frames=T, stride=STRIDE, num_workers=0, crop=CROP, flip=True, cache="ram")
    loader = dm.train_dataloader()
    batches = [(x.clone(), y.clone()) for x, y in loader]
    assert batches[0][0].shape == (4, T, 3, 32, 32) and batches[0][0].dtype == torch.uint8
    assert sorted(numbers(k)[0] // FRAMES for x, y in batches for k in x) == list(range(CLASSES * PER_CLASS))
    for x, y in batches:
        check_clips(x, y)
    dm.teardown()
    timed = PackDataModule.video(pack, batch_size=4, frames=T, fps=5, num_workers=0, cache="ram")  # 10 fps sources
    x, _ = next(iter(timed.train_dataloader()))
    assert all(numbers(k) == [numbers(k)[0] + 2 * t for t in range(T)] for k in x)
    timed.teardown()


def test_two_ranks_serve_every_video_once_and_a_state_from_two_ranks_resumes_on_one(pack):
    def loader(**kw):
        opts = {"shuffle": True, "seed": 7, "crop": CROP, "flip": True, **kw}
        return dataprep.Loader(dataprep.VideoDataset(pack, frames=T, stride=STRIDE), **opts)

    one = loader(batch_size=2)  # one rank, the two ranks' global batch: its clips by position in the one order
    one.set_epoch(1)
    whole = [c.clone() for x, _ in one for c in x]
    one.close()
    ranks = [loader(batch_size=1, rank=r, world_size=2) for r in (0, 1)]
    for r in ranks:
        r.set_epoch(1)
    per_rank = [[(x.clone(), y.clone()) for x, y in r] for r in ranks]
    assert [len(b) for b in per_rank] == [3, 3]
    clips = [x for b in per_rank for x, y in b]
    assert sorted(numbers(x[0])[0] // FRAMES for x in clips) == list(range(CLASSES * PER_CLASS))  # every video once
    for r, batches in enumerate(per_rank):  # rank r's k-th clip is the one order's (2 k + r)-th: crops, starts, flips
        assert all(torch.equal(x[0], whole[2 * k + r]) for k, (x, _) in enumerate(batches)), r
        for x, y in batches:
            check_clips(x, y)
    for r in ranks:
        r.set_epoch(1)
    states = []
    for r in ranks:
        next(iter(r))
        states.append(r.state_dict())
        r.close()
    assert states[0]["samples_consumed"] == states[1]["samples_consumed"] == 2
    restored = loader(batch_size=1)  # a rank's batch size as saved: another one warns (serve/resume.py)
    restored.load_state_dict(states[0])
    rest = [c.clone() for x, _ in restored for c in x]
    restored.close()
    assert len(rest) == len(whole) - 2 and all(torch.equal(a, b) for a, b in zip(whole[2:], rest))


@pytest.fixture(scope="module")
def large(tmp_path_factory) -> Path:
    """Frames of 256 x 384 px: many restart segments, so a small box needs only a few of them."""
    root = tmp_path_factory.mktemp("large")
    write_video_tree(root / "src", classes=2, per_class=2, frames=6, h=256, w=384)
    build.video(root / "src", root / "pack", size=256, workers=1)
    return root / "pack"


def test_training_crops_of_large_frames_decode_only_the_restart_segments_around_the_box(pack, large):
    small = dataprep.RandomResizedCrop(32, scale=(0.05, 0.2))

    def serve(decode: str):
        ds = dataprep.VideoDataset(large, frames=T, stride=1, decode=decode)
        loader = dataprep.Loader(ds, batch_size=2, shuffle=True, seed=3, crop=small, flip=True)
        got = torch.cat([x.clone() for x, _ in loader])
        paths = loader.stats()["decode_paths"]
        loader.close()
        return got, paths

    fast, paths = serve("fast")
    assert fast.shape == (4, T, 3, 32, 32)
    # every frame of every clip cut from its box's segments ("region full", "region 1/2": at a DCT scale the box
    # allows), none decoded whole ("fast ...", or "full" and "1/2" for the accurate decode)
    assert all(p.startswith("region ") for p in paths) and sum(paths.values()) == 4 * T, paths
    accurate, whole = serve("accurate")
    assert not any(p.startswith(("region", "fast")) for p in whole), whole
    diff = (fast.to(torch.int16) - accurate.to(torch.int16)).abs()
    assert diff.float().mean() < 1 and diff.max() <= 6  # the same boxes and flips: only the IDCTs differ (a box 8 px off: the ramp moves 5 levels)
    # the 64 px pack's frames are 4 MCU rows of 2 segments: a box of 0.6 of the frame or more, with the
    # resampling margin, spans all of them, so the whole frame is decoded ("fast full"), never a region
    ds = dataprep.VideoDataset(pack, frames=T, stride=STRIDE)
    loader = dataprep.Loader(ds, batch_size=2, crop=CROP)
    for _ in loader:
        pass
    assert set(loader.stats()["decode_paths"]) == {"fast full"}
    loader.close()


def mapped(pid: int, path: str) -> list[tuple[int, int]]:
    """The address ranges where process `pid` maps the file `path`."""
    out = []
    try:
        lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    except FileNotFoundError:  # it has ended
        return out
    for line in lines:
        fields = line.split()
        if len(fields) >= 6 and fields[5] == path:
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            out.append((lo, hi))
    return out


def children() -> list[int]:
    """This process's child processes (each thread's children; a thread or child ending meanwhile is passed over)."""
    out = []
    for t in os.listdir("/proc/self/task"):
        try:
            out += [int(k) for k in Path(f"/proc/self/task/{t}/children").read_text().split()]
        except FileNotFoundError:
            pass
    return out


def test_shm_cache_is_one_copy_for_the_loaders_workers(pack):
    before = own_segments(pack.parent)
    ds = dataprep.VideoDataset(pack, frames=T, stride=STRIDE, cache="shm")
    seg = ds.segment
    assert seg is not None and own_segments(pack.parent) == before | {seg}
    # the frames are served from the segment itself, not from a private copy read out of it
    frames = ds._cached.arrays["images"]
    assert frames.nbytes > 0 and any(lo <= frames.ctypes.data < hi for lo, hi in mapped(os.getpid(), seg))
    loader = dataprep.Loader(ds, batch_size=4, shuffle=True, seed=5, crop=CROP, num_workers=2)
    workers: set[int] = set()
    for x, y in loader:
        check_clips(x, y)
        workers |= {k for k in children() if mapped(k, seg)}
        assert own_segments(pack.parent) == before | {seg}  # no worker made a segment (a copy) of its own
    assert len(workers) == 2  # both workers map the one segment
    other = dataprep.VideoDataset(pack, frames=T, stride=STRIDE, cache="shm")  # a second dataset (another rank) attaches it
    assert other.segment == seg and not other._cached.segment.created
    loader.close()
    del ds, other, loader, frames
    gc.collect()
    assert own_segments(pack.parent) == before  # the last user removed it


@pytest.mark.parametrize("kw,what", [({"frames": 1 << 20}, "frames is a whole number from 1 to 65,536"),
                                     ({"stride": 1 << 61}, "stride is a whole number from 1 to 2,147,483,648"),
                                     ({"clips_per_video": 1 << 30}, "clips_per_video is a whole number from 1 to 65,536"),
                                     ({"frames": 0}, "frames is a whole number"), ({"fps": 5e-324}, "fps is a number"),
                                     ({"fps": float("nan")}, "fps is a number")])
def test_a_clip_request_past_any_machine_is_refused_by_name(pack, kw, what):
    """Clip sizes whose rows overflow int64, whose epoch's order or ring buffers no machine holds, or a rate that
    divides by nearly nothing: a DataprepError naming the argument, before anything is allocated."""
    with pytest.raises(dataprep.DataprepError, match=what):
        dataprep.VideoDataset(pack, **kw)
