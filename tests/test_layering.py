"""The layout is the architecture: an AST pass over dataprep/ finds every import (function-level ones
included) and holds the package to ARCHITECTURE.md's rules; a fresh interpreter shows that building
never imports torch."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "dataprep"
KINDS = ("images", "segmentation", "volumes", "tokens", "tables", "detection", "video")
# Between kinds, imports run only toward images/ (segmentation, volumes, detection and video build on its pixel stages).
MAY_IMPORT = {"segmentation": {"images"}, "volumes": {"images"}, "detection": {"images"}, "video": {"images"}}
KIND_FREE = ("pack", "serve", "engine", "remote", "audit")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _run_time_nodes(tree: ast.AST):
    """Every node of `tree` but those under `if TYPE_CHECKING:`: imports there are for type checkers and
    IDEs and never run, so they can make no circle and break no layer."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                stack.extend(child.orelse)
            else:
                stack.append(child)


def imports(path: Path, source: str | None = None) -> set[str]:
    """Every dataprep module `path` (or `source` read as if it stood there) imports at run time, wherever in
    the file the import stands."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in _run_time_nodes(ast.parse(path.read_text() if source is None else source)):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("dataprep")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not mod.startswith("dataprep"):
                continue
            # `from pkg import sub` imports the module pkg.sub when there is one
            subs = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in MODULES or f"{mod}.{a.name}" in COMPILED]
            out |= set(subs) if subs and len(subs) == len(node.names) else {mod, *subs}
    out.discard(name)
    return {m for m in out if m in MODULES}


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}
COMPILED = {module_name(p.with_suffix(".py")) for p in ROOT.rglob("*.c")}  # C extensions: `from . import _jpegseg` is a submodule
GRAPH = {m: imports(p) for m, p in MODULES.items()}


def top(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_the_graph_is_read():
    """Negative control for the rules below: the AST pass sees known edges, lazy ones included."""
    assert "dataprep.pack.fields" in GRAPH["dataprep.images.field"]
    assert "dataprep.serve.cache" in GRAPH["dataprep.images.holding"]
    assert "dataprep.images.process" in GRAPH["dataprep.images.build"]  # imported inside a function
    assert "dataprep.serve.loader" not in GRAPH["dataprep"]  # named under `if TYPE_CHECKING:` only: never run
    assert len(MODULES) > 60


def test_no_import_circles():
    cycles, state = [], {}

    def visit(m, stack):
        state[m] = "open"
        for n in sorted(GRAPH[m]):
            if state.get(n) == "open":
                cycles.append(stack[stack.index(n):] + [n])
            elif n not in state:
                visit(n, stack + [n])
        state[m] = "done"

    for m in sorted(GRAPH):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import circles: " + "; ".join(" -> ".join(c) for c in cycles)


def back_arrows(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports of a package that holds the importer (`from .. import name` where the name lives in an
    `__init__.py`): code below a package reaching back up into it, where circles start."""
    return sorted((m, n) for m, deps in graph.items() for n in deps if m.startswith(n + "."))


def test_no_import_runs_back_up_to_a_package_that_holds_it():
    assert not back_arrows(GRAPH), back_arrows(GRAPH)
    assert not GRAPH["dataprep.version"]  # a leaf: what records the version imports nothing else through it


def test_a_back_arrow_is_caught():
    """Negative control: the version read from the package root, as the builds once did, is a back-arrow;
    a sibling submodule read through the package (`from .. import build`) and a C extension are not."""
    below = MODULES["dataprep.tables.build"]
    assert imports(below, "from .. import __version__\n") == {"dataprep"}
    assert imports(below, "from .. import build\n") == {"dataprep.build"}
    assert imports(MODULES["dataprep.images.codec"], "from . import _jpegseg\n") == set()
    planted = {**GRAPH, "dataprep.tables.build": GRAPH["dataprep.tables.build"] | {"dataprep"}}
    assert back_arrows(planted) == [("dataprep.tables.build", "dataprep")]


@pytest.mark.parametrize("layer", KIND_FREE)
def test_kind_free_layers_import_no_kind(layer):
    bad = sorted((m, n) for m, deps in GRAPH.items() if top(m) == layer for n in deps
                 if top(n) in KINDS or n in ("dataprep.kinds", "dataprep.verify", "dataprep.driver") or top(n) in ("cli", "bench"))
    assert not bad, bad


def test_the_shard_driver_and_settings_know_no_kind():
    for m in ("dataprep.driver", "dataprep.settings", "dataprep.sources", "dataprep.errors", "dataprep.kinds", "dataprep.text",
              "dataprep.limits", "dataprep.safe_paths", "dataprep.progress"):
        bad = sorted(n for n in GRAPH[m] if top(n) in KINDS)
        assert not bad, (m, bad)


def test_between_kinds_imports_run_only_toward_images():
    bad = sorted((m, n) for m, deps in GRAPH.items() if top(m) in KINDS for n in deps
                 if top(n) in KINDS and top(n) != top(m) and top(n) not in MAY_IMPORT.get(top(m), set()))
    assert not bad, bad


def test_kinds_reach_only_kind_free_layers_and_errors():
    # text: tokenizers for tokens and captions; limits, safe_paths, progress: rules every kind's build follows;
    # version: the string a manifest records
    allowed = set(KIND_FREE) | {"errors", "driver", "settings", "sources", "text", "limits", "safe_paths", "progress", "version", ""}
    bad = sorted((m, n) for m, deps in GRAPH.items() if top(m) in KINDS for n in deps
                 if top(n) not in KINDS and top(n) not in allowed)
    assert not bad, bad


def third_party(path: Path, source: str | None = None) -> set[str]:
    """The top-level packages `path` (or `source` read as if it stood there) imports by absolute name,
    anywhere in the file, `if TYPE_CHECKING:` included."""
    tree = ast.parse(path.read_text() if source is None else source)
    names = {a.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    return names | {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module and not node.level}


def may_import_torch(m: str) -> bool:
    """ARCHITECTURE.md's torch rule: a kind's dataset.py, packed.py, transforms.py and dali.py (what serves batches),
    its attention.py (masks over served batches), serve/, gpu.py, lightning.py and bench/ (the serving
    benchmarks); building never."""
    return (top(m) in KINDS and m.rsplit(".", 1)[-1] in {"dataset", "packed", "dali", "transforms", "attention"}) or top(m) in ("serve", "bench") \
        or m in ("dataprep.gpu", "dataprep.lightning")


def test_torch_is_imported_only_by_serving_modules():
    importers = {m for m, p in MODULES.items() if "torch" in third_party(p)}
    assert sorted(m for m in importers if not may_import_torch(m)) == []
    assert {"dataprep.images.dataset", "dataprep.serve.loader", "dataprep.gpu", "dataprep.lightning"} <= importers


def test_fsspec_is_imported_only_by_remote_urls():
    """remote/urls.py is where a missing backend is named with its extra; every other module reaches the
    store through it."""
    assert sorted(m for m, p in MODULES.items() if "fsspec" in third_party(p)) == ["dataprep.remote.urls"]


def test_pyav_is_imported_only_by_video_read():
    """The video extra's decoder: one module imports it, and says how to install it when it is missing."""
    assert sorted(m for m, p in MODULES.items() if "av" in third_party(p) and top(m) != "synthetic") == ["dataprep.video.read"]


def test_the_import_rules_can_fail():
    """Negative control: an fsspec import inside a method, and torch imported by a build module or a
    kind-free layer, are seen."""
    store = MODULES["dataprep.remote.store"]
    assert "fsspec" in third_party(store, "def f():\n    from fsspec.asyn import sync\n")
    assert "torch" in third_party(MODULES["dataprep.images.build"], "import torch.nn.functional as F\n")
    assert not may_import_torch("dataprep.images.build") and not may_import_torch("dataprep.remote.store")
    assert not may_import_torch("dataprep.audit.pack") and may_import_torch("dataprep.volumes.transforms")


BUILD_MODULES = sorted(m for m in MODULES if m.rsplit(".", 1)[-1] in ("build", "tokenize", "read", "columns", "pairs", "masks",
                                                                        "process", "decode", "resize", "codec", "field")
                       or top(m) in ("pack", "engine", "remote") or m in ("dataprep.driver", "dataprep.verify", "dataprep.kinds",
                                                                 "dataprep.sources", "dataprep.text", "dataprep.cli.build"))


def test_building_never_imports_torch():
    code = ("import importlib, sys\n"
            f"for m in {BUILD_MODULES!r}:\n"
            "    importlib.import_module(m)\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"building imported torch: {out.stdout[:300]}"
    assert len(BUILD_MODULES) > 25


def test_the_torch_check_can_fail():
    """Negative control: a serving module does pull torch in, and the same check sees it."""
    code = "import sys, dataprep.images.dataset\nprint('torch' in sys.modules)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True", out.stderr
