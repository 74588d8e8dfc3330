"""Length bias (docs/diagnostics.md, "Length bias").

Data: lengths uniform on {8..128}, A = beta (L - mu) / sigma_L + N(0, 1). The population
drive D* is computed exactly by summing over the 121 lengths (E|N(m, 1)| in closed
form). Coverage: the nominal 95% interval (approximate) covers D* in 0.95 +- 3 binomial
standard errors of R replicates at 128 rows, for token-mean (W ~ L) and
seq-mean-token-mean (W constant), at beta = 0 and beta = 0.5. The alarm is the sign-flip
(or within-group permutation) test: its level holds at B = 16 and with two prompts, where
the interval does not, and its z is N(0, 1) at the example's shape.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import pytest
import torch

from polgrad_reference.diagnostics import length_bias
from polgrad_reference.errors import ConfigError, InputError, InputTypeError

LENGTHS = range(8, 129)
T = 128


def _population_drive(beta: float, power: int) -> float:
    ls = list(LENGTHS)
    mu = sum(ls) / len(ls)
    sd = math.sqrt(sum((x - mu) ** 2 for x in ls) / len(ls))
    nd = NormalDist()

    def mean_abs(m: float) -> float:  # E|N(m, 1)|
        return m * (1 - 2 * nd.cdf(-m)) + 2 * nd.pdf(m)

    num = sum(x**power * beta * (x - mu) ** 2 / sd for x in ls) / len(ls)
    den = sum(x**power * mean_abs(beta * (x - mu) / sd) for x in ls) / len(ls)
    return float(num / (sd * den))


def _batch(g: torch.Generator, beta: float, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.randint(8, 129, (b,), generator=g)
    mask = torch.arange(T)[None] < lengths[:, None]
    ls = torch.arange(8, 129, dtype=torch.float64)
    z = (lengths.double() - ls.mean()) / ls.std(correction=0)
    adv = beta * z + torch.randn(b, generator=g, dtype=torch.float64)
    return adv, mask


@pytest.mark.parametrize("beta", [0.0, 0.5])
@pytest.mark.parametrize(("aggregation", "power"), [("token-mean", 1), ("seq-mean-token-mean", 0)])
def test_interval_coverage_is_calibrated(aggregation: str, power: int, beta: float) -> None:
    g = torch.Generator().manual_seed(0)
    truth = _population_drive(beta, power)
    reps, covered = 300, 0
    for _ in range(reps):
        adv, mask = _batch(g, beta, 128)
        # the interval does not depend on the sign-flip test's rearrangements: the fewest
        # the test accepts at alpha = 0.05 (19) instead of the default 999 (each a row of
        # a [M, B] matrix product), the same intervals
        out = length_bias(
            advantages=adv, response_mask=mask, aggregation=aggregation, n_resamples=19
        )
        covered += out.ci_low <= truth <= out.ci_high
    cover = covered / reps
    assert abs(cover - 0.95) <= 3 * math.sqrt(0.95 * 0.05 / reps), (cover, truth)


def test_a_length_bias_at_the_injected_size_is_detected() -> None:
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        adv, mask = _batch(g, 1.0, 64)  # the example's injected size
        out = length_bias(advantages=adv, response_mask=mask, aggregation="token-mean")
        assert out.alarm and out.drive > 0 and out.t > 1.96 and out.z > 1.96, out.summary()


def test_value_and_weight_slope_follow_the_aggregation() -> None:
    # two rows, lengths 1 and 3, advantages +1 and -1
    mask = torch.tensor([[True, False, False], [True, True, True]])
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    # token-mean W = (1, 3)/4: D = sum W A (L - 2) / (sd_L sum W |A|) = (-1 - 3)/(1 * 4) = -1
    tm = length_bias(advantages=adv, response_mask=mask, aggregation="token-mean")
    assert tm.drive == pytest.approx(-1.0, rel=1e-15) and tm.weight_length_slope == pytest.approx(
        1.0
    )
    sm = length_bias(advantages=adv, response_mask=mask, aggregation="seq-mean-token-mean")
    assert sm.drive == pytest.approx(-1.0, rel=1e-15) and sm.weight_length_slope == pytest.approx(
        0.0, abs=1e-15
    )
    # with lengths 1 and 3 and A = (+1, +1): W-weighted mean length above the mean -> long
    pos = torch.ones(2, dtype=torch.float64)
    assert length_bias(
        advantages=pos, response_mask=mask, aggregation="token-mean"
    ).drive == pytest.approx(0.5)
    assert (
        length_bias(advantages=pos, response_mask=mask, aggregation="seq-mean-token-mean").drive
        == 0.0
    )
    nrm = length_bias(advantages=pos, response_mask=mask, aggregation="token-sum-norm", budget=4)
    assert nrm.drive == pytest.approx(0.5) and nrm.weight_length_slope == pytest.approx(1.0)


def test_groups_cluster_the_standard_error() -> None:
    g = torch.Generator().manual_seed(2)
    adv, mask = _batch(g, 0.0, 64)
    rows = length_bias(advantages=adv, response_mask=mask, aggregation="token-mean")
    one_group_per_row = length_bias(
        advantages=adv, response_mask=mask, aggregation="token-mean", groups=torch.arange(64)
    )
    # the same interval; but singleton groups leave nothing to permute: no decision
    assert (one_group_per_row.stderr, one_group_per_row.ci_low) == (rows.stderr, rows.ci_low)
    assert rows.method == "sign-flip" and rows.decided
    assert one_group_per_row.method == "permutation" and not one_group_per_row.decided
    paired = length_bias(
        advantages=adv, response_mask=mask, aggregation="token-mean", groups=torch.arange(64) // 2
    )
    assert paired.drive == rows.drive and paired.stderr != rows.stderr and paired.n_clusters == 32


def _example_batch(g: torch.Generator, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The example's null shape: lengths U(16..64), A ~ N(0, 1) independent of them."""
    lengths = torch.randint(16, 65, (b,), generator=g)
    mask = torch.arange(64)[None] < lengths[:, None]
    return torch.randn(b, generator=g, dtype=torch.float64), mask


def test_null_z_is_standard_normal_at_the_examples_shape() -> None:
    """The delta-method z had variance 1.25 here (P(|z| > 1.96) = 0.077); the sign-flip
    z is exactly N(0, 1)."""
    g = torch.Generator().manual_seed(5)
    reps, zs, alarms = 1000, [], 0
    for seed in range(reps):
        adv, mask = _example_batch(g, 64)
        out = length_bias(
            advantages=adv,
            response_mask=mask,
            aggregation="token-mean",
            n_resamples=199,
            seed=seed,
        )
        zs.append(out.z)
        alarms += out.alarm
    mean = sum(zs) / reps
    var = sum((z - mean) ** 2 for z in zs) / (reps - 1)
    assert abs(mean) < 3 / math.sqrt(reps) and abs(var - 1.0) < 3 * math.sqrt(2 / reps), var
    assert alarms / reps <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / reps)


@pytest.mark.parametrize("grouped", [False, True])
def test_alarm_level_holds_at_small_batches_and_with_two_prompts(grouped: bool) -> None:
    """The interval excluded 0 in 0.178 of null batches at B = 16 and 0.343 with two
    prompt groups; the test's level holds there."""
    g = torch.Generator().manual_seed(6)
    reps, alarms = 400, 0
    for seed in range(reps):
        adv, mask = _example_batch(g, 16)
        groups = None
        if grouped:  # two prompts, GRPO-style: advantages centred and scaled per prompt
            groups = torch.arange(16) // 8
            adv = adv + 3.0 * groups.double()  # prompts differ in reward level
            for k in range(2):
                sel = groups == k
                adv[sel] = (adv[sel] - adv[sel].mean()) / adv[sel].std()
        out = length_bias(
            advantages=adv,
            response_mask=mask,
            aggregation="token-mean",
            groups=groups,
            n_resamples=199,
            seed=seed,
        )
        assert out.decided and out.method == ("permutation" if grouped else "sign-flip")
        alarms += out.alarm
    assert alarms / reps <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / reps), alarms / reps


def test_too_few_rows_to_decide_instead_of_alarming() -> None:
    mask = torch.arange(8)[None] < torch.tensor([[1], [2], [3], [4], [8]])
    adv = torch.tensor([-2.0, -1.0, 0.0, 1.0, 2.0], dtype=torch.float64)  # long rows rewarded
    out = length_bias(advantages=adv, response_mask=mask, aggregation="token-mean")
    assert out.drive > 0.5 and not out.decided and not out.alarm and out.min_rows == 6
    assert "too few rows to decide" in out.summary() and "at least 6" in out.summary()


def test_bfloat16_advantages_equal_float64_of_the_same_values() -> None:
    g = torch.Generator().manual_seed(3)
    adv, mask = _batch(g, 0.5, 32)
    low = length_bias(advantages=adv.bfloat16(), response_mask=mask, aggregation="token-mean")
    ref = length_bias(
        advantages=adv.bfloat16().double(), response_mask=mask, aggregation="token-mean"
    )
    assert low == ref


def test_bad_inputs_are_named() -> None:
    g = torch.Generator().manual_seed(4)
    adv, mask = _batch(g, 0.0, 16)
    with pytest.raises(ConfigError, match="aggregation must be one of"):
        length_bias(advantages=adv, response_mask=mask, aggregation="mean")
    with pytest.raises(ConfigError, match="level must be"):
        length_bias(advantages=adv, response_mask=mask, aggregation="token-mean", level=95)
    with pytest.raises(InputError, match=r"advantages must have shape \[B\]"):
        length_bias(
            advantages=adv[:, None].expand(16, T), response_mask=mask, aggregation="token-mean"
        )
    with pytest.raises(InputError, match="same length"):
        length_bias(advantages=adv, response_mask=torch.ones_like(mask), aggregation="token-mean")
    with pytest.raises(InputError, match="advantages are all 0"):
        length_bias(advantages=torch.zeros_like(adv), response_mask=mask, aggregation="token-mean")
    with pytest.raises(InputError, match="groups must be an integer tensor"):
        length_bias(advantages=adv, response_mask=mask, aggregation="token-mean", groups=adv)
    with pytest.raises(InputError, match="at least 2 clusters"):
        length_bias(
            advantages=adv,
            response_mask=mask,
            aggregation="token-mean",
            groups=torch.zeros(16, dtype=torch.long),
        )
    with pytest.raises(ConfigError, match="budget"):
        length_bias(advantages=adv, response_mask=mask, aggregation="token-sum-norm")
    with pytest.raises(ConfigError, match="seed must be a non-negative integer"):
        length_bias(advantages=adv, response_mask=mask, aggregation="token-mean", seed=1.5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="n_resamples must be a positive integer"):
        length_bias(advantages=adv, response_mask=mask, aggregation="token-mean", n_resamples=0)
    with pytest.raises(InputError, match=r"groups must have shape \[B\]"):
        length_bias(
            advantages=adv,
            response_mask=mask,
            aggregation="token-mean",
            groups=torch.zeros(3, dtype=torch.long),
        )
    with pytest.raises(InputTypeError, match=r"advantages must be a torch\.Tensor"):
        length_bias(advantages=[1.0], response_mask=mask, aggregation="token-mean")  # type: ignore[arg-type]
