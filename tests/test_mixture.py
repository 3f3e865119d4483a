"""Mixtures: per-member counts in every window follow the weights, each member epoch is a permutation of
the member, and a mixture resumes exactly through the Loader, sharded or not."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import dataprep
from dataprep.errors import DataprepError
from dataprep.serve.loader import Loader
from dataprep.serve.mixture import Mixture


class Tagged:
    """A member that serves (tag, index, epoch) per sample, so every served row says where it came from."""

    def __init__(self, tag: int, n: int):
        self.tag, self.n = tag, n

    def __len__(self):
        return self.n

    def batch_layout(self, request=None):
        return {"x": ((3,), np.dtype(np.int64))}

    def fill_batch(self, idx, out, request=None):
        out["x"][: len(idx)] = np.stack([np.full(len(idx), self.tag), idx, np.full(len(idx), request.epoch)], 1)


def served(loader) -> np.ndarray:
    return np.concatenate([x.numpy() for (x,) in loader])


def window_errors(tags: np.ndarray, weights, n: int = 10_000, step: int = 997) -> float:
    """The largest relative deviation from the weights of any member's count in windows of n positions."""
    worst = 0.0
    for s in range(0, len(tags) - n + 1, step):
        c = np.bincount(tags[s : s + n], minlength=len(weights)) / n
        worst = max(worst, float(np.max(np.abs(c - weights) / weights)))
    return worst


WEIGHTS = np.array([0.7, 0.2, 0.1])


def test_counts_in_every_window_follow_the_weights_and_members_restart():
    mix = Mixture([Tagged(0, 30_000), Tagged(1, 5_000), Tagged(2, 2_000)], WEIGHTS, seed=3)
    loader = Loader(mix, 500)
    rows = served(loader)
    assert len(rows) == len(mix) == 37_000
    assert window_errors(rows[:, 0], WEIGHTS) <= 0.01  # within 1 % of each weight, in any 10,000 positions
    rng = np.random.default_rng(0)  # negative control: i.i.d. draws with the same weights miss that bound
    assert window_errors(rng.choice(3, len(rows), p=WEIGHTS), WEIGHTS) > 0.01
    assert mix.passes == pytest.approx([0.7 * 37_000 / 30_000, 0.2 * 37_000 / 5_000, 0.1 * 37_000 / 2_000], rel=1e-3)
    small = rows[rows[:, 0] == 2]  # 3,700 draws of a 2,000-sample member: epoch 0 whole, then epoch 1 begins
    first, second = small[small[:, 2] == 0, 1], small[small[:, 2] == 1, 1]
    assert sorted(first.tolist()) == list(range(2000)) and len(second) == 1700 and len(set(second.tolist())) == 1700
    assert first.tolist() != sorted(first.tolist())  # shuffled within its epoch
    nxt = served(loader)  # the mixture's next epoch continues each member where it stopped
    assert nxt[nxt[:, 0] == 2][0, 2] == 1


def test_stop_ends_the_epoch_when_the_first_member_runs_out():
    mix = Mixture([Tagged(0, 1000), Tagged(1, 300)], [0.5, 0.5], exhausted="stop")
    rows = served(Loader(mix, 64))
    assert len(rows) == 601 and mix.passes == [0.301, 1.0]  # one more position would need a 301st of member 1
    for tag, n in ((0, 301), (1, 300)):
        idx = rows[rows[:, 0] == tag, 1]
        assert len(idx) == n and len(set(idx.tolist())) == n  # no sample twice


@pytest.mark.parametrize("workers", [0, 2])
def test_a_mixture_resumes_exactly_and_shards(workers):
    def make(**kw):
        mix = Mixture([Tagged(0, 700), Tagged(1, 200)], [0.6, 0.4], seed=9)
        return Loader(mix, 32, num_workers=workers, **kw)

    whole = make()
    e0, e1 = served(whole), served(whole)
    stopped = make()
    it = iter(stopped)
    head = np.concatenate([next(it)[0].numpy() for _ in range(5)])
    state = stopped.state_dict()
    stopped.close()
    again = make()
    again.load_state_dict(state)
    assert np.array_equal(np.concatenate([head, served(again)]), e0) and np.array_equal(served(again), e1)
    ranks = [make(rank=r, world_size=2) for r in range(2)]
    halves = [served(r) for r in ranks]
    both = np.concatenate(halves)
    assert len(halves[0]) == len(halves[1]) and sorted(map(tuple, both.tolist())) == sorted(map(tuple, e0.tolist()))
    for loader in (whole, again, *ranks):
        loader.close()


def test_token_packs_mix_through_the_loader(tmp_path):
    from dataprep.tokens.tokenize import TokenizeSettings, tokenize

    packs = []
    for name, text in (("a", "alpha beta gamma delta " * 200), ("b", "one two three four five " * 200)):
        (tmp_path / f"{name}.txt").write_text(text)
        tokenize([str(tmp_path / f"{name}.txt")], tmp_path / name, TokenizeSettings(), train_bpe_vocab=280)
        packs.append(dataprep.TokenDataset(tmp_path / name, context=8, samples=100))
    mix = dataprep.Mixture(packs, [3, 1])
    x, y = next(iter(Loader(mix, 40)))
    assert x.shape == (40, 8) and (x[:, 1:] == y[:, :-1]).all()
    assert x.tolist() == [mix[i][0].tolist() for i in range(40)]  # the Loader serves what indexing gives


def test_bad_mixtures_are_refused(tmp_path):
    with pytest.raises(DataprepError, match="weights"):
        Mixture([Tagged(0, 10), Tagged(1, 10)], [1, -1])
    with pytest.raises(DataprepError, match="weights"):
        Mixture([Tagged(0, 10)], [1, 1])
    with pytest.raises(DataprepError, match="exhausted"):
        Mixture([Tagged(0, 10)], [1], exhausted="never")
    with pytest.raises(DataprepError, match="shuffle=False"):
        Loader(Mixture([Tagged(0, 10)], [1]), 4, shuffle=True)
    with pytest.raises(DataprepError, match="cannot fill batches"):
        Mixture([Tagged(0, 10), list(range(3))], [1, 1])

    class Other(Tagged):
        pass

    with pytest.raises(DataprepError, match="one kind"):
        Mixture([Tagged(0, 10), Other(1, 10)], [1, 1])


def test_mixture_orders_crops_and_flips_draw_from_separate_streams():
    """A member's shuffle must not be a crop's draw of the same samples (they once shared keys: crop areas
    then grew with the position in the epoch), and two members' sample i must not get one box."""
    from dataprep.images.crops import RandomResizedCrop, flips
    from dataprep.serve.mixture import member_seed

    mix = Mixture([Tagged(0, 4000), Tagged(1, 4000)], [0.5, 0.5], seed=0)
    member, index, m_epoch = mix.locate(np.arange(len(mix)), 0)
    first = index[member == 0]  # member 0's samples in the order the mixture serves them
    plan = RandomResizedCrop(8)
    boxes = plan.boxes(np.full(len(first), 100), np.full(len(first), 100), (member_seed(0, 0), 0), first)
    area = boxes[:, 2] * boxes[:, 3]
    assert abs(np.corrcoef(np.arange(len(first)), area)[0, 1]) < 0.05  # no trend along the epoch
    same = np.arange(4000)
    a = plan.boxes(np.full(4000, 100), np.full(4000, 100), (member_seed(0, 0), 0), same)
    b = plan.boxes(np.full(4000, 100), np.full(4000, 100), (member_seed(0, 1), 0), same)
    assert np.mean((a == b).all(1)) < 0.01
    assert 0.48 < np.mean(flips((member_seed(0, 0), 0), same) == flips((member_seed(0, 1), 0), same)) < 0.52


def assert_rows_are_samples(mix, out, idx, req) -> None:
    """Every row of `out` is the sample `locate` names for its position: the member's window, drawn with
    the member's own seed in the member's epoch."""
    from dataprep.serve.mixture import member_seed

    member, index, m_epoch = mix.locate(np.asarray(idx), req.epoch)
    for k in range(len(member)):
        w = mix.datasets[member[k]]._gather(np.array([index[k]]), int(m_epoch[k]), member_seed(req.seed, int(member[k])))
        assert out["x"][k].tolist() == w[0, :-1].tolist() and out["y"][k].tolist() == w[0, 1:].tolist(), k


@pytest.mark.parametrize("chunk", [None, 37])
def test_members_that_fill_rows_in_place_serve_what_the_buffered_path_serves(tmp_path, monkeypatch, chunk):
    """Token members fill a run of positions through the joined view at window starts drawn for a whole
    plan, or each into its rows at those starts, or write their scattered rows straight into the batch
    (`fills_rows`); each must give what the buffered path (fill a part, scatter it) gives, and what each
    member serves for the sample `locate` names, for runs of positions (the Loader's case, asked in
    pieces of 16 that cross plan ends when plans are 37 positions) and scattered positions alike."""
    from dataprep.serve.request import Request

    packs = _token_packs(tmp_path, TEXTS)
    import dataprep.serve.mixture as mixture

    chunk = chunk or mixture.CHUNK  # 37: runs cross plans, and members restart inside them
    mix = dataprep.Mixture(packs, [0.6, 0.4], seed=5)
    req = Request(epoch=3, seed=7)

    def batch(idx):  # a new Mixture each time: nothing cached from a call with other members' methods
        monkeypatch.setattr(mixture, "CHUNK", chunk)
        fresh = dataprep.Mixture(packs, [0.6, 0.4], seed=5)
        joined.append(fresh._join() is not None)
        out = {k: np.full((len(idx), *s), -1, d) for k, (s, d) in fresh.batch_layout(req).items()}
        if idx[1] == idx[0] + 1:  # the run, in the Loader's pieces
            for a in range(0, len(idx), 16):
                fresh.fill_batch(range(int(idx[a]), int(idx[a]) + 16), {k: v[a : a + 16] for k, v in out.items()}, req)
        else:
            fresh.fill_batch(idx, out, req)
        return out

    run, scattered = np.arange(100, 228), np.random.default_rng(1).permutation(len(mix))[:128]
    for idx in (run, scattered):
        joined = []
        direct = batch(idx)
        member = mix.locate(idx, 3)[0]
        assert 0 < (member == 0).sum() < len(idx)  # both members appear, interleaved
        assert_rows_are_samples(mix, direct, idx, req)
        monkeypatch.setattr(mixture.Mixture, "_join", lambda self: None)  # no joined view: each member its rows
        per_member = batch(idx)
        monkeypatch.delattr(type(packs[0]), "addresses")  # each member's own fill_batch, rows in place
        in_place = batch(idx)
        monkeypatch.setattr(type(packs[0]), "fills_rows", False)  # ... and through a buffer of its own
        buffered = batch(idx)
        monkeypatch.undo()
        assert joined == [True, False, False, False]  # the first batch came through the joined view
        assert all((direct[k] == v[k]).all() for v in (per_member, in_place, buffered) for k in direct)
    mix = dataprep.Mixture(packs, [0.6, 0.4], seed=5)  # nothing cached under another CHUNK
    whole = mix.locate(np.arange(len(mix)), 3)  # a run and the same positions scattered: one answer
    perm = np.random.default_rng(2).permutation(len(mix))
    assert all((a[perm] == b).all() for a, b in zip(whole, mix.locate(perm, 3)))


@pytest.mark.parametrize("exhausted", ["restart", "stop"])
def test_runs_sliced_from_plans_locate_what_scattered_positions_do(monkeypatch, exhausted):
    """A run's apportionment comes from a plan of positions; runs that cross plans' ends and member epochs
    (a member restarting inside a plan) must name the samples the position-by-position path names."""
    import dataprep.serve.mixture as mixture

    monkeypatch.setattr(mixture, "CHUNK", 37)  # plan ends that no run here lines up with
    mix = Mixture([Tagged(0, 300), Tagged(1, 41), Tagged(2, 7)], WEIGHTS, seed=1, exhausted=exhausted,
                  samples=None if exhausted == "stop" else 500)
    for epoch in (0, 1, 3):
        n = len(mix)
        scattered = mix.locate(np.random.default_rng(epoch).permutation(n), epoch)
        order = np.argsort(np.random.default_rng(epoch).permutation(n))
        truth = [a[order] for a in scattered]  # back in position order
        whole = mix.locate(np.arange(n), epoch)
        assert all((a == b).all() for a, b in zip(whole, truth))
        for lo, hi in ((0, 1), (30, min(80, n)), (36, 38), (n - 50, n)):  # inside, across two or more chunks, the end
            fresh = Mixture([Tagged(0, 300), Tagged(1, 41), Tagged(2, 7)], WEIGHTS, seed=1, exhausted=exhausted,
                            samples=None if exhausted == "stop" else 500)  # no plan of the whole epoch to answer from
            for a in range(lo, hi, 16):  # runs of 16 from lo: some cross the plans' ends
                part = fresh.locate(np.arange(a, min(a + 16, hi)), epoch)
                assert all((x == t[a : min(a + 16, hi)]).all() for x, t in zip(part, truth))
        if exhausted == "restart":
            assert len(set(whole[2][whole[0] == 2].tolist())) > 1  # member 2 restarted inside this epoch
    # plans are per epoch: a cache that ignored the epoch would serve epoch 0's draws again
    assert not (mix.locate(np.arange(len(mix)), 1)[1] == mix.locate(np.arange(len(mix)), 0)[1]).all()


@pytest.mark.parametrize("rank,world", [(0, 1), (1, 4), (0, 2)])
def test_a_process_plans_about_the_positions_it_serves(monkeypatch, rank, world):
    """A rank (or a worker) serving runs `stride` apart plans its next runs, not every position between
    them: over an epoch a process plans about what it serves (a rank of 4 once planned 4x that). What it
    serves is each position's sample either way, in process and through 2 workers."""
    import dataprep.serve.mixture as mixture
    from dataprep.serve.request import Request

    planned = []
    make = mixture.Mixture._make_plan

    def counted(self, epoch, start, length, stride, runs):
        plan = make(self, epoch, start, length, stride, runs)
        planned.append(len(plan.member))
        return plan

    def mixed():
        return Mixture([Tagged(0, 5000), Tagged(1, 3000), Tagged(2, 2000)], WEIGHTS, seed=4)

    monkeypatch.setattr(mixture, "CHUNK", 512)
    monkeypatch.setattr(mixture.Mixture, "_make_plan", counted)
    truth = np.stack(mixed().locate(np.arange(10_000)[::-1].copy(), 0), 1)[::-1]  # position by position
    planned.clear()
    for workers in (0, 2):
        loader = Loader(mixed(), 64, rank=rank, world_size=world, num_workers=workers, indices=True)
        rows = [(x.numpy(), i.numpy()) for x, i in loader]
        loader.close()
        served, planning = sum(len(i) for _, i in rows), sum(planned)
        assert served >= 10_000 // world
        assert (np.concatenate([x for x, _ in rows]) == truth[np.concatenate([i for _, i in rows])]).all()
        if not workers:  # (a worker's plans are made in its own process, uncounted here)
            assert planning <= served + 2 * 512, (planning, served)
    planned.clear()
    for part in ((0, 32), (32, 64)):  # what each of two workers asks for: its part of each of this rank's batches
        fresh = mixed()
        for b in range(rank * 64, 10_000 - 64, 64 * world):
            out = {"x": np.empty((32, 3), np.int64)}
            fresh.fill_batch(range(b + part[0], b + part[1]), out, Request())
            assert (out["x"] == truth[b + part[0] : b + part[1]]).all()
    assert sum(planned) <= 10_000 // world + 4 * 512, (sum(planned), 10_000 // world)


def _token_packs(tmp_path, names_texts, context=8, samples=300, modes=None):
    from dataprep.tokens.tokenize import TokenizeSettings, tokenize

    packs = []
    for k, (name, text) in enumerate(names_texts):
        (tmp_path / f"{name}.txt").write_text(text)
        tokenize([str(tmp_path / f"{name}.txt")], tmp_path / name, TokenizeSettings(), train_bpe_vocab=280)
        mode = modes[k] if modes else "random"
        n = samples[k] if isinstance(samples, tuple) else samples
        packs.append(dataprep.TokenDataset(tmp_path / name, context=context, samples=n if mode == "random" else None,
                                           mode=mode))
    return packs


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_hands_a_mixture_runs_as_ranges_and_a_wrapped_last_batch_as_positions(tmp_path, workers):
    """The Loader passes a mixture's batches as ranges (it then checks nothing), except a padded last
    batch that wraps around to the epoch's start, which is no run: every served row must be the mixture's
    sample at the position the Loader reports, on each of 2 ranks."""
    packs = _token_packs(tmp_path, (("a", "alpha beta gamma delta " * 300), ("b", "one two three four five " * 300)),
                         samples=(100, 101))
    mix = dataprep.Mixture(packs, [0.6, 0.4], seed=2)  # 201 positions: 2 ranks x batch 8 leave a tail of 9
    mix.set_epoch(1)
    wrapped = False
    for rank in range(2):
        loader = Loader(mix, 8, num_workers=workers, rank=rank, world_size=2, indices=True)
        loader.set_epoch(1)
        batches = list(loader)
        loader.close()
        assert sum(len(i) for *_, i in batches) == 101  # 201 positions padded to 2 x 101
        for x, y, i in batches:
            assert x.tolist() == [mix[int(p)][0].tolist() for p in i] and y.tolist() == [mix[int(p)][1].tolist() for p in i]
            wrapped |= bool((np.diff(i.numpy()) != 1).any())
    assert wrapped  # the path that must not be taken for a run was exercised


def test_random_windows_are_not_shuffled_but_sequential_windows_are(tmp_path):
    """A random-window member's samples are independent draws: the mixture serves its indices in order,
    drawing no shuffle, and each member epoch still brings new windows; a sequential member's windows
    tile the text in order, so they are shuffled every member epoch."""
    packs = _token_packs(tmp_path, (("a", "alpha beta gamma delta " * 300), ("b", "one two three four five " * 300)),
                         samples=120, modes=("random", "sequential"))
    mix = dataprep.Mixture(packs, [0.5, 0.5], seed=4, samples=2 * max(len(p) for p in packs) * 2)
    member, index, m_epoch = mix.locate(np.arange(len(mix)), 0)
    rnd, seq = (member == 0), (member == 1)
    assert index[rnd & (m_epoch == 0)].tolist() == list(range(len(packs[0])))  # in order, each once
    s0 = index[seq & (m_epoch == 0)]
    assert sorted(s0.tolist()) == list(range(len(packs[1]))) and s0.tolist() != sorted(s0.tolist())  # a permutation, shuffled
    assert m_epoch[rnd].max() >= 1
    starts = [packs[0].addresses(np.arange(len(packs[0])), e, 0) for e in (0, 1)]
    assert np.mean(starts[0] == starts[1]) < 0.05  # member epoch 1 draws new windows for the same indices
    assert not packs[1].independent_samples and packs[0].independent_samples


def test_a_range_and_its_array_fill_one_batch(tmp_path):
    from dataprep.serve.request import Request

    packs = _token_packs(tmp_path, (("a", "alpha beta gamma delta " * 300), ("b", "one two three four five " * 300)))
    mix = dataprep.Mixture(packs, [0.6, 0.4], seed=5)
    req = Request(epoch=2, seed=3)

    def batch(idx):
        out = {k: np.full((50, *s), -1, d) for k, (s, d) in mix.batch_layout(req).items()}
        mix.fill_batch(idx, out, req)
        return out

    a, b = batch(range(130, 180)), batch(np.arange(130, 180))
    assert all((a[k] == b[k]).all() for k in a) and (a["x"] >= 0).all()
    with pytest.raises(IndexError):
        batch(range(len(mix) - 10, len(mix) + 40))


def members_alone(mix, idx, req) -> dict[str, np.ndarray]:
    """The batch of positions `idx` as each member fills its own samples of it alone, with its own request
    (member epoch, member seed), each part scattered to its rows."""
    from dataprep.serve.mixture import member_seed
    from dataprep.serve.request import Request

    member, index, m_epoch = mix.locate(np.asarray(idx), req.epoch)
    out = {k: np.zeros((len(member), *s), d) for k, (s, d) in mix.batch_layout(req).items()}
    for m, e in set(zip(member.tolist(), m_epoch.tolist())):
        rows = np.flatnonzero((member == m) & (m_epoch == e))
        part = {k: np.zeros((len(rows), *v.shape[1:]), v.dtype) for k, v in out.items()}
        mix.datasets[m].fill_batch(index[rows], part, Request(e, member_seed(req.seed, m), None, req.crop, req.flip))
        for k, v in part.items():
            out[k][rows] = v
    return out


def test_image_members_fill_a_batch_together_as_each_would_alone(photo_tree, tmp_path):
    """Image members fill a mixed batch in one call (`fill_parts`: every member's crop boxes and flips
    drawn in one pass, keyed per member): the bytes equal each member filling its own samples alone with
    its own request (member epoch, member seed). Photos, not flat colours, so a box or a flip drawn with
    another member's key shows."""
    from dataprep.images.build import build_images
    from dataprep.images.settings import ImageSettings
    from dataprep.serve.request import Request
    from dataprep.settings import BuildSettings
    from dataprep.sources import scan_imagenet

    build_images(scan_imagenet(photo_tree), tmp_path / "p", BuildSettings(shard_size=16), ImageSettings(size=48),
                 progress=False)
    mix = Mixture([dataprep.InMemoryImageDataset(tmp_path / "p") for _ in range(3)], [0.5, 0.3, 0.2], seed=6)

    def empty(req, n):
        return {k: np.zeros((n, *s), d) for k, (s, d) in mix.batch_layout(req).items()}

    for req in (Request(epoch=2, seed=5, crop=dataprep.RandomResizedCrop(24), flip=True),
                Request(epoch=0, crop=dataprep.CenterCrop(24)), Request(epoch=1, crop=(40, 40), flip=True)):
        for idx in (np.arange(10, 50), np.random.default_rng(1).permutation(len(mix))[:40]):
            together = empty(req, len(idx))
            mix.fill_batch(range(10, 50) if idx[1] == idx[0] + 1 else idx, together, req)
            member, index, m_epoch = mix.locate(idx, req.epoch)
            assert len(set(member.tolist())) == 3  # every member in the batch
            alone = members_alone(mix, idx, req)
            assert all((together[k] == alone[k]).all() for k in together)
            assert together["images"].std() > 20  # photos: what a wrong box or flip would change
    # and through the Loader, threads serve what one process serves (the mixture's plans made under its lock)
    crop = dataprep.RandomResizedCrop(24)
    batches = [[b[0].clone() for b in Loader(mix, 8, crop=crop, flip=True, num_workers=w, threads=t)]
               for w, t in ((0, False), (2, True))]
    assert len(batches[0]) == len(batches[1]) and all(torch.equal(a, b) for a, b in zip(*batches))


TEXTS = (("a", "alpha beta gamma delta " * 300), ("b", "one two three four five six " * 300))


def test_token_members_are_rows_of_one_view_that_spans_them(tmp_path):
    """Member m's window k is row shift[m] + k of the joined view (the bytes between members never read);
    a view one row off serves other windows, which the check would see."""
    packs = _token_packs(tmp_path, TEXTS)
    mix = dataprep.Mixture(packs, [0.6, 0.4])
    join = mix._join()
    assert join is not None and join.view.dtype == packs[0].windows().dtype
    for m, d in enumerate(packs):
        w = d.windows()
        rows = np.array([0, 1, len(w) // 2, len(w) - 1])
        assert (join.view[join.shift[m] + rows] == w[rows]).all()
        assert not (join.view[join.shift[m] + rows[:-1] + 1] == w[rows[:-1]]).all()  # one row off: not the windows
    assert join.view.flags.writeable is False


@pytest.mark.parametrize("past", ["end", "start"])
def test_a_member_drawing_starts_outside_its_windows_is_refused_before_any_read(tmp_path, monkeypatch, past):
    packs = _token_packs(tmp_path, TEXTS)
    mix = dataprep.Mixture(packs, [0.6, 0.4])
    n = len(packs[1].windows())
    bad = n if past == "end" else -1  # one past its last window, one before its first
    monkeypatch.setattr(packs[1], "addresses", lambda idx, epoch, seed: np.full(len(idx), bad))
    out = {k: np.zeros((16, *s), d) for k, (s, d) in mix.batch_layout().items()}
    with pytest.raises(DataprepError, match=f"member 1 .* outside its {n} windows"):
        mix.fill_batch(range(0, 16), out)
    assert not out["x"].any()  # nothing was served


def _serve_all(mix, req) -> dict:
    out = {k: np.zeros((len(mix), *s), d) for k, (s, d) in mix.batch_layout(req).items()}
    for a in range(0, len(mix), 24):
        mix.fill_batch(range(a, min(a + 24, len(mix))), {k: v[a : a + 24] for k, v in out.items()}, req)
    return out


@pytest.mark.parametrize("case", ["ram and mmap", "odd byte offset", "uint16 and uint32", "view too big"])
def test_members_are_joined_only_where_they_line_up_and_serve_their_samples_either_way(tmp_path, monkeypatch, case):
    """A member in RAM and one mapped from its files (terabytes apart) are joined; a member whose ids start
    at an odd byte (rows of the view would cut ids in half), members of two dtypes, or a view numpy cannot
    size are not, and are served each on its own: every row is its position's sample in every case."""
    from dataprep.serve.request import Request

    packs = _token_packs(tmp_path, TEXTS, samples=(150, 90))
    sliding = np.lib.stride_tricks.sliding_window_view
    if case == "ram and mmap":
        packs[1] = dataprep.TokenDataset(tmp_path / "b", context=8, samples=90, cache="mmap")
    elif case == "odd byte offset":
        ids = packs[1].data.tokens
        moved = np.frombuffer(bytearray(ids.nbytes + 1), ids.dtype, len(ids), offset=1)
        moved[:] = ids
        packs[1].data.tokens, packs[1]._all_windows = moved, sliding(moved, 9)
    elif case == "uint16 and uint32":
        wide = packs[1].data.tokens.astype(np.uint32)
        packs[1].data.tokens, packs[1]._all_windows = wide, sliding(wide, 9)
    elif case == "view too big":
        import dataprep.serve.mixture as mixture

        def too_big(*args, **kwargs):
            raise ValueError("array is too big; `arr.size * arr.dtype.itemsize` is larger than the maximum possible size.")

        monkeypatch.setattr(mixture.np.lib.stride_tricks, "as_strided", too_big)
    mix = dataprep.Mixture(packs, [0.6, 0.4], seed=2)
    req = Request(epoch=1, seed=3)
    joined = mix._join() is not None
    monkeypatch.undo()
    assert joined == (case == "ram and mmap")
    if joined:
        assert isinstance(packs[1].windows().base, np.memmap) or isinstance(packs[1].data.tokens, np.memmap)
    assert_rows_are_samples(mix, _serve_all(mix, req), np.arange(len(mix)), req)


def test_a_member_whose_windows_change_is_joined_anew(tmp_path):
    """A member reloaded (its windows are other arrays) is joined again, its starts drawn anew: a stale
    join would serve the old member's windows."""
    from dataprep.serve.mixture import member_seed
    from dataprep.serve.request import Request

    packs = _token_packs(tmp_path, (*TEXTS, ("c", "red green blue " * 500)))
    mix = dataprep.Mixture(packs[:2], [0.6, 0.4], seed=1)
    req = Request(epoch=0, seed=2)
    out = {k: np.zeros((64, *s), d) for k, (s, d) in mix.batch_layout(req).items()}
    mix.fill_batch(range(64), out, req)
    packs[0].data, packs[0]._all_windows = packs[2].data, packs[2]._all_windows  # member 0 now holds pack c
    mix.fill_batch(range(64), out, req)
    member, index, m_epoch = mix.locate(np.arange(64), 0)
    for k in np.flatnonzero(member == 0):
        want = packs[0]._gather(np.array([index[k]]), int(m_epoch[k]), member_seed(2, 0))[0]
        assert out["x"][k].tolist() == want[:-1].tolist()
    assert mix._joined.windows[0] is packs[2].windows()


def test_a_members_shuffle_is_the_permutation_its_key_draws():
    """Member m's epoch-e order is Generator.permutation(n) keyed by (tag, seed, m, e), whichever epoch is
    asked for first (a cache that served another epoch's order would fail)."""
    from dataprep.serve import draws

    mix = Mixture([Tagged(0, 50), Tagged(1, 30)], [0.5, 0.5], seed=3, samples=400)
    member, index, m_epoch = mix.locate(np.arange(len(mix))[::-1].copy(), 1)  # last positions first
    for m, n in ((0, 50), (1, 30)):
        for e in np.unique(m_epoch[member == m]):
            key = [w & 0xFFFFFFFFFFFFFFFF for w in (draws.MIXTURE, 3, m, int(e))]
            got = index[(member == m) & (m_epoch == e)][::-1]  # back in position order
            want = np.random.default_rng(key).permutation(n)
            drawn = np.arange(len(mix))[::-1][(member == m) & (m_epoch == e)][::-1]  # positions of these draws
            first = mix.counts(drawn[0])[m] + 1 * int(mix._per_epoch[m]) - int(e) * n  # rank in the member epoch
            assert got.tolist() == want[first : first + len(got)].tolist()
