"""Length bias (docs/diagnostics.md, "Length bias").

Data: lengths uniform on {8..128}, A = beta (L - mu) / sigma_L + N(0, 1). The population
drive D* is computed exactly by summing over the 121 lengths (E|N(m, 1)| in closed
form). Coverage: the nominal 95% interval covers D* in 0.95 +- 3 binomial standard
errors of R replicates, for token-mean (W ~ L) and seq-mean-token-mean (W constant), at
the null beta = 0 (where D* = 0, so this is also the false-alarm rate) and beta = 0.5.
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
    return num / (sd * den)


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
        out = length_bias(advantages=adv, response_mask=mask, aggregation=aggregation)
        covered += out.ci_low <= truth <= out.ci_high
    cover = covered / reps
    assert abs(cover - 0.95) <= 3 * math.sqrt(0.95 * 0.05 / reps), (cover, truth)


def test_a_length_bias_at_the_injected_size_is_detected() -> None:
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        adv, mask = _batch(g, 1.0, 64)  # the example's injected size
        out = length_bias(advantages=adv, response_mask=mask, aggregation="token-mean")
        assert out.alarm and out.drive > 0 and out.z > 1.96, out.summary()


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
    assert one_group_per_row == rows
    paired = length_bias(
        advantages=adv, response_mask=mask, aggregation="token-mean", groups=torch.arange(64) // 2
    )
    assert paired.drive == rows.drive and paired.stderr != rows.stderr and paired.n_clusters == 32


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
    with pytest.raises(InputTypeError, match=r"advantages must be a torch\.Tensor"):
        length_bias(advantages=[1.0], response_mask=mask, aggregation="token-mean")  # type: ignore[arg-type]
