"""Accumulation paths of the installed frameworks, marked with the kit's training-step kind.

verl 0.9.1: the policy loss with the step-wide ``global_batch_info`` its actor sets
(``workers/utils/losses.py``); TRL 1.16.0: ``_compute_loss`` with ``num_items_in_batch``
and ``current_gradient_accumulation_steps``, for every split the kit draws (micro-batches,
uneven ranks, steps_per_generation != gradient_accumulation_steps).
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_polgrad.frameworks import trl as trl_adapter
from pytest_polgrad.frameworks import verl as verl_adapter

# Every check of the kind but the golden (the recorded outputs of the policy losses live
# in snapshots/frameworks/; the training-step golden of the kit is not used here).
STEP_CHECKS = ("full-batch", "micro-batches", "data-parallel", "generation-steps",
               "masked-positions", "inputs-unchanged", "deterministic")  # fmt: skip
_GENERATION = (
    "TRL normalises by the generation batch's tokens x gradient_accumulation_steps / "
    "steps_per_generation: the step's own token count only when every optimizer step of a "
    "generation batch holds as many tokens"
)

_verl_token_mean = verl_adapter.training_step("vanilla", loss_agg_mode="token-mean")
_verl_seq_mean = verl_adapter.training_step("vanilla", loss_agg_mode="seq-mean-token-mean")
_trl_dapo = trl_adapter.training_step(loss_type="dapo", epsilon_high=0.28)


@pytest.mark.polgrad_conforms(
    "ppo", kind="training_step", dual_clip=3.0, advantages="token", checks=STEP_CHECKS
)
def verl_token_mean_step(
    logprobs: Any,
    old_logprobs: Any,
    advantages: Any,
    response_mask: Any,
    world_size: int,
    global_tokens: int,
    global_rows: int,
) -> Any:
    return _verl_token_mean(
        logprobs=logprobs,
        old_logprobs=old_logprobs,
        advantages=advantages,
        response_mask=response_mask,
        world_size=world_size,
        global_tokens=global_tokens,
        global_rows=global_rows,
    )


@pytest.mark.polgrad_conforms(
    "grpo", kind="training_step", dual_clip=3.0, advantages="token", checks=STEP_CHECKS
)
def verl_seq_mean_token_mean_step(
    logprobs: Any,
    old_logprobs: Any,
    advantages: Any,
    response_mask: Any,
    world_size: int,
    global_tokens: int,
    global_rows: int,
) -> Any:
    return _verl_seq_mean(
        logprobs=logprobs,
        old_logprobs=old_logprobs,
        advantages=advantages,
        response_mask=response_mask,
        world_size=world_size,
        global_tokens=global_tokens,
        global_rows=global_rows,
    )


@pytest.mark.polgrad_conforms(
    "dapo",
    kind="training_step",
    checks=STEP_CHECKS,
    # 2.75e5x the tolerance on the canonical corpus; pinned at about 1.5x
    expect={"generation-steps": (_GENERATION, 4.1e5)},
)
def trl_dapo_step(
    logprobs: Any,
    old_logprobs: Any,
    advantages: Any,
    response_mask: Any,
    world_size: int,
    gradient_accumulation_steps: int,
    steps_per_generation: int,
    generation_tokens: int,
) -> Any:
    return _trl_dapo(
        logprobs=logprobs,
        old_logprobs=old_logprobs,
        advantages=advantages,
        response_mask=response_mask,
        world_size=world_size,
        gradient_accumulation_steps=gradient_accumulation_steps,
        steps_per_generation=steps_per_generation,
        generation_tokens=generation_tokens,
    )


_GEO = (
    "verl's geo_mean ends in torch.mean over the micro-batch's rows and ignores "
    "global_batch_info, so summing micro-batch losses scales the gradient by their number"
)
_verl_geo_mean = verl_adapter.training_step(
    "geo_mean", loss_agg_mode="token-mean", clip_ratio_low=0.4, clip_ratio_high=0.4
)


@pytest.mark.polgrad_conforms(
    "gmpo",
    kind="training_step",
    checks=STEP_CHECKS,
    # sizes on the canonical corpus: 6.58e5x, 2.2e5x, 2.2e5x; pinned at about 1.5x (the
    # training step runs no golden, so the pin is what keeps each deviation its size)
    expect={
        "micro-batches": (_GEO, 9.9e5),
        "data-parallel": (_GEO, 3.3e5),
        "generation-steps": (_GEO, 3.3e5),
    },
)
def verl_geo_mean_step(
    logprobs: Any,
    old_logprobs: Any,
    advantages: Any,
    response_mask: Any,
    world_size: int,
    global_tokens: int,
    global_rows: int,
) -> Any:
    return _verl_geo_mean(
        logprobs=logprobs,
        old_logprobs=old_logprobs,
        advantages=advantages,
        response_mask=response_mask,
        world_size=world_size,
        global_tokens=global_tokens,
        global_rows=global_rows,
    )
