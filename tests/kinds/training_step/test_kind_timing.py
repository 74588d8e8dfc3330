"""The training step's backward is the function's own time (issue 32, ``core/clock.py``):
the kit differentiates the micro-batch loss the step returned, and that backward runs
through the step's own graph, so a slow backward is blamed on the function, not the kit.
No assertion times the kit: the lower bound is the sleep in the step's backward, the
upper bound the check's own total."""

from __future__ import annotations

import time
from typing import Any

import torch

from pytest_polgrad.core.engine import build_context, run_check
from pytest_polgrad.core.options import ConformanceOptions

DELAY = 0.004


class _SlowBackward(torch.autograd.Function):
    """The identity, whose backward sleeps :data:`DELAY` and counts its calls."""

    calls = 0

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        _SlowBackward.calls += 1
        time.sleep(DELAY)
        return grad


def slow_backward_step(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    global_tokens: int,
    world_size: int,
) -> torch.Tensor:
    """A correct token-mean REINFORCE-style step whose forward is fast, backward slow."""
    lp: torch.Tensor = _SlowBackward.apply(logprobs)  # type: ignore[no-untyped-call]
    ratio = torch.exp(lp - old_logprobs)
    adv = advantages if advantages.dim() == 2 else advantages[:, None]
    pg = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.28) * adv)
    return torch.where(response_mask, pg, 0.0).sum() / global_tokens * world_size


def test_a_slow_backward_is_blamed_on_the_function() -> None:
    """Every backward's sleep is the function's time (without the charge around the
    kit's ``autograd.grad`` in ``accumulate`` the function's share is its forwards only,
    far below the sleeps), and the function's share never exceeds the whole."""
    _SlowBackward.calls = 0
    opts = ConformanceOptions("dapo", kind="training_step")
    result = run_check(build_context(slow_backward_step, opts), "micro-batches",
                       max_examples=4, base_seed=0)  # fmt: skip
    assert result.passed, result.report
    assert _SlowBackward.calls > 0
    assert result.function_seconds >= _SlowBackward.calls * DELAY, (
        result.function_seconds,
        _SlowBackward.calls,
    )
    assert result.function_seconds <= result.seconds


def slow_backward_critic(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    global_tokens: int,
    world_size: int,
) -> torch.Tensor:
    """A correct token-mean unclipped critic step whose backward is slow."""
    v: torch.Tensor = _SlowBackward.apply(values)  # type: ignore[no-untyped-call]
    per = 0.5 * (v - returns) ** 2
    return torch.where(response_mask, per, 0.0).sum() / global_tokens * world_size


def test_a_slow_critic_backward_is_blamed_on_the_function() -> None:
    """The same for ``kind="critic_step"``: without the charge around its
    ``autograd.grad`` the function's share is its forwards only."""
    _SlowBackward.calls = 0
    opts = ConformanceOptions("unclipped", kind="critic_step")
    result = run_check(build_context(slow_backward_critic, opts), "micro-batches",
                       max_examples=4, base_seed=0)  # fmt: skip
    assert result.passed, result.report
    assert _SlowBackward.calls > 0
    assert result.function_seconds >= _SlowBackward.calls * DELAY, (
        result.function_seconds,
        _SlowBackward.calls,
    )
    assert result.function_seconds <= result.seconds
