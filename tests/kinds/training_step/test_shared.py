"""What the training-step checks share (issue 32): one pool of steps, one accumulation per
(function, step, split) while the engine screens, and still a separate second run for the
deterministic check."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from pytest_polgrad.core.engine import build_context, run_check
from pytest_polgrad.core.kinds import CallStore
from pytest_polgrad.core.options import ConformanceOptions
from tests.kinds.training_step.test_kind import SPLIT_CHECKS, token_mean_step

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
