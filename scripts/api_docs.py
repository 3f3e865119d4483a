"""The API reference: takes the public names of `dataprep` (its `__all__`), `dataprep.build`, `dataprep.gpu`
and, where Lightning is installed, `dataprep.lightning`; gives HTML pages generated from their docstrings
(pdoc, Google style: Args / Returns sections) in OUT. Any warning fails the build (exit 1): pdoc's own
(a name that does not resolve, an annotation it cannot read) and the docstring check's (an `Args:` entry
that names no parameter of the callable, an empty section).

    python scripts/api_docs.py build/api      # what `make docs` runs; open build/api/index.html
"""
from __future__ import annotations

import importlib
import inspect
import re
import sys
import typing
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

SECTION = re.compile(r"^(Args|Arguments|Returns|Yields|Raises|Attributes|Example|Examples|Note|Notes):\s*$")
# An Args entry: `name:`, `name (type):`, or the house's `a, b: as for X` for parameters that share a meaning.
TAG = re.compile(r"<[A-Za-z/][^<>]*>")  # Markdown passes `<class>` through as HTML: the reader sees nothing
ENTRY = re.compile(r"^(\*{0,2}\w+(?:,\s*\*{0,2}\w+)*)(?:\s*\([^)]*\))?:(\s|$)")


def modules() -> list[str]:
    """The modules to hand pdoc; it adds the submodules `dataprep.__all__` names (`build`, `gpu`).

    Returns:
        Their import names; `dataprep.lightning` only where Lightning imports.
    """
    names = ["dataprep"]
    try:
        importlib.import_module("dataprep.lightning")
    except ImportError:
        return names
    return [*names, "dataprep.lightning"]


def public() -> Iterator[tuple[str, Any]]:
    """Every public name of the reference with its object.

    Returns:
        An iterator of `(qualified name, object)`: `dataprep.NAME` for each name of `dataprep.__all__`,
        `dataprep.build.NAME` for each function of the front door.
    """
    import dataprep
    from dataprep import build

    for name in dataprep.__all__:
        yield f"dataprep.{name}", getattr(dataprep, name)
    for name in build.__all__:
        obj = getattr(build, name)
        if inspect.isfunction(obj):
            yield f"dataprep.build.{name}", obj


def members(name: str, cls: type) -> Iterator[tuple[str, Any]]:
    """The public methods and properties a public class defines itself (not those it inherits).

    Args:
        name: The class's qualified name.
        cls: The class.

    Returns:
        An iterator of `(qualified name, function or property)`; a property, documented as a value, needs
        no Args or Returns.
    """
    for attr, value in vars(cls).items():
        if attr.startswith("_"):
            continue
        if isinstance(value, (classmethod, staticmethod)):
            value = value.__func__
        if inspect.isfunction(value) or isinstance(value, property):
            yield f"{name}.{attr}", value


def parameters(obj: Any) -> list[str] | None:
    """The names a caller passes to `obj` (a class: its constructor), without `self`.

    Args:
        obj: A function or class.

    Returns:
        The names, `*args` and `**options` with their stars; None where Python has no signature for it.
    """
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    stars = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    return [stars.get(p.kind, "") + p.name for p in sig.parameters.values() if p.name not in ("self", "cls")]


def sections(doc: str) -> dict[str, list[str]]:
    """A Google-style docstring's sections.

    Args:
        doc: The docstring, dedented (`inspect.getdoc`).

    Returns:
        Each section's title (`Args`, `Returns`, ...) mapped to its lines, without the title.
    """
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in doc.splitlines():
        m = SECTION.match(line)
        if m:
            current = out.setdefault(m.group(1), [])
        elif current is not None and (not line.strip() or line.startswith(" ")):
            current.append(line)
        else:
            current = None  # unindented text ends a section
    return out


def args_named(lines: list[str]) -> list[str]:
    """The parameter names an `Args:` section documents: its entries at the first indent.

    Args:
        lines: The section's lines.

    Returns:
        The names, in order; an entry `a, b: ...` gives both.
    """
    indents = [len(ln) - len(ln.lstrip()) for ln in lines if ln.strip()]
    if not indents:
        return []
    first = min(indents)
    return [name.strip() for ln in lines if ln.strip() and len(ln) - len(ln.lstrip()) == first
            if (m := ENTRY.match(ln.strip())) for name in m.group(1).split(",")]


def format_problems(name: str, obj: Any) -> list[str]:
    """What in the docstring of `obj` renders wrong: an empty section, an `Args:` entry naming no parameter,
    a `<name>` outside backticks.

    Args:
        name: The qualified name, for the message.
        obj: The public object.

    Returns:
        One message a problem; empty when there is none.
    """
    doc = inspect.getdoc(obj) or ""
    found = sections(doc)
    problems = [f"{name}: the {title}: section is empty" for title, lines in found.items() if not any(ln.strip() for ln in lines)]
    problems += [f"{name}: {tag} renders as an HTML tag, not as text: put it in backticks"
                 for tag in TAG.findall(re.sub(r"`[^`]*`", "", doc))]
    params = parameters(obj) if callable(obj) else None
    if "Args" in found and params is not None:
        known = set(params) | {p.lstrip("*") for p in params}
        problems += [f"{name}: Args: names {arg!r}, which is not a parameter ({', '.join(params) or 'none'})"
                     for arg in args_named(found["Args"]) if arg not in known]
    return problems


def missing_sections(obj: Any) -> list[str]:
    """What the docstring of `obj` lacks: a one-line summary, `Args:` naming each parameter where it takes
    arguments, `Returns:` (or `Yields:`) where it is a function that returns something.

    Args:
        obj: A public function or class.

    Returns:
        The missing parts: `summary`, `Args`, `Args: NAME` for a parameter left out, `Returns`; empty when
        none is.
    """
    doc = inspect.getdoc(obj) or ""
    found = sections(doc)
    missing = [] if doc.strip() and not SECTION.match(doc.splitlines()[0]) else ["summary"]
    params = parameters(obj)
    if params and "Args" not in found:
        missing.append("Args")
    elif params:
        named = set(args_named(found["Args"]))
        missing += [f"Args: {p}" for p in params if p not in named and p.lstrip("*") not in named]
    if inspect.isfunction(obj):
        returns = inspect.signature(obj).return_annotation
        if returns not in (None, "None") and not {"Returns", "Yields"} & found.keys():
            missing.append("Returns")
    return missing


_FORMAT = inspect.formatannotation  # inspect's own, which `annotation` stands in for while pdoc runs


def annotation(a: Any, *args: Any, **kw: Any) -> str:
    """An annotation as the reference writes it in a signature: `Unpack[ImageOptions]` as the front door
    spells it (Python 3.11 writes `*<class 'dataprep.options.ImageOptions'>`), the rest as `inspect` does.

    Args:
        a: The annotation.
        *args: What `inspect.formatannotation` takes beside it (the base module).
        **kw: Its keywords, as inspect passes them.

    Returns:
        Its text; pdoc links the names in it that the reference documents.
    """
    from dataprep.build import Unpack

    if typing.get_origin(a) is Unpack:
        return f"Unpack[{_FORMAT(typing.get_args(a)[0], *args, **kw)}]"
    return _FORMAT(a, *args, **kw)


def build(out: Path) -> list[str]:
    """Write the reference into `out`.

    Args:
        out: The folder for the HTML pages (made if absent).

    Returns:
        Every warning raised while building, as text; empty when the build is clean.
    """
    import pdoc
    import pdoc.render

    import dataprep

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        names = dict(public())
        # The package's names load lazily (its __getattr__); pdoc reads them from the module's namespace.
        for name in dataprep.__all__:
            vars(dataprep).setdefault(name, names[f"dataprep.{name}"])
        methods = [m for name, obj in names.items() if inspect.isclass(obj) for m in members(name, obj)]
        problems = [p for name, obj in [*names.items(), *methods] for p in format_problems(name, obj)]
        pdoc.render.configure(docformat="google", show_source=False, footer_text="dataprep " + dataprep.__version__)
        inspect.formatannotation = annotation  # what a parameter's str(), and so pdoc's signatures, write with
        try:
            pdoc.pdoc(*modules(), output_directory=out)
        finally:
            inspect.formatannotation = _FORMAT
    return [f"{w.category.__name__}: {w.message}" for w in caught] + problems


def main(argv: list[str] | None = None, say: Callable[[str], None] = print) -> int:
    """Build the reference into the folder named by the first argument.

    Args:
        argv: The command line without the program name; `sys.argv[1:]` when None.
        say: Where messages go.

    Returns:
        0 when the build is clean, 1 when it warned, 2 for a usage error.
    """
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        say("usage: python scripts/api_docs.py OUT")
        return 2
    out = Path(args[0])
    warned = build(out)
    for w in warned:
        say(f"api_docs: {w}")
    if warned:
        say(f"api_docs: {len(warned)} warnings; the reference is not clean")
        return 1
    say(f"api_docs: the reference is in {out}/index.html")
    return 0


if __name__ == "__main__":
    sys.exit(main())
