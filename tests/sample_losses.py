"""Loss functions for the kit's own tests: independent correct implementations and one
deliberately wrong twin per check. Each docstring names the bug."""

from __future__ import annotations

import itertools

import torch

Tensor = torch.Tensor


def _token_mean(per_token: Tensor, response_mask: Tensor) -> Tensor:
    return torch.where(response_mask, per_token, 0.0).sum() / response_mask.sum()


def _ppo_per_token(
    lp: Tensor, old: Tensor, adv: Tensor, mask: Tensor, lo: float, hi: float
) -> Tensor:
    ratio = torch.exp(torch.where(mask, lp - old, 0.0))
    a = adv[:, None] if adv.dim() == 1 else torch.where(mask, adv, 0.0)
    return torch.maximum(-a * ratio, -a * ratio.clamp(1 - lo, 1 + hi))


def dapo(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """Correct DAPO: token-mean, clip 0.2 / 0.28."""
    per = _ppo_per_token(logprobs, old_logprobs, advantages, response_mask, 0.2, 0.28)
    return _token_mean(per, response_mask)


def grpo_no_kl(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """Correct GRPO policy term: seq-mean-token-mean, clip 0.2."""
    per = torch.where(
        response_mask,
        _ppo_per_token(logprobs, old_logprobs, advantages, response_mask, 0.2, 0.2),
        0.0,
    )
    return (per.sum(dim=1) / response_mask.sum(dim=1)).mean()


def cispo(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """Correct CISPO: sg(min(r, 3)) * A * log pi, token-mean."""
    ratio = torch.exp(torch.where(response_mask, logprobs - old_logprobs, 0.0))
    per = (
        -ratio.clamp(max=3.0).detach()
        * advantages[:, None]
        * torch.where(response_mask, logprobs, 0.0)
    )
    return per.sum() / response_mask.sum()


# ----------------------------------------------------------------- one wrong twin per check


def dapo_wrong_eps(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """value: clip-high 0.2 instead of 0.28."""
    per = _ppo_per_token(logprobs, old_logprobs, advantages, response_mask, 0.2, 0.2)
    return _token_mean(per, response_mask)


def cispo_no_stop_gradient(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """gradient / on-policy: the truncated weight is not detached (same value)."""
    ratio = torch.exp(torch.where(response_mask, logprobs - old_logprobs, 0.0))
    per = -ratio.clamp(max=3.0) * advantages[:, None] * torch.where(response_mask, logprobs, 0.0)
    return per.sum() / response_mask.sum()


def dapo_grad_into_padding(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """masked-positions: a zero-valued term that still sends gradient to padding."""
    leak = (logprobs - logprobs.detach())[~response_mask].sum()
    return dapo(logprobs, old_logprobs, advantages, response_mask) + leak


def dapo_leaky(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """padding-values: the numerator forgets the mask."""
    per = _ppo_per_token(logprobs, old_logprobs, advantages, response_mask, 0.2, 0.28)
    per = per + 0.0 * torch.exp(torch.clamp(logprobs - old_logprobs, max=30.0))  # reads padding
    return (per + 1e-3 * torch.nan_to_num(logprobs)).sum() / response_mask.sum()


def dapo_padded_width(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """padding-columns: divides by B * T (the padded width) instead of the token count."""
    per = _ppo_per_token(logprobs, old_logprobs, advantages, response_mask, 0.2, 0.28)
    return torch.where(response_mask, per, 0.0).sum() / response_mask.numel()


def dapo_inplace(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """inputs-unchanged: zeroes the padding of old_logprobs in place."""
    old_logprobs.masked_fill_(~response_mask, 0.0)
    return dapo(logprobs, old_logprobs, advantages, response_mask)


_calls = itertools.count()


def dapo_nondeterministic(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """deterministic: the result drifts by one part in 1e15 per call."""
    return dapo(logprobs, old_logprobs, advantages, response_mask) * (1 + 1e-15 * next(_calls))


def dapo_ratio_of_probs(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """extreme-finite: ratio as exp(lp) / exp(old), 0/0 for very unlikely tokens."""
    ratio = torch.where(response_mask, torch.exp(logprobs) / torch.exp(old_logprobs), 1.0)
    a = advantages[:, None]
    per = torch.maximum(-a * ratio, -a * ratio.clamp(0.8, 1.28))
    return _token_mean(per, response_mask)


def grpo_token_mean(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """micro-batch (and value): token-mean where GRPO means per sequence first."""
    per = _ppo_per_token(logprobs, old_logprobs, advantages, response_mask, 0.2, 0.2)
    return _token_mean(per, response_mask)
