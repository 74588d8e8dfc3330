"""The generated half of docs/api.md: every name of each public package's ``__all__``.

One section per package (``PACKAGES``): a table of every exported name with what it is and
the first line of its docstring, then a mkdocstrings directive that renders the documented
ones in full. Names a public submodule exports beyond its package's ``__all__`` (e.g.
``polgrad_reference.advantages.WHITEN_EPS``) get a table of their own, so a name that is
public anywhere is on the page. Constants have no runtime docstring: theirs is read from
the source (the string literal after the assignment, the attribute-docstring convention
mkdocstrings reads too). ``tools/generate_docs.py`` renders it; ``--check`` fails when the
page is stale, that is when a package's ``__all__`` changed and the page did not.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import itertools
import pkgutil
import re
import types
import typing
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]

PACKAGES: tuple[tuple[str, str], ...] = (
    ("pytest_polgrad", "the kit from plain Python: `assert_conforms`, its report, the checks"),
    ("pytest_polgrad.strategies", "Hypothesis strategies (docs: [strategies.md](strategies.md))"),
    (
        "pytest_polgrad.frameworks",
        "the framework tier's tables (docs: [frameworks.md](frameworks.md))",
    ),
    ("pytest_polgrad.frameworks.verl", "call verl 0.9.1 yourself"),
    ("pytest_polgrad.frameworks.trl", "call TRL 1.16.0 yourself"),
    ("pytest_polgrad.frameworks.openrlhf", "call OpenRLHF 0.11.2 yourself"),
    ("polgrad_reference", "the reference library"),
    ("polgrad_reference.verify", "verification: gradcheck, formula check, bandit, goldens"),
    ("polgrad_reference.diagnostics", "run diagnostics (docs: [diagnostics.md](diagnostics.md))"),
)
"""The packages whose ``__all__`` the page lists, in page order, with a one-line subtitle."""

SUBMODULE_ROOTS = ("polgrad_reference",)
"""Packages whose plain public submodules (not listed above) may export further names."""


def _exported(module: ModuleType) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is None:
        raise SystemExit(f"{module.__name__} has no __all__")
    return sorted(names, key=lambda n: (n.startswith("_"), n.lower()))


@functools.cache
def _module_body(path: Path) -> list[ast.stmt]:
    """A source file's top-level statements, parsed once per run (a file belongs to its
    package and to every package above it)."""
    return ast.parse(path.read_text()).body


def _source_docstrings(package: str) -> dict[str, str]:
    """``name -> docstring`` of every module-level assignment followed by a string literal,
    over the source files of ``package`` (first definition wins)."""
    module = importlib.import_module(package)
    files = [Path(inspect.getfile(module))]
    if hasattr(module, "__path__"):
        files = sorted(Path(next(iter(module.__path__))).rglob("*.py"))
    out: dict[str, str] = {}
    for path in files:
        for node, after in itertools.pairwise(_module_body(path)):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
            elif isinstance(node, ast.AnnAssign):
                target = node.target
            else:
                continue
            if (
                isinstance(target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                out.setdefault(target.id, after.value.value)
    return out


def _first_line(doc: str | None) -> str:
    """The docstring's first paragraph (its first sentence when long), roles dropped."""
    if not doc:
        return ""
    para = " ".join(inspect.cleandoc(doc).split("\n\n", 1)[0].split())
    if len(para) > 200 and ". " in para:
        para = para.split(". ", 1)[0] + "."
    para = re.sub(r":\w+:`~?\.?([^`]+)`", r"``\1``", para)
    return para.replace("|", "\\|")


def _value(obj: object) -> str:
    """A constant without a docstring, shown by its value (short) or its keys."""
    items: list[object] | None = None
    if isinstance(obj, typing.Mapping | tuple | list | frozenset):
        items = list(obj)
    if items is not None and all(isinstance(i, str | int | float) for i in items):
        head = ", ".join(f"``{i}``" for i in items[:8])
        more = f", ... ({len(items)} in all)" if len(items) > 8 else ""
        return ("keys " if isinstance(obj, typing.Mapping) else "") + head + more
    text = repr(obj)
    return f"``{text}``".replace("|", "\\|") if len(text) <= 100 else ""


def _what(obj: object) -> str:
    if inspect.isclass(obj):
        if issubclass(obj, BaseException):
            return "exception"
        return "class"
    if inspect.isfunction(obj) or inspect.isbuiltin(obj):
        return "function"
    if inspect.ismodule(obj):
        return "module"
    if typing.get_origin(obj) is not None or isinstance(obj, types.UnionType):
        return "type alias"
    return f"constant (`{type(obj).__name__}`)"


def _summary(obj: object, name: str, constants: dict[str, str]) -> str:
    if inspect.isclass(obj) or inspect.isfunction(obj) or inspect.ismodule(obj):
        own = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
        return _first_line(own)
    return _first_line(constants.get(name)) or _value(obj)


def _table(package: str, names: list[str], module: ModuleType) -> list[str]:
    root = package.split(".", 1)[0]
    constants = _source_docstrings(root) | _source_docstrings(package)
    rows = ["| name | what | summary |", "|---|---|---|"]
    for name in names:
        obj = getattr(module, name)
        rows.append(f"| `{name}` | {_what(obj)} | {_summary(obj, name, constants)} |")
    return rows


def _directive(package: str, names: list[str]) -> list[str]:
    members = ", ".join(n for n in names if not n.startswith("_"))
    return [
        f"::: {package}",
        "    options:",
        "      show_root_heading: false",
        "      show_root_toc_entry: false",
        f"      members: [{members}]",
    ]


def _extra_names() -> list[tuple[str, str]]:
    """``(module, name)`` exported by a plain public submodule of ``SUBMODULE_ROOTS`` and by
    no package of ``PACKAGES``."""
    listed = {p for p, _ in PACKAGES}
    out = []
    for root in SUBMODULE_ROOTS:
        package = importlib.import_module(root)
        covered = set(package.__all__)
        for info in pkgutil.iter_modules(package.__path__):
            full = f"{root}.{info.name}"
            if info.name.startswith("_") or full in listed:
                continue
            module = importlib.import_module(full)
            out += [(full, n) for n in _exported(module) if n not in covered]
    return out


def render() -> str:
    """The generated block of docs/api.md."""
    out: list[str] = []
    for package, subtitle in PACKAGES:
        module = importlib.import_module(package)
        names = _exported(module)
        out += [
            f"## `{package}`",
            "",
            f"{subtitle[0].upper()}{subtitle[1:]}. {len(names)} names.",
            "",
        ]
        out += _table(package, names, module)
        out += ["", *_directive(package, names), ""]
    extra = _extra_names()
    if extra:
        out += [
            "## Exported by a submodule only",
            "",
            "Public names of a submodule that its package does not re-export; import them "
            "from the module named.",
            "",
            "| name | module | what | summary |",
            "|---|---|---|---|",
        ]
        for full, name in extra:
            module = importlib.import_module(full)
            obj = getattr(module, name)
            constants = _source_docstrings(full)
            out.append(f"| `{name}` | `{full}` | {_what(obj)} | {_summary(obj, name, constants)} |")
        out.append("")
    return "\n".join(out)


def every_public_name() -> list[str]:
    """``package.name`` of every name the page must list (for the tests)."""
    out = []
    for package, _ in PACKAGES:
        out += [f"{package}.{n}" for n in _exported(importlib.import_module(package))]
    return out + [f"{m}.{n}" for m, n in _extra_names()]
