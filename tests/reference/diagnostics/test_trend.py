"""Permutation changepoint test (docs/diagnostics.md, "Changepoint").

Level: under an exchangeable series (dependence="exchangeable") P(p <= alpha) <=
floor(alpha (M + 1)) / (M + 1), with equality up to ties; the Monte Carlo rejection rate
over R null series is within that level +- 3 binomial standard errors (valid, and not a
dead alarm), for Gaussian and heavy-tailed (Cauchy) steps alike. The default prewhitens
AR(1) dependence: AR(1) series with phi = 0.5 and no change stay within the level.
Power: a drop of one standard deviation at the middle of a 100-step series.
"""

from __future__ import annotations

import math

import pytest
import torch

from polgrad_reference.diagnostics import entropy_trend
from polgrad_reference.errors import ConfigError, InputError


@pytest.mark.parametrize(
    ("law", "m"), [("normal", 19), ("cauchy", 19), ("normal", 39), ("normal", 29)]
)
def test_level_is_exact_under_exchangeability(law: str, m: int) -> None:
    g = torch.Generator().manual_seed(0)
    reps, n, alpha = 1500, 30, 0.05
    rejected = 0
    for i in range(reps):
        x = torch.randn(n, generator=g, dtype=torch.float64)
        if law == "cauchy":
            x = torch.tan(math.pi * (torch.rand(n, generator=g, dtype=torch.float64) - 0.5))
        out = entropy_trend(x, alpha=alpha, n_permutations=m, seed=i, dependence="exchangeable")
        rejected += out.alarm
    level = math.floor(alpha * (m + 1)) / (m + 1)
    assert out.level == level
    rate = rejected / reps
    assert abs(rate - level) <= 3 * math.sqrt(level * (1 - level) / reps), (rate, level)


def _ar1(g: torch.Generator, n: int, phi: float) -> torch.Tensor:
    """x_t = phi x_{t-1} + e_t after a burn-in of 50, in Python floats (float64, the same
    two roundings per step as 0-dim tensors, bitwise: a tenth of the time)."""
    e = torch.randn(n + 50, generator=g, dtype=torch.float64).tolist()
    x = [0.0] * (n + 50)
    for t in range(1, n + 50):
        x[t] = phi * x[t - 1] + e[t]
    return torch.tensor(x[50:], dtype=torch.float64)


@pytest.mark.parametrize("n", [30, 100])
def test_ar1_series_without_a_change_keep_the_level(n: int) -> None:
    """AR(1) with phi = 0.5 and no change: the exchangeable test rejects far above 0.05
    (0.16-0.69 in the audit); the prewhitened one stays within the level."""
    g = torch.Generator().manual_seed(7)
    reps, rejected, naive = 400, 0, 0
    for i in range(reps):
        x = _ar1(g, n, 0.5)
        out = entropy_trend(x, n_permutations=99, seed=i)
        assert out.dependence == "ar1" and 0.0 <= out.phi <= 0.95 and out.decided
        rejected += out.alarm
        if i < 100:
            naive += entropy_trend(x, n_permutations=99, seed=i, dependence="exchangeable").alarm
    assert rejected / reps <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / reps), rejected / reps
    assert naive / 100 > 0.12  # the exchangeable null does not hold here


def test_too_few_steps_to_decide_instead_of_alarming() -> None:
    out = entropy_trend([5.0, 4.0, 3.0, 2.0, 1.0])  # a clean drop, but 4! < 2 / 0.05
    assert not out.decided and not out.alarm and out.min_steps == 6
    assert "too few steps to decide" in out.summary()
    assert entropy_trend([6.0, 5.0, 4.0, 3.0, 2.0, 1.0], dependence="exchangeable").decided


def test_a_drop_at_the_middle_is_found_and_located() -> None:
    g = torch.Generator().manual_seed(1)
    located = fired = 0
    for i in range(30):
        x = torch.randn(100, generator=g, dtype=torch.float64)
        x[50:] -= 1.0
        out = entropy_trend(x, seed=i)
        fired += out.alarm
        located += out.alarm and abs(out.changepoint - 50) <= 8
        assert out.mean_before > out.mean_after
    # the two-sample z of a 1-sd drop at n = 100 is 5: power well above 0.9
    assert fired >= 27 and located >= 24, (fired, located)


def test_direction() -> None:
    x = (
        torch.cat([torch.zeros(20), -torch.ones(20)]).double()
        + 0.01 * torch.arange(40).double().sin()
    )
    assert entropy_trend(x, direction="decrease").alarm
    assert not entropy_trend(x, direction="increase").alarm
    assert entropy_trend(x, direction="both").alarm
    assert entropy_trend(-x, direction="increase").alarm


def test_deterministic_constant_and_list_inputs() -> None:
    x = [math.sin(i) for i in range(25)]
    a, b = entropy_trend(x, seed=3), entropy_trend(torch.tensor(x, dtype=torch.float64), seed=3)
    assert a == b
    const = entropy_trend([1.0] * 10)
    assert const.p_value == 1.0 and not const.alarm and const.statistic == 0.0
    assert entropy_trend(torch.tensor(x).bfloat16()).n == 25


def test_bad_inputs_are_named() -> None:
    with pytest.raises(InputError, match="at least 3 steps"):
        entropy_trend([1.0, 2.0])
    with pytest.raises(InputError, match=r"values holds NaN at positions \(1\)"):
        entropy_trend([1.0, math.nan, 2.0])
    with pytest.raises(InputError, match=r"values must be 1-D"):
        entropy_trend(torch.zeros((3, 3)))
    with pytest.raises(InputError, match="sequence of real numbers"):
        entropy_trend(["a", "b", "c"])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="direction must be one of"):
        entropy_trend([1.0, 2.0, 3.0], direction="down")
    with pytest.raises(ConfigError, match="dependence must be one of"):
        entropy_trend([1.0, 2.0, 3.0], dependence="block")
    with pytest.raises(ConfigError, match="n_permutations must be >= 1"):
        entropy_trend([1.0, 2.0, 3.0], n_permutations=0)
    with pytest.raises(ConfigError, match="alpha must lie in"):
        entropy_trend([1.0, 2.0, 3.0], alpha=0.0)


def test_the_smallest_p_value_is_one_over_m_plus_one() -> None:
    # a monotone drop beats every permutation; the p-value is 1/(M + 1), never 0
    out = entropy_trend([-float(i) for i in range(50)], n_permutations=199)
    assert out.p_value == 1 / 200 and out.alarm and out.level == 0.05
