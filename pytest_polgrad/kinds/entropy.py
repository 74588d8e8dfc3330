"""The entropy kind: ``entropy(logits [B, T, V], response_mask [B, T]) -> [B, T]`` per-token
entropies, or the aggregated entropy bonus (a scalar), compared (value and gradient
w.r.t. ``logits``) with the exact softmax entropy of ``polgrad_reference.entropy`` in
float64.

The shape of the result says which: ``[B, T]`` is compared at response positions, a scalar
against ``aggregate(H, response_mask, mode)`` (token-mean by default, as verl 0.9.1
``compute_entropy_loss``). ``negate=True`` declares an entropy *loss* ``-H`` (what a
trainer adds to its loss); ``aggregation=``/``budget=`` pick the aggregation.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from polgrad_reference import Aggregation, PolgradError, token_weights
from polgrad_reference.entropy import token_entropy
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
    unknown_overrides,
    worst_entries,
)
from pytest_polgrad.strategies import LogitBatch, logit_batches

__all__ = [
    "CORPUS_VERSION",
    "KIND",
    "REFERENCES",
    "EntropyKind",
    "EntropyReference",
    "expected_entropy",
]

INPUT_NAMES = ("logits", "response_mask")
CORPUS_VERSION = 1
_LN2 = math.log(2.0)


@dataclasses.dataclass(frozen=True)
class EntropyReference:
    """How per-token entropies are aggregated (``budget=0``: the padded width), whether the
    result is negated (an entropy loss), and the logarithm's base (nats or bits)."""

    aggregation: Aggregation = Aggregation.TOKEN_MEAN
    budget: int | None = None
    negate: bool = False
    bits: bool = False

    def describe(self, scalar: bool = True) -> str:
        what = "-H" if self.negate else "H"
        unit = "bits (log2)" if self.bits else "nats"
        if not scalar:
            return f"per-token {what} of the softmax in {unit}"
        agg = self.aggregation.value
        if self.aggregation is Aggregation.TOKEN_SUM_NORM:
            agg += " (padded width)" if self.budget == 0 else f" (budget {self.budget})"
        return f"{agg} of {what} of the softmax in {unit}"


REFERENCES: Mapping[str, EntropyReference] = {
    "entropy": EntropyReference(),
    "entropy_loss": EntropyReference(negate=True),
}
"""``entropy``: the token-mean exact entropy (verl 0.9.1 ``compute_entropy_loss`` with its
default ``loss_agg_mode``), or per-token entropies; ``entropy_loss``: its negation."""


def _weights(ref: EntropyReference, mask: torch.Tensor) -> torch.Tensor:
    budget = ref.budget
    if ref.aggregation is Aggregation.TOKEN_SUM_NORM and budget == 0:
        budget = mask.shape[1]
    return token_weights(mask, ref.aggregation, budget=budget)


def expected_entropy(
    ref: EntropyReference, kw: Mapping[str, torch.Tensor], *, scalar: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(result, d result / d logits)`` in float64; ``result`` is ``[B, T]`` or a scalar.
    For per-token results the gradient is that of their sum over response positions."""
    mask = kw["response_mask"]
    z = kw["logits"].to(torch.float64).clone().requires_grad_(True)
    h = token_entropy(logits=z, response_mask=mask)
    factor = (-1.0 if ref.negate else 1.0) / (_LN2 if ref.bits else 1.0)
    h = h * factor
    out = (h * _weights(ref, mask)).sum() if scalar else h
    (grad,) = torch.autograd.grad(out.sum(), z)
    return out.detach(), grad


def _scales(
    ref: EntropyReference, kw: Mapping[str, torch.Tensor], grad: torch.Tensor, *, scalar: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Magnitudes that do not cancel: per token ``|H| + max_v |z_v| + log V`` (the log-sum-exp
    and the mean logit cancel to ``H``), and for the gradient ``p_v`` times that plus the
    token's largest entry."""
    mask = kw["response_mask"]
    z = torch.where(mask[:, :, None], kw["logits"].to(torch.float64), 0.0)
    finite = torch.where(torch.isfinite(z), z, 0.0)
    vocab = z.shape[2]
    h = token_entropy(logits=z, response_mask=mask)
    per_token = h.abs() + finite.abs().amax(dim=2) + math.log(max(vocab, 2))
    shifted = z - z.amax(dim=2, keepdim=True)
    p = torch.softmax(shifted, dim=2)
    w = _weights(ref, mask).abs() if scalar else mask.to(torch.float64)
    g = grad.abs()
    grad_scale = g + g.amax(dim=2, keepdim=True) + (w * per_token)[:, :, None] * (p + 1.0 / vocab)
    value_scale = (w * per_token).sum() if scalar else per_token
    return value_scale, grad_scale


# ---- calling the function -----------------------------------------------------------------


@dataclasses.dataclass
class EntropyContext(TokenContext):
    """:class:`~pytest_polgrad.kinds._tokens.TokenContext` for the entropy kind."""


def call_entropy(
    ctx: TokenContext, kw: Mapping[str, torch.Tensor], *, grad: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, torch.Tensor]]:
    """``(result, gradient of its sum (response positions for [B, T]) w.r.t. logits,
    tensors as passed)``; the result is detached."""
    given = {n: kw[n].detach().clone() for n in INPUT_NAMES if n in ctx.takes}
    if grad:
        given["logits"].requires_grad_(True)
    mask = kw["response_mask"]
    result = call_in_layout(ctx.options, ctx.fn, given, mask, "a valid batch of logits")
    out = pick_output(result, ctx.options.loss, "entropy")
    if not isinstance(out, torch.Tensor) or not out.is_floating_point():
        raise Verdict(
            f"the function returned {type(out).__name__}; the entropy must be a floating "
            "tensor [B, T] or a scalar"
        )
    if out.numel() == 1 and out.dim() <= 1:
        out = out.reshape(())
    elif out.shape != mask.shape:
        raise Verdict(
            f"the function returned shape {list(out.shape)}; expected [B, T] = "
            f"{list(mask.shape)} (per-token entropies) or a scalar (the aggregated bonus)"
        )
    if not grad:
        return out.detach(), None, given
    if not out.requires_grad:
        raise Verdict("the returned entropy is not differentiable in logits (no grad_fn)")
    total = out.sum() if out.dim() == 0 else torch.where(mask, out, 0.0).sum()
    with charged():  # the backward through the function's result is its own
        (g,) = torch.autograd.grad(total, given["logits"], allow_unused=True)
    if g is None:
        raise Verdict("the returned entropy does not depend on logits (gradient is None)")
    return out.detach(), g, given


def _reference(
    ctx: TokenContext, kw: Mapping[str, torch.Tensor], *, scalar: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    try:
        return expected_entropy(ctx.config, kw, scalar=scalar)
    except PolgradError as exc:
        raise Verdict(f"the reference cannot compute this batch: {exc}") from exc


def _compare(
    ctx: TokenContext,
    kw: Mapping[str, torch.Tensor],
    actual: torch.Tensor,
    expected: torch.Tensor,
    scale: torch.Tensor,
    what: str,
) -> float:
    mask = kw["response_mask"]
    if actual.dim() == 0:
        n = int(mask.sum()) * kw["logits"].shape[2]
        a, e = float(actual), float(expected)
        cmp = ctx.tolerance.value(a, e, float(scale), n)
        if not cmp.ok:
            raise CheckFailure(
                f"{what} differs from the reference by {abs(a - e):.3g} "
                f"({cmp.error:.3g}x the tolerance)",
                numbers=[(what, fmt(e), fmt(a))],
                error=cmp.error,
            )
        return ctx.record(cmp, what)
    where = mask if actual.dim() == 2 else mask[:, :, None].expand_as(actual)
    cmp, ratios = ctx.tolerance.tensor(actual, expected, scale, where)
    if not cmp.ok:
        raise CheckFailure(
            f"{what} differs from the reference at {int((ratios > 1).sum())} position(s), "
            f"worst by {cmp.error:.3g}x the tolerance",
            entries=worst_entries(ratios, expected, actual.to(torch.float64)),
            error=cmp.error,
        )
    return ctx.record(cmp, what)


# ---- checks -----------------------------------------------------------------------------------


def _check_value(ctx: Any, kw: Mapping[str, Any]) -> float:
    out, _, _ = call_entropy(ctx, kw, grad=False)
    scalar = out.dim() == 0
    expected, grad = _reference(ctx, kw, scalar=scalar)
    scale, _ = _scales(ctx.config, kw, grad, scalar=scalar)
    what = "entropy" if scalar else "per-token entropy"
    return _compare(ctx, kw, out, expected, scale, what)


def _check_gradient(ctx: Any, kw: Mapping[str, Any]) -> float:
    out, g, _ = call_entropy(ctx, kw)
    assert g is not None
    scalar = out.dim() == 0
    _, expected = _reference(ctx, kw, scalar=scalar)
    _, scale = _scales(ctx.config, kw, expected, scalar=scalar)
    err = _compare(ctx, kw, g, expected, scale, "gradient w.r.t. logits")
    leak = (g != 0) & ~kw["response_mask"][:, :, None]
    if bool(leak.any()):
        pos = [tuple(p) for p in leak.nonzero()[:4].tolist()]
        raise CheckFailure(
            f"gradient flows into the logits of padding positions at {pos}",
            entries=[(p, 0.0, float(g[p])) for p in pos],
        )
    return err


def _own(ctx: Any, kw: Mapping[str, Any], other: Mapping[str, Any], why: str) -> float:
    base, _, _ = call_entropy(ctx, kw, grad=False)
    out, _, _ = call_entropy(ctx, other, grad=False)
    if out.dim() == 2:
        out = out[:, : kw["response_mask"].shape[1]]
    scalar = base.dim() == 0
    _, grad = _reference(ctx, kw, scalar=scalar)
    scale, _ = _scales(ctx.config, kw, grad, scalar=scalar)
    with against_own(why):
        return _compare(ctx, kw, out, base.to(torch.float64).nan_to_num(0.0), scale, "entropy")


def _check_padding_values(ctx: Any, kw: Mapping[str, Any]) -> float:
    mask = kw["response_mask"]
    if bool(mask.all()):
        return 0.0
    g = torch.Generator().manual_seed(5)
    z = kw["logits"]
    junk = ((torch.rand(z.shape, generator=g, dtype=torch.float64) * 2 - 1) * 3e3).to(z.dtype)
    other = {**kw, "logits": torch.where(mask[:, :, None], z, junk)}
    return _own(ctx, kw, other, "with other logits at padding")


def _check_padding_columns(ctx: Any, kw: Mapping[str, Any]) -> float:
    ref: EntropyReference = ctx.config
    if ref.aggregation is Aggregation.TOKEN_SUM_NORM and ref.budget == 0:
        return 0.0
    wide = {
        "logits": torch.nn.functional.pad(kw["logits"], (0, 0, 0, 3), value=4.0),
        "response_mask": torch.nn.functional.pad(kw["response_mask"], (0, 3), value=False),
    }
    return _own(ctx, kw, wide, "with 3 more padding columns")


def _before(ctx: Any, kw: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    return {n: kw[n].detach().clone() for n in INPUT_NAMES if n in ctx.takes}


_CHECKS: dict[str, KindCheck] = {
    c.name: c
    for c in (
        KindCheck("value", "the entropy equals the exact entropy of the softmax", _check_value),
        KindCheck(
            "gradient",
            "d entropy / d logits equals the exact gradient, 0 at padding",
            _check_gradient,
        ),
        KindCheck(
            "large-logits",
            "logits offset by +-1e4 give the exact entropy, finite (needs the max shift)",
            _check_value,
            domain="extreme",
        ),
        *token_hygiene(
            "logits",
            "result",
            call_entropy,
            _before,
            padding_values=_check_padding_values,
            padding_columns=_check_padding_columns,
        ),
    )
}

_OVERRIDES = frozenset({"aggregation", "budget", "negate", "bits"})


class EntropyKind(TableKind):
    """The entropy :class:`~pytest_polgrad.core.kinds.Kind` (see the module docstring)."""

    name = "entropy"
    summary = "entropy(logits [B, T, V], response_mask [B, T]) -> [B, T] or scalar tensor"
    override_keys = _OVERRIDES

    def resolve(self, options: ConformanceOptions) -> EntropyReference:
        base = named_reference(self.name, options.reference, REFERENCES, EntropyReference)
        unknown_overrides(self.name, options, _OVERRIDES)
        over = dict(options.overrides)
        aggregation_override(over)
        for flag in ("negate", "bits"):
            if flag in over and not isinstance(over[flag], bool):
                raise MarkerError(f"{flag} must be True or False, got {over[flag]!r}")
        out = dataclasses.replace(base, **over)
        require_budget(out.aggregation, out.budget)
        if options.layout not in ("right", "packed"):
            raise MarkerError(
                "the entropy kind takes right-padded [B, T, V] logits (layout='right') or "
                "a packed [N, V] stream (layout='packed')"
            )
        return out

    def missing(self, name: str) -> str:
        return (
            f"{name} has no 'logits' parameter; an entropy function takes logits "
            "[B, T, V] and response_mask [B, T]"
        )

    def shape(self, ctx: Any, check: KindCheck) -> dict[str, Any]:
        patterns = (
            ("large", "peaked") if check.domain == "extreme" else ("normal", "peaked", "uniform")
        )
        return dict(
            max_batch=min(4, ctx.options.max_batch),
            max_length=min(8, ctx.options.max_length),
            patterns=patterns,
            dtype=ctx.tolerance.input_dtype,
            padding="nan" if ctx.options.padding_nan else "garbage",
        )

    def strategy(self, ctx: Any, check: KindCheck) -> Any:
        return logit_batches(**self.shape(ctx, check))

    def corpus(self, ctx: Any) -> dict[str, LogitBatch]:
        return entropy_corpus(ctx.tolerance.input_dtype)

    def diagnose(self, ctx: Any, inputs: Any) -> Diagnosis:
        return diagnose_entropy(ctx, inputs)

    def snippet(self, ctx: Any, inputs: Any, check: KindCheck) -> str:
        return entropy_snippet(ctx, inputs, check)

    def golden(self, ctx: Any) -> Tolerant:
        def entry(kw: Mapping[str, Any], called: Any) -> Any:
            out, g, _ = called
            assert g is not None
            scalar = out.dim() == 0
            _, ref_grad = _reference(ctx, kw, scalar=scalar)
            value_scale, grad_scale = _scales(ctx.config, kw, ref_grad, scalar=scalar)
            if scalar:
                n = int(kw["response_mask"].sum()) * kw["logits"].shape[2]
                scale = EntryScale(float(value_scale), count=n)
            else:
                scale = EntryScale(value_scale)
            return {"entropy": out, "grad": g}, {"entropy": scale, "grad": EntryScale(grad_scale)}

        return corpus_golden(self.corpus(ctx), lambda kw: call_entropy(ctx, kw), entry,
                             tolerance=ctx.tolerance, version=CORPUS_VERSION)  # fmt: skip


# --------------------------------------------------------------------------- snippet


def entropy_snippet(ctx: TokenContext, inputs: LogitBatch, check: KindCheck) -> str:
    """Standalone Python: the function called as ``check`` called it, the exact entropy
    of the softmax and its gradient in float64, and what the check compared."""
    ref: EntropyReference = ctx.config
    where = importable(ctx.fn, ctx.name)
    grad = check.name in ("gradient", "inputs-unchanged", "deterministic")
    takes = [n for n in INPUT_NAMES if n in ctx.takes]
    budget = "mask.shape[1]" if ref.budget == 0 else repr(ref.budget)  # 0: the padded width
    factor = ("-" if ref.negate else "") + "1.0" + (" / math.log(2)" if ref.bits else "")
    definitions = [
        *snippet_helper(ctx.options),
        "",
        "",
        "def run(inputs, grad=" + str(grad) + "):",
        '    """Call the function as the check did; the gradient w.r.t. logits of the result',
        '    (per-token results: of their sum over response positions)."""',
        "    mask = inputs['response_mask']",
        f"    kw = {{n: inputs[n].detach().clone() for n in {takes!r}}}",
        "    if grad:",
        "        kw['logits'].requires_grad_(True)",
        "    before = {k: v.detach().clone() for k, v in kw.items()}",
        f"    out = {snippet_call(ctx.options, where.call)}",
        pick_line(ctx.options.loss, "entropy"),
        "    if out.numel() == 1 and out.dim() <= 1:",
        "        out = out.reshape(())",
        "    g = None",
        "    if grad:",
        "        total = out.sum() if out.dim() == 0 else torch.where(mask, out, 0.0).sum()",
        "        (g,) = torch.autograd.grad(total, kw['logits'])",
        "    return out.detach(), g, kw, before",
        "",
        "",
        "def reference(inputs, out):",
        f'    """The float64 reference: {ref.describe()} (per token when out is [B, T])."""',
        "    mask = inputs['response_mask']",
        "    z = inputs['logits'].double().clone().requires_grad_(True)",
        f"    h = token_entropy(logits=z, response_mask=mask) * ({factor})",
        f"    w = token_weights(mask, {ref.aggregation.value!r}, budget={budget})",
        "    result = (h * w).sum() if out.dim() == 0 else h",
        "    return result.detach(), torch.autograd.grad(result.sum(), z)[0]",
    ]
    if check.name == "padding-values":
        other = [
            "g = torch.Generator().manual_seed(5)",
            "z = inputs['logits']",
            "junk = ((torch.rand(z.shape, generator=g, dtype=torch.float64) * 2 - 1) * 3e3)",
            "other = {**inputs, 'logits': torch.where(inputs['response_mask'][:, :, None], z, "
            "junk.to(z.dtype))}",
        ]
        lines = check_lines("same", other=other, grads=False, what="other logits at padding")
    elif check.name == "padding-columns":
        other = [
            "other = {'logits': torch.nn.functional.pad(inputs['logits'], (0, 0, 0, 3), "
            "value=4.0),",
            "         'response_mask': torch.nn.functional.pad(inputs['response_mask'], (0, 3), "
            "value=False)}",
        ]
        lines = check_lines("same", other=other, grads=False, what="3 more padding columns")
    else:
        lines = check_lines("value" if check.name == "large-logits" else check.name)
    return kind_snippet(
        where,
        imports=[
            "import math",
            "",
            "from polgrad_reference import token_weights",
            "from polgrad_reference.entropy import token_entropy",
        ],
        inputs=inputs.to_snippet(),
        definitions=definitions,
        check=lines,
    )


KIND = EntropyKind(_CHECKS, INPUT_NAMES, EntropyContext)


# ---- corpus -------------------------------------------------------------------------------------


def entropy_corpus(dtype: torch.dtype) -> dict[str, LogitBatch]:
    """Literal logits: ragged rows with varied, peaked and uniform distributions."""
    lengths = [1, 3, 5, 2]
    width, vocab = 6, 5
    mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    z = torch.tensor(
        [
            [[((3 * b + 5 * t + 7 * v) % 11 - 5) / 2 for v in range(vocab)] for t in range(width)]
            for b in range(len(lengths))
        ],
        dtype=torch.float64,
    )
    z[1, 1] = torch.tensor([8.0, 0.0, 0.0, -1.0, 0.5])  # peaked
    z[2, 3] = 0.25  # uniform: log 5
    z = torch.where(mask[:, :, None], z, 50.0)
    return {"ragged": LogitBatch(logits=z.to(dtype), response_mask=mask, pattern="corpus")}


# ---- diagnosis ----------------------------------------------------------------------------------


def _candidates(ref: EntropyReference, scalar: bool) -> Iterator[EntropyReference]:
    yield ref
    aggs: tuple[Aggregation, ...] = tuple(Aggregation) if scalar else (ref.aggregation,)
    for agg, negate, bits in itertools.product(aggs, (False, True), (False, True)):
        budgets: tuple[int | None, ...] = (None,)
        if agg is Aggregation.TOKEN_SUM_NORM:
            budgets = tuple(dict.fromkeys(b for b in (ref.budget, 0) if b is not None))
        for budget in budgets:
            yield EntropyReference(agg, budget, negate, bits)


def _error(
    ctx: TokenContext,
    cand: EntropyReference,
    observed: Mapping[str, tuple[Mapping[str, torch.Tensor], torch.Tensor, torch.Tensor]],
) -> float:
    probe = dataclasses.replace(ctx, config=cand, worst=0.0, notes=set())
    worst = 0.0
    for kw, out, grad in observed.values():
        scalar = out.dim() == 0
        try:
            expected, eg = expected_entropy(cand, kw, scalar=scalar)
        except PolgradError:
            return math.inf
        vs, gs = _scales(cand, kw, eg, scalar=scalar)
        try:
            worst = max(worst, _compare(probe, kw, out, expected, vs, "entropy"))
            worst = max(worst, _compare(probe, kw, grad, eg, gs, "gradient"))
        except CheckFailure as exc:
            worst = max(worst, exc.error)
    return worst


def _negative(ref: EntropyReference, observed: Mapping[str, Any]) -> str:
    """A clause for a negative entropy (``H >= 0`` for every distribution) where the
    reference is not negated: what a sentinel logprob > 0 at padding gives (TRL PR #6121)."""
    if ref.negate:
        return ""
    for name, (kw, out, _) in observed.items():
        low = out if out.dim() == 0 else out[kw["response_mask"]]
        if low.numel() and float(low.min()) < 0:
            return (
                f"the entropy is negative on corpus batch {name!r} ({float(low.min()):.4g}), "
                "and H >= 0 for every distribution: padding counted with a sentinel logprob "
                "> 0 (TRL's INVALID_LOGPROB = 1.0, TRL PR #6121) or a flipped sign; "
            )
    return ""


def diagnose_entropy(ctx: TokenContext, inputs: Any) -> Diagnosis:
    """The closest candidate (aggregation, sign, base) on the corpus."""
    ref: EntropyReference = ctx.config
    observed = {}
    for name, batch in entropy_corpus(ctx.tolerance.input_dtype).items():
        kw = batch.as_kwargs()
        try:
            out, g, _ = call_entropy(ctx, kw)
        except Verdict as exc:
            return Diagnosis(f"could not evaluate the function on corpus batch {name!r}: {exc}", "")
        assert g is not None
        observed[name] = (kw, out, g)
    scalar = next(iter(observed.values()))[1].dim() == 0
    ranked = sorted(
        ((c, _error(ctx, c, observed)) for c in _candidates(ref, scalar)), key=lambda x: x[1]
    )
    best, err = ranked[0]
    label = best.describe(scalar)
    reference = f"the reference {ctx.options.reference_id!r} is {ref.describe(scalar)}"
    if err > 1.0:
        return Diagnosis(
            _negative(ref, observed)
            + f"no candidate entropy matches on the corpus; the closest is {label} (off by "
            f"{err:.3g} tolerances); {reference}",
            "",
        )
    if best == ref:
        return Diagnosis(f"the function matches the reference on the corpus ({label})", label)
    return Diagnosis(f"this entropy function computes {label} on the corpus; {reference}", label)
