"""The aggregation kind: per-token values ``[B, T]`` and a mask -> one scalar.

Convention: the function takes the per-token values under one of the names in
:data:`VALUE_NAMES` (``x``, verl's ``loss_mat``, ``per_token_loss``, ...) and the bool mask
under one of :data:`MASK_NAMES` (``response_mask``, verl's ``loss_mask``, ...), and returns
a scalar. The reference is ``aggregate(x, mask, mode) = sum_{b,t} w[b, t] x[b, t]`` with the
closed-form weights of :func:`polgrad_reference.token_weights`, so the gradient with respect
to ``x`` must *be* ``w`` (``docs/aggregation.md``). The marker's reference is a registry name
(its loss's aggregation and budget) or a mode name (``"token-mean"``); ``aggregation=`` and
``budget=`` override it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch
from hypothesis import strategies as st

from polgrad_reference import ALGORITHMS, Aggregation, aggregate, get_algorithm, token_weights
from pytest_polgrad.core.calls import _pick_loss
from pytest_polgrad.core.clock import charged
from pytest_polgrad.core.corpus import canonical_corpus, corpus_version
from pytest_polgrad.core.golden_format import EntryScale, Tolerant
from pytest_polgrad.core.kinds import Diagnosis, Kind, KindCheck
from pytest_polgrad.core.options import ConformanceOptions, MarkerError, did_you_mean
from pytest_polgrad.core.snippets import check_lines, importable, kind_snippet, pick_line
from pytest_polgrad.core.verdicts import CheckFailure, Verdict
from pytest_polgrad.kinds._packed import (
    call_in_layout,
    check_layout,
    for_layout,
    snippet_call,
    snippet_helper,
)
from pytest_polgrad.kinds._tokens import (
    TokenContext,
    TokenInputs,
    bitwise_equal,
    compare_tensor,
    compare_value,
    parameters,
    require_scalar,
    tolerance_for,
)
from pytest_polgrad.strategies import batches
from pytest_polgrad.strategies._sample import mapped

__all__ = ["KIND", "MASK_NAMES", "VALUE_NAMES", "AggregationKind", "AggregationRef"]

VALUE_NAMES = ("x", "loss_mat", "per_token_loss", "token_loss", "values", "losses", "loss")
"""The per-token values' spellings: verl's ``loss_mat``, TRL's ``per_token_loss``, OpenRLHF's
``aggregate_loss(loss, ...)``."""
MASK_NAMES = ("response_mask", "loss_mask", "mask", "completion_mask")


@dataclasses.dataclass(frozen=True)
class AggregationRef:
    """The reference: a mode and (token-sum-norm only) its fixed budget."""

    mode: Aggregation
    budget: int | None = None

    def describe(self) -> str:
        if self.mode is Aggregation.TOKEN_SUM_NORM:
            return f"token-sum-norm (budget {self.budget})"
        return str(self.mode.value)


@dataclasses.dataclass
class AggContext(TokenContext):
    value_name: str = "x"
    mask_name: str = "response_mask"

    @property
    def ref(self) -> AggregationRef:
        assert isinstance(self.config, AggregationRef)
        return self.config


@dataclasses.dataclass(frozen=True)
class _Eval:
    value: torch.Tensor
    grad: torch.Tensor


def _call(ctx: AggContext, inputs: Mapping[str, torch.Tensor], what: str) -> _Eval:
    x = inputs["x"].detach().clone().requires_grad_(True)
    kwargs = {ctx.value_name: x, ctx.mask_name: inputs["response_mask"].clone()}
    mask = inputs["response_mask"]
    result = call_in_layout(ctx.options, ctx.fn, kwargs, mask, what)
    out = require_scalar(_pick_loss(result, ctx.options.loss), what)
    if not bool(torch.isfinite(out)):
        raise Verdict(f"the function returned {out.item()} on {what}")
    if not out.requires_grad:
        raise Verdict(f"{what}: the result is not differentiable in {ctx.value_name}")
    with charged():  # the backward through the function's result is its own
        (g,) = torch.autograd.grad(out, x, allow_unused=True)
    if g is None:
        raise Verdict(f"{what}: the result does not depend on {ctx.value_name}")
    return _Eval(out.detach(), g.detach())


@dataclasses.dataclass(frozen=True)
class _Expected:
    value: float
    weights: torch.Tensor
    value_scale: float
    grad_scale: torch.Tensor
    n: int


def _expected(
    ref: AggregationRef, inputs: Mapping[str, torch.Tensor], budget: int | None = None
) -> _Expected:
    mask = inputs["response_mask"]
    x = torch.where(mask, inputs["x"].detach().to(torch.float64), 0.0)
    bud = budget if budget is not None else ref.budget
    w = token_weights(mask, ref.mode, budget=bud)
    value = float(aggregate(x, response_mask=mask, mode=ref.mode, budget=bud))
    return _Expected(
        value=value,
        weights=w,
        value_scale=float((w.abs() * x.abs()).sum()),
        grad_scale=w.abs() + w.abs().max(),
        n=int(mask.sum()),
    )


def check_value(ctx: AggContext, inputs: Mapping[str, torch.Tensor]) -> float:
    ev = _call(ctx, inputs, "a valid input")
    e = _expected(ctx.ref, inputs)
    return compare_value(ctx, float(ev.value), e.value, e.value_scale, e.n, "aggregate")


def check_gradient(ctx: AggContext, inputs: Mapping[str, torch.Tensor]) -> float:
    ev = _call(ctx, inputs, "a valid input")
    e = _expected(ctx.ref, inputs)
    return compare_tensor(ctx, ev.grad, e.weights, e.grad_scale, inputs["response_mask"],
                          f"d aggregate / d {ctx.value_name} (the token weights)")  # fmt: skip


def check_masked_positions(ctx: AggContext, inputs: Mapping[str, torch.Tensor]) -> float:
    ev = _call(ctx, inputs, "a valid input")
    bad = ~inputs["response_mask"] & (ev.grad != 0)
    if bool(bad.any()):
        pos = [tuple(p) for p in bad.nonzero()[:4].tolist()]
        raise CheckFailure(
            f"the gradient is not exactly zero at {int(bad.sum())} padding position(s)",
            entries=[(p, 0.0, float(ev.grad[p])) for p in pos],
        )
    return 0.0


def _same(
    ctx: AggContext, inputs: Mapping[str, torch.Tensor], a: _Eval, b: _Eval, what: str
) -> float:
    e = _expected(ctx.ref, inputs)
    width = inputs["response_mask"].shape[1]
    err = compare_value(ctx, float(b.value), float(a.value), e.value_scale, e.n, "aggregate",
                        f" when {what}")  # fmt: skip
    return max(err, compare_tensor(ctx, b.grad[:, :width], a.grad.to(torch.float64),
                                   e.grad_scale, inputs["response_mask"], "gradient",
                                   f" when {what}"))  # fmt: skip


def check_padding_values(ctx: AggContext, inputs: Mapping[str, torch.Tensor]) -> float:
    first = _call(ctx, inputs, "a valid input")
    mask = inputs["response_mask"]
    fill = float("nan") if ctx.options.padding_nan else -7.5
    other = {**inputs, "x": torch.where(mask, inputs["x"], torch.full_like(inputs["x"], fill))}
    second = _call(ctx, other, "the input with other values at padding")
    what = "only the values at padding change" + (" (to NaN)" if ctx.options.padding_nan else "")
    return _same(ctx, inputs, first, second, what)


def check_padding_columns(ctx: AggContext, inputs: Mapping[str, torch.Tensor]) -> float:
    first = _call(ctx, inputs, "a valid input")
    mask, x = inputs["response_mask"], inputs["x"]
    extra = mask.shape[1] + 3
    wide = {
        "x": torch.cat([x, torch.full((x.shape[0], extra), -7.0, dtype=x.dtype)], dim=1),
        "response_mask": torch.cat([mask, torch.zeros(mask.shape[0], extra, dtype=torch.bool)], 1),
    }
    second = _call(ctx, wide, f"the input with {extra} padding columns appended")
    return _same(ctx, inputs, first, second, f"{extra} padding columns are appended")


def check_inputs_unchanged(ctx: AggContext, inputs: Mapping[str, torch.Tensor]) -> float:
    x = inputs["x"].detach().clone().requires_grad_(True)
    mask = inputs["response_mask"].clone()
    before = (x.detach().clone(), mask.clone())
    kwargs = {ctx.value_name: x, ctx.mask_name: mask}
    call_in_layout(ctx.options, ctx.fn, kwargs, inputs["response_mask"], "a valid input")
    for name, old, new in (
        (ctx.value_name, before[0], x.detach()),
        (ctx.mask_name, before[1], mask),
    ):
        if not bool(bitwise_equal(old, new).all()):
            raise CheckFailure(f"the function modified its input {name} in place")
    return 0.0


def check_deterministic(ctx: AggContext, inputs: Mapping[str, torch.Tensor]) -> float:
    a, b = _call(ctx, inputs, "a valid input"), _call(ctx, inputs, "the same input again")
    if not bool(bitwise_equal(a.value, b.value)) or not bool(bitwise_equal(a.grad, b.grad).all()):
        raise CheckFailure("two calls on the same input give different results")
    return 0.0


_CHECKS = (
    KindCheck("value", "the aggregate equals sum(w * x) with the mode's closed-form weights",
              check_value),
    KindCheck("gradient", "the gradient with respect to the values is the token weights w",
              check_gradient),
    KindCheck("masked-positions", "the gradient is exactly zero at padding",
              check_masked_positions, semantic=False),
    KindCheck("padding-values", "the result does not depend on the values at padding",
              check_padding_values, semantic=False),
    KindCheck("padding-columns", "appending padding columns changes nothing (a budget is "
              "not the padded width)", check_padding_columns),
    KindCheck("inputs-unchanged", "no input is modified in place", check_inputs_unchanged,
              semantic=False),
    KindCheck("deterministic", "two calls agree bitwise", check_deterministic, semantic=False),
)  # fmt: skip


def _inputs(batch: Mapping[str, torch.Tensor], label: str = "") -> TokenInputs:
    """Per-token values from a policy batch: its per-token advantages times its ratios."""
    mask = batch["response_mask"]
    x = batch["advantages"]
    if x.dim() == 1:
        x = x[:, None].expand_as(batch["logprobs"])
    ratio = torch.exp(batch["logprobs"] - batch["old_logprobs"])
    x = torch.where(mask, -x * ratio, batch["logprobs"])  # finite garbage at padding
    return TokenInputs({"x": x.contiguous(), "response_mask": mask}, label)


class AggregationKind(Kind):
    """See the module docstring."""

    name = "aggregation"
    summary = "(x [B, T] per-token values, response_mask [B, T] bool) -> scalar aggregate"
    override_keys = frozenset({"aggregation", "budget"})

    def resolve(self, options: ConformanceOptions) -> AggregationRef:
        check_layout(self.name, options, self.override_keys)
        ref, o = options.reference, dict(options.overrides)
        modes = [m.value for m in Aggregation]
        if isinstance(ref, str) and ref in modes:
            mode, budget = Aggregation(ref), None
        elif isinstance(ref, str) and ref in ALGORITHMS:
            loss = get_algorithm(ref).loss
            mode, budget = loss.aggregation, loss.budget
        else:
            raise MarkerError(
                f"the aggregation kind's reference must be a mode ({', '.join(modes)}) or a "
                f"registry name ({', '.join(ALGORITHMS)}), got {ref!r}"
                + did_you_mean(str(ref), [*modes, *ALGORITHMS])
            )
        if "aggregation" in o:
            value = o["aggregation"]
            if value not in modes and not isinstance(value, Aggregation):
                raise MarkerError(f"aggregation must be one of {modes}, got {value!r}"
                                  + did_you_mean(str(value), modes))  # fmt: skip
            mode = Aggregation(value)
            budget = None if mode is not Aggregation.TOKEN_SUM_NORM else budget
        if "budget" in o:
            budget = o["budget"]
        if mode is Aggregation.TOKEN_SUM_NORM:
            if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
                raise MarkerError(f"token-sum-norm needs budget=<positive int>, got {budget!r}")
        elif budget is not None:
            raise MarkerError(f"budget applies to token-sum-norm only, not {mode.value!r}")
        return AggregationRef(mode, budget)

    def checks(self, config: Any, options: ConformanceOptions) -> list[KindCheck]:
        out = for_layout(list(_CHECKS), options)
        return [c for c in out if options.checks is None or c.name in options.checks]

    def context(
        self, fn: Callable[..., Any], name: str, config: Any, options: ConformanceOptions
    ) -> AggContext:
        takes = parameters(fn, (*VALUE_NAMES, *MASK_NAMES))
        value = next((n for n in VALUE_NAMES if n in takes), None)
        mask = next((n for n in MASK_NAMES if n in takes), None)
        if value is None or mask is None:
            raise Verdict(
                f"{name!r} must take the per-token values as one of {', '.join(VALUE_NAMES)} "
                f"and the mask as one of {', '.join(MASK_NAMES)}"
            )
        return AggContext(fn=fn, name=name, options=options, config=config,
                          tolerance=tolerance_for(options), takes=takes, value_name=value,
                          mask_name=mask)  # fmt: skip

    def pool_key(self, ctx: Any, check: KindCheck) -> tuple[object, ...]:
        o = ctx.options
        return (o.dtype, o.max_batch, o.max_length, o.padding_nan)

    def strategy(self, ctx: Any, check: KindCheck) -> st.SearchStrategy[TokenInputs]:
        o = ctx.options
        drawn = batches(
            max_batch=o.max_batch, max_length=o.max_length, dtype=ctx.tolerance.input_dtype,
            advantage_shape="token", with_ref_logprobs=False, with_rollout_logprobs=False,
            with_rewards=False, padding="nan" if o.padding_nan else "garbage",
        )  # fmt: skip
        return mapped(drawn, lambda b: _inputs(b.as_kwargs()))

    def corpus(self, ctx: Any) -> dict[str, TokenInputs]:
        found = canonical_corpus(dtype=ctx.tolerance.input_dtype, advantages="token")
        return {name: _inputs(batch, name) for name, batch in found.items()}

    def diagnose(self, ctx: Any, inputs: Any) -> Diagnosis:
        return _diagnose(ctx, self.corpus(ctx), inputs)

    def snippet(self, ctx: Any, inputs: Any, check: KindCheck) -> str:
        return aggregation_snippet(ctx, inputs, check)

    def golden(self, ctx: Any) -> Tolerant:
        data: dict[str, dict[str, torch.Tensor]] = {}
        scales: dict[str, EntryScale] = {}
        for name, inp in self.corpus(ctx).items():
            try:
                ev = _call(ctx, inp.tensors, f"canonical input {name!r}")
            except Verdict as exc:
                raise Verdict(f"on canonical input {name!r}: {exc}") from exc
            e = _expected(ctx.ref, inp.tensors)
            data[name] = {"loss": ev.value, "grad": ev.grad}
            own = float(ev.value.abs()) if bool(torch.isfinite(ev.value)) else 0.0
            scales[f"{name}/loss"] = EntryScale(max(e.value_scale, own), count=e.n)
            g = ev.grad.abs().to(torch.float64)
            scales[f"{name}/grad"] = EntryScale(torch.maximum(e.grad_scale, g + g.max()))
        return Tolerant(
            data,
            tolerance=ctx.tolerance,
            scales=scales,
            corpus=corpus_version(ctx.tolerance.input_dtype),
        )


def _candidates(ref: AggregationRef) -> list[tuple[AggregationRef, bool]]:
    """Every mode; token-sum-norm with the reference's budget and with the padded width."""
    out: list[tuple[AggregationRef, bool]] = [(ref, False)]
    for mode in Aggregation:
        if mode is Aggregation.TOKEN_SUM_NORM:
            if ref.budget is not None and ref.mode is not mode:
                out.append((AggregationRef(mode, ref.budget), False))
            out.append((AggregationRef(mode, 1), True))
        elif mode is not ref.mode:
            out.append((AggregationRef(mode), False))
    return out


def _describe(cand: AggregationRef, padded: bool) -> str:
    text = (
        "token-sum-norm dividing by the padded width T (a batch-dependent budget; also "
        "a plain mean over the padded [B, T] entries)"
        if padded
        else cand.describe()
    )
    names = [n for n, s in ALGORITHMS.items()
             if s.loss.aggregation is cand.mode and (padded or s.loss.budget == cand.budget)
             and not padded]  # fmt: skip
    return text + (f" ({', '.join(names)})" if names else "")


def _diagnose(ctx: AggContext, corpus: Mapping[str, TokenInputs], failing: Any) -> Diagnosis:
    cases = dict(corpus)
    if failing is not None:
        cases["failing input"] = failing
    cands = _candidates(ctx.ref)
    errors = [0.0] * len(cands)
    for label, inp in cases.items():
        try:
            ev = _call(ctx, inp.tensors, f"input {label!r}")
        except Verdict as exc:
            return Diagnosis(f"no diagnosis: {exc}", "")
        mask = inp.tensors["response_mask"]
        for i, (cand, padded) in enumerate(cands):
            e = _expected(cand, inp.tensors, budget=mask.shape[1] if padded else None)
            v = ctx.tolerance.value(float(ev.value), e.value, e.value_scale, e.n).error
            g = ctx.tolerance.tensor(ev.grad, e.weights, e.grad_scale, mask)[0].error
            errors[i] = max(errors[i], v, g)
    best = min(range(len(cands)), key=lambda i: errors[i])
    reference = ctx.ref.describe()
    text = _describe(*cands[best])
    if errors[best] > 1.0:
        return Diagnosis(f"no aggregation mode matches (closest: {text}, {errors[best]:.3g}x the "
                         f"tolerance); the reference is {reference}", "")  # fmt: skip
    if best == 0:
        return Diagnosis(f"this function matches the reference {reference}", reference)
    return Diagnosis(f"this function matches {text} on the corpus (within tolerance); the "
                     f"reference is {reference}", text.split(" (")[0])  # fmt: skip


# --------------------------------------------------------------------------- snippet


def aggregation_snippet(ctx: AggContext, inputs: TokenInputs, check: KindCheck) -> str:
    """Standalone Python: the function called as ``check`` called it, the reference
    ``sum(w * x)`` and its gradient ``w`` in float64, and what the check compared."""
    ref = ctx.ref
    where = importable(ctx.fn, ctx.name)
    mask = "inputs['response_mask']"
    definitions = [
        "",
        "",
        *snippet_helper(ctx.options),
        "",
        "",
        f"MODE, BUDGET = {ref.mode.value!r}, {ref.budget!r}",
        "",
        "",
        f"def run(inputs, grad={check.name != 'inputs-unchanged'}):",
        '    """Call the function as the check did; its gradient w.r.t. the values."""',
        "    x = inputs['x'].detach().clone().requires_grad_(True)",
        f"    kw = {{{ctx.value_name!r}: x, {ctx.mask_name!r}: inputs['response_mask'].clone()}}",
        "    before = {k: v.detach().clone() for k, v in kw.items()}",
        f"    out = {snippet_call(ctx.options, where.call, mask=mask)}",
        pick_line(ctx.options.loss, "loss"),
        "    g = torch.autograd.grad(out, x)[0] if grad else None",
        "    return out.detach(), g, kw, before",
        "",
        "",
        "def reference(inputs, out):",
        f'    """The float64 reference: {ref.describe()}, sum(w * x); its gradient is w."""',
        "    mask = inputs['response_mask']",
        "    x = torch.where(mask, inputs['x'].double(), 0.0)",
        "    w = token_weights(mask, MODE, budget=BUDGET)",
        "    return aggregate(x, response_mask=mask, mode=MODE, budget=BUDGET), w",
    ]
    fill = "float('nan')" if ctx.options.padding_nan else "-7.5"
    if check.name == "padding-values":
        other = [
            f"other = {{**inputs, 'x': torch.where(inputs['response_mask'], inputs['x'], {fill})}}",
        ]
        lines = check_lines("same", other=other, what="other values at padding")
    elif check.name == "padding-columns":
        other = [
            "extra = inputs['response_mask'].shape[1] + 3",
            "rows = inputs['x'].shape[0]",
            "other = {'x': torch.cat([inputs['x'], torch.full((rows, extra), -7.0, "
            "dtype=inputs['x'].dtype)], 1),",
            "         'response_mask': torch.cat([inputs['response_mask'], "
            "torch.zeros(rows, extra, dtype=torch.bool)], 1)}",
        ]
        lines = check_lines("same", other=other, what="T + 3 padding columns appended")
    else:
        modes = {"masked-positions": "masked"}
        lines = check_lines(modes.get(check.name, check.name))
    return kind_snippet(
        where,
        imports=["from polgrad_reference import aggregate, token_weights"],
        inputs=inputs.to_snippet(),
        definitions=definitions,
        check=lines,
    )


KIND = AggregationKind()
