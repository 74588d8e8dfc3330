"""The notes of passing checks reach the reader (a new user's trial found the "consistent
with float32 arithmetic" note only in the JSON report): ``assert_conforms``'s summary lists
them, and the plugin's terminal summary prints them under its table, each note once per
function (a precision note once, with the quantities it was seen on); a function without
notes adds nothing."""

from __future__ import annotations

import pytest
import torch

from pytest_polgrad import assert_conforms
from pytest_polgrad.pytest.notes import passing_notes
from tests.core.test_tolerance import _cast
from tests.helpers import inline_run
from tests.helpers import sample_losses as L

pytest_plugins = ["pytester"]

NOTE = "consistent with float32 arithmetic, not float64"


def test_the_api_summary_lists_the_notes_of_passing_checks() -> None:
    summary = assert_conforms(_cast(torch.float32), "dapo", max_examples=10).summary()
    assert "  notes:" in summary and NOTE in summary, summary
    assert "notes" not in assert_conforms(L.dapo, "dapo", max_examples=10).summary()


def test_each_note_is_listed_once_per_function_and_the_list_is_bounded() -> None:
    """Sorted by function (xdist reports arrive in completion order); a precision note once,
    with the quantities it was seen on."""
    x = "consistent with x"
    notes = [
        ("f", [f"value: {x}", f"value: {x}"]),
        ("f", [f"gradient: {x}", "other"]),
        ("e", ["c"]),
    ]
    assert passing_notes(notes) == ["e: c", f"f: value, gradient: {x}", "f: other"]
    many = passing_notes([("f", [f"note {i}" for i in range(30)])], limit=20)
    assert len(many) == 21 and many[-1] == "... and 10 more (--polgrad-report)"


PROJECT = """
import pytest
import torch


@pytest.mark.polgrad_conforms("dapo", checks=["value", "gradient"])
def float32_inside(logprobs, old_logprobs, advantages, response_mask):
    lp, old, adv = (t.float() for t in (logprobs, old_logprobs, advantages))
    r = torch.exp(torch.where(response_mask, lp - old, 0.0))
    per = torch.maximum(-adv[:, None] * r, -adv[:, None] * r.clamp(0.8, 1.28))
    return (torch.where(response_mask, per, 0.0).sum() / response_mask.sum()).double()
"""


def test_the_terminal_summary_prints_the_notes_of_passing_checks(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_losses=PROJECT)
    result = inline_run.run(
        pytester, "-p", "no:cacheprovider", "-p", "no:randomly", "--polgrad-max-examples=10"
    )
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        ["notes of passing checks:", f"  float32_inside: value, d loss / d logprobs: {NOTE}*"]
    )
