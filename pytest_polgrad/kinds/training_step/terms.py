"""Steps with several loss terms, judged term by term.

A trainer's loss is rarely the policy term alone: ``policy + kl_coef * KL +
entropy_coef * entropy`` (verl's actor, OpenRLHF, TRL with ``beta``), each term with its own
aggregation, and each can be mis-scaled under gradient accumulation on its own (verl PR
#6957: one term normalised per micro-batch, so its gradient grew K-fold with K
micro-batches). A step that returns a dict with the total under ``"loss"`` and at least
one more of :data:`TERMS` is judged term by term by the split checks:

* the ``"policy"`` term against the marked algorithm's policy loss over the whole step
  (the reference without its KL term; the other terms have their own kinds);
* every term ``t`` (``"kl"``, ``"entropy"``, and ``"policy"`` too) for its SCALING: its
  gradient accumulated over the split (summed over micro-batches, mean over ranks) must
  equal the same function's term on the whole step as one micro-batch,
  ``sum_{r,k} d t_{r,k} / d logprobs / W == d t_full / d logprobs``. Whatever the term's
  own formula (its estimator, its coefficient), a correct scaling leaves it invariant to
  the split; a mis-scaled term is named with its factor ("the kl term is 4x its full-batch
  value: normalised per micro-batch; 4 micro-batches").

The total ``"loss"`` is what the other checks (padding, determinism, ...) use.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from pytest_polgrad.core.verdicts import CheckFailure, Verdict
from pytest_polgrad.kinds._tokens import as_passed
from pytest_polgrad.strategies._splits import Split, StepInfo

__all__ = ["TERMS", "factor_meaning", "judge", "term_names"]

TERMS = ("policy", "kl", "entropy")
"""The names of the terms a step may return beside ``"loss"``."""

_NAMES: dict[Any, tuple[str, ...]] = {}


def term_names(ctx: Any, inputs: Mapping[str, Any]) -> tuple[str, ...]:
    """The terms the step returns (none: a plain loss), from one call on the whole step
    as one micro-batch; remembered per function."""
    fn = ctx.fn
    try:
        return _NAMES[fn]
    except (KeyError, TypeError):
        pass
    result = _full_call(ctx, inputs)
    names: tuple[str, ...] = ()
    if isinstance(result, Mapping) and "loss" in result:
        names = tuple(t for t in TERMS if t in result)
    with_policy = names if "policy" in names else ()
    with contextlib.suppress(TypeError):  # an unhashable callable: asked again next time
        _NAMES[fn] = with_policy
    return with_policy


def _full_call(ctx: Any, inputs: Mapping[str, Any]) -> object:
    mask = inputs["response_mask"]
    split = Split(((tuple(range(mask.shape[0])),),))
    info: StepInfo = split.infos(mask)[0][0]
    kwargs: dict[str, Any] = {
        k: v.detach().clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)
    }
    kwargs = {k: v for k, v in kwargs.items() if k in ctx.takes}
    kwargs["logprobs"].requires_grad_(True)
    for f in dataclasses.fields(StepInfo):
        if f.name in ctx.takes:
            kwargs[f.name] = getattr(info, f.name)
    if "step" in ctx.takes:
        kwargs["step"] = info
    try:
        return ctx.fn(**as_passed(ctx.takes, kwargs))  # under its own spellings
    except Exception:  # the split checks report it; a plain step then
        return None


def _whole(inputs: Mapping[str, Any]) -> dict[str, Any]:
    rows = tuple(range(inputs["response_mask"].shape[0]))
    return {**inputs, "split": Split(((rows,),))}


def factor_meaning(c: float, split: Split) -> str:
    """The usual cause of a term that is ``c`` times its full-batch value under ``split``."""
    k, w = split.gradient_accumulation_steps, split.world_size
    known: list[tuple[float, str]] = []
    if k > 1:
        known += [
            (float(k), f"normalised per micro-batch; {k} micro-batches (the accumulation's "
                       "division by the number of micro-batches is missing)"),
            (1.0 / k, f"divided by the {k} accumulation steps twice"),
        ]  # fmt: skip
    if w > 1:
        known += [
            (1.0 / w, f"the world-size factor is missing ({w} ranks, all-reduce mean)"),
            (float(w), f"multiplied by the world size ({w}) twice"),
        ]
    hits = [text for value, text in known if abs(c - value) <= 1e-6 * max(1.0, value)]
    return "; or ".join(dict.fromkeys(hits))


def _uniform_factor(got: torch.Tensor, want: torch.Tensor, where: torch.Tensor) -> float | None:
    g, r = got[where], want[where]
    denom = float((r * r).sum())
    if denom == 0.0:
        return None
    c = float((g * r).sum()) / denom
    if not math.isfinite(c) or c == 0.0:
        return None
    spread = float((g - c * r).abs().max()) if g.numel() else 0.0
    return c if spread <= 1e-6 * max(float(r.abs().max()) * abs(c), 1e-300) else None


def judge(
    ctx: Any,
    inputs: Mapping[str, Any],
    execute: Callable[[Any, Mapping[str, Any]], Any],
    check_policy: Callable[[Any, Mapping[str, Any]], float],
    policy_context: Callable[[Any], Any],
) -> float | None:
    """The split check of a multi-term step (None: the step returns one loss, judge it as
    usual). ``execute(ctx, inputs)``: the kind's step run; ``check_policy(ctx, inputs)``:
    its split check, on ``policy_context(ctx)`` (the policy term, the reference without
    its KL term)."""
    if ctx.options.loss in TERMS:
        return None
    names = term_names(ctx, inputs)
    if not names:
        return None
    split: Split = inputs["split"]
    mask = inputs["response_mask"]
    worst = 0.0
    for term in names:
        one = dataclasses.replace(ctx, options=dataclasses.replace(ctx.options, loss=term))
        acc = execute(one, inputs)
        full = execute(one, _whole(inputs))
        if not bool(torch.isfinite(acc.grad).all()):
            raise Verdict(
                f"the {term} term's accumulated gradient is not finite with the split "
                f"{split.describe()}"
            )
        own = full.grad.abs()
        scale = own + own.max()
        err, ok = _compare(ctx, acc.grad, full.grad, scale, mask)
        if not ok:
            c = _uniform_factor(acc.grad, full.grad, mask)
            whole = f"the same function's {term} term on the whole step as one micro-batch"
            if c is None:
                how = (
                    f"not a uniform multiple of {whole}: the term is weighted differently per "
                    "micro-batch or rank (e.g. each micro-batch's own mean)"
                )
            else:
                meaning = factor_meaning(c, split)
                how = f"{c:.6g}x {whole}" + (f": {meaning}" if meaning else "")
            raise CheckFailure(
                f"the {term} term is mis-scaled with the split {split.describe()}: its "
                f"accumulated gradient is {how}",
                numbers=[(f"{term} term's loss (whole step, accumulated)",
                          f"{full.loss:.6g}", f"{acc.loss:.6g}")],
            )  # fmt: skip
        worst = max(worst, err)
    return max(worst, check_policy(policy_context(ctx), inputs))


def _compare(
    ctx: Any, got: torch.Tensor, want: torch.Tensor, scale: torch.Tensor, mask: torch.Tensor
) -> tuple[float, bool]:
    result = ctx.tolerance.tensor(got, want, scale, mask)[0]
    return float(result.error), bool(result.ok)
