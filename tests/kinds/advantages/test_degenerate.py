"""``singleton-constant`` judges the rows of singleton and constant-reward groups only: a
wrong std elsewhere is the value check's finding, not a singleton bug (new-user trial:
population std failed singleton-constant with value's finding on a batch of four groups
of four); a wrong singleton advantage is still caught there. ``extreme-values`` runs on
its own domain only (no canonical batch has extreme reward scales)."""

from __future__ import annotations

from typing import Any

import torch

from pytest_polgrad import ConformanceError, assert_conforms
from pytest_polgrad.api import ConformanceReport
from tests.kinds.advantages.test_kind import _groups, grpo_loop, grpo_population_std

CHECKS = ["value", "singleton-constant"]


def _failed(fn: Any) -> set[str]:
    try:
        report: ConformanceReport = assert_conforms(
            fn, "grpo", kind="advantages", checks=CHECKS, max_examples=30, seed=1
        )
    except ConformanceError as exc:
        report = exc.report
    return {r.check for r in report.results if not r.passed}


def singleton_nan(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Correct except that a one-response group gets NaN (0 / 0) instead of 0."""
    out = grpo_loop(rewards, group_ids)
    for m in _groups(group_ids):
        if int(m.sum()) == 1:
            out[m] = float("nan")
    return out


def test_a_wrong_std_fails_value_only() -> None:
    assert _failed(grpo_population_std) == {"value"}


def test_a_wrong_singleton_advantage_fails_singleton_constant() -> None:
    assert "singleton-constant" in _failed(singleton_nan)


def test_a_correct_estimator_passes_both() -> None:
    assert _failed(grpo_loop) == set()


def test_extreme_values_reports_a_batch_of_its_own_domain() -> None:
    try:
        assert_conforms(
            grpo_population_std,
            "grpo",
            kind="advantages",
            checks=["extreme-values"],
            max_examples=30,
            seed=1,
        )
    except ConformanceError as exc:
        report = exc.report.results[0].report
    else:
        raise AssertionError("population std passed extreme-values")
    assert "check 'extreme-values' failed" in report
    assert "canonical corpus" not in report  # it was the corpus's unscaled 'groups' batch
