"""``assert_conforms``'s summary says what happened to a function that cannot be evaluated
(new-user trial): a function that raises read ``FAILED  (7 examples, worst inf tol)`` on
every check; each row now reads ``FAILED  (verdict: raised on a valid batch: ...)``. A
finding (the property does not hold) keeps its examples and worst error in tolerances.
"""

from __future__ import annotations

import pytest
import torch

from pytest_polgrad import ConformanceError, assert_conforms
from tests.helpers import sample_losses as L


def boom(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
) -> torch.Tensor:
    raise RuntimeError("shape mismatch in my kernel")


def nan_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
) -> torch.Tensor:
    return L.dapo(logprobs, old_logprobs, advantages, response_mask) * float("nan")


def _rows(summary: str) -> list[str]:
    """The check rows of a summary: its lines after the header, less the time row."""
    return [row for row in summary.splitlines()[1:] if not row.startswith("  time ")]


def _summary(fn: object, **options: object) -> list[str]:
    with pytest.raises(ConformanceError) as info:
        assert_conforms(fn, "dapo", max_examples=5, **options)  # type: ignore[arg-type]
    return _rows(info.value.report.summary())


def test_a_raising_function_reads_as_raised_on_every_check() -> None:
    rows = _summary(boom, checks=("value", "gradient", "deterministic"))
    assert len(rows) == 3, rows
    for row, check in zip(rows, ("value", "gradient", "deterministic"), strict=True):
        verdict = "raised on a valid batch: RuntimeError: shape mismatch in my kernel"
        assert row == f"  {check:<18} FAILED  (verdict: {verdict})", row
        assert "tol" not in row and "examples" not in row, row


def test_a_nan_result_reads_as_the_verdict_it_is() -> None:
    (row,) = _summary(nan_loss, checks=("value",))
    assert "FAILED  (verdict: " in row and "inf tol" not in row, row
    assert "nan" in row.lower() or "finite" in row, row


def test_a_finding_keeps_its_examples_and_worst_error() -> None:
    (row,) = _summary(L.dapo_wrong_eps, checks=("value",))
    assert "verdict" not in row, row
    words = row.split()
    assert words[:2] == ["value", "FAILED"] and words[3] == "examples,", row
    assert float(words[5]) > 1.0 and words[6] == "tol)", row


def test_a_declared_check_that_raises_quotes_its_verdict_once() -> None:
    with pytest.raises(ConformanceError) as info:
        assert_conforms(boom, "dapo", max_examples=5, checks=("value",), expect={"value": "x"})
    (row,) = _rows(info.value.report.summary())
    assert row.startswith("  value              FAILED (declared, but not excused: "), row
    assert row.count("shape mismatch in my kernel") == 1, row


def test_a_long_verdict_is_cut() -> None:
    from pytest_polgrad.api import brief

    text = brief("the function raised on a valid batch: ValueError: " + "x" * 300 + "\nmore")
    assert text.startswith("raised on a valid batch: ValueError: xxx") and text.endswith("...")
    assert len(text) == 140
    assert brief("the function returned NaN\nsecond line") == "returned NaN"


def test_one_verdict_is_reported_in_full_once() -> None:
    """A function that raises fails every check with one verdict: ``str(ConformanceError)``
    shows its full report once and, for the other checks, the verdict and a pointer, as
    the plugin does (it printed nine near-identical full reports; new-user trial)."""
    checks = ("value", "gradient", "deterministic")
    with pytest.raises(ConformanceError) as info:
        assert_conforms(boom, "dapo", max_examples=5, checks=checks)
    text = str(info.value)
    assert text.count("  reproduce (standalone):") == 1, text
    assert text.count("RuntimeError: shape mismatch in my kernel") >= len(checks)
    pointer = "(the same verdict as check 'value' of boom: its report has the batch"
    assert text.count(pointer) == len(checks) - 1, text
    assert text.count("does not conform to 'dapo'") == len(checks)


def test_one_declared_check_excuses_that_check_only() -> None:
    """DAPO's loss marked as PPO fails value and gradient (eps 0.28 vs 0.2); declaring
    value alone leaves gradient an unexpected failure (issue 27: a mutant that let one
    declaration excuse every failing check survived)."""
    try:
        assert_conforms(
            L.dapo, "ppo", max_examples=5, checks=("value", "gradient"),
            expect={"value": "eps_high 0.28"},
        )  # fmt: skip
    except ConformanceError as exc:
        assert [r.check for r in exc.report.unexpected_failures] == ["gradient"]
    else:
        raise AssertionError("a failing gradient check was excused by value's declaration")
