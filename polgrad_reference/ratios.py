"""Importance ratios between the current policy and the behaviour (old) policy.

All ratios are formed from a log-ratio that is first set to 0 at padding, so values at
masked positions never reach ``exp`` and receive exactly zero gradient.
"""

from __future__ import annotations

import torch

from .config import RatioKind

__all__ = ["masked_log_ratio", "ratio", "sequence_log_ratio"]


def masked_log_ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """``log r[b, t] = logprobs - old_logprobs`` at response tokens, ``0`` at padding."""
    # In place on the fresh difference: one [B, T] buffer instead of two.
    return (logprobs - old_logprobs).masked_fill_(~response_mask, 0.0)


def sequence_log_ratio(log_ratio: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Length-normalised sequence log-ratio ``(1/L_b) sum_t log r[b, t]``, shape ``[B]``
    (GSPO, arXiv:2507.18071 Eq. 7). ``log_ratio`` must already be 0 at padding."""
    lengths = response_mask.sum(dim=1).to(log_ratio.dtype)
    return log_ratio.sum(dim=1) / lengths


def ratio(kind: RatioKind, log_ratio: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Per-token ratio ``[B, T]`` of the given kind from a padding-zeroed log-ratio.

    - token: ``exp(log r[b, t])`` (arXiv:1707.06347 Eq. 6)
    - sequence: ``s_b = exp(mean_t log r[b, t])`` broadcast over the row; gradient flows to
      every token of the row (arXiv:2507.18071 Eq. 7)
    - sequence_token: ``sg(s_b) * exp(log r[b, t] - sg(log r[b, t]))``; its value is
      ``s_b`` and its gradient is token-local, ``d/d logprobs[b, t] = s_b``
      (arXiv:2507.18071 Eq. 13)
    - sequence_product: ``exp(sum_t log r[b, t])`` broadcast over the row (the sequence
      likelihood ratio; may overflow to inf, which the CISPO truncation bounds)
    """
    if kind is RatioKind.TOKEN:
        return torch.exp(log_ratio)
    if kind is RatioKind.SEQUENCE_PRODUCT:
        return torch.exp(log_ratio.sum(dim=1, keepdim=True)).expand_as(log_ratio)
    seq = torch.exp(sequence_log_ratio(log_ratio, response_mask))[:, None]
    if kind is RatioKind.SEQUENCE:
        return seq.expand_as(log_ratio)
    # The exp(x - sg(x)) factor is exactly 1 in value and carries the token-local gradient.
    return seq.detach() * torch.exp(log_ratio - log_ratio.detach())
