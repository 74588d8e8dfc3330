"""Failure reports: the property, the shrunk batch as a standalone snippet, the numbers
side by side, a diagnosis, and the command that replays the item."""

from __future__ import annotations

import dataclasses
import enum
import textwrap
from typing import TYPE_CHECKING, Any

from .target import Verdict

if TYPE_CHECKING:
    from .checks import Check, Context

__all__ = ["config_source", "failure_report"]

SEMANTIC_CHECKS = frozenset({"value", "gradient", "on-policy", "padding-columns", "micro-batch"})
"""Checks whose failure means 'computes other semantics', so a diagnosis is worth running."""


def config_source(value: Any) -> str:
    """Valid Python that rebuilds a (nested) config dataclass."""
    if isinstance(value, enum.Enum):
        return repr(value.value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        args = ", ".join(
            f"{f.name}={config_source(getattr(value, f.name))}" for f in dataclasses.fields(value)
        )
        return f"{type(value).__name__}({args})"
    return repr(value)


def _reference_source(ctx: Context) -> list[str]:
    return [
        "from polgrad_reference import (",
        "    ClipConfig, ISCorrection, KLConfig, PolicyLossConfig, policy_loss,",
        ")",
        "",
        f"config = {config_source(ctx.config)}",
    ]


def snippet(ctx: Context, batch: Any, check: str = "value") -> str:
    """Standalone Python: rebuild the batch, call the function and the reference, and
    print what ``check`` compares (loss, gradient, padding gradient, changed inputs)."""
    fn = ctx.fut.fn
    lines = ["import torch", f"from {fn.__module__} import {fn.__name__}", *_reference_source(ctx)]
    built = [ln for ln in batch.to_snippet().rstrip().splitlines() if ln != "import torch"]
    lines += ["", *built, ""]
    layout = ctx.options.layout
    present = batch.as_kwargs()
    passed = [
        n for n in ctx.fut.takes if n in present or (n == "cu_seqlens" and layout == "packed")
    ]
    if layout != "right":
        lines += [
            f"# the function receives the batch {'left-padded' if layout == 'left' else 'packed'}",
            "from pytest_polgrad.strategies import (",
            "    left_to_right, pack, right_to_left, row_extents, unpack,",
            ")",
            "extents = row_extents(response_mask)",
        ]
        convert = "right_to_left({0}, extents)" if layout == "left" else "pack({0}, extents)[0]"
        names = [n for n in passed if n not in ("cu_seqlens", "advantages")]
        if "advantages" in passed and ctx.options.advantages == "token":
            names.append("advantages")
        lines += [f"{n}_in = {convert.format(n)}" for n in names]
        if "cu_seqlens" in passed:
            lines.append("cu_seqlens = pack(response_mask, extents)[1]")
    call_args = []
    for n in passed:
        converted = (
            layout != "right"
            and n != "cu_seqlens"
            and (n != "advantages" or ctx.options.advantages == "token")
        )
        call_args.append(f"{n}={n}_in" if converted else f"{n}={n}")
    lp = "logprobs_in" if layout != "right" else "logprobs"
    args = ", ".join(call_args)
    if check == "inputs-unchanged":
        lines.append(f"before = {{k: v.clone() for k, v in dict({args}).items()}}")
    lines += [
        f"{lp}.requires_grad_(True)",
        f"loss = {fn.__name__}({args})",
        f"(grad,) = torch.autograd.grad(loss, {lp})",
    ]
    if layout == "left":
        lines.append("grad = left_to_right(grad, extents)")
    elif layout == "packed":
        lines.append(
            "grad = unpack(grad, pack(response_mask, extents)[1], width=response_mask.shape[1])"
        )
    lines += [
        "ref_lp = logprobs.detach().double().requires_grad_(True)",
        "ref_inputs = dict(logprobs=ref_lp, old_logprobs=old_logprobs.double(),",
        "                  advantages=advantages.double(), response_mask=response_mask)",
    ]
    lines += [f"ref_inputs['{name}'] = {name}.double()" for name in ctx.oracle.needs]
    lines += [
        "expected = policy_loss(config, **ref_inputs).loss",
        "(expected_grad,) = torch.autograd.grad(expected, ref_lp)",
        "print('function:', loss.item(), ' reference:', expected.item())",
        "diff = (grad.double() - expected_grad).abs().masked_fill(~response_mask, 0.0)",
        "print('largest gradient difference at a response position:', diff.max().item(),",
        "      'at (b, t) =', divmod(int(diff.argmax()), diff.shape[1]))",
        "print('largest |gradient| at padding (must be 0):',",
        "      grad.masked_fill(response_mask, 0.0).abs().max().item())",
    ]
    if check == "inputs-unchanged":
        lines += [
            f"after = dict({args})",
            "changed = [k for k, v in before.items()",
            "           if not torch.equal(v.nan_to_num(), after[k].detach().nan_to_num())]",
            "print('inputs modified in place:', changed)",
        ]
    return "\n".join(lines)


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
    head = (
        f"{ctx.fut.name} does not conform to {ctx.options.reference_id!r}: "
        f"check {check.name!r} failed"
    )
    out = [
        head,
        f"  property   {check.summary}",
        f"  {kind:<10} {exc}",
    ]
    if batch is not None:
        out.append(f"  batch      {_batch_line(batch)} (the smallest Hypothesis found)")
    numbers = getattr(exc, "numbers", [])
    if numbers:
        out.append("")
        out.append(f"  {'quantity':<28} {'expected':>24} {'actual':>24}")
        out += [f"  {q:<28} {e:>24} {a:>24}" for q, e, a in numbers]
    entries = getattr(exc, "entries", [])
    if entries:
        out.append("")
        out.append(f"  {'position (b, t)':<28} {'expected':>24} {'actual':>24}")
        out += [f"  {p!s:<28} {e:>24.17g} {a:>24.17g}" for p, e, a in entries]
    diagnosis = summary = ""
    if diagnose and check.name in SEMANTIC_CHECKS and not isinstance(exc, Verdict):
        diagnosis, summary = diagnosis_line(ctx)
        if batch is not None:
            diagnosis = diagnosis.rstrip(".") + "." + _on_failing_batch(ctx, batch.as_kwargs())
        out += ["", "  diagnosis  " + textwrap.fill(diagnosis, 88, subsequent_indent=" " * 13)]
    if ctx.notes:
        out += ["", "  notes"] + [f"    - {n}" for n in sorted(ctx.notes)]
    if batch is not None:
        out += ["", "  reproduce (standalone; run from your repository root):", ""]
        out += [
            "    " + line if line else "" for line in snippet(ctx, batch, check.name).splitlines()
        ]
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
    from .diagnose import holds_on

    best = _BEST.get(_key(ctx))
    if best is None or holds_on(best, ctx.fut, batch, ctx.tolerance):
        return ""
    mask = batch["response_mask"]
    return (
        f" That match does not hold on the failing batch (B={mask.shape[0]}, "
        f"T={mask.shape[1]}): the deviation depends on the batch's lengths, width or values."
    )


def diagnosis_line(ctx: Context) -> tuple[str, str]:
    """``(sentence, summary)``: 'this function matches X — name; the reference is Y' and
    the short form for the summary table (cached per function: every failing check of one
    function shares it)."""
    key = _key(ctx)
    if key not in _DIAGNOSES:
        _DIAGNOSES[key] = _diagnosis(ctx)
    return _DIAGNOSES[key]


def _diagnosis(ctx: Context) -> tuple[str, str]:
    from .diagnose import describe_config, diagnose

    wanted = f"the reference {ctx.options.reference_id!r} is {describe_config(ctx.config)}"
    try:
        matches = diagnose(ctx.fut, ctx.config, ctx.tolerance)
    except Verdict as exc:
        return f"not diagnosed ({exc}); {wanted}", "not diagnosed"
    best = [m for m in matches if m.matches]
    if best:
        _BEST[_key(ctx)] = best[0]
        found = "; or ".join(m.describe() for m in best)
        return (
            f"on the canonical corpus this function matches {found} (within tolerance); {wanted}",
            f"is {found}",
        )
    m = matches[0]
    return (
        f"no registered semantics matches; the closest is {m.describe()} "
        f"(off by {m.error:.3g}x the tolerance); {wanted}",
        f"no match (closest: {m.describe()}, {m.error:.2g}x tol)",
    )
