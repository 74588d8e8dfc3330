"""Cov(log pi, A), the leading indicator of entropy collapse (docs/diagnostics.md).

Null: log-probabilities independent of advantages, rows i.i.d., advantages shared by a
row's tokens (GRPO). The row-clustered z then rejects |z| > 1.96 at rate 0.05 +- 3
binomial standard errors over R replicates. Power: advantages that reward confident rows
(A_b = gamma * mean_t log pi + noise), the example's injection.
"""

from __future__ import annotations

import math

import pytest
import torch

from polgrad_reference.diagnostics import logprob_advantage_covariance
from polgrad_reference.errors import InputError


def _batch(seed: int, *, gamma: float, b: int = 96, t: int = 20):
    g = torch.Generator().manual_seed(seed)
    mask = torch.arange(t)[None] < torch.randint(2, t + 1, (b, 1), generator=g)
    row_level = torch.randn((b, 1), generator=g, dtype=torch.float64)  # rows differ in confidence
    lp = -torch.nn.functional.softplus(
        row_level + torch.randn((b, t), generator=g, dtype=torch.float64)
    )
    lengths = mask.sum(dim=1)
    row_mean = torch.where(mask, lp, 0.0).sum(dim=1) / lengths
    adv = gamma * (row_mean - row_mean.mean()) + torch.randn(b, generator=g, dtype=torch.float64)
    return lp, adv, mask


def test_null_rejection_rate_is_calibrated() -> None:
    reps, rejected = 400, 0
    for seed in range(reps):
        lp, adv, mask = _batch(seed, gamma=0.0)
        rejected += (
            abs(logprob_advantage_covariance(logprobs=lp, advantages=adv, response_mask=mask).z)
            > 1.96
        )
    rate = rejected / reps
    assert abs(rate - 0.05) <= 3 * math.sqrt(0.05 * 0.95 / reps), rate


def test_positive_covariance_at_the_injected_size_is_detected() -> None:
    zs = []
    for seed in range(20):
        lp, adv, mask = _batch(1000 + seed, gamma=2.0)
        out = logprob_advantage_covariance(logprobs=lp, advantages=adv, response_mask=mask)
        assert out.cov > 0 and out.p_value < 0.01, out.summary()
        zs.append(out.z)
    assert sum(zs) / len(zs) > 4.0


def test_value_equals_the_population_covariance_of_the_tokens() -> None:
    lp, adv, mask = _batch(5, gamma=1.0)
    out = logprob_advantage_covariance(logprobs=lp, advantages=adv, response_mask=mask)
    x = lp[mask]
    y = adv[:, None].expand(mask.shape)[mask]
    ref = torch.cov(torch.stack([x, y]), correction=0)[0, 1]
    assert out.cov == pytest.approx(float(ref), rel=1e-12)
    assert out.corr == pytest.approx(float(torch.corrcoef(torch.stack([x, y]))[0, 1]), rel=1e-10)
    # token-level advantages give the same value when they repeat the row's advantage
    same = logprob_advantage_covariance(
        logprobs=lp, advantages=adv[:, None].expand(mask.shape).clone(), response_mask=mask
    )
    assert same == out


def test_constant_advantages_give_zero_not_nan() -> None:
    lp, adv, mask = _batch(6, gamma=0.0)
    out = logprob_advantage_covariance(
        logprobs=lp, advantages=torch.ones_like(adv), response_mask=mask
    )
    assert out.cov == 0.0 and out.z == 0.0 and out.corr == 0.0


def test_bfloat16_inputs_equal_float64_of_the_same_values() -> None:
    lp, adv, mask = _batch(7, gamma=1.0)
    low = logprob_advantage_covariance(
        logprobs=lp.bfloat16(), advantages=adv.bfloat16(), response_mask=mask
    )
    ref = logprob_advantage_covariance(
        logprobs=lp.bfloat16().double(), advantages=adv.bfloat16().double(), response_mask=mask
    )
    assert low == ref


def test_bad_inputs_are_named() -> None:
    lp, adv, mask = _batch(8, gamma=0.0)
    with pytest.raises(InputError, match=r"advantages must have shape \[B\] = \[96\]"):
        logprob_advantage_covariance(logprobs=lp, advantages=adv[:5], response_mask=mask)
    with pytest.raises(InputError, match="B >= 2 rows"):
        logprob_advantage_covariance(logprobs=lp[:1], advantages=adv[:1], response_mask=mask[:1])
