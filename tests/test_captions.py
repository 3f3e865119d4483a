"""Captions beside images (issue 23): packs built from WebDataset tars written here with `tarfile`
(key.jpg + key.cls + key.txt), whose images encode their own index in their pixels, so a caption served
beside the wrong image is seen. Captions hold non-ASCII text and an empty one."""
from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from dataprep.cli import main
from dataprep.errors import DataprepError, SourceError
from dataprep.images.build import build_images
from dataprep.images.dataset import InMemoryImageDataset
from dataprep.images.settings import ImageSettings
from dataprep.kinds import kind_of
from dataprep.serve.cache import open_split
from dataprep.serve.request import Request
from dataprep.settings import BuildSettings
from dataprep.sources.webdataset import scan_webdataset
from dataprep.synthetic import decode_index, index_image
from dataprep.verify import verify_pack

from .conftest import corpus_dir
from .test_verify_content import _rewrite as rewrite

# Sample k's caption; k = 3 is empty, the others name k so no two are alike.
CAPTIONS = [f"a photo of number {k}" for k in range(12)]
CAPTIONS[1] = "café crème, 1 €"
CAPTIONS[2] = "日本語のキャプション 2"
CAPTIONS[3] = ""
CAPTIONS[5] = "emoji 🐱 and ünïcödé, sample 5"
CAPTIONS[8] = "a long caption " + "with many words " * 12 + "8"


def write_tar(path: Path, keys: list[int], labelled: bool = True, captions: list[str] = CAPTIONS) -> Path:
    """A WebDataset tar: per sample k, k.jpg (index image k), k.cls (k % 3) and k.txt (captions[k])."""
    with tarfile.open(path, "w") as tf:
        for k in keys:
            h, w = (40, 56) if k % 2 else (48, 36)
            members = {"jpg": cv2.imencode(".jpg", index_image(k, h, w)[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, 95])[1].tobytes(),
                       "txt": captions[k].encode("utf-8")}
            if labelled:
                members["cls"] = str(k % 3).encode()
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{k:06d}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return path


def build(tmp: Path, name: str = "pack", labelled: bool = True, keys=range(12), **image) -> Path:
    tar = write_tar(tmp / f"{name}.tar", list(keys), labelled)
    out = tmp / name
    build_images(scan_webdataset([str(tar)]), out, BuildSettings(workers=1, shard_size=5), ImageSettings(size=32, **image))
    return out


@pytest.fixture(scope="module")
def packs(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("captions")
    return {"labelled": build(tmp), "unlabelled": build(tmp, "unlabelled", labelled=False)}


@pytest.fixture
def pack(packs, tmp_path) -> Path:
    shutil.copytree(packs["labelled"], tmp_path / "p")
    return tmp_path / "p"


def stored(pack: Path, split: str = "train") -> tuple[list[str], list[int]]:
    """Every stored caption and the index its image encodes, read through the kind's fields (no dataset)."""
    c = open_split(pack, split, lambda m: kind_of(m).served_fields(m), "ram")
    captions = list(c.fields["caption"].strings(c.arrays))
    field, a = next(iter(c.fields.values())), c.arrays
    index = [decode_index(cv2.imdecode(np.asarray(field.sample(a, i)), cv2.IMREAD_COLOR)[:, :, ::-1]) for i in range(len(captions))]
    return captions, index


def test_every_caption_is_stored_with_its_own_image(packs):
    """Caught: the shard loop took sample k's caption with the size loop's counter (every sample of a shard got
    the first one's caption)."""
    for pack in packs.values():
        captions, index = stored(pack)
        assert sorted(index) == list(range(12))
        assert captions == [CAPTIONS[j] for j in index]
        assert "" in captions and CAPTIONS[2] in captions


def test_the_caption_field_is_one_of_the_packs_fields(packs):
    m = json.loads((packs["labelled"] / "manifest.json").read_text())
    kind = kind_of(m)
    assert "caption" in kind.fields_of(m) and "caption" in kind.served_fields(m)
    assert kind.fields_of(m)["caption"].stored() == {"captions": "captions", "caption_offsets": "caption_offsets"}
    out = CliRunner().invoke(main, ["info", str(packs["labelled"])])
    assert out.exit_code == 0, out.output
    assert "caption" in out.output and "UTF-8 text, a caption per sample (captions, caption_offsets)" in out.output


def _rewrite(pack: Path, k: int, name: str, arr: np.ndarray) -> None:
    """Replace train shard k's NAME.npy with `arr`, its records (manifest and shard.json) made to match, so
    only a content check can tell."""
    rewrite(pack, "train", k, name, arr)


def _shard_with(pack: Path, text: str) -> tuple[int, Path]:
    """The train shard holding caption `text` (non-ASCII), and its directory."""
    m = json.loads((pack / "manifest.json").read_text())
    for k, s in enumerate(m["splits"]["train"]["shards"]):
        d = pack / "train" / s["name"]
        if text.encode() in np.load(d / "captions.npy").tobytes():
            return k, d
    raise AssertionError(text)


def test_verify_passes_and_finds_a_damaged_caption_blob(pack):
    assert verify_pack(pack).ok, verify_pack(pack).problems
    k, d = _shard_with(pack, CAPTIONS[2])
    blob, offsets = np.load(d / "captions.npy"), np.load(d / "caption_offsets.npy")
    _rewrite(pack, k, "captions", blob)  # the same bytes rewritten: still clean (control for the rewrite)
    assert verify_pack(pack).ok
    at = blob.tobytes().index(CAPTIONS[2].encode())
    bad = blob.copy()
    bad[at + 1] = 0x41  # the second byte of a 3-byte character: no longer UTF-8
    _rewrite(pack, k, "captions", bad)
    problems = verify_pack(pack).problems
    assert not any("checksum" in what for _, what in problems), problems
    j = int(np.searchsorted(offsets, at, "right")) - 1
    assert [what for _, what in problems] == [f"captions.npy: caption {j} is not UTF-8 text (invalid continuation byte)"]
    with pytest.raises(Exception, match="not UTF-8"):
        open_split(pack, "train", lambda m: kind_of(m).served_fields(m), "ram")


def test_verify_finds_caption_offsets_that_cut_a_character_or_run_backwards(pack):
    k, d = _shard_with(pack, CAPTIONS[2])
    blob, offsets = np.load(d / "captions.npy"), np.load(d / "caption_offsets.npy")
    j = int(np.flatnonzero(offsets[:-1] == blob.tobytes().index(CAPTIONS[2].encode()))[-1])
    cut = offsets.copy()
    cut[j] += 1  # caption j now starts inside its first character (and the one before ends inside it)
    _rewrite(pack, k, "caption_offsets", cut)
    assert [what for _, what in verify_pack(pack).problems] == [f"captions.npy: caption {j} starts inside a UTF-8 character"]
    back = offsets.copy()
    back[1], back[2] = offsets[2] + 1, offsets[1]
    _rewrite(pack, k, "caption_offsets", back)
    assert any("not monotonic" in what for _, what in verify_pack(pack).problems)


def _index(img) -> int:
    img = np.asarray(img)
    return decode_index(img if img.shape[-1] == 3 else np.moveaxis(img, 0, -1))


def test_the_dataset_serves_image_label_caption_and_image_caption(packs):
    ds = InMemoryImageDataset(packs["labelled"], as_numpy=True)
    assert ds.labelled and len(ds) == 12 and len(ds.captions) == 12
    for i in range(len(ds)):
        img, label, caption = ds[i]
        j = _index(img)
        assert (label, caption) == (j % 3, CAPTIONS[j]) and ds.captions[i] == caption
    un = InMemoryImageDataset(packs["unlabelled"])
    assert not un.labelled and un.classes == [] and un.labels is None and "label" not in un.manifest["fields"]
    for i in range(len(un)):
        img, caption = un[i]
        assert caption == CAPTIONS[_index(img)]
    # __getitems__ (the DataLoader's batched fetch) and batch indexing give the same samples
    idx = [7, 3, 0, 11]
    for d in (ds, un):
        got = d.__getitems__(idx)
        assert [s[-1] for s in got] == [d.captions[i] for i in idx] == [CAPTIONS[_index(s[0])] for s in got]


def test_batches_carry_captions_beside_labels(tmp_path):
    """Batch indexing of a fixed-shape (raw, center-crop) pack: one gather, captions in sample order."""
    for labelled in (True, False):
        pack = build(tmp_path, f"raw{labelled}", labelled=labelled, mode="raw", resize="center-crop")
        ds = InMemoryImageDataset(pack)
        idx = [7, 3, 0, 11, 3]
        batch = ds[idx]
        images, captions = batch[0], batch[-1]
        assert images.shape == (5, 3, 32, 32) and len(batch) == (3 if labelled else 2)
        found = [_index(img) for img in images.numpy()]
        assert captions == [CAPTIONS[j] for j in found] == [ds.captions[i] for i in idx]
        if labelled:
            assert batch[1].tolist() == [j % 3 for j in found]
        assert [s[-1] for s in ds.__getitems__(idx)] == captions


def train_tokenizer(path: Path, pad: bool = True) -> Path:
    """A tiny byte-level BPE trained on the captions (non-ASCII included), with a [PAD] token (id 1) when `pad`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", "[PAD]"] if pad else ["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CAPTIONS * 3, trainer)
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory) -> tuple[Path, Path]:
    """(a pack of labelled tars with captions tokenized through the CLI, its tokenizer file)."""
    tmp = tmp_path_factory.mktemp("tokenized")
    tok = train_tokenizer(tmp / "tok.json")
    tar = write_tar(tmp / "a.tar", list(range(12)))
    out = tmp / "pack"
    r = CliRunner().invoke(main, ["build", "webdataset", str(tar), "--out", str(out), "--size", "32", "--workers", "1",
                                  "--shard-size", "5", "--tokenize", str(tok)])
    assert r.exit_code == 0, r.output
    return out, tok


def test_tokenized_captions_are_the_tokenizers_own_ids(tokenized):
    from tokenizers import Tokenizer

    pack, tok_path = tokenized
    ref = Tokenizer.from_file(str(tok_path))
    m = json.loads((pack / "manifest.json").read_text())
    data = tok_path.read_bytes()
    assert m["tokenizer"]["sha256"] == hashlib.sha256(data).hexdigest() and (pack / "tokenizer.json").read_bytes() == data
    assert m["tokenizer"]["vocab_size"] == ref.get_vocab_size(with_added_tokens=True) == 300
    assert m["fields"]["caption_tokens"]["dtype"] == "<u2" and m["fields"]["caption_tokens"]["pad_id"] == 1 == ref.token_to_id("[PAD]")
    c = open_split(pack, "train", lambda m: kind_of(m).served_fields(m), "ram")
    ids, offsets = c.arrays["caption_tokens"], c.arrays["caption_token_offsets"]
    captions = list(c.fields["caption"].strings(c.arrays))
    assert ids.dtype == np.uint16 and len(offsets) == 13
    runs = [ids[offsets[i] : offsets[i + 1]].tolist() for i in range(12)]
    assert runs == [ref.encode(cap).ids for cap in captions]
    assert [] in runs and any(max(r, default=0) > 255 for r in runs)  # the empty caption; merges, not just bytes
    assert verify_pack(pack).ok, verify_pack(pack).problems
    out = CliRunner().invoke(main, ["info", str(pack)])
    assert "tokenized (uint16, vocabulary 300, pad id 1" in out.output and "caption_tokens" in out.output


@pytest.mark.corpus
def test_a_wordpiece_tokenizer_adds_its_special_tokens_and_pads_with_its_pad_id(tmp_path):
    """The shared corpus's BERT WordPiece: its post-processor's [CLS] ... [SEP] are in the stored ids (what
    Tokenizer.encode gives), its padding setting's pad id (0, [PAD]) is the pack's, the empty caption is [CLS] [SEP]."""
    from tokenizers import Tokenizer

    tok = corpus_dir("tokenizer") / "tokenizer.json"
    ref = Tokenizer.from_file(str(tok))
    ref.no_padding()
    ref.no_truncation()
    pack = tmp_path / "p"
    build_images(scan_webdataset([str(write_tar(tmp_path / "a.tar", list(range(12))))]), pack,
                 BuildSettings(workers=1, shard_size=5), ImageSettings(size=32), tokenizer=tok)
    c = open_split(pack, "train", lambda m: kind_of(m).served_fields(m), "ram")
    ids, offsets = c.arrays["caption_tokens"], c.arrays["caption_token_offsets"]
    captions = list(c.fields["caption"].strings(c.arrays))
    runs = [ids[offsets[i] : offsets[i + 1]].tolist() for i in range(12)]
    assert runs == [ref.encode(cap).ids for cap in captions]
    assert runs[captions.index("")] == [ref.token_to_id("[CLS]"), ref.token_to_id("[SEP]")]
    assert c.fields["caption_tokens"].pad_id == 0 == ref.token_to_id("[PAD]")
    assert json.loads((pack / "manifest.json").read_text())["tokenizer"]["pad_from"] == "the tokenizer"


def test_a_vocabulary_over_65536_stores_uint32_ids_and_no_pad_means_0(tmp_path):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    vocab = {f"w{i}": i for i in range(70_000)}
    vocab["[UNK]"] = 70_000
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(tmp_path / "tok.json"))
    words = [f"w{69_990 + k} w{k} w65536" if k != 3 else "" for k in range(12)]
    pack = tmp_path / "p"
    build_images(scan_webdataset([str(write_tar(tmp_path / "a.tar", list(range(12)), captions=words))]), pack,
                 BuildSettings(workers=1, shard_size=5), ImageSettings(size=32), tokenizer=tmp_path / "tok.json")
    c = open_split(pack, "train", lambda m: kind_of(m).served_fields(m), "ram")
    ids, offsets = c.arrays["caption_tokens"], c.arrays["caption_token_offsets"]
    captions = list(c.fields["caption"].strings(c.arrays))
    assert ids.dtype == np.uint32 and c.fields["caption_tokens"].pad_id == 0 and sorted(captions) == sorted(words)
    assert [ids[offsets[i] : offsets[i + 1]].tolist() for i in range(12)] == [tok.encode(cap).ids for cap in captions]
    assert 69_999 in ids.tolist() and 65_536 in ids.tolist()  # above 65,535: kept, not wrapped
    assert json.loads((pack / "manifest.json").read_text())["tokenizer"]["pad_from"] == "0: the tokenizer has no pad"


def test_tokenize_is_refused_without_captions_or_with_a_file_that_is_no_tokenizer(tmp_path):
    tar = write_tar(tmp_path / "a.tar", [0, 1])
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(SourceError, match="not a tokenizers JSON file"):
        build_images(scan_webdataset([str(tar)]), tmp_path / "p", BuildSettings(workers=1), ImageSettings(size=32),
                     tokenizer=tmp_path / "bad.json")
    with pytest.raises(SourceError, match="does not exist"):
        build_images(scan_webdataset([str(tar)]), tmp_path / "p", BuildSettings(workers=1), ImageSettings(size=32),
                     tokenizer=tmp_path / "none.json")
    source = scan_webdataset([str(tar)])
    source.splits[0].captions = None
    with pytest.raises(DataprepError, match="no captions to tokenize"):
        build_images(source, tmp_path / "p", BuildSettings(workers=1), ImageSettings(size=32), tokenizer=train_tokenizer(tmp_path / "t.json"))
    assert not (tmp_path / "p" / "manifest.json").exists()


def test_resume_keeps_shards_of_the_same_tokenizer_and_rebuilds_for_another(tmp_path):
    """The tokenizer is part of every shard's digest; a rebuild without --tokenize leaves no tokenizer copy."""
    from tokenizers import Tokenizer

    tar = write_tar(tmp_path / "a.tar", list(range(12)))
    with_pad, without = train_tokenizer(tmp_path / "a.json"), train_tokenizer(tmp_path / "b.json", pad=False)
    pack = tmp_path / "p"

    def run(tok, resume=True):
        return build_images(scan_webdataset([str(tar)]), pack, BuildSettings(workers=1, shard_size=5, resume=resume),
                            ImageSettings(size=32), tokenizer=tok).splits[0].reused

    assert run(with_pad, resume=False) == 0
    assert run(with_pad) == 3  # the same tokenizer: every shard finished and intact
    assert run(without) == 0  # another one: every shard rebuilt with its ids
    c = open_split(pack, "train", lambda m: kind_of(m).served_fields(m), "ram")
    ref = Tokenizer.from_file(str(without))
    ids, offsets = c.arrays["caption_tokens"], c.arrays["caption_token_offsets"]
    assert [ids[offsets[i] : offsets[i + 1]].tolist() for i in range(12)] == [ref.encode(t).ids for t in c.fields["caption"].strings(c.arrays)]
    assert (pack / "tokenizer.json").read_bytes() == without.read_bytes() and verify_pack(pack).ok
    assert run(None) == 0
    m = json.loads((pack / "manifest.json").read_text())
    assert "caption_tokens" not in m["fields"] and "tokenizer" not in m and not (pack / "tokenizer.json").exists()
    assert verify_pack(pack).ok


def expected_rows(ids: list[int], length: int, pad: int, cut: int | None = None) -> tuple[list[int], int]:
    """A caption's row in a batch of `length` as the test defines it: its first `cut` (default: `length`) ids,
    then `pad` up to `length`; and its length capped at `cut`."""
    cut = length if cut is None else cut
    return ids[:cut] + [pad] * max(0, length - len(ids[:cut])), min(len(ids), cut)


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_serves_captions_padded_and_truncated_with_their_lengths(tokenized, workers):
    from tokenizers import Tokenizer

    from dataprep.serve.loader import Loader

    pack, tok_path = tokenized
    ref = Tokenizer.from_file(str(tok_path))
    encoded = [ref.encode(c).ids for c in CAPTIONS]
    L = 6
    assert max(map(len, encoded)) > L + 1 and min(map(len, encoded)) == 0 and L in map(len, encoded)  # cut, padded, exact
    ds = InMemoryImageDataset(pack, caption_length=L)
    assert ds.caption_pad_id == 1
    got = {}
    for images, labels, captions, lengths, idx in Loader(ds, batch_size=5, shuffle=True, num_workers=workers, crop=(32, 32), indices=True):
        assert captions.dtype == torch.int64 and captions.shape == (len(idx), L) and lengths.dtype == torch.int32
        for k in range(len(idx)):
            j = _index(images[k].numpy())
            assert int(labels[k]) == j % 3 and ds.caption_ids(int(idx[k])).tolist() == encoded[j]
            got[j] = (captions[k].tolist(), int(lengths[k]))
    assert sorted(got) == list(range(12))
    assert got == {j: expected_rows(encoded[j], L, 1) for j in range(12)}
    # negative controls: a truncation one id off, either way, is not what was served
    assert got != {j: expected_rows(encoded[j], L, 1, cut=L - 1) for j in range(12)}
    assert got != {j: expected_rows(encoded[j], L, 1, cut=L + 1) for j in range(12)}


def test_a_mixture_of_captioned_packs_fills_each_members_rows_as_the_member_would(tokenized):
    """Image members fill a mixed batch together (each sample written straight into its row): each row
    holds the image, label and caption of the sample the mixture names for it, and the bytes equal each
    member filling its own samples alone with its own request (member epoch, member seed). (Index images
    are flat: random crops and flips are checked on photos in test_mixture.)"""
    from tokenizers import Tokenizer

    from dataprep.images.crops import RandomResizedCrop
    from dataprep.images.dataset import InMemoryImageDataset as Images
    from dataprep.serve.mixture import Mixture

    from .test_mixture import members_alone

    pack, tok_path = tokenized
    encoded = [Tokenizer.from_file(str(tok_path)).encode(c).ids for c in CAPTIONS]
    mix = Mixture([Images(pack, caption_length=6), Images(pack, caption_length=6)], [0.6, 0.4], seed=3)

    def empty(req, n):
        return {k: np.full((n, *s), 7, d) for k, (s, d) in mix.batch_layout(req).items()}

    for req in (Request(epoch=1, crop=(32, 32)), Request(epoch=1, seed=4, crop=RandomResizedCrop(16), flip=True)):
        for idx in (np.arange(3, 20), np.random.default_rng(0).permutation(len(mix))[:17]):
            direct = empty(req, len(idx))
            mix.fill_batch(range(3, 20) if idx[1] == idx[0] + 1 else idx, direct, req)
            member, index, _ = mix.locate(idx, 1)
            assert 0 < (member == 0).sum() < len(member)  # both members, interleaved
            alone = members_alone(mix, idx, req)
            assert all((direct[k] == alone[k]).all() for k in direct)
            if req.crop == (32, 32):  # whole index images: each row says which sample it holds
                for k in range(len(member)):
                    j = _index(direct["images"][k])
                    assert j == index[k] and direct["labels"][k] == j % 3
                    assert direct["captions"][k].tolist() == expected_rows(encoded[j], 6, 1)[0]


def test_unlabelled_tokenized_batches_are_images_captions_lengths(tmp_path):
    from tokenizers import Tokenizer

    from dataprep.serve.loader import Loader

    tok = train_tokenizer(tmp_path / "tok.json", pad=False)
    tar = write_tar(tmp_path / "u.tar", list(range(12)), labelled=False)
    pack = tmp_path / "u"
    build_images(scan_webdataset([str(tar)]), pack, BuildSettings(workers=1, shard_size=5), ImageSettings(size=32, resize="center-crop"),
                 tokenizer=tok)
    ref = Tokenizer.from_file(str(tok))
    ds = InMemoryImageDataset(pack, caption_length=40)  # longer than every caption: all padded, with 0 (no pad token)
    assert ds.caption_pad_id == 0 and set(ds.batch_layout()) == {"images", "captions", "caption_lengths"}
    batches = list(Loader(ds, batch_size=12))
    assert len(batches) == 1 and len(batches[0]) == 3
    images, captions, lengths = batches[0]
    for k in range(12):
        ids = ref.encode(CAPTIONS[_index(images[k].numpy())]).ids
        assert (captions[k].tolist(), int(lengths[k])) == expected_rows(ids, 40, 0)


def test_caption_length_without_caption_tokens_is_a_clear_error(packs, index_tree, tmp_path):
    with pytest.raises(DataprepError, match="holds its captions as text only; build it with --tokenize"):
        InMemoryImageDataset(packs["labelled"], caption_length=8)
    from dataprep.sources import scan_imagenet

    build_images(scan_imagenet(index_tree), tmp_path / "plain", BuildSettings(workers=1), ImageSettings(size=32))
    with pytest.raises(DataprepError, match="has no captions"):
        InMemoryImageDataset(tmp_path / "plain", caption_length=8)
    with pytest.raises(DataprepError, match="caption_length is a number"):
        InMemoryImageDataset(packs["labelled"], caption_length=0)
    plain = InMemoryImageDataset(tmp_path / "plain")  # a pack without captions serves as before
    assert plain.captions is None and set(plain.batch_layout(Request(crop=(32, 32)))) == {"images", "labels"}
    img, label = plain[0]
    assert isinstance(label, int)


def _served(ds: InMemoryImageDataset) -> list[tuple[int, str, list[int]]]:
    """(image index, caption, caption ids) of every sample, in pack order."""
    return [(_index(ds[i][0]), ds.captions[i], ds.caption_ids(i).tolist()) for i in range(len(ds))]


@pytest.mark.parametrize("to", ["hdf5", "zarr"])
def test_convert_keeps_captions_their_tokens_and_the_tokenizer(tokenized, tmp_path, to):
    from dataprep.pack.convert import convert

    if to == "zarr":
        from .test_backends import _has_zarr_3

        if not _has_zarr_3():
            pytest.skip("needs zarr 3")
    pack, tok_path = tokenized
    out = tmp_path / ("p.h5" if to == "hdf5" else "p.zarr")
    convert(pack, out, to)
    assert verify_pack(out).ok, verify_pack(out).problems
    want = _served(InMemoryImageDataset(pack, as_numpy=True))
    assert [c for _, c, _ in want] and sorted(c for _, c, _ in want) == sorted(CAPTIONS)
    for cache in ("ram", "mmap") if to == "hdf5" else ("ram",):  # Zarr offers no mmap
        got = InMemoryImageDataset(out, as_numpy=True, cache=cache, caption_length=4)
        assert _served(got) == want and got.caption_pad_id == 1
    from dataprep.text import read_tokenizer

    m = json.loads((pack / "manifest.json").read_text())
    assert read_tokenizer(out, m, "tokenizer.json").to_str() == read_tokenizer(pack, m, "tokenizer.json").to_str()
    # and back to npy: the same bytes as the original's copy of the tokenizer
    back = tmp_path / "back"
    convert(out, back, "npy")
    assert (back / "tokenizer.json").read_bytes() == tok_path.read_bytes() and _served(InMemoryImageDataset(back, as_numpy=True)) == want


def test_every_cache_mode_serves_the_same_captions(tokenized):
    import gc

    pack, _ = tokenized
    want = _served(InMemoryImageDataset(pack, as_numpy=True))
    for cache in ("mmap", "shm"):
        ds = InMemoryImageDataset(pack, as_numpy=True, cache=cache, caption_length=3)
        assert _served(ds) == want
        del ds
        gc.collect()


def test_verify_finds_a_caption_token_beyond_the_vocabulary(tokenized, tmp_path):
    pack = tmp_path / "p"
    shutil.copytree(tokenized[0], pack)
    d = pack / "train" / "00001"
    ids = np.load(d / "caption_tokens.npy")
    _rewrite(pack, 1, "caption_tokens", ids)
    assert verify_pack(pack).ok  # control: the same ids rewritten
    bad = ids.copy()
    bad[len(bad) // 2] = 300  # the vocabulary is 300 ids: 0..299
    _rewrite(pack, 1, "caption_tokens", bad)
    assert [what for _, what in verify_pack(pack).problems] == ["caption_tokens.npy: a token id is beyond the vocabulary of 300"]
    with pytest.raises(Exception, match="beyond the vocabulary"):
        InMemoryImageDataset(pack)


def test_a_json_caption_that_is_not_unicode_text_is_skipped_with_its_reason(tmp_path):
    """A .json caption "\\ud800" parses to a lone surrogate, which UTF-8 cannot store: that sample is skipped
    (it crashed the build), the others are kept with their captions."""
    tar = tmp_path / "j.tar"
    with tarfile.open(tar, "w") as tf:
        for k in range(4):
            for ext, data in {"jpg": cv2.imencode(".jpg", index_image(k, 32, 32))[1].tobytes(),
                              "json": json.dumps({"caption": "\ud800 bad" if k == 2 else CAPTIONS[k]}).encode()}.items():
                info = tarfile.TarInfo(f"{k:06d}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    pack = tmp_path / "p"
    build_images(scan_webdataset([str(tar)], caption_field="caption"), pack, BuildSettings(workers=1), ImageSettings(size=32))
    m = json.loads((pack / "manifest.json").read_text())
    assert [(s["source"], s["reason"]) for s in m["splits"]["train"]["skipped"]] == [("j.tar:000002", "bad caption")]
    ds = InMemoryImageDataset(pack)
    assert list(ds.captions) == [CAPTIONS[0], CAPTIONS[1], CAPTIONS[3]]
