"""The layers of docs/architecture.md are a checked contract (``[tool.importlinter]`` in
pyproject.toml, run by ``make lint``): the tree keeps it, and an added circle or upward
import breaks it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter not installed")


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [str(LINT), "--config", str(tree / "pyproject.toml"), "--no-cache"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _copy(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("pytest_polgrad", "polgrad_reference"):
        shutil.copytree(ROOT / name, tree / name, symlinks=False)  # strategies resolved
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    return tree


def _append(path: Path, line: str) -> None:
    path.write_text(path.read_text() + "\n" + line + "\n")


def test_the_tree_keeps_every_contract(tmp_path: Path) -> None:
    result = _lint(_copy(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_an_added_circle_breaks_the_contract(tmp_path: Path) -> None:
    tree = _copy(tmp_path)
    # tolerance (core) importing the policy-loss checks, which import tolerance: a circle
    # and an upward import at once
    _append(
        tree / "pytest_polgrad/core/tolerance.py", "import pytest_polgrad.kinds.policy_loss.checks"
    )
    result = _lint(tree)
    assert result.returncode != 0, result.stdout
    assert "BROKEN" in result.stdout
    assert (
        "pytest_polgrad.core.tolerance -> pytest_polgrad.kinds.policy_loss.checks" in result.stdout
    )


def test_a_kind_importing_another_kind_breaks_the_independence(tmp_path: Path) -> None:
    tree = _copy(tmp_path)
    _append(tree / "pytest_polgrad/kinds/kl.py", "import pytest_polgrad.kinds.entropy")
    result = _lint(tree)
    assert result.returncode != 0, result.stdout
    assert "the kinds are independent of one another BROKEN" in result.stdout
