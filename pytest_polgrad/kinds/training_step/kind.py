"""The training-step kind: the trainer's micro-batch / accumulation / data-parallel scaling.

Convention. The marked function computes the loss of ONE micro-batch, the one a trainer
calls ``backward()`` on::

    @pytest.mark.polgrad_conforms("dapo", kind="training_step")
    def step(logprobs, old_logprobs, advantages, response_mask, global_tokens, world_size):
        per_token = my_surrogate(logprobs, old_logprobs, advantages)
        return (per_token * response_mask).sum() / global_tokens * world_size

It receives the micro-batch's keyword tensors (right-padded to the micro-batch's longest
row, as dynamic batching does) and, by name, any :class:`~pytest_polgrad.strategies.StepInfo`
field (``global_tokens``, ``rank_tokens``, ``gradient_accumulation_steps``, ``world_size``,
``rank``, ``steps_per_generation``, ``generation_tokens``, ...) or ``step`` (the whole
:class:`StepInfo`). It returns the loss, or ``None`` after calling ``backward()`` itself.

The kit calls it for every micro-batch of every rank of one optimizer step, sums the
gradients per rank as autograd accumulation does, averages them over ranks as an
all-reduce MEAN does (DDP/FSDP), and compares the result, per token, with the gradient of
the marked algorithm's loss on the whole step (token-mean: the step's global token count,
DAPO arXiv:2503.14476 Eq. 8). The summed, rank-averaged loss must equal the full-batch loss.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from hypothesis import strategies as st

from polgrad_reference import PolicyLossConfig, get_algorithm, policy_loss
from pytest_polgrad.core.calls import ALIASES, _pick_loss
from pytest_polgrad.core.clock import charged
from pytest_polgrad.core.corpus import canonical_corpus, corpus_version
from pytest_polgrad.core.golden_format import EntryScale, Tolerant
from pytest_polgrad.core.kinds import CallStore, Diagnosis, Kind, KindCheck, remember
from pytest_polgrad.core.options import ConformanceOptions, MarkerError
from pytest_polgrad.core.snippets import (
    check_lines,
    config_import,
    config_source,
    importable,
    kind_snippet,
    pick_line,
)
from pytest_polgrad.core.verdicts import CheckFailure, Verdict
from pytest_polgrad.kinds._accumulation import Scheme, row_facts, schemes
from pytest_polgrad.kinds._packed import (
    call_in_layout,
    check_layout,
    for_layout,
    snippet_call,
    snippet_helper,
)
from pytest_polgrad.kinds._tokens import (
    Takes,
    TokenContext,
    as_passed,
    bitwise_equal,
    compare_tensor,
    compare_value,
    fmt,
    parameters,
    require_scalar,
    tolerance_for,
)
from pytest_polgrad.kinds.policy_loss.oracle import Oracle, OracleResult
from pytest_polgrad.kinds.training_step import empty as _empty
from pytest_polgrad.kinds.training_step import shared as _shared
from pytest_polgrad.kinds.training_step import terms as _terms
from pytest_polgrad.kinds.training_step.execute import (
    empty_hint,
    fold,
    on_process_group,
    run_distributed,
)
from pytest_polgrad.strategies._snippet import snippet as tensor_snippet
from pytest_polgrad.strategies._splits import Split, StepInfo

__all__ = ["KIND", "Accumulated", "StepInputs", "TrainingStepKind", "accumulate"]

TENSORS = ("logprobs", "old_logprobs", "advantages", "response_mask", "ref_logprobs",
           "rollout_logprobs")  # fmt: skip
INFO_FIELDS = tuple(f.name for f in dataclasses.fields(StepInfo))
_OVERRIDES = frozenset(
    {"eps_low", "eps_high", "dual_clip", "aggregation", "budget", "ratio", "surrogate", "kl",
     "is_correction", "clip"}
)  # fmt: skip


@dataclasses.dataclass(frozen=True, eq=False)
class StepInputs:
    """One optimizer step: the full batch (canonical tensors) and how it is split."""

    batch: Mapping[str, torch.Tensor]
    split: Split
    label: str = ""

    def as_kwargs(self) -> dict[str, Any]:
        return {**self.batch, "split": self.split}

    def to_snippet(self) -> str:
        body = tensor_snippet(self.batch.items(), comment="pytest-polgrad step: " + self.describe())
        return body.rstrip() + "\n" + f"split = {self.split.to_python()}\n"

    def describe(self) -> str:
        mask = self.batch["response_mask"]
        text = (
            f"B={mask.shape[0]}, T={mask.shape[1]}, response lengths {mask.sum(dim=1).tolist()}; "
            f"{self.split.describe()}"
        )
        return f"{self.label}: {text}" if self.label else text


@dataclasses.dataclass
class StepContext(TokenContext):
    oracle: Oracle | None = None
    wrap: str | None = None
    """``distributed=``: multi-rank splits run on a real ``ddp`` / ``fsdp`` process group."""
    world: int = 2

    @functools.cached_property
    def options_key(self) -> str:
        """``repr(options)``, once: the key of this function's shared accumulations."""
        return repr(self.options)

    @property
    def policy(self) -> PolicyLossConfig:
        assert isinstance(self.config, PolicyLossConfig)
        return self.config


@dataclasses.dataclass(frozen=True)
class Accumulated:
    """The step as the kit accumulated it: loss and ``d loss / d logprobs`` ``[B, T]``."""

    loss: float
    grad: torch.Tensor
    changed: tuple[str, ...] = ()
    """``"rank r micro-batch k: name"`` for every input the function wrote in place."""


@dataclasses.dataclass(frozen=True)
class _Piece:
    """One micro-batch of a split on one batch: its counts, where it is (for messages),
    rows (a long index), width (the micro-batch's longest response), mask ``[rows, width]``."""

    info: StepInfo
    where: str
    index: torch.Tensor
    width: int
    mask: torch.Tensor


_PIECES = CallStore()
"""(split, id of the mask) -> its :class:`_Piece` tuple, while the mask lives: the split
checks, padding-values' second run (same mask) and inputs-unchanged cut a step alike."""


def _pieces(split: Split, mask: torch.Tensor) -> tuple[_Piece, ...]:
    """The micro-batches of ``split`` on ``mask``, made once per (split, mask)."""
    key = (split, id(mask))
    hit: tuple[_Piece, ...] | None = _PIECES.get(key)
    if hit is not None:
        return hit
    cols = torch.arange(1, mask.shape[1] + 1)
    extent = torch.where(mask, cols, 0).amax(dim=1).tolist() if mask.numel() else []
    out = []
    for r, rank in enumerate(split.infos(mask)):
        for info in rank:
            rows = info.rows
            index = torch.tensor(rows, dtype=torch.long)
            width = max((extent[i] for i in rows), default=0)  # empty: [0, 0]
            where = f"rank {r} micro-batch {info.micro_batch} (rows {list(rows)})"
            out.append(_Piece(info, where, index, width, mask[index, :width]))
    made = tuple(out)
    remember(_PIECES, key, made, (mask,))
    return made


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Every element the same value, NaN equal to NaN (:func:`bitwise_equal`), with
    ``torch.equal``'s one pass first: it answers for any pair without NaN."""
    return torch.equal(a, b) or bool(bitwise_equal(a, b).all())


def accumulate(
    ctx: StepContext, inputs: Mapping[str, Any], *, snapshot: bool = False
) -> Accumulated:
    """Call the function on every micro-batch of the split; accumulate as a trainer does:
    ``grad[rows] = g_{r,k} / W`` and ``loss = sum_{r,k} loss_{r,k} / W`` (every row is in
    one micro-batch, so the sum of per-rank sums is a write per micro-batch)."""
    split: Split = inputs["split"]
    mask = inputs["response_mask"]
    tensors = [
        (n, t) for n in TENSORS if n in ctx.takes and isinstance(t := inputs.get(n), torch.Tensor)
    ]
    fields = [n for n in INFO_FIELDS if n in ctx.takes]
    grad = torch.zeros(mask.shape, dtype=torch.float64)
    total = 0.0
    changed: list[str] = []
    world = split.world_size
    for piece in _pieces(split, mask):
        info, where, index, width = piece.info, piece.where, piece.index, piece.width
        # one copy each: advanced indexing makes a fresh, contiguous tensor
        kwargs: dict[str, Any] = {
            n: (t[index, :width] if t.dim() == 2 else t[index]).detach() for n, t in tensors
        }
        lp = kwargs["logprobs"].requires_grad_(True)
        before = {k: v.detach().clone() for k, v in kwargs.items()} if snapshot else {}
        for name in fields:
            kwargs[name] = getattr(info, name)
        if "step" in ctx.takes:
            kwargs["step"] = info
        passed = as_passed(ctx.takes, kwargs)
        result = call_in_layout(ctx.options, ctx.fn, passed, piece.mask, where)
        if result is None:
            if lp.grad is None:
                raise Verdict(
                    f"{where}: the function returned None and left no gradient in "
                    "logprobs.grad; return the loss, or call backward() on it"
                )
            g, value = lp.grad, math.nan
        else:
            loss = require_scalar(_pick_loss(result, ctx.options.loss), where)
            if not loss.requires_grad:
                raise Verdict(f"{where}: the returned loss is not differentiable in logprobs")
            try:
                with charged():  # the backward through the function's loss is its own
                    (g_opt,) = torch.autograd.grad(loss, lp, allow_unused=True)
            except RuntimeError as exc:
                raise Verdict(f"{where}: backward through the returned loss failed: {exc}") from exc
            if g_opt is None:
                raise Verdict(f"{where}: the returned loss does not depend on logprobs")
            g, value = g_opt, float(loss.detach())
            if not math.isfinite(value):
                raise Verdict(
                    f"the function returned {value} for {where}, a valid input"
                    + empty_hint(info.micro_batch_tokens, info.rank_tokens)
                )
        g = g.detach().to(torch.float64)
        # 0 + g / W, as the accumulation into zeros was (x / 1 is x, bitwise)
        grad.narrow(1, 0, width).index_add_(0, index, g / world if world != 1 else g)
        total += value / world
        for name, old in before.items():
            new = kwargs[name].detach()
            if new.shape != old.shape or not _same(new, old):
                changed.append(f"{where}: {name}")
    return Accumulated(total, grad, tuple(changed))


def execute(ctx: StepContext, inputs: Mapping[str, Any], *, snapshot: bool = False) -> Any:
    """The step as the checks see it: :func:`accumulate`, or on a real process group for a
    multi-rank split under ``distributed=`` (same fields: ``loss``, ``grad``, ``changed``)."""
    if ctx.wrap is not None and on_process_group(ctx.wrap, inputs["split"]):
        return run_distributed(ctx, inputs, wrap=ctx.wrap, snapshot=snapshot)
    return accumulate(ctx, inputs, snapshot=snapshot)


# ------------------------------------------------------------------------------ checks


def _expected(ctx: StepContext, batch: Mapping[str, Any]) -> OracleResult:
    assert ctx.oracle is not None
    return _shared.expected(ctx.oracle, batch, ctx.tolerance.loosest)


def _shared_run(ctx: StepContext, inputs: Mapping[str, Any]) -> Any:
    """:func:`execute`, one run per (function, step, split) while the engine screens."""
    return _shared.reuse(ctx, inputs, lambda: execute(ctx, inputs))


def _family_check(family: str) -> Callable[[StepContext, Mapping[str, Any]], float]:
    """The check of one split family; steps of other families (from the corpus) are left
    to their own check, so a failure is reported under the split that breaks it."""

    def run(ctx: StepContext, inputs: Mapping[str, Any]) -> float:
        if inputs["split"].family != family:
            return 0.0
        return check_split(ctx, inputs)

    return run


def check_split(ctx: StepContext, inputs: Mapping[str, Any]) -> float:
    """Accumulated gradient (per token) and loss equal the full-batch reference's; a step
    returning several terms is judged term by term (:mod:`.terms`)."""
    judged = _terms.judge(ctx, inputs, execute, check_split, _policy_term)
    if judged is not None:
        return judged
    split: Split = inputs["split"]
    acc = _shared_run(ctx, inputs)
    ref = _expected(ctx, inputs)
    context = f" with the split {split.describe()}"
    if not bool(torch.isfinite(acc.grad).all()):
        raise Verdict(f"the accumulated gradient is not finite{context}")
    err = compare_tensor(  # ref.clear: the mask's response tokens off the kinks
        ctx, acc.grad, ref.grad, ref.grad_scale, ref.clear, "accumulated d loss / d logprobs",
        context,
    )  # fmt: skip
    if math.isnan(acc.loss):  # the function ran backward() itself and returned nothing
        return err
    return max(
        err,
        compare_value(ctx, acc.loss, ref.loss, ref.value_scale, ref.n_tokens,
                      "accumulated loss (summed over micro-batches, mean over ranks)", context),
    )  # fmt: skip


def _policy_term(ctx: StepContext) -> StepContext:
    """The ``"policy"`` term of a multi-term step, against the reference without its KL."""
    cfg = ctx.policy.replace(kl=None)
    options = dataclasses.replace(ctx.options, loss="policy")
    return dataclasses.replace(ctx, options=options, config=cfg, oracle=Oracle(cfg))


def check_masked_positions(ctx: StepContext, inputs: Mapping[str, Any]) -> float:
    acc = _shared_run(ctx, inputs)
    bad = ~inputs["response_mask"] & (acc.grad != 0)
    if bool(bad.any()):
        pos = [tuple(p) for p in bad.nonzero()[:4].tolist()]
        raise CheckFailure(
            f"the accumulated gradient is not exactly zero at {int(bad.sum())} padding "
            f"position(s) with the split {inputs['split'].describe()}",
            entries=[(p, 0.0, float(acc.grad[p])) for p in pos],
        )
    return 0.0


def check_padding_values(ctx: StepContext, inputs: Mapping[str, Any]) -> float:
    """Only the values at padding change (to NaN with ``padding_nan``): nothing else does."""
    mask = inputs["response_mask"]
    first = _shared_run(ctx, inputs)
    fill = math.nan if ctx.options.padding_nan else -11.5
    padding = ~mask
    other = {
        k: v.masked_fill(padding, fill)
        if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dim() == 2
        else v
        for k, v in inputs.items()
    }
    second = execute(ctx, other)
    ref = _expected(ctx, inputs)
    what = " when only the values at padding change" + (
        " (to NaN)" if ctx.options.padding_nan else ""
    )
    err = compare_tensor(
        ctx, second.grad, first.grad, ref.grad_scale, mask, "accumulated gradient", what
    )
    if math.isnan(first.loss) and math.isnan(second.loss):
        return err
    return max(err, compare_value(ctx, second.loss, first.loss, ref.value_scale, ref.n_tokens,
                                  "accumulated loss", what))  # fmt: skip


def check_inputs_unchanged(ctx: StepContext, inputs: Mapping[str, Any]) -> float:
    acc = execute(ctx, inputs, snapshot=True)
    _shared.keep_fresh(ctx, inputs, acc)  # deterministic's second run
    if acc.changed:
        raise CheckFailure(
            f"the function modified its inputs in place: {'; '.join(acc.changed[:4])}"
        )
    return 0.0


def check_deterministic(ctx: StepContext, inputs: Mapping[str, Any]) -> float:
    a = _shared_run(ctx, inputs)
    b = _shared.take_fresh(ctx, inputs) or execute(ctx, inputs)
    same_loss = (a.loss == b.loss) or (math.isnan(a.loss) and math.isnan(b.loss))
    if not same_loss or not _same(a.grad, b.grad):
        raise CheckFailure(
            "two runs of the same step give different results",
            numbers=[("loss (1st run, 2nd run)", fmt(a.loss), fmt(b.loss))],
        )
    return 0.0


def _prepare(family: str | None) -> Callable[[Any], Any]:
    """A pooled :class:`~.shared.StepBatch` as the step of ``family``'s split (None: the
    split the non-semantic checks share); a corpus step as it is."""

    def pick(item: Any) -> Any:
        if not isinstance(item, _shared.StepBatch):
            return item
        return StepInputs(item.batch, item.split_for(family))

    return pick


_CHECKS = (
    KindCheck("full-batch", "one rank, one micro-batch: loss and gradient equal the reference's",
              _family_check("full-batch"), domain="full-batch", prepare=_prepare("full-batch")),
    KindCheck("micro-batches", "micro-batches accumulated on one rank give the full-batch "
              "gradient and loss", _family_check("micro-batches"), domain="micro-batches",
              prepare=_prepare("micro-batches")),
    KindCheck("data-parallel", "ranks with different token counts, accumulated and "
              "all-reduce-averaged, give the full-batch gradient and loss",
              _family_check("data-parallel"), domain="data-parallel",
              prepare=_prepare("data-parallel")),
    KindCheck("generation-steps", "steps_per_generation != gradient_accumulation_steps still "
              "gives the optimizer step's full-batch gradient and loss",
              _family_check("generation-steps"), domain="generation-steps",
              prepare=_prepare("generation-steps")),
    KindCheck("masked-positions", "the accumulated gradient is exactly zero at padding",
              check_masked_positions, domain="any", semantic=False, prepare=_prepare(None)),
    KindCheck("padding-values", "the accumulated loss and gradient do not depend on the "
              "values at padding", check_padding_values, domain="any", semantic=False,
              prepare=_prepare(None)),
    KindCheck("inputs-unchanged", "no micro-batch input is modified in place",
              check_inputs_unchanged, domain="any", semantic=False, prepare=_prepare(None)),
    KindCheck("deterministic", "two runs of the same step agree bitwise", check_deterministic,
              domain="any", semantic=False, prepare=_prepare(None)),
)  # fmt: skip
_EMPTY_CHECK = _empty.check_of(check_split)
"""Opt-in (``checks=``): splits with empty micro-batches and ranks (:mod:`.empty`)."""


# -------------------------------------------------------------------------- corpus


def _corpus_splits() -> dict[str, tuple[str, Split]]:
    """Named (corpus batch, split): ragged rows of lengths 1, 3, 6, 8 cut every way."""
    return {
        "full-batch": ("ragged", Split((((0, 1, 2, 3),),))),
        "micro-batches": ("ragged", Split((((0,), (1, 2, 3)),))),
        "micro-batches-even": ("ragged", Split((((0, 1), (2, 3)),))),
        "one-row-each": ("one-token", Split((((0,), (1,), (2,)),))),
        "data-parallel": ("ragged", Split((((0,), (1,)), ((2,), (3,))))),
        "data-parallel-uneven": ("ragged", Split((((0, 1, 2),), ((3,),)))),
        "generation-double": (
            "ragged",
            Split((((0, 1), (2, 3)),), steps_per_generation=4, outside_tokens=11, outside_rows=4),
        ),
        "generation-half": ("ragged", Split((((0, 1), (2, 3)),), steps_per_generation=1)),
    }


# ------------------------------------------------------------------------------ kind


class TrainingStepKind(Kind):
    """See the module docstring."""

    name = "training_step"
    summary = (
        "(micro-batch logprobs, old_logprobs, advantages, response_mask, + StepInfo fields "
        "such as global_tokens, world_size) -> the micro-batch loss to backward()"
    )
    override_keys = _OVERRIDES

    def resolve(self, options: ConformanceOptions) -> PolicyLossConfig:
        ref = options.reference
        check_layout(self.name, options, _OVERRIDES)
        if options.layout == "packed" and options.distributed is not None:
            raise MarkerError("distributed= runs right-padded micro-batches; drop layout='packed'")
        if isinstance(ref, PolicyLossConfig):
            return ref.replace(**options.overrides) if options.overrides else ref
        if not isinstance(ref, str):
            raise MarkerError(
                f"reference must be a registry name or a PolicyLossConfig, got {ref!r}"
            )
        try:
            return get_algorithm(ref).derive(**options.overrides).loss
        except ValueError as exc:
            raise MarkerError(str(exc)) from exc

    def checks(self, config: Any, options: ConformanceOptions) -> list[KindCheck]:
        if options.checks is None:
            return for_layout(list(_CHECKS), options)
        opt_in = [_EMPTY_CHECK] if _empty.opted_in(options) else []  # only when named
        return for_layout([c for c in (*_CHECKS, *opt_in) if c.name in options.checks], options)

    def check(self, name: str) -> KindCheck | None:
        return _EMPTY_CHECK if name == _empty.EMPTY else None

    def corpus_for(self, ctx: Any, check: KindCheck) -> Mapping[str, Any]:
        if check.domain == _empty.EMPTY:
            return _empty.corpus(ctx, StepInputs)
        return self.corpus(ctx)

    def context(
        self, fn: Callable[..., Any], name: str, config: Any, options: ConformanceOptions
    ) -> StepContext:
        takes = parameters(fn, (*TENSORS, *INFO_FIELDS, "step"), ALIASES)
        if "logprobs" not in takes:
            raise Verdict(
                f"{name!r} has no 'logprobs' parameter; a marked training step takes the "
                f"micro-batch's keyword tensors among {', '.join(TENSORS)} and StepInfo fields"
            )
        if options.distributed is not None and _aliased(takes):
            raise MarkerError(
                f"{name!r} takes {sorted(_aliased(takes).values())}: distributed= passes the "
                f"inputs by their canonical names ({', '.join(sorted(_aliased(takes)))}); "
                "name the step's parameters so"
            )
        cfg: PolicyLossConfig = config
        notes = set()
        if cfg.kl_in_loss and "ref_logprobs" not in takes:
            cfg = cfg.replace(kl=None)
            notes.add("compared without the reference's as-loss KL term: the step takes no "
                      "ref_logprobs")  # fmt: skip
        return StepContext(
            fn=fn, name=name, options=options, config=cfg, tolerance=tolerance_for(options),
            takes=takes, notes=notes, oracle=Oracle(cfg), wrap=options.distributed,
            world=options.world_size,
        )  # fmt: skip

    def strategy(self, ctx: Any, check: KindCheck) -> st.SearchStrategy[Any]:
        if check.domain == _empty.EMPTY:
            return _empty.strategy(ctx, StepInputs)
        drawn = _shared.drawn_batches(ctx, *_shared.search_bounds(ctx.options))

        # one pool for every check: a batch and a split of each family (see .shared)
        world = None if ctx.wrap is None else ctx.world
        return _shared.step_batches(drawn, world=world, fold=fold)

    def extra_inputs(self, ctx: Any, check: KindCheck, seed: int) -> list[Any]:
        """The pool's realistic-size steps (deterministic in ``seed``; none for the
        opt-in empty-micro-batches check, which draws its own)."""
        if check.domain == _empty.EMPTY:
            return []
        world = None if ctx.wrap is None else ctx.world
        return list(_shared.realistic_steps(ctx, seed, world=world, fold=fold))

    def pool_key(self, ctx: Any, check: KindCheck) -> tuple[object, ...]:
        """Every check screens the same pooled steps (across functions, too)."""
        o, cfg = ctx.options, ctx.policy
        pooled = "steps" if check.prepare is not None else check.domain
        return (pooled, o.dtype, o.advantages, o.max_batch, o.max_length, o.padding_nan,
                cfg.clip, cfg.kl_in_loss, cfg.is_correction is not None) + (
            () if ctx.wrap is None else ("distributed", ctx.world)
        )  # fmt: skip

    def corpus(self, ctx: Any) -> dict[str, StepInputs]:
        dtype, advantages = ctx.tolerance.input_dtype, ctx.options.advantages

        def build() -> dict[str, StepInputs]:
            batches_ = canonical_corpus(dtype=dtype, advantages=advantages)
            return {
                name: StepInputs(batches_[source], split, label=name)
                for name, (source, split) in _corpus_splits().items()
            }

        return dict(_shared.cached_corpus((dtype, advantages), build))

    def diagnose(self, ctx: Any, inputs: Any) -> Diagnosis:
        return diagnose_step(ctx, inputs)

    def snippet(self, ctx: Any, inputs: Any, check: KindCheck) -> str:
        return step_snippet(ctx, inputs, check)

    def golden(self, ctx: Any) -> Tolerant:
        data: dict[str, dict[str, torch.Tensor]] = {}
        scales: dict[str, EntryScale] = {}
        for name, inp in self.corpus(ctx).items():
            try:
                acc = accumulate(ctx, inp.as_kwargs())
            except Verdict as exc:
                raise Verdict(f"on canonical step {name!r}: {exc}") from exc
            ref = _expected(ctx, inp.as_kwargs())
            own = acc.grad.abs()
            data[name] = {"loss": torch.tensor(acc.loss, dtype=torch.float64), "grad": acc.grad}
            scales[f"{name}/loss"] = EntryScale(max(ref.value_scale, abs(acc.loss) if
                                                    math.isfinite(acc.loss) else 0.0),
                                                count=ref.n_tokens)  # fmt: skip
            scales[f"{name}/grad"] = EntryScale(
                torch.maximum(ref.grad_scale, own + own.max()), skip=ref.ambiguous
            )
        return Tolerant(
            data,
            tolerance=ctx.tolerance,
            scales=scales,
            corpus=corpus_version(ctx.tolerance.input_dtype),
        )


# ------------------------------------------------------------------------- diagnosis


@dataclasses.dataclass(frozen=True)
class _Rows:
    """Per-row reference pieces: ``d sum_t l[b, t] / d logprobs`` and ``sum_t l[b, t]``."""

    jac: torch.Tensor
    values: torch.Tensor


def _rows(cfg: PolicyLossConfig, batch: Mapping[str, Any]) -> _Rows:
    x = {
        k: batch[k].detach().to(torch.float64) if batch[k].is_floating_point() else batch[k]
        for k in TENSORS
        if k in batch
    }
    lp = x["logprobs"].clone().requires_grad_(True)
    needed = {"logprobs": lp, "old_logprobs": x["old_logprobs"], "advantages": x["advantages"],
              "response_mask": x["response_mask"]}  # fmt: skip
    if cfg.kl_in_loss:
        needed["ref_logprobs"] = x["ref_logprobs"]
    if cfg.is_correction is not None:
        needed["rollout_logprobs"] = x["rollout_logprobs"]
    out = policy_loss(cfg, **needed)
    terms = out.token_loss if out.kl is None else out.token_loss + out.kl_coef * out.kl
    per_row = torch.where(out.response_mask, terms, 0.0).sum(dim=1)
    (jac,) = torch.autograd.grad(per_row.sum(), lp)
    return _Rows(jac.detach(), per_row.detach())


def _scheme_error(
    ctx: StepContext, scheme: Scheme, inp: StepInputs, acc: Accumulated, ref: OracleResult
) -> float:
    batch = inp.batch
    mask = batch["response_mask"]
    rows = _rows(ctx.policy, batch)
    c = scheme.weights(row_facts(mask, inp.split))
    grad = c[:, None] * rows.jac
    where = mask & ~ref.ambiguous
    err = ctx.tolerance.tensor(acc.grad, grad, ref.grad_scale * 2.0, where)[0].error
    if math.isfinite(acc.loss):
        value = float((c * rows.values).sum())
        err = max(
            err, ctx.tolerance.value(acc.loss, value, ref.value_scale * 2.0, ref.n_tokens).error
        )
    return err


def _factor(
    acc: Accumulated, ref: OracleResult, ctx: StepContext, mask: torch.Tensor
) -> float | None:
    """``c`` when the accumulated gradient is ``c`` times the reference's (``c != 1``)."""
    where = mask & ~ref.ambiguous
    g, r = acc.grad[where], ref.grad[where]
    denom = float((r * r).sum())
    if denom == 0.0:
        return None
    c = float((g * r).sum()) / denom
    if not math.isfinite(c) or abs(c - 1.0) < 1e-9 or c == 0.0:
        return None
    scale = ref.grad_scale * max(1.0, abs(c))
    ok = ctx.tolerance.tensor(acc.grad, c * ref.grad, scale, where)[0].ok
    return c if ok else None


def _meaning(c: float, split: Split) -> str:
    """What a uniform factor ``c`` usually means for this split."""
    k, w = split.gradient_accumulation_steps, split.world_size
    s = split.steps_per_generation
    assert s is not None
    known: list[tuple[float, str]] = []
    if k > 1:
        known += [
            (1.0 / k, "divided by the number of accumulation steps twice (or once where the "
                      "normaliser already covers the whole optimizer step)"),
            (float(k), "the division by the number of accumulation steps is missing"),
        ]  # fmt: skip
    if w > 1:
        known += [
            (1.0 / w, "the world-size factor is missing: the all-reduce MEAN divides every "
                      "gradient by the number of ranks"),
            (float(w), "multiplied by the world size twice"),
        ]  # fmt: skip
    if k > 1 and w > 1:
        known.append((1.0 / (k * w), "divided by the accumulation steps and the world size "
                                     "once too often"))  # fmt: skip
    if s != k:
        text = (
            f"normalised by the tokens of the generation batch (steps_per_generation={s} "
            f"micro-steps), not of one optimizer step (gradient_accumulation_steps={k})"
        )
        known += [(k / s, text), (s / k, text)]  # fmt: skip
    hits = []
    for value, text in known:
        if abs(c - value) <= 1e-6 * max(1.0, value) and text not in hits:
            hits.append(text)
    return "; or ".join(hits)


def diagnose_step(ctx: StepContext, inputs: StepInputs | None) -> Diagnosis:
    """Which scaling scheme the step matches on the corpus (and the failing step), and, when
    the gradient is a uniform multiple of the reference's, the factor and its usual cause."""
    kind = TrainingStepKind()
    cfg = ctx.policy
    cases = dict(kind.corpus(ctx))
    if inputs is not None:
        cases["failing step"] = inputs
    candidates = schemes(cfg.aggregation, cfg.budget)
    errors = dict.fromkeys(range(len(candidates)), 0.0)
    factor_text = ""
    for label, inp in cases.items():
        try:
            acc = execute(ctx, inp.as_kwargs())
        except Verdict as exc:
            return Diagnosis(f"no diagnosis: on {label!r}: {exc}", "")
        ref = _expected(ctx, inp.as_kwargs())
        for i, scheme in enumerate(candidates):
            errors[i] = max(errors[i], _scheme_error(ctx, scheme, inp, acc, ref))
        if label == "failing step" or not factor_text:
            c = _factor(acc, ref, ctx, inp.batch["response_mask"])
            if c is not None:
                meaning = _meaning(c, inp.split)
                factor_text = (
                    f"on {label!r} ({inp.split.describe()}) the gradient is {c:.6g}x the "
                    f"reference's" + (f": {meaning}" if meaning else "")
                )
    best = min(errors, key=lambda i: errors[i])
    reference = candidates[0].text
    ref_name = ctx.options.reference_id
    parts = []
    if errors[best] <= 1.0:
        s = candidates[best]
        if s.correct:
            parts.append(f"this step matches {s.text} (the reference) on the corpus")
        else:
            parts.append(
                f"this step matches {s.text} on the canonical steps (within tolerance); the "
                f"reference {ref_name!r} is {reference}"
            )
        match = s.key
    else:
        parts.append(
            f"no registered scaling scheme matches (closest: {candidates[best].text}, "
            f"{errors[best]:.3g}x the tolerance); the reference {ref_name!r} is {reference}"
        )
        match = ""
    if factor_text:
        parts.append(factor_text)
    return Diagnosis("; ".join(parts), match)


# --------------------------------------------------------------------------- snippet


def _aliased(takes: frozenset[str]) -> dict[str, str]:
    """Canonical name -> the step's own parameter name, for the inputs it takes by alias."""
    spelled = takes.spelled if isinstance(takes, Takes) else {}
    return {k: v for k, v in spelled.items() if k != v}


def _renamed(takes: frozenset[str], indent: str) -> list[str]:
    """The snippet line passing the inputs under the step's own parameter names (an
    alias such as ``log_probs``); none when it takes the canonical names."""
    renames = _aliased(takes)
    if not renames:
        return []
    return [f"{indent}kw = {{{renames!r}.get(k, k): v for k, v in kw.items()}}  # its names"]


def step_snippet(ctx: StepContext, inputs: StepInputs, check: KindCheck) -> str:
    """Standalone Python: the step as the kit runs it (the function on every micro-batch
    of the split, accumulated as a trainer does), the full-batch float64 reference, and
    what ``check`` compared."""
    where = importable(ctx.fn, ctx.name)
    tensors = [n for n in TENSORS if n in ctx.takes and n in inputs.batch]
    info = [n for n in INFO_FIELDS if n in ctx.takes]
    assert ctx.oracle is not None
    definitions = [
        *snippet_helper(ctx.options),
        "",
        "",
        f"config = {config_source(ctx.policy)}",
        "",
        "",
        "def run(inputs):",
        '    """The step as the kit accumulates it: the function on every micro-batch of',
        "    split (its rows, trimmed to its longest response), loss and gradient / world_size",
        '    summed over micro-batches and ranks (all-reduce mean of per-rank sums)."""',
        "    mask = inputs['response_mask']",
        "    cols = torch.arange(mask.shape[1])",
        "    grad = torch.zeros(mask.shape, dtype=torch.float64)",
        "    total, passed, before = 0.0, {}, {}",
        "    for r, rank in enumerate(split.infos(mask)):",
        "        for info in rank:",
        "            rows = torch.tensor(info.rows, dtype=torch.long)",
        "            width = int(torch.where(mask[rows], cols + 1, 0).max()) if info.rows else 0",
        "            mb = {n: (inputs[n][rows][:, :width] if inputs[n].dim() == 2 else "
        "inputs[n][rows]).clone()",
        f"                  for n in {tensors!r}}}",
        "            mb['logprobs'].requires_grad_(True)",
        "            here = f'rank {r} micro-batch {info.micro_batch}'",
        "            before.update({f'{here}: {k}': v.detach().clone() for k, v in mb.items()})",
        "            kw = dict(mb)",
        *[f"            kw[{n!r}] = info.{n}" for n in info],
        *(["            kw['step'] = info"] if "step" in ctx.takes else []),
        *_renamed(ctx.takes, "            "),
        f"            out = {snippet_call(ctx.options, where.call, mask='mask[rows][:, :width]')}",
        pick_line(ctx.options.loss, "loss", indent="            "),
        "            if out is None:  # the function ran backward itself",
        "                g, value = mb['logprobs'].grad, float('nan')",
        "            else:",
        "                (g,) = torch.autograd.grad(out, mb['logprobs'])",
        "                value = out.item()",
        "            grad[rows, :width] += g.double() / split.world_size",
        "            total += value / split.world_size",
        "            passed.update({f'{here}: {k}': v for k, v in mb.items()})",
        "    return torch.tensor(total, dtype=torch.float64), grad, passed, before",
        "",
        "",
        "def reference(inputs, out):",
        '    """The float64 full-batch reference loss and its gradient w.r.t. logprobs."""',
        "    lp = inputs['logprobs'].detach().double().requires_grad_(True)",
        "    ref_inputs = dict(logprobs=lp, old_logprobs=inputs['old_logprobs'].double(),",
        "                      advantages=inputs['advantages'].double(),",
        "                      response_mask=inputs['response_mask'])",
        *[f"    ref_inputs[{n!r}] = inputs[{n!r}].double()" for n in ctx.oracle.needs],
        "    expected = policy_loss(config, **ref_inputs).loss",
        "    return expected.detach(), torch.autograd.grad(expected, lp)[0]",
    ]
    mask = "inputs['response_mask']"
    if check.name in ("full-batch", "micro-batches", "data-parallel", "generation-steps",
                      _empty.EMPTY):  # fmt: skip
        lines = [
            "",
            "out, grad, passed, before = run(inputs)",
            "expected, expected_grad = reference(inputs, out)",
            f"show('accumulated loss', out, 'full-batch reference', expected, {mask})",
            "show('accumulated gradient', grad, 'full-batch reference gradient', expected_grad,",
            f"     {mask})",
            "ratio = (grad * expected_grad).sum() / (expected_grad * expected_grad).sum()",
            "print('gradient / reference (least squares):', ratio.item())",
        ]
    elif check.name == "padding-values":
        fill = "float('nan')" if ctx.options.padding_nan else "-11.5"
        other = [
            f"other = {{k: torch.where({mask}, v, torch.full_like(v, {fill}))",
            "         if v.is_floating_point() and v.dim() == 2 else v for k, v in inputs.items()}",
        ]
        lines = check_lines("same", other=other, what="other values at padding")
    else:
        lines = check_lines("masked" if check.name == "masked-positions" else check.name)
    return kind_snippet(
        where,
        imports=[config_import(ctx.policy), "from pytest_polgrad.strategies import Split"],
        inputs=inputs.to_snippet(),
        definitions=definitions,
        check=lines,
    )


KIND = TrainingStepKind()
