"""Changepoint test with an exact permutation level, for a per-step series (entropy).

Statistic for a series ``x_1..x_n`` (``direction="decrease"``): the largest standardised
drop of the mean at a split,

    T(x) = max_{1 <= k < n} sqrt(k (n - k) / n) (mean(x_1..x_k) - mean(x_{k+1}..x_n)) / sd(x),

(``"increase"`` negates the difference, ``"both"`` takes its absolute value); the argmax
``k`` estimates the changepoint (the first index after the change is ``k``). Null: the
series is exchangeable (e.g. i.i.d. steps, no trend). With ``M`` uniformly random
permutations ``pi_j`` and ``p = (1 + #{j : T(pi_j x) >= T(x)}) / (M + 1)``, the observed
series is exchangeable with the permuted ones under the null, so ``P(p <= alpha) <=
floor(alpha (M + 1)) / (M + 1) <= alpha`` for every ``n`` and ``M``, with equality when no
permuted statistic ties the observed one (ties count against the alarm; they occur when
the maximum sits at an edge split) — a Monte Carlo permutation test (Phipson & Smyth
2010, Stat. Appl. Genet. Mol. Biol. 9(1), "Permutation p-values should never be zero").
The default ``M = 199`` makes the level ``0.05``. Calibrated in
``tests/reference/diagnostics/test_trend.py``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch

from .. import _validate as v
from ..errors import ConfigError, InputError
from ._common import COMPUTE, DiagnosticResult, check_alpha

__all__ = ["ChangepointTest", "entropy_trend"]

_DIRECTIONS = ("decrease", "increase", "both")
_CHUNK_ELEMENTS = 1 << 22


@dataclasses.dataclass(frozen=True)
class ChangepointTest(DiagnosticResult):
    """Result of the permutation changepoint test on one series."""

    namespace = "trend"

    n: int
    direction: str
    statistic: float
    p_value: float
    alpha: float
    level: float
    """The size ``floor(alpha (M + 1)) / (M + 1)`` of the test (exact without ties, an upper
    bound with them)."""
    alarm: bool
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
            "changepoint": float(self.changepoint),
            "mean_before": self.mean_before,
            "mean_after": self.mean_after,
            "level": self.level,
        }

    def summary(self) -> str:
        verdict = "ALARM" if self.alarm else "ok"
        return (
            f"changepoint ({self.direction}) {verdict}: p={self.p_value:.3g} (level "
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


def entropy_trend(
    values: torch.Tensor | Sequence[float],
    *,
    alpha: float = 0.05,
    direction: str = "decrease",
    n_permutations: int = 199,
    seed: int = 0,
) -> ChangepointTest:
    """Permutation changepoint test of a per-step series (entropy by default reads
    ``decrease``); deterministic for a given ``seed``; permutations drawn on the series'
    device."""
    a = check_alpha(alpha)
    if direction not in _DIRECTIONS:
        raise ConfigError(f"direction must be one of {_DIRECTIONS}, got {direction!r}")
    if isinstance(n_permutations, bool) or not isinstance(n_permutations, int):
        raise ConfigError(f"n_permutations must be a positive integer, got {n_permutations!r}")
    if n_permutations < 1:
        raise ConfigError(f"n_permutations must be >= 1, got {n_permutations}")
    x = _series(values)
    n = x.numel()
    sd = float(x.std(correction=0))
    obs_splits = _split_statistics(x, direction)
    k = int(torch.argmax(obs_splits))
    obs = float(obs_splits[k]) / sd if sd > 0 else 0.0
    mean_before, mean_after = float(x[: k + 1].mean()), float(x[k + 1 :].mean())
    if sd > 0:
        gen = torch.Generator(device=x.device).manual_seed(seed)
        tol = 1e-9 * max(1.0, abs(obs))  # rounding of the permuted cumulative sums
        count, done = 0, 0
        step = max(1, _CHUNK_ELEMENTS // n)
        while done < n_permutations:
            rows = min(step, n_permutations - done)
            keys = torch.rand((rows, n), generator=gen, device=x.device, dtype=COMPUTE)
            perm = x[torch.argsort(keys, dim=1)]
            stats = _split_statistics(perm, direction).amax(dim=1) / sd
            count += int((stats >= obs - tol).sum())
            done += rows
        p = (1 + count) / (1 + n_permutations)
    else:
        p = 1.0  # a constant series carries no evidence of change
    level = math.floor(a * (n_permutations + 1)) / (n_permutations + 1)
    return ChangepointTest(
        n=n,
        direction=direction,
        statistic=obs,
        p_value=p,
        alpha=a,
        level=level,
        alarm=p <= a,
        changepoint=k + 1,
        mean_before=mean_before,
        mean_after=mean_after,
        n_permutations=n_permutations,
    )
