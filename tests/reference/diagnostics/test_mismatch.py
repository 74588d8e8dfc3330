"""Trainer-vs-rollout mismatch (docs/diagnostics.md, "Mismatch").

Null (noise floor): within each row the rollout's discrepancy is no larger than margin x
the trainer's re-scoring discrepancy plus atol; at its boundary (trainer, rollout and a
second trainer pass the truth plus noise of one distribution, margin 1, atol 0) the row
sign-flip test rejects at alpha +- 3 sqrt(alpha (1 - alpha) / R), with or without noise
shared along rows. Inside it (rollout 5% noisier, default margin 1.1; a bitwise rescore
with 1e-6 jitter) it stays quiet. Power: rollout noise 1.5x the noise floor, the
example's injected effect.
"""

from __future__ import annotations

import math

import pytest
import torch

from polgrad_reference.diagnostics import logprob_mismatch
from polgrad_reference.errors import ConfigError, InputError, NumericalError


def _mask(g: torch.Generator, b: int, t: int) -> torch.Tensor:
    return torch.arange(t)[None] < torch.randint(1, t + 1, (b, 1), generator=g)


def _scores(
    seed: int,
    *,
    rollout_scale: float,
    b: int = 32,
    t: int = 64,
    sigma0: float = 0.01,
    trainer_scale: float = 1.0,
    row_share: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Trainer, rollout and re-score: the truth plus noise; ``row_share`` of each noise's
    variance is one draw shared by the whole row (errors correlated along a row)."""
    g = torch.Generator().manual_seed(seed)
    mask = _mask(g, b, t)
    truth = -3.0 * torch.rand((b, t), generator=g, dtype=torch.float64)

    def noisy(scale: float) -> torch.Tensor:
        tok = torch.randn((b, t), generator=g, dtype=torch.float64)
        row = torch.randn((b, 1), generator=g, dtype=torch.float64)
        e = math.sqrt(1 - row_share) * tok + math.sqrt(row_share) * row
        return truth + scale * sigma0 * e

    return noisy(trainer_scale), noisy(rollout_scale), noisy(1.0), mask


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


@pytest.mark.parametrize("row_share", [0.0, 0.5])
def test_noise_floor_null_false_alarm_rate_is_within_alpha(row_share: float) -> None:
    """At the null's boundary (margin 1, atol 0: the rollout exactly as noisy as the
    floor) the row sign-flip test rejects at alpha, also when half of every noise is
    shared along the row (where the token-level sign test rejected 0.076-0.179)."""
    alpha, reps = 0.05, 300
    alarms, zs = 0, []
    for seed in range(reps):
        tr, ro, rs, mask = _scores(seed, rollout_scale=1.0, row_share=row_share)
        out = logprob_mismatch(
            trainer_logprobs=tr,
            rollout_logprobs=ro,
            rescored_logprobs=rs,
            response_mask=mask,
            alpha=alpha,
            margin=1.0,
            atol=0.0,
            n_resamples=199,
            seed=seed,
        )
        assert out.decided
        alarms += out.alarm
        assert out.z is not None
        zs.append(out.z)
    rate = alarms / reps
    tol = 3.0 * math.sqrt(alpha * (1 - alpha) / reps)
    assert rate <= alpha + tol, rate
    assert rate >= alpha - tol, rate  # exact at the boundary: not a dead alarm
    mean = sum(zs) / reps
    var = sum((z - mean) ** 2 for z in zs) / (reps - 1)
    assert abs(mean) < 4 / math.sqrt(reps) and abs(var - 1.0) < 4 * math.sqrt(2 / reps)


def test_a_rollout_5_percent_noisier_than_the_floor_does_not_alarm_at_32k_tokens() -> None:
    """The token-level sign test alarmed on 99.5% of these batches; 5% is inside the
    default margin of 1.1."""
    for seed in range(10):
        tr, ro, rs, mask = _scores(seed, rollout_scale=1.05, b=512, t=64)
        mask[:] = True  # 32,768 tokens
        out = logprob_mismatch(
            trainer_logprobs=tr,
            rollout_logprobs=ro,
            rescored_logprobs=rs,
            response_mask=mask,
            seed=seed,
        )
        assert out.n_tokens == 32768 and out.decided and not out.alarm, out.summary()


def test_a_bitwise_equal_rescore_does_not_turn_rounding_into_an_alarm() -> None:
    tr, _, _, mask = _scores(3, rollout_scale=1.0)
    g = torch.Generator().manual_seed(3)
    jitter = 1e-6 * torch.randn(tr.shape, generator=g, dtype=torch.float64)
    out = logprob_mismatch(
        trainer_logprobs=tr,
        rollout_logprobs=tr + jitter,
        rescored_logprobs=tr.clone(),
        response_mask=mask,
    )
    assert out.noise_rms == 0.0 and not out.alarm and out.n_exceed == 0, out.summary()
    noise = 0.01 * torch.randn(tr.shape, generator=g, dtype=torch.float64)
    real = logprob_mismatch(
        trainer_logprobs=tr,
        rollout_logprobs=tr + noise,
        rescored_logprobs=tr.clone(),
        response_mask=mask,
    )
    assert real.alarm, real.summary()


def test_rollout_drift_at_the_injected_size_fires() -> None:
    """The example's injection: an exact trainer, re-scoring noise sd 0.01, rollout 1.5x."""
    for seed in range(20):
        tr, ro, rs, mask = _scores(1000 + seed, rollout_scale=1.5, trainer_scale=0.0, b=64)
        out = logprob_mismatch(
            trainer_logprobs=tr,
            rollout_logprobs=ro,
            rescored_logprobs=rs,
            response_mask=mask,
            seed=seed,
        )
        assert out.alarm and out.p_value < 1e-3, out.summary()
        assert out.noise_rms is not None and out.rms > out.noise_rms


@pytest.mark.parametrize(
    ("exceed", "p"), [((1,) * 6, 1 / 64), ((2, 1, 1, 1, 1, 1), 1 / 64), ((1,) * 5 + (-1,), 7 / 64)]
)
def test_sign_flip_p_value_is_the_exact_tail_over_rows(exceed: tuple[int, ...], p: float) -> None:
    """Row b holds |c_b| tokens that exceed (|d| = 0.2 > |d0| = 0.1) or stay within (swapped)
    and one tie (dropped); P(sum_b eps_b |c_b| >= sum_b c_b) over fair signs, within 4
    Monte Carlo standard errors of its 19,999 sign flips."""
    rows = len(exceed)
    mask = torch.zeros((rows, 3), dtype=torch.bool)
    tr = torch.full((rows, 3), -1.0, dtype=torch.float64)
    d, d0 = torch.zeros((rows, 3)), torch.zeros((rows, 3))
    for b, c in enumerate(exceed):
        mask[b, : abs(c) + 1] = True
        d[b, : abs(c)], d0[b, : abs(c)] = (0.2, 0.1) if c > 0 else (0.1, 0.2)
        d[b, abs(c)] = d0[b, abs(c)] = 0.3  # a tie
    out = logprob_mismatch(
        trainer_logprobs=tr,
        rollout_logprobs=tr - d.double(),
        rescored_logprobs=tr - d0.double(),
        response_mask=mask,
        alpha=0.1,
        margin=1.0,
        atol=0.0,
        n_resamples=19_999,
    )
    assert out.n_rows_informative == rows and out.decided
    assert out.n_informative == sum(abs(c) for c in exceed)
    assert out.n_exceed == sum(c for c in exceed if c > 0)
    assert abs(out.p_value - p) <= 4 * math.sqrt(p * (1 - p) / 19_999) + 1 / 20_000, out.p_value
    assert out.alarm == (out.p_value <= 0.1)


def test_too_few_rows_to_decide_instead_of_alarming() -> None:
    tr, _, rs, mask = _scores(4, rollout_scale=1.0, b=5)
    out = logprob_mismatch(
        trainer_logprobs=tr, rollout_logprobs=tr + 1.0, rescored_logprobs=rs, response_mask=mask
    )  # every token far off, but 5 rows cannot reach alpha = 1e-3 (2^5 < 2000)
    assert out.n_exceed == out.n_tokens and not out.decided and not out.alarm
    assert out.min_rows == 11 and "too few rows to decide" in out.summary()
    assert "at least 11" in out.summary()


def test_ratio_quantiles_interpolate_the_sorted_ratios() -> None:
    """Linear interpolation between order statistics, as torch.quantile; on ratios
    1, 2, ..., 101 the q-quantile is 1 + 100 q exactly."""
    mask = torch.ones((1, 101), dtype=torch.bool)
    ratios = torch.arange(1, 102, dtype=torch.float64).flip(0)[None]  # unsorted order
    ro = torch.full((1, 101), -5.0, dtype=torch.float64)
    qs = (0.0, 0.001, 0.01, 0.257, 0.5, 0.99, 0.999, 1.0)
    out = logprob_mismatch(
        trainer_logprobs=ro + ratios.log(), rollout_logprobs=ro, response_mask=mask, quantiles=qs
    )
    for q, r in out.quantiles:
        assert r == pytest.approx(1.0 + 100.0 * q, rel=1e-12), (q, r)
    tr, ro2, _, mask2 = _scores(11, rollout_scale=5.0, sigma0=0.1)
    got = logprob_mismatch(
        trainer_logprobs=tr, rollout_logprobs=ro2, response_mask=mask2, quantiles=qs
    )
    w = torch.exp(tr - ro2)[mask2]
    ref = torch.quantile(w, torch.tensor(qs, dtype=torch.float64))
    assert [r for _, r in got.quantiles] == pytest.approx(ref.tolist(), rel=1e-12)


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
    # issue 28: these were raw ValueErrors from float()
    with pytest.raises(ConfigError, match="catastrophic_ratio must be a real number, got 'ten'"):
        logprob_mismatch(
            trainer_logprobs=tr,
            rollout_logprobs=ro,
            response_mask=mask,
            catastrophic_ratio="ten",  # type: ignore[arg-type]
        )
    with pytest.raises(ConfigError, match=r"band must be a \(low, high\) tuple of real ratios"):
        logprob_mismatch(
            trainer_logprobs=tr,
            rollout_logprobs=ro,
            response_mask=mask,
            band=("a", "b"),  # type: ignore[arg-type]
        )
    with pytest.raises(ConfigError, match="quantiles must be a non-empty tuple"):
        logprob_mismatch(
            trainer_logprobs=tr,
            rollout_logprobs=ro,
            response_mask=mask,
            quantiles="0.5",  # type: ignore[arg-type]
        )
    with pytest.raises(ConfigError, match="margin must be a finite factor >= 1"):
        logprob_mismatch(trainer_logprobs=tr, rollout_logprobs=ro, response_mask=mask, margin=0.9)
    with pytest.raises(ConfigError, match="atol must be a finite log-ratio >= 0"):
        logprob_mismatch(trainer_logprobs=tr, rollout_logprobs=ro, response_mask=mask, atol=-1e-3)
    with pytest.raises(ConfigError, match=r"n_resamples = 99 cannot reach alpha = 0\.001"):
        logprob_mismatch(
            trainer_logprobs=tr, rollout_logprobs=ro, response_mask=mask, n_resamples=99
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
