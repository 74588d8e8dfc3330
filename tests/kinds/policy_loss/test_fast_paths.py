"""The policy-loss checks' fast paths (issue 32) answer as the plain computations do."""

from __future__ import annotations

import dataclasses
import math

import torch

from polgrad_reference import get_algorithm, policy_loss
from pytest_polgrad.kinds.policy_loss import checks
from pytest_polgrad.kinds.policy_loss.oracle import Oracle
from pytest_polgrad.strategies import Batch


def test_same_values_is_nan_aware_and_sees_a_change() -> None:
    a = torch.tensor([1.0, math.nan, -0.0])
    assert checks._same_values(a, a.clone())  # NaN equals NaN: no change
    assert checks._same_values(a, torch.tensor([1.0, math.nan, 0.0]))
    assert not checks._same_values(a, torch.tensor([1.0, math.nan, 2.0]))
    assert not checks._same_values(a, torch.tensor([1.0, 0.0, 0.0]))


def _batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    lp = -torch.rand(2, 3, generator=g, dtype=torch.float64)
    batch = Batch(
        logprobs=lp,
        old_logprobs=lp + 0.1 * torch.randn(2, 3, generator=g, dtype=torch.float64),
        advantages=torch.tensor([0.7, -1.3], dtype=torch.float64),
        response_mask=mask,
    )
    return batch.as_kwargs()


def test_the_oracles_scales_are_the_plain_formula() -> None:
    cfg = get_algorithm("dapo").loss
    oracle, kw = Oracle(cfg), _batch()
    res = oracle(kw, kink_eps=1e-7)
    x = oracle._inputs(kw)
    lp = x["logprobs"].clone().requires_grad_(True)
    out = policy_loss(cfg, **{**x, "logprobs": lp})
    mask = out.response_mask
    adv = oracle._token_advantages(x, lp)
    lp0, old0 = (torch.where(mask, x[k], 0.0) for k in ("logprobs", "old_logprobs"))
    cond = (1.0 + lp0.abs() + old0.abs()).amax(dim=1, keepdim=True)
    slope = adv.abs() * out.ratio.detach() + oracle._penalty_slope(x, mask)
    terms = out.token_loss.detach().abs() + slope * cond
    plain = float((torch.where(mask, terms, 0.0) * out.weights.abs()).sum())
    assert res.value_scale == plain
    part = dataclasses.replace(res, clear=res.clear & torch.tensor([[True, False, False]] * 2))
    assert part.clear_mass == float(torch.where(part.clear, part.grad.abs(), 0.0).sum())
    assert part.clear_mass != res.clear_mass == float(res.grad.abs().sum())
