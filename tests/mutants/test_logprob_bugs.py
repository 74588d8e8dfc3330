"""Issue 31's bugs downstream of the logprobs, flagged by the policy-loss kind: NaN x 0 at
a masked old logprob (OpenRLHF PR #1240: multiplying by the mask instead of selecting) and
the token-mean numerator left unmasked (ROLL PR #444)."""

from __future__ import annotations

from typing import Any

import torch

from pytest_polgrad import assert_conforms
from pytest_polgrad.api import ConformanceError, ConformanceReport

T = torch.Tensor


def _run(fn: Any, **options: Any) -> ConformanceReport:
    try:
        return assert_conforms(fn, "dapo", max_examples=8, seed=3, **options)
    except ConformanceError as exc:
        return exc.report


def _per_token(logprobs: T, old_logprobs: T, advantages: T) -> T:
    r = torch.exp(logprobs - old_logprobs)
    a = advantages[:, None]
    return torch.maximum(-a * r, -a * r.clamp(0.8, 1.28))


def selects(logprobs: T, old_logprobs: T, advantages: T, response_mask: T) -> T:
    """Selects before any arithmetic (a where after exp would still send NaN x 0 back)."""
    lr = torch.where(response_mask, logprobs - old_logprobs, 0.0)
    per = _per_token(lr, torch.zeros_like(lr), advantages)
    return torch.where(response_mask, per, 0.0).sum() / response_mask.sum()


def nan_times_zero(logprobs: T, old_logprobs: T, advantages: T, response_mask: T) -> T:
    per = _per_token(logprobs, old_logprobs, advantages) * response_mask
    return per.sum() / response_mask.sum()


def unmasked_numerator(logprobs: T, old_logprobs: T, advantages: T, response_mask: T) -> T:
    return _per_token(logprobs, old_logprobs, advantages).sum() / response_mask.sum()


def test_nan_times_zero_at_masked_old_logprobs_is_flagged_with_nan_padding() -> None:
    report = _run(nan_times_zero, padding_nan=True)
    failed = {r.check: r.message for r in report.results if not r.passed}
    assert "nan" in failed.get("value", ""), failed
    assert not [r for r in _run(selects, padding_nan=True).results if not r.passed]


def test_unmasked_numerator_is_flagged() -> None:
    report = _run(unmasked_numerator)
    failed = {r.check: r for r in report.results if not r.passed}
    assert {"value", "padding-values"} <= set(failed), sorted(failed)
