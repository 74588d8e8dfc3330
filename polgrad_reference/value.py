"""Clipped value-function loss (PPO critic) over masked ``[B, T]`` batches.

``L_t = 0.5 * max((V_t - R_t)^2, (clip(V_t, V_old_t - c, V_old_t + c) - R_t)^2)``, then
aggregated with :func:`polgrad_reference.aggregate.aggregate`. The PPO paper
(arXiv:1707.06347 Eq. 9) writes the unclipped ``(V - V_targ)^2``; the clipped form and the
factor 0.5 are the OpenAI baselines ``ppo2`` convention. Derivations: ``docs/value.md``.
"""

from __future__ import annotations

import torch

from . import _validate as v
from .aggregate import aggregate
from .config import Aggregation, _real
from .errors import ConfigError

__all__ = ["clipped_value_loss", "value_loss_per_token"]


def _clip_range(value: object) -> float | None:
    if value is None:
        return None
    c = _real(value, "clip_range")
    if c <= 0.0:
        raise ConfigError(f"clip_range must be > 0, got {c}")
    return c


def value_loss_per_token(
    *,
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    clip_range: float | None,
) -> torch.Tensor:
    """``0.5 * max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2)`` per token, ``[B, T]``;
    ``clip_range=None`` is the unclipped ``0.5 * (V - R)^2`` (PPO Eq. 9's squared error;
    ``old_values`` is then validated but unused).

    Exactly 0 at padding, where values may be NaN and get zero gradient. Inside the clip
    range both terms coincide and the gradient is ``V - R``; outside it the gradient is 0
    whenever the clipped term is the larger.
    """
    c = _clip_range(clip_range)
    mask, t = v.require_token_inputs(
        response_mask, tokens={"values": values, "old_values": old_values, "returns": returns}
    )
    val, old, ret = (torch.where(mask, t[k], 0.0) for k in ("values", "old_values", "returns"))
    if c is None:
        return 0.5 * (val - ret) ** 2  # 0 at padding
    clipped = torch.minimum(torch.maximum(val, old - c), old + c)
    return 0.5 * torch.maximum((val - ret) ** 2, (clipped - ret) ** 2)  # 0 at padding


def clipped_value_loss(
    *,
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    clip_range: float | None,
    mode: Aggregation | str = Aggregation.TOKEN_MEAN,
    budget: int | None = None,
) -> torch.Tensor:
    """Scalar clipped value loss: :func:`value_loss_per_token` aggregated with ``mode``
    (``budget`` for ``token-sum-norm``); token-mean by default, as in baselines ``ppo2`` and
    verl 0.9.1 ``compute_value_loss`` (which applies the 0.5 after ``agg_loss``: the same
    value, since every aggregation is linear)."""
    per_token = value_loss_per_token(
        values=values,
        old_values=old_values,
        returns=returns,
        response_mask=response_mask,
        clip_range=clip_range,
    )
    return aggregate(per_token, response_mask=response_mask, mode=mode, budget=budget)
