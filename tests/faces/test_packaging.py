"""Packaging: the wheel carries the strategies package (a symlink in the source tree)
as real files, the pytest11 entry point, and the license files; imports run one way."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers.fresh_imports import loaded_after
from tests.helpers.snippet_driver import run_snippets

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("pytest_polgrad-*.whl")
    return built


def test_wheel_contents(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    sources = sorted(p.name for p in (ROOT / "strategies").glob("*.py"))
    packed = sorted(n.split("/")[-1] for n in names if n.startswith("pytest_polgrad/strategies/"))
    assert packed == sources  # each file exactly once, as a real file
    assert "polgrad_reference/loss.py" in names
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "polgrad = pytest_polgrad.plugin" in zipfile.ZipFile(wheel).read(entry).decode()
    assert any(n.endswith("licenses/LICENSE") for n in names)
    assert any(n.endswith("licenses/NOTICE") for n in names)


def test_strategies_import_from_the_wheel(wheel: Path, tmp_path: Path) -> None:
    """In the suite's snippet interpreter (``tests/helpers/snippet_driver.py``: another process,
    the source tree's kit not imported, ``fresh_kit``), the wheel first on ``sys.path``."""
    code = (
        f"import sys; sys.path.insert(0, {str(wheel)!r})\n"
        "import pytest_polgrad.strategies as s, polgrad_reference as r\n"
        f"assert s.__file__.startswith({str(wheel)!r}), s.__file__\n"
        f"assert r.__file__.startswith({str(wheel)!r}), r.__file__\n"
        "print(len(s.__all__))\n"
    )
    out = run_snippets([("wheel", code, str(tmp_path))], tmp_path, fresh_kit=True)["wheel"]
    assert not out.startswith("FAILED"), out
    assert int(out) > 5


def test_reference_imports_only_torch() -> None:
    """In a fresh interpreter (``tests/helpers/fresh_imports.py``)."""
    names = ("pytest", "hypothesis", "syrupy", "pytest_polgrad")
    loaded = loaded_after("polgrad_reference")
    assert "torch" in loaded  # the interpreter did import the package
    bad = [m for m in names if m in loaded]
    assert not bad, bad


def test_plugin_modules_import_no_torch() -> None:
    """What pytest loads for every session (the plugin, its collection, options, the
    snapshot guard, the kinds registry) imports neither torch nor Hypothesis."""
    code = (
        "import sys, pytest_polgrad.plugin, pytest_polgrad.pytest.collect,"
        " pytest_polgrad.pytest.guard,"
        " pytest_polgrad.core.options, pytest_polgrad.core.kinds;"
        "bad = [m for m in ('torch', 'hypothesis', 'polgrad_reference') if m in sys.modules];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
