"""The documentation holds together: every relative link in README.md, ARCHITECTURE.md and docs/*.md
names a file that exists (and an #anchor a heading of it), the README stays a landing page of at most
200 lines, every page under docs/ is reachable from docs/index.md and from the README, and every ```python
block of README.md and docs/*.md runs as printed.

A block runs in a fresh interpreter, in an empty directory holding the small generated inputs its text names
(`photos/`, a class-folder tree; `packs/NAME`, a pack built from such inputs: MATERIALS), and must exit 0; the
README's quickstart also shows that its restored Loader serves the batch the run would have served next. A
block that cannot run here (it needs a GPU, object storage, your own data, or names from the block before it)
says so on the line before its fence: `<!-- fragment: the reason -->`, the reason not empty. Shell blocks
(```bash, ``` and ```text) are not run: their commands are the CLI's, which tests/test_cli.py and the
command's own tests run."""
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README_MAX_LINES = 200
MIN_PAGES = 6
QUICKSTART_MAX_LINES = 25

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")  # [text](target "title"), not images
FENCE = re.compile(r"^(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def documents() -> list[Path]:
    return [p for p in [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted(DOCS.glob("*.md"))] if p.is_file()]


def prose(text: str) -> list[str]:
    """The lines outside fenced code blocks (a link-like string in code is code, not a link)."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: inline markup dropped, lower case, punctuation other than '-' and
    '_' removed, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = text.replace("`", "").replace("*", "")
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a markdown file, with GitHub's -1, -2 suffixes for repeated headings."""
    seen: dict[str, int] = {}
    out = set()
    for line in prose(path.read_text(encoding="utf-8")):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def relative_links(path: Path) -> list[str]:
    links = []
    for line in prose(path.read_text(encoding="utf-8")):
        line = re.sub(r"`[^`]*`", "", line)  # inline code is not a link either
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or target.startswith("//"):
                continue  # http:, https:, mailto:, ...: not checked here (no network in tests)
            links.append(target)
    return links


def broken_links(path: Path) -> list[str]:
    problems = []
    for target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / unquote(file_part)).resolve() if file_part else path
        if not dest.exists():
            problems.append(f"{path.relative_to(ROOT)}: {target}: no such file")
            continue
        if anchor and dest.suffix == ".md" and anchor.lower() not in anchors(dest):
            problems.append(f"{path.relative_to(ROOT)}: {target}: no heading with anchor #{anchor} in {dest.name}")
    return problems


def linked_pages(path: Path) -> set[Path]:
    """The docs pages a file links to (anchors dropped)."""
    out = set()
    for target in relative_links(path):
        file_part = target.partition("#")[0]
        if file_part:
            dest = (path.parent / unquote(file_part)).resolve()
            if dest.parent == DOCS.resolve() and dest.suffix == ".md":
                out.add(dest)
    return out


def pages() -> list[Path]:
    return sorted(p.resolve() for p in DOCS.glob("*.md"))


def test_docs_folder_has_enough_pages():
    assert DOCS.is_dir(), "docs/ is missing"
    assert len(pages()) >= MIN_PAGES, f"docs/ has {len(pages())} pages, fewer than {MIN_PAGES}"
    assert (DOCS / "index.md").is_file(), "docs/index.md is missing"


def test_readme_is_a_landing_page():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines, more than {README_MAX_LINES}"


def test_readme_keeps_the_two_make_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    for command in ("make demo", "make test"):
        assert re.search(rf"^{command}\b", text, re.MULTILINE), f"README.md no longer starts a line with `{command}`"


@pytest.mark.parametrize("path", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    assert not broken_links(path), "\n".join(broken_links(path))


@pytest.mark.parametrize("source", ["docs/index.md", "README.md"])
def test_every_docs_page_is_linked(source):
    src = ROOT / source
    assert src.is_file(), f"{source} is missing"
    assert pages(), "docs/ holds no pages"
    wanted = {p for p in pages() if not (source == "docs/index.md" and p.name == "index.md")}
    missing = sorted(p.name for p in wanted - linked_pages(src))
    assert not missing, f"{source} does not link to: {', '.join(missing)}"


def test_slugs_follow_github():
    assert slug("Packs larger than one node's RAM") == "packs-larger-than-one-nodes-ram"
    assert slug("Class lists: labels=") == "class-lists-labels"
    assert slug("Held batches and `copy=`") == "held-batches-and-copy"
    assert slug("Tars, Parquet, Arrow and path lists") == "tars-parquet-arrow-and-path-lists"


# -- every ```python block runs as printed ---------------------------------------------------------------
FRAGMENT = re.compile(r"^<!--\s*fragment:(.*?)-->$")  # on the line before a block's fence: why it does not run
BLOCK_TIMEOUT = 240


@dataclass
class Block:
    """One ```python block: where it stands, its code, and its fragment marker's reason (None: unmarked)."""

    path: Path
    line: int  # of the opening fence, from 1
    code: str
    fragment: str | None

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def python_blocks(path: Path, text: str | None = None) -> list[Block]:
    lines = (path.read_text(encoding="utf-8") if text is None else text).splitlines()
    out, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith("```"):
                j += 1
            marker = FRAGMENT.match(lines[i - 1].strip()) if i else None
            out.append(Block(path, i + 1, "\n".join(lines[i + 1 : j]) + "\n", marker.group(1).strip() if marker else None))
            i = j
        i += 1
    return out


def all_blocks() -> list[Block]:
    return [b for p in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))] for b in python_blocks(p)]


def readme_quickstart() -> str:
    """The README's first ```python block: its quickstart."""
    blocks = python_blocks(ROOT / "README.md")
    assert blocks, "README.md has no ```python block (its quickstart)"
    return blocks[0].code


def make_class_tree(root: Path, classes=("cat", "dog", "fox"), per_class: int = 12) -> None:
    """root/<class>/<n>.jpg: small JPEGs of a few sizes (gradients plus noise)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            h, w = 120 + 8 * (i % 5), 150 + 10 * (i % 3)
            y, x = np.mgrid[0:h, 0:w]
            base = np.stack([x * 255 // w, y * 255 // h, np.full_like(x, 80 * c)], axis=-1)
            pixels = np.clip(base + rng.integers(-20, 21, base.shape), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.jpg", quality=90)


def _photos_pack(base: Path) -> None:
    from dataprep import build

    build.folder(base / "photos", base / "packs" / "photos", size=160, mode="raw", workers=1)


def _coco_pack(base: Path) -> None:
    import dataprep

    scenes = dataprep.write_scenes(base / "scenes", n=12, sizes=((520, 640), (640, 560), (600, 600)))  # a 512 crop fits
    dataprep.build.coco(scenes["images"], base / "packs" / "coco", annotations=scenes["coco"], size=512, workers=1)


def _seg_pack(base: Path) -> None:
    from dataprep import build
    from dataprep.synthetic import write_segmentation_tree

    images, masks = write_segmentation_tree(base / "seg", splits={"train": 4}, sizes=((120, 160), (150, 100)))
    build.segmentation(images / "train", masks / "train", base / "packs" / "seg", size=128, workers=1)


def _ct_pack(base: Path) -> None:
    import numpy as np

    from dataprep import build

    rng = np.random.default_rng(0)
    (base / "ct").mkdir()
    for i in range(2):
        np.save(base / "ct" / f"v{i}.npy", rng.integers(-1000, 2000, (20, 24, 24)).astype(np.int16))
    build.volumes(base / "ct", base / "packs" / "ct", shape=(64, 128, 128), window=(-1000, 2000), workers=1)


def _text_pack(base: Path) -> None:
    import numpy as np

    import dataprep

    rng = np.random.default_rng(0)
    words = [f"w{j}" for j in range(300)]
    (base / "corpus").mkdir()
    for i in range(4):
        (base / "corpus" / f"d{i}.txt").write_text("\n\n".join(" ".join(rng.choice(words, 60)) for _ in range(40)))
    dataprep.tokenize(base / "corpus", base / "packs" / "text", train_bpe=400, split_docs="paragraph")


def _captions_pack(base: Path) -> None:
    """WebDataset members key.jpg + key.txt (no labels), captions tokenized with the text pack's tokenizer."""
    import io
    import tarfile

    from dataprep import build

    with tarfile.open(base / "pairs.tar", "w") as tf:
        for i, p in enumerate(sorted((base / "photos").rglob("*.jpg"))):
            for name, data in ((f"{i:05d}.jpg", p.read_bytes()), (f"{i:05d}.txt", f"a photo of a {p.parent.name}, {i}".encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    build.webdataset(base / "pairs.tar", base / "packs" / "laion256", size=256, upscale=True, workers=1,
                     tokenize=base / "packs" / "text" / "tokenizer.json")


# What a block may name, made once for the module (each after what it needs) and copied into a block's directory.
MATERIALS: dict[str, tuple[Callable[[Path], None], tuple[str, ...]]] = {
    "photos/": (lambda base: make_class_tree(base / "photos"), ()),
    "packs/photos": (_photos_pack, ("photos/",)),
    "packs/coco": (_coco_pack, ()),
    "packs/seg": (_seg_pack, ()),
    "packs/ct": (_ct_pack, ()),
    "packs/text": (_text_pack, ()),
    "packs/laion256": (_captions_pack, ("photos/", "packs/text")),
}


@pytest.fixture(scope="module")
def materials(tmp_path_factory):
    """`need(name)`: the directory holding `name` (made on first use)."""
    base = tmp_path_factory.mktemp("doc_materials")
    made: set[str] = set()

    def need(name: str) -> Path:
        make, after = MATERIALS[name]
        for first in after:
            need(first)
        if name not in made:
            make(base)
            made.add(name)
        return base / name.rstrip("/")

    return need


def run_block(code: str, where: Path, materials) -> subprocess.CompletedProcess:
    """`code` as a script in the empty directory `where`, beside copies of the materials it names, in a fresh
    interpreter that imports this checkout's dataprep (its shared-memory segments kept in `where` too)."""
    import shutil

    where.mkdir()
    for name in MATERIALS:
        if name in code:
            shutil.copytree(materials(name), where / name.rstrip("/"))
    (where / "block.py").write_text(code, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
           "DATAPREP_SHM_DIR": str(where / "shm")}  # cache="shm" segments: the block's own, removed with its directory
    (where / "shm").mkdir()
    return subprocess.run([sys.executable, "block.py"], check=False, cwd=where, env=env, capture_output=True, text=True,
                          timeout=BLOCK_TIMEOUT)


RUNNABLE = [b for b in all_blocks() if b.fragment is None][1:]  # the README's quickstart first: its own test below


@pytest.mark.parametrize("block", RUNNABLE, ids=str)
def test_every_python_block_runs_as_printed(block, materials, tmp_path):
    r = run_block(block.code, tmp_path / "run", materials)
    assert r.returncode == 0, f"{block}: the block failed (exit {r.returncode}):\n{r.stdout}\n{r.stderr}"


def test_a_block_that_does_not_run_says_why():
    marked = [b for b in all_blocks() if b.fragment is not None]
    assert not [str(b) for b in marked if not b.fragment], "a fragment marker without its reason"
    assert all_blocks()[0].path.name == "README.md" and all_blocks()[0].fragment is None, "the quickstart must run"
    assert len(RUNNABLE) >= 8, f"only {len(RUNNABLE)} blocks besides the quickstart run"


def test_the_block_reader_sees_markers_and_fences():
    """Negative control: an unmarked block is run, a marked one is not, an empty reason is seen as empty."""
    text = ("x\n```python\nprint(1)\n```\n<!-- fragment: needs a GPU -->\n```python\nimport torch\n```\n"
            "<!-- fragment: -->\n```python\npass\n```\n```bash\nls\n```\n")
    got = python_blocks(ROOT / "README.md", text)
    assert [(b.line, b.code, b.fragment) for b in got] == [(2, "print(1)\n", None), (6, "import torch\n", "needs a GPU"),
                                                             (10, "pass\n", "")]


def test_readme_quickstart_is_short():
    lines = readme_quickstart().splitlines()
    assert len(lines) <= QUICKSTART_MAX_LINES, f"the quickstart has {len(lines)} lines, more than {QUICKSTART_MAX_LINES}"


def test_readme_quickstart_runs(materials, tmp_path):
    """The quickstart as printed, in a directory holding a generated `photos/` tree: it builds its pack there,
    trains a step, prints the loss and the resumed batch's shape, and its restored Loader serves the second
    batch of the uninterrupted run (what the appended check compares, through the quickstart's own `loader()`)."""
    check = (
        "\n# the README's claim: the restored Loader serves the batch the run would have served next\n"
        "uninterrupted = iter(loader())\n"
        "next(uninterrupted)\n"
        "expected = next(uninterrupted)\n"
        "assert torch.equal(images, expected[0]) and torch.equal(labels, expected[1]), 'the resumed batch differs'\n"
        "print('quickstart ok')\n"
    )
    code = readme_quickstart()
    assert '"photos/"' in code, "the quickstart reads photos/ (the tree this test makes)"
    r = run_block(code + check, tmp_path / "run", materials)
    assert r.returncode == 0, f"the README's quickstart failed (exit {r.returncode}):\n{r.stdout}\n{r.stderr}"
    assert "quickstart ok" in r.stdout
    assert re.search(r"^loss \d+\.\d+$", r.stdout, re.MULTILINE), f"the quickstart prints no loss:\n{r.stdout}"
    assert "resumed batch: (16, 3, 128, 128)" in r.stdout, f"the quickstart prints no resumed batch:\n{r.stdout}"
    assert (tmp_path / "run" / "packs" / "photos" / "manifest.json").is_file(), "the quickstart's pack is not where it says"



def test_the_readme_says_when_audit_exits_1_as_the_command_does(tmp_path):
    """The README's audit sentence: exit 1 for a near twin in another split, 0 for duplicates within splits only
    (the command's rule, not "when there are any"), and so the command exits on a copy within train, then on
    the same copy in val."""
    import shutil

    from click.testing import CliRunner

    from dataprep import build
    from dataprep.cli import main

    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert "exit 1 when a sample has a near twin in another split, 0 when duplicates are only within splits" in text
    tree = tmp_path / "tree"
    make_class_tree(tree / "train", per_class=3)
    shutil.copy(tree / "train" / "cat" / "0.jpg", tree / "train" / "cat" / "copy.jpg")  # a duplicate within train
    build.imagenet(tree, tmp_path / "within", size=64, workers=1)
    r = CliRunner().invoke(main, ["audit", str(tmp_path / "within"), "--no-progress"])
    assert r.exit_code == 0 and "copy.jpg" in r.output, r.output
    (tree / "val" / "cat").mkdir(parents=True)
    shutil.copy(tree / "train" / "cat" / "1.jpg", tree / "val" / "cat" / "1.jpg")  # a twin across splits: a leak
    build.imagenet(tree, tmp_path / "across", size=64, workers=1)
    r = CliRunner().invoke(main, ["audit", str(tmp_path / "across"), "--no-progress"])
    assert r.exit_code == 1, r.output

# A timing in a comment or docstring: "0.2 ms", "~5 us", "30x faster", "2x slower", "1,200 img/s".
TIMING = re.compile(r"\b\d[\d.,]*\s?(ms|us|µs|ns)\b|\b\d[\d.]*x (faster|slower|the cost)\b|\b\d[\d,]*\s?(img|images|samples|tokens)/s\b")


def timing_lines(text: str) -> list[str]:
    """Lines of Python source quoting a timing outside an f-string (what a program prints is not a quote)."""
    return [ln.strip() for ln in text.splitlines() if TIMING.search(ln) and not re.search(r"\bf[\"']", ln)]


def test_code_says_what_and_why_and_leaves_figures_to_docs_benchmarks():
    found = [f"{p.relative_to(ROOT)}: {ln}" for p in sorted((ROOT / "dataprep").rglob("*.py")) for ln in timing_lines(p.read_text())]
    assert len(found) <= 3, "figures belong in docs/benchmarks.md:\n" + "\n".join(found)


def test_the_timing_check_sees_timings():
    """Negative control: lines as the docstrings had them before the figures moved are seen."""
    assert len(timing_lines("0.2-0.4 ms a batch\n# 3x faster than argsorting\n~5 us a key\nprint(f'{r:.0f} img/s')\n")) == 3
