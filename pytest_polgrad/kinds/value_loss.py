"""The value-loss kind: ``value_loss(values, old_values, returns, response_mask) -> scalar``,
compared (value and gradient w.r.t. ``values``) with
``polgrad_reference.value.clipped_value_loss`` in float64.

``L_t = h max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2)`` (``h = 1/2``; unclipped:
``h (V - R)^2``), aggregated over the response tokens (token-mean by default). The
function takes the tensors by parameter name (``**kwargs`` takes all) and returns the loss
(or a tuple/dict whose first item / ``"loss"`` entry it is, as verl's
``compute_value_loss`` returns ``(vf_loss, vf_clipfrac)``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from polgrad_reference import Aggregation, PolgradError, token_weights
from polgrad_reference.value import value_loss_per_token
from pytest_polgrad.core.clock import charged
from pytest_polgrad.core.golden_format import EntryScale, Tolerant
from pytest_polgrad.core.kinds import Diagnosis, KindCheck
from pytest_polgrad.core.options import ConformanceOptions, MarkerError
from pytest_polgrad.core.snippets import check_lines, importable, kind_snippet, pick_line
from pytest_polgrad.core.verdicts import CheckFailure, Verdict
from pytest_polgrad.kinds._packed import call_in_layout, snippet_call, snippet_helper
from pytest_polgrad.kinds._token_checks import TableKind, against_own, corpus_golden, token_hygiene
from pytest_polgrad.kinds._tokens import (
    TokenContext,
    aggregation_override,
    fmt,
    named_reference,
    pick_output,
    require_budget,
    require_scalar,
    unknown_overrides,
    worst_entries,
)
from pytest_polgrad.strategies import (
    ValueBatch,
    left_to_right,
    right_to_left,
    row_extents,
    value_batches,
)

__all__ = [
    "CORPUS_VERSION",
    "INPUT_NAMES",
    "KIND",
    "REFERENCES",
    "ValueLossKind",
    "ValueLossReference",
    "expected_value_loss",
]

INPUT_NAMES = ("values", "old_values", "returns", "response_mask")
CORPUS_VERSION = 1


@dataclasses.dataclass(frozen=True)
class ValueLossReference:
    """Clip range (``None``: unclipped), aggregation (``budget`` for token-sum-norm; ``0``
    means the batch's padded width, a batch-dependent variant) and the factor ``h``."""

    clip_range: float | None = 0.2
    aggregation: Aggregation = Aggregation.TOKEN_MEAN
    budget: int | None = None
    half: bool = True

    def describe(self) -> str:
        clip = "unclipped" if self.clip_range is None else f"clipped at +-{self.clip_range:g}"
        agg = self.aggregation.value
        if self.aggregation is Aggregation.TOKEN_SUM_NORM:
            agg += " (padded width)" if self.budget == 0 else f" (budget {self.budget})"
        factor = "1/2" if self.half else "1 (no 1/2)"
        return f"{clip} squared error x {factor}, {agg}"

    def names(self) -> list[str]:
        return [n for n, r in REFERENCES.items() if r == self]


REFERENCES: Mapping[str, ValueLossReference] = {
    "ppo": ValueLossReference(0.2),
    "verl": ValueLossReference(0.5),
    "unclipped": ValueLossReference(None),
}
"""``ppo``: clip 0.2, 1/2, token-mean (OpenAI baselines ``ppo2``, whose ``cliprange`` is
also the value clip); ``verl``: clip 0.5 (verl 0.9.1 ``critic.cliprange_value`` default,
``compute_value_loss``); ``unclipped``: ``1/2 (V - R)^2`` (PPO arXiv:1707.06347 Eq. 9)."""


def _f64(kw: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: t.to(torch.float64) if t.is_floating_point() else t for k, t in kw.items()}


def _weights(ref: ValueLossReference, mask: torch.Tensor) -> torch.Tensor:
    budget = ref.budget
    if ref.aggregation is Aggregation.TOKEN_SUM_NORM and budget == 0:
        budget = mask.shape[1]
    return token_weights(mask, ref.aggregation, budget=budget)


def expected_value_loss(
    ref: ValueLossReference, kw: Mapping[str, torch.Tensor]
) -> tuple[float, torch.Tensor]:
    """The reference loss and its gradient w.r.t. ``values`` (float64, ``[B, T]``)."""
    t = _f64(kw)
    values = t["values"].clone().requires_grad_(True)
    per_token = value_loss_per_token(
        values=values,
        old_values=t["old_values"],
        returns=t["returns"],
        response_mask=t["response_mask"],
        clip_range=ref.clip_range,
    )
    w = _weights(ref, t["response_mask"])
    loss = (torch.where(t["response_mask"], per_token, 0.0) * w).sum() * (1.0 if ref.half else 2.0)
    (grad,) = torch.autograd.grad(loss, values)
    return float(loss.detach()), grad


def _scales(
    ref: ValueLossReference, kw: Mapping[str, torch.Tensor], grad: torch.Tensor
) -> tuple[float, torch.Tensor]:
    """Loss and gradient magnitudes that do not cancel: ``sum |w| (|V| + |R| + |V_old| +
    c)^2`` and ``|w| (|V| + |R| + |V_old| + c)`` plus the row's largest gradient."""
    t = _f64(kw)
    mask = t["response_mask"]
    c = ref.clip_range or 0.0
    size = torch.where(
        mask, t["values"].abs() + t["returns"].abs() + t["old_values"].abs() + c, 0.0
    )
    w = _weights(ref, mask).abs()
    loss_scale = float((w * size * size).sum())
    g = grad.abs()
    grad_scale = 2.0 * w * size + g + g.amax(dim=1, keepdim=True)
    return loss_scale, grad_scale


# ---- calling the function ------------------------------------------------------------------


@dataclasses.dataclass
class ValueLossContext(TokenContext):
    """:class:`~pytest_polgrad.kinds._tokens.TokenContext` for the value-loss kind."""


def _edge(ctx: TokenContext, kw: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {n: kw[n].detach().clone() for n in INPUT_NAMES if n in ctx.takes and n in kw}
    if ctx.options.layout == "left":
        extents = row_extents(kw["response_mask"])
        out = {n: right_to_left(t, extents) for n, t in out.items()}
    return out


def call_value_loss(
    ctx: TokenContext, kw: Mapping[str, torch.Tensor], *, grad: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, torch.Tensor]]:
    """``(loss, d loss / d values in the canonical layout or None, tensors as passed)``."""
    given = _edge(ctx, kw)
    if grad:
        given["values"].requires_grad_(True)
    loss = require_scalar(
        pick_output(
            call_in_layout(ctx.options, ctx.fn, given, kw["response_mask"], "a valid batch"),
            ctx.options.loss,
            "loss",
        ),
        "value loss",
    )
    if not grad:
        return loss.detach(), None, given
    if not loss.requires_grad:
        raise Verdict("the returned loss is not differentiable in values (no grad_fn)")
    with charged():  # the backward through the function's result is its own
        (g,) = torch.autograd.grad(loss, given["values"], allow_unused=True)
    if g is None:
        raise Verdict("the returned loss does not depend on values (gradient is None)")
    if ctx.options.layout == "left":
        g = left_to_right(g, row_extents(kw["response_mask"]))
    return loss.detach(), g, given


# ---- checks ---------------------------------------------------------------------------------


def _reference(ctx: TokenContext, kw: Mapping[str, torch.Tensor]) -> tuple[float, torch.Tensor]:
    try:
        return expected_value_loss(ctx.config, kw)
    except PolgradError as exc:
        raise Verdict(f"the reference cannot compute this batch: {exc}") from exc


def _compare_loss(
    ctx: TokenContext,
    kw: Mapping[str, torch.Tensor],
    actual: float,
    expected: float,
    scale: float,
    what: str = "loss",
) -> float:
    n = int(kw["response_mask"].sum())
    cmp = ctx.tolerance.value(actual, expected, scale, n)
    if not cmp.ok:
        raise CheckFailure(
            f"{what} differs from the reference by {abs(actual - expected):.3g} "
            f"({cmp.error:.3g}x the tolerance)",
            numbers=[(what, fmt(expected), fmt(actual))],
            error=cmp.error,
        )
    return ctx.record(cmp, what)


def _compare_grad(
    ctx: TokenContext,
    kw: Mapping[str, torch.Tensor],
    actual: torch.Tensor,
    expected: torch.Tensor,
    scale: torch.Tensor,
    what: str = "gradient w.r.t. values",
) -> float:
    mask = kw["response_mask"]
    cmp, ratios = ctx.tolerance.tensor(actual, expected, scale, mask)
    if not cmp.ok:
        raise CheckFailure(
            f"{what} differs from the reference at {int((ratios > 1).sum())} response "
            f"position(s), worst by {cmp.error:.3g}x the tolerance",
            entries=worst_entries(ratios, expected, actual.to(torch.float64)),
            error=cmp.error,
        )
    return ctx.record(cmp, what)


def _check_value(ctx: Any, kw: Mapping[str, Any]) -> float:
    loss, _, _ = call_value_loss(ctx, kw, grad=False)
    if not bool(torch.isfinite(loss)):
        raise Verdict(f"the function returned {float(loss)} for a valid batch")
    expected, grad = _reference(ctx, kw)
    scale, _ = _scales(ctx.config, kw, grad)
    return _compare_loss(ctx, kw, float(loss), expected, scale)


def _check_gradient(ctx: Any, kw: Mapping[str, Any]) -> float:
    _, g, _ = call_value_loss(ctx, kw)
    assert g is not None
    _, expected = _reference(ctx, kw)
    _, scale = _scales(ctx.config, kw, expected)
    err = _compare_grad(ctx, kw, g, expected, scale)
    mask = kw["response_mask"]
    leak = (g != 0) & ~mask
    if bool(leak.any()):
        pos = [tuple(p) for p in leak.nonzero()[:4].tolist()]
        raise CheckFailure(
            f"gradient flows into padding positions of values at {pos}",
            entries=[(p, 0.0, float(g[p])) for p in pos],
        )
    return err


def _regarble(kw: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    mask = kw["response_mask"]
    g = torch.Generator().manual_seed(11)
    out = dict(kw)
    for name, t in kw.items():
        if t.is_floating_point():
            junk = (torch.rand(t.shape, generator=g, dtype=torch.float64) * 2 - 1) * 5e3
            out[name] = torch.where(mask, t, junk.to(t.dtype))
    return out


def _check_same_loss(ctx: Any, kw: Mapping[str, Any], other: Mapping[str, Any], why: str) -> float:
    base, _, _ = call_value_loss(ctx, kw, grad=False)
    changed, _, _ = call_value_loss(ctx, other, grad=False)
    _, grad = _reference(ctx, kw)
    scale, _ = _scales(ctx.config, kw, grad)
    with against_own(why, "loss"):
        return _compare_loss(ctx, kw, float(changed), float(base), scale, "loss")


def _check_padding_values(ctx: Any, kw: Mapping[str, Any]) -> float:
    if bool(kw["response_mask"].all()):
        return 0.0
    return _check_same_loss(ctx, kw, _regarble(kw), "with other values at padding")


def _check_padding_columns(ctx: Any, kw: Mapping[str, Any]) -> float:
    if ctx.config.aggregation is Aggregation.TOKEN_SUM_NORM and ctx.config.budget == 0:
        return 0.0  # the padded width is the semantics
    wide = {
        n: torch.nn.functional.pad(t, (0, 3), value=False if t.dtype == torch.bool else 9.0)
        for n, t in kw.items()
    }
    return _check_same_loss(ctx, kw, wide, "with 3 more padding columns")


_CHECKS: dict[str, KindCheck] = {
    c.name: c
    for c in (
        KindCheck("value", "the loss equals the reference value loss", _check_value),
        KindCheck(
            "gradient", "d loss / d values equals the reference, 0 at padding", _check_gradient
        ),
        KindCheck(
            "extreme-values",
            "value and targets scaled from 1e-2 to 1e4 give the reference loss",
            _check_value,
            domain="extreme",
        ),
        *token_hygiene(
            "values",
            "loss",
            call_value_loss,
            _edge,
            padding_values=_check_padding_values,
            padding_columns=_check_padding_columns,
            numbers="loss",
        ),
    )
}

_OVERRIDES = frozenset({"clip_range", "aggregation", "budget", "half"})


class ValueLossKind(TableKind):
    """The value-loss :class:`~pytest_polgrad.core.kinds.Kind` (see the module docstring)."""

    name = "value_loss"
    summary = "value_loss(values, old_values, returns, response_mask) -> scalar tensor"
    override_keys = _OVERRIDES

    def resolve(self, options: ConformanceOptions) -> ValueLossReference:
        base = named_reference(self.name, options.reference, REFERENCES, ValueLossReference)
        unknown_overrides(self.name, options, _OVERRIDES)
        over = dict(options.overrides)
        aggregation_override(over)
        if "aggregation" in over and over["aggregation"] is not Aggregation.TOKEN_SUM_NORM:
            over.setdefault("budget", None)
        out = dataclasses.replace(base, **over)
        c = out.clip_range
        if c is not None and (isinstance(c, bool) or not isinstance(c, (int, float)) or not c > 0):
            raise MarkerError(f"clip_range must be a positive number or None, got {c!r}")
        if not isinstance(out.half, bool):
            raise MarkerError(f"half must be True or False, got {out.half!r}")
        require_budget(out.aggregation, out.budget)
        return out

    def missing(self, name: str) -> str:
        return (
            f"{name} has no 'values' parameter; a value loss takes keyword tensors among "
            f"{', '.join(INPUT_NAMES)}"
        )

    def shape(self, ctx: Any, check: KindCheck) -> dict[str, Any]:
        ref: ValueLossReference = ctx.config
        return dict(
            max_batch=min(6, ctx.options.max_batch),
            max_length=min(12, ctx.options.max_length),
            clip_range=ref.clip_range or 0.2,
            dtype=ctx.tolerance.input_dtype,
            domain="extreme" if check.domain == "extreme" else "semantic",
            padding="nan" if ctx.options.padding_nan else "garbage",
        )

    def strategy(self, ctx: Any, check: KindCheck) -> Any:
        return value_batches(**self.shape(ctx, check))

    def corpus(self, ctx: Any) -> dict[str, ValueBatch]:
        ref: ValueLossReference = ctx.config
        return value_corpus(ctx.tolerance.input_dtype, ref.clip_range or 0.2)

    def diagnose(self, ctx: Any, inputs: Any) -> Diagnosis:
        return diagnose_value_loss(ctx, inputs)

    def snippet(self, ctx: Any, inputs: Any, check: KindCheck) -> str:
        return value_loss_snippet(ctx, inputs, check)

    def golden(self, ctx: Any) -> Tolerant:
        def entry(kw: Mapping[str, Any], called: Any) -> Any:
            loss, g, _ = called
            assert g is not None
            _, ref_grad = _reference(ctx, kw)
            loss_scale, grad_scale = _scales(ctx.config, kw, ref_grad)
            own = float(loss.abs())
            scales = {
                "loss": EntryScale(max(loss_scale, own), count=int(kw["response_mask"].sum())),
                "grad": EntryScale(
                    torch.maximum(grad_scale, g.to(torch.float64).abs() + float(g.abs().max()))
                ),
            }
            return {"loss": loss, "grad": g}, scales

        return corpus_golden(self.corpus(ctx), lambda kw: call_value_loss(ctx, kw), entry,
                             tolerance=ctx.tolerance, version=CORPUS_VERSION)  # fmt: skip


# --------------------------------------------------------------------------- snippet


def value_loss_snippet(ctx: TokenContext, inputs: ValueBatch, check: KindCheck) -> str:
    """Standalone Python: the function called as ``check`` called it, the reference
    value loss and its gradient w.r.t. ``values`` in float64, and what the check compared."""
    ref: ValueLossReference = ctx.config
    where = importable(ctx.fn, ctx.name)
    left = ctx.options.layout == "left"
    grad = check.name in ("gradient", "inputs-unchanged", "deterministic")
    takes = [n for n in INPUT_NAMES if n in ctx.takes]
    budget = "mask.shape[1]" if ref.budget == 0 else repr(ref.budget)  # 0: the padded width
    convert = [
        "    extents = row_extents(mask)  # the function takes left-padded tensors",
        "    kw = {n: right_to_left(t, extents) for n, t in kw.items()}",
    ]
    definitions = [
        *snippet_helper(ctx.options),
        "",
        "",
        "def run(inputs, grad=" + str(grad) + "):",
        '    """Call the function as the check did; its gradient w.r.t. values."""',
        "    mask = inputs['response_mask']",
        f"    kw = {{n: inputs[n].detach().clone() for n in {takes!r}}}",
        *(convert if left else []),
        "    if grad:",
        "        kw['values'].requires_grad_(True)",
        "    before = {k: v.detach().clone() for k, v in kw.items()}",
        f"    out = {snippet_call(ctx.options, where.call)}",
        pick_line(ctx.options.loss, "loss"),
        "    g = torch.autograd.grad(out, kw['values'])[0] if grad else None",
        *(["    g = left_to_right(g, extents) if grad else None"] if left else []),
        "    return out.detach(), g, kw, before",
        "",
        "",
        "def reference(inputs, out):",
        f'    """The float64 reference: {ref.describe()}."""',
        "    t = {k: v.double() if v.is_floating_point() else v for k, v in inputs.items()}",
        "    mask = t['response_mask']",
        "    values = t['values'].clone().requires_grad_(True)",
        "    per_token = value_loss_per_token(values=values, old_values=t['old_values'],",
        "                                     returns=t['returns'], response_mask=mask,",
        f"                                     clip_range={ref.clip_range!r})",
        f"    w = token_weights(mask, {ref.aggregation.value!r}, budget={budget})",
        "    loss = (torch.where(mask, per_token, 0.0) * w).sum()"
        + ("" if ref.half else " * 2.0  # without the 1/2"),
        "    return loss.detach(), torch.autograd.grad(loss, values)[0]",
    ]
    if check.name == "padding-values":
        other = [
            "g = torch.Generator().manual_seed(11)",
            "other = dict(inputs)",
            "for name, t in inputs.items():",
            "    if t.is_floating_point():",
            "        junk = (torch.rand(t.shape, generator=g, dtype=torch.float64) * 2 - 1) * 5e3",
            "        other[name] = torch.where(inputs['response_mask'], t, junk.to(t.dtype))",
        ]
        lines = check_lines("same", other=other, grads=False, what="other values at padding")
    elif check.name == "padding-columns":
        other = [
            "other = {n: torch.nn.functional.pad(t, (0, 3), value=False if t.dtype == "
            "torch.bool else 9.0)",
            "         for n, t in inputs.items()}",
        ]
        lines = check_lines("same", other=other, grads=False, what="3 more padding columns")
    else:
        lines = check_lines("value" if check.name == "extreme-values" else check.name)
    imports = [
        "from polgrad_reference import token_weights",
        "from polgrad_reference.value import value_loss_per_token",
    ]
    if left:
        imports.append("from pytest_polgrad.strategies import left_to_right, right_to_left, "
                       "row_extents")  # fmt: skip
    return kind_snippet(
        where,
        imports=imports,
        inputs=inputs.to_snippet(),
        definitions=definitions,
        check=lines,
    )


KIND = ValueLossKind(_CHECKS, INPUT_NAMES, ValueLossContext)


# ---- corpus -----------------------------------------------------------------------------------


def value_corpus(dtype: torch.dtype, clip: float) -> dict[str, ValueBatch]:
    """Literal batches: both clip regions, either side of the return, ragged rows."""
    out = {}
    lengths = {"ragged": [1, 4, 6, 3], "full": [5, 5]}
    for index, (name, lens) in enumerate(lengths.items()):
        width = max(lens) + 1
        b = len(lens)
        mask = torch.arange(width)[None, :] < torch.tensor(lens)[:, None]
        old = torch.tensor(
            [[((5 * i + 3 * j + index) % 9 - 4) / 4 for j in range(width)] for i in range(b)],
            dtype=torch.float64,
        )
        # steps of 0.3c (inside), 2c to 5c (outside, also of a 0.5 range), both signs
        pattern = [0.3, -2.0, 2.0, -0.3, 0.0, 4.0, 6.0, -4.0]  # even: no ties in the max
        step = torch.tensor(
            [[pattern[(i + j) % len(pattern)] * clip for j in range(width)] for i in range(b)],
            dtype=torch.float64,
        )
        ret = old + torch.tensor(
            [[((7 * i + j) % 13 - 6) * clip for j in range(width)] for i in range(b)],
            dtype=torch.float64,
        )
        junk = torch.full((b, width), 77.0, dtype=torch.float64)
        out[name] = ValueBatch(
            values=torch.where(mask, old + step, junk).to(dtype),
            old_values=torch.where(mask, old, junk).to(dtype),
            returns=torch.where(mask, ret, junk).to(dtype),
            response_mask=mask,
        )
    return out


# ---- diagnosis ---------------------------------------------------------------------------------


def _candidates(ref: ValueLossReference) -> Iterator[ValueLossReference]:
    yield ref
    clips = dict.fromkeys((ref.clip_range, None, 0.2, 0.5, 0.1, 0.3))
    for clip, agg, half in itertools.product(clips, Aggregation, (True, False)):
        budgets: tuple[int | None, ...] = (None,)
        if agg is Aggregation.TOKEN_SUM_NORM:
            budgets = tuple(dict.fromkeys(b for b in (ref.budget, 0) if b is not None))
        for budget in budgets:
            yield ValueLossReference(clip, agg, budget, half)


def _error(
    ctx: TokenContext,
    cand: ValueLossReference,
    observed: Mapping[str, tuple[Mapping[str, torch.Tensor], float, torch.Tensor]],
) -> float:
    probe = dataclasses.replace(ctx, config=cand, worst=0.0, notes=set())
    worst = 0.0
    for kw, loss, grad in observed.values():
        try:
            expected, eg = expected_value_loss(cand, kw)
        except PolgradError:
            return math.inf
        ls, gs = _scales(cand, kw, eg)
        try:
            worst = max(worst, _compare_loss(probe, kw, loss, expected, ls))
            worst = max(worst, _compare_grad(probe, kw, grad, eg, gs))
        except CheckFailure as exc:
            worst = max(worst, exc.error)
    return worst


def diagnose_value_loss(ctx: TokenContext, inputs: Any) -> Diagnosis:
    """The closest candidate (clip range, aggregation, factor) on the corpus."""
    ref: ValueLossReference = ctx.config
    observed = {}
    for name, batch in value_corpus(ctx.tolerance.input_dtype, ref.clip_range or 0.2).items():
        kw = batch.as_kwargs()
        try:
            loss, g, _ = call_value_loss(ctx, kw)
        except Verdict as exc:
            return Diagnosis(f"could not evaluate the function on corpus batch {name!r}: {exc}", "")
        assert g is not None
        observed[name] = (kw, float(loss), g)
    ranked = sorted(((c, _error(ctx, c, observed)) for c in _candidates(ref)), key=lambda x: x[1])
    best, err = ranked[0]
    label = best.describe() + (f" — {', '.join(best.names())}" if best.names() else "")
    reference = f"the reference {ctx.options.reference_id!r} is {ref.describe()}"
    if err > 1.0:
        return Diagnosis(
            f"no candidate value loss matches on the corpus; the closest is {label} (off by "
            f"{err:.3g} tolerances); {reference}",
            "",
        )
    if best == ref:
        return Diagnosis(f"the function matches the reference on the corpus ({label})", label)
    return Diagnosis(f"this value loss matches {label} on the corpus; {reference}", label)
