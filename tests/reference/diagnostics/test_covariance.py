"""Cov(log pi, A), the leading indicator of entropy collapse (docs/diagnostics.md).

Null: row advantages exchangeable within groups and independent of the log-probabilities
(advantages shared by a row's tokens, GRPO). The permutation test then rejects at
0.05 +- 3 binomial standard errors over R replicates, and its z is N(0, 1), at B = 5 and
8 too; at B = 4 it refuses. Power: advantages that reward confident rows
(A_b = gamma * mean_t log pi + noise), the example's injection.
"""

from __future__ import annotations

import math

import pytest
import torch

from polgrad_reference.diagnostics import logprob_advantage_covariance
from polgrad_reference.diagnostics.covariance import MIN_ROWS_CLUSTERED_T
from polgrad_reference.errors import ConfigError, InputError


def _batch(
    seed: int, *, gamma: float, b: int = 96, t: int = 20
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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
    reps, rejected = 300, 0
    for seed in range(reps):
        lp, adv, mask = _batch(seed, gamma=0.0)
        out = logprob_advantage_covariance(
            logprobs=lp, advantages=adv, response_mask=mask, n_resamples=199, seed=seed
        )
        rejected += out.alarm
    rate = rejected / reps
    assert abs(rate - 0.05) <= 3 * math.sqrt(0.05 * 0.95 / reps), rate


@pytest.mark.parametrize("b", [5, 8])
def test_z_is_standard_normal_and_the_level_holds_at_small_batches(b: int) -> None:
    """The normal approximation rejected 0.145 at B = 4 and 0.092 at B = 8; the
    permutation p-value's probit is exactly N(0, 1) at every B."""
    reps, zs, rejected = 400, [], 0
    for seed in range(reps):
        lp, adv, mask = _batch(seed, gamma=0.0, b=b)
        out = logprob_advantage_covariance(
            logprobs=lp, advantages=adv, response_mask=mask, n_resamples=199, seed=seed
        )
        assert out.decided and out.method == "permutation"
        zs.append(out.z)
        rejected += out.alarm
    mean = sum(zs) / reps
    var = sum((z - mean) ** 2 for z in zs) / (reps - 1)
    assert abs(mean) < 4 / math.sqrt(reps) and abs(var - 1.0) < 4 * math.sqrt(2 / reps), (mean, var)
    assert rejected / reps <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / reps)


def test_too_few_rows_to_decide_instead_of_alarming() -> None:
    lp, adv, mask = _batch(3, gamma=20.0, b=4)  # a strong covariance, but 4! < 2 / 0.05
    out = logprob_advantage_covariance(logprobs=lp, advantages=adv, response_mask=mask)
    assert out.t > 3 and not out.decided and not out.alarm and out.min_rows == 5
    assert "too few rows to decide" in out.summary() and "at least 5" in out.summary()
    assert out.as_metrics()["entropy_cov/decided"] == 0.0


def test_advantages_are_permuted_only_within_groups() -> None:
    # two prompts: the confident one's rows all get +1, the other's all -1. Across the
    # batch that is a strong covariance; within each prompt there is nothing to permute.
    g = torch.Generator().manual_seed(4)
    mask = torch.ones((16, 8), dtype=torch.bool)
    group = torch.arange(16) // 8
    lp = -1.0 - 2.0 * group[:, None].double() - 0.1 * torch.rand((16, 8), generator=g)
    adv = 1.0 - 2.0 * group.double()
    pooled = logprob_advantage_covariance(logprobs=lp, advantages=adv, response_mask=mask)
    grouped = logprob_advantage_covariance(
        logprobs=lp, advantages=adv, response_mask=mask, groups=group
    )
    assert pooled.alarm and pooled.p_value <= 1e-3
    assert grouped.cov == pooled.cov and grouped.p_value == 1.0 and not grouped.alarm


def test_token_varying_advantages_use_the_clustered_t_approximation() -> None:
    lp, adv, mask = _batch(9, gamma=0.0)
    g = torch.Generator().manual_seed(9)
    tok = adv[:, None] + 0.3 * torch.randn(mask.shape, generator=g, dtype=torch.float64)
    out = logprob_advantage_covariance(logprobs=lp, advantages=tok, response_mask=mask)
    assert out.method == "clustered-t" and out.decided and out.n_resamples == 0
    small = logprob_advantage_covariance(
        logprobs=lp[:8], advantages=tok[:8], response_mask=mask[:8]
    )
    assert not small.decided and small.min_rows == MIN_ROWS_CLUSTERED_T


def test_positive_covariance_at_the_injected_size_is_detected() -> None:
    ts, zs = [], []
    for seed in range(20):
        lp, adv, mask = _batch(1000 + seed, gamma=2.0)
        out = logprob_advantage_covariance(
            logprobs=lp, advantages=adv, response_mask=mask, seed=seed
        )
        assert out.cov > 0 and out.alarm and out.p_value < 0.01, out.summary()
        ts.append(out.t)
        zs.append(out.z)
    assert sum(ts) / len(ts) > 4.0
    # z is the probit of a p-value of at least 1/1000: about 3.1 once t beats every permutation
    assert sum(zs) / len(zs) > 2.5


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
    assert out.cov == 0.0 and out.t == 0.0 and out.corr == 0.0 and not out.alarm
    assert math.isfinite(out.z)


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
    with pytest.raises(InputError, match="groups must be an integer tensor"):
        logprob_advantage_covariance(logprobs=lp, advantages=adv, response_mask=mask, groups=adv)
    with pytest.raises(InputError, match=r"groups must have shape \[B\]"):
        logprob_advantage_covariance(
            logprobs=lp, advantages=adv, response_mask=mask, groups=torch.zeros(3).long()
        )
    with pytest.raises(ConfigError, match=r"n_resamples = 9 cannot reach alpha = 0\.05"):
        logprob_advantage_covariance(logprobs=lp, advantages=adv, response_mask=mask, n_resamples=9)
    with pytest.raises(ConfigError, match="seed must be a non-negative integer"):
        logprob_advantage_covariance(logprobs=lp, advantages=adv, response_mask=mask, seed=-1)
    with pytest.raises(ConfigError, match="alpha must lie in"):
        logprob_advantage_covariance(logprobs=lp, advantages=adv, response_mask=mask, alpha=1.0)
