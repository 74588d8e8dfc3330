"""What ``expect=`` excuses: the deviation it names, never a crash or a growing deviation.

A declaration ``expect={"value": "divides by the padded width"}`` turns a failing ``value``
check into an expected failure only when

1. the failure is a *finding* (the property does not hold), not a *verdict* (the function
   raised, returned a non-finite, non-scalar, integer or non-differentiable loss) — a
   verdict is never excused; and, on every canonical corpus input of the kind, the check
   either holds or fails as a finding (a crash there is not excused either);
2. the deviation stays what it was: with ``("reason", max_error)`` the deviation's *size*
   must not exceed ``max_error``. With a bare reason the golden snapshot pins it: the
   golden item records the function's outputs on the same corpus, so a new, larger
   deviation fails ``golden`` (unless ``golden`` is declared too).

The size of a declared deviation (:func:`size`) is one number, printed the same way
everywhere (:func:`fmt`): the check's worst error over the canonical corpus, in units of
tolerance (deterministic, independent of the seed and the budget), rounded *up* to three
significant digits. The expected-failure reason, the summary table and the JSON report
show it, and a bound is compared with exactly it, so a pin at the printed size holds and
a pin below it fails as "grew". The worst error over the examples a run drew (the
table's ``worst/tol`` and the JSON entry's ``worst``) is a different number: it depends
on the seed and the budget and stops at the first failing example.

``judge`` returns why a declared failure is *not* excused (``""`` when it is) and the
deviation it measured.
"""

from __future__ import annotations

import dataclasses
import decimal
import math
from typing import Any

from pytest_polgrad.core.engine import check_of, corpus_of, is_verdict, kind_of, prepared
from pytest_polgrad.core.options import PROFILES
from pytest_polgrad.core.verdicts import CheckFailure, Verdict

__all__ = [
    "BASIS",
    "Judgement",
    "declared_fields",
    "evidence_budget",
    "excused_reason",
    "fmt",
    "judge",
    "measure",
    "pin_hint",
    "size",
    "suggested_bound",
]

BASIS = "the canonical corpus"
"""What the size of a declared deviation is measured on."""


def evidence_budget(budget: int) -> int | None:
    """The budget at which a declared check that passed is searched again before it is
    called stale ("now passes; remove it from expect="), or None when ``budget`` is
    already enough: a deviation the corpus does not show but a drawn batch does (TRL's
    VESPO clamp, shown by long rows far off-policy) is missed by 5 examples and found by
    100, and a verdict must not depend on the budget (issue 27). So a pass below the
    default profile's budget is evidence of nothing until the default budget confirms it.
    """
    default = PROFILES["default"]
    return default if budget < default else None


def size(measured: float) -> float:
    """``measured`` rounded up to three significant digits (0 and inf unchanged): the
    smallest such number not below it, so ``size(m) >= m`` and ``fmt`` prints it exactly."""
    if not math.isfinite(measured) or measured <= 0:
        return measured
    # The shortest decimal that reads back as ``measured`` (so 1.07 stays 1.07), rounded
    # up; float() of a decimal not below it is not below it (rounding is monotone).
    shortest = decimal.Decimal(repr(measured))
    quantum = decimal.Decimal(1).scaleb(shortest.adjusted() - 2)
    return float(shortest.quantize(quantum, rounding=decimal.ROUND_CEILING))


def fmt(x: float) -> str:
    """``x`` in the fewest significant digits (at least three) that read back as ``x``:
    a size prints as ``3.82e+03``, a bound ``3815`` as typed."""
    if not math.isfinite(x):
        return str(x)
    for digits in range(3, 18):
        text = f"{x:.{digits}g}"
        if float(text) == x:
            return text
    return repr(x)


@dataclasses.dataclass(frozen=True)
class Judgement:
    """``problem == ""``: the declaration excuses the failure. ``measured``: the check's
    worst error on the canonical corpus, in tolerances (``inf`` for exact properties);
    ``size``: the same rounded up to three significant digits, the number a bound is
    compared with."""

    problem: str
    measured: float

    @property
    def excused(self) -> bool:
        return not self.problem

    @property
    def size(self) -> float:
        return size(self.measured)


def measure(ctx: Any, check_name: str) -> tuple[float, str]:
    """Run ``check_name`` on every canonical corpus input: ``(worst error, verdict)``
    where ``verdict`` names the first input on which the function misbehaved ("" if none)."""
    kind = kind_of(ctx.options)
    check = check_of(kind, ctx, check_name)
    worst = 0.0
    saved = getattr(ctx, "worst", None)
    try:
        for name, raw in corpus_of(kind, ctx, check).items():
            inputs = prepared(check, raw)
            try:
                error = float(check.run(ctx, inputs.as_kwargs()))
            except Verdict as exc:
                return worst, f"on canonical corpus input {name!r}: {exc}"
            except CheckFailure as exc:
                error = float(exc.error)
            worst = max(worst, error)
    finally:
        if saved is not None:
            ctx.worst = saved  # the measurement is not part of the check's own record
    return worst, ""


def judge(ctx: Any, result: Any) -> Judgement:
    """Whether the declaration for ``result.check`` excuses the failing ``result``."""
    options = ctx.options
    check = str(result.check)
    if is_verdict(result):
        return Judgement(
            f"the failure is a verdict, not the declared deviation: {result.message}",
            math.inf,
        )
    measured, verdict = measure(ctx, check)
    if verdict:
        return Judgement(f"the function misbehaved {verdict}", measured)
    bound = options.expect_bounds.get(check)
    if bound is not None and math.isinf(measured):
        return Judgement(
            f"check {check!r} is an exact property: its deviation has no size in "
            f"tolerances, so max_error={fmt(bound)} cannot bound it; declare the reason "
            "alone (the golden snapshot pins the outputs)",
            measured,
        )
    if bound is not None and size(measured) > bound:
        return Judgement(
            f"the declared deviation grew: {fmt(size(measured))}x the tolerance on {BASIS}, "
            f"declared at most {fmt(bound)}x (if it did not grow, the pin is below its size: "
            f"pin at least {fmt(size(measured))})",
            measured,
        )
    return Judgement("", measured)


def suggested_bound(measured: float) -> float | None:
    """The ``max_error`` a pin hint suggests: 1.5x the size, to two significant digits
    (``None`` where no bound can pin the deviation)."""
    s = size(measured)
    if not math.isfinite(s) or s <= 1:
        return None
    return float(f"{s * 1.5:.2g}")


def pin_hint(check: str, reason: str, measured: float) -> str:
    """The marker text that pins a declared deviation at its measured size ("" where
    none can: an exact property, or a deviation the corpus does not show)."""
    bound = suggested_bound(measured)
    if bound is None:
        return ""
    return f"pin its size with expect={{{check!r}: ({reason!r}, {fmt(bound)})}}"


def excused_reason(
    check: str, reason: str, measured: float, bound: float | None, run_worst: float | None = None
) -> str:
    """The expected-failure reason of an excused check: the declared reason, the size
    and its basis, the pin (a hint where none is declared), and, when this run's worst
    error exceeds the size, that the pin bounds the corpus size, not a draw's."""
    s = size(measured)
    if math.isinf(s):
        detail = "an exact property: its deviation has no size in tolerances"
    elif s <= 1:
        detail = (
            f"{BASIS} does not show it ({fmt(s)}x the tolerance there): max_error cannot "
            "pin its size"
        )
    elif bound is not None:
        detail = f"{fmt(s)}x the tolerance on {BASIS}, declared at most {fmt(bound)}x"
    else:
        detail = (
            f"{pin_hint(check, reason, measured)}: it measures {fmt(s)}x the tolerance on "
            f"{BASIS}; the pin allows about 1.5x that"
        )
    if run_worst is not None and math.isfinite(run_worst) and 1 < s < run_worst:
        detail += (
            f"; this run's worst was {fmt(size(run_worst))}x, on a batch it drew: a pin "
            f"bounds the size on {BASIS}, which no draw changes"
        )
    return f"known deviation: {reason} ({detail})"


def declared_fields(
    reason: str, judgement: Judgement, bound: float | None, run_worst: object
) -> dict[str, Any]:
    """The ``declared`` block of a declared check's JSON entry (docs/conformance.md,
    "Reports"); ``None`` stands for a size an exact property does not have."""
    s = judgement.size

    def finite(x: float | None) -> float | None:
        return x if x is not None and math.isfinite(x) else None

    return {
        "reason": reason,
        "excused": judgement.excused,
        "corpus_size": finite(s),
        "measured": finite(s),  # kept: the same number as corpus_size
        "run_worst": run_worst,
        "bound": bound,
        "suggested_bound": None if bound is not None else suggested_bound(judgement.measured),
        "problem": judgement.problem,
    }
