"""What ``expect=`` excuses: the deviation it names, never a crash or a growing deviation.

A declaration ``expect={"value": "divides by the padded width"}`` turns a failing ``value``
check into an expected failure only when

1. the failure is a *finding* (the property does not hold), not a *verdict* (the function
   raised, returned a non-finite, non-scalar, integer or non-differentiable loss) — a
   verdict is never excused; and, on every canonical corpus input of the kind, the check
   either holds or fails as a finding (a crash there is not excused either);
2. the deviation stays what it was: with ``("reason", max_error)`` the worst error of the
   check over the canonical corpus (in units of tolerance: deterministic, independent of
   the seed and the budget) must not exceed ``max_error``. With a bare reason the golden
   snapshot pins it: the golden item records the function's outputs on the same corpus,
   so a new, larger deviation fails ``golden`` (unless ``golden`` is declared too).

``judge`` returns why a declared failure is *not* excused (``""`` when it is) and the
deviation it measured, which the report shows so the bound can be declared.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

__all__ = ["Judgement", "judge", "measure", "pin_hint"]


@dataclasses.dataclass(frozen=True)
class Judgement:
    """``problem == ""``: the declaration excuses the failure. ``measured``: the check's
    worst error on the canonical corpus, in tolerances (``inf`` for exact properties)."""

    problem: str
    measured: float

    @property
    def excused(self) -> bool:
        return not self.problem


def _check(kind: Any, ctx: Any, name: str) -> Any:
    lookup = getattr(kind, "check", None)
    found = lookup(name) if lookup is not None else None
    if found is not None:
        return found
    config = getattr(ctx, "config", None)
    if config is None:
        config = kind.resolve(ctx.options)
    return {c.name: c for c in kind.checks(config, ctx.options)}[name]


def measure(ctx: Any, check_name: str) -> tuple[float, str]:
    """Run ``check_name`` on every canonical corpus input: ``(worst error, verdict)``
    where ``verdict`` names the first input on which the function misbehaved ("" if none)."""
    from .checks import CheckFailure
    from .engine import corpus_of, kind_of
    from .target import Verdict

    kind = kind_of(ctx.options)
    check = _check(kind, ctx, check_name)
    prepare = getattr(check, "prepare", None)
    worst = 0.0
    saved = getattr(ctx, "worst", None)
    try:
        for name, raw in corpus_of(kind, ctx, check).items():
            inputs = raw if prepare is None else prepare(raw)
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
    if bool(getattr(result, "verdict", False)) or "\n  verdict " in str(result.report):
        return Judgement(
            f"the failure is a verdict, not the declared deviation: {result.message}",
            math.inf,
        )
    measured, verdict = measure(ctx, check)
    if verdict:
        return Judgement(f"the function misbehaved {verdict}", measured)
    bound = options.expect_bounds.get(check)
    if bound is not None and measured > bound:
        return Judgement(
            f"the declared deviation grew: {measured:.3g}x the tolerance on the canonical "
            f"corpus, declared at most {bound:.3g}x",
            measured,
        )
    return Judgement("", measured)


def pin_hint(check: str, reason: str, measured: float) -> str:
    """The marker text that pins a declared deviation at its measured size."""
    if not math.isfinite(measured) or measured <= 0:
        return ""
    bound = float(f"{measured * 1.5:.2g}")
    return f"pin its size with expect={{{check!r}: ({reason!r}, {bound:g})}}"
