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
from typing import TypeVar

import torch

_S = TypeVar("_S", float, torch.Tensor)

__all__ = ["KINK_ULPS", "UNIT_ROUNDOFF", "Comparison", "Tolerance", "unit_roundoff"]

UNIT_ROUNDOFF = {
    torch.float64: 2.0**-53,
    torch.float32: 2.0**-24,
    torch.float16: 2.0**-11,
    torch.bfloat16: 2.0**-8,
}
_K = 32.0  # operations per token, with margin: exp, sub, mul, clamp, max, weights, sums
UNDERFLOW = {
    dtype: torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps for dtype in UNIT_ROUNDOFF
}
"""The spacing of a dtype's subnormal numbers (``2^-149`` for float32): a true value that
small is not representable in that precision, so a difference up to ``_K`` of it is
rounding, not a deviation (a float32 VESPO gradient of -3.4e-47 is computed as -0)."""
KINK_ULPS = 4.0
"""Roundings that can move a computed ratio across a clip bound: the log-ratio's
subtraction, ``exp``, the bound ``1 + eps`` itself, with a factor 2 of margin (in units of
``u`` times the ratio's condition number; derivation in docs/tolerance.md, "Kinks")."""


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
        """``K u`` of the loosest accepted precision (a generous kink band; the checks use
        the tighter :attr:`kink_band`)."""
        return max(unit_roundoff(p) for p in self.precisions) * _K * self.factor

    @property
    def kink_band(self) -> tuple[float, bool]:
        """``(eps, native)`` for :meth:`Oracle.__call__`'s ``kink_eps`` / ``native_kinks``:
        ``KINK_ULPS`` roundings of the loosest accepted precision, and whether that
        precision is the input dtype (inputs exact in it: only the log-ratio rounds, so the
        band scales with ``1 + |lr|``; otherwise the inputs themselves round and it scales
        with ``1 + |logprobs| + |old_logprobs|``)."""
        loosest = max(self.precisions, key=unit_roundoff)
        return KINK_ULPS * unit_roundoff(loosest) * self.factor, loosest is self.input_dtype

    def _pick(self, p: torch.dtype, scale: _S, native: _S | None) -> _S:
        """The scale for precision ``p``: ``native`` (inputs exactly representable in ``p``)
        when given and ``p`` is the input dtype, the conservative ``scale`` otherwise."""
        return native if native is not None and p is self.input_dtype else scale

    def value(
        self,
        actual: float,
        expected: float,
        scale: float,
        n: int,
        *,
        native_scale: float | None = None,
    ) -> Comparison:
        """Scalar loss comparison: ``|a - e| <= factor * u * (K + sqrt(N)) * scale``
        (``native_scale`` for arithmetic in the input dtype itself, see :meth:`_pick`)."""
        if not math.isfinite(actual):
            return Comparison(False, math.inf, self.input_dtype)
        diff = abs(actual - expected)
        ratio = math.inf
        for p in self.precisions:
            s = self._pick(p, scale, native_scale)
            floor = _K * UNDERFLOW[p] if s > 0 else 0.0  # an exact 0 stays exact
            tol = self.factor * unit_roundoff(p) * (_K + math.sqrt(n)) * s + floor
            # a scale of exactly 0 (every term vanishes) admits no difference at all
            ratio = diff / tol if tol > 0 else (math.inf if diff > 0 else 0.0)
            if ratio <= 1.0:
                return Comparison(True, ratio, p)
        return Comparison(False, ratio, self.precisions[-1])

    def tensor(
        self,
        actual: torch.Tensor,
        expected: torch.Tensor,
        scale: torch.Tensor,
        where: torch.Tensor,
        *,
        native_scale: torch.Tensor | None = None,
    ) -> tuple[Comparison, torch.Tensor]:
        """Elementwise comparison on ``where``; returns the comparison and the per-element
        error ratios (``inf`` for non-finite entries, ``0`` outside ``where``)."""
        diff = (actual.to(torch.float64) - expected).abs()
        diff = torch.where(torch.isfinite(actual), diff, torch.inf)
        ratios = torch.zeros_like(diff)
        for p in self.precisions:
            s = self._pick(p, scale, native_scale)
            floor = torch.where(s > 0, _K * UNDERFLOW[p], 0.0)  # an exact 0 stays exact
            tol = self.factor * unit_roundoff(p) * _K * s + floor
            # an entry whose scale is exactly 0 (the reference's gradient and every term of
            # its scale vanish) admits no difference: inf, not a ratio to a tiny floor
            exact = torch.where(diff > 0, torch.inf, 0.0)
            ratios = torch.where(where, torch.where(tol > 0, diff / tol, exact), 0.0)
            worst = float(ratios.max()) if ratios.numel() else 0.0
            if worst <= 1.0:
                return Comparison(True, worst, p), ratios
        worst = float(ratios.max()) if ratios.numel() else 0.0
        return Comparison(False, worst, self.precisions[-1]), ratios
