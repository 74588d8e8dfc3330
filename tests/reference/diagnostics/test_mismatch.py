"""Trainer-vs-rollout mismatch (docs/diagnostics.md, "Mismatch").

Null (noise floor): trainer, rollout and a second trainer pass are the truth plus i.i.d.
noise of one distribution; the exact sign test then has size <= alpha (the Monte Carlo
false-alarm rate over R replicates is within alpha + 3 sqrt(alpha (1 - alpha) / R)).
Power: rollout noise 1.5x the noise floor, the example's injected effect.
"""

from __future__ import annotations

import math

import pytest
import torch

from polgrad_reference.diagnostics import logprob_mismatch
from polgrad_reference.errors import ConfigError, InputError, NumericalError


def _mask(g: torch.Generator, b: int, t: int) -> torch.Tensor:
    return torch.arange(t)[None] < torch.randint(1, t + 1, (b, 1), generator=g)


def _scores(seed: int, *, rollout_scale: float, b: int = 32, t: int = 64, sigma0: float = 0.01):
    g = torch.Generator().manual_seed(seed)
    mask = _mask(g, b, t)
    truth = -3.0 * torch.rand((b, t), generator=g, dtype=torch.float64)

    def noisy(scale: float) -> torch.Tensor:
        return truth + scale * sigma0 * torch.randn((b, t), generator=g, dtype=torch.float64)

    return noisy(1.0), noisy(rollout_scale), noisy(1.0), mask


def test_on_policy_null_is_exact() -> None:
    tr, _, _, mask = _scores(0, rollout_scale=1.0)
    same = logprob_mismatch(trainer_logprobs=tr, rollout_logprobs=tr.clone(), response_mask=mask)
    assert same.null == "on-policy" and not same.alarm and same.p_value == 1.0
    assert (same.k1, same.k2, same.k3, same.tv, same.chi2) == (0.0, 0.0, 0.0, 0.0, 0.0)
    assert same.z is None and "mismatch/z" not in same.as_metrics()
    moved = tr.clone()
    moved[1, 0] += 1e-9
    one = logprob_mismatch(trainer_logprobs=tr, rollout_logprobs=moved, response_mask=mask)
    assert one.alarm and one.n_exceed == 1 and one.p_value == 0.0


def test_noise_floor_null_false_alarm_rate_is_within_alpha() -> None:
    alpha, reps = 0.05, 300
    alarms, zs = 0, []
    for seed in range(reps):
        tr, ro, rs, mask = _scores(seed, rollout_scale=1.0)
        out = logprob_mismatch(
            trainer_logprobs=tr,
            rollout_logprobs=ro,
            rescored_logprobs=rs,
            response_mask=mask,
            alpha=alpha,
        )
        alarms += out.alarm
        assert out.z is not None
        zs.append(out.z)
    rate = alarms / reps
    tol = 3.0 * math.sqrt(alpha * (1 - alpha) / reps)
    assert rate <= alpha + tol, rate
    # the exact binomial test is only slightly conservative at m ~ 1000: not a dead alarm
    assert rate >= alpha - 0.01 - tol, rate
    mean = sum(zs) / reps
    var = sum((z - mean) ** 2 for z in zs) / (reps - 1)
    assert abs(mean) < 4 / math.sqrt(reps) and abs(var - 1.0) < 4 * math.sqrt(2 / reps)


def test_rollout_drift_at_the_injected_size_fires() -> None:
    for seed in range(20):
        tr, ro, rs, mask = _scores(1000 + seed, rollout_scale=1.5)
        out = logprob_mismatch(
            trainer_logprobs=tr, rollout_logprobs=ro, rescored_logprobs=rs, response_mask=mask
        )
        assert out.alarm and out.p_value < 1e-3, out.summary()
        assert out.noise_rms is not None and out.rms > out.noise_rms


@pytest.mark.parametrize(("exceed", "p"), [(4, 1 / 16), (3, 5 / 16), (2, 11 / 16), (0, 1.0)])
def test_sign_test_p_value_is_the_exact_binomial_tail(exceed: int, p: float) -> None:
    # four informative tokens and one tie: K of them have |d| > |d0|; P(Bin(4, 1/2) >= K)
    mask = torch.ones((1, 5), dtype=torch.bool)
    tr = torch.full((1, 5), -1.0, dtype=torch.float64)
    big, small = torch.full((5,), 0.2), torch.full((5,), 0.1)
    d = torch.where(torch.arange(5) < exceed, big, small).double()
    d0 = torch.where(torch.arange(5) < exceed, small, big).double()
    d[4] = d0[4] = 0.3  # a tie: dropped
    out = logprob_mismatch(
        trainer_logprobs=tr,
        rollout_logprobs=tr - d[None],
        rescored_logprobs=tr - d0[None],
        response_mask=mask,
        alpha=0.1,
    )
    assert out.n_informative == 4 and out.n_exceed == exceed
    assert out.p_value == pytest.approx(p, rel=1e-12) and out.alarm == (p <= 0.1)
    assert out.z == pytest.approx((2 * exceed - 4) / 2)


def test_closed_forms_at_a_constant_ratio_of_two() -> None:
    mask = torch.ones((2, 3), dtype=torch.bool)
    ro = torch.full((2, 3), -2.0, dtype=torch.float64)
    tr = ro + math.log(2.0)
    out = logprob_mismatch(trainer_logprobs=tr, rollout_logprobs=ro, response_mask=mask)
    assert out.k1 == pytest.approx(-math.log(2.0), rel=1e-15)
    assert out.k2 == pytest.approx(math.log(2.0) ** 2 / 2, rel=1e-15)
    assert out.k3 == pytest.approx(1.0 - math.log(2.0), rel=1e-15)
    assert out.tv == pytest.approx(0.5, rel=1e-15) and out.chi2 == pytest.approx(1.0, rel=1e-15)
    assert all(r == pytest.approx(2.0, rel=1e-15) for _, r in out.quantiles)
    assert out.frac_outside_band == 1.0


def test_a_zero_mean_hides_tails_that_the_band_fraction_shows() -> None:
    # TRL#6789: mean difference ~0 while 8% of tokens are outside [0.9, 1.1]
    n = 1000
    d = torch.zeros(n, dtype=torch.float64)
    d[:40], d[40:80] = 0.2, -0.2
    mask = torch.ones((10, 100), dtype=torch.bool)
    ro = torch.full((10, 100), -1.0, dtype=torch.float64)
    out = logprob_mismatch(
        trainer_logprobs=ro + d.reshape(10, 100), rollout_logprobs=ro, response_mask=mask
    )
    assert out.k1 == pytest.approx(0.0, abs=1e-15)
    assert out.frac_outside_band == 0.08


def test_catastrophic_tokens_are_listed_worst_first_with_positions() -> None:
    tr, ro, rs, mask = _scores(7, rollout_scale=1.0)
    mask[3, :10] = True
    mask[5, :20] = True
    ro[3, 4] = tr[3, 4] - 3.0
    ro[5, 17] = tr[5, 17] + 4.0
    out = logprob_mismatch(
        trainer_logprobs=tr, rollout_logprobs=ro, rescored_logprobs=rs, response_mask=mask
    )
    assert out.n_catastrophic == 2
    (b0, t0, d0), (b1, t1, d1) = out.catastrophic
    assert (b0, t0, b1, t1) == (5, 17, 3, 4)
    assert d0 == pytest.approx(-4.0) and d1 == pytest.approx(3.0)
    assert "catastrophic token (5, 17)" in out.report()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_inputs_equal_float64_of_the_same_values(dtype: torch.dtype) -> None:
    tr, ro, rs, mask = _scores(8, rollout_scale=2.0, sigma0=0.05)
    tr, ro, rs = tr.to(dtype), ro.to(dtype), rs.to(dtype)
    low = logprob_mismatch(
        trainer_logprobs=tr, rollout_logprobs=ro, rescored_logprobs=rs, response_mask=mask
    )
    ref = logprob_mismatch(
        trainer_logprobs=tr.double(),
        rollout_logprobs=ro.double(),
        rescored_logprobs=rs.double(),
        response_mask=mask,
    )
    assert low == ref
    # mixed dtypes (bf16 rollout beside an fp32 trainer) are upcast, not rejected
    mixed = logprob_mismatch(trainer_logprobs=tr.float(), rollout_logprobs=ro, response_mask=mask)
    assert mixed.n_tokens == int(mask.sum())


def test_bad_inputs_and_options_are_named() -> None:
    tr, ro, rs, mask = _scores(9, rollout_scale=1.0)
    with pytest.raises(ConfigError, match="alpha must lie in"):
        logprob_mismatch(trainer_logprobs=tr, rollout_logprobs=ro, response_mask=mask, alpha=1.5)
    with pytest.raises(ConfigError, match="band must satisfy"):
        logprob_mismatch(
            trainer_logprobs=tr, rollout_logprobs=ro, response_mask=mask, band=(1.1, 0.9)
        )
    with pytest.raises(ConfigError, match="catastrophic_ratio"):
        logprob_mismatch(
            trainer_logprobs=tr, rollout_logprobs=ro, response_mask=mask, catastrophic_ratio=0.5
        )
    with pytest.raises(InputError, match=r"rescored_logprobs must have shape \[B, T\]"):
        logprob_mismatch(
            trainer_logprobs=tr, rollout_logprobs=ro, rescored_logprobs=rs[:1], response_mask=mask
        )
    nan = ro.clone()
    nan[0, 0] = float("nan")
    with pytest.raises(
        InputError, match=r"rollout_logprobs holds NaN at response positions \(0, 0\)"
    ):
        logprob_mismatch(trainer_logprobs=tr, rollout_logprobs=nan, response_mask=mask)
    far = ro.clone()
    far[0, 0] = -1000.0
    with pytest.raises(NumericalError, match=r"overflows float64 at positions \(0, 0\)"):
        logprob_mismatch(trainer_logprobs=tr, rollout_logprobs=far, response_mask=mask)
    with pytest.raises(InputError, match="selects no token"):
        logprob_mismatch(
            trainer_logprobs=tr, rollout_logprobs=ro, response_mask=torch.zeros_like(mask)
        )
