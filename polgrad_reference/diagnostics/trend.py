"""Changepoint test for a per-step series (entropy), calibrated by permutation.

Statistic for a series ``x_1..x_n`` (``direction="decrease"``): the largest standardised
drop of the mean at a split,

    T(x) = max_{1 <= k < n} sqrt(k (n - k) / n) (mean(x_1..x_k) - mean(x_{k+1}..x_n)) / sd(x),

(``"increase"`` negates the difference, ``"both"`` takes its absolute value); the argmax
``k`` estimates the changepoint (the first index after the change is ``k``).

``dependence="exchangeable"``: **null** — the series is exchangeable (i.i.d. steps, no
trend). With ``M`` uniformly random permutations ``pi_j`` and ``p = (1 + #{j : T(pi_j x) >=
T(x)}) / (M + 1)``, ``P(p <= alpha) <= floor(alpha (M + 1)) / (M + 1) <= alpha`` for every
``n`` and ``M`` (Phipson & Smyth 2010, Stat. Appl. Genet. Mol. Biol. 9(1)); ties count
against the alarm (they occur when the maximum sits at an edge split).

``dependence="ar1"`` (default): real metric series are autocorrelated (consecutive steps
share most of the policy), and an exchangeable test rejects 0.16-0.69 of AR(1) series
with no change (``bench/calibration.py``). **Null:** no change in mean, and the
fluctuations are a stationary AR(1) ``e_t = phi e_{t-1} + eta_t`` with i.i.d. innovations,
``0 <= phi <= 0.95`` (short-range dependence; a negative ``phi`` makes the test
conservative). The series is prewhitened, ``y_t = x_t - phi_hat x_{t-1}`` (``t >= 2``: a
mean shift ``delta`` in ``x`` stays a shift ``(1 - phi) delta`` in ``y``), and the
permutation test runs on ``y``. ``phi_hat`` is the lag-1 autocorrelation about the whole
series' mean with Kendall's bias correction ``+ (1 + 3 phi_hat) / n`` (Kendall 1954,
Biometrika 41, "Note on bias in the estimation of autocorrelation"), clipped to
``[0, 0.95]``. Estimated about the whole mean, a change inflates ``phi_hat`` (the test
loses some power, never level); estimated about a fitted split it would be biased low
under the null and over-reject (0.10 at ``phi = 0.5``). The statistic is taken on the
average ranks of ``y``: a large clean step turns ``phi_hat`` towards 1 and leaves one
spike in ``y`` that would dominate a mean-based statistic, but only one rank. Approximate,
not exact: the benchmark measures its level for ``n`` in 30..200 and ``phi`` in 0..0.8.
The changepoint and the means are read on ``x``.

The default ``M = 199`` makes the level ``0.05``. With fewer than ``2 / alpha``
arrangements (``n! < 2/alpha``) the test refuses to decide.
Tests: ``tests/reference/diagnostics/test_trend.py``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch

from .. import _validate as v
from ..errors import ConfigError, InputError
from ._common import COMPUTE, DiagnosticResult, check_alpha, min_permutation_rows

__all__ = ["ChangepointTest", "entropy_trend"]

_DIRECTIONS = ("decrease", "increase", "both")
_DEPENDENCE = ("ar1", "exchangeable")
_PHI_MAX = 0.95
_CHUNK_ELEMENTS = 1 << 22


@dataclasses.dataclass(frozen=True)
class ChangepointTest(DiagnosticResult):
    """Result of the permutation changepoint test on one series."""

    namespace = "trend"

    n: int
    direction: str
    dependence: str
    """``"ar1"`` (prewhitened) or ``"exchangeable"``."""
    phi: float
    """The AR(1) coefficient the series was prewhitened with (0 for exchangeable)."""
    statistic: float
    p_value: float
    alpha: float
    level: float
    """The size ``floor(alpha (M + 1)) / (M + 1)`` of the test (exact without ties, an upper
    bound with them)."""
    alarm: bool
    """``decided`` and ``p_value <= alpha``."""
    decided: bool
    """False when the series is too short to reach ``alpha`` (``min_steps``)."""
    min_steps: int
    changepoint: int
    """Index of the first value after the estimated change."""
    mean_before: float
    mean_after: float
    n_permutations: int

    def _metrics(self) -> dict[str, float]:
        return {
            "statistic": self.statistic,
            "p_value": self.p_value,
            "alarm": float(self.alarm),
            "decided": float(self.decided),
            "phi": self.phi,
            "changepoint": float(self.changepoint),
            "mean_before": self.mean_before,
            "mean_after": self.mean_after,
            "level": self.level,
        }

    def summary(self) -> str:
        verdict = "ALARM" if self.alarm else "ok"
        if not self.decided:
            verdict = f"undecided (too few steps to decide: needs at least {self.min_steps})"
        return (
            f"changepoint ({self.direction}, {self.dependence}) {verdict}: "
            f"p={self.p_value:.3g} (level "
            f"{self.level:.3g}), split at {self.changepoint}: mean {self.mean_before:.4g} -> "
            f"{self.mean_after:.4g} over n={self.n}"
        )


def _split_statistics(x: torch.Tensor, direction: str) -> torch.Tensor:
    """``[..., n - 1]`` standardised mean differences at every split of the last dim."""
    n = x.shape[-1]
    cs = torch.cumsum(x, dim=-1)
    k = torch.arange(1, n, device=x.device, dtype=x.dtype)
    before = cs[..., :-1] / k
    after = (cs[..., -1:] - cs[..., :-1]) / (n - k)
    diff = (before - after) * torch.sqrt(k * (n - k) / n)
    if direction == "increase":
        return -diff
    if direction == "both":
        return diff.abs()
    return diff


def _series(values: object) -> torch.Tensor:
    if isinstance(values, torch.Tensor):
        t = v.require_float_tensor("values", values)
        if t.dim() != 1:
            raise InputError(f"values must be 1-D [n], got shape {list(t.shape)}")
        x = t.detach().to(COMPUTE)
    elif isinstance(values, Sequence) and not isinstance(values, (str, bytes)):
        if not all(isinstance(a, (int, float)) and not isinstance(a, bool) for a in values):
            raise InputError("values must be a 1-D float tensor or a sequence of real numbers")
        x = torch.tensor([float(a) for a in values], dtype=COMPUTE, device="cpu")
    else:
        raise InputError(
            f"values must be a 1-D float tensor or a sequence of real numbers, got "
            f"{type(values).__name__}"
        )
    if x.numel() < 3:
        raise InputError(f"values must hold at least 3 steps, got {x.numel()}")
    v.require_finite_where("values", x, None)
    return x


def _ar1_coefficient(x: torch.Tensor) -> float:
    """Lag-1 autocorrelation about the mean, plus Kendall's ``(1 + 3 phi) / n``, clipped to
    ``[0, 0.95]``."""
    n = x.numel()
    r = x - x.mean()
    denom = float(r.square().sum())
    if denom == 0.0:
        return 0.0
    phi = float((r[1:] * r[:-1]).sum()) / denom
    return min(max(phi + (1.0 + 3.0 * phi) / n, 0.0), _PHI_MAX)


def _average_ranks(y: torch.Tensor) -> torch.Tensor:
    """Ranks ``1..n`` of a 1-D tensor, ties given their average rank."""
    order = torch.argsort(y)
    _, inverse, counts = torch.unique_consecutive(y[order], return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, dim=0).to(COMPUTE)
    mid = ends - (counts.to(COMPUTE) - 1.0) / 2.0
    ranks = torch.empty_like(y)
    ranks[order] = mid[inverse]
    return ranks


def _min_steps(alpha: float, dependence: str) -> int:
    """Shortest series whose permutations (of ``n`` or ``n - 1`` values) reach ``alpha``."""
    lost = 1 if dependence == "ar1" else 0
    return max(3 + lost, min_permutation_rows(alpha) + lost)


def entropy_trend(
    values: torch.Tensor | Sequence[float],
    *,
    alpha: float = 0.05,
    direction: str = "decrease",
    dependence: str = "ar1",
    n_permutations: int = 199,
    seed: int = 0,
) -> ChangepointTest:
    """Permutation changepoint test of a per-step series (entropy by default reads
    ``decrease``), prewhitened for AR(1) dependence unless ``dependence="exchangeable"``;
    deterministic for a given ``seed``; permutations drawn on the series' device."""
    a = check_alpha(alpha)
    if direction not in _DIRECTIONS:
        raise ConfigError(f"direction must be one of {_DIRECTIONS}, got {direction!r}")
    if dependence not in _DEPENDENCE:
        raise ConfigError(f"dependence must be one of {_DEPENDENCE}, got {dependence!r}")
    if isinstance(n_permutations, bool) or not isinstance(n_permutations, int):
        raise ConfigError(f"n_permutations must be a positive integer, got {n_permutations!r}")
    if n_permutations < 1:
        raise ConfigError(f"n_permutations must be >= 1, got {n_permutations}")
    x = _series(values)
    n = x.numel()
    splits_x = _split_statistics(x, direction)
    k = int(torch.argmax(splits_x))
    mean_before, mean_after = float(x[: k + 1].mean()), float(x[k + 1 :].mean())
    phi = _ar1_coefficient(x) if dependence == "ar1" else 0.0
    y = x[1:] - phi * x[:-1] if dependence == "ar1" else x
    if dependence == "ar1" and float(y.std(correction=0)) > 0:
        y = _average_ranks(y)
    sd = float(y.std(correction=0))
    obs = float(_split_statistics(y, direction).max()) / sd if sd > 0 else 0.0
    if sd > 0 and y.numel() >= 2:
        gen = torch.Generator(device=x.device).manual_seed(seed)
        tol = 1e-9 * max(1.0, abs(obs))  # rounding of the permuted cumulative sums
        count, done = 0, 0
        m = y.numel()
        step = max(1, _CHUNK_ELEMENTS // m)
        while done < n_permutations:
            rows = min(step, n_permutations - done)
            keys = torch.rand((rows, m), generator=gen, device=x.device, dtype=COMPUTE)
            perm = y[torch.argsort(keys, dim=1)]
            stats = _split_statistics(perm, direction).amax(dim=1) / sd
            count += int((stats >= obs - tol).sum())
            done += rows
        p = (1 + count) / (1 + n_permutations)
    else:
        p = 1.0  # a constant series carries no evidence of change
    level = math.floor(a * (n_permutations + 1)) / (n_permutations + 1)
    min_steps = _min_steps(a, dependence)
    decided = n >= min_steps and (n_permutations + 1) * a >= 1.0
    return ChangepointTest(
        n=n,
        direction=direction,
        dependence=dependence,
        phi=phi,
        statistic=obs,
        p_value=p,
        alpha=a,
        level=level,
        alarm=decided and p <= a,
        decided=decided,
        min_steps=min_steps,
        changepoint=k + 1,
        mean_before=mean_before,
        mean_after=mean_after,
        n_permutations=n_permutations,
    )
