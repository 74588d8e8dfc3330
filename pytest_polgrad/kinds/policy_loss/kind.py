"""The policy-loss kind: ``loss(logprobs, old_logprobs, advantages, response_mask[,
ref_logprobs, rollout_logprobs, cu_seqlens]) -> scalar``, compared with
``polgrad_reference.policy_loss`` in float64.

This module wires the existing pieces into the :class:`~pytest_polgrad.core.kinds.Kind`
contract: the checks of :mod:`pytest_polgrad.kinds.policy_loss.checks`, the call convention of
:mod:`pytest_polgrad.core.calls`, the oracle, the reports of
:mod:`pytest_polgrad.kinds.policy_loss.report`,
the diagnosis and the golden data. What it adds: the pool key (which options shape the
batches), the realistic-size batches every check's pool holds, a per-batch cache of oracle
results shared by every check and function, and a row/column shrinker for failures that
only show at sizes Hypothesis does not draw.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import torch

from polgrad_reference import PolicyLossConfig, get_algorithm
from pytest_polgrad.core.calls import FunctionUnderTest, SignatureError
from pytest_polgrad.core.kinds import CallStore, Diagnosis, Kind, KindCheck, remember
from pytest_polgrad.core.options import ConformanceOptions, override_keys
from pytest_polgrad.core.tolerance import Tolerance
from pytest_polgrad.kinds.policy_loss.checks import CHECKS, Check, Context
from pytest_polgrad.kinds.policy_loss.corpus import corpus_batches
from pytest_polgrad.kinds.policy_loss.golden import golden_data
from pytest_polgrad.kinds.policy_loss.oracle import Oracle, OracleResult
from pytest_polgrad.kinds.policy_loss.report import diagnosis_line, failure_report, snippet
from pytest_polgrad.strategies import EXTREME, Batch, BatchPlan, batches, build_many
from pytest_polgrad.strategies._domain import DOMAINS, boundaries
from pytest_polgrad.strategies._plan import AdvantagePlan, RefPlan, RolloutPlan, ValuePlan
from pytest_polgrad.strategies._values import _column_aims, base_floor

__all__ = [
    "KIND",
    "REALISTIC_SIZES",
    "SEARCH_ROWS",
    "SEARCH_TOKENS",
    "PolicyLossContext",
    "PolicyLossKind",
]

_DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}

SEARCH_ROWS, SEARCH_TOKENS = 8, 256
"""Largest ``B`` and ``T`` Hypothesis draws (``max_batch`` / ``max_length`` cap them
lower): searching and shrinking stay cheap, and most bugs show at these sizes."""

REALISTIC_SIZES: tuple[tuple[int, int], ...] = ((64, 384), (9, 4096))
"""``(rows, width)`` of the realistic-size batches in every check's pool, capped by
``max_batch`` / ``max_length``; row lengths are ragged over ``[1, width]``, the shortest
and the longest always present. 9 rows: not a multiple of a power-of-two chunk size, so
averaging chunk means differs from the batch mean for every aggregation. Two batches of
25k and 37k elements: together about as costly as thirty of the drawn ones (issue 8)."""

_FLOAT16_SIZES: tuple[tuple[int, int], ...] = ((64, 96), (8, 1024))
"""float16 inputs: at most 8192 response tokens, so a sum of ``|A| * ratio`` over the
batch stays representable (65504) for a loss that computes in float16."""


@dataclasses.dataclass
class PolicyLossContext(Context):
    """:class:`~pytest_polgrad.kinds.policy_loss.checks.Context` plus the name pytest collected."""

    name: str = ""


# ---- oracle results, shared by every check and function ------------------------------

_ORACLE_CACHE = CallStore()
"""(config, kink band, batch tensor ids) -> :class:`OracleResult`."""


@dataclasses.dataclass(frozen=True)
class SharedOracle(Oracle):
    """The oracle, with results cached per (config, kink band, batch tensors).

    The key holds the identities of the batch's tensors; an entry is dropped when any of
    them is freed, so a key can never name other tensors and the cache holds no memory of
    its own past the pool's lifetime. The gradient is always computed: the value check's
    result then serves the gradient, padding and micro-batch checks of every function.
    Inputs are never modified in place (the function under test receives clones)."""

    def __call__(
        self, batch: Mapping[str, torch.Tensor], *, grad: bool = True, **options: Any
    ) -> OracleResult:
        tensors = tuple(batch[k] for k in sorted(batch))
        settings = tuple(sorted(options.items()))
        key: tuple[Hashable, ...] = (self._config_key, settings, *map(id, tensors))
        hit: OracleResult | None = _ORACLE_CACHE.get(key)
        if hit is not None:
            return hit
        result = super().__call__(batch, grad=True, **options)
        remember(_ORACLE_CACHE, key, result, tensors)
        return result

    @functools.cached_property
    def _config_key(self) -> str:
        """``repr(config)``, once per oracle: a string caches its hash, where a nested
        frozen config rehashes every field at every lookup."""
        return repr(self.config)


_UNREAD = {
    "rollout_logprobs": "it has no rollout-IS correction, so no batch carries rollout logprobs "
    "(a bypass-mode loss such as verl's, registry 'bypass_pg', reads the rollout logprobs as "
    "its old_logprobs: pass them there)",
    "ref_logprobs": "it has no KL term in the loss, so no batch carries reference logprobs",
}
"""Why a batch lacks each optional input (:attr:`Oracle.needs` says which ones it carries)."""


def _require_fed(fut: FunctionUnderTest, oracle: Oracle, options: ConformanceOptions) -> None:
    """A required parameter for an input the reference does not read is never fed: say so
    once, as a :class:`SignatureError`, instead of a ``TypeError`` on every batch."""
    reference = options.reference if isinstance(options.reference, str) else "the config"
    for input_name, why in _UNREAD.items():
        if input_name in fut.required and input_name not in oracle.needs:
            param = fut.parameters[input_name]
            spelled = param if param == input_name else f"{param} ({input_name})"
            raise SignatureError(
                f"{fut.name} requires parameter {spelled!r}, which reference {reference!r} "
                f"does not read: {why}; give the parameter a default (None) or mark the "
                "function against a reference that reads it"
            )


# ---- the kind ---------------------------------------------------------------------------


def _search_bounds(options: ConformanceOptions) -> tuple[int, int]:
    return min(SEARCH_ROWS, options.max_batch), min(SEARCH_TOKENS, options.max_length)


def _on_policy(batch: Any) -> Batch:
    """The same batch with ``old_logprobs`` (and ``rollout_logprobs``) set to ``logprobs``."""
    assert isinstance(batch, Batch)
    rollout = None if batch.rollout_logprobs is None else batch.logprobs.clone()
    return dataclasses.replace(
        batch, plan=None, old_logprobs=batch.logprobs.clone(), rollout_logprobs=rollout
    )


def _wrap(check: Check) -> KindCheck:
    return KindCheck(
        name=check.name,
        summary=check.summary,
        run=check.run,
        domain=check.domain,
        semantic=check.semantic,
        prepare=_on_policy if check.on_policy else None,
    )


class PolicyLossKind(Kind):
    """The policy-loss :class:`~pytest_polgrad.core.kinds.Kind` (see the module docstring)."""

    name = "policy_loss"
    summary = (
        "loss(logprobs, old_logprobs, advantages, response_mask[, ref_logprobs, "
        "rollout_logprobs, cu_seqlens]) -> scalar tensor"
    )

    override_keys = override_keys("policy_loss")

    def resolve(self, options: ConformanceOptions) -> PolicyLossConfig:
        """The reference loss config with the marker's overrides applied."""
        ref = options.reference
        if isinstance(ref, PolicyLossConfig):
            return ref.replace(**options.overrides) if options.overrides else ref
        assert isinstance(ref, str)
        return get_algorithm(ref).derive(**options.overrides).loss

    def checks(self, config: Any, options: ConformanceOptions) -> list[KindCheck]:
        return [_wrap(c) for c in CHECKS.values() if c.applies(config, options)]

    def check(self, name: str) -> KindCheck | None:
        """Any check by name, applicable or not (``None`` when unknown)."""
        return _wrap(CHECKS[name]) if name in CHECKS else None

    def check_names(self) -> tuple[str, ...]:
        return tuple(CHECKS)

    def context(
        self, fn: Callable[..., Any], name: str, config: Any, options: ConformanceOptions
    ) -> PolicyLossContext:
        """A function without a ``ref_logprobs`` parameter is compared with the reference's
        KL term removed, and the report says so."""
        fut = FunctionUnderTest(fn, options)
        cfg: PolicyLossConfig = config
        notes = set()
        if cfg.kl_in_loss and not fut.takes_ref:
            cfg = cfg.replace(kl=None)
            notes.add(
                "compared without the reference's as-loss KL term: the function takes no "
                "ref_logprobs (most current GRPO setups train without it)"
            )
        oracle = SharedOracle(cfg)
        _require_fed(fut, oracle, options)
        tol = Tolerance(_DTYPES[options.dtype], strict=options.strict, factor=options.tolerance)
        ctx = PolicyLossContext(fut=fut, oracle=oracle, tolerance=tol, options=options, name=name)
        ctx.notes |= notes
        return ctx

    # -- inputs --

    def _shape(self, ctx: Any, check: KindCheck) -> dict[str, Any]:
        """The arguments of :func:`batches` for ``check``: everything that shapes its
        batches (and nothing about the function beyond the tensors it takes)."""
        cfg: PolicyLossConfig = ctx.config
        options: ConformanceOptions = ctx.options
        dtype = ctx.tolerance.input_dtype
        rows, tokens = _search_bounds(options)
        # Keep a plain loss representable in the input dtype: |A| * exp(gap) summed over up
        # to rows * tokens tokens (binds for float16 only: gap <= log(65504 / 8192)).
        cap = max(1.0, math.log(torch.finfo(dtype).max / (4.0 * rows * tokens)))
        bound = min(EXTREME.max_log_ratio, cap) if check.domain == "extreme" else None
        return dict(
            max_log_ratio=bound,
            clip=cfg.clip,
            domain=check.domain,
            dtype=dtype,
            advantage_shape=options.advantages,
            with_ref_logprobs=cfg.kl_in_loss,
            with_rollout_logprobs=cfg.is_correction is not None,
            with_rewards=False,
            max_batch=rows,
            max_length=tokens,
            holes=bool(getattr(options, "holes", False)),
            padding="nan" if options.padding_nan else "garbage",
        )

    def pool_key(self, ctx: Any, check: KindCheck) -> Hashable:
        """Checks (and functions) with equal keys share one pool of batches."""
        shape = self._shape(ctx, check)
        options: ConformanceOptions = ctx.options
        realistic = (options.max_batch, options.max_length)
        return (tuple(sorted((k, repr(v)) for k, v in shape.items())), realistic)

    def strategy(self, ctx: Any, check: KindCheck) -> Any:
        return batches(**self._shape(ctx, check))

    def extra_inputs(self, ctx: Any, check: KindCheck, seed: int) -> list[Batch]:
        """The realistic-size batches of the pool (deterministic in ``seed``)."""
        return realistic_batches(self._shape(ctx, check), ctx.options, seed)

    def corpus(self, ctx: Any) -> dict[str, Batch]:
        """The canonical corpus, with the optional tensors the reference uses (as drawn)."""
        options: ConformanceOptions = ctx.options
        cfg: PolicyLossConfig = ctx.config
        drop = set()
        if not cfg.kl_in_loss:
            drop.add("ref_logprobs")
        if cfg.is_correction is None:
            drop.add("rollout_logprobs")
        key = (ctx.tolerance.input_dtype, options.advantages, options.padding_nan)
        return corpus_batches(*key, frozenset(drop))

    def shrink(self, ctx: Any, inputs: Any, fails: Callable[[Any], bool]) -> Any:
        return shrink_rows_and_columns(inputs, fails)

    # -- reports --

    def diagnose(self, ctx: Any, inputs: Any) -> Diagnosis:
        text, match = diagnosis_line(ctx)
        return Diagnosis(text, match)

    def snippet(self, ctx: Any, inputs: Any, check: KindCheck) -> str:
        return snippet(ctx, inputs, CHECKS[check.name])

    def report(
        self,
        ctx: Any,
        check: KindCheck,
        exc: BaseException,
        inputs: Any,
        replay: str,
        diagnose: bool,
    ) -> tuple[str, str, str]:
        return failure_report(
            ctx,
            CHECKS[check.name],
            exc,  # type: ignore[arg-type]
            inputs,
            replay,
            diagnose=diagnose,
        )

    def golden(self, ctx: Any) -> Any:
        return golden_data(ctx.fut.fn, ctx.options)


KIND = PolicyLossKind()


# ---- corpus and realistic sizes ---------------------------------------------------------


def _realistic_extents(rng: random.Random, rows: int, width: int) -> tuple[int, ...]:
    if rows == 1:
        return (width,)
    rest = [rng.randint(1, width) for _ in range(rows - 2)]
    extents = [1, width, *rest]
    rng.shuffle(extents)
    return tuple(extents)


def realistic_batches(
    shape: Mapping[str, Any], options: ConformanceOptions, seed: int
) -> list[Batch]:
    """A few batches at realistic sizes (:data:`REALISTIC_SIZES`, capped by ``max_batch``
    / ``max_length``), built from plans with the domain's random style and boundary-aimed
    columns; float16 inputs get :data:`_FLOAT16_SIZES` (none in the extreme domain)."""
    dtype: torch.dtype = shape["dtype"]
    domain = DOMAINS[shape["domain"]]
    sizes = REALISTIC_SIZES
    if dtype is torch.float16:
        sizes = () if domain.name == "extreme" else _FLOAT16_SIZES
    bound = shape["max_log_ratio"]
    bound = domain.max_log_ratio if bound is None else bound
    aims = _column_aims(boundaries((shape["clip"],), bound)[2])
    rng = random.Random(seed)
    plans: list[BatchPlan] = []
    seen: set[tuple[int, int]] = set()
    for index, (rows, width) in enumerate(sizes):
        rows, width = min(rows, options.max_batch), min(width, options.max_length)
        if (rows, width) in seen:
            continue
        seen.add((rows, width))
        extents = _realistic_extents(rng, rows, width)
        base_scale, base_power = domain.base_shapes[index % len(domain.base_shapes)]
        gap = domain.gap_scales[(0, 2)[index % 2]]  # the domain's typical, then a wide one
        values = ValuePlan(
            style="random",
            base_scale=min(base_scale, base_floor(domain, bound)),
            base_power=base_power,
            gap_scale=min(gap, bound, 1.0 if dtype is torch.float16 else bound),
            aim_stride=3 if aims and dtype in (torch.float32, torch.float64) else 0,
            column_aims=aims,
        )
        mags = None
        if domain.name == "extreme":
            mags = tuple(rng.choice((1.0, 1e-6, 1e3, 1e6)) for _ in range(rows))
        advantages = AdvantagePlan(
            shape=shape["advantage_shape"],
            pattern="random",
            values=tuple(rng.choice((1.0, -1.0, 1.0, -1.0, 0.0)) for _ in range(rows)),
            magnitudes=mags,
            noise=0.5 if shape["advantage_shape"] == "token" else 0.0,
        )
        rollout = None
        if shape["with_rollout_logprobs"]:
            limit = domain.max_rollout_seq
            rollout = RolloutPlan(scale=0.001 if limit is None else min(0.001, limit / width))
        plan = BatchPlan(
            extents=extents,
            width=width,
            holes=_holes(rng, extents) if shape["holes"] else (),
            dtype=str(dtype).removeprefix("torch."),
            domain=domain.name,
            padding=shape["padding"],
            max_log_ratio=bound,
            seed=rng.getrandbits(32),
            values=values,
            advantages=advantages,
            ref=RefPlan(min(1.0, domain.max_ref_gap)) if shape["with_ref_logprobs"] else None,
            rollout=rollout,
        )
        plans.append(plan)
    return build_many(plans)


def _holes(rng: random.Random, extents: tuple[int, ...]) -> tuple[tuple[int, int, int], ...]:
    """One interior hole in every fourth row long enough (never at a row's ends)."""
    holes = []
    for row, extent in enumerate(extents):
        if extent >= 8 and row % 4 == 0:
            start = rng.randint(1, extent - 3)
            holes.append((row, start, rng.randint(start + 1, extent - 1)))
    return tuple(holes)


# ---- the kit's own shrinker -------------------------------------------------------------


def _subset(batch: Batch, rows: list[int], cols: int | list[int]) -> Batch | None:
    """Rows ``rows`` of ``batch`` with its first ``cols`` columns, or the columns listed
    (None if a row would keep no response token)."""
    kw = batch.as_kwargs()
    index = torch.tensor(rows, dtype=torch.int64)  # index_select: indexing with a list of
    keep = torch.tensor(cols, dtype=torch.int64) if isinstance(cols, list) else None

    def take(t: torch.Tensor) -> torch.Tensor:  # rows costs ~1000x more
        t = t.index_select(0, index)
        return t[:, :cols] if keep is None else t.index_select(1, keep)

    mask = take(kw["response_mask"])
    if not bool(mask.any(dim=1).all()):
        return None
    out: dict[str, Any] = {}
    for name, t in kw.items():
        if t.dim() == 2:
            out[name] = take(t).clone()
        elif t.dim() == 1 and t.shape[0] == batch.batch_size:
            out[name] = t.index_select(0, index)
    return Batch(**out)


def _drop_chunks(
    items: list[int], attempt: Callable[[list[int]], bool], spent: Callable[[], bool], floor: int
) -> list[int]:
    """Greedily delete runs of ``items`` while ``attempt`` (on what is left) holds: halves
    first, then runs half as long whenever a pass deletes nothing, down to ``floor``."""
    chunk = max(1, len(items) // 2)
    while not spent():
        i, progressed = 0, False
        while i < len(items) and len(items) > 1:
            trial = items[:i] + items[i + chunk :]
            if trial and attempt(trial):
                items, progressed = trial, True
            else:
                i += chunk
        if chunk <= floor and not progressed:
            break
        chunk = max(floor, chunk // 2) if not progressed else chunk
    return items


def shrink_rows_and_columns(inputs: Any, fails: Callable[[Any], bool], *, budget: int = 120) -> Any:
    """Greedily drop rows (halves, then smaller runs), truncate columns (bisection), then
    delete runs of inner columns (down to 1/64 of the width: a failure that needs a row
    past some length but not the columns before it) while ``fails`` still holds; at most
    ``budget`` calls. Values are kept, not redrawn, so a failure that needs a particular
    value survives. Right-padded batches only."""
    if not isinstance(inputs, Batch) or inputs.layout != "right":
        return inputs
    calls = [0]
    found: list[Batch] = [inputs]

    def still(candidate: Batch | None) -> bool:
        if candidate is None or calls[0] >= budget:
            return False
        calls[0] += 1
        if fails(candidate):
            found[0] = candidate
            return True
        return False

    def spent() -> bool:
        return calls[0] >= budget

    rows = _drop_chunks(
        list(range(inputs.batch_size)),
        lambda trial: still(_subset(inputs, trial, inputs.width)),
        spent,
        floor=1,
    )
    lo, hi = 1, found[0].width  # the smallest width that still fails, by bisection
    while lo < hi and not spent():
        mid = (lo + hi) // 2
        if not still(_subset(found[0], list(range(len(rows))), mid)):
            lo = mid + 1
        else:
            hi = mid
    narrow = found[0]
    _drop_chunks(
        list(range(narrow.width)),
        lambda trial: still(_subset(narrow, list(range(len(rows))), trial)),
        spent,
        floor=max(1, narrow.width // 64),
    )
    return found[0]
