"""Aggregation of per-token losses, each mode an inner product with closed-form weights.

``aggregate(x, mask, mode) = sum_{b,t} w[b, t] x[b, t]`` where ``w = token_weights(mask,
mode)`` is zero at padding. Because the weights are explicit, the gradient of an
aggregated loss with respect to ``x`` *is* ``w`` (bitwise), and the effect of
micro-batching/gradient accumulation is a different ``w`` that can be compared exactly
(:func:`microbatch_token_weights`). Derivations: ``docs/aggregation.md``.
"""

from __future__ import annotations

import torch

from ._validate import (
    require_finite_where,
    require_response_mask,
    require_shape,
    require_tensor,
)
from .config import Aggregation, MicroBatchScaling, _enum, _positive_int
from .errors import ConfigError, InputError, NumericalError

__all__ = ["aggregate", "microbatch_token_weights", "token_weights"]


def _budget_for(mode: Aggregation, budget: int | None) -> int | None:
    if mode is Aggregation.TOKEN_SUM_NORM:
        return _positive_int(budget, "budget")
    if budget is not None:
        raise ConfigError(f"budget applies to mode='token-sum-norm' only, got budget={budget!r}")
    return None


def _weights(
    mask: torch.Tensor, mode: Aggregation, budget: int | None, dtype: torch.dtype
) -> torch.Tensor:
    """Weights for a validated mask. Rows without tokens get weight 0 and are not counted
    as sequences by the seq-mean modes (only the rollout-IS 'mask' mode creates them)."""
    m = mask.to(dtype)  # a fresh buffer: the divisions below are done in place
    if mode is Aggregation.TOKEN_SUM:
        return m
    if mode is Aggregation.TOKEN_MEAN:
        return m.div_(m.sum().clamp(min=1.0))
    if mode is Aggregation.TOKEN_SUM_NORM:
        assert budget is not None
        return m.div_(float(mask.shape[0] * budget))
    lengths = m.sum(dim=1, keepdim=True)
    rows = (lengths > 0).sum().clamp(min=1).to(dtype)
    if mode is Aggregation.SEQ_MEAN_TOKEN_SUM:
        return m.div_(rows)
    return m.div_(lengths.clamp(min=1.0) * rows)  # SEQ_MEAN_TOKEN_MEAN


def token_weights(
    response_mask: torch.Tensor,
    mode: Aggregation | str,
    *,
    budget: int | None = None,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Closed-form per-token weights ``w[b, t]`` of an aggregation mode.

    With ``L_b`` the length of row ``b``, ``B`` rows and ``N = sum_b L_b`` tokens:

    - token-mean: ``1 / N`` (DAPO, arXiv:2503.14476 Eq. 8)
    - seq-mean-token-mean: ``1 / (B L_b)`` (GRPO, arXiv:2402.03300 Eq. 3)
    - seq-mean-token-sum: ``1 / B``
    - token-sum: ``1``
    - token-sum-norm: ``1 / (B budget)`` (Dr.GRPO, arXiv:2503.20783 Sec. 3.1)

    and ``0`` at padding.
    """
    mask = require_response_mask(response_mask)
    if not dtype.is_floating_point:
        raise ConfigError(f"dtype must be a floating-point dtype, got {dtype}")
    mode = _enum(Aggregation, mode, "mode")
    return _weights(mask, mode, _budget_for(mode, budget), dtype)


def aggregate(
    x: torch.Tensor,
    *,
    response_mask: torch.Tensor,
    mode: Aggregation | str,
    budget: int | None = None,
) -> torch.Tensor:
    """Aggregate per-token values ``x [B, T]`` into a scalar: ``sum(w * x)`` over the mask.

    Values of ``x`` at padding are ignored (also NaN/inf) and receive exactly zero
    gradient. ``w`` is :func:`token_weights` in ``x``'s dtype. A NaN or inf at a response
    token raises ``InputError`` naming the positions (as ``policy_loss`` does for the same
    input), and a sum that overflows ``x``'s dtype raises ``NumericalError``: the result
    is never a silent NaN or inf.
    """
    x = require_tensor("x", x)
    if not x.is_floating_point():
        raise InputError(f"x must have a floating-point dtype, got {x.dtype}")
    w = token_weights(response_mask, mode, budget=budget, dtype=x.dtype)
    require_shape("x", x, w.shape, "[B, T] like response_mask")
    out = _inner(x, response_mask, w)
    if not bool(torch.isfinite(out.detach())):
        require_finite_where("x", x.detach(), response_mask)
        raise NumericalError(
            f"the aggregate of x ({x.dtype}) overflows to {out.item()} although every response "
            "value is finite; the weighted sum exceeds the dtype's range (compute in float64)"
        )
    return out


def _inner(x: torch.Tensor, mask: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``sum(w * x)`` with padding values of ``x`` replaced by zero (no NaN leaks)."""
    return (torch.where(mask, x, 0.0) * w).sum()


def microbatch_token_weights(
    response_mask: torch.Tensor,
    mode: Aggregation | str,
    *,
    micro_batch_size: int,
    scaling: MicroBatchScaling | str = MicroBatchScaling.MEAN,
    budget: int | None = None,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Per-token weights induced by gradient accumulation over micro-batches.

    Rows are split into consecutive chunks of ``micro_batch_size`` (the last may be
    shorter); each chunk is aggregated with ``mode`` on its own rows, and the chunk losses
    are summed after scaling by ``1 / K`` (``scaling='mean'``, ``K`` chunks) or ``1``
    (``'sum'``). The result equals the full-batch :func:`token_weights` only for
    token-sum (sum scaling) and for seq-mean / token-sum-norm with equal chunks (mean
    scaling); token-mean differs whenever chunks hold different token counts.
    """
    mask = require_response_mask(response_mask)
    size = _positive_int(micro_batch_size, "micro_batch_size")
    mode = _enum(Aggregation, mode, "mode")
    scaling = _enum(MicroBatchScaling, scaling, "scaling")
    budget = _budget_for(mode, budget)
    chunks = torch.split(mask, size, dim=0)
    scale = 1.0 / len(chunks) if scaling is MicroBatchScaling.MEAN else 1.0
    return torch.cat([_weights(c, mode, budget, dtype) * scale for c in chunks], dim=0)
