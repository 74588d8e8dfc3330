"""The KL kind: (logprobs, ref_logprobs[, response_mask, old_logprobs]) -> KL penalty.

Convention: the function returns the per-token penalty ``[B, T]`` (compared at response
positions) or the aggregated scalar (compared with the reference aggregation). Parameter
names follow the frameworks: ``logprobs``/``logprob``/``log_probs``,
``ref_logprobs``/``ref_logprob``/``ref_log_probs``, an optional mask
(``response_mask``/``mask``/``loss_mask``) and, for ratio-weighted estimators,
``old_logprobs``. The reference is :func:`polgrad_reference.kl_estimate` with the
marker's ``KLConfig`` (estimator, ratio weighting) and an optional value clamp
(verl 0.9.1 ``kl_penalty`` clamps k3 to [-10, 10]). Placed in the loss, the *gradient*
with respect to ``logprobs`` is checked too: a k3-as-loss gradient is not the gradient of
``KL(pi || ref)`` (Schulman 2020; arXiv:2512.21852, arXiv:2510.01555; ``docs/kl.md``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from hypothesis import strategies as st

from polgrad_reference import (
    ALGORITHMS,
    Aggregation,
    KLConfig,
    KLEstimator,
    KLPlacement,
    KLRatioWeight,
    get_algorithm,
    token_weights,
)
from polgrad_reference.kl import k_values, ratio_weighted
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
    tolerance_for,
)
from pytest_polgrad.strategies import batches
from pytest_polgrad.strategies._sample import mapped

__all__ = ["KIND", "KLKind", "KLRef"]

_NAMES = {
    "logprobs": ("logprobs", "logprob", "log_probs", "log_prob"),
    "ref_logprobs": ("ref_logprobs", "ref_logprob", "ref_log_probs", "ref_log_prob"),
    "response_mask": ("response_mask", "mask", "loss_mask", "completion_mask"),
    "old_logprobs": ("old_logprobs", "old_logprob", "old_log_probs", "old_log_prob"),
}
_OVERRIDES = frozenset(
    {"estimator", "placement", "clamp", "ratio_weight", "ratio_cap", "aggregation", "budget"}
)


@dataclasses.dataclass(frozen=True)
class KLRef:
    """The reference penalty: a ``KLConfig``, an optional value clamp ``[-clamp, clamp]``,
    and the aggregation a scalar result is compared with."""

    kl: KLConfig
    clamp: float | None = None
    mode: Aggregation = Aggregation.TOKEN_MEAN
    budget: int | None = None

    def describe(self) -> str:
        k = self.kl
        parts = [k.estimator.value]
        if k.ratio_weight is not KLRatioWeight.NONE:
            cap = f" capped at {k.ratio_cap:g}" if k.ratio_cap else ""
            parts.append(f"ratio-weighted ({k.ratio_weight.value}{cap})")
        parts.append(f"clamped to +-{self.clamp:g}" if self.clamp else "no clamp")
        parts.append(f"in the {k.placement.value}")
        return ", ".join(parts)


Formula = Callable[[torch.Tensor], torch.Tensor]
"""Per-token penalty from ``lr = ref_logprobs - logprobs`` (padding-zeroed)."""


@dataclasses.dataclass
class KLContext(TokenContext):
    names: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Canonical tensor name -> the function's parameter name."""

    @property
    def ref(self) -> KLRef:
        assert isinstance(self.config, KLRef)
        return self.config


@dataclasses.dataclass(frozen=True)
class _Eval:
    out: torch.Tensor
    """The returned penalty (``[B, T]`` or scalar), detached."""
    grad: torch.Tensor
    """``d <out, v> / d logprobs`` (per-token ``v``: the aggregation weights) or d out."""


def _weights(ref: KLRef, mask: torch.Tensor) -> torch.Tensor:
    return token_weights(mask, ref.mode, budget=ref.budget)


def _call(
    ctx: KLContext, inputs: Mapping[str, torch.Tensor], what: str, grad: bool = True
) -> _Eval:
    mask = inputs["response_mask"]
    lp = inputs["logprobs"].detach().clone().requires_grad_(grad)
    kwargs: dict[str, Any] = {}
    for canon, param in ctx.names.items():
        kwargs[param] = lp if canon == "logprobs" else inputs[canon].detach().clone()
    out = _pick_loss(call_in_layout(ctx.options, ctx.fn, kwargs, mask, what), ctx.options.loss)
    if not isinstance(out, torch.Tensor) or not out.is_floating_point():
        raise Verdict(f"{what}: the function returned {type(out).__name__}, not a float tensor")
    if tuple(out.shape) != tuple(mask.shape):
        if out.numel() != 1:
            raise Verdict(f"{what}: the function returned shape {list(out.shape)}; expected the "
                          f"per-token penalty {list(mask.shape)} or a scalar")  # fmt: skip
        out = out.reshape(())
    g = torch.zeros(mask.shape, dtype=torch.float64)
    if grad:
        if not out.requires_grad:
            raise Verdict(f"{what}: the penalty is not differentiable in logprobs (placed in "
                          "the loss, its gradient is what trains the policy)")  # fmt: skip
        v = _weights(ctx.ref, mask).to(out.dtype)
        target = out if out.dim() == 0 else (torch.where(mask, out, 0.0) * v).sum()
        with charged():  # the backward through the function's result is its own
            (gg,) = torch.autograd.grad(target, lp, allow_unused=True)
        if gg is None:
            raise Verdict(f"{what}: the penalty does not depend on logprobs")
        g = gg.detach().to(torch.float64)
    return _Eval(out.detach(), g)


@dataclasses.dataclass(frozen=True)
class _Expected:
    per_token: torch.Tensor
    value: torch.Tensor
    """Per-token penalty, or the aggregate when the function returned a scalar."""
    grad: torch.Tensor
    value_scale: torch.Tensor
    grad_scale: torch.Tensor
    n: int


def _ref_formula(ref: KLRef) -> Formula:
    est, clamp = ref.kl.estimator, ref.clamp

    def formula(lr: torch.Tensor) -> torch.Tensor:
        if clamp is None:
            return k_values(est, lr)
        if est.straight_through and est.base is not KLEstimator.K2:
            # the clamp bounds the reported value; the gradient stays k2's, unclamped
            # (verl 0.9.1 core_algos.kl_penalty: forward score clamped, then straight-through)
            value = k_values(est.base, lr).clamp(-clamp, clamp)
            k2 = 0.5 * (lr * lr)
            return k2 - k2.detach() + value.detach()
        return k_values(est, lr).clamp(-clamp, clamp)

    return formula


_UNIT_SLOPE = (KLEstimator.K1, KLEstimator.ABS, KLEstimator.K1_PLUS, KLEstimator.ABS_PLUS)


def _sensitivity(est: KLEstimator, lr: torch.Tensor) -> torch.Tensor:
    """How much an error ``d`` in ``lr`` (``|d| <= cond u`` from rounded inputs) moves the
    penalty and its gradient, per unit of ``d``: 1 for k1 and abs (slope +-1; their ``+``
    variants' gradient is k2's, ``lr``, also of slope 1); ``e^lr + 1 + |lr|`` for k2 and k3
    (k3' = ``e^lr - 1``, k2' = ``lr``). A k1 bound of ``|lr|`` would hide a clamp of ``lr``
    at +-10 from bfloat16 inputs (``|lr| = 25``: 15 off, within ``26 |lr| u K``)."""
    if est in _UNIT_SLOPE:
        return torch.ones_like(lr)
    return lr.exp() + 1.0 + lr.abs()


def _expected(
    ref: KLRef, formula: Formula, inputs: Mapping[str, torch.Tensor], scalar: bool
) -> _Expected:
    mask = inputs["response_mask"]
    x = {k: torch.where(mask, t.detach().to(torch.float64), 0.0)
         for k, t in inputs.items() if k != "response_mask"}  # fmt: skip
    lp = x["logprobs"].clone().requires_grad_(True)
    lr = torch.where(mask, x["ref_logprobs"] - lp, 0.0)
    k = formula(lr)
    rw = ref.kl.ratio_weight
    ratio = torch.ones_like(lp)
    if rw is not KLRatioWeight.NONE:
        ratio = torch.exp(torch.where(mask, lp - x["old_logprobs"], 0.0))
        k = ratio_weighted(k, ratio, rw, ref.kl.ratio_cap)
    k = torch.where(mask, k, 0.0)
    w = _weights(ref, mask)
    (g,) = torch.autograd.grad((k * w).sum(), lp)
    cond = 1.0 + x["logprobs"].abs() + x["ref_logprobs"].abs()
    lrd = lr.detach()
    spread = _sensitivity(ref.kl.estimator, lrd) * cond * ratio.detach()
    if rw is not KLRatioWeight.NONE:
        spread = spread * (1.0 + x["old_logprobs"].abs() + x["logprobs"].abs())
    tok_scale = torch.where(mask, k.detach().abs() + spread, 0.0)
    value = (k.detach() * w).sum() if scalar else k.detach()
    vscale = (tok_scale * w.abs()).sum() if scalar else tok_scale
    gscale = (g.abs() + w.abs() * spread).detach()
    return _Expected(k.detach(), value, g.detach(), vscale, gscale, int(mask.sum()))


def _applies_gradient(ref: KLRef) -> bool:
    return ref.kl.placement is KLPlacement.LOSS


def check_value(ctx: KLContext, inputs: Mapping[str, torch.Tensor]) -> float:
    ev = _call(ctx, inputs, "a valid input", grad=False)
    scalar = ev.out.dim() == 0
    e = _expected(ctx.ref, _ref_formula(ctx.ref), inputs, scalar)
    if scalar:
        return compare_value(ctx, float(ev.out), float(e.value), float(e.value_scale), e.n,
                             f"aggregated KL ({ctx.ref.mode.value})")  # fmt: skip
    return compare_tensor(ctx, ev.out, e.value, e.value_scale, inputs["response_mask"],
                          "per-token KL penalty")  # fmt: skip


def check_gradient(ctx: KLContext, inputs: Mapping[str, torch.Tensor]) -> float:
    ev = _call(ctx, inputs, "a valid input")
    e = _expected(ctx.ref, _ref_formula(ctx.ref), inputs, ev.out.dim() == 0)
    return compare_tensor(ctx, ev.grad, e.grad, e.grad_scale, inputs["response_mask"],
                          f"d KL ({ctx.ref.mode.value}) / d logprobs")  # fmt: skip


def check_masked_positions(ctx: KLContext, inputs: Mapping[str, torch.Tensor]) -> float:
    ev = _call(ctx, inputs, "a valid input", grad=_applies_gradient(ctx.ref))
    pad = ~inputs["response_mask"]
    bad = pad & (ev.grad != 0)
    if bool(bad.any()):
        pos = [tuple(p) for p in bad.nonzero()[:4].tolist()]
        raise CheckFailure(
            f"the gradient is not exactly zero at {int(bad.sum())} padding position(s)",
            entries=[(p, 0.0, float(ev.grad[p])) for p in pos],
        )
    return 0.0


def check_padding_values(ctx: KLContext, inputs: Mapping[str, torch.Tensor]) -> float:
    mask = inputs["response_mask"]
    a = _call(ctx, inputs, "a valid input", grad=_applies_gradient(ctx.ref))
    fill = float("nan") if ctx.options.padding_nan else -9.25
    other = {k: (torch.where(mask, t, torch.full_like(t, fill)) if t.is_floating_point() else t)
             for k, t in inputs.items()}  # fmt: skip
    b = _call(ctx, other, "the input with other values at padding", grad=_applies_gradient(ctx.ref))
    e = _expected(ctx.ref, _ref_formula(ctx.ref), inputs, a.out.dim() == 0)
    what = " when only the values at padding change"
    if a.out.dim() == 0:
        err = compare_value(ctx, float(b.out), float(a.out), float(e.value_scale), e.n,
                            "aggregated KL", what)  # fmt: skip
    else:
        err = compare_tensor(ctx, b.out, a.out.to(torch.float64), e.value_scale, mask,
                             "per-token KL penalty", what)  # fmt: skip
    return max(err, compare_tensor(ctx, b.grad, a.grad, e.grad_scale, mask, "gradient", what))


def check_inputs_unchanged(ctx: KLContext, inputs: Mapping[str, torch.Tensor]) -> float:
    kwargs = {p: inputs[c].detach().clone() for c, p in ctx.names.items()}
    before = {p: t.clone() for p, t in kwargs.items()}
    call_in_layout(ctx.options, ctx.fn, kwargs, inputs["response_mask"], "a valid input")
    for p, t in kwargs.items():
        if not bool(bitwise_equal(before[p], t.detach()).all()):
            raise CheckFailure(f"the function modified its input {p} in place")
    return 0.0


def check_deterministic(ctx: KLContext, inputs: Mapping[str, torch.Tensor]) -> float:
    grad = _applies_gradient(ctx.ref)
    a, b = _call(ctx, inputs, "a valid input", grad), _call(ctx, inputs, "the same input", grad)
    if not bool(bitwise_equal(a.out, b.out).all()) or not bool(bitwise_equal(a.grad, b.grad).all()):
        raise CheckFailure("two calls on the same input give different results")
    return 0.0


_CHECKS = (
    KindCheck("value", "the penalty equals the reference estimator (per token, or aggregated)",
              check_value),
    KindCheck("gradient", "d penalty / d logprobs equals the reference estimator's (placed in "
              "the loss only)", check_gradient),
    KindCheck("masked-positions", "the gradient is exactly zero at padding",
              check_masked_positions, semantic=False),
    KindCheck("padding-values", "the penalty at response positions does not depend on the "
              "values at padding", check_padding_values, semantic=False),
    KindCheck("inputs-unchanged", "no input is modified in place", check_inputs_unchanged,
              semantic=False),
    KindCheck("deterministic", "two calls agree bitwise", check_deterministic, semantic=False),
)  # fmt: skip


_WIDE = (-40.0, -30.0, -22.0, -20.5, -15.0, -11.0, -10.5, -4.0, -1.0, 0.5, 2.0, 9.0, 10.5,
         11.0, 15.0, 20.5, 22.0, 25.0)  # fmt: skip
"""The corpus batch ``large-log-ratios``' ``ref_logprobs - logprobs`` (its 18 response
tokens in order): past +-10 and +-20 on both sides; -40, where ``exp`` underflows
harmlessly, so that a clamp at +-20 moves the value by 20 and shows from bfloat16 inputs."""
_WIDE_FLOAT16 = (-40.0, -30.0, -22.0, -20.5, -15.0, -11.0, -10.5, -4.0, -1.0, 0.5, 2.0, 3.0,
                 4.0, 5.0, 6.0, 7.0, 8.0, 9.0)  # fmt: skip
"""``_WIDE`` for float16 inputs: the positive side stops at 9, ``e^9 - 10 ~ 8093``."""


def _inputs(batch: Mapping[str, torch.Tensor], label: str = "") -> TokenInputs:
    keep = ("logprobs", "ref_logprobs", "old_logprobs", "response_mask")
    return TokenInputs({k: batch[k] for k in keep}, label)


class KLKind(Kind):
    """See the module docstring."""

    name = "kl"
    summary = "(logprobs, ref_logprobs, response_mask) -> per-token KL penalty [B, T] or scalar"
    override_keys = _OVERRIDES

    def resolve(self, options: ConformanceOptions) -> KLRef:
        check_layout(self.name, options, _OVERRIDES)
        ref, o = options.reference, dict(options.overrides)
        estimators = [e.value for e in KLEstimator]
        mode, budget = Aggregation.TOKEN_MEAN, None
        if isinstance(ref, KLConfig):
            kl: KLConfig | None = ref
        elif isinstance(ref, str) and ref in ALGORITHMS:
            loss = get_algorithm(ref).loss
            kl, mode, budget = loss.kl, loss.aggregation, loss.budget
            if kl is not None and kl.aggregation is not None:
                mode = kl.aggregation
            if kl is None and "estimator" not in o:
                raise MarkerError(f"registry entry {ref!r} has no KL term; name one with "
                                  f"estimator=<{'|'.join(estimators)}>")  # fmt: skip
        elif isinstance(ref, str) and ref in estimators:
            kl = KLConfig(estimator=KLEstimator(ref))
        else:
            raise MarkerError(
                f"the kl kind's reference must be a registry name, an estimator "
                f"({', '.join(estimators)}) or a KLConfig, got {ref!r}"
                + did_you_mean(str(ref), [*ALGORITHMS, *estimators])
            )
        fields = {
            k: o[k] for k in ("estimator", "placement", "ratio_weight", "ratio_cap") if k in o
        }
        try:
            kl = (kl or KLConfig()).replace(**fields)
            if "aggregation" in o:
                mode = Aggregation(o["aggregation"])
        except ValueError as exc:
            raise MarkerError(str(exc)) from exc
        budget = o.get("budget", budget) if mode is Aggregation.TOKEN_SUM_NORM else None
        if mode is Aggregation.TOKEN_SUM_NORM and not isinstance(budget, int):
            raise MarkerError("aggregation='token-sum-norm' needs budget=<positive int>")
        clamp = o.get("clamp")
        if clamp is not None and (isinstance(clamp, bool) or not isinstance(clamp, (int, float))
                                  or not math.isfinite(clamp) or clamp <= 0):  # fmt: skip
            raise MarkerError(f"clamp must be a positive number or None, got {clamp!r}")
        return KLRef(kl, None if clamp is None else float(clamp), mode, budget)

    def checks(self, config: Any, options: ConformanceOptions) -> list[KindCheck]:
        out = [c for c in _CHECKS if c.name != "gradient" or _applies_gradient(config)]
        out = for_layout(out, options)
        return [c for c in out if options.checks is None or c.name in options.checks]

    def context(
        self, fn: Callable[..., Any], name: str, config: Any, options: ConformanceOptions
    ) -> KLContext:
        takes = parameters(fn, [n for names in _NAMES.values() for n in names])
        names = {}
        for canon, spellings in _NAMES.items():
            found = next((s for s in spellings if s in takes), None)
            if found is not None:
                names[canon] = found
        if "logprobs" not in names or "ref_logprobs" not in names:
            raise Verdict(f"{name!r} must take logprobs and ref_logprobs (accepted spellings: "
                          f"{_NAMES['logprobs']} and {_NAMES['ref_logprobs']})")  # fmt: skip
        if config.kl.ratio_weight is not KLRatioWeight.NONE and "old_logprobs" not in names:
            raise Verdict(f"{name!r} takes no old_logprobs, but the reference KL is "
                          "ratio-weighted and needs the policy ratio")  # fmt: skip
        return KLContext(fn=fn, name=name, options=options, config=config,
                         tolerance=tolerance_for(options), takes=takes, names=names)  # fmt: skip

    def pool_key(self, ctx: Any, check: KindCheck) -> tuple[object, ...]:
        o = ctx.options
        return (o.dtype, o.max_batch, o.max_length, o.padding_nan)

    def strategy(self, ctx: Any, check: KindCheck) -> st.SearchStrategy[TokenInputs]:
        o = ctx.options
        drawn = batches(
            max_batch=o.max_batch, max_length=o.max_length, dtype=ctx.tolerance.input_dtype,
            with_ref_logprobs=True, with_rollout_logprobs=False, with_rewards=False,
            padding="nan" if o.padding_nan else "garbage",
        )  # fmt: skip
        return mapped(drawn, lambda b: _inputs(b.as_kwargs()))

    def corpus(self, ctx: Any) -> dict[str, TokenInputs]:
        found = canonical_corpus(dtype=ctx.tolerance.input_dtype)
        out = {name: _inputs(batch, name) for name, batch in found.items()}
        base = found["ragged"]
        mask = base["response_mask"]
        # log-ratios past every clamp a framework ships and twice that (OpenRLHF 0.11.2
        # compute_approx_kl clamps the log-ratio to +-10, verl 0.9.1 low_var_kl the value to
        # +-10 and the log-ratio to +-20): -40 .. 25, each side past 10 and past 20, so a k1,
        # abs, k2 or k3 clamped at +-10 or +-20 differs on this batch at every budget; in
        # float16 the positive side stops at 9 (k3(9) = e^9 - 10 ~ 8093 stays finite), the
        # negative side, where exp underflows harmlessly, still reaches -40
        wide = torch.tensor(_WIDE_FLOAT16 if base["logprobs"].dtype == torch.float16 else _WIDE,
                            dtype=torch.float64)[: int(mask.sum())]  # fmt: skip
        ref = base["logprobs"].to(torch.float64).clone()
        ref[mask] = ref[mask] + wide
        big = {**base, "ref_logprobs": ref.to(base["logprobs"].dtype)}
        out["large-log-ratios"] = _inputs(big, "large-log-ratios")
        return out

    def diagnose(self, ctx: Any, inputs: Any) -> Diagnosis:
        return _diagnose(ctx, self.corpus(ctx), inputs)

    def snippet(self, ctx: Any, inputs: Any, check: KindCheck) -> str:
        return kl_snippet(ctx, inputs, check)

    def golden(self, ctx: Any) -> Tolerant:
        data: dict[str, dict[str, torch.Tensor]] = {}
        scales: dict[str, EntryScale] = {}
        grad = _applies_gradient(ctx.ref)
        for name, inp in self.corpus(ctx).items():
            try:
                ev = _call(ctx, inp.tensors, f"canonical input {name!r}", grad=grad)
            except Verdict as exc:
                raise Verdict(f"on canonical input {name!r}: {exc}") from exc
            e = _expected(ctx.ref, _ref_formula(ctx.ref), inp.tensors, ev.out.dim() == 0)
            mask = inp.tensors["response_mask"]
            out = ev.out if ev.out.dim() == 0 else torch.where(mask, ev.out, 0.0)
            data[name] = {"kl": out, "grad": ev.grad}
            own = torch.nan_to_num(out.to(torch.float64)).abs()
            if out.dim() == 0:
                scales[f"{name}/kl"] = EntryScale(max(float(e.value_scale), float(own)), count=e.n)
            else:
                scales[f"{name}/kl"] = EntryScale(torch.maximum(e.value_scale, own + own.max()))
            scales[f"{name}/grad"] = EntryScale(torch.maximum(e.grad_scale, ev.grad.abs()))
        return Tolerant(
            data,
            tolerance=ctx.tolerance,
            scales=scales,
            corpus=corpus_version(ctx.tolerance.input_dtype),
        )


# ------------------------------------------------------------------------- diagnosis


def _wrong() -> list[tuple[str, Formula]]:
    """Realistic wrong estimators (``lr = ref_logprobs - logprobs``)."""
    return [
        ("k3 with the sign of the log-ratio flipped (exp(logprobs - ref) - 1 - (logprobs - ref))",
         lambda lr: torch.expm1(-lr) + lr),
        ("k2 without the 1/2 ((logprobs - ref)^2)", lambda lr: lr * lr),
        ("k1 in the wrong direction (ref - logprobs)", lambda lr: lr),
    ]  # fmt: skip


def _candidates(ref: KLRef, ratio: bool) -> list[tuple[str, KLRef, Formula]]:
    out: list[tuple[str, KLRef, Formula]] = [(ref.describe(), ref, _ref_formula(ref))]
    weights = list(KLRatioWeight) if ratio else [KLRatioWeight.NONE]
    for est in KLEstimator:
        for clamp in dict.fromkeys([ref.clamp, None, 10.0, 20.0]):
            for rw in weights:
                try:
                    kl = ref.kl.replace(estimator=est, ratio_weight=rw,
                                        ratio_cap=ref.kl.ratio_cap if rw is not KLRatioWeight.NONE
                                        else None)  # fmt: skip
                except ValueError:
                    continue
                cand = dataclasses.replace(ref, kl=kl, clamp=clamp)
                if cand != ref:
                    out.append((cand.describe(), cand, _ref_formula(cand)))
    plain = dataclasses.replace(ref, kl=ref.kl.replace(ratio_weight=KLRatioWeight.NONE,
                                                       ratio_cap=None), clamp=None)  # fmt: skip
    out += [(text, plain, f) for text, f in _wrong()]
    return out


def _diagnose(ctx: KLContext, corpus: Mapping[str, TokenInputs], failing: Any) -> Diagnosis:
    cases = dict(corpus)
    if failing is not None:
        cases["failing input"] = failing
    grad = _applies_gradient(ctx.ref)
    cands = _candidates(ctx.ref, "old_logprobs" in ctx.names)
    value_err = [0.0] * len(cands)
    grad_err = [0.0] * len(cands)
    for label, inp in cases.items():
        try:
            ev = _call(ctx, inp.tensors, f"input {label!r}", grad=grad)
        except Verdict as exc:
            return Diagnosis(f"no diagnosis: {exc}", "")
        mask = inp.tensors["response_mask"]
        scalar = ev.out.dim() == 0
        for i, (_, cand, formula) in enumerate(cands):
            try:
                e = _expected(cand, formula, inp.tensors, scalar)
            except ValueError:
                value_err[i] = grad_err[i] = math.inf
                continue
            if scalar:
                v = ctx.tolerance.value(float(ev.out), float(e.value), float(e.value_scale), e.n)
            else:
                v = ctx.tolerance.tensor(ev.out, e.value, e.value_scale, mask)[0]
            value_err[i] = max(value_err[i], v.error)
            if grad:
                g = ctx.tolerance.tensor(ev.grad, e.grad, e.grad_scale, mask)[0]
                grad_err[i] = max(grad_err[i], g.error)
    total = [max(a, b) for a, b in zip(value_err, grad_err, strict=True)]
    best = min(range(len(cands)), key=lambda i: total[i])
    reference = ctx.ref.describe()
    text, cand, _ = cands[best]
    if total[best] > 1.0:
        by_value = min(range(len(cands)), key=lambda i: value_err[i])
        if grad and value_err[by_value] <= 1.0:
            msg = (f"the penalty's value matches {cands[by_value][0]}, but its gradient matches "
                   "no candidate (a stop-gradient or straight-through difference)")  # fmt: skip
        else:
            msg = f"no KL estimator matches (closest: {text}, {total[best]:.3g}x the tolerance)"
        return Diagnosis(f"{msg}; the reference is {reference}", "")
    if best == 0:
        body = f"this function matches the reference: {reference}"
    else:
        body = (
            f"this function matches {text} on the corpus (within tolerance); "
            f"the reference is {reference}"
        )
    # a _wrong() formula carries the reference's KLConfig but computes another function: the
    # note holds for k3 itself only (a flipped k3's gradient is not the forward KL's)
    k3 = cand.kl.estimator is KLEstimator.K3 and text == cand.describe()
    if grad and k3 and cand.kl.ratio_weight is KLRatioWeight.NONE:
        body += (
            ". Note: differentiated as a loss, k3's gradient is not the gradient of "
            "KL(pi || ref): in expectation it is the gradient of the forward KL(ref || pi) "
            "(docs/kl.md); k2 or 'k3+' give the reverse-KL score-function gradient"
        )
    return Diagnosis(body, text)


# --------------------------------------------------------------------------- snippet


def _formula_lines(ref: KLRef) -> list[str]:
    """``k = ...``: the reference per-token penalty from ``lr`` (see :func:`_ref_formula`)."""
    est, clamp = ref.kl.estimator, ref.clamp
    if clamp is None:
        return [f"    k = k_values(KLEstimator({est.value!r}), lr)"]
    if est.straight_through and est.base is not KLEstimator.K2:
        return [
            f"    value = k_values(KLEstimator({est.base.value!r}), lr).clamp({-clamp!r}, "
            f"{clamp!r})",
            "    k2 = 0.5 * (lr * lr)  # the clamp bounds the value; the gradient stays k2's",
            "    k = k2 - k2.detach() + value.detach()",
        ]
    return [f"    k = k_values(KLEstimator({est.value!r}), lr).clamp({-clamp!r}, {clamp!r})"]


def kl_snippet(ctx: KLContext, inputs: TokenInputs, check: KindCheck) -> str:
    """Standalone Python: the function called as ``check`` called it, the reference
    estimator in float64, and what the check compared."""
    ref = ctx.ref
    where = importable(ctx.fn, ctx.name)
    grad = {"value": False, "gradient": True, "inputs-unchanged": False}.get(
        check.name, _applies_gradient(ref)
    )
    ratio = []
    if ref.kl.ratio_weight is not KLRatioWeight.NONE:
        ratio = [
            "    ratio = torch.exp(torch.where(mask, lp - x['old_logprobs'], 0.0))",
            f"    k = ratio_weighted(k, ratio, KLRatioWeight({ref.kl.ratio_weight.value!r}), "
            f"{ref.kl.ratio_cap!r})",
        ]
    definitions = [
        "",
        "",
        *snippet_helper(ctx.options),
        "",
        "",
        f"PARAMS = {dict(ctx.names)!r}  # input -> the function's parameter",
        f"MODE, BUDGET = {ref.mode.value!r}, {ref.budget!r}  # a scalar result's aggregation",
        "",
        "",
        f"def run(inputs, grad={grad}):",
        '    """Call the function as the check did; its gradient: of the result (a scalar) or',
        '    of the per-token penalty summed with the aggregation weights."""',
        "    mask = inputs['response_mask']",
        "    lp = inputs['logprobs'].detach().clone().requires_grad_(grad)",
        "    kw = {param: lp if name == 'logprobs' else inputs[name].detach().clone()",
        "          for name, param in PARAMS.items()}",
        "    before = {k: v.detach().clone() for k, v in kw.items()}",
        f"    out = {snippet_call(ctx.options, where.call)}",
        pick_line(ctx.options.loss, "loss"),
        "    if tuple(out.shape) != tuple(mask.shape):",
        "        out = out.reshape(())",
        "    g = None",
        "    if grad:",
        "        v = token_weights(mask, MODE, budget=BUDGET).to(out.dtype)",
        "        target = out if out.dim() == 0 else (torch.where(mask, out, 0.0) * v).sum()",
        "        (g,) = torch.autograd.grad(target, lp)",
        "        g = g.double()",
        "    return out.detach(), g, kw, before",
        "",
        "",
        "def reference(inputs, out):",
        f'    """The float64 reference: {ref.describe()}; aggregated like a scalar result."""',
        "    mask = inputs['response_mask']",
        "    x = {k: torch.where(mask, t.double(), 0.0) for k, t in inputs.items()",
        "         if k != 'response_mask'}",
        "    lp = x['logprobs'].clone().requires_grad_(True)",
        "    lr = torch.where(mask, x['ref_logprobs'] - lp, 0.0)",
        *_formula_lines(ref),
        *ratio,
        "    k = torch.where(mask, k, 0.0)",
        "    w = token_weights(mask, MODE, budget=BUDGET)",
        "    (g,) = torch.autograd.grad((k * w).sum(), lp)",
        "    return ((k.detach() * w).sum() if out.dim() == 0 else k.detach()), g",
    ]
    fill = "float('nan')" if ctx.options.padding_nan else "-9.25"
    modes = {"value": "value", "gradient": "gradient", "masked-positions": "masked"}
    if check.name == "padding-values":
        other = [
            "other = {k: torch.where(inputs['response_mask'], t, torch.full_like(t, "
            f"{fill})) if t.is_floating_point() else t for k, t in inputs.items()}}",
        ]
        lines = check_lines("same", other=other, grads=grad, what="other values at padding")
    else:
        lines = check_lines(modes.get(check.name, check.name))
    return kind_snippet(
        where,
        imports=[
            "from polgrad_reference import token_weights",
            "from polgrad_reference.kl import KLEstimator, KLRatioWeight, k_values, ratio_weighted",
        ],
        inputs=inputs.to_snippet(),
        definitions=definitions,
        check=lines,
    )


KIND = KLKind()
