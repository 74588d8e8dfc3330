"""The critic's training step: the value loss under micro-batch and data-parallel splits.

The marked function computes the value loss of ONE micro-batch, the one the trainer calls
``backward()`` on, from ``values`` (requires grad), ``old_values``, ``returns``,
``response_mask`` and any :class:`~pytest_polgrad.strategies.StepInfo` field by name::

    @pytest.mark.polgrad_conforms("verl", kind="critic_step", distributed="ddp")
    def critic_step(values, old_values, returns, response_mask, global_tokens, world_size):
        per_token = my_clipped_value_loss(values, old_values, returns)  # 0 at padding
        return per_token.sum() / global_tokens * world_size

The step is correct when its gradient, summed over micro-batches and averaged over ranks, is
that of the value loss over the WHOLE step,

    L = (1/N) sum_{b,t} m[b, t] l[b, t],   l = 1/2 max((V - R)^2, (clip(V, V_old +- c) - R)^2)

(token-mean over the step's ``N`` response tokens; PPO arXiv:1707.06347 Eq. 9, clipped as
verl's ``compute_value_loss``). verl PR #6957 normalised it per micro-batch, so its gradient
grew K-fold with K micro-batches; the failure names that factor.

``kind="critic_step"`` (:data:`KIND`): the references are ``"ppo"`` (clip 0.2), ``"verl"``
(clip 0.5, verl 0.9.1 ``critic.cliprange_value``) and ``"unclipped"``, ``clip_range=``
overrides; ``distributed="ddp"`` / ``"fsdp"`` runs the multi-rank splits on a real process
group (:func:`.distributed.run_step` with ``through="values"``). :func:`check_critic_step`
is the same comparison for one step and split, from plain Python. The reference is
``polgrad_reference.value`` (no other kind's oracle).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from hypothesis import strategies as st

from polgrad_reference import Aggregation
from polgrad_reference.value import value_loss_per_token
from pytest_polgrad.core.calls import guarded_call
from pytest_polgrad.core.clock import charged
from pytest_polgrad.core.golden_format import EntryScale, Tolerant
from pytest_polgrad.core.kinds import Diagnosis, Kind, KindCheck
from pytest_polgrad.core.options import ConformanceOptions, MarkerError
from pytest_polgrad.core.snippets import check_lines, importable, kind_snippet, pick_line
from pytest_polgrad.core.verdicts import CheckFailure, Verdict
from pytest_polgrad.kinds._accumulation import Scheme, row_facts, schemes
from pytest_polgrad.kinds._tokens import (
    TokenContext,
    bitwise_equal,
    compare_tensor,
    compare_value,
    fmt,
    parameters,
    pick_output,
    require_scalar,
    tolerance_for,
    worst_entries,
)
from pytest_polgrad.kinds.training_step import shared as _shared
from pytest_polgrad.kinds.training_step.distributed import DistributedError, run_step
from pytest_polgrad.kinds.training_step.execute import fold, on_process_group
from pytest_polgrad.kinds.training_step.kind import StepInputs
from pytest_polgrad.kinds.training_step.shared import FAMILY_SHAPES
from pytest_polgrad.kinds.training_step.terms import factor_meaning
from pytest_polgrad.strategies import value_batches
from pytest_polgrad.strategies._cache import choice
from pytest_polgrad.strategies._sample import composite
from pytest_polgrad.strategies._splits import Split, StepInfo, splits

__all__ = [
    "CRITIC_INPUTS",
    "KIND",
    "REFERENCES",
    "Critic",
    "CriticReference",
    "CriticStepKind",
    "check_critic_step",
    "critic_batch",
    "expected_critic",
    "run_critic",
]

CRITIC_INPUTS = ("values", "old_values", "returns", "response_mask")
_INFO_FIELDS = tuple(f.name for f in dataclasses.fields(StepInfo))
_RTOL = {torch.float64: 1e-10, torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 5e-3}
"""Relative error :func:`check_critic_step` allows against ``|grad_ref| + max |grad_ref|``,
by the inputs' dtype (the marker uses the kit's tolerance model instead)."""


@dataclasses.dataclass(frozen=True)
class Critic:
    """A critic step as the kit accumulated it: loss and ``d loss / d values`` ``[B, T]``;
    ``changed``: ``"rank r micro-batch k: name"`` for every input written in place."""

    loss: float
    grad: torch.Tensor
    changed: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class CriticReference:
    """The whole step's value loss: token-mean of ``1/2`` the squared error, clipped at
    ``+-clip_range`` around ``old_values`` (None: unclipped)."""

    clip_range: float | None = 0.2

    def describe(self) -> str:
        clip = "unclipped" if self.clip_range is None else f"clipped at +-{self.clip_range:g}"
        return f"{clip} squared error x 1/2, token-mean over the whole step"


REFERENCES: Mapping[str, CriticReference] = {
    "ppo": CriticReference(0.2),
    "verl": CriticReference(0.5),
    "unclipped": CriticReference(None),
}
"""The value-loss kind's names: ``ppo`` clip 0.2, ``verl`` clip 0.5 (verl 0.9.1
``critic.cliprange_value``), ``unclipped`` (PPO arXiv:1707.06347 Eq. 9)."""


def critic_batch(
    lengths: tuple[int, ...],
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    padding: float = math.nan,
) -> dict[str, torch.Tensor]:
    """Right-padded rows of response ``lengths``: values near returns, some outside the clip
    range of 0.2 around ``old_values``, ``padding`` (NaN by default) at padding."""
    g = torch.Generator().manual_seed(seed)
    b, width = len(lengths), max(lengths)
    mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    ret = torch.randn((b, width), generator=g, dtype=torch.float64)
    old = ret + torch.randn((b, width), generator=g, dtype=torch.float64) * 0.3
    val = old + torch.randn((b, width), generator=g, dtype=torch.float64) * 0.3
    fill = torch.tensor(padding, dtype=torch.float64)
    out = {"values": val, "old_values": old, "returns": ret}
    return {
        **{k: torch.where(mask, v, fill).to(dtype) for k, v in out.items()},
        "response_mask": mask,
    }


def expected_critic(
    batch: Mapping[str, torch.Tensor], clip_range: float | None = 0.2
) -> tuple[float, torch.Tensor]:
    """The float64 token-mean value loss of the whole step and its gradient in ``values``."""
    mask = batch["response_mask"]
    val = batch["values"].detach().to(torch.float64).requires_grad_(True)
    per_token = value_loss_per_token(
        values=val,
        old_values=batch["old_values"].detach().to(torch.float64),
        returns=batch["returns"].detach().to(torch.float64),
        response_mask=mask,
        clip_range=clip_range,
    )
    loss = torch.where(mask, per_token, 0.0).sum() / mask.sum()
    (grad,) = torch.autograd.grad(loss, val)
    return float(loss.detach()), grad.detach()


def _takes(fn: Callable[..., Any]) -> frozenset[str]:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError) as exc:
        raise Verdict(f"the critic step {fn!r} has no readable signature") from exc
    return frozenset(params)


def _accumulate(
    fn: Callable[..., Any],
    batch: Mapping[str, torch.Tensor],
    split: Split,
    takes: frozenset[str],
    loss_key: str | int | None,
    snapshot: bool,
) -> Critic:
    mask = batch["response_mask"]
    cols = torch.arange(mask.shape[1])
    grad = torch.zeros(mask.shape, dtype=torch.float64)
    total, world = 0.0, split.world_size
    changed: list[str] = []
    for rank in split.infos(mask):
        for info in rank:
            index = torch.tensor(info.rows, dtype=torch.long)
            width = int(torch.where(mask[index], cols + 1, 0).max()) if info.rows else 0
            kwargs: dict[str, Any] = {
                n: batch[n][index][:, :width].detach().clone() for n in CRITIC_INPUTS if n in takes
            }
            before = {k: v.clone() for k, v in kwargs.items()} if snapshot else {}
            val = kwargs["values"].requires_grad_(True)
            kwargs.update({f: getattr(info, f) for f in _INFO_FIELDS if f in takes})
            if "step" in takes:
                kwargs["step"] = info
            where = f"rank {info.rank} micro-batch {info.micro_batch}"
            loss = require_scalar(pick_output(guarded_call(fn, kwargs, where), loss_key, "loss"),
                                  where)  # fmt: skip
            if not loss.requires_grad:
                raise Verdict(f"{where}: the critic step must return a scalar loss of values")
            try:
                with charged():  # the backward through the function's loss is its own
                    (g,) = torch.autograd.grad(loss, val, allow_unused=True)
            except RuntimeError as exc:
                raise Verdict(f"{where}: backward through the returned loss failed: {exc}") from exc
            if g is None:
                raise Verdict(f"{where}: the returned loss does not depend on values")
            grad[index, :width] += g.detach().to(torch.float64) / world
            total += float(loss.detach()) / world
            changed += [
                f"{where}: {k}"
                for k, old in before.items()
                if not bool(bitwise_equal(kwargs[k].detach(), old).all())
            ]
    return Critic(total, grad, tuple(changed))


def run_critic(
    fn: Callable[..., Any],
    batch: Mapping[str, torch.Tensor],
    split: Split,
    *,
    wrap: str | None = None,
    takes: frozenset[str] | None = None,
    loss: str | int | None = None,
    snapshot: bool = False,
) -> Critic:
    """The critic step accumulated over ``split``: per-rank sums averaged over ranks
    (simulated), or, with ``wrap`` (``"ddp"`` / ``"fsdp"``) and more than one rank, the
    gradient the real process group's reduction leaves (a rank's fault is a
    :class:`Verdict` naming the rank)."""
    names = _takes(fn) if takes is None else takes
    if not on_process_group(wrap, split):
        return _accumulate(fn, batch, split, names, loss, snapshot)
    assert wrap is not None
    tensors = {k: v for k, v in batch.items() if k in CRITIC_INPUTS}
    try:
        ran = run_step(fn, tensors, split, wrap=wrap, takes=names, loss=loss,
                       snapshot=snapshot, through="values")  # fmt: skip
    except DistributedError as exc:
        who = "" if exc.rank is None else f", rank {exc.rank}"
        raise Verdict(
            f"on a real {wrap} process group ({split.world_size} ranks{who}): {exc}"
        ) from exc
    return Critic(ran.loss, ran.grad, ran.changed)


def _at_the_clip(
    batch: Mapping[str, torch.Tensor], clip_range: float | None, eps: float | None = None
) -> torch.Tensor:
    """Tokens whose ``|V - V_old|`` lies within rounding (``eps``; default 4 roundings of
    the inputs' dtype) of the clip range: a step computing in lower precision may take
    either side of the kink there (the gradient jumps between ``V - R`` and 0), so their
    gradient is not judged."""
    mask = batch["response_mask"]
    if clip_range is None:
        return torch.zeros_like(mask)
    v, old = (batch[k].detach().to(torch.float64) for k in ("values", "old_values"))
    if eps is None:
        eps = 4 * torch.finfo(batch["values"].dtype).eps
    near = ((v - old).abs() - clip_range).abs() <= eps * (v.abs() + old.abs() + clip_range)
    return mask & near


def _mis_scaled(
    split: Split,
    got: Critic,
    uniform: float | None,
    loss: float,
    err: float,
    entries: list[tuple[tuple[int, ...], float, float]] | None = None,
) -> CheckFailure:
    """The failure of a step whose accumulated gradient is not the reference's: the factor
    ``uniform`` (None: not a uniform multiple) and its usual cause."""
    if uniform is not None:
        meaning = factor_meaning(uniform, split)
        how = f"{uniform:.6g}x the reference's" + (f": {meaning}" if meaning else "")
    else:
        how = "not a uniform multiple of the reference's (weighted differently per micro-batch)"
    return CheckFailure(
        f"the value term is mis-scaled with the split {split.describe()}: the critic step's "
        f"accumulated gradient is {how}",
        numbers=[("value loss (whole step, accumulated)", f"{loss:.6g}", f"{got.loss:.6g}")],
        entries=entries or [],
        error=err,
    )


def _least_squares(got: torch.Tensor, ref: torch.Tensor, where: torch.Tensor) -> float:
    g, r = got[where], ref[where]
    denom = float((r * r).sum())
    return float((g * r).sum()) / denom if denom > 0 else math.nan


def check_critic_step(
    fn: Callable[..., Any],
    batch: Mapping[str, torch.Tensor],
    split: Split,
    *,
    clip_range: float | None = 0.2,
    wrap: str | None = None,
) -> float:
    """The critic step's accumulated gradient (per token, in ``values``) and loss against
    the whole step's token-mean value loss; the worst error relative to the dtype's
    tolerance, or ``CheckFailure`` naming the factor and its cause. ``wrap``: ``"ddp"`` /
    ``"fsdp"`` runs a multi-rank split on a real process group."""
    if "values" not in _takes(fn):
        raise Verdict(f"the critic step {fn!r} takes no 'values'")
    got = run_critic(fn, batch, split, wrap=wrap)
    loss, grad = expected_critic(batch, clip_range)
    mask = batch["response_mask"] & ~_at_the_clip(batch, clip_range)
    rtol = _RTOL.get(batch["values"].dtype, 1e-4)
    scale = grad.abs() + grad.abs().max()
    err = float(((got.grad - grad).abs() / (rtol * scale))[mask].max()) if mask.any() else 0.0
    err = max(err, abs(got.loss - loss) / (rtol * max(abs(loss), 1e-300)))
    if err <= 1.0 and bool(torch.isfinite(got.grad).all()):
        return err
    c = _least_squares(got.grad, grad, mask)
    spread = float((got.grad - c * grad).abs().max()) if math.isfinite(c) else math.inf
    uniform = c if spread <= rtol * float(scale.max()) else None
    raise _mis_scaled(split, got, uniform, loss, err)


# ------------------------------------------------------------------------ the kind


@dataclasses.dataclass
class CriticContext(TokenContext):
    """:class:`~pytest_polgrad.kinds._tokens.TokenContext` of a critic step; ``wrap``:
    ``distributed=`` (None: simulated), ``world``: ``world_size=``."""

    wrap: str | None = None
    world: int = 2

    @functools.cached_property
    def options_key(self) -> str:
        """``repr(options)``, once: the key of this function's shared runs."""
        return repr(self.options)

    @property
    def reference(self) -> CriticReference:
        assert isinstance(self.config, CriticReference)
        return self.config


def _reference(ctx: CriticContext, batch: Mapping[str, Any]) -> tuple[float, torch.Tensor]:
    return expected_critic(batch, ctx.reference.clip_range)


def _scales(
    ctx: CriticContext, batch: Mapping[str, Any], grad: torch.Tensor
) -> tuple[float, torch.Tensor]:
    """Magnitudes that do not cancel: ``(1/N) sum (|V| + |R| + |V_old| + c)^2`` for the
    loss; ``2 (|V| + |R| + |V_old| + c) / N`` plus ``|g|`` and the row's largest ``|g|``
    for each token's gradient (as the value-loss kind's, with the whole step's weight)."""
    mask = batch["response_mask"]
    c = ctx.reference.clip_range or 0.0
    t = {k: batch[k].detach().to(torch.float64) for k in ("values", "returns", "old_values")}
    size = torch.where(mask, t["values"].abs() + t["returns"].abs() + t["old_values"].abs() + c,
                       0.0)  # fmt: skip
    n = max(int(mask.sum()), 1)
    g = grad.abs()
    return float((size * size).sum()) / n, 2.0 * size / n + g + g.amax(dim=1, keepdim=True)


def _unjudged(ctx: CriticContext, batch: Mapping[str, Any]) -> torch.Tensor:
    """The clip kinks within the loosest accepted precision's rounding."""
    eps = ctx.tolerance.kink_band[0]
    return _at_the_clip(batch, ctx.reference.clip_range, eps)


def _run(ctx: CriticContext, inputs: Mapping[str, Any], *, snapshot: bool = False) -> Critic:
    batch = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    return run_critic(ctx.fn, batch, inputs["split"], wrap=ctx.wrap, takes=ctx.takes,
                      loss=ctx.options.loss, snapshot=snapshot)  # fmt: skip


def _shared_run(ctx: CriticContext, inputs: Mapping[str, Any]) -> Critic:
    """:func:`_run`, once per (function, step, split) while the engine screens (the split
    checks, masked-positions and deterministic's first run share it)."""
    return _shared.reuse(ctx, inputs, lambda: _run(ctx, inputs))


def check_split(ctx: CriticContext, inputs: Mapping[str, Any]) -> float:
    """The accumulated gradient (per token) and loss equal the whole step's reference; a
    mis-scaled step is named with its factor and cause."""
    split: Split = inputs["split"]
    got = _shared_run(ctx, inputs)
    loss, grad = _reference(ctx, inputs)
    loss_scale, grad_scale = _scales(ctx, inputs, grad)
    mask = inputs["response_mask"]
    where = mask & ~_unjudged(ctx, inputs)
    context = f" with the split {split.describe()}"
    if not bool(torch.isfinite(got.grad[mask]).all()):
        raise Verdict(f"the critic step's accumulated gradient is not finite{context}")
    cmp, ratios = ctx.tolerance.tensor(got.grad, grad, grad_scale, where)
    if not cmp.ok:
        c = _least_squares(got.grad, grad, where)
        ok = (
            math.isfinite(c)
            and ctx.tolerance.tensor(got.grad, c * grad, grad_scale * max(1.0, abs(c)), where)[0].ok
        )
        entries = worst_entries(ratios, grad, got.grad)
        raise _mis_scaled(split, got, c if ok else None, loss, cmp.error, entries)
    err = ctx.record(cmp, "accumulated d loss / d values")
    n = int(mask.sum())
    return max(err, compare_value(ctx, got.loss, loss, loss_scale, n,
                                  "accumulated loss (summed over micro-batches, mean over "
                                  "ranks)", context))  # fmt: skip


def _family(family: str) -> Callable[[CriticContext, Mapping[str, Any]], float]:
    """The check of one split family; corpus steps of other families are left to theirs."""

    def run(ctx: CriticContext, inputs: Mapping[str, Any]) -> float:
        return check_split(ctx, inputs) if inputs["split"].family == family else 0.0

    return run


def check_masked_positions(ctx: CriticContext, inputs: Mapping[str, Any]) -> float:
    got = _shared_run(ctx, inputs)
    bad = ~inputs["response_mask"] & (got.grad != 0)
    if bool(bad.any()):
        pos = [tuple(p) for p in bad.nonzero()[:4].tolist()]
        raise CheckFailure(
            f"the accumulated gradient in values is not exactly zero at {int(bad.sum())} "
            f"padding position(s) with the split {inputs['split'].describe()}",
            entries=[(p, 0.0, float(got.grad[p])) for p in pos],
        )
    return 0.0


def check_padding_values(ctx: CriticContext, inputs: Mapping[str, Any]) -> float:
    """Only ``values``, ``old_values`` and ``returns`` at padding change (to NaN with
    ``padding_nan``): the accumulated loss and gradient stay the same."""
    mask = inputs["response_mask"]
    first = _shared_run(ctx, inputs)
    fill = math.nan if ctx.options.padding_nan else -11.5
    other = {k: v.masked_fill(~mask, fill) if k in CRITIC_INPUTS[:3] else v
             for k, v in inputs.items()}  # fmt: skip
    second = _run(ctx, other)
    loss_scale, grad_scale = _scales(ctx, inputs, _reference(ctx, inputs)[1])
    what = " when only the values at padding change" + (" (to NaN)" if math.isnan(fill) else "")
    context = f"{what} with the split {inputs['split'].describe()}"
    err = compare_tensor(ctx, second.grad, first.grad, grad_scale, mask,
                         "the accumulated gradient in values", context)  # fmt: skip
    return max(err, compare_value(ctx, second.loss, first.loss, loss_scale, int(mask.sum()),
                                  "the accumulated value loss", context))  # fmt: skip


def check_inputs_unchanged(ctx: CriticContext, inputs: Mapping[str, Any]) -> float:
    got = _run(ctx, inputs, snapshot=True)
    if got.changed:
        raise CheckFailure(f"the critic step modified its inputs in place: "
                           f"{'; '.join(got.changed[:4])}")  # fmt: skip
    return 0.0


def check_deterministic(ctx: CriticContext, inputs: Mapping[str, Any]) -> float:
    a, b = _shared_run(ctx, inputs), _run(ctx, inputs)
    same = a.loss == b.loss or (math.isnan(a.loss) and math.isnan(b.loss))
    if not same or not bool(bitwise_equal(a.grad, b.grad).all()):
        raise CheckFailure(
            "two runs of the same critic step give different results",
            numbers=[("loss (1st run, 2nd run)", fmt(a.loss), fmt(b.loss))],
        )
    return 0.0


_CHECKS = (
    KindCheck("full-batch", "one rank, one micro-batch: the value loss and its gradient "
              "equal the reference's", _family("full-batch"), domain="full-batch"),
    KindCheck("micro-batches", "micro-batches accumulated on one rank give the whole step's "
              "value-loss gradient and loss", _family("micro-batches"), domain="micro-batches"),
    KindCheck("data-parallel", "ranks with different token counts, accumulated and "
              "all-reduce-averaged, give the whole step's gradient and loss",
              _family("data-parallel"), domain="data-parallel"),
    KindCheck("masked-positions", "the accumulated gradient is exactly zero at padding",
              check_masked_positions, domain="any", semantic=False),
    KindCheck("padding-values", "the accumulated loss and gradient do not depend on the "
              "values at padding", check_padding_values, domain="any", semantic=False),
    KindCheck("inputs-unchanged", "no micro-batch input is modified in place",
              check_inputs_unchanged, domain="any", semantic=False),
    KindCheck("deterministic", "two runs of the same step agree bitwise", check_deterministic,
              domain="any", semantic=False),
)  # fmt: skip
_OVERRIDES = frozenset({"clip_range"})
_NEED = {"full-batch": 1, "micro-batches": 2, "data-parallel": 2}


def _corpus_splits() -> dict[str, tuple[tuple[int, ...], Split]]:
    """Named (response lengths, split): ragged rows cut every way, and equal rows in four
    micro-batches (a per-micro-batch normalisation is then an exact 4x; 2x with two per
    rank)."""
    ragged, equal = (1, 3, 6, 8), (4, 4, 4, 4)
    return {
        "full-batch": (ragged, Split((((0, 1, 2, 3),),))),
        "micro-batches-equal": (equal, Split((((0,), (1,), (2,), (3,)),))),
        "micro-batches": (ragged, Split((((0,), (1, 2, 3)),))),
        "data-parallel-equal": (equal, Split((((0,), (1,)), ((2,), (3,))))),
        "data-parallel": (ragged, Split((((0,), (1,)), ((2,), (3,))))),
        "data-parallel-uneven": (ragged, Split((((0, 1, 2),), ((3,),)))),
    }


class CriticStepKind(Kind):
    """See the module docstring."""

    name = "critic_step"
    summary = (
        "(micro-batch values, old_values, returns, response_mask, + StepInfo fields such as "
        "global_tokens, world_size) -> the micro-batch value loss to backward()"
    )
    override_keys = _OVERRIDES

    def resolve(self, options: ConformanceOptions) -> CriticReference:
        ref = options.reference
        if options.layout != "right":
            raise MarkerError(f"kind='critic_step' takes right-padded micro-batches; drop "
                              f"layout={options.layout!r}")  # fmt: skip
        unknown = sorted(set(options.overrides) - _OVERRIDES)
        if unknown:
            raise MarkerError(f"kind='critic_step' takes no {', '.join(unknown)} (overrides: "
                              "clip_range)")  # fmt: skip
        if isinstance(ref, CriticReference):
            base = ref
        elif isinstance(ref, str) and ref in REFERENCES:
            base = REFERENCES[ref]
        else:
            raise MarkerError(
                f"reference must be one of {', '.join(map(repr, REFERENCES))} or a "
                f"CriticReference for kind='critic_step', got {ref!r}"
            )
        out = dataclasses.replace(base, **options.overrides)
        c = out.clip_range
        if c is not None and (isinstance(c, bool) or not isinstance(c, (int, float)) or not c > 0):
            raise MarkerError(f"clip_range must be a positive number or None, got {c!r}")
        return out

    def checks(self, config: Any, options: ConformanceOptions) -> list[KindCheck]:
        if options.checks is None:
            return list(_CHECKS)
        return [c for c in _CHECKS if c.name in options.checks]

    def check_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in _CHECKS)

    def context(
        self, fn: Callable[..., Any], name: str, config: Any, options: ConformanceOptions
    ) -> CriticContext:
        takes = parameters(fn, (*CRITIC_INPUTS, *_INFO_FIELDS, "step"))
        if "values" not in takes:
            raise Verdict(
                f"{name!r} has no 'values' parameter; a marked critic step takes the "
                f"micro-batch's keyword tensors among {', '.join(CRITIC_INPUTS)} and StepInfo "
                "fields"
            )
        return CriticContext(fn=fn, name=name, options=options, config=config,
                             tolerance=tolerance_for(options), takes=takes,
                             wrap=options.distributed, world=options.world_size)  # fmt: skip

    def strategy(self, ctx: Any, check: KindCheck) -> st.SearchStrategy[Any]:
        family = check.domain if check.domain in _NEED else None
        drawn = value_batches(
            max_batch=min(8, ctx.options.max_batch),
            max_length=min(12, ctx.options.max_length),
            clip_range=ctx.reference.clip_range or 0.2,
            dtype=ctx.tolerance.input_dtype,
            padding="nan" if ctx.options.padding_nan else "garbage",
        )
        world: int | None = ctx.world if ctx.wrap is not None else None

        def _steps(draw: st.DrawFn) -> StepInputs:
            batch = draw(drawn).as_kwargs()
            lengths = batch["response_mask"].sum(dim=1).tolist()
            fam = family  # the non-semantic checks: micro-batches or ranks, drawn
            if fam is None and len(lengths) >= 2:
                fam = draw(choice(("micro-batches", "data-parallel")))
            if fam is None or len(lengths) < _NEED[fam]:
                fam = "full-batch"  # too few rows: the family's check skips the step
            ranks, micro = FAMILY_SHAPES[fam]
            if world is not None and ranks > 1:
                ranks = world
            split = draw(splits(lengths, family=fam, max_ranks=ranks, max_micro_batches=micro))
            return StepInputs(batch, split if world is None else fold(split, world))

        return composite(_steps)

    def pool_key(self, ctx: Any, check: KindCheck) -> tuple[object, ...]:
        o = ctx.options
        return (check.domain, o.dtype, o.max_batch, o.max_length, o.padding_nan,
                ctx.reference.clip_range, ctx.wrap, ctx.world)  # fmt: skip

    def corpus(self, ctx: Any) -> dict[str, StepInputs]:
        fill = math.nan if ctx.options.padding_nan else 77.0
        dtype = ctx.tolerance.input_dtype

        def build() -> dict[str, StepInputs]:
            return {
                name: StepInputs(
                    critic_batch(lengths, dtype=dtype, padding=fill), split, label=name
                )
                for name, (lengths, split) in _corpus_splits().items()
            }

        return dict(_shared.cached_corpus(("critic", dtype, ctx.options.padding_nan), build))

    def diagnose(self, ctx: Any, inputs: Any) -> Diagnosis:
        return diagnose_critic(ctx, inputs, self.corpus(ctx))

    def snippet(self, ctx: Any, inputs: Any, check: KindCheck) -> str:
        return critic_snippet(ctx, inputs, check)

    def golden(self, ctx: Any) -> Tolerant:
        data: dict[str, dict[str, torch.Tensor]] = {}
        scales: dict[str, EntryScale] = {}
        for name, inp in self.corpus(ctx).items():
            kw = inp.as_kwargs()
            try:
                got = _accumulate(ctx.fn, inp.batch, inp.split, ctx.takes, ctx.options.loss,
                                  False)  # fmt: skip
            except Verdict as exc:
                raise Verdict(f"on canonical step {name!r}: {exc}") from exc
            _, grad = _reference(ctx, kw)
            loss_scale, grad_scale = _scales(ctx, kw, grad)
            own = got.grad.abs()
            n = int(inp.batch["response_mask"].sum())
            data[name] = {"loss": torch.tensor(got.loss, dtype=torch.float64), "grad": got.grad}
            scales[f"{name}/loss"] = EntryScale(max(loss_scale, abs(got.loss)), count=n)
            scales[f"{name}/grad"] = EntryScale(torch.maximum(grad_scale, own + own.max()),
                                                skip=_unjudged(ctx, kw))  # fmt: skip
        return Tolerant(data, tolerance=ctx.tolerance, scales=scales, corpus=1)


# ------------------------------------------------------------------------- diagnosis

_KNOWN = {"token-mean/micro-batch-sum": " (verl PR #6957's value loss)"}
"""Schemes a framework shipped, named beside the scheme's own text."""


def _per_token(ctx: CriticContext, batch: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """``l[b, t]`` and ``d l[b, t] / d V[b, t]`` in float64, 0 at padding."""
    mask = batch["response_mask"]
    val = batch["values"].detach().to(torch.float64).requires_grad_(True)
    per_token = value_loss_per_token(
        values=val,
        old_values=batch["old_values"].detach().to(torch.float64),
        returns=batch["returns"].detach().to(torch.float64),
        response_mask=mask,
        clip_range=ctx.reference.clip_range,
    )
    per_token = torch.where(mask, per_token, 0.0)
    (grad,) = torch.autograd.grad(per_token.sum(), val)
    return per_token.detach(), grad.detach()


def _scheme_error(ctx: CriticContext, scheme: Scheme, inp: StepInputs, got: Critic) -> float:
    """How far (in tolerances) the step is from ``scheme``: each row's per-token loss
    weighted by the scheme's coefficient for that row under the split."""
    kw = inp.as_kwargs()
    mask = inp.batch["response_mask"]
    per_token, grad = _per_token(ctx, kw)
    c = scheme.weights(row_facts(mask, inp.split))
    _, ref_grad = _reference(ctx, kw)
    loss_scale, grad_scale = _scales(ctx, kw, ref_grad)
    where = mask & ~_unjudged(ctx, kw)
    err = ctx.tolerance.tensor(got.grad, c[:, None] * grad, grad_scale * 2.0, where)[0].error
    value = float((c * per_token.sum(dim=1)).sum())
    n = int(mask.sum())
    return max(err, ctx.tolerance.value(got.loss, value, loss_scale * 2.0, n).error)


def diagnose_critic(
    ctx: CriticContext, inputs: StepInputs | None, corpus: Mapping[str, StepInputs]
) -> Diagnosis:
    """Which scaling scheme (:mod:`.._accumulation`, token-mean candidates) the critic step
    matches on the canonical steps and the failing one."""
    cases = dict(corpus)
    if inputs is not None:
        cases["failing step"] = inputs
    candidates = schemes(Aggregation.TOKEN_MEAN, None)
    errors = dict.fromkeys(range(len(candidates)), 0.0)
    for label, inp in cases.items():
        try:
            got = _run(ctx, inp.as_kwargs())
        except Verdict as exc:
            return Diagnosis(f"no diagnosis: on {label!r}: {exc}", "")
        for i, scheme in enumerate(candidates):
            errors[i] = max(errors[i], _scheme_error(ctx, scheme, inp, got))
    best = min(errors, key=lambda i: errors[i])
    s = candidates[best]
    reference = f"the reference {ctx.options.reference_id!r} is {ctx.reference.describe()}"
    if errors[best] > 1.0:
        return Diagnosis(
            f"no registered scaling scheme matches (closest: {s.text}, {errors[best]:.3g}x "
            f"the tolerance); {reference}",
            "",
        )
    if s.correct:
        return Diagnosis(f"this critic step matches {s.text} (the reference) on the corpus",
                         s.key)  # fmt: skip
    return Diagnosis(
        f"this critic step matches {s.text}{_KNOWN.get(s.key, '')} on the canonical steps "
        f"(within tolerance); {reference}",
        s.key,
    )


def critic_snippet(ctx: CriticContext, inputs: StepInputs, check: KindCheck) -> str:
    """Standalone Python: the step as the kit runs it simulated (every micro-batch of the
    split, gradients in ``values`` / world_size summed), the float64 whole-step reference,
    and what ``check`` compared."""
    where = importable(ctx.fn, ctx.name)
    tensors = [n for n in CRITIC_INPUTS if n in ctx.takes]
    info = [n for n in _INFO_FIELDS if n in ctx.takes]
    definitions = [
        "",
        "",
        "def run(inputs):",
        '    """The critic step accumulated as the kit does (simulated ranks)."""',
        "    mask = inputs['response_mask']",
        "    cols = torch.arange(mask.shape[1])",
        "    grad = torch.zeros(mask.shape, dtype=torch.float64)",
        "    total, passed, before = 0.0, {}, {}",
        "    for r, rank in enumerate(split.infos(mask)):",
        "        for info in rank:",
        "            rows = torch.tensor(info.rows, dtype=torch.long)",
        "            width = int(torch.where(mask[rows], cols + 1, 0).max()) if info.rows else 0",
        f"            mb = {{n: inputs[n][rows][:, :width].clone() for n in {tensors!r}}}",
        "            mb['values'].requires_grad_(True)",
        "            here = f'rank {r} micro-batch {info.micro_batch}'",
        "            before.update({f'{here}: {k}': v.detach().clone() for k, v in mb.items()})",
        "            kw = dict(mb)",
        *[f"            kw[{n!r}] = info.{n}" for n in info],
        *(["            kw['step'] = info"] if "step" in ctx.takes else []),
        f"            out = {where.call}(**kw)",
        pick_line(ctx.options.loss, "loss", indent="            "),
        "            (g,) = torch.autograd.grad(out, mb['values'])",
        "            grad[rows, :width] += g.double() / split.world_size",
        "            total += out.item() / split.world_size",
        "            passed.update({f'{here}: {k}': v for k, v in mb.items()})",
        "    return torch.tensor(total, dtype=torch.float64), grad, passed, before",
        "",
        "",
        "def reference(inputs, out):",
        f'    """The float64 whole-step reference: {ctx.reference.describe()}."""',
        "    mask = inputs['response_mask']",
        "    values = inputs['values'].detach().double().requires_grad_(True)",
        "    per_token = value_loss_per_token(values=values,",
        "                                     old_values=inputs['old_values'].double(),",
        "                                     returns=inputs['returns'].double(),",
        f"                                     response_mask=mask, "
        f"clip_range={ctx.reference.clip_range!r})",
        "    loss = torch.where(mask, per_token, 0.0).sum() / mask.sum()",
        "    return loss.detach(), torch.autograd.grad(loss, values)[0]",
    ]
    mask = "inputs['response_mask']"
    if check.domain in _NEED:
        lines = [
            "",
            "out, grad, passed, before = run(inputs)",
            "expected, expected_grad = reference(inputs, out)",
            f"show('accumulated loss', out, 'whole-step reference', expected, {mask})",
            "show('accumulated gradient', grad, 'whole-step reference gradient', expected_grad,",
            f"     {mask})",
            "ratio = (grad * expected_grad).sum() / (expected_grad * expected_grad).sum()",
            "print('gradient / reference (least squares):', ratio.item())",
        ]
    elif check.name == "padding-values":
        fill = "float('nan')" if ctx.options.padding_nan else "-11.5"
        other = [
            f"other = {{k: torch.where({mask}, v, torch.full_like(v, {fill}))",
            f"         if k in {list(CRITIC_INPUTS[:3])!r} else v for k, v in inputs.items()}}",
        ]
        lines = check_lines("same", other=other, what="other values at padding")
    else:
        lines = check_lines("masked" if check.name == "masked-positions" else check.name)
    return kind_snippet(
        where,
        imports=[
            "from polgrad_reference.value import value_loss_per_token",
            "from pytest_polgrad.strategies import Split",
        ],
        inputs=inputs.to_snippet(),
        definitions=definitions,
        check=lines,
    )


KIND = CriticStepKind()
