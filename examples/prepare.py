"""Make the small packs the training examples run on, once, before any training (as nanoGPT's prepare.py).

    python examples/prepare.py images runs/demo-src --out packs/demo              # then: train_classifier.py packs/demo
    python examples/prepare.py images runs/demo-src --out packs/demo --size 32 --images 64
    python examples/prepare.py text runs/demo-text --out packs/demo-text          # then: train_gpt.py packs/demo-text
    python examples/prepare.py videos runs/demo-videos --out packs/demo-videos    # then: train_video.py packs/demo-videos

`images DIR`: writes a synthetic ImageNet-layout tree in DIR (DIR/{train,val}/<class>/*.png, unless DIR/train
is there already) and packs it with `dataprep.build.imagenet`. `text DIR`: writes a generated text in
DIR/demo.txt (unless it is there) and packs it with `dataprep.tokenize`, through a byte-level BPE trained on
it. `videos DIR`: writes class folders of generated videos in DIR (DIR/{train,val}/<class>/*.mp4, unless
DIR/train is there; needs the `video` extra) and packs them with `dataprep.build.video`. A real dataset is
packed the same way: `build.imagenet("/data/imagenet", out, size=256)`, or the CLI's
`dataprep build imagenet`, `dataprep build video` and `dataprep tokenize`.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
from pathlib import Path

import numpy as np

import dataprep
from dataprep import build

# -- images ----------------------------------------------------------------------------------------
# One colour per class, tinting every image of it: the class is visible in any crop and any flip, so a small
# network learns it in a few epochs.
PALETTE = np.array([[230, 40, 40], [40, 190, 60], [50, 80, 230], [240, 210, 30],
                    [200, 60, 220], [30, 200, 210], [250, 140, 0], [130, 130, 130]], np.float32)


def clutter(seed: int, h: int, w: int) -> np.ndarray:
    """An RGB float image of a smooth gradient, a few filled shapes and sensor-like noise."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base, slope = rng.uniform(0, 255, 3), rng.uniform(-0.3, 0.3, (3, 2))
    grad = np.stack([base[c] + slope[c, 0] * y + slope[c, 1] * x for c in range(3)], axis=2)
    img = Image.fromarray(np.clip(grad, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(3, 9))):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        box = [x0, y0, x0 + int(rng.integers(w // 10 + 1, w // 2 + 2)), y0 + int(rng.integers(h // 10 + 1, h // 2 + 2))]
        fill = tuple(int(v) for v in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=fill)
    return np.asarray(img, np.float32) + rng.normal(0, 6, (h, w, 3))


def write_image_tree(root: Path, train_images: int, shorter: int) -> None:
    """root/{train,val}/<class>/*.png: 8 classes, `train_images` train images and a quarter as many val
    images, portrait and landscape, the shorter side `shorter` pixels."""
    from PIL import Image

    per_class = {"train": max(1, train_images // len(PALETTE)), "val": max(1, train_images // 4 // len(PALETTE))}
    k = 0
    for split, n in per_class.items():
        for c, colour in enumerate(PALETTE):
            d = root / split / f"class{c}"
            d.mkdir(parents=True, exist_ok=True)
            for j in range(n):
                h, w = (shorter, shorter * 4 // 3) if k % 2 else (shorter * 4 // 3, shorter)
                img = 0.35 * clutter(k, h, w) + 0.65 * colour
                Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(d / f"{j:05d}.png")
                k += 1


def prepare_images(args) -> None:
    """Pack the tree as decoded pixels (nothing to decode while serving), the shorter side stored at the size
    the validation crop resizes to (CenterCrop(size).resize), so training crops are cut from the whole image."""
    src, stored = Path(args.dir), dataprep.CenterCrop(args.size).resize
    if (src / "train").is_dir():
        print(f"{src}: packing the images already there", flush=True)
    else:
        write_image_tree(src, args.images, shorter=stored + stored // 4)
    summary = build.imagenet(src, args.out, size=stored, resize="shorter", mode="raw", workers=args.workers, overwrite=True)
    print("\n".join(summary.lines()), flush=True)


# -- text ------------------------------------------------------------------------------------------
WHO = ["the cat", "a dog", "the old man", "my sister", "the teacher", "a small bird", "the farmer", "our neighbour"]
DID = ["sat on", "looked at", "walked past", "painted", "found", "carried", "forgot", "cleaned"]
WHAT = ["the red door", "a wooden box", "the garden wall", "an empty cup", "the blue boat", "a heavy stone"]
WHEN = ["in the morning", "after lunch", "at night", "before the rain", "on sunday"]


def write_text(path: Path, docs: int, seed: int = 0) -> None:
    """Paragraphs of short sentences from a tiny grammar, plus sums: structure a small model can learn
    (the loss falls well below that of guessing from token frequencies)."""
    rng = random.Random(seed)
    paragraphs = []
    for _ in range(docs):
        sentences = []
        for _ in range(rng.randint(2, 5)):
            if rng.random() < 0.25:
                a, b = rng.randint(0, 9), rng.randint(0, 9)
                sentences.append(f"{a} plus {b} is {a + b}.")
            else:
                sentences.append(f"{rng.choice(WHO)} {rng.choice(DID)} {rng.choice(WHAT)} {rng.choice(WHEN)}.".capitalize())
        paragraphs.append(" ".join(sentences))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n".join(paragraphs) + "\n")


def prepare_text(args) -> None:
    """One document per paragraph, tokenized with a byte-level BPE of --vocab ids trained on the text."""
    text = Path(args.dir) / "demo.txt"
    if text.exists():
        print(f"{text}: tokenizing the text already there", flush=True)
    else:
        write_text(text, args.docs)
    summary = dataprep.tokenize([text], args.out, train_bpe=args.vocab, split_docs="paragraph", overwrite=True)
    print("\n".join(summary.lines()), flush=True)


# -- videos ----------------------------------------------------------------------------------------
def prepare_videos(args) -> None:
    """Frame-coded videos (dataprep.synthetic.write_video_tree: each frame's colour codes its number, and the
    numbers grow with the class), stored with the shorter side at the training crop size plus a quarter, so
    RandomResizedCrop has room to move."""
    from dataprep.synthetic import write_video_tree

    src, stored = Path(args.dir), args.size + args.size // 4
    if (src / "train").is_dir():
        print(f"{src}: packing the videos already there", flush=True)
    else:
        per_class = max(1, args.videos // args.classes)
        h, w = 2 * (stored // 2), 2 * (stored * 2 // 3)  # 3:4 landscape, even sizes for the 4:2:0 codec
        for split, n in (("train", per_class), ("val", max(1, per_class // 4))):
            write_video_tree(src, args.classes, n, args.frames, h, w, split=split)
    summary = build.video(src, args.out, size=stored, workers=args.workers, overwrite=True)
    print("\n".join(summary.lines()), flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    kinds = p.add_subparsers(dest="kind", required=True)
    im = kinds.add_parser("images", help="a synthetic image tree, packed for train_classifier.py and lightning_classifier.py",
                          formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    im.add_argument("dir", help="where the synthetic tree is written (a tree already there is packed as it is)")
    im.add_argument("--out", required=True, help="the pack to write (replaced if there)")
    im.add_argument("--size", type=int, default=64, help="the crop size the training will use (its --size)")
    im.add_argument("--images", type=int, default=512, help="train images to generate (and a quarter as many for val)")
    im.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1), help="build worker processes")
    im.set_defaults(run=prepare_images)
    tx = kinds.add_parser("text", help="a generated text, tokenized for train_gpt.py",
                          formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    tx.add_argument("dir", help="where the text is written, as DIR/demo.txt (a text already there is tokenized as it is)")
    tx.add_argument("--out", required=True, help="the pack to write (replaced if there)")
    tx.add_argument("--docs", type=int, default=3000, help="paragraphs the text has (one document each)")
    tx.add_argument("--vocab", type=int, default=384, help="ids of the BPE trained on the text")
    tx.set_defaults(run=prepare_text)
    vd = kinds.add_parser("videos", help="generated videos, packed as JPEG frames for train_video.py",
                          formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    vd.add_argument("dir", help="where the videos are written (videos already there are packed as they are)")
    vd.add_argument("--out", required=True, help="the pack to write (replaced if there)")
    vd.add_argument("--size", type=int, default=64, help="the crop size the training will use (its --size)")
    vd.add_argument("--videos", type=int, default=32, help="train videos to generate (and a quarter as many for val)")
    vd.add_argument("--frames", type=int, default=16, help="frames a video")
    vd.add_argument("--classes", type=int, default=2, help="class folders (keep videos x frames under 1024)")
    vd.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1), help="build worker processes")
    vd.set_defaults(run=prepare_videos)
    args = p.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    sys.exit(main())
