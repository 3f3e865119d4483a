"""dataprep.audit's core: hashes that find near copies and keep distinct photos apart (generated images
always, the shared corpus when present), a search equal to brute force on every shape of input, the
report's pairs, leaks and drops, and a contact sheet that is a real PNG with one panel per pair. Each
tolerance has its negative control beside it."""
import glob
import json
import os

import numpy as np
import pytest

cv2 = pytest.importorskip("cv2")

from dataprep.audit import hashes as H  # noqa: E402
from dataprep.audit import index as X  # noqa: E402
from dataprep.audit.report import DEFAULT_MAX_DISTANCE, Samples, audit, drop_indices, leak_mask, text_report  # noqa: E402
from dataprep.audit.sheet import BACKGROUND, PANEL, contact_sheet, layout  # noqa: E402
from dataprep.errors import UsageError  # noqa: E402

CORPUS = "/work/shared/corpus/images/train"


# -- near copies, as the acceptance names them ---------------------------------------------------------
def jpeg40(im):
    ok, b = cv2.imencode(".jpg", im[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, 40])
    return cv2.imdecode(b, cv2.IMREAD_COLOR)[:, :, ::-1]


def resize60(im):
    h, w = im.shape[:2]
    return cv2.resize(im, (max(1, round(w * 0.6)), max(1, round(h * 0.6))), interpolation=cv2.INTER_AREA)


def crop4(im):
    h, w = im.shape[:2]
    dy, dx = round(h * 0.04), round(w * 0.04)
    return im[dy:h - dy, dx:w - dx]


def brighter10(im):
    return np.clip(im.astype(np.float32) * 1.1, 0, 255).astype(np.uint8)


def darker10(im):
    return np.clip(im.astype(np.float32) * 0.9, 0, 255).astype(np.uint8)


TRANSFORMS = {"jpeg q40": jpeg40, "resize 60%": resize60, "crop 4%": crop4, "brighter 10%": brighter10, "darker 10%": darker10}


def to_256(im):
    """As a build stores it: the shorter side at 256 px."""
    h, w = im.shape[:2]
    s = 256 / min(h, w)
    return np.ascontiguousarray(cv2.resize(im, (max(1, round(w * s)), max(1, round(h * s))), interpolation=cv2.INTER_AREA))


def generated_photos(n, seed=0):
    """Photo-like images: a smooth random field (blobs of every scale), an edge or two, mild texture."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        h, w = 256, int(rng.integers(256, 400))
        im = np.zeros((h, w, 3), np.float32)
        for scale in (4, 8, 16, 32):
            field = rng.normal(size=(scale, max(2, scale * w // h), 3)).astype(np.float32)
            im += cv2.resize(field, (w, h), interpolation=cv2.INTER_CUBIC) * (64.0 / scale ** 0.5)
        yy, xx = np.mgrid[:h, :w]
        a, b, c = rng.normal(size=3)
        im[(a * xx + b * yy + c * 100) > 0] += rng.normal(size=3) * 40
        im += rng.normal(size=im.shape).astype(np.float32) * 6
        out.append(np.clip(im + 128, 0, 255).astype(np.uint8))
    return out


def robustness(images, hash_fn, D):
    """(recall per transform, fraction of images with any other image within D)."""
    base = np.array([hash_fn(im) for im in images], np.uint64)
    recall = {name: float((H.hamming(base, [hash_fn(t(im)) for im in images]) <= D).mean()) for name, t in TRANSFORMS.items()}
    d = H.hamming(base[:, None], base[None, :])
    np.fill_diagonal(d, 99)
    return recall, float((d.min(axis=1) <= D).mean())


def constant_hash(im):
    return np.uint64(0)


_RNG = np.random.default_rng(5)


def random_hash(im, _rng=_RNG):
    return _rng.integers(0, 2**63, dtype=np.uint64)


@pytest.fixture(scope="module")
def photos():
    return generated_photos(120)


def test_generated_near_copies_are_found_and_distinct_images_kept_apart(photos):
    recall, fp = robustness(photos, H.perceptual_hash, DEFAULT_MAX_DISTANCE)
    assert min(recall.values()) >= 0.95, recall
    assert fp <= 0.01, fp


def test_hashes_that_ignore_the_image_fail_the_same_test(photos):
    """Negative controls: a constant hash pairs every distinct image; a random one finds no copy."""
    _, fp = robustness(photos[:40], constant_hash, DEFAULT_MAX_DISTANCE)
    assert fp > 0.01
    recall, _ = robustness(photos[:40], random_hash, DEFAULT_MAX_DISTANCE)
    assert min(recall.values()) < 0.95


def corpus_photos():
    paths = sorted(glob.glob(os.path.join(CORPUS, "*", "*.JPEG")))
    out, folders = [], []
    for p in paths:
        im = cv2.imread(p, cv2.IMREAD_COLOR)
        if im is not None:
            out.append(to_256(im[:, :, ::-1]))
            folders.append(p.split(os.sep)[-2])
    return out, np.array(folders)


@pytest.mark.skipif(not os.path.isdir(CORPUS), reason=f"the shared corpus is not at {CORPUS}")
def test_corpus_near_copies_are_found_and_photos_of_other_sources_not_paired():
    """The corpus's folders hold sequences of one scene (calibration frames, crops of one wallpaper), so
    a distinct photo here is one from another folder; within-folder pairs are reported in docs/audit.md."""
    images, folders = corpus_photos()
    assert len(images) > 100
    D = DEFAULT_MAX_DISTANCE
    base = np.array([H.perceptual_hash(im) for im in images], np.uint64)
    for name, t in TRANSFORMS.items():
        found = (H.hamming(base, [H.perceptual_hash(t(im)) for im in images]) <= D).mean()
        assert found >= 0.95, (name, found)
    d = np.where(folders[:, None] != folders[None, :], H.hamming(base[:, None], base[None, :]), 99)
    assert (d.min(axis=1) <= D).mean() <= 0.01
    # negative control: the constant hash pairs every photo with one of another folder
    assert (np.where(folders[:, None] != folders[None, :], 0, 99).min(axis=1) <= D).mean() > 0.01


# -- the hash's inputs ---------------------------------------------------------------------------------
def test_hash_takes_gray_rgb_rgba_deep_and_tiny_images(photos):
    im = photos[0]
    h = H.perceptual_hash(im)
    gray = cv2.cvtColor(im, cv2.COLOR_RGB2GRAY)
    assert H.hamming(h, H.perceptual_hash(gray)) <= 2
    assert H.perceptual_hash(gray) == H.perceptual_hash(gray[:, :, None])
    assert H.perceptual_hash(np.dstack([im, np.full(im.shape[:2], 7, np.uint8)])) == h  # alpha ignored
    assert H.hamming(h, H.perceptual_hash(im.astype(np.uint16) * 257)) <= 2
    assert bin(int(h)).count("1") == 32  # half the bits: the median splits 64 coefficients
    for shape in ((1, 1, 3), (3, 5), (2, 200, 3)):
        H.perceptual_hash(np.random.default_rng(0).integers(0, 255, shape, dtype=np.uint8))
    assert H.perceptual_hash(np.full((40, 30, 3), 200, np.uint8)) == 0  # blank: 0, whatever its colour
    for bad in (np.zeros((0, 5, 3), np.uint8), np.zeros((4, 4, 2), np.uint8), np.zeros(5, np.uint8), np.zeros((4, 4), bool)):
        with pytest.raises(ValueError):
            H.perceptual_hash(bad)


def test_flipped_hash_is_the_hash_of_the_mirror(photos):
    for im in photos[:20]:
        mirror = np.ascontiguousarray(im[:, ::-1])
        assert H.hamming(H.flipped_hash(im), H.perceptual_hash(mirror)) <= 2
        # negative control: the image's own hash is far from its mirror's
        assert H.hamming(H.perceptual_hash(im), H.perceptual_hash(mirror)) > DEFAULT_MAX_DISTANCE
    h, f = H.perceptual_hashes(photos[:5], flips=True)
    assert list(h) == [H.perceptual_hash(im) for im in photos[:5]] and list(f) == [H.flipped_hash(im) for im in photos[:5]]
    assert len(H.perceptual_hashes([])) == 0


def test_pixel_digest_is_equal_only_for_identical_pixels(photos):
    im = photos[0]
    d = H.pixel_digest(im)
    assert len(d) == 16 and H.pixel_digest(im.copy()) == d
    changed = im.copy()
    changed[100, 100, 1] ^= 1
    assert H.pixel_digest(changed) != d
    assert H.pixel_digest(np.ascontiguousarray(im.reshape(im.shape[1], im.shape[0], 3))) != d  # same bytes, other shape
    g = im[:, :, 0]
    assert H.pixel_digest(g) == H.pixel_digest(g[:, :, None])
    assert H.pixel_digest(im[:, ::2]) == H.pixel_digest(np.ascontiguousarray(im[:, ::2]))


# -- the search ----------------------------------------------------------------------------------------
def planted(n, D, seed=0, frac=0.05):
    rng = np.random.default_rng(seed)
    h = rng.integers(0, 2**64 - 1, size=n, dtype=np.uint64, endpoint=True)
    k = max(1, int(n * frac))
    src, dst = rng.integers(0, n, k), rng.integers(0, n, k)
    flip = np.zeros(k, np.uint64)
    nb = rng.integers(0, D + 1, size=k)
    for t in range(D):
        flip ^= np.where(t < nb, np.uint64(1) << rng.integers(0, 64, k).astype(np.uint64), np.uint64(0))
    h[dst] = h[src] ^ flip
    return h


def same(p, q):
    return all(np.array_equal(a, b) for a, b in zip(p[:3], q[:3]))


N_BRUTE = 20_000  # hashes the index is checked against all-pairs with


@pytest.fixture(scope="module")
def brute():
    """20,000 hashes with near copies at 0..10 bits and a group of 40 equal, and every pair within 10 of them
    found all against all once (each distance below is a prefix of it)."""
    h = planted(N_BRUTE, 10, seed=10)
    h[100:140] = h[7]  # a group of equal hashes
    return h, X.brute_force_pairs(h, 10)


@pytest.mark.parametrize("D", [0, 1, 2, 3, 5, 8, 10])
def test_index_equals_brute_force(D, brute):
    h, every = brute
    keep = every.distance <= D
    b = X.Pairs(every.i[keep], every.j[keep], every.distance[keep], True)
    p = X.find_matches(h, D, search="index").pairs()
    assert len(b.i) > 100 and same(p, b)
    assert same(X.find_matches(h, D).pairs(), b)  # the cost model's choice too


def test_index_that_searches_a_smaller_radius_misses_pairs(monkeypatch):
    """Negative control for the equality above: blocks probed at radius 0 where the plan says 1 or 2."""
    h = planted(3000, 8, seed=3)
    real = X.plan
    monkeypatch.setattr(X, "plan", lambda n, D, s="auto": [X.Block(b.lo, b.bits, 0) for b in real(n, D, "index")])
    assert not same(X.find_matches(h, 8, search="index").pairs(), X.brute_force_pairs(h, 8))


def test_index_on_skewed_bits_equals_brute_force():
    """Hashes that agree on most bits (blocks shared by everyone, buckets as large as the input)."""
    rng = np.random.default_rng(1)
    h = (rng.integers(0, 2**12, 2500).astype(np.uint64) << np.uint64(20)) | np.uint64(0xABCDE)
    assert same(X.find_matches(h, 4, search="index").pairs(), X.brute_force_pairs(h, 4))


def test_small_chunks_give_the_same_pairs(monkeypatch):
    h = planted(2000, 6, seed=9)
    h[:300] = h[0]
    want = X.find_matches(h, 6, search="index").pairs()
    monkeypatch.setattr(X, "CHUNK", 7)
    assert same(X.find_matches(h, 6, search="index").pairs(), want)
    m = X.find_matches(h, 6, search="index")
    assert all(len(i) <= 7 for i, _, _ in m.chunks(7))


def test_empty_one_and_all_identical_inputs():
    for h in (np.zeros(0, np.uint64), np.array([5], np.uint64)):
        m = X.find_matches(h, 8)
        assert m.total == 0 and len(m.pairs().i) == 0 and len(m.groups()) == len(h)
    n = 200_000  # every hash equal: 2e10 pairs, counted and listed in bounded pieces, never searched
    m = X.find_matches(np.full(n, 42, np.uint64), 8)
    assert m.total == n * (n - 1) // 2 and m.candidates == 0
    p = m.pairs(limit=1000)
    assert len(p.i) == 1000 and not p.complete and (p.i < p.j).all() and (p.distance == 0).all()
    assert (m.groups() == 0).all()


def test_triangle_decodes_large_indices_exactly():
    t = np.array([0, 1, 2, 3, 10**12, 2**52 + 12345, 8 * 10**11 - 1], np.int64)
    a, b = X._triangle(t)
    assert ((a >= 0) & (a < b)).all() and np.array_equal(b * (b - 1) // 2 + a, t)


def test_cross_pairs_and_bad_arguments():
    h = planted(1000, 4, seed=2)
    q, r = h[:300], h[300:]
    c = X.cross_pairs(q, r, 4)
    want = X.brute_force_pairs(h, 4)
    keep = (want.i < 300) & (want.j >= 300)
    assert np.array_equal(c.i, want.i[keep]) and np.array_equal(c.j, want.j[keep] - 300)
    for bad in (-1, 33, 2.5, True):
        with pytest.raises(ValueError):
            X.find_matches(h, bad)
    with pytest.raises(ValueError):
        X.find_matches(h.reshape(10, 100), 3)


def test_groups_are_chains_of_pairs():
    h = np.array([0b0, 0b11, 0b1111, 0xFFFF0000, 0xFFFF0000, 0x5555555555555555], np.uint64)
    g = X.find_matches(h, 2).groups()
    assert list(g) == [0, 0, 0, 1, 1, 2]  # 0 ~ 3 ~ 15 by chains of 2 bits; two equal; one alone


# -- the report ----------------------------------------------------------------------------------------
def two_splits(copies=4, seed=0):
    rng = np.random.default_rng(seed)
    tr = rng.integers(0, 2**63, 300, dtype=np.uint64)
    va = rng.integers(0, 2**63, 100, dtype=np.uint64)
    dtr, dva = rng.integers(0, 256, (300, 16), dtype=np.uint8), rng.integers(0, 256, (100, 16), dtype=np.uint8)
    va[0], dva[0] = tr[0], dtr[0]  # an exact leak
    va[1] = tr[1] ^ np.uint64(0b101)  # a near leak
    tr[10:10 + copies], dtr[10:10 + copies] = tr[50], dtr[50]  # copies + 1 equal in train
    return Samples.from_splits({"train": {"hashes": tr, "digests": dtr, "sources": [f"train/{i}.jpg" for i in range(300)]},
                                "val": {"hashes": va, "digests": dva, "sources": [f"val/{i}.jpg" for i in range(100)]}})


def test_report_lists_every_pair_and_calls_out_leaks():
    s = two_splits(copies=4)
    r = json.loads(json.dumps(audit(s)))  # JSON as it stands
    summ = r["summary"]
    assert summ["leaks"]["val"]["samples"] == 2 and summ["leaks"]["val"]["of"] == 100
    assert summ["pairs_across"] == {"train/val": 2} and summ["pairs_within"] == {"train": 10}  # 5 copies: all 10 pairs
    assert len(r["pairs"]) == 12 and summ["complete"]
    first = r["pairs"][0]
    assert {first["a"]["split"], first["b"]["split"]} == {"train", "val"} and first["exact"] is True  # across splits first
    near = [p for p in r["pairs"] if p["distance"] == 2]
    assert len(near) == 1 and near[0]["exact"] is False
    assert summ["groups"] == 3 and summ["largest_group"] == 5
    text = text_report(r)
    assert text.splitlines()[0].startswith("LEAK: 2 of 100 val samples")


def test_report_cap_keeps_counts_exact():
    s = two_splits(copies=40)
    r = audit(s, max_pairs=5)
    assert len(r["pairs"]) == 5 and not r["summary"]["complete"]
    assert r["summary"]["pairs_within"]["train"] == 41 * 40 // 2 and r["summary"]["leaks"]["val"]["samples"] == 2
    assert {r["pairs"][0]["a"]["split"], r["pairs"][0]["b"]["split"]} == {"train", "val"}


def test_leak_mask_and_drops():
    s = two_splits(copies=4)
    m = X.find_matches(s.hashes, DEFAULT_MAX_DISTANCE)
    assert list(np.flatnonzero(leak_mask(s, m, "val"))) == [0, 1]
    assert list(np.flatnonzero(leak_mask(s, m, "train"))) == [0, 1]
    drops = drop_indices(s, m)
    assert list(drops["val"]) == [0, 1]  # twins in train leave val
    assert list(drops["train"]) == [11, 12, 13, 50]  # of 10..13 and 50, the first (10) stays
    with pytest.raises(ValueError):
        leak_mask(s, m, "test")


def test_mirror_pairs_only_with_flips(photos):
    ims = photos[:6] + [np.ascontiguousarray(photos[0][:, ::-1])]
    h, f = H.perceptual_hashes(ims, flips=True)
    s = Samples.from_splits({"train": {"hashes": h[:6], "flipped": f[:6]}, "val": {"hashes": h[6:], "flipped": f[6:]}})
    assert audit(s)["summary"]["leaks"]["val"]["samples"] == 0  # negative control: a mirror is not near unmirrored
    r = audit(s, flips=True)
    assert r["summary"]["leaks"]["val"]["samples"] == 1 and r["summary"]["mirror_pairs"] == 1
    assert r["pairs"][0]["flip"] is True and r["pairs"][0]["a"]["index"] == 0
    assert r["shown"] == r["pairs"] and r["summary"]["shown"]["leaking_samples"] == {"shown": 1, "left_off": 0}


def test_report_on_empty_and_single_inputs():
    r = audit(Samples.from_splits({"train": {"hashes": []}, "val": {"hashes": []}}))
    assert r["pairs"] == [] and r["summary"]["leaks"]["val"]["samples"] == 0
    r = audit(Samples.from_splits({"train": {"hashes": [7]}}))
    assert r["pairs"] == [] and r["summary"]["leaks"] == {}
    assert "no leaks" in text_report(r)


# -- what the sheet and the text show: every leak first, then groups in turn -----------------------------
def flooded(seed=0):
    """Issue 51's flood in hashes: train holds a cluster of 80 near-identical hashes (distinct, each within
    10 bits of every other), 30 twins of val samples, 20 pairs of copies and the rest apart; val holds 5
    samples inside the cluster (400 pairs across splits), the 30 twins' leaks (2..8 bits off) and the rest
    apart: 35 leaking val samples."""
    rng = np.random.default_rng(seed)
    tr = rng.integers(0, 2**63, 300, dtype=np.uint64)
    va = rng.integers(0, 2**63, 100, dtype=np.uint64)
    bits = np.uint64(1) << rng.choice(64, 10, replace=False).astype(np.uint64)
    codes = rng.choice(1024, 85, replace=False)  # subsets of 10 bits: any two within 10 bits
    cluster = np.array([tr[0] ^ np.bitwise_or.reduce(bits[[(c >> k) & 1 == 1 for k in range(10)]]) for c in codes], np.uint64)
    tr[:80], va[:5] = cluster[:80], cluster[80:]
    for k in range(30):  # val 5..34: a twin in train 80..109, 2..8 bits off
        off = rng.choice(64, int(rng.integers(2, 9)), replace=False).astype(np.uint64)
        va[5 + k] = tr[80 + k] ^ np.bitwise_or.reduce(np.uint64(1) << off)
    tr[111:151:2] = tr[110:150:2]  # 20 pairs of copies within train
    return Samples.from_splits({"train": {"hashes": tr, "sources": [f"train/c0/{i}.jpg" for i in range(300)]},
                                "val": {"hashes": va, "sources": [f"val/c0/{i}.jpg" for i in range(100)]}})


def _leaking(s, D=DEFAULT_MAX_DISTANCE):
    """Each val sample with a twin in train: the distance to its closest one, all against all."""
    d = np.bitwise_count(s.hashes[s.split == 1][:, None] ^ s.hashes[s.split == 0][None, :])
    best = d.min(axis=1)
    return {int(v): int(best[v]) for v in np.flatnonzero(best <= D)}


def _val_side(p):
    return next(int(p[x]["index"]) for x in "ab" if p[x]["split"] == "val")


def test_every_leaking_sample_is_shown_first_however_large_a_cluster():
    s = flooded()
    leaking = _leaking(s)
    assert len(leaking) == 35
    r = json.loads(json.dumps(audit(s)))
    shown, counts = r["shown"], r["summary"]["shown"]
    assert len(shown) == 100 and counts["panels"] == 100
    first = shown[:35]  # one pair per leaking sample, its closest twin in train, before any other pair
    assert all({p["a"]["split"], p["b"]["split"]} == {"train", "val"} for p in first)
    assert sorted(_val_side(p) for p in first) == sorted(leaking)
    assert all(p["distance"] == leaking[_val_side(p)] for p in first)
    # then one pair a group in turn: each of the 20 pairs of copies in train shows, the cluster takes its turns
    rest = shown[35:]
    assert len({p["group"] for p in rest[:21]}) == 21  # the cluster's first turn and the 20 pairs of copies
    assert {p["a"]["index"] for p in rest[:21] if p["a"]["split"] == p["b"]["split"] == "train"} >= set(range(110, 150, 2))
    # the counts, against all the pairs
    across = sum(r["summary"]["pairs_across"].values())
    within_n = sum(r["summary"]["pairs_within"].values())
    assert across == 400 + 30 and within_n == 80 * 79 // 2 + 5 * 4 // 2 + 20
    n_across = sum(p["a"]["split"] != p["b"]["split"] for p in shown)
    assert counts["leaking_samples"] == {"shown": 35, "left_off": 0}
    assert counts["leak_pairs"] == {"shown": n_across, "left_off": across - n_across}
    assert counts["pairs_within"] == {"shown": 100 - n_across, "left_off": within_n - (100 - n_across)}
    # the text shows the same pairs: a line for every leaking sample
    text = text_report(r)
    for v in leaking:
        assert f"val:{v} val/c0/{v}.jpg" in text
    assert sum(" ~ " in line for line in text.splitlines()) == 100
    assert f"not shown: {across - n_across} pairs across splits, {within_n - 100 + n_across} pairs within splits" in text


def test_the_old_order_leaves_leaking_samples_off_the_sheet():
    """Negative control: the first 100 listed pairs (across splits first, closest first: the sheet's order
    before) are mostly the cluster's, and leave most leaking samples and every pair of copies off."""
    s = flooded()
    r = audit(s)
    old = r["pairs"][:100]
    assert len({_val_side(p) for p in old}) < 25
    assert not any(p["a"]["split"] == p["b"]["split"] for p in old)


def test_panels_sets_the_budget_and_leaks_share_a_small_one():
    s = flooded()
    few = audit(s, panels=20)
    assert len(few["shown"]) == 20 and all(p["a"]["split"] != p["b"]["split"] for p in few["shown"])
    assert len({_val_side(p) for p in few["shown"]}) == 20
    assert few["summary"]["shown"]["leaking_samples"] == {"shown": 20, "left_off": 15}
    assert "not shown: 15 leaking samples" in text_report(few)
    more = audit(s, panels=400)
    assert len(more["shown"]) == 400 and more["summary"]["shown"]["panels"] == 400
    assert more["shown"][:100] == audit(s)["shown"]  # a larger budget shows more after the same pairs
    assert len({(p["a"]["split"], p["a"]["index"], p["b"]["split"], p["b"]["index"]) for p in more["shown"]}) == 400  # no pair twice
    for bad in (0, -1, 1001, 2.5, True, "10", None):
        with pytest.raises(UsageError, match="panels"):
            audit(s, panels=bad)


def test_leaks_are_shown_past_the_listing_cap():
    """The leaking samples' twins come from the matches, not the listed pairs: none listed, all 35 shown."""
    s = flooded()
    r = audit(s, max_pairs=0)
    assert r["pairs"] == [] and len(r["shown"]) == 35
    assert sorted(_val_side(p) for p in r["shown"]) == sorted(_leaking(s))


def test_the_sheet_draws_every_leaking_sample(tmp_path):
    s = flooded()
    r = audit(s)
    drawn = []
    lay = contact_sheet(r["shown"], lambda side: drawn.append((side["split"], side["index"])) or np.zeros((8, 8, 3), np.uint8),
                        tmp_path / "s.png")
    assert len(lay.boxes) == 100 and {i for sp, i in drawn if sp == "val"} >= set(_leaking(s))


def test_the_text_report_escapes_what_a_terminal_would_act_on():
    """Issue 52: file names (and split names) with newlines, terminal escapes, C1 controls and bidi overrides
    reach the terminal escaped; other text (accents, a space) unchanged. The report's lines are its own."""
    import unicodedata

    names = ["ok/café naïve.jpg", "a\nLEAK: 0 of 100 val samples.jpg", "b\x1b[2J\x1b]0;owned\x07.jpg", "c\x9b31m\x85.jpg",
             "d\u202egpj.exe", "e\r\t\x00\x7f\u2028\u2066.jpg", "f\udcff.jpg", "g\\x1b.jpg"]
    tr = np.arange(1, 9, dtype=np.uint64) << np.uint64(40)
    evil = "val\x1b[31m"
    s = Samples.from_splits({"train": {"hashes": tr, "sources": names}, evil: {"hashes": tr, "sources": names}})
    r = audit(s)
    text = text_report(r)
    bad = [c for c in text if c != "\n" and (unicodedata.category(c) in ("Cc", "Cs", "Zl", "Zp") or "\u202a" <= c <= "\u202e"
                                          or "\u2066" <= c <= "\u2069")]
    assert bad == []
    assert len(text.splitlines()) == len(text_report(audit(Samples.from_splits(
        {"train": {"hashes": tr}, "val": {"hashes": tr}}))).splitlines())  # no line added by a name
    for want in ("ok/café naïve.jpg", "a\\nLEAK", "b\\x1b[2J\\x1b]0;owned\\x07.jpg", "c\\x9b31m\\x85.jpg", "d\\u202egpj.exe",
                 "e\\r\\t\\x00\\x7f\\u2028\\u2066.jpg", "f\\udcff.jpg", "g\\\\x1b.jpg", "LEAK: 8 of 8 val\\x1b[31m samples"):
        assert want in text, want
    text.encode("utf-8")  # a lone surrogate would not encode: printing it would raise


# -- the contact sheet ---------------------------------------------------------------------------------
def test_contact_sheet_is_a_png_with_one_panel_per_pair(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    dark = {k: rng.integers(0, 200, (int(rng.integers(20, 300)), int(rng.integers(20, 300)), 3), dtype=np.uint8) for k in range(12)}
    pairs = [{"a": {"split": "train", "index": k, "source": "a/very/long/path/" * 6 + f"{k}.jpg"},
              "b": {"split": "val", "index": k + 1, "source": f"{k + 1}.jpg"}, "distance": k % 3 * 2, "exact": k == 0} for k in range(10)]
    for n, cols in ((10, 4), (1, 4), (3, 2)):
        path = tmp_path / f"sheet{n}.png"
        lay = contact_sheet(pairs[:n], lambda side: dark[side["index"]], path, columns=cols)
        with Image.open(path) as im:
            assert im.format == "PNG" and im.size == (lay.width, lay.height)
            px = np.asarray(im.convert("RGB"))
        expect = layout(n, cols)
        assert (lay.width, lay.height) == (expect.width, expect.height)
        white = np.all(px == PANEL, axis=2).astype(np.uint8)
        count, _, stats, _ = cv2.connectedComponentsWithStats(white, connectivity=4)
        big = stats[1:, cv2.CC_STAT_AREA] > lay.panel_width * lay.panel_height // 4
        assert big.sum() == n
        assert tuple(px[0, 0]) == BACKGROUND
    # max_pairs cuts the sheet; an image that cannot load is drawn, not raised
    lay = contact_sheet(pairs, lambda side: (_ for _ in ()).throw(OSError("gone")), tmp_path / "cut.png", max_pairs=2)
    assert len(lay.boxes) == 2


def test_contact_sheet_panel_count_check_can_fail(tmp_path):
    """Negative control: the count above sees a missing panel (the background left where one should be)."""
    pairs = [{"a": {"split": "train", "index": 0, "source": ""}, "b": {"split": "val", "index": 0, "source": ""}, "distance": 0}] * 3
    lay = contact_sheet(pairs, lambda side: np.zeros((50, 50, 3), np.uint8), tmp_path / "s.png")
    import cv2 as c

    px = c.imread(str(tmp_path / "s.png"))[:, :, ::-1].copy()
    x, y, w, h = lay.boxes[1]
    px[y:y + h, x:x + w] = BACKGROUND
    white = np.all(px == PANEL, axis=2).astype(np.uint8)
    _, _, stats, _ = c.connectedComponentsWithStats(white, connectivity=4)
    assert (stats[1:, c.CC_STAT_AREA] > lay.panel_width * lay.panel_height // 4).sum() == 2


# -- groups, drops and mirror pairs made without the pairs: the sample-level reference ------------------------
def _reference(s, D):
    """Every figure from the pairs of samples themselves: O(N^2), for small inputs."""
    h, f, sp, n = s.hashes, s.flipped, s.split, len(s)
    d = np.bitwise_count(h[:, None] ^ h[None, :])
    hf = np.bitwise_count(h[:, None] ^ f[None, :])  # [a, b]: a's hash against b's flipped hash
    off = ~np.eye(n, dtype=bool)
    direct = (d <= D) & off
    mirror = np.minimum(hf, hf.T)
    mirror_only = (mirror <= D) & ~direct & off
    iu = np.triu_indices(n, 1)
    mo = [(int(a), int(b), int(mirror[a, b])) for a, b in zip(*iu) if mirror_only[a, b]]

    def comps(adj):
        label = np.arange(n)
        for _ in range(n):
            new = np.array([label[adj[k] | (np.arange(n) == k)].min() for k in range(n)])
            if np.array_equal(new, label):
                break
            label = new
        return label

    g = comps(direct | mirror_only)
    same = sp[:, None] == sp[None, :]
    within = comps((direct | ((mirror <= D) & off)) & same)
    order = sorted(range(len(s.splits)), key=lambda k: (s.splits[k] != "train", k))
    rank = {k: r for r, k in enumerate(order)}
    twin = (direct | ((hf <= D) & off))  # x's hash near y's hash, or near y's flipped hash
    drops = {}
    for k, name in enumerate(s.splits):
        out = []
        for x in np.flatnonzero(sp == k):
            earlier = [y for y in np.flatnonzero(twin[x]) if rank[int(sp[y])] < rank[k]]
            if earlier or within[x] != x:
                out.append(int(s.index[x]))
        drops[name] = out
    return mo, g, drops


def _messy(n=300, D=6, seed=0):
    rng = np.random.default_rng(seed)
    h = rng.integers(0, 2**63, n, dtype=np.uint64)
    f = rng.integers(0, 2**63, n, dtype=np.uint64)
    noise = lambda k: np.bitwise_or.reduce(np.uint64(1) << rng.integers(0, 64, (k, 2)).astype(np.uint64), axis=1)  # noqa: E731
    a, b = rng.integers(0, n, 40), rng.integers(0, n, 40)
    h[b] = h[a] ^ noise(40)  # near copies
    a, b = rng.integers(0, n, 40), rng.integers(0, n, 40)
    f[b] = h[a] ^ noise(40)  # mirror copies
    h[20:40], f[20:40] = h[5], f[5]  # one class of 21: equal hash and flipped hash, across the splits
    h[60:70] = h[61]  # equal hashes, flipped hashes apart
    f[80:90] = h[3]  # many mirrors of one image
    sp = rng.integers(0, 3, n)
    names = ("val", "train", "test")
    parts = {nm: {"hashes": h[sp == k], "flipped": f[sp == k]} for k, nm in enumerate(names)}
    return Samples.from_splits(parts)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_groups_drops_and_mirror_pairs_equal_the_sample_level_reference(seed):
    from dataprep.audit.report import _groups, _mirror_classes

    D = 6
    s = _messy(seed=seed, D=D)
    m = X.find_matches(s.hashes, D)
    fm = X.find_matches(np.concatenate([s.hashes, s.flipped]), D)
    mo, g, drops = _reference(s, D)
    mc = _mirror_classes(s, fm, D)
    p = mc.pairs()
    assert mc.total == len(mo) and sorted(zip(p.i.tolist(), p.j.tolist(), p.distance.tolist())) == sorted(mo)
    assert len(mo) > 30
    got = _groups(s, m, mc)
    assert np.array_equal(got[:, None] == got[None, :], g[:, None] == g[None, :])  # the same partition
    got_drops = drop_indices(s, m, fm)
    assert {k: list(v) for k, v in got_drops.items()} == drops
    assert sum(len(v) for v in drops.values()) > 20
    # without flips: the direct pairs alone
    plain = drop_indices(s, m)
    assert sum(len(v) for v in plain.values()) < sum(len(v) for v in drops.values())
    # listing by split: across and within are those of the full listing, and each made alone
    full = m.pairs()
    ac = m.pairs(split=s.split, across=True)
    wi = m.pairs(split=s.split, across=False)
    cross = s.split[full.i] != s.split[full.j]
    assert same(ac, X.Pairs(full.i[cross], full.j[cross], full.distance[cross], True))
    assert same(wi, X.Pairs(full.i[~cross], full.j[~cross], full.distance[~cross], True))
    # each leaking sample's closest twin in train: the lowest at the smallest distance, direct before mirror
    from dataprep.audit.panels import closest_twins
    from dataprep.audit.report import twin_splits

    tr = s.splits.index("train")
    t = closest_twins(s.split, twin_splits(s, m, fm), tr, m, mc)
    h, f = s.hashes, s.flipped
    d = np.bitwise_count(h[:, None] ^ h[None, :])
    mirror = np.minimum(np.bitwise_count(h[:, None] ^ f[None, :]), np.bitwise_count(f[:, None] ^ h[None, :]))
    hf = np.bitwise_count(h[:, None] ^ f[None, :])
    want = {}
    for x in np.flatnonzero(s.split != tr):
        ys = np.flatnonzero(s.split == tr)
        if not ((d[x, ys] <= D) | (hf[x, ys] <= D)).any():  # a twin as twin_splits sees one
            continue
        want[int(x)] = min((int(d[x, y]), False, int(y)) if d[x, y] <= D else (int(mirror[x, y]), True, int(y))
                           for y in ys if d[x, y] <= D or mirror[x, y] <= D)
    got = {x: (dd, fl, y) for x, y, dd, fl in zip(t.x.tolist(), t.y.tolist(), t.d.tolist(), t.flip.tolist())}
    assert got == want and len(want) > 20 and any(fl for _, fl, _ in want.values())


_MANY_EQUAL = r"""
import json, resource, sys, time
import numpy as np
from dataprep.audit.report import Samples, audit
rng = np.random.default_rng(0)
flips = sys.argv[1] == "flips"
tr = np.concatenate([np.full(50_000, 0x5555555555555555, np.uint64), np.zeros(20_000, np.uint64), rng.integers(1, 2**63, 2000, dtype=np.uint64)])
va = np.concatenate([np.zeros(300, np.uint64), rng.integers(1, 2**63, 1000, dtype=np.uint64)])
far = np.uint64(0xFFFF0000FFFF0000)
parts = {"train": {"hashes": tr}, "val": {"hashes": va}}
if flips:
    parts = {k: {"hashes": v["hashes"], "flipped": np.where(v["hashes"] == 0, v["hashes"], v["hashes"] ^ far)} for k, v in parts.items()}
s = Samples.from_splits(parts)
audit(Samples.from_splits({"train": {"hashes": tr[-50:]}, "val": {"hashes": va[-50:]}}), max_pairs=10)  # warm imports
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
r = audit(s, max_pairs=10_000, flips=flips)
seconds = time.perf_counter() - t
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
print(json.dumps({"seconds": seconds, "grown_mib": grown, "summary": r["summary"], "listed": len(r["pairs"]),
                  "first": [r["pairs"][0]["a"]["split"], r["pairs"][0]["b"]["split"]]}))
"""


@pytest.mark.parametrize("flips", ["plain", "flips"])
def test_many_equal_hashes_cost_time_and_memory_by_samples_not_pairs(flips):
    """50,000 equal hashes and 20,000 blanks (hash 0) in train, 300 blanks in val: 1.45e9 pairs counted exactly,
    10,000 listed, groups and drops made, in seconds and without memory that grows with the pairs."""
    import subprocess
    import sys

    from .conftest import within  # here: test_trust_audit imports this module as a top-level one

    r = subprocess.run([sys.executable, "-c", _MANY_EQUAL, flips], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    s = out["summary"]
    k = lambda n: n * (n - 1) // 2  # noqa: E731
    assert s["pairs_within"] == {"train": k(50_000) + k(20_000), "val": k(300)}
    assert s["pairs_across"] == {"train/val": 20_000 * 300}
    assert s["pairs"] == k(50_000) + k(20_000) + k(300) + 20_000 * 300 and s["mirror_pairs"] == 0
    assert out["listed"] == s["pairs_listed"] == 10_000 and s["complete"] is False
    assert out["first"] == ["train", "val"]  # the leaks listed first
    assert s["leaks"]["val"]["samples"] == 300
    assert s["shown"]["leaking_samples"] == {"shown": 100, "left_off": 200}  # one panel each, as far as 100 go
    assert s["drop_duplicates"] == {"train": 49_999 + 19_999, "val": 300}
    assert s["groups"] == 2 and s["largest_group"] == 50_000 and s["samples_in_groups"] == 50_000 + 20_300
    assert out["grown_mib"] < 200, out["grown_mib"]
    within(out["seconds"], 10, f"the audit of 70,300 equal hashes ({flips})")
