"""Where the reference is exactly zero (a clipped row's gradient, a loss whose every term
vanishes) no rounding allows a difference: the report says so, with an infinite error,
instead of a ratio to a 1e-300 floor (it read "3.9e305x the tolerance")."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from pytest_polgrad.core.engine import build_context
from pytest_polgrad.core.options import parse_marker
from pytest_polgrad.core.verdicts import CheckFailure
from pytest_polgrad.kinds.policy_loss.checks import check_gradient, check_value

Tensor = torch.Tensor

# one token at ratio 2 with A > 0: clipped under dapo, so d loss / d logprobs is exactly 0
CLIPPED = {
    "logprobs": torch.tensor([[math.log(2.0) - 1.0]], dtype=torch.float64),
    "old_logprobs": torch.tensor([[-1.0]], dtype=torch.float64),
    "advantages": torch.tensor([1.0], dtype=torch.float64),
    "response_mask": torch.tensor([[True]]),
}


def unclipped(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    ratio = torch.exp(logprobs - old_logprobs)
    per = torch.where(response_mask, -advantages[:, None] * ratio, 0.0)
    return per.sum() / response_mask.sum()


def test_a_gradient_where_the_reference_is_exactly_zero_is_named_as_such() -> None:
    ctx = build_context(unclipped, parse_marker(("dapo",), {}))
    with pytest.raises(CheckFailure) as info:
        check_gradient(ctx, CLIPPED)
    assert "is nonzero at 1 response position(s) where the reference's is exactly 0" in str(
        info.value
    )
    assert info.value.error == math.inf and "e+30" not in str(info.value)


def test_a_loss_whose_every_term_vanishes_admits_no_difference() -> None:
    zero_adv = {**CLIPPED, "advantages": torch.tensor([0.0], dtype=torch.float64)}

    def offset(**kw: Tensor) -> Tensor:
        return unclipped(**kw) + 1e-12

    offset.__signature__ = inspect.signature(unclipped)  # type: ignore[attr-defined]
    ctx = build_context(offset, parse_marker(("dapo",), {}))
    with pytest.raises(CheckFailure, match="the reference's every term is exactly 0"):
        check_value(ctx, zero_adv)
    check_value(build_context(unclipped, parse_marker(("dapo",), {})), zero_adv)  # exact: ok
