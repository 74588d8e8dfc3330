"""The tolerance model: errors are measured against the precision the function computed in.

For a quantity ``q = sum_t w_t l_t`` computed in a floating type with unit roundoff ``u``,
the rounding error is bounded by ``c(N) u sum_t |w_t| |l_t| cond_t`` (Higham, *Accuracy and
Stability of Numerical Algorithms*, 2nd ed., Sec. 4.2), where ``cond_t`` accounts for the
cancellation in ``logprobs - old_logprobs``. The scale never collapses when positive and
negative advantages cancel the loss itself to near zero. Derivation: docs/tolerance.md.
"""

from __future__ import annotations

import dataclasses
import math

import torch

__all__ = ["UNIT_ROUNDOFF", "Comparison", "Tolerance", "unit_roundoff"]

UNIT_ROUNDOFF = {
    torch.float64: 2.0**-53,
    torch.float32: 2.0**-24,
    torch.float16: 2.0**-11,
    torch.bfloat16: 2.0**-8,
}
_K = 32.0  # operations per token, with margin: exp, sub, mul, clamp, max, weights, sums


def unit_roundoff(dtype: torch.dtype) -> float:
    """``u`` of a floating dtype (half the machine epsilon)."""
    return UNIT_ROUNDOFF[dtype]


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Outcome of comparing one quantity against the oracle."""

    ok: bool
    error: float
    """Largest ``|actual - expected| / tolerance`` at the precision that was accepted
    (``<= 1`` passes)."""
    precision: torch.dtype
    """The precision the observed error is consistent with."""


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """Which precisions are acceptable for a function fed ``input_dtype`` tensors.

    By default a float64-fed function may compute in float32 internally (reported with a
    note); ``strict`` accepts float64 rounding only, so an epsilon guard such as ``+ 1e-8``
    in a denominator is flagged. ``factor`` scales every tolerance.
    """

    input_dtype: torch.dtype
    strict: bool = False
    factor: float = 1.0

    @property
    def precisions(self) -> tuple[torch.dtype, ...]:
        if self.strict or self.input_dtype is not torch.float64:
            return (self.input_dtype,)
        return (torch.float64, torch.float32)

    @property
    def loosest(self) -> float:
        """Unit roundoff of the loosest accepted precision (for kink detection)."""
        return max(unit_roundoff(p) for p in self.precisions) * _K * self.factor

    def value(self, actual: float, expected: float, scale: float, n: int) -> Comparison:
        """Scalar loss comparison: ``|a - e| <= factor * u * (K + sqrt(N)) * scale``."""
        if not math.isfinite(actual):
            return Comparison(False, math.inf, self.input_dtype)
        diff = abs(actual - expected)
        ratio = math.inf
        for p in self.precisions:
            tol = self.factor * unit_roundoff(p) * (_K + math.sqrt(n)) * max(scale, 1e-300)
            ratio = diff / tol
            if ratio <= 1.0:
                return Comparison(True, ratio, p)
        return Comparison(False, ratio, self.precisions[-1])

    def tensor(
        self,
        actual: torch.Tensor,
        expected: torch.Tensor,
        scale: torch.Tensor,
        where: torch.Tensor,
    ) -> tuple[Comparison, torch.Tensor]:
        """Elementwise comparison on ``where``; returns the comparison and the per-element
        error ratios (``inf`` for non-finite entries, ``0`` outside ``where``)."""
        diff = (actual.to(torch.float64) - expected).abs()
        diff = torch.where(torch.isfinite(actual), diff, torch.inf)
        ratios = torch.zeros_like(diff)
        for p in self.precisions:
            tol = self.factor * unit_roundoff(p) * _K * scale.clamp(min=1e-300)
            ratios = torch.where(where, diff / tol, 0.0)
            worst = float(ratios.max()) if ratios.numel() else 0.0
            if worst <= 1.0:
                return Comparison(True, worst, p), ratios
        worst = float(ratios.max()) if ratios.numel() else 0.0
        return Comparison(False, worst, self.precisions[-1]), ratios
