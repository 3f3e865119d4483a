"""The video build: frame-coded generated videos (each frame's top half codes its number, dataprep.synthetic) built
into packs whose stored JPEGs are decoded back, so every frame's order, timestamp, orientation and size is checked
exactly; --fps, --max-frames, --max-seconds; and the awkward inputs (empty, text named .mp4, truncated, audio only),
each skipped with its reason and counted."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("av", reason="needs the video extra (pip install 'dataprep[video]')")

import cv2  # noqa: E402

from dataprep import build  # noqa: E402
from dataprep.cli import main  # noqa: E402
from dataprep.errors import NothingStored, VideoDecodeError  # noqa: E402
from dataprep.kinds import kind_of  # noqa: E402
from dataprep.synthetic import decode_frame_number, write_video, write_video_tree  # noqa: E402
from dataprep.video.field import FramesField  # noqa: E402
from dataprep.video.read import VideoSettings, read_frames  # noqa: E402


def split_arrays(pack: Path, split: str = "train", key: str = "frame") -> dict:
    """A split's arrays as the kind's fields load them (every field, one flat dict)."""
    m = json.loads((pack / "manifest.json").read_text())
    out: dict = {}
    for f in kind_of(m).fields_of(m).values():
        if isinstance(f, FramesField) and f.image.suffix != ("" if key == "frame" else f"_r{key.split('@')[1]}"):
            continue
        out.update(f.load(pack / split, m["splits"][split]["shards"]))
    return out


def frames_of(a: dict, v: int) -> list[np.ndarray]:
    """Video v's stored frames, decoded."""
    s, e = int(a["video_starts"][v]), int(a["video_starts"][v + 1])
    return [cv2.cvtColor(cv2.imdecode(np.asarray(a["images"][a["offsets"][k]:a["offsets"][k + 1]]), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
            for k in range(s, e)]


def one(tmp_path: Path, name: str = "v.mp4", **kw) -> Path:
    """A folder holding one frame-coded video (a class folder of one video), its path."""
    (tmp_path / "src" / "c").mkdir(parents=True, exist_ok=True)
    write_video(tmp_path / "src" / "c" / name, **{"frames": 12, "h": 32, "w": 48, **kw})
    return tmp_path / "src"


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("videos")
    write_video_tree(root, classes=2, per_class=2, frames=12, h=32, w=48)
    return root


def test_a_build_stores_every_frame_in_order_with_its_timestamp_label_and_source(tree, tmp_path):
    summary = build.video(tree, tmp_path / "p", size=24, workers=1, shard_size=3)
    a = split_arrays(tmp_path / "p")
    assert a["video_starts"].tolist() == [0, 12, 24, 36, 48] and a["video_starts"].dtype == np.dtype("<i8")
    assert a["labels"].tolist() == [0, 0, 1, 1] and a["labels"].dtype == np.dtype("<i8")
    assert a["timestamps"].dtype == np.dtype("<f8") and a["shapes"].tolist() == [[24, 36, 3]] * 48
    for v in range(4):
        assert [decode_frame_number(f) for f in frames_of(a, v)] == list(range(12 * v, 12 * v + 12))
        np.testing.assert_allclose(a["timestamps"][12 * v : 12 * v + 12], np.arange(12) / 10, atol=1e-6)
    sources = [json.loads((tmp_path / "p" / "manifest.json").read_text())["source"]["layout"]]
    assert sources == ["splits"] and "48 frames stored" in "\n".join(summary.lines())
    assert "JPEGs kept" not in "\n".join(summary.lines())  # an image build's figure: a video build keeps none
    r = CliRunner().invoke(main, ["verify", str(tmp_path / "p"), "--decode"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["info", str(tmp_path / "p")])
    assert "split train: 4 samples, 48 frames in 2 shards" in r.output, r.output


def test_several_sizes_store_each_frame_at_each(tree, tmp_path):
    build.video(tree, tmp_path / "p", sizes=(16, 32), workers=1, limit=2)
    for key, shape in (("frame@32", [32, 48, 3]), ("frame@16", [16, 24, 3])):
        a = split_arrays(tmp_path / "p", key=key)
        assert a["shapes"].tolist() == [shape] * 24
        assert [decode_frame_number(f) for f in frames_of(a, 0)] == list(range(12))


@pytest.mark.parametrize("fps,numbers,times", [
    (5, list(range(0, 12, 2)), [k / 5 for k in range(6)]),  # every second frame
    (20, [k // 2 for k in range(24)], [k / 20 for k in range(24)]),  # each frame twice
])
def test_fps_resamples_by_the_timestamps(tmp_path, fps, numbers, times):
    build.video(one(tmp_path), tmp_path / "p", size=32, fps=fps, workers=1)
    a = split_arrays(tmp_path / "p")
    assert [decode_frame_number(f) for f in frames_of(a, 0)] == numbers
    np.testing.assert_allclose(a["timestamps"], times, atol=1e-9)


def test_max_frames_and_max_seconds_keep_a_videos_start(tmp_path):
    src = one(tmp_path)
    build.video(src, tmp_path / "f", size=32, max_frames=5, workers=1)
    build.video(src, tmp_path / "s", size=32, max_seconds=0.55, workers=1)
    assert [decode_frame_number(f) for f in frames_of(split_arrays(tmp_path / "f"), 0)] == [0, 1, 2, 3, 4]
    assert [decode_frame_number(f) for f in frames_of(split_arrays(tmp_path / "s"), 0)] == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize("rotate", [180, 270])
def test_half_and_three_quarter_turns_are_undone(tmp_path, rotate):
    build.video(one(tmp_path, rotate=rotate), tmp_path / "p", size=32, workers=1)
    a = split_arrays(tmp_path / "p")
    assert a["shapes"][0].tolist() == ([32, 48, 3] if rotate == 180 else [48, 32, 3])
    assert [decode_frame_number(np.rot90(f, rotate // 90)) for f in frames_of(a, 0)] == list(range(12))


@pytest.mark.parametrize("size", [32, 24])  # 24: the decoder shrinks the frame before turning it
def test_rotation_metadata_turns_the_frames_upright(tmp_path, size):
    build.video(one(tmp_path, rotate=90), tmp_path / "p", size=size, workers=1)
    a = split_arrays(tmp_path / "p")
    frames = frames_of(a, 0)
    h, w = 48 * size // 32, size
    assert a["shapes"][0].tolist() == [h, w, 3]  # 48 wide, 32 high, turned a quarter clockwise
    # the number's flat block, the top half before turning, is now the right half; the ramp is on the left
    assert frames[3][:, w * 5 // 8:].std(axis=(0, 1)).max() < 6 and frames[3][:, :w * 3 // 8].std(axis=(0, 1)).max() > 20
    assert [decode_frame_number(np.rot90(f, 1)) for f in frames] == list(range(12))


def test_odd_sizes_and_a_one_frame_video(tmp_path):
    (tmp_path / "src" / "c").mkdir(parents=True)
    write_video(tmp_path / "src" / "c" / "odd.mkv", 5, 34, 50, first=7)
    write_video(tmp_path / "src" / "c" / "one.mp4", 1, 32, 48, first=9)
    build.video(tmp_path / "src", tmp_path / "p", size=17, workers=1)
    a = split_arrays(tmp_path / "p")
    assert a["video_starts"].tolist() == [0, 5, 6]
    assert a["shapes"].tolist() == [[17, 25, 3]] * 5 + [[17, 26, 3]]
    assert [decode_frame_number(f) for f in frames_of(a, 0)] + [decode_frame_number(f) for f in frames_of(a, 1)] == [7, 8, 9, 10, 11, 9]
    assert a["timestamps"][5] == 0.0


def test_a_variable_frame_rate_keeps_each_frames_time(tmp_path):
    times = [0, 0.1, 0.15, 0.4, 0.41]
    src = one(tmp_path, frames=5, times=times)
    build.video(src, tmp_path / "p", size=32, workers=1)
    a = split_arrays(tmp_path / "p")
    assert [decode_frame_number(f) for f in frames_of(a, 0)] == [0, 1, 2, 3, 4]
    np.testing.assert_allclose(a["timestamps"], times, atol=1e-3)
    got = [(decode_frame_number(p), round(t, 6)) for p, t in read_frames(str(src / "c" / "v.mp4"), VideoSettings(fps=10))][:5]
    assert got == [(0, 0.0), (1, 0.1), (2, 0.2), (2, 0.3), (3, 0.4)]  # the frame shown at each tenth of a second


def _awkward(root: Path) -> None:
    """One class folder of good videos and every awkward input the issue lists."""
    d = root / "train" / "c"
    d.mkdir(parents=True)
    write_video(d / "good.mp4", 6, 32, 48)
    (d / "empty.mp4").write_bytes(b"")
    (d / "text.mp4").write_text("this is not a video\n" * 20)
    whole = write_video(root / "whole.mp4", 20, 32, 48).read_bytes()
    assert whole.rfind(b"moov") > len(whole) // 2  # the index comes last: cutting the file loses it
    (d / "truncated.mp4").write_bytes(whole[: len(whole) // 2])
    import av

    with av.open(str(d / "audio.mp4"), "w") as out:
        s = out.add_stream("aac", rate=8000)
        fr = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
        fr.sample_rate = 8000
        for p in [*s.encode(fr), *s.encode()]:
            out.mux(p)


def test_awkward_inputs_are_skipped_with_their_reasons_and_counted(tmp_path):
    _awkward(tmp_path / "src")
    summary = build.video(tmp_path / "src", tmp_path / "p", size=32, workers=1)
    m = json.loads((tmp_path / "p" / "manifest.json").read_text())
    skipped = {Path(s["source"]).name: s["reason"] for s in m["splits"]["train"]["skipped"]}
    assert skipped == {"empty.mp4": "empty file", "text.mp4": "unreadable", "truncated.mp4": "unreadable", "audio.mp4": "no video stream"}
    assert m["splits"]["train"]["count"] == 1 and summary.splits[0].skipped == {"empty file": 1, "unreadable": 2, "no video stream": 1}
    assert [decode_frame_number(f) for f in frames_of(split_arrays(tmp_path / "p"), 0)] == list(range(6))
    with pytest.raises(VideoDecodeError, match=r"truncated\.mp4: unreadable \(not a video FFmpeg reads"):
        list(read_frames(str(tmp_path / "src" / "train" / "c" / "truncated.mp4")))


def test_a_build_that_stores_nothing_exits_non_zero(tmp_path):
    _awkward(tmp_path / "src")
    (tmp_path / "src" / "train" / "c" / "good.mp4").unlink()
    r = CliRunner().invoke(main, ["build", "video", str(tmp_path / "src"), "--out", str(tmp_path / "p"), "-j", "1", "--no-progress"])
    assert r.exit_code == 1 and "nothing stored" in r.output and not (tmp_path / "p" / "manifest.json").exists()
    with pytest.raises(NothingStored):
        build.video(tmp_path / "src", tmp_path / "q", workers=1)


def test_a_csv_list_of_videos_is_a_source(tree, tmp_path):
    videos = sorted((tree / "train").rglob("*.mp4"))
    (tmp_path / "list.csv").write_text("".join(f"{p},{'b' if k % 2 else 'a'}\n" for k, p in enumerate(videos)))
    build.video(tmp_path / "list.csv", tmp_path / "p", size=24, root="/", workers=1)
    a = split_arrays(tmp_path / "p")
    assert a["labels"].tolist() == [0, 1, 0, 1] and a["video_starts"].tolist() == [0, 12, 24, 36, 48]


def test_frame_caps_refuse_before_decoding(tmp_path, monkeypatch):
    import dataprep.video.read as read

    path = str(one(tmp_path) / "c" / "v.mp4")
    monkeypatch.setattr(read, "VIDEO_MAX_FRAMES", 5)
    with pytest.raises(VideoDecodeError, match="too many frames.*declares 12 frames"):
        next(read_frames(path))
    assert len(list(read_frames(path, VideoSettings(max_frames=3)))) == 3  # bounded: read its start
    with pytest.raises(VideoDecodeError, match="too large.*48x32 frames, over the 1,000-pixel cap"):
        next(read_frames(path, max_pixels=1000))
    with pytest.raises(VideoDecodeError, match="too large.*over the 100-byte cap"):
        next(read_frames(path, max_bytes=100))


def test_the_frame_index_check_finds_what_verify_reports(tree, tmp_path):
    build.video(tree, tmp_path / "p", size=24, workers=1, limit=2)
    m = json.loads((tmp_path / "p" / "manifest.json").read_text())
    field = kind_of(m).fields_of(m)["frame"]
    a = split_arrays(tmp_path / "p")
    assert field.check(a) == []
    back = {**a, "timestamps": a["timestamps"].copy()}
    back["timestamps"][15] = 0.05  # video 1's frame 3, before its frame 2
    assert field.check(back) == ["timestamps.npy: video 1's frame 3 is at 0.05 s, before the frame ahead of it (0.2 s)"]
    short = {**a, "video_starts": np.array([0, 12, 23])}
    assert "but the split stores 24 frames" in field.check(short)[0]
    empty = {**a, "video_starts": np.array([0, 24, 24])}
    assert "video 1 has no frames" in field.check(empty)[0]


def _shard_task(root: Path, out: Path, names: list[str], size: int = 64, strict: bool = False):
    from dataprep.images.settings import ImageSettings
    from dataprep.video.build import VideoShardTask

    return VideoShardTask(str(root), str(out), 0, tuple(f"c/{n}" for n in names), np.zeros(len(names), np.int64), True,
                          ImageSettings(size=size), VideoSettings(), strict)


def test_a_build_holds_no_frames_of_a_long_video(tmp_path):
    """The build's memory (all Python and numpy allocations, tracemalloc) does not grow with a video's length: its
    frames go to the shard as they are encoded. Holding a video's JPEGs until it ends (the old build) grows by
    what the longer video's extra frames weigh (over 200 kB); the bound is 40 kB."""
    import tracemalloc

    from dataprep.video.build import build_video_shard

    (tmp_path / "c").mkdir()
    peaks, jpegs = {}, {}
    for frames in (30, 200):
        write_video(tmp_path / "c" / f"v{frames}.mp4", frames, 96, 128)
        build_video_shard(_shard_task(tmp_path, tmp_path / f"warm{frames}", [f"v{frames}.mp4"]))  # codecs' first-use allocations
        tracemalloc.start()
        rec = build_video_shard(_shard_task(tmp_path, tmp_path / f"p{frames}", [f"v{frames}.mp4"], size=96))
        peaks[frames] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert rec["counts"] == {"frames": frames}
        jpegs[frames] = rec["files"]["images.npy"]["bytes"]
    assert jpegs[200] - jpegs[30] > 200_000  # what holding the longer video's frames would add: 5x the bound
    assert peaks[200] - peaks[30] < 40_000, (peaks, jpegs)


def test_a_video_that_fails_half_way_leaves_none_of_its_frames(tmp_path, monkeypatch):
    """A video whose 5th frame cannot be encoded is skipped, and the frames it had appended are gone from the shard:
    the next video's frames follow the first's, offsets and blob agree, and the shard's files match their records."""
    import dataprep.video.build as vb
    from dataprep.pack.shard import file_sha256

    (tmp_path / "c").mkdir()
    for name, first in (("a.mp4", 0), ("b.mp4", 100), ("c.mp4", 200)):
        write_video(tmp_path / "c" / name, 8, 32, 48, first=first)
    real, seen = vb.encode_frame, {"n": 0}

    def failing(pixels, image):
        seen["n"] += 1
        if seen["n"] == 8 + 5:  # b.mp4's 5th frame
            raise ValueError("planted")
        return real(pixels, image)

    monkeypatch.setattr(vb, "encode_frame", failing)
    rec = vb.build_video_shard(_shard_task(tmp_path, tmp_path / "p", ["a.mp4", "b.mp4", "c.mp4"], size=32))
    assert rec["count"] == 2 and [s["source"] for s in rec["skipped"]] == ["c/b.mp4"]
    shard = tmp_path / "p" / "00000"
    for fname, frec in rec["files"].items():
        assert (shard / fname).stat().st_size == frec["bytes"] and file_sha256(shard / fname) == frec["sha256"], fname
    images, offsets = np.load(shard / "images.npy"), np.load(shard / "offsets.npy")
    assert offsets[-1] == len(images) and np.load(shard / "video_starts.npy").tolist() == [0, 8, 16]
    a = {"images": images, "offsets": offsets, "video_starts": np.array([0, 8, 16])}
    assert [decode_frame_number(f) for v in (0, 1) for f in frames_of(a, v)] == [*range(8), *range(200, 208)]


def test_a_forged_jump_in_the_timestamps_is_not_an_endless_video(tmp_path, monkeypatch):
    """Three frames whose last is stamped 1,000 s on: --fps 10 would repeat the second frame 10,000 times. The
    frames a video gives are capped after resampling too, so the build skips it with its reason, not forever."""
    import dataprep.video.read as read

    src = one(tmp_path, frames=3, times=[0.0, 0.1, 1000.0])
    monkeypatch.setattr(read, "VIDEO_MAX_FRAMES", 50)
    with pytest.raises(VideoDecodeError, match=r"too many frames.*at 10 fps its timestamps reach"):
        list(read_frames(str(src / "c" / "v.mp4"), VideoSettings(fps=10)))
    assert len(list(read_frames(str(src / "c" / "v.mp4")))) == 3  # as decoded: three frames


@pytest.mark.parametrize("name,codec", [("a.mp4", "libx264"), ("b.mkv", "mpeg4"), ("c.webm", "libvpx-vp9"), ("d.avi", "mjpeg"),
                                        ("e.mov", "libx264")])
def test_each_container_ffmpeg_reads_is_a_source(tmp_path, name, codec):
    """mp4, mkv, webm, avi and mov, with H.264, MPEG-4, VP9 and MJPEG: every frame stored, in order, timed."""
    build.video(one(tmp_path, name, frames=9, codec=codec, first=40), tmp_path / "p", size=32, workers=1)
    a = split_arrays(tmp_path / "p")
    assert [decode_frame_number(f) for f in frames_of(a, 0)] == list(range(40, 49))
    np.testing.assert_allclose(a["timestamps"], np.arange(9) / 10, atol=1e-3)


def test_a_resumed_video_build_keeps_finished_shards_and_makes_the_same_pack(tree, tmp_path):
    """--resume after a build stopped with shards left to make: the finished ones are kept (not rebuilt), the
    rest made, and the pack's files are the uninterrupted build's, byte for byte."""
    import shutil

    build.video(tree, tmp_path / "whole", size=24, workers=1, shard_size=1)
    build.video(tree, tmp_path / "cut", size=24, workers=1, shard_size=1)
    (tmp_path / "cut" / "manifest.json").unlink()  # stopped before the manifest: shards 0-1 done, 2-3 not
    for k in (2, 3):
        shutil.rmtree(tmp_path / "cut" / "train" / f"{k:05d}")
    summary = build.video(tree, tmp_path / "cut", size=24, workers=1, shard_size=1, resume=True)
    assert summary.kept == 2 and summary.built == 2
    for f in sorted((tmp_path / "whole" / "train").rglob("*.npy")):
        assert f.read_bytes() == (tmp_path / "cut" / "train" / f.relative_to(tmp_path / "whole" / "train")).read_bytes(), f


def _joined_sizes(path: Path, sizes: list[tuple[int, int]], frames: int = 6) -> Path:
    """One file whose stream changes size: MPEG-TS segments (H.264) of `sizes`, joined, frame k numbered k."""
    import av

    from dataprep.synthetic import video_frame

    parts = []
    for i, (h, w) in enumerate(sizes):
        part = path.with_name(f"part{i}.ts")
        with av.open(str(part), "w", format="mpegts") as out:
            s = out.add_stream("libx264", rate=10)
            s.width, s.height, s.pix_fmt = w, h, "yuv420p"
            for k in range(frames):
                for pk in s.encode(av.VideoFrame.from_ndarray(video_frame(k + frames * i, h, w), format="rgb24")):
                    out.mux(pk)
            for pk in s.encode():
                out.mux(pk)
        parts.append(part.read_bytes())
        part.unlink()
    path.write_bytes(b"".join(parts))
    return path


def test_a_stream_that_changes_size_keeps_one_size_a_video(tmp_path):
    """A 64x96 stream that turns 96x64 half-way: every frame is stored at the first frame's size (as ffmpeg scales to
    one output size), in order, so its clips have one box; verify holds a forged pack to the rule."""
    import dataprep

    (tmp_path / "src" / "c").mkdir(parents=True)
    _joined_sizes(tmp_path / "src" / "c" / "v.mp4", [(64, 96), (96, 64)])
    build.video(tmp_path / "src", tmp_path / "p", size=32, workers=1)
    a = split_arrays(tmp_path / "p")
    assert a["shapes"].tolist() == [[32, 48, 3]] * 12
    assert [decode_frame_number(f) for f in frames_of(a, 0)] == list(range(12))
    assert len(dataprep.VideoDataset(tmp_path / "p", frames=4)) == 1
    shard = tmp_path / "p" / "train" / "00000"
    shapes = np.load(shard / "shapes.npy")
    shapes[7] = [48, 32, 3]
    m = json.loads((tmp_path / "p" / "manifest.json").read_text())
    found = kind_of(m).fields_of(m)["frame"].check({**a, "shapes": shapes})
    assert found and "video 0's frame 7 is [48, 32, 3], the frame before it [32, 48, 3]" in found[0]


def test_a_fifo_among_the_videos_is_skipped_not_waited_on(tmp_path):
    """A FIFO named .mp4 would block a plain open forever: it is refused on the descriptor, opened without blocking."""
    import os
    import subprocess
    import sys

    src = one(tmp_path)
    os.mkfifo(src / "c" / "pipe.mp4")
    r = subprocess.run([sys.executable, "-m", "dataprep", "build", "video", str(src), "--out", str(tmp_path / "p"), "-j", "1",
                        "--no-progress"], capture_output=True, text=True, timeout=120)  # a hang guard only
    assert r.returncode == 0, r.stderr
    skipped = json.loads((tmp_path / "p" / "manifest.json").read_text())["splits"]["train"]["skipped"]
    assert [(s["source"], s["reason"], s["detail"]) for s in skipped] == [("c/pipe.mp4", "not a regular file", "it is a FIFO")]


def test_a_listed_file_that_leads_outside_the_root_is_not_read(tmp_path):
    """A CSV list's root confines what is opened (checked on the descriptor, as images are): a row swapped for a
    symlink out after the listing is skipped, never decoded."""
    import os

    src = one(tmp_path)
    outside = write_video(tmp_path / "secret.mp4", 3, 32, 48)
    os.symlink(outside, src / "c" / "link.mp4")
    with pytest.raises(VideoDecodeError, match="outside the root"):
        next(read_frames(str(src / "c" / "link.mp4"), root=str(src)))
    assert len(list(read_frames(str(src / "c" / "link.mp4")))) == 3  # not confined: a class folder's symlink is read


def test_damaged_files_are_skipped_with_a_reason_never_a_crash(tmp_path):
    """Bytes flipped in small videos of five containers (a seeded fuzz, 200 files): each gives frames or a
    VideoDecodeError; nothing else escapes (an unknown codec once raised AttributeError and killed the build)."""
    import random

    seeds = [write_video(tmp_path / f"s{n}", 8, 32, 48, codec=c, rotate=90 if n.endswith(".mov") else 0).read_bytes()
             for n, c in (("a.mp4", "mpeg4"), ("b.mkv", "libx264"), ("c.webm", "libvpx-vp9"), ("d.avi", "mjpeg"), ("e.mov", "mpeg4"))]
    rng = random.Random(5)
    reasons: dict[str, int] = {}
    for _ in range(200):
        b = bytearray(rng.choice(seeds))
        for _ in range(rng.choice([1, 2, 4, 8, 32])):
            b[rng.randrange(len(b))] = rng.randrange(256)
        (tmp_path / "x.mp4").write_bytes(b)
        try:
            for _ in read_frames(str(tmp_path / "x.mp4"), VideoSettings(fps=rng.choice([None, 7.0])), scaled=lambda h, w: (h // 2 or 1, w // 2 or 1)):
                pass
            reasons["read"] = reasons.get("read", 0) + 1
        except VideoDecodeError as e:
            reasons[e.reason] = reasons.get(e.reason, 0) + 1
    assert reasons.get("read", 0) > 20 and reasons.get("unreadable", 0) > 20, reasons
    b = bytearray(seeds[4])
    b[912] = 0x13  # the stream's codec tag: one FFmpeg has no decoder for
    (tmp_path / "x.mov").write_bytes(b)
    with pytest.raises(VideoDecodeError, match="codec is one FFmpeg cannot decode"):
        list(read_frames(str(tmp_path / "x.mov")))


def test_a_forged_timestamp_far_on_is_refused(tmp_path, monkeypatch):
    """A frame stamped past what one video may span (limits.VIDEO_MAX_SECONDS, 115 days; 500 s here) is refused as
    too long, and verify refuses such a timestamp in a pack."""
    import dataprep.video.field as vf
    import dataprep.video.read as read
    from dataprep.images.field import ImageField

    src = one(tmp_path, frames=3, times=[0.0, 0.1, 1000.0])
    monkeypatch.setattr(read, "VIDEO_MAX_SECONDS", 500)
    with pytest.raises(VideoDecodeError, match="too long.*frame 3 is stamped 1,000 s after the first, past the 500 s"):
        list(read_frames(str(src / "c" / "v.mp4")))
    for fps, times in ((None, [0.0, 0.1]), (10, [0.0, 0.1, 0.2, 0.3, 0.4])):  # --max-seconds stops the reader first
        got = [round(t, 6) for _, t in read_frames(str(src / "c" / "v.mp4"), VideoSettings(fps=fps, max_seconds=0.5))]
        assert got == times, fps
    monkeypatch.setattr(vf, "VIDEO_MAX_SECONDS", 500)
    index = {"video_starts": np.array([0, 2]), "timestamps": np.array([0.0, 1000.0]), "shapes": np.ones((2, 3), np.int32)}
    assert "past 500 s" in FramesField(ImageField("jpeg", None, 3)).check(index)[0]
