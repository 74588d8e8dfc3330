"""The mini trainer's losses, marked with pytest-polgrad (run: ``make demo``).

Correct implementations conform. The wrong ones are declared with ``expect=`` so the
run exits 0 while every finding stays visible as an expected failure with its reason;
an expectation that stops failing would be reported.
"""

from __future__ import annotations

import pytest
import torch
from minitrainer.losses import (
    compute_cispo_loss,
    compute_policy_loss,
    compute_policy_loss_inplace,
    compute_policy_loss_leaky,
    compute_policy_loss_truncating,
)

Tensor = torch.Tensor


# ------------------------------------------------------------------- correct implementations


@pytest.mark.polgrad_conforms("dapo", advantages="token")
def dapo_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    loss, _ = compute_policy_loss(old_logprobs, logprobs, advantages, response_mask, 0.2, 0.28)
    return loss


@pytest.mark.polgrad_conforms("grpo", advantages="token")
def grpo_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    loss, _ = compute_policy_loss(
        old_logprobs, logprobs, advantages, response_mask, agg="seq-mean-token-mean"
    )
    return loss


@pytest.mark.polgrad_conforms("cispo", advantages="token")
def cispo_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    return compute_cispo_loss(logprobs, old_logprobs, advantages, response_mask)


# One function, every aggregation mode it offers: each parameter set is checked against
# the registry entry that means that mode (its own marker), the mode bound into the call.
# Items: every_aggregation[agg=token-mean-ppo-value], ...; rows: every_aggregation[agg=...].


@pytest.mark.parametrize(
    "agg",
    [
        pytest.param("token-mean", marks=pytest.mark.polgrad_conforms("ppo", advantages="token")),
        pytest.param(
            "seq-mean-token-mean", marks=pytest.mark.polgrad_conforms("grpo", advantages="token")
        ),
    ],
)
def every_aggregation(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor, agg: str
) -> Tensor:
    loss, _ = compute_policy_loss(old_logprobs, logprobs, advantages, response_mask, agg=agg)
    return loss


# ------------------------------------------------------------------------ known deviations


@pytest.mark.polgrad_conforms(
    "grpo",
    advantages="token",
    expect={
        "value": "token-mean aggregation, not the paper's seq-mean-token-mean",
        "gradient": "token-mean aggregation, not the paper's seq-mean-token-mean",
        "on-policy": "token-mean aggregation weights every token 1/N",
        "micro-batch": "token-mean is not decomposable into per-row micro-batches",
    },
)
def grpo_by_default_settings(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """A 'GRPO' run launched with the trainer's default aggregation (token-mean)."""
    loss, _ = compute_policy_loss(old_logprobs, logprobs, advantages, response_mask)
    return loss


@pytest.mark.polgrad_conforms(
    "dapo",
    advantages="token",
    expect={
        "value": "clip_high left at 0.2 (DAPO's clip-higher is 0.28)",
        "gradient": "clip_high left at 0.2 (DAPO's clip-higher is 0.28)",
    },
)
def dapo_without_clip_higher(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    loss, _ = compute_policy_loss(old_logprobs, logprobs, advantages, response_mask, 0.2, 0.2)
    return loss


@pytest.mark.polgrad_conforms(
    "dr_grpo",
    advantages="token",
    budget=64,
    expect={
        "value": "divides by the padded width, not the generation budget",
        "gradient": "divides by the padded width, not the generation budget",
        "padding-columns": "divides by the padded width",
        "on-policy": "divides by the padded width",
    },
)
def dr_grpo_padded_width(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """Dr.GRPO's constant normaliser taken from the batch's padded width."""
    width = response_mask.shape[1]
    loss, _ = compute_policy_loss(
        old_logprobs,
        logprobs,
        advantages,
        response_mask,
        agg="seq-mean-token-sum-norm",
        budget=width,
    )
    return loss


@pytest.mark.polgrad_conforms(
    "dapo",
    advantages="token",
    expect={
        "value": "padding values leak into the numerator",
        "padding-values": "padding values leak into the numerator",
        "masked-positions": "gradient flows into padding positions",
        "padding-columns": "appended padding columns change the loss",
    },
)
def dapo_leaky(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    return compute_policy_loss_leaky(old_logprobs, logprobs, advantages, response_mask)


@pytest.mark.polgrad_conforms(
    "cispo",
    advantages="token",
    expect={
        "gradient": "the truncated IS weight is not detached",
        "on-policy": "the truncated IS weight is not detached",
    },
)
def cispo_missing_stop_gradient(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    return compute_cispo_loss(
        logprobs, old_logprobs, advantages, response_mask, detach_weight=False
    )


@pytest.mark.polgrad_conforms(
    "dapo",
    advantages="token",
    expect={"inputs-unchanged": "zeroes the padding of old_logprobs in place"},
)
def dapo_inplace(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    return compute_policy_loss_inplace(old_logprobs, logprobs, advantages, response_mask)


@pytest.mark.polgrad_conforms(
    "dapo",
    advantages="token",
    expect={
        "value": "drops tokens past position 64",
        "gradient": "drops tokens past position 64",
        "on-policy": "drops tokens past position 64",
    },
)
def dapo_truncating(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    return compute_policy_loss_truncating(old_logprobs, logprobs, advantages, response_mask)
