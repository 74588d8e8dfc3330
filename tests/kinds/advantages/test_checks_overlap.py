"""One advantages deviation, one check (new-user trial): each check judges only what it is
about (docs/advantages.md, "Which check reports a deviation").

- ``extreme-values`` judges a failing extreme-scale batch only if the function is right on
  the same batch with its rewards at unit scale; a wrong std is the value check's finding
  (population std failed both with the same report).
- A function whose second call on a batch differs from its first (a running baseline)
  fails ``deterministic`` only: value, singleton-constant, group-order, group-isolation,
  padding-values and padding-columns said it was wrong, read padding, or mixed groups.
- The self-comparisons (group-order, padding-values, padding-columns) count a NaN that the
  function returns on both inputs as the same (a 0/0 std of a constant group is
  singleton-constant's finding, not padding's or order's).

A check hands a finding to another only when that one runs (``checks=``): nothing is lost.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from pytest_polgrad import ConformanceError, assert_conforms
from tests.kinds.advantages.test_kind import (
    _groups,
    grpo_float32,
    grpo_loop,
    grpo_population_std,
)

BUDGET = 12


def _failed(fn: Callable[..., Any], *, checks: list[str] | None = None, **options: Any) -> set[str]:
    try:
        report = assert_conforms(
            fn, "grpo", kind="advantages", max_examples=BUDGET, seed=1, checks=checks, **options
        )
    except ConformanceError as exc:
        report = exc.report
    return {r.check for r in report.results if not r.passed}


def grpo_clipped_rewards(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Clips the rewards to [-100, 100] first (a reward-clipping safeguard): right at unit
    scale, wrong for rewards scaled by 1e3 and more (a bug only extreme-values sees)."""
    return grpo_loop(rewards.clamp(-100.0, 100.0), group_ids)


def grpo_no_eps(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """(r - mean) / std: NaN (0/0) for a constant group."""
    out = torch.zeros_like(rewards)
    for m in _groups(group_ids):
        r = rewards[m]
        if r.numel() > 1:
            out[m] = (r - r.mean()) / r.std()
    return out


def grpo_no_eps_contiguous(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """The same, and assumes each group's rows are adjacent (splits where the id changes)."""
    out = torch.zeros_like(rewards)
    start = 0
    for i in range(1, rewards.numel() + 1):
        if i == rewards.numel() or bool(group_ids[i] != group_ids[start]):
            r = rewards[start:i]
            if r.numel() > 1:
                out[start:i] = (r - r.mean()) / r.std()
            start = i
    return out


class _Running:
    """A running baseline kept across calls (stateful): call k subtracts the average of
    the batch means seen before it."""

    def __init__(self) -> None:
        self.baseline = 0.0

    def __call__(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        out = grpo_loop(rewards, group_ids) - 0.01 * self.baseline
        self.baseline = 0.9 * self.baseline + 0.1 * float(rewards.detach().mean()) + 0.1
        return out


def test_a_wrong_std_fails_value_not_extreme_values() -> None:
    assert _failed(grpo_population_std) == {"value"}


def test_a_bug_only_at_extreme_scales_still_fails_extreme_values() -> None:
    assert _failed(grpo_clipped_rewards) == {"extreme-values"}


def test_extreme_values_alone_still_reports_a_wrong_std() -> None:
    """Without the value check to hand it to, extreme-values keeps its finding."""
    assert _failed(grpo_population_std, checks=["extreme-values"]) == {"extreme-values"}


def test_a_stateful_estimator_fails_deterministic_only() -> None:
    running = _Running()

    def running_baseline(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        return running(rewards, group_ids)

    assert _failed(running_baseline) == {"deterministic"}


@pytest.mark.parametrize("check", ["value", "group-order", "padding-values"])
def test_without_the_deterministic_check_a_stateful_estimator_still_fails(check: str) -> None:
    running = _Running()

    def running_baseline(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        return running(rewards, group_ids)

    assert _failed(running_baseline, checks=[check]) == {check}


def test_a_nan_for_constant_groups_is_not_a_padding_or_order_finding() -> None:
    failed = _failed(grpo_no_eps)
    assert "singleton-constant" in failed and "value" in failed
    assert not failed & {"group-order", "padding-values", "padding-columns"}, failed


def test_an_order_bug_is_caught_beside_nan_advantages() -> None:
    assert "group-order" in _failed(grpo_no_eps_contiguous)


@pytest.mark.parametrize(
    ("fn", "options"),
    [(grpo_loop, {}), (grpo_float32, {}), (grpo_loop, {"dtype": "bfloat16"})],
    ids=["float64", "float32-inside", "bfloat16-inputs"],
)
def test_correct_estimators_pass_every_check(fn: Callable[..., Any], options: Any) -> None:
    assert _failed(fn, **options) == set()
