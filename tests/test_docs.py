"""The documentation holds together: every relative link in README.md, ARCHITECTURE.md and docs/*.md
names a file that exists (and an #anchor a heading of it), the README stays a landing page of at most
200 lines, every page under docs/ is reachable from docs/index.md and from the README, and the README's
quickstart runs as printed on a small generated class-folder tree."""
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README_MAX_LINES = 200
MIN_PAGES = 6
QUICKSTART_MAX_LINES = 25
QUICKSTART_SRC = re.compile(r'^src = "[^"\n]*"', re.MULTILINE)  # the one line naming the quickstart's source folder

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


def readme_quickstart() -> str:
    """The README's first ```python block: its quickstart."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(r"^```python\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    assert m, "README.md has no ```python block (its quickstart)"
    return m.group(1)


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


def test_readme_quickstart_is_short():
    lines = readme_quickstart().splitlines()
    assert len(lines) <= QUICKSTART_MAX_LINES, f"the quickstart has {len(lines)} lines, more than {QUICKSTART_MAX_LINES}"


def test_readme_quickstart_runs(tmp_path):
    """The quickstart, its `src = "..."` line pointed at a generated tree, run in a fresh interpreter in an empty
    directory: it builds its pack there, trains a step, and its restored Loader serves the second batch of the
    uninterrupted run (what the appended check compares, through the quickstart's own `loader()`)."""
    tree = tmp_path / "tree"
    make_class_tree(tree)
    code, n = QUICKSTART_SRC.subn(f"src = {str(tree) + os.sep!r}", readme_quickstart())
    assert n == 1, 'the quickstart names its source folder in exactly one line `src = "..."`, which this test replaces'
    check = (
        "\n# the README's claim: the restored Loader serves the batch the run would have served next\n"
        "uninterrupted = iter(loader())\n"
        "next(uninterrupted)\n"
        "expected = next(uninterrupted)\n"
        "assert torch.equal(images, expected[0]) and torch.equal(labels, expected[1]), 'the resumed batch differs'\n"
        "print('quickstart ok')\n"
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    script = run_dir / "quickstart.py"
    script.write_text(code + check, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    r = subprocess.run([sys.executable, script.name], check=False, cwd=run_dir, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, f"the README's quickstart failed (exit {r.returncode}):\n{r.stdout}\n{r.stderr}"
    assert "quickstart ok" in r.stdout
    assert (run_dir / "packs" / "photos" / "manifest.json").is_file(), "the quickstart's pack is not where it says"


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
