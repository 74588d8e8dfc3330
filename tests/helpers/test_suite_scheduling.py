"""The suite's own xdist scheduling (tests/conftest.py): every test module with a
module- or session-scoped fixture runs on one worker, so the fixture is built once."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ONE_WORKER

TESTS = Path(__file__).resolve().parents[1]


def _scoped_fixture_modules() -> set[str]:
    found = set()
    for path in sorted(TESTS.rglob("test_*.py")):
        if "frameworks" in path.parts:  # the frameworks tier (its own run)
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "scope":
                value = node.value
                if isinstance(value, ast.Constant) and value.value in ("module", "session"):
                    found.add(path.relative_to(TESTS.parent).as_posix())
    return found


def test_every_module_with_a_module_scoped_fixture_runs_on_one_worker() -> None:
    scoped = {p for p in _scoped_fixture_modules() if "/frameworks/" not in p}
    assert scoped, "no module-scoped fixture found: the scan is broken"
    assert scoped == set(ONE_WORKER), (
        f"add to tests/conftest.py ONE_WORKER: {sorted(scoped - ONE_WORKER)}; "
        f"no longer needed there: {sorted(ONE_WORKER - scoped)}"
    )
