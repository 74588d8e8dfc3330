"""Central finite differences against an analytic gradient formula.

``check_gradient_formula`` evaluates three gradients of a scalar function at one point:
the user's closed-form formula, autograd, and central differences of the function with its
stop-gradients frozen (see :mod:`~polgrad_reference.verify._frozen`). The formula must
match the finite differences (a wrong derivation fails) and so must autograd (wrong code
fails even when the derivation is right, and vice versa).

When one fails, the check says which party is wrong, as far as the three gradients tell:

- autograd off the finite differences: the code's backward (a hand-written
  ``autograd.Function``, an in-place write autograd does not see);
- the formula off, autograd on, and detaching one intermediate result of ``fn`` makes
  autograd equal the formula: a **missing stop-gradient** in ``fn``, named with the
  operation and the line that computes it;
- the formula equal to the derivative of ``fn``'s values with no stop-gradient held: an
  **extra stop-gradient** in ``fn`` (or one the derivation forgot);
- otherwise the formula and the code disagree: a wrong derivation, or code that does not
  compute what the derivation describes.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ..errors import InputError, InputTypeError
from . import _convention as conv
from ._errors import VerificationError
from ._frozen import FrozenStopGradients

__all__ = ["FormulaCheck", "check_gradient_formula"]

F64 = torch.float64
_MAX_CANDIDATES = 400


@dataclasses.dataclass(frozen=True)
class FormulaCheck:
    """The three gradients and how far apart they are (in units of the tolerance), at the
    entries ``where`` selects (0 elsewhere, whatever the formula or autograd hold there)."""

    formula: torch.Tensor
    autograd: torch.Tensor
    numeric: torch.Tensor
    tolerance: torch.Tensor
    where: torch.Tensor | None = None
    """The entries compared (None: all)."""
    diagnosis: str = ""
    """Which party is wrong when the check fails (see the module docstring); ``""`` when it
    passes."""

    def _error(self, other: torch.Tensor) -> float:
        err = ((other - self.numeric).abs() / self.tolerance).nan_to_num(nan=math.inf)
        if self.where is not None:
            err = torch.where(self.where, err, 0.0)
        return float(err.max()) if err.numel() else 0.0

    @property
    def formula_error(self) -> float:
        """``max |formula - numeric| / tolerance``: the derivation against the code's values."""
        return self._error(self.formula)

    @property
    def autograd_error(self) -> float:
        """``max |autograd - numeric| / tolerance``: the code's gradient against its values."""
        return self._error(self.autograd)

    @property
    def ok(self) -> bool:
        return self.formula_error <= 1.0 and self.autograd_error <= 1.0

    def summary(self) -> str:
        return (
            f"formula vs finite differences: {self.formula_error:.3g}x tol; "
            f"autograd vs finite differences: {self.autograd_error:.3g}x tol"
        )


def _name(fn: object) -> str:
    return str(getattr(fn, "__qualname__", None) or "fn").replace("<locals>.", "")


def _caller() -> str:
    """``file:line`` of the innermost frame outside torch and this package."""
    skip = (os.path.dirname(torch.__file__), os.path.dirname(__file__))
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(skip):
            return f"{os.path.basename(name)}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return "?"


class _Probe(TorchFunctionMode):
    """Numbers the operations whose result carries a gradient; lists them (``target``
    None) or returns the ``target``-th one detached."""

    def __init__(self, target: int | None) -> None:
        super().__init__()
        self.target = target
        self.count = 0
        self.sites: list[tuple[str, str]] = []

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        if not (isinstance(out, torch.Tensor) and out.requires_grad):
            return out
        index = self.count
        self.count += 1
        if self.target is None:
            self.sites.append((str(getattr(func, "__name__", func)), _caller()))
            return out
        return out.detach() if index == self.target else out


def _within(a: torch.Tensor, b: torch.Tensor, tol: torch.Tensor, region: torch.Tensor) -> bool:
    return bool(torch.where(region, (a - b).abs() <= tol, True).all())


def _grad(call: Callable[[torch.Tensor], torch.Tensor], x0: torch.Tensor, mode: Any) -> Any:
    x = x0.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        with mode:
            out = call(x)
        if not out.requires_grad:
            return torch.zeros_like(x)
        (g,) = torch.autograd.grad(out, x, allow_unused=True)
    return torch.zeros_like(x) if g is None else g


def _missing_stop_gradient(
    call: Callable[[torch.Tensor], torch.Tensor],
    x0: torch.Tensor,
    claimed: torch.Tensor,
    tol: torch.Tensor,
    region: torch.Tensor,
) -> str:
    """Where detaching one intermediate result of ``fn`` makes autograd equal the formula
    (``"exp, clamp (loss.py:4)"``), or ``""``."""
    lister = _Probe(None)
    _grad(call, x0, lister)
    found: dict[str, list[str]] = {}
    for k in range(min(len(lister.sites), _MAX_CANDIDATES)):
        if _within(_grad(call, x0, _Probe(k)), claimed, tol, region):
            name, where = lister.sites[k]
            names = found.setdefault(where, [])
            if name not in names:
                names.append(name)
    return "; ".join(f"{', '.join(names[:8])} ({where})" for where, names in found.items())


def _plain_numeric(
    call: Callable[[torch.Tensor], torch.Tensor], x0: torch.Tensor, region: torch.Tensor, h: float
) -> torch.Tensor:
    """Central differences of ``fn``'s values, no stop-gradient held."""
    out = torch.zeros_like(x0)
    with torch.no_grad():
        for index in region.nonzero().tolist():
            pos = tuple(index)
            up, down = x0.detach().clone(), x0.detach().clone()
            up[pos] += h
            down[pos] -= h
            out[pos] = (call(up) - call(down)) / (2 * h)
    return out


def _diagnose(
    result: FormulaCheck,
    call: Callable[[torch.Tensor], torch.Tensor],
    x0: torch.Tensor,
    region: torch.Tensor,
    h: float,
    cuts: int,
    name: str,
) -> str:
    formula_bad, autograd_bad = result.formula_error > 1, result.autograd_error > 1
    if autograd_bad and not formula_bad:
        return (
            f"{name}'s backward: autograd disagrees with the finite differences of its own values "
            "(stop-gradients held at the base point) while the formula agrees with them; a "
            "hand-written backward (torch.autograd.Function) or an in-place write autograd does "
            "not see (through .data) is the usual cause"
        )
    if autograd_bad:
        return (
            f"both: neither the formula nor autograd matches the finite differences of {name}'s "
            "values; check its backward (a hand-written autograd.Function?) first"
        )
    sites = _missing_stop_gradient(call, x0, result.formula, result.tolerance, region)
    if sites:
        return (
            f"a missing stop-gradient in {name}: autograd agrees with the finite differences of "
            "its values, and the formula is its gradient with one intermediate result detached. "
            f"Detaching the result of any one of {sites} makes autograd equal the formula: {name} "
            "lacks that stop-gradient (.detach()), or the derivation assumes one the method "
            "does not have"
        )
    if cuts:
        plain = _plain_numeric(call, x0, region, h)
        if _within(plain, result.formula, result.tolerance, region):
            return (
                f"an extra stop-gradient in {name}: the formula is the derivative of its values "
                "with no stop-gradient held, while it stops a gradient (detach, .data, "
                "no_grad) that the derivation differentiates through; remove it, or "
                "differentiate the derivation with it"
            )
    return (
        f"the formula and {name} disagree: autograd agrees with the finite differences of its "
        "values, so its gradient is what its code computes; either the derivation is wrong "
        f"or {name} does not compute what the derivation describes (no single stop-gradient "
        "explains the difference)"
    )


def check_gradient_formula(
    fn: Callable[..., Any],
    formula: Callable[..., Any],
    inputs: Mapping[str, Any],
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
    true (default: all; elsewhere nothing is compared, NaN included: pass
    ``where=batch["response_mask"]`` for a batch with NaN padding).

    ``fn`` and ``formula`` each get the inputs their signatures name (all with
    ``**kwargs``): any loss with the policy-loss calling convention works as ``fn``, and
    its return value may be a tuple, mapping or object holding the loss (``[0]``,
    ``["loss"]``, ``.loss``). ``inputs[wrt]`` must be float64; ``step`` positive,
    ``rtol``/``atol`` at least 0 (not both 0). Raises
    :class:`~polgrad_reference.verify.VerificationError` naming the party at fault (see
    the module docstring), and when ``fn`` is not differentiable or not finite there.
    """
    if not isinstance(inputs, Mapping) or not all(isinstance(k, str) for k in inputs):
        raise InputTypeError(f"inputs must be a mapping of names to values, got {type(inputs)}")
    if not isinstance(wrt, str) or wrt not in inputs:
        raise InputError(f"wrt={wrt!r} is not among the inputs {sorted(inputs)}")
    for name, f in (("fn", fn), ("formula", formula)):
        if not callable(f):
            raise InputTypeError(f"{name} must be callable, got {type(f).__name__}")
    x = inputs[wrt]
    if not isinstance(x, torch.Tensor) or x.dtype is not F64:
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise InputTypeError(f"inputs[{wrt!r}] must be a float64 tensor, got {got}")
    h = conv.require_positive("step", step)
    rtol, atol = conv.require_tolerance(rtol, atol)
    conv.require_bool("raise_on_failure", raise_on_failure)
    if where is None:
        region = torch.ones_like(x, dtype=torch.bool)
    elif not isinstance(where, torch.Tensor) or where.dtype is not torch.bool:
        raise InputTypeError(f"where must be a bool tensor of shape {list(x.shape)}")
    elif where.shape != x.shape:
        raise InputError(
            f"where must be a bool tensor of shape {list(x.shape)}, got {list(where.shape)}"
        )
    else:
        region = where
    offered = tuple(inputs)
    fn_names = conv.takes(fn, offered, what="fn")
    formula_names = conv.takes(formula, offered, what="formula")
    for name, names in (("fn", fn_names), ("formula", formula_names)):
        if wrt not in names:
            raise InputError(f"{name} takes no parameter {wrt!r} (wrt)")
    label = f"fn {_name(fn)}"

    def call(value: torch.Tensor) -> torch.Tensor:
        given = {**inputs, wrt: value}
        return conv.as_loss(fn(**{n: given[n] for n in fn_names}), what=label)

    x0 = x.detach().clone().requires_grad_(True)
    frozen = FrozenStopGradients(call)
    with torch.enable_grad():
        base = frozen(x0)
        if not base.requires_grad:
            raise VerificationError(
                f"{label} is not differentiable in inputs[{wrt!r}]: its result has no grad_fn "
                "(it was detached, computed under torch.no_grad(), or does not depend on "
                f"{wrt}), so there is no autograd gradient to check"
            )
        if not bool(torch.isfinite(base.detach())):
            raise VerificationError(
                f"{label} is {float(base)} at the base point; if the inputs hold NaN at "
                "padding, fn must not read it (mask with torch.where, not by multiplying)"
            )
        (auto,) = torch.autograd.grad(base, x0, allow_unused=True)
        auto = torch.zeros_like(x0) if auto is None else auto
        numeric = torch.zeros_like(auto)
        for index in region.nonzero().tolist():
            pos = tuple(index)
            up, down = x0.detach().clone(), x0.detach().clone()
            up[pos] += h
            down[pos] -= h
            f_up = frozen(up.requires_grad_(True)).detach()
            f_down = frozen(down.requires_grad_(True)).detach()
            numeric[pos] = (f_up - f_down) / (2 * h)
    given = {**inputs, wrt: x.detach()}
    claimed = formula(**{n: given[n] for n in formula_names})
    if not isinstance(claimed, torch.Tensor) or not claimed.is_floating_point():
        what = claimed.dtype if isinstance(claimed, torch.Tensor) else type(claimed).__name__
        raise InputTypeError(
            f"formula must return a floating tensor of shape {list(x.shape)} (the gradient), "
            f"got {what}"
        )
    if claimed.shape != x.shape:
        raise InputError(f"formula returned shape {list(claimed.shape)}, expected {list(x.shape)}")
    claimed = claimed.detach().to(F64)
    zero = torch.zeros((), dtype=F64)
    claimed = torch.where(region, claimed, zero)
    auto = torch.where(region, auto.detach(), zero)
    tol = atol + rtol * torch.maximum(claimed.abs(), auto.abs()).nan_to_num(nan=0.0)
    result = FormulaCheck(claimed, auto, numeric, tol, region)
    if not result.ok:
        diagnosis = _diagnose(result, call, x0, region, h, frozen.cuts, _name(fn))
        result = dataclasses.replace(result, diagnosis=diagnosis)
        if raise_on_failure:
            raise VerificationError(f"{diagnosis} ({result.summary()})")
    return result
