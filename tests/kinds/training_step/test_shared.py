"""What the training-step checks share (issue 32): one pool of steps, one accumulation per
(function, step, split) while the engine screens, and still a separate second run for the
deterministic check."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

from pytest_polgrad.core.engine import _pool, build_context, check_of, kind_of, run_check
from pytest_polgrad.core.kinds import CallStore
from pytest_polgrad.core.options import ConformanceOptions
from pytest_polgrad.core.verdicts import CheckFailure
from pytest_polgrad.kinds.policy_loss.kind import REALISTIC_SIZES, SEARCH_ROWS, SEARCH_TOKENS
from pytest_polgrad.kinds.training_step import shared as _shared
from pytest_polgrad.kinds.training_step.kind import accumulate, check_split
from tests.kinds.training_step.test_kind import MUTANTS, SPLIT_CHECKS, token_mean_step

BUDGET = 14


def _counting() -> tuple[list[int], Callable[..., Any]]:
    calls = [0]

    def step(logprobs, old_logprobs, advantages, response_mask, global_tokens, world_size):  # type: ignore[no-untyped-def]
        calls[0] += 1
        return token_mean_step(
            logprobs, old_logprobs, advantages, response_mask, global_tokens, world_size
        )

    return calls, step


def test_the_non_semantic_checks_reuse_the_split_checks_accumulations() -> None:
    """After the four split checks, masked-positions screens the corpus and the pool without
    calling the function: each of its steps is a split check's (step, split)."""
    calls, step = _counting()
    ctx = build_context(step, ConformanceOptions("dapo", kind="training_step"))
    store = CallStore()
    for check in SPLIT_CHECKS:
        assert run_check(ctx, check, max_examples=BUDGET, base_seed=0, shared=store).passed
    before = calls[0]
    assert before > 0
    result = run_check(ctx, "masked-positions", max_examples=BUDGET, base_seed=0, shared=store)
    assert result.passed and result.examples == BUDGET
    assert calls[0] == before
    # without a store every step is accumulated afresh
    run_check(ctx, "masked-positions", max_examples=BUDGET, base_seed=0)
    assert calls[0] > before


def test_a_step_that_differs_on_a_second_run_still_fails_deterministic() -> None:
    """The deterministic check's second run is inputs-unchanged's separate run, never the
    shared accumulation its first run is."""
    runs = [0]

    def drifting(logprobs, old_logprobs, advantages, response_mask, global_tokens, world_size):  # type: ignore[no-untyped-def]
        runs[0] += 1
        loss = token_mean_step(
            logprobs, old_logprobs, advantages, response_mask, global_tokens, world_size
        )
        return loss + torch.tensor(runs[0] * 1e-13, dtype=loss.dtype)

    ctx = build_context(drifting, ConformanceOptions("dapo", kind="training_step"))
    store = CallStore()
    for check in ("masked-positions", "inputs-unchanged"):
        run_check(ctx, check, max_examples=BUDGET, base_seed=0, shared=store)
    result = run_check(ctx, "deterministic", max_examples=BUDGET, base_seed=0, shared=store)
    assert not result.passed
    assert "two runs of the same step give different results" in result.message


def _bits(value: object) -> object:
    """A float64 tensor as its bit patterns (so -0.0 and NaN payloads count), else as is."""
    if isinstance(value, torch.Tensor) and value.dtype == torch.float64:
        return value.detach().contiguous().view(torch.int64)
    return value


def _same(a: object, b: object) -> bool:
    a, b = _bits(a), _bits(b)
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b


def _takes_every_input(  # type: ignore[no-untyped-def]
    logprobs, old_logprobs, advantages, response_mask, ref_logprobs, rollout_logprobs,
    global_tokens, world_size,
):  # fmt: skip
    """A step whose signature keeps every optional input (and the reference's KL term)."""
    return token_mean_step(  # type: ignore[no-untyped-call]
        logprobs, old_logprobs, advantages, response_mask, global_tokens, world_size
    )


def _pooled(
    reference: str, fn: Callable[..., Any] = token_mean_step, **options: Any
) -> tuple[Any, tuple[Any, ...]]:
    opts = ConformanceOptions(reference, kind="training_step", **options)
    ctx = build_context(fn, opts)
    kind = kind_of(opts)
    drawn, _ = _pool(kind, ctx, check_of(kind, ctx, "micro-batches"), 0, 8)
    return ctx, drawn


@pytest.mark.parametrize(
    ("reference", "options"),
    [("grpo", {}), ("dapo", {"dtype": "bfloat16"}), ("grpo_tis", {"dtype": "float32"})],
)
def test_the_steps_reference_skips_only_the_native_fields(reference, options) -> None:  # type: ignore[no-untyped-def]
    """The training step judges on the conservative scales, so its oracle call
    (``shared.expected``) leaves out the native-precision fields; every field it keeps is
    bitwise the full call's (GRPO's k3 term in the loss, bfloat16 inputs, rollout IS)."""
    ctx, drawn = _pooled(reference, _takes_every_input, **options)
    assert ctx.policy.kl is not None or reference != "grpo"
    for item in drawn:
        tensors = {k: v for k, v in item.batch.items() if isinstance(v, torch.Tensor)}
        full = ctx.oracle(tensors, kink_eps=ctx.tolerance.loosest)
        got = _shared.expected(ctx.oracle, item.batch, ctx.tolerance.loosest)
        assert got.grad_scale_native is None and got.cond_native is None
        for field in dataclasses.fields(full):
            if field.name not in ("value_scale_native", "grad_scale_native", "cond_native"):
                assert _same(getattr(full, field.name), getattr(got, field.name)), field.name


def _plain_accumulation(ctx: Any, inputs: dict[str, Any]) -> tuple[float, torch.Tensor]:
    """The accumulation spelled out: zeros, then ``+= g / W`` per micro-batch's rows."""
    mask = inputs["response_mask"]
    grad = torch.zeros(mask.shape, dtype=torch.float64)
    total, world = 0.0, inputs["split"].world_size
    for rank in inputs["split"].infos(mask):
        for info in rank:
            rows = torch.tensor(info.rows, dtype=torch.long)
            width = (
                int(torch.where(mask[rows], torch.arange(mask.shape[1]) + 1, 0).max())
                if info.rows
                else 0
            )
            kw = {k: (inputs[k][rows, :width] if inputs[k].dim() == 2 else inputs[k][rows]).clone()
                  for k in ("logprobs", "old_logprobs", "advantages", "response_mask")}  # fmt: skip
            lp = kw["logprobs"].requires_grad_(True)
            loss = ctx.fn(**kw, global_tokens=info.global_tokens, world_size=world)
            (g,) = torch.autograd.grad(loss, lp)
            grad[rows, :width] += g.to(torch.float64) / world
            total += float(loss.detach()) / world
    return total, grad


def test_accumulate_is_bitwise_the_plain_accumulation() -> None:
    """``accumulate`` writes each micro-batch's ``g / W`` into its rows once; the loss and
    gradient are bitwise those of zeros plus ``+= g / W`` per micro-batch (every family's
    split of pooled steps, float64 and bfloat16 inputs), so verdicts did not move."""
    every: tuple[dict[str, Any], ...] = ({}, {"dtype": "bfloat16"})
    for options in every:
        ctx, drawn = _pooled("dapo", **options)
        for item in drawn:
            for split in item.splits.values():
                inputs = {**item.batch, "split": split}
                acc = accumulate(ctx, inputs)
                loss, grad = _plain_accumulation(ctx, inputs)
                assert _same(acc.loss, loss) and _same(acc.grad, grad), split.describe()


def test_the_pool_draws_steps_at_search_sizes_plus_the_realistic_ones() -> None:
    """Drawn steps have at most ``SEARCH_ROWS x SEARCH_TOKENS`` (8 x 256); the realistic
    steps are the policy-loss pool's sizes (64 x 384, 9 x 4096), each with a split of every
    family its rows allow (issue 32: the giant drawn steps cost ten times a policy loss)."""
    ctx, drawn = _pooled("dapo")
    kind = kind_of(ctx.options)
    _, extra = _pool(kind, ctx, check_of(kind, ctx, "micro-batches"), 0, 40)
    for item in drawn:
        rows, width = item.batch["response_mask"].shape
        assert rows <= SEARCH_ROWS and width <= SEARCH_TOKENS
    assert sorted(tuple(e.batch["response_mask"].shape) for e in extra) == sorted(REALISTIC_SIZES)
    for item in extra:
        assert set(item.splits) == {"full-batch", "micro-batches", "data-parallel",
                                    "generation-steps"}  # fmt: skip
        assert item.shared in item.splits


@pytest.mark.parametrize(("fn", "family", "_named"), MUTANTS, ids=[m[0].__name__ for m in MUTANTS])
def test_each_scaling_mutant_fails_on_pooled_steps_alone(fn, family, _named) -> None:  # type: ignore[no-untyped-def]
    """Without the corpus, a few pooled steps of the mutant's family already flag it:
    the search-size steps keep the unequal micro-batch / rank token counts the bugs need."""
    opts = ConformanceOptions("dapo", kind="training_step")
    ctx = build_context(fn, opts)
    kind = kind_of(opts)
    drawn, _ = _pool(kind, ctx, check_of(kind, ctx, family), 0, 12)
    flagged = 0
    for item in drawn:
        if family in item.splits:
            try:
                check_split(ctx, {**item.batch, "split": item.splits[family]})
            except CheckFailure:
                flagged += 1
    assert flagged >= 2, flagged
