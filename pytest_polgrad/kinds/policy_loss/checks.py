"""The catalogue of checks: each a small named property of a loss function over a batch.

A check either returns the worst error it saw (in units of its tolerance, ``<= 1``) or
raises :class:`CheckFailure` carrying the batch and the numbers side by side. Hypothesis
drives the batches and shrinks failures; see :mod:`pytest_polgrad.core.engine`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Hashable, Mapping

import torch

from polgrad_reference import (
    Aggregation,
    ISMode,
    MicroBatchScaling,
    PolicyLossConfig,
    RatioKind,
    SurrogateKind,
)
from pytest_polgrad.core.calls import Evaluation, FunctionUnderTest
from pytest_polgrad.core.kinds import SHARED_CALLS, CallStore, remember
from pytest_polgrad.core.options import ConformanceOptions
from pytest_polgrad.core.tolerance import Comparison, Tolerance
from pytest_polgrad.core.verdicts import CheckFailure, Verdict
from pytest_polgrad.kinds.policy_loss import snippet
from pytest_polgrad.kinds.policy_loss.oracle import Oracle, OracleResult

__all__ = ["CHECKS", "Check", "Context"]

Batch = Mapping[str, torch.Tensor]


@dataclasses.dataclass
class Context:
    """What every check needs: the function, the oracle, the tolerance, and running notes.

    ``name`` is the function's name as pytest collected it (module attribute, for reports
    and snippets; defaults to its ``__qualname__``). Once a check has failed on some batch
    (``failed``), notes that say "passes" are withdrawn and no longer added, so a note
    never contradicts the verdict.
    """

    fut: FunctionUnderTest
    oracle: Oracle
    tolerance: Tolerance
    options: ConformanceOptions
    worst: float = 0.0
    notes: set[str] = dataclasses.field(default_factory=set)
    name: str = ""
    failed: bool = False
    _passing_notes: set[str] = dataclasses.field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        if not self.name:
            self.name = self.fut.name

    @functools.cached_property
    def options_key(self) -> str:
        """``repr(options)``, once: equal options give equal keys in the call stores (the
        repr of the options costs more than the rest of a store lookup)."""
        return repr(self.options)

    @property
    def config(self) -> PolicyLossConfig:
        return self.oracle.config

    def expected(self, batch: Batch, *, grad: bool = True) -> OracleResult:
        return self.call_oracle(self.oracle, batch, grad=grad)

    def call_oracle(self, oracle: Oracle, batch: Batch, *, grad: bool = True) -> OracleResult:
        """``oracle`` on ``batch`` with the kink band of this context's tolerance."""
        eps, native = self.tolerance.kink_band
        return oracle(batch, kink_eps=eps, grad=grad, native_kinks=native)

    def record(self, cmp: Comparison, what: str) -> float:
        self.worst = max(self.worst, cmp.error)
        finest = self.tolerance.precisions[0]
        if cmp.ok and cmp.precision is not finest and not self.failed:
            why = (
                "arithmetic in the inputs' own precision, or a deviation within its rounding: "
                "a loss that upcasts is judged at float32 with strict=True"
                if cmp.precision is self.tolerance.input_dtype
                else "an internal downcast or an epsilon guard"
            )
            note = (
                f"{what}: consistent with {str(cmp.precision).removeprefix('torch.')} arithmetic, "
                f"not {str(finest).removeprefix('torch.')} ({why}); passes by default, fails "
                "with strict=True"
            )
            self.notes.add(note)
            self._passing_notes.add(note)
        return cmp.error

    def not_judged(self) -> float:
        """A batch the comparison cannot judge at this precision (a rollout-IS keep/drop
        decision within rounding of its band): counted, said in the notes, no error."""
        self.notes.add(
            "batches whose rollout-IS keep/drop decision lies within rounding distance of "
            f"its band at {str(self.tolerance.input_dtype).removeprefix('torch.')} are not "
            "judged by value/gradient (the loss jumps there)"
        )
        return 0.0

    def mark_failed(self) -> None:
        """A check failed: withdraw the notes that say it passes, and say what strict does
        with half-precision inputs (its failures at clip kinks look like other bugs)."""
        self.failed = True
        self.notes -= self._passing_notes
        tol = self.tolerance
        if tol.strict and tol.precisions[-1] is not tol.input_dtype:
            half = str(tol.input_dtype).removeprefix("torch.")
            self.notes.add(
                f"strict=True judges {half} inputs at float32, for a loss that upcasts: a loss "
                f"that computes in {half} fails it, first at the clip kinks its rounding "
                "moves (the diagnosis may then name another cause); drop strict=True for it"
            )


@dataclasses.dataclass(frozen=True)
class Check:
    """One named property, with everything known about it: adding a check is adding one
    entry to :data:`CHECKS` (and a case to ``tests/kinds/policy_loss/test_checks.py``).

    ``domain`` picks the batches; ``on_policy`` runs it on batches with ``old_logprobs =
    logprobs`` against REINFORCE; ``applies`` says whether the check is meaningful for a
    reference config and options (inapplicable checks generate no item); ``semantic``
    says a failure means 'computes other semantics', so the report runs a diagnosis;
    ``lines`` are its reproduction snippet's lines after the call of the function
    (:mod:`pytest_polgrad.kinds.policy_loss.snippet`; default: compare with the
    reference)."""

    name: str
    summary: str
    run: Callable[[Context, Batch], float]
    domain: str = "semantic"
    on_policy: bool = False
    applies: Callable[[PolicyLossConfig, ConformanceOptions], bool] = lambda cfg, opt: True
    semantic: bool = False
    lines: Callable[[Context], list[str]] = snippet.reference_compare


def _fmt(x: float) -> str:
    return f"{x:.17g}" if math.isfinite(x) else str(x)


def _tracked(run: Callable[[Context, Batch], float]) -> Callable[[Context, Batch], float]:
    """``run`` that marks the context failed (:meth:`Context.mark_failed`) when it raises."""

    @functools.wraps(run)
    def tracked(ctx: Context, batch: Batch) -> float:
        try:
            return run(ctx, batch)
        except (CheckFailure, Verdict):
            ctx.mark_failed()
            raise

    return tracked


def _require_finite_loss(ev: Evaluation) -> None:
    if not math.isfinite(float(ev.loss)):
        raise Verdict(f"the function returned {ev.loss.item()} for a valid batch")


def _first_positions(where: torch.Tensor, k: int = 4) -> list[tuple[int, ...]]:
    """The first ``k`` indices where ``where`` is true, as tuples (for report tables)."""
    return [tuple(p) for p in where.nonzero()[:k].tolist()]


def _worst_entries(
    ratios: torch.Tensor, expected: torch.Tensor, actual: torch.Tensor, k: int = 4
) -> list[tuple[tuple[int, ...], float, float]]:
    flat = torch.nan_to_num(ratios, nan=math.inf).flatten()
    top = flat.topk(min(k, flat.numel())).indices
    out = []
    for i in top.tolist():
        if flat[i] <= 1.0:
            break
        pos = tuple(int(p) for p in torch.unravel_index(torch.tensor(i), ratios.shape))
        out.append((pos, float(expected[pos]), float(actual[pos])))
    return out


def evaluate(ctx: Context, batch: Batch) -> Evaluation:
    """``ctx.fut.call(batch)``: loss and gradient. While the engine screens the corpus and
    the pool with a store (:data:`~pytest_polgrad.core.kinds.SHARED_CALLS`), one call per
    (function, options, batch tensors) serves every check that compares a plain call on
    that batch (value, gradient, masked positions, the first call of padding-values,
    padding-columns, micro-batch and deterministic). An entry goes when a batch tensor is
    freed, and holds the function, so that its id is not reused meanwhile. Without a store
    the function is called afresh."""
    store = SHARED_CALLS.get()
    if store is None:
        return ctx.fut.call(batch)
    key, tensors = _call_key(ctx, batch, "shared")
    found = _stored(store, ctx, key, pop=False)
    if found is not None:
        return found
    ev = ctx.fut.call(batch)
    _store(store, ctx, key, tensors, ev)
    return ev


def _call_key(
    ctx: Context, batch: Batch, tag: str
) -> tuple[tuple[Hashable, ...], tuple[torch.Tensor, ...]]:
    """The store key of the ``tag`` call of this function on ``batch`` (ids of the batch
    tensors, which :func:`remember` keeps valid), and those tensors."""
    tensors = tuple(batch[k] for k in sorted(batch))
    return (tag, id(ctx.fut.fn), ctx.options_key, *map(id, tensors)), tensors


def _stored(
    store: CallStore, ctx: Context, key: tuple[Hashable, ...], *, pop: bool
) -> Evaluation | None:
    """This function's call under ``key`` in ``store`` (None if not there)."""
    hit = store.pop(key, None) if pop else store.get(key)
    if hit is not None and hit[0] is ctx.fut.fn:
        found: Evaluation = hit[1]
        return found
    return None


def _store(
    store: CallStore,
    ctx: Context,
    key: tuple[Hashable, ...],
    tensors: tuple[torch.Tensor, ...],
    ev: Evaluation,
) -> None:
    remember(store, key, (ctx.fut.fn, dataclasses.replace(ev, inputs={}, before=None)), tensors)


def _value_of(ctx: Context, batch: Batch) -> Evaluation:
    """The value check's call: the shared one when the function is differentiable, else
    (or with nothing shared) a value-only call, so that a function that is not
    differentiable still gets a verdict on its value alone."""
    if SHARED_CALLS.get() is not None:
        try:
            return evaluate(ctx, batch)
        except Verdict:
            pass
    return ctx.fut.call(batch, grad=False)


def check_value(ctx: Context, batch: Batch) -> float:
    ev = _value_of(ctx, batch)
    _require_finite_loss(ev)
    ref = ctx.expected(batch, grad=False)
    if ref.undecided:
        return ctx.not_judged()
    actual = float(ev.loss)
    cmp = ctx.tolerance.value(
        actual, ref.loss, ref.value_scale, ref.n_tokens, native_scale=ref.value_scale_native
    )
    if not cmp.ok:
        size = (
            f"{cmp.error:.3g}x the tolerance"
            if math.isfinite(cmp.error)
            else "the reference's every term is exactly 0"
        )
        raise CheckFailure(
            f"loss differs from the reference by {abs(actual - ref.loss):.3g} ({size})",
            numbers=[("loss", _fmt(ref.loss), _fmt(actual))],
            error=cmp.error,
        )
    return ctx.record(cmp, "value")


def _compare_grad(
    ctx: Context, batch: Batch, ev: Evaluation, ref: OracleResult, what: str
) -> float:
    assert ev.grad is not None
    clear = ref.clear
    cmp, ratios = ctx.tolerance.tensor(
        ev.grad, ref.grad, ref.grad_scale, clear, native_scale=ref.grad_scale_native
    )
    if ref.kinked:  # at a kink only finiteness is required
        kinks = ref.ambiguous & ~torch.isfinite(ev.grad)
        if bool(kinks.any()):
            cmp = Comparison(False, math.inf, cmp.precision)
            ratios = torch.where(kinks, math.inf, ratios)
    if not cmp.ok:
        n_bad = int((ratios > 1).sum())
        zero = clear & (ref.grad_scale == 0) & torch.isinf(ratios) & torch.isfinite(ev.grad)
        if bool(zero.any()):
            message = (
                f"{what} is nonzero at {int(zero.sum())} response position(s) where the "
                "reference's is exactly 0 (no rounding can make it nonzero there)"
            )
        else:
            message = (
                f"{what} differs from the reference at {n_bad} response position(s), worst "
                f"by {cmp.error:.3g}x the tolerance"
            )
        raise CheckFailure(
            message,
            entries=_worst_entries(ratios, ref.grad, ev.grad.to(torch.float64)),
            error=cmp.error,
        )
    return ctx.record(cmp, what)


def check_gradient(ctx: Context, batch: Batch) -> float:
    ev = evaluate(ctx, batch)
    _require_finite_loss(ev)
    ref = ctx.expected(batch)
    if ref.undecided:
        return ctx.not_judged()
    return _compare_grad(ctx, batch, ev, ref, "d loss / d logprobs")


def check_masked_positions(ctx: Context, batch: Batch) -> float:
    ev = evaluate(ctx, batch)
    assert ev.grad is not None
    pad = ~batch["response_mask"]
    bad = pad & (ev.grad != 0)
    if bool(bad.any()):
        pos = _first_positions(bad)
        raise CheckFailure(
            f"the gradient is not exactly zero at {int(bad.sum())} padding position(s)",
            entries=[(p, 0.0, float(ev.grad[p])) for p in pos],
        )
    return 0.0


def _regarbage(batch: Batch, seed: int, nan: bool) -> dict[str, torch.Tensor]:
    """The same batch with different values at padding (NaN when ``nan``)."""
    mask = batch["response_mask"]
    g = torch.Generator().manual_seed(seed)
    out = dict(batch)
    for name, t in batch.items():
        if not t.is_floating_point() or t.dim() != 2:
            continue
        noise = (torch.rand(t.shape, generator=g, dtype=torch.float64) * -20).to(t.dtype)
        fill = torch.full_like(t, math.nan) if nan else noise
        out[name] = torch.where(mask, t, fill)
    return out


def _mass_ratio(ref: OracleResult, grad: torch.Tensor) -> float:
    """``sum |grad| / sum |ref.grad|`` over ``ref.clear``: how much larger the function's own
    loss is than the reference's (1 when the reference's gradient vanishes there)."""
    ref_mass = ref.clear_mass
    own = float(torch.where(ref.clear, grad.abs(), 0.0).sum())
    return own / ref_mass if ref_mass > 0 and math.isfinite(own) else 1.0


def _same_result(
    ctx: Context, batch: Batch, a: Evaluation, b: Evaluation, what: str, width: int
) -> float:
    """Compare two evaluations of the function itself: both carry rounding error (hence the
    factor 2), and the scale is the larger of the reference's and the function's own
    magnitude (a loss 1000x the reference's rounds 1000x more). Tokens at a clip kink may
    take either branch in each evaluation; there only finiteness is required."""
    ref = ctx.expected(batch)
    la, lb = float(a.loss), float(b.loss)
    assert a.grad is not None and b.grad is not None
    ga, gb = a.grad.to(torch.float64), b.grad[:, :width].to(torch.float64)
    mask = batch["response_mask"]
    clear = ref.clear
    k = _mass_ratio(ref, ga)
    own = max(abs(la), abs(lb)) if math.isfinite(la) and math.isfinite(lb) else 0.0
    cmp = ctx.tolerance.value(
        lb,
        la,
        2.0 * max(ref.value_scale, k * ref.value_scale, own),
        ref.n_tokens,
        native_scale=2.0 * max(ref.value_scale_native, k * ref.value_scale_native, own),
    )
    if not cmp.ok:
        raise CheckFailure(
            f"the loss changes when {what}",
            numbers=[("loss", _fmt(la), _fmt(lb))],
            error=cmp.error,
        )
    assert ref.cond is not None and ref.cond_native is not None
    assert ref.grad_scale_native is not None
    own_g = torch.where(mask, ga.abs(), 0.0)
    own_g = own_g + own_g.amax(dim=1, keepdim=True)
    cmp2, ratios = ctx.tolerance.tensor(
        gb,
        ga,
        2.0 * torch.maximum(ref.grad_scale, own_g * ref.cond),
        clear,
        native_scale=2.0 * torch.maximum(ref.grad_scale_native, own_g * ref.cond_native),
    )
    if ref.kinked:  # at a kink only finiteness is required
        kinks = ref.ambiguous & ~(torch.isfinite(gb) & torch.isfinite(ga))
        if bool(kinks.any()):
            cmp2 = Comparison(False, math.inf, cmp2.precision)
            ratios = torch.where(kinks, math.inf, ratios)
    if not cmp2.ok:
        raise CheckFailure(
            f"the gradient changes when {what}",
            entries=_worst_entries(ratios, ga, gb),
            error=cmp2.error,
        )
    ctx.record(cmp, "value")
    return max(cmp.error, ctx.record(cmp2, "gradient"))


def check_padding_values(ctx: Context, batch: Batch) -> float:
    first = evaluate(ctx, batch)
    _require_finite_loss(first)
    other = _regarbage(batch, seed=1234, nan=ctx.options.padding_nan)
    second = ctx.fut.call(other)
    what = "only the values at padding change" + (" (to NaN)" if ctx.options.padding_nan else "")
    return _same_result(ctx, batch, first, second, what, batch["response_mask"].shape[1])


def _widen(batch: Batch, extra: int) -> dict[str, torch.Tensor]:
    """Append ``extra`` padding columns (mask False, finite garbage values)."""
    out = {}
    for name, t in batch.items():
        if t.dim() != 2:
            out[name] = t
            continue
        if t.dtype == torch.bool:
            pad = torch.zeros(t.shape[0], extra, dtype=torch.bool)
        else:
            pad = torch.full((t.shape[0], extra), -7.0, dtype=t.dtype)
        out[name] = torch.cat([t, pad], dim=1)
    return out


def check_padding_columns(ctx: Context, batch: Batch) -> float:
    first = evaluate(ctx, batch)
    _require_finite_loss(first)
    width = batch["response_mask"].shape[1]
    second = ctx.fut.call(_widen(batch, width + 3))
    return _same_result(
        ctx, batch, first, second, f"{width + 3} padding columns are appended", width
    )


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise 'same value', NaN equal to NaN (a write of the same value is no change)."""
    return (a == b) | (torch.isnan(a) & torch.isnan(b))


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether :func:`_bitwise_equal` holds everywhere: ``torch.equal`` first (one call, the
    common case), the NaN-aware comparison only when it says no."""
    if a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b):
        return True
    return bool(_bitwise_equal(a, b).all())


def check_inputs_unchanged(ctx: Context, batch: Batch) -> float:
    ev = ctx.fut.call(batch, snapshot=True)
    assert ev.before is not None
    store = SHARED_CALLS.get()
    if store is not None:  # a fresh call on the batch: the deterministic check's second
        _store(store, ctx, *_call_key(ctx, batch, "fresh"), ev)
    for name, before in ev.before.items():
        after = ev.inputs[name].detach()
        if after.shape != before.shape or after.dtype != before.dtype:
            raise CheckFailure(f"the function resized or re-typed its input {name} in place")
        if _same_values(after, before):
            continue
        changed = ~_bitwise_equal(after, before)
        if bool(changed.any()):
            pos = _first_positions(changed)
            raise CheckFailure(
                f"the function modified its input {name} in place at {int(changed.sum())} "
                f"position(s) (layout {ctx.options.layout!r})",
                entries=[(p, float(before[p]), float(after[p])) for p in pos],
                columns=("before", "after"),
            )
    return 0.0


def check_deterministic(ctx: Context, batch: Batch) -> float:
    """Two calls of the function on ``batch`` agree bitwise. The first is the shared call
    of the other checks when there is one (:func:`evaluate`): it is still a separate call,
    made earlier; the second is another call of its own: the inputs-unchanged check's, when
    that check ran on the batch with the same store, else a new one."""
    store = SHARED_CALLS.get()
    a = evaluate(ctx, batch)
    b = None if store is None else _stored(store, ctx, _call_key(ctx, batch, "fresh")[0], pop=True)
    b = ctx.fut.call(batch) if b is None else b
    assert a.grad is not None and b.grad is not None
    if not _same_values(a.loss, b.loss):
        raise CheckFailure(
            "two calls on the same batch return different losses",
            numbers=[("loss (1st call, 2nd call)", _fmt(float(a.loss)), _fmt(float(b.loss)))],
        )
    diff = None if _same_values(a.grad, b.grad) else ~_bitwise_equal(a.grad, b.grad)
    if diff is not None and bool(diff.any()):
        pos = _first_positions(diff)
        raise CheckFailure(
            "two calls on the same batch give different gradients",
            entries=[(p, float(a.grad[p]), float(b.grad[p])) for p in pos],
        )
    return 0.0


def _past_range(ctx: Context, batch: Batch, ev: Evaluation) -> bool:
    """Whether the inputs' dtype cannot hold what a correct loss computes on ``batch``: the
    reference's loss, or its gradient wherever the function's is non-finite, lies beyond
    the dtype's largest value (a float16 result of 1e5 is inf whatever computed it); or,
    when arithmetic in that dtype is accepted, the reference's per-token terms (policy
    and KL) sum beyond it (a float16 token-sum overflows). The extreme domain keeps float32
    and bfloat16 results below 1e34 (3.4e38 is their limit): in practice float16 only."""
    dtype = ctx.tolerance.input_dtype
    big = torch.finfo(dtype).max
    ref = ctx.expected(batch)
    assert ev.grad is not None
    bad = ~torch.isfinite(ev.grad)
    loss_beyond = bool(torch.isfinite(ev.loss)) or abs(ref.loss) > big
    if loss_beyond and bool((ref.grad[bad].abs() > big).all()):  # all() of none is True
        return True
    return dtype in ctx.tolerance.precisions and _term_mass(ctx, batch) > big


def _term_mass(ctx: Context, batch: Batch) -> float:
    """``sum_t |l_t| + |kl_t|`` over the response tokens: the largest value a token-sum of
    the reference's per-token terms reaches."""
    out = ctx.oracle.reference(batch)
    mask = out.response_mask
    mass = torch.where(mask, out.token_loss.abs(), 0.0).sum()
    if out.kl is not None:
        mass = mass + torch.where(mask, out.kl.abs(), 0.0).sum()
    return float(mass)


def check_extreme_finite(ctx: Context, batch: Batch) -> float:
    ev = ctx.fut.call(batch)
    assert ev.grad is not None
    finite = bool(torch.isfinite(ev.loss)) and bool(torch.isfinite(ev.grad).all())
    if not finite and _past_range(ctx, batch, ev):
        dtype = str(ctx.tolerance.input_dtype).removeprefix("torch.")
        ctx.notes.add(
            f"extreme-domain batches on which a correct loss exceeds {dtype}'s largest value "
            f"({torch.finfo(ctx.tolerance.input_dtype).max:g}) are not judged for finiteness"
        )
        return 0.0
    if not bool(torch.isfinite(ev.loss)):
        raise CheckFailure(
            f"the loss is {float(ev.loss)} on a valid input",
            numbers=[("loss", "finite", str(float(ev.loss)))],
        )
    bad = ~torch.isfinite(ev.grad)
    if bool(bad.any()):
        pos = _first_positions(bad)
        raise CheckFailure(
            f"the gradient is non-finite at {int(bad.sum())} position(s) on a valid input",
            numbers=[(f"d loss / d logprobs{p}", "finite", str(float(ev.grad[p]))) for p in pos],
        )
    return 0.0


def _decomposable(cfg: PolicyLossConfig, opt: ConformanceOptions) -> bool:
    """Aggregations whose full-batch loss is the scaled sum of one-row micro-batch losses."""
    ok = {
        Aggregation.SEQ_MEAN_TOKEN_MEAN,
        Aggregation.SEQ_MEAN_TOKEN_SUM,
        Aggregation.TOKEN_SUM_NORM,
        Aggregation.TOKEN_SUM,
    }
    kl_agg = cfg.kl.aggregation if cfg.kl is not None and cfg.kl.aggregation else cfg.aggregation
    masked_is = cfg.is_correction is not None and cfg.is_correction.mode is ISMode.MASK
    return (
        cfg.aggregation in ok
        and kl_agg in ok
        and not masked_is
        and not cfg.couples_rows  # Clip-Cov / KL-Cov select tokens over the whole batch
        and opt.layout != "packed"
    )


def _scaling(cfg: PolicyLossConfig) -> MicroBatchScaling:
    if cfg.aggregation is Aggregation.TOKEN_SUM:
        return MicroBatchScaling.SUM
    return MicroBatchScaling.MEAN


def check_micro_batch(ctx: Context, batch: Batch) -> float:
    full = evaluate(ctx, batch)
    _require_finite_loss(full)
    rows = batch["response_mask"].shape[0]
    scale = 1.0 if _scaling(ctx.config) is MicroBatchScaling.SUM else 1.0 / rows
    total = 0.0  # accumulated in float64, whatever the function computes in
    grads = []
    for b in range(rows):
        part = ctx.fut.call({k: v[b : b + 1] for k, v in batch.items()})
        _require_finite_loss(part)
        total += float(part.loss) * scale
        assert part.grad is not None
        grads.append(part.grad.to(torch.float64) * scale)
    accumulated = Evaluation(torch.tensor(total, dtype=torch.float64), torch.cat(grads), {}, None)
    return _same_result(
        ctx,
        batch,
        full,
        accumulated,
        f"the batch is split into {rows} one-row micro-batches and their losses are "
        f"accumulated with {_scaling(ctx.config).value} scaling",
        batch["response_mask"].shape[1],
    )


def _ratio_based(cfg: PolicyLossConfig, opt: ConformanceOptions) -> bool:
    """Ratio-based surrogates whose on-policy gradient is the policy gradient (not
    REINFORCE itself, nor Clip-Cov, which drops its selected tokens)."""
    return cfg.surrogate is not SurrogateKind.REINFORCE and cfg.on_policy_is_policy_gradient


def _row_pooled(cfg: PolicyLossConfig) -> bool:
    """True when a token's on-policy gradient is its row's, not its own: a gradient that
    flows through the sequence ratio ``s_b = exp(mean_t lr_t)`` (pg_clip, pg, sapo with
    ``ratio='sequence'``) or GMPO's geometric mean. CISPO's ratio is a detached weight and
    ``sequence_token`` keeps each token's own gradient, so they stay per token."""
    through_seq = cfg.surrogate in (SurrogateKind.PG_CLIP, SurrogateKind.PG, SurrogateKind.SAPO)
    return cfg.surrogate is SurrogateKind.GMPO or (through_seq and cfg.ratio is RatioKind.SEQUENCE)


def _pool_rows(ref: OracleResult, own: OracleResult, batch: Batch, gmpo: bool) -> OracleResult:
    """REINFORCE's gradient ``g`` pooled over each row: ``(1/L_b) sum_t g[b, t]`` at every
    response token of row ``b`` (GMPO: 0 where ``A_t = 0``, whose clipped log-ratio is 0).
    With row-constant advantages this is ``g`` itself (the weights are row-constant). The
    scales are pooled alike, and are at least those of the reference itself on this batch
    (``own``: the sequence ratio's rounding); a row with an ambiguous token is ambiguous
    throughout."""
    mask = batch["response_mask"]
    lengths = mask.sum(dim=1, keepdim=True).clamp(min=1).to(torch.float64)
    where = mask
    if gmpo:
        adv = batch["advantages"]
        where = mask & ((adv[:, None] if adv.dim() == 1 else adv).expand_as(mask) != 0)

    def pooled(t: torch.Tensor) -> torch.Tensor:
        row = torch.where(mask, t, 0.0).sum(dim=1, keepdim=True) / lengths
        return torch.where(where, row.expand_as(t), 0.0)

    ambiguous = (ref.ambiguous & mask).any(dim=1, keepdim=True).expand_as(mask) & mask
    native = None
    if ref.grad_scale_native is not None:
        native = pooled(ref.grad_scale_native)
        if own.grad_scale_native is not None:
            native = torch.maximum(native, own.grad_scale_native)
    return dataclasses.replace(
        ref,
        grad=pooled(ref.grad),
        grad_scale=torch.maximum(pooled(ref.grad_scale), own.grad_scale),
        grad_scale_native=native,
        ambiguous=ambiguous,
        clear=mask & ~ambiguous,
    )


def check_on_policy(ctx: Context, batch: Batch) -> float:
    """On-policy (old = logprobs, every gate, clip and weight 1), a ratio-based surrogate
    has REINFORCE's gradient ``g``, token by token. Through a sequence ratio
    ``s_b = exp(mean_t lr_t)`` (GSPO, LUSPO) or GMPO's geometric mean every token of a row
    gets the row's mean ``(1/L_b) sum_t g[b, t]`` instead, which is ``g`` only when the
    advantages are constant along the row (the aggregation weights always are):
    ``d/d lr_u sum_t w_b A_t s_b = (w_b / L_b) sum_t A_t`` at ``s_b = 1``."""
    ev = ctx.fut.call(batch)
    _require_finite_loss(ev)
    # the same class as the context's oracle: its per-batch cache serves every function
    reinforce = dataclasses.replace(
        ctx.oracle,
        config=ctx.config.replace(surrogate=SurrogateKind.REINFORCE, ratio=RatioKind.TOKEN),
    )
    ref = ctx.call_oracle(reinforce, batch)
    if ref.undecided:
        return ctx.not_judged()
    what = "on-policy gradient (expected: REINFORCE's)"
    if _row_pooled(ctx.config):
        own = ctx.expected(batch)  # its scales carry the sequence mean's rounding
        ref = _pool_rows(ref, own, batch, ctx.config.surrogate is SurrogateKind.GMPO)
        what = "on-policy gradient (expected: REINFORCE's, averaged over each row)"
    return _compare_grad(ctx, batch, ev, ref, what)


CHECKS: dict[str, Check] = {
    c.name: c
    for c in (
        Check(
            "value",
            "the loss equals the float64 reference",
            _tracked(check_value),
            semantic=True,
        ),
        Check(
            "gradient",
            "d loss / d logprobs equals the reference's",
            _tracked(check_gradient),
            semantic=True,
        ),
        Check(
            "masked-positions",
            "the gradient is exactly zero at every padding position",
            _tracked(check_masked_positions),
        ),
        Check(
            "padding-values",
            "loss and gradient do not depend on the values at padding",
            _tracked(check_padding_values),
            lines=snippet.padding_values_lines,
        ),
        Check(
            "padding-columns",
            "loss and gradient do not change when padding columns are appended",
            _tracked(check_padding_columns),
            applies=lambda cfg, opt: opt.layout != "packed",
            semantic=True,
            lines=snippet.padding_columns_lines,
        ),
        Check(
            "inputs-unchanged",
            "no input tensor is modified (values compared, padding included)",
            _tracked(check_inputs_unchanged),
            lines=snippet.inputs_unchanged_lines,
        ),
        Check(
            "deterministic",
            "two calls on the same batch agree bitwise",
            _tracked(check_deterministic),
            lines=snippet.deterministic_lines,
        ),
        Check(
            "extreme-finite",
            "loss and gradient are finite on valid extreme-domain input",
            _tracked(check_extreme_finite),
            domain="extreme",
            lines=snippet.extreme_finite_lines,
        ),
        Check(
            "micro-batch",
            "accumulating one-row micro-batch losses gives the full-batch loss and gradient",
            _tracked(check_micro_batch),
            applies=_decomposable,
            semantic=True,
            lines=snippet.micro_batch_lines,
        ),
        Check(
            "on-policy",
            "with old_logprobs == logprobs the gradient is REINFORCE's",
            _tracked(check_on_policy),
            on_policy=True,
            applies=_ratio_based,
            semantic=True,
            lines=snippet.on_policy_lines,
        ),
    )
}
"""Every check of the policy-loss kind, by name, in report order."""
