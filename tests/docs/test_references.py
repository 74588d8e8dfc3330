"""Every test the docs and the code's docstrings name exists.

The audit of issue 13 found references to tests that did not exist (``surrogates.py``
citing a missing ``tests/reference/test_surrogates.py``, a stale test name in docs/strategies.md).
A claim enforced by a test that is not there is not enforced, so every ``tests/...py`` and
``tests/...py::name`` in docs/, README.md, polgrad_reference/, strategies/ and
pytest_polgrad/ must name a file and a function or class in it. A bare ``::name`` refers
to the last file named before it in the same document.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(
    [
        ROOT / "README.md",
        *ROOT.glob("docs/**/*.md"),
        *ROOT.glob("polgrad_reference/**/*.py"),
        *ROOT.glob("pytest_polgrad/**/*.py"),
        *ROOT.glob("strategies/**/*.py"),
    ]
)
REF = re.compile(r"([\w/]+\.py)?::(\w+)|(tests/[\w/]+\.py)")
USER_PROJECT = {
    # files of the reader's own project in the examples (docs/quickstart.md, README.md,
    # docs/conformance.md), not of this repository
    "tests/test_loss_conformance.py",
    "tests/test_step_conformance.py",
    "tests/test_my_properties.py",
    "tests/test_polgrad_verl_adapter.py",  # docs/frameworks.md, marking framework code
    "tests/test_polgrad_verl.py",
    "tests/test_polgrad_openrlhf.py",
    "tests/test_polgrad_verl_entry_points.py",  # docs/frameworks.md, "Call it yourself"
    "tests/test_polgrad_trl_entry_points.py",
    "tests/test_polgrad_openrlhf_entry_points.py",
    "tests/test_polgrad_deviations.py",
}


@functools.cache
def _names(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return frozenset(n.name for n in ast.walk(tree) if isinstance(n, kinds))


def _in_tests(name: str) -> str | None:
    """``tests/...`` path of a file named without its directory (None: not a test file)."""
    found = sorted(ROOT.glob(f"tests/**/{name}"))
    return str(found[0].relative_to(ROOT)) if len(found) == 1 else None


def dangling(text: str) -> list[str]:
    """References in ``text`` to a missing test file or a missing name in one."""
    bad, last = [], None
    for m in REF.finditer(text):
        path = m.group(1) or m.group(3)
        if path is not None and not path.startswith("tests/"):
            path = _in_tests(path)  # ``test_x.py::name``: a file under tests/, or not ours
            if path is None:
                continue
        if path is not None:
            last = path
            if path in USER_PROJECT:
                continue
            if not (ROOT / path).is_file():
                bad.append(m.group(0))
                continue
        name = m.group(2)
        if name is None or last is None or last in USER_PROJECT:
            continue
        if not name.startswith(("test_", "Test")):
            continue  # ``module::function`` of something else, e.g. verl's files
        if (ROOT / last).is_file() and name not in _names(ROOT / last):
            bad.append(f"{last}::{name}")
    return bad


BARE = re.compile(r"`(test_\w+)`")


@functools.cache
def _all_test_names() -> frozenset[str]:
    return frozenset().union(*(_names(p) for p in ROOT.glob("tests/**/*.py")))


def unknown_bare_names(markdown: str) -> list[str]:
    """Backticked ``test_name``s of a page that no test file (nor the page's own code
    blocks) defines."""
    own = set(re.findall(r"def (test_\w+)", markdown))
    return [n for n in BARE.findall(markdown) if n not in own and n not in _all_test_names()]


@pytest.mark.parametrize(
    "page", [p for p in SOURCES if p.suffix == ".md"], ids=lambda p: str(p.relative_to(ROOT))
)
def test_every_bare_test_name_on_a_page_exists(page: Path) -> None:
    bad = unknown_bare_names(page.read_text(encoding="utf-8"))
    assert not bad, f"{page.relative_to(ROOT)} names tests that do not exist: {bad}"


def test_the_bare_name_scan_finds_a_stale_name() -> None:
    page = "(`test_same_seed_gives_identical_tensors_in_other_processes`)"
    assert unknown_bare_names(page) == [page[2:-2]]
    assert unknown_bare_names("`test_same_seed_gives_identical_tensors_in_another_process`") == []


def test_user_project_files_are_not_in_this_repository() -> None:
    assert not [p for p in USER_PROJECT if (ROOT / p).exists()]


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_named_test_exists(source: Path) -> None:
    bad = dangling(source.read_text(encoding="utf-8"))
    assert not bad, f"{source.relative_to(ROOT)} names tests that do not exist: {bad}"


def test_the_scan_finds_a_dangling_reference() -> None:
    text = (
        "`tests/reference/test_losses.py::test_clip_region_equals_autograd_zero_tokens`, "
        "`::test_gspo_token_gradient_is_token_local`; `tests/reference/test_losses.py::test_gone`, "
        "`::test_also_gone`, `tests/test_nowhere.py`, `test_all_components.py::test_gone`, "
        "`core_algos.py::compute_policy_loss`"
    )
    assert dangling(text) == [
        "tests/reference/test_losses.py::test_gone",
        "tests/reference/test_losses.py::test_also_gone",
        "tests/test_nowhere.py",
        "tests/frameworks/test_all_components.py::test_gone",
    ]
