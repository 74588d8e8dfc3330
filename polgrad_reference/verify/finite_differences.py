"""Central finite differences against an analytic gradient formula.

``check_gradient_formula`` evaluates three gradients of a scalar function at one point:
the user's closed-form formula, autograd, and central differences of the function with its
stop-gradients frozen (see :mod:`~polgrad_reference.verify._frozen`). The formula must
match the finite differences (a wrong derivation fails) and so must autograd (wrong code
fails even when the derivation is right, and vice versa).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping

import torch

from ..errors import InputError, InputTypeError
from ._frozen import FrozenStopGradients
from .gradcheck import VerificationError

__all__ = ["FormulaCheck", "check_gradient_formula"]


@dataclasses.dataclass(frozen=True)
class FormulaCheck:
    """The three gradients and how far apart they are (in units of the tolerance)."""

    formula: torch.Tensor
    autograd: torch.Tensor
    numeric: torch.Tensor
    tolerance: torch.Tensor

    @property
    def formula_error(self) -> float:
        """``max |formula - numeric| / tolerance``: the derivation against the code's values."""
        return float(((self.formula - self.numeric).abs() / self.tolerance).max())

    @property
    def autograd_error(self) -> float:
        """``max |autograd - numeric| / tolerance``: the code's gradient against its values."""
        return float(((self.autograd - self.numeric).abs() / self.tolerance).max())

    @property
    def ok(self) -> bool:
        return self.formula_error <= 1.0 and self.autograd_error <= 1.0

    def summary(self) -> str:
        return (
            f"formula vs finite differences: {self.formula_error:.3g}x tol; "
            f"autograd vs finite differences: {self.autograd_error:.3g}x tol"
        )


def check_gradient_formula(
    fn: Callable[..., torch.Tensor],
    formula: Callable[..., torch.Tensor],
    inputs: Mapping[str, torch.Tensor],
    *,
    wrt: str,
    where: torch.Tensor | None = None,
    step: float = 1e-6,
    rtol: float = 1e-6,
    atol: float = 1e-9,
    raise_on_failure: bool = True,
) -> FormulaCheck:
    """Compare ``formula(**inputs)`` (the claimed ``d fn / d inputs[wrt]``) with central
    differences of ``fn(**inputs)`` and with autograd, at the entries where ``where`` is
    true (default: all). ``inputs[wrt]`` must be float64. Raises
    :class:`~polgrad_reference.verify.VerificationError` naming which of the two failed.
    """
    if wrt not in inputs:
        raise InputError(f"wrt={wrt!r} is not among the inputs {sorted(inputs)}")
    x = inputs[wrt]
    if not isinstance(x, torch.Tensor) or x.dtype is not torch.float64:
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise InputTypeError(f"inputs[{wrt!r}] must be a float64 tensor, got {got}")
    if not (math.isfinite(step) and step > 0):
        raise InputError(f"step must be a positive finite float, got {step!r}")
    region = torch.ones_like(x, dtype=torch.bool) if where is None else where
    if region.shape != x.shape or region.dtype is not torch.bool:
        raise InputError(f"where must be a bool tensor of shape {list(x.shape)}")

    def call(value: torch.Tensor) -> torch.Tensor:
        out = fn(**{**inputs, wrt: value})
        if not isinstance(out, torch.Tensor) or out.numel() != 1:
            raise InputError("fn must return a scalar tensor")
        return out.reshape(())

    x0 = x.detach().clone().requires_grad_(True)
    (auto,) = torch.autograd.grad(call(x0), x0)
    claimed = formula(**{**inputs, wrt: x.detach()}).to(torch.float64)
    if claimed.shape != x.shape:
        raise InputError(f"formula returned shape {list(claimed.shape)}, expected {list(x.shape)}")
    frozen = FrozenStopGradients(call)
    numeric = torch.zeros_like(auto)
    with torch.no_grad():
        frozen(x0.detach())
        for index in region.nonzero().tolist():
            pos = tuple(index)
            up, down = x0.detach().clone(), x0.detach().clone()
            up[pos] += step
            down[pos] -= step
            numeric[pos] = (frozen(up) - frozen(down)) / (2 * step)
    keep = region.to(torch.float64)
    tol = atol + rtol * torch.maximum(claimed.abs(), auto.abs())
    result = FormulaCheck(claimed * keep, auto * keep, numeric, tol)
    if raise_on_failure and not result.ok:
        which = "the formula (a wrong derivation?)" if result.formula_error > 1 else "autograd"
        raise VerificationError(f"{which} disagrees with finite differences: {result.summary()}")
    return result
