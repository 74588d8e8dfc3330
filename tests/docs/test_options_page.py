"""docs/options.md lists every option the code defines, with the code's defaults.

The marker keywords are the init fields of ``ConformanceOptions`` and each kind's override
keywords; the command-line and ini options are read from ``pytest_polgrad/plugin.py``'s
``addoption``/``addini`` calls and the ``which`` CLI's ``add_argument`` calls (by AST, so an
option added anywhere in those modules counts).
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from pytest_polgrad.core.kinds import KINDS
from pytest_polgrad.core.options import PROFILES, ConformanceOptions, override_keys

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "options.md").read_text(encoding="utf-8")


def _calls(path: Path, method: str) -> list[str]:
    """First string argument of every ``<obj>.<method>("...")`` call in ``path``."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == method
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names.append(node.args[0].value)
    return names


def _rows(text: str) -> dict[str, list[str]]:
    """Table rows keyed by the first backticked word of their first cell."""
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        m = re.match(r"`([^` ]+)", cells[0]) if line.startswith("|") else None
        if m:
            rows.setdefault(m.group(1), cells)
    return rows


def _rendered(value: object) -> str:
    """A default as the page writes it: ``"sequence"``, ``1.0``, ``False``, ``None``."""
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, dict):
        return "`{}`" if not value else f"`{value!r}`"
    return f"`{value!r}`"


MARKER_SECTION = PAGE.split("## Marker keywords", 1)[1].split("### Overrides", 1)[0]
OPTION_FIELDS = [f for f in dataclasses.fields(ConformanceOptions) if f.init]


@pytest.mark.parametrize("field", OPTION_FIELDS, ids=lambda f: f.name)
def test_every_marker_keyword_has_a_row_with_its_default(field: dataclasses.Field) -> None:  # type: ignore[type-arg]
    rows = _rows(MARKER_SECTION)
    assert field.name in rows, f"docs/options.md has no row for marker keyword {field.name!r}"
    if field.default is not dataclasses.MISSING:
        default = field.default
    elif field.default_factory is not dataclasses.MISSING:
        default = field.default_factory()
    else:
        assert "required" in rows[field.name][1], field.name
        return
    assert rows[field.name][1] == _rendered(default), (
        f"docs/options.md says {field.name} defaults to {rows[field.name][1]}, "
        f"the code says {_rendered(default)}"
    )


def test_every_kind_and_its_overrides_are_listed() -> None:
    section = PAGE.split("### Overrides", 1)[1].split("## Command line", 1)[0]
    for kind in KINDS:
        (row,) = [
            ln
            for ln in section.splitlines()
            if ln.startswith("|") and f"`{kind}`" in ln.split("|")[1]
        ]
        listed = set(re.findall(r"`(\w+)`", row.split("|")[2]))
        assert listed >= set(override_keys(kind)), (kind, set(override_keys(kind)) - listed)
        assert f'`"{kind}"`' in MARKER_SECTION, kind


def test_every_command_line_and_ini_option_is_listed() -> None:
    plugin = ROOT / "pytest_polgrad" / "plugin.py"
    flags = _calls(plugin, "addoption")
    inis = _calls(plugin, "addini")
    assert flags and inis  # the AST walk found the plugin's options at all
    section = PAGE.split("## Command line and ini", 1)[1]
    for name in [*flags, *inis]:
        assert re.search(rf"`{re.escape(name)}\b", section), f"{name} is not on docs/options.md"
    for profile, budget in PROFILES.items():
        assert f"`{profile}` = {budget}" in section, profile


def test_every_which_option_is_listed() -> None:
    args = [a for a in _calls(ROOT / "pytest_polgrad" / "__main__.py", "add_argument")]
    section = PAGE.split("## `python -m pytest_polgrad which`", 1)[1]
    options = [a for a in args if a.startswith("--")]
    assert options
    for name in options:
        assert f"`{name}" in section, f"which {name} is not on docs/options.md"


def test_the_page_check_would_catch_a_missing_row() -> None:
    """The row parser is not vacuous: removing a row or changing a default is noticed."""
    without = MARKER_SECTION.replace("| `holes` |", "| holes |")
    assert "holes" not in _rows(without) and "holes" in _rows(MARKER_SECTION)
    assert _rows(MARKER_SECTION)["max_batch"][1] == _rendered(64)
    assert _rendered(65) != _rendered(64)


def test_every_assert_conforms_keyword_is_listed_with_its_default() -> None:
    import inspect

    from pytest_polgrad import assert_conforms

    section = PAGE.split("## `assert_conforms`'s own keywords", 1)[1].split("\n## ", 1)[0]
    rows = _rows(section)
    own = [
        p
        for p in inspect.signature(assert_conforms).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    assert {p.name for p in own} == {"seed", "max_examples", "name"}
    for param in own:
        assert param.name in rows, f"docs/options.md has no assert_conforms row {param.name!r}"
        assert rows[param.name][1] == _rendered(param.default), param.name
