"""Policy losses of the mini trainer: a framework-style core plus deliberately wrong twins.

The core ``compute_policy_loss`` takes the knobs trainers usually expose (clip range,
aggregation mode) and returns ``(loss, metrics)``.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``x`` where ``mask``; padding values never reach the result."""
    x = torch.where(mask, x, 0.0)
    return x.sum() if dim is None else x.sum(dim=dim)


def aggregate(per_token: Tensor, mask: Tensor, mode: str, budget: int | None = None) -> Tensor:
    """Aggregate a per-token loss like trainers do."""
    if mode == "token-mean":
        return masked_sum(per_token, mask) / mask.sum()
    if mode == "seq-mean-token-mean":
        return (masked_sum(per_token, mask, dim=1) / mask.sum(dim=1)).mean()
    if mode == "seq-mean-token-sum-norm":
        assert budget is not None
        return masked_sum(per_token, mask) / (mask.shape[0] * budget)
    raise ValueError(f"unknown aggregation {mode!r}")


def compute_policy_loss(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    agg: str = "token-mean",
    budget: int | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO-clip policy loss; ``advantages`` is ``[B, T]``."""
    log_ratio = torch.where(response_mask, log_prob - old_log_prob, 0.0)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    loss = aggregate(per_token, response_mask, agg, budget)
    clip_frac = masked_sum((clipped > unclipped).float(), response_mask) / response_mask.sum()
    return loss, {"clipfrac": clip_frac.item()}


def compute_cispo_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    eps_high: float = 2.0,
    detach_weight: bool = True,
) -> Tensor:
    """CISPO: the truncated IS weight scales ``A log pi`` and must be a constant."""
    ratio = torch.exp(torch.where(response_mask, log_prob - old_log_prob, 0.0))
    weight = ratio.clamp(max=1.0 + eps_high)
    if detach_weight:
        weight = weight.detach()
    per_token = -weight * advantages * torch.where(response_mask, log_prob, 0.0)
    return aggregate(per_token, response_mask, "token-mean")


# ----------------------------------------------------------------------------- wrong twins


def compute_policy_loss_leaky(
    old_log_prob: Tensor, log_prob: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """Wrong: the numerator forgets the mask, so padding values leak into the loss."""
    ratio = torch.exp(log_prob - old_log_prob)
    per_token = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(0.8, 1.28))
    return per_token.sum() / response_mask.sum()


def compute_policy_loss_inplace(
    old_log_prob: Tensor, log_prob: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """Wrong: 'cleans' the caller's old_log_prob in place (zeroes its padding)."""
    old_log_prob.masked_fill_(~response_mask, 0.0)
    loss, _ = compute_policy_loss(old_log_prob, log_prob, advantages, response_mask, 0.2, 0.28)
    return loss


MAX_RESPONSE_LENGTH = 64
"""A length limit hard-coded long ago, when responses were short."""


def compute_policy_loss_truncating(
    old_log_prob: Tensor, log_prob: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """Wrong only for long responses: silently drops every token past position 64."""
    cut = slice(None), slice(0, MAX_RESPONSE_LENGTH)
    loss, _ = compute_policy_loss(
        old_log_prob[cut], log_prob[cut], advantages[cut], response_mask[cut], 0.2, 0.28
    )
    return loss
