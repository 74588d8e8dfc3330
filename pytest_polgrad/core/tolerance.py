"""The tolerance model: errors are measured against the precision the function computed in.

For a quantity ``q = sum_t w_t l_t`` computed in a floating type with unit roundoff ``u``,
the rounding error is bounded by ``c(N) u sum_t |w_t| |l_t| cond_t`` (Higham, *Accuracy and
Stability of Numerical Algorithms*, 2nd ed., Sec. 4.2), where ``cond_t`` accounts for the
cancellation in ``logprobs - old_logprobs``. The scale never collapses when positive and
negative advantages cancel the loss itself to near zero. Derivation: docs/tolerance.md.
"""

from __future__ import annotations

import dataclasses
import functools
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

    By default a float64-fed function may compute in float32 internally, and a function
    fed bfloat16 or float16 may compute in that half precision instead of upcasting to
    float32 (either reported with a note); ``strict`` accepts the finest precision only
    (float64; float32; float32 for half-precision inputs), so an epsilon guard such as
    ``+ 1e-8`` in a denominator, or an error of a few per cent in a bfloat16-fed loss that
    upcasts, is flagged. ``factor`` scales every tolerance.
    """

    input_dtype: torch.dtype
    strict: bool = False
    factor: float = 1.0

    @property
    def precisions(self) -> tuple[torch.dtype, ...]:
        """The accepted arithmetic, finest first: float64 inputs (float64, float32);
        float32 inputs (float32,); half-precision inputs (float32, the half precision)."""
        if self.input_dtype is torch.float64:
            ladder: tuple[torch.dtype, ...] = (torch.float64, torch.float32)
        elif self.input_dtype is torch.float32:
            ladder = (torch.float32,)
        else:  # exact in float32, where a function that upcasts computes
            ladder = (torch.float32, self.input_dtype)
        return ladder[:1] if self.strict else ladder

    def exact_in(self, p: torch.dtype) -> bool:
        """Whether the inputs are exactly representable in precision ``p``: their own, or
        float32 and float64 for half-precision inputs (never float32 for float64 ones)."""
        wider = p in (torch.float32, torch.float64)  # float16 cannot hold bfloat16's range
        return p is self.input_dtype or (
            wider and unit_roundoff(p) < unit_roundoff(self.input_dtype)
        )

    def _floor(self, p: torch.dtype) -> float:
        """The absolute part of the tolerance at ``p`` (where the scale is positive):
        ``_K`` subnormal spacings of ``p``, plus one of the inputs' half precision when the
        result is rounded to it (:meth:`_result_rounding`): below its smallest normal a
        float16 gradient is a multiple of 6e-8, a bfloat16 one of 9e-41, whatever
        precision computed it."""
        floor = _K * UNDERFLOW[p]
        return floor + UNDERFLOW[self.input_dtype] if self._result_rounding(p) else floor

    def _result_rounding(self, p: torch.dtype) -> float:
        """Judged at ``p`` finer than the inputs' half precision: one rounding of the result
        to that precision (a function fed bfloat16 gets its gradient in bfloat16, the
        dtype of the leaf, whatever it computes in), ``u(input)`` per unit of scale; 0
        otherwise."""
        u_in = unit_roundoff(self.input_dtype)
        return u_in if unit_roundoff(p) < u_in else 0.0

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
        return KINK_ULPS * unit_roundoff(loosest) * self.factor, self.exact_in(loosest)

    def _pick(self, p: torch.dtype, scale: _S, native: _S | None) -> _S:
        """The scale for precision ``p``: ``native`` (inputs exactly representable in ``p``,
        :meth:`exact_in`) when given, the conservative ``scale`` otherwise."""
        return native if native is not None and self.exact_in(p) else scale

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
            floor = self._floor(p) if s > 0 else 0.0  # an exact 0 stays exact
            tol = self.factor * unit_roundoff(p) * (_K + math.sqrt(n)) * s + floor
            if rounding := self._result_rounding(p):
                tol += self.factor * rounding * s
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
        # |inf - e| is inf already; NaN (a NaN entry) becomes inf too
        diff = (actual.to(torch.float64) - expected).abs().nan_to_num_(math.inf, math.inf)
        # an entry whose scale is exactly 0 (the reference's gradient and every term of its
        # scale vanish) has tolerance 0 and admits no difference: diff / 0 is inf there, and
        # an entry without difference has ratio 0 whatever its tolerance
        judged = where & (diff != 0)
        ratios = diff
        for p, relative, floor, rounding in self._tensor_terms:
            s = self._pick(p, scale, native_scale)
            tol = relative * s + floor
            if rounding:
                tol = tol + rounding * s
            tol = torch.where(s > 0, tol, 0.0)  # an exact 0 stays exact: no floor
            ratios = torch.where(judged, diff / tol, 0.0)
            worst = float(ratios.max()) if ratios.numel() else 0.0
            if worst <= 1.0:
                return Comparison(True, worst, p), ratios
        worst = float(ratios.max()) if ratios.numel() else 0.0
        return Comparison(False, worst, self.precisions[-1]), ratios

    @functools.cached_property
    def _tensor_terms(self) -> tuple[tuple[torch.dtype, float, float, float], ...]:
        """``(p, relative, floor, rounding)`` of each accepted precision, computed once:
        where the scale ``s`` is positive the tolerance at ``p`` is ``relative * s + floor
        + rounding * s``, with ``relative = factor u K`` and ``rounding`` one rounding of
        the result to the inputs' precision (:meth:`_result_rounding`), times ``factor``."""
        return tuple(
            (
                p,
                self.factor * unit_roundoff(p) * _K,
                self._floor(p),
                self.factor * self._result_rounding(p),
            )
            for p in self.precisions
        )
