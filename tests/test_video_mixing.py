"""Video packs served through the Loader's other paths: a Mixture of two video packs, a progressive Schedule over a
multi-resolution video pack, `loader.stats()` over clips. Frame-coded generated videos (dataprep.synthetic), so every
served frame says which video and frame it is (test_video_serving.py's `numbers`)."""
from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("av", reason="needs the video extra (pip install 'dataprep[video]')")

import dataprep  # noqa: E402
from dataprep import build  # noqa: E402
from dataprep.synthetic import write_tree, write_video, write_video_tree  # noqa: E402

from .test_video_serving import CROP, numbers  # noqa: E402

T = 4
# pack A: 2 classes x 3 videos of 12 frames, numbered from 12 g; pack B: classes "class_1" and "class_9", 2 videos
# each of 16 frames, numbered from 512 + 16 g, and a smaller frame (48 px, not 64)
A_FRAMES, A_PER_CLASS, A_STRIDE = 12, 3, 2
B_FIRST, B_FRAMES, B_PER_CLASS, B_STRIDE = 512, 16, 2, 3
BY_NAME = ["class_0", "class_1", "class_9"]


@pytest.fixture(scope="module")
def packs(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("mixed")
    write_video_tree(root / "a_src", classes=2, per_class=A_PER_CLASS, frames=A_FRAMES, h=64, w=96)
    build.video(root / "a_src", root / "a", size=64, workers=1)
    for c, name in enumerate(("class_1", "class_9")):
        (root / "b_src" / name).mkdir(parents=True)
        for j in range(B_PER_CLASS):
            write_video(root / "b_src" / name / f"v{j}.mp4", B_FRAMES, 48, 64, first=B_FIRST + B_FRAMES * (B_PER_CLASS * c + j))
    build.video(root / "b_src", root / "b", size=48, workers=1)
    return root / "a", root / "b"


def where(clip: torch.Tensor) -> tuple[str, int, list[int]]:
    """(member "a" or "b", video, frame numbers in it) of a served clip, checked consecutive at that member's
    stride within one video (the last frame repeated past the video's end)."""
    got = numbers(clip)
    if got[0] >= B_FIRST:
        member, first, length, stride = "b", B_FIRST, B_FRAMES, B_STRIDE
    else:
        member, first, length, stride = "a", 0, A_FRAMES, A_STRIDE
    video = (got[0] - first) // length
    at = [n - first - length * video for n in got]
    assert at == [min(at[0] + stride * k, length - 1) for k in range(T)], (member, got)
    return member, video, at


def label_of(member: str, video: int) -> int:
    """A clip's label in the mixture's by_name classes (class_0, class_1, class_9)."""
    if member == "a":
        return BY_NAME.index(f"class_{video // A_PER_CLASS}")
    return BY_NAME.index(("class_1", "class_9")[video // B_PER_CLASS])


def mixture(packs, samples: int | None = None) -> dataprep.Mixture:
    a, b = packs
    members = [dataprep.VideoDataset(a, frames=T, stride=A_STRIDE), dataprep.VideoDataset(b, frames=T, stride=B_STRIDE)]
    return dataprep.Mixture(members, [0.75, 0.25], seed=3, samples=samples, labels="by_name")


def served(dataset, epochs=(0,), **kw) -> list[tuple[torch.Tensor, torch.Tensor]]:
    loader = dataprep.Loader(dataset, **{"batch_size": 4, "seed": 5, "crop": CROP, "flip": True, **kw})
    out = []
    for e in epochs:
        loader.set_epoch(e)
        out += [(x.clone(), y.clone()) for x, y in loader]
    loader.close()
    return out


def same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, u) and torch.equal(y, v) for (x, y), (u, v) in zip(a, b))


def test_a_mixture_of_two_video_packs_serves_each_members_clips_labels_and_share(packs):
    mix = mixture(packs, samples=40)
    assert mix.classes == BY_NAME
    batches = served(mix, epochs=(0, 1))
    assert batches[0][0].shape == (4, T, 3, 32, 32)
    for epoch in (batches[:10], batches[10:]):
        seen: dict[str, list[int]] = {"a": [], "b": []}
        for x, y in epoch:
            for clip, label in zip(x, y.tolist()):
                member, video, _ = where(clip)
                assert label == label_of(member, video), (member, video, label)
                seen[member].append(video)
        # 0.75 of 40: 30 clips of A, 5 of its member epochs (each video once in each); 10 of B, 2.5 of its epochs
        assert (len(seen["a"]), len(seen["b"])) == (30, 10) == tuple(mix.counts(40).tolist())
        assert sorted(seen["a"]) == sorted(list(range(2 * A_PER_CLASS)) * 5)
        assert max(np.bincount(seen["b"])) - min(np.bincount(seen["b"])) <= 1
    # the weights hold over every window of positions, not only the epoch's: the first 8 hold 6 of A
    assert sum(numbers(c)[0] < B_FIRST for x, _ in batches[:2] for c in x) == 6


def test_a_video_mixture_serves_identical_batches_with_workers_and_resumes_mid_epoch(packs):
    ref = served(mixture(packs), epochs=(0, 1))
    assert same(ref, served(mixture(packs), epochs=(0, 1), num_workers=2))
    assert same(ref, served(mixture(packs), epochs=(0, 1), num_workers=2, threads=True))
    for workers in (0, 2):
        loader = dataprep.Loader(mixture(packs), batch_size=4, seed=5, crop=CROP, flip=True, num_workers=workers)
        loader.set_epoch(1)
        it = iter(loader)
        next(it)
        state = loader.state_dict()
        loader.close()
        again = dataprep.Loader(mixture(packs), batch_size=4, seed=5, crop=CROP, flip=True, num_workers=workers)
        again.load_state_dict(state)
        rest = [(x.clone(), y.clone()) for x, y in again]
        again.close()
        first_epoch = len(ref) // 2
        assert same(ref[first_epoch + 1:], rest), workers


def test_a_video_mixture_refuses_other_kinds_and_other_clip_lengths(packs):
    a, b = packs
    root = Path(a).parent
    write_tree(root / "images_src", classes=2, per_class=2, sizes=((48, 64),))
    build.imagenet(root / "images_src", root / "images", size=32, workers=1)
    with pytest.raises(dataprep.DataprepError, match="one kind.*VideoDataset"):
        dataprep.Mixture([dataprep.VideoDataset(a, frames=T), dataprep.InMemoryImageDataset(root / "images")], [0.5, 0.5])
    short = dataprep.Mixture([dataprep.VideoDataset(a, frames=T), dataprep.VideoDataset(b, frames=T + 1)], [0.5, 0.5],
                             labels="by_name")
    with pytest.raises(dataprep.DataprepError, match=r"different batches.*images \(5, 32, 32, 3\).*\(4, 32, 32, 3\)"):
        dataprep.Loader(short, batch_size=4, crop=CROP)



# -- a progressive schedule over a multi-resolution video pack ----------------------------------------------
SCHEDULE = {0: 32, 1: 48}  # epoch 0 at 32 px, from epoch 1 on at 48 px


@pytest.fixture(scope="module")
def sizes(tmp_path_factory) -> Path:
    """2 classes x 2 videos of 12 frames (numbered from 12 g), stored at 32 and 48 px squares (center-crop: every
    frame of a resolution one size, so a schedule serves the stored frames without a crop)."""
    root = tmp_path_factory.mktemp("sizes")
    write_video_tree(root / "src", classes=2, per_class=2, frames=12, h=64, w=96)
    build.video(root / "src", root / "pack", sizes=[32, 48], resize="center-crop", workers=1)
    return root / "pack"


def scheduled(pack: Path, epochs=(0, 1, 2), crop=None, **kw):
    ds = dataprep.VideoDataset(pack, frames=T, stride=2, cache="mmap", resolution="all" if crop is not None else None)
    schedule = dataprep.Schedule.table(ds.resolutions, SCHEDULE)
    return served(ds, epochs, batch_size=2, shuffle=True, schedule=schedule, crop=crop, **kw)


def check_scheduled(batches: list, per_epoch: int = 2) -> None:
    """Epoch e's clips at SCHEDULE's size, whole frames (not a smaller one padded), consecutive at the stride, every
    video once an epoch, labelled by its class."""
    for e in range(len(batches) // per_epoch):
        size = SCHEDULE[min(e, 1)]
        videos = []
        for x, y in batches[e * per_epoch:(e + 1) * per_epoch]:
            assert x.shape == (2, T, 3, size, size), (e, x.shape)
            for clip, label in zip(x, y.tolist()):
                got = numbers(clip)
                assert got == [got[0] + 2 * k for k in range(T)] and got[-1] // 12 == got[0] // 12, got
                assert label == got[0] // 24
                red = clip[:, 0, -1].to(torch.int64)  # the bottom row's red: 0 at one end, 255 at the other
                assert (red.amax(1) > 200).all() and (red.amin(1) < 60).all(), (e, red[:, [0, -1]])
                videos.append(got[0] // 12)
        assert sorted(videos) == [0, 1, 2, 3], e


def test_a_schedule_serves_each_epoch_at_its_size_alike_with_workers_and_threads(sizes):
    ref = scheduled(sizes, flip=True)
    check_scheduled(ref)
    for kw in ({"num_workers": 2}, {"num_workers": 2, "threads": True}):
        assert same(ref, scheduled(sizes, flip=True, **kw)), kw
    # a crop plan is resized by the schedule instead: its output size, cut from the stored size that holds it
    cropped = scheduled(sizes, crop=dataprep.RandomResizedCrop(32, scale=(0.6, 1.0)), epochs=(0, 1))
    assert [x.shape[-1] for x, _ in cropped] == [32, 32, 48, 48]
    assert same(cropped, scheduled(sizes, crop=dataprep.RandomResizedCrop(32, scale=(0.6, 1.0)), epochs=(0, 1),
                                   num_workers=2))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_run_resumed_before_the_schedules_switch_serves_both_sizes_as_the_whole_run(sizes, workers):
    ref = scheduled(sizes, epochs=(0, 1), flip=True)
    check_scheduled(ref)
    ds = dataprep.VideoDataset(sizes, frames=T, stride=2, cache="mmap")
    opts = {"batch_size": 2, "shuffle": True, "seed": 5, "schedule": dataprep.Schedule.table(ds.resolutions, SCHEDULE),
            "flip": True, "num_workers": workers}
    loader = dataprep.Loader(ds, **opts)
    next(iter(loader))  # epoch 0's first batch, at 32 px
    state = loader.state_dict()
    loader.close()
    again = dataprep.Loader(dataprep.VideoDataset(sizes, frames=T, stride=2, cache="mmap"), **opts)
    again.load_state_dict(state)
    rest = [(x.clone(), y.clone()) for x, y in again]  # the rest of epoch 0
    rest += [(x.clone(), y.clone()) for x, y in again]  # epoch 1, at 48 px
    again.close()
    assert [x.shape[-1] for x, _ in rest] == [32, 48, 48]
    assert same(ref[1:], rest)


def test_a_mixture_moves_every_member_in_its_first_fill_so_threads_may_fill_it(sizes):
    """A Mixture served by threads (fills_in_threads where its members say so): the pass's first fill, which the
    thread backend runs alone, moves every member to the request's resolution, also those it takes no sample
    from; a scheduled mixture then serves with threads what it serves in one process."""
    from dataprep.serve.request import Request

    def members():
        return [dataprep.VideoDataset(sizes, frames=T, stride=2, cache="mmap") for _ in range(2)]  # at 48 px

    mix = dataprep.Mixture(members(), [0.5, 0.5], seed=1)
    assert mix.fills_in_threads
    first = int(mix.locate(np.arange(len(mix)), 0)[0].tolist().index(0))  # a position of member 0
    assert [d.resolution for d in mix.datasets] == [48, 48]
    layout = mix.batch_layout(Request(resolution=32))
    out = {k: np.empty((1, *shape), dt) for k, (shape, dt) in layout.items()}
    mix.fill_batch(np.array([first]), out, Request(resolution=32))
    assert [d.resolution for d in mix.datasets] == [32, 32]
    mix.datasets[1].use(48)  # moved by something else (another Loader over the member): settled by its own state
    mix.fill_batch(np.array([first]), out, Request(resolution=32))
    assert [d.resolution for d in mix.datasets] == [32, 32]
    schedule = dataprep.Schedule.table([32, 48], SCHEDULE)

    def run(**kw):
        return served(dataprep.Mixture(members(), [0.5, 0.5], seed=1), (0, 1, 2), batch_size=2, schedule=schedule, **kw)

    ref = run()
    assert [x.shape[-1] for x, _ in ref[::4]] == [32, 48, 48]  # 4 batches an epoch
    assert same(ref, run(num_workers=2, threads=True)) and same(ref, run(num_workers=2))


# -- loader.stats() over clips -----------------------------------------------------------------------------
@pytest.mark.parametrize("workers", [0, 2])
def test_stats_count_clips_as_samples_and_a_decode_path_a_frame(packs, workers):
    a, _ = packs
    ds = dataprep.VideoDataset(a, frames=T, stride=A_STRIDE, clips_per_video=2)  # 12 clips of the 6 videos
    mix = mixture(packs)  # 10 clips: 7 or 8 of A, the rest of B
    for dataset, clips in ((ds, 12), (mix, 10)):
        loader = dataprep.Loader(dataset, batch_size=4, seed=5, crop=CROP, num_workers=workers)
        served_clips = sum(len(x) for x, _ in loader)
        s = loader.stats()
        loader.close()
        assert served_clips == clips and (s["batches"], s["samples"]) == (3, clips), s  # samples are clips, not frames
        assert sum(s["decode_paths"].values()) == clips * T, s["decode_paths"]  # every frame of every clip cut once
        assert s["finished"] and 0 < s["wait_s"] <= s["wall_s"] and 0 <= s["wait_fraction"] <= 1
        assert s["workers"] == workers and len(s["worker_busy"]) == workers
    loader = dataprep.Loader(ds, batch_size=4, seed=5, num_workers=workers)  # no crop: every frame decoded whole
    assert sum(len(x) for x, _ in loader) == 12 and loader.stats()["decode_paths"] == {"full": 12 * T}
    loader.close()


# -- clips at a frame rate, by the stored timestamps ------------------------------------------------------------
VFR_MS = [0, 30, 130, 140, 200, 330, 380, 500, 610, 650, 720, 900]  # a variable frame rate: each frame's time
TIMED = {0: VFR_MS, 100: [100 * k for k in range(12)], 200: [0, 100, 200]}  # first number -> frame times (ms)


@pytest.fixture(scope="module")
def timed(tmp_path_factory) -> Path:
    """Three videos built without --fps (each keeps its own times): a variable frame rate (numbers from 0), 10 fps
    (from 100), and 3 frames at 10 fps (from 200), shorter than a clip."""
    root = tmp_path_factory.mktemp("timed")
    for c, (first, ms) in enumerate(TIMED.items()):
        (root / "src" / f"c{c}").mkdir(parents=True)
        write_video(root / "src" / f"c{c}" / "v.mp4", len(ms), 32, 48, first=first, times=[t / 1000 for t in ms])
    build.video(root / "src", root / "pack", size=32, workers=1)
    return root / "pack"


def at_rate(clip: torch.Tensor, fps: float) -> list[int]:
    """A clip served at `fps`, checked against its video's frame times (exact fractions, not the floats served
    from): frame i is the last one shown at or before the first frame's time + i / fps, the first frame one whose
    time leaves the clip's span before the video's last frame (or the video's first, where no frame does); gives
    the clip's frame indices in its video."""
    got = numbers(clip)
    first = max(f for f in TIMED if f <= got[0])
    times = [Fraction(ms, 1000) for ms in TIMED[first]]
    s = got[0] - first
    span = (T - 1) / Fraction(fps).limit_denominator(1000)
    assert times[s] + span <= times[-1] or s == 0, (got, "a first frame where the clip does not fit")
    want = [max(k for k, t in enumerate(times) if t <= times[s] + i * span / (T - 1)) for i in range(T)]
    assert [n - first for n in got] == want, (fps, got, want)
    return want


@pytest.mark.parametrize("fps", [10, 5, 20, 7.5])
def test_clips_at_a_frame_rate_serve_the_frame_shown_at_each_instant(timed, fps):
    ds = dataprep.VideoDataset(timed, frames=T, fps=fps)
    loader = dataprep.Loader(ds, batch_size=3, shuffle=True, seed=1)
    starts: dict[int, set[int]] = {0: set(), 100: set()}
    for epoch in range(8):
        loader.set_epoch(epoch)
        for x, y in loader:
            for clip, label in zip(x, y.tolist()):
                rows = at_rate(clip, fps)
                first = [0, 100, 200][label]
                assert numbers(clip)[0] - rows[0] == first  # the label is its video's class
                if first in starts:
                    starts[first].add(rows[0])
    loader.close()
    assert len(starts[0]) > 2 and len(starts[100]) > 2, starts  # starts drawn anew each epoch
    short = ds.frame_rows([2], epoch=0)[0] - int(ds.video_starts[2])  # 3 frames 0.1 s apart: the last one repeated
    assert short.tolist() == [min(int(10 * i / Fraction(fps)), 2) for i in range(T)]


def test_clips_at_a_frame_rate_are_the_same_with_workers_threads_and_a_resumed_run(timed):
    def run(**kw):
        return served(dataprep.VideoDataset(timed, frames=T, fps=10), epochs=(0, 1, 2), batch_size=2, shuffle=True,
                      crop=None, flip=False, **kw)

    ref = run()
    for kw in ({"num_workers": 2}, {"num_workers": 2, "threads": True}):
        assert same(ref, run(**kw)), kw
    loader = dataprep.Loader(dataprep.VideoDataset(timed, frames=T, fps=10), batch_size=2, shuffle=True, seed=5,
                             num_workers=2)
    next(iter(loader))
    state = loader.state_dict()
    loader.close()
    again = dataprep.Loader(dataprep.VideoDataset(timed, frames=T, fps=10), batch_size=2, shuffle=True, seed=5)
    again.load_state_dict(state)
    rest = [(x.clone(), y.clone()) for x, y in again]
    again.close()
    assert same(ref[1:2], rest)


def test_a_frame_rate_and_a_stride_together_or_a_rate_that_is_no_rate_are_refused(timed):
    with pytest.raises(dataprep.DataprepError, match="stride=2 counts stored frames, fps=10 seconds: pass one"):
        dataprep.VideoDataset(timed, frames=T, stride=2, fps=10)
    for bad in (0, -5, float("nan"), float("inf"), True, "10"):
        with pytest.raises(dataprep.DataprepError, match="fps is a number of frames a second from 0.001 to 1000"):
            dataprep.VideoDataset(timed, frames=T, fps=bad)
    assert dataprep.VideoDataset(timed, frames=T).stride == 2  # the default without fps, as before
