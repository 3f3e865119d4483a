"""dataprep/__init__.py names its public API twice: `_LAZY` (what `__getattr__` imports on first use, and
so `__all__`) and the `if TYPE_CHECKING:` imports (what IDEs and type checkers see). These tests hold the
two to each other: the same names both ways, each naming the same object."""
import ast
import importlib
from pathlib import Path

import pytest

import dataprep

INIT = Path(dataprep.__file__)
EAGER = {"DataprepError", "PackError", "UsageError", "__version__"}  # imported when the package is


def type_checking_names(source: str) -> dict[str, tuple[str, str | None]]:
    """Each name the `if TYPE_CHECKING:` block of `source` binds, as `_LAZY` writes it: (module, attribute),
    the attribute None where the name is a submodule."""
    out: dict[str, tuple[str, str | None]] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.level == 1, f"not a `from .x import y`: {ast.unparse(imp)}"
                for a in imp.names:
                    name = a.asname or a.name
                    out[name] = (f"dataprep.{a.name}", None) if imp.module is None else (f"dataprep.{imp.module}", a.name)
    return out


def disagreements(lazy: dict, typed: dict) -> list[str]:
    """The names on one side only, or naming another object on each side."""
    return sorted(f"{n}: _LAZY {lazy.get(n)}, TYPE_CHECKING {typed.get(n)}" for n in set(lazy) | set(typed) if lazy.get(n) != typed.get(n))


TYPED = type_checking_names(INIT.read_text())


def test_the_lazy_table_and_its_type_checking_twin_agree():
    assert len(TYPED) > 25
    assert disagreements(dataprep._LAZY, TYPED) == []
    assert set(dataprep.__all__) == set(dataprep._LAZY) | EAGER and len(dataprep.__all__) == len(set(dataprep.__all__))


@pytest.mark.parametrize("name", sorted(TYPED))
def test_each_lazy_name_is_the_object_its_import_names(name):
    mod, attr = TYPED[name]
    module = importlib.import_module(mod)
    assert getattr(dataprep, name) is (module if attr is None else getattr(module, attr))


def test_a_name_on_one_side_only_is_caught():
    """Negative control: a name dropped from either side, or pointed at another object, is named."""
    source = INIT.read_text()
    dropped = source.replace("    from .serve.mixture import Mixture\n", "")
    assert dropped != source
    assert disagreements(dataprep._LAZY, type_checking_names(dropped)) == [
        "Mixture: _LAZY ('dataprep.serve.mixture', 'Mixture'), TYPE_CHECKING None"]
    lazy = {n: v for n, v in dataprep._LAZY.items() if n != "Partition"}
    assert disagreements(lazy, TYPED) == ["Partition: _LAZY None, TYPE_CHECKING ('dataprep.serve.partition', 'Partition')"]
    swapped = source.replace("from .images.crops import CenterCrop, RandomResizedCrop",
                             "from .images.crops import RandomResizedCrop\n    from .gpu import CenterCrop")
    assert swapped != source
    assert disagreements(dataprep._LAZY, type_checking_names(swapped)) == [
        "CenterCrop: _LAZY ('dataprep.images.crops', 'CenterCrop'), TYPE_CHECKING ('dataprep.gpu', 'CenterCrop')"]
