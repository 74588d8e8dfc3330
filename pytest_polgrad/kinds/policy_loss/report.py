"""Failure reports: the property, the shrunk batch as a standalone snippet, the numbers
side by side, a diagnosis, and the command that replays the item."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, Any

import torch

from pytest_polgrad.core.saved_snippets import reproduce_lines
from pytest_polgrad.core.snippets import config_source
from pytest_polgrad.core.verdicts import Verdict, value_tables
from pytest_polgrad.kinds.policy_loss.diagnose.diagnosis import explain, holds_on
from pytest_polgrad.kinds.policy_loss.snippet import snippet

if TYPE_CHECKING:
    from pytest_polgrad.kinds.policy_loss.checks import Check, Context

__all__ = ["config_source", "failure_report", "snippet"]


def _batch_line(batch: Any) -> str:
    mask = batch.as_kwargs()["response_mask"]
    lengths = mask.sum(dim=1).tolist()
    return f"B={mask.shape[0]}, T={mask.shape[1]}, response lengths {lengths}"


def failure_report(
    ctx: Context,
    check: Check,
    exc: AssertionError,
    batch: Any,
    replay: str,
    *,
    diagnose: bool = True,
) -> tuple[str, str, str]:
    """The full text of a failure, its diagnosis sentence and the diagnosis summary (both
    empty when no diagnosis was run)."""
    kind = "verdict" if isinstance(exc, Verdict) else "finding"
    name = getattr(ctx, "name", "") or ctx.fut.name
    head = f"{name} does not conform to {ctx.options.reference_id!r}: check {check.name!r} failed"
    out = [
        head,
        f"  property   {check.summary}",
        f"  {kind:<10} {exc}",
    ]
    if batch is not None:
        out.append(f"  batch      {_batch_line(batch)} (the smallest Hypothesis found)")
    out += value_tables(exc, "position (b, t)")
    diagnosis = summary = ""
    if diagnose and check.semantic and not isinstance(exc, Verdict):
        diagnosis, summary = diagnosis_line(ctx)
        if batch is not None:
            elsewhere = _on_failing_batch(ctx, batch.as_kwargs())
            diagnosis = diagnosis.rstrip(".") + "." + elsewhere
            if elsewhere:  # the table must not read as if the function were its match
                summary += " on the corpus only (not on the failing batch)"
            cut = ignored_from(ctx, batch.as_kwargs())
            if cut is not None:
                diagnosis += (
                    f" Its gradient is exactly 0 at every response token from position {cut} "
                    "on, where the reference's is not, and before it only where the "
                    f"reference's is: it ignores the tokens past the first {cut} of each row."
                )
                ignores = f"ignores tokens from position {cut} on"
                summary = ignores if elsewhere or not summary else f"{summary}; {ignores}"
        out += ["", "  diagnosis  " + textwrap.fill(diagnosis, 88, subsequent_indent=" " * 13)]
    if ctx.notes:
        out += ["", "  notes"] + [f"    - {n}" for n in sorted(ctx.notes)]
    if batch is not None:  # the snippet's first comment says how to run it, as every kind's
        out.append("")  # flush left: saved as printed, it runs
        out += reproduce_lines(snippet(ctx, batch, check), name, check.name)
    if replay:
        out += ["", f"  replay     {replay}"]
    return "\n".join(out), diagnosis, summary


_DIAGNOSES: dict[tuple[Any, ...], tuple[str, str]] = {}
_BEST: dict[tuple[Any, ...], Any] = {}


def _key(ctx: Context) -> tuple[Any, ...]:
    return (ctx.fut.fn, repr(ctx.options), ctx.config, ctx.tolerance)


def _on_failing_batch(ctx: Context, batch: Any) -> str:
    """A sentence when the corpus match does not hold on the failing batch: the deviation
    then depends on the batch (its lengths, width or values), not on the semantics."""
    best = _BEST.get(_key(ctx))
    if best is None or holds_on(best, ctx.fut, batch, ctx.tolerance):
        return ""
    mask = batch["response_mask"]
    return (
        f" That match does not hold on the failing batch (B={mask.shape[0]}, "
        f"T={mask.shape[1]}): the deviation depends on the batch's lengths, width or values."
    )


def ignored_from(ctx: Context, batch: Any) -> int | None:
    """The column ``c`` from which the function's gradient is exactly 0 at every response
    token while the reference's is not (at one token at least), when before ``c`` it is 0
    only where the reference's is: a loss that drops the tokens past the first ``c`` of
    each row (a slice, a chunk limit). None otherwise, or when the call fails."""
    try:
        ev = ctx.fut.call(batch)
    except Verdict:
        return None
    if ev.grad is None:
        return None
    ref = ctx.expected(batch)
    mask = batch["response_mask"]
    g = ev.grad.to(torch.float64)
    live = (mask & (g != 0)).any(dim=0).nonzero()
    cut = int(live.max()) + 1 if live.numel() else 0
    if cut == 0 or cut >= mask.shape[1]:
        return None
    wanted = mask & (ref.grad != 0)
    if not bool(wanted[:, cut:].any()):
        return None
    zero_before = wanted[:, :cut] & (g[:, :cut] == 0)  # a zero the reference has not
    return None if bool(zero_before.any()) else cut


def diagnosis_line(ctx: Context) -> tuple[str, str]:
    """``(sentence, summary)``: 'this function matches X — name; the reference is Y' and
    the short form for the summary table (cached per function: every failing check of one
    function shares it)."""
    key = _key(ctx)
    if key not in _DIAGNOSES:
        _DIAGNOSES[key] = _diagnosis(ctx)
    return _DIAGNOSES[key]


def _diagnosis(ctx: Context) -> tuple[str, str]:
    found = explain(
        ctx.fut,
        ctx.config,
        ctx.tolerance,
        reference=ctx.options.reference,
        reference_id=ctx.options.reference_id,
    )
    if found.best is not None:
        _BEST[_key(ctx)] = found.best
    return found.text, found.summary
