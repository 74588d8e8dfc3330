"""Per-token surrogate objectives (as losses to minimise) and the clip zero-gradient region."""

from __future__ import annotations

import torch

from .config import ClipConfig, SurrogateKind

__all__ = ["clip_region", "surrogate"]


def _clamp(x: torch.Tensor, clip: ClipConfig) -> torch.Tensor:
    if clip.low is None and clip.high is None:
        return x
    return torch.clamp(x, min=clip.low, max=clip.high)


def surrogate(
    kind: SurrogateKind,
    *,
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    logprobs: torch.Tensor,
    clip: ClipConfig,
) -> torch.Tensor:
    """Per-token loss ``[B, T]`` of a surrogate; ``advantages`` broadcast to ``[B, T]``.

    - pg_clip: ``max(-r A, -clip(r) A)``, i.e. ``-min(r A, clip(r) A)`` (arXiv:1707.06347
      Eq. 7); with dual clip ``c`` the loss of ``A < 0`` tokens is further capped at
      ``-c A`` (arXiv:1912.09729 Eq. 5).
    - pg: ``-r A``.
    - reinforce: ``-A log pi`` (Williams 1992; the ratio is ignored).
    - cispo: ``-sg(clip(r)) A log pi`` (arXiv:2506.13585 Eq. 4); the truncated weight is a
      constant, so the gradient is ``-clip(r) A grad log pi``.
    """
    if kind is SurrogateKind.PG_CLIP:
        loss = torch.maximum(-advantages * ratio, -advantages * _clamp(ratio, clip))
        if clip.dual_clip is not None:
            loss = torch.where(
                advantages < 0, torch.minimum(loss, -clip.dual_clip * advantages), loss
            )
        return loss
    if kind is SurrogateKind.PG:
        return -advantages * ratio
    if kind is SurrogateKind.REINFORCE:
        return -advantages * logprobs
    # CISPO: stop-gradient on the truncated importance weight.
    return -(_clamp(ratio, clip).detach() * advantages) * logprobs


def clip_region(*, ratio: torch.Tensor, advantages: torch.Tensor, clip: ClipConfig) -> torch.Tensor:
    """Tokens whose pg_clip gradient is zero because a clip is active, as a bool ``[B, T]``.

    ``A > 0 and r > 1 + eps_high``, ``A < 0 and r < 1 - eps_low``, or, with dual clip ``c``,
    ``A < 0 and r > c``. Boundaries are open: at ``r = 1 + eps_high`` the gradient is
    still non-zero. Enforced against autograd in ``tests/test_surrogates.py``.
    """
    pos, neg = advantages > 0, advantages < 0
    region = torch.zeros_like(ratio, dtype=torch.bool)
    if clip.high is not None:
        region |= pos & (ratio > clip.high)
    if clip.low is not None:
        region |= neg & (ratio < clip.low)
    if clip.dual_clip is not None:
        region |= neg & (ratio > clip.dual_clip)
    return region
