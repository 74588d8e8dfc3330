"""The demo reproduces the table in README.md ("What the demo prints") exactly: the numbers
of the project's founding description, which lives outside this repository."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.helpers.snippet_driver import run_scripts

EXAMPLE = Path(__file__).parents[2] / "examples" / "which_grpo_am_i_running.py"
EXPECTED = {
    "seq-mean-token-mean (GRPO paper)": (0.24038972, 0.19568, 0.29263),
    "token-mean (DAPO; verl, TRL>=0.16)": (0.51717388, 0.07827, 0.46821),
    "token-sum-norm (Dr.GRPO, budget 8)": (0.32323368, 0.04892, 0.29263),
    "GSPO sequence-level ratio": (0.15429390, 0.19550, 0.00000),
}


def _load() -> object:
    spec = importlib.util.spec_from_file_location("which_grpo", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_table_numbers_match_the_seed() -> None:
    rows = _load().measure()  # type: ignore[attr-defined]
    assert list(rows) == list(EXPECTED)
    for label, (loss, short, long) in EXPECTED.items():
        got_loss, mass = rows[label]
        assert round(got_loss, 8) == pytest.approx(loss, abs=0), label
        assert round(mass[0], 5) == pytest.approx(short, abs=0), label
        assert round(mass[-1], 5) == pytest.approx(long, abs=0), label


def test_script_prints_the_table() -> None:
    """``python examples/which_grpo_am_i_running.py`` from the repository root (run as
    that command runs it, in the suite's snippet interpreter:
    ``tests/helpers/snippet_driver.py``)."""
    out = run_scripts([("demo", EXAMPLE, EXAMPLE.parents[1], ())])["demo"]
    assert not out.startswith("FAILED"), out
    assert "0.24038972" in out and "0.51717388" in out
    assert "0.32323368" in out and "0.15429390" in out
