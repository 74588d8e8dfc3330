"""Entropy of the policy's next-token distribution over masked ``[B, T, V]`` logits.

``H_t = -sum_v p_v log p_v`` with ``p = softmax(z_t)``, computed as
``H = log sum_v exp(z_v - m) - sum_v p_v (z_v - m)`` with ``m = max_v z_v`` (the shift
leaves ``H`` unchanged and keeps ``exp`` finite for logits of any size, e.g. ``1e4``).
The entropy bonus is the aggregated ``H`` (verl 0.9.1 ``compute_entropy_loss`` aggregates
``entropy_from_logits`` with ``agg_loss``; PPO adds ``c_2 S`` to the objective,
arXiv:1707.06347 Eq. 9). The sampled-token estimate ``-log pi(y_t)`` is unbiased for
``H_t`` only when ``y_t`` is drawn from ``pi`` itself (on-policy). Derivations:
``docs/entropy.md``.
"""

from __future__ import annotations

import torch

from . import _validate as v
from .aggregate import aggregate
from .config import Aggregation
from .errors import InputError, NumericalError

__all__ = ["entropy_bonus", "sampled_token_entropy", "token_entropy"]


def _logits(logits: object, response_mask: object) -> tuple[torch.Tensor, torch.Tensor]:
    """Float ``[B, T, V]`` logits (``V >= 1``) and a ``[B, T]`` bool mask with non-empty
    rows; no NaN or ``+inf`` at response positions (``-inf`` marks an excluded token)."""
    z = v.require_float_tensor("logits", logits)
    if z.dim() != 3 or z.shape[2] == 0:
        raise InputError(f"logits must have shape [B, T, V] with V >= 1, got {list(z.shape)}")
    mask = v.require_response_mask(response_mask)
    v.require_shape("response_mask", mask, tuple(z.shape[:2]), "[B, T] of logits")
    v.require_same_device({"logits": z, "response_mask": mask})
    bad = (torch.isnan(z) | (z == torch.inf)) & mask[:, :, None]
    if bool(bad.any()):
        kind = "NaN" if bool(torch.isnan(z[bad]).any()) else "+inf"
        raise InputError(
            f"logits hold {kind} at response positions (b, t, v) {v.format_positions(bad)}"
        )
    allinf = (z == -torch.inf).all(dim=2) & mask
    if bool(allinf.any()):
        raise InputError(
            "logits are -inf over the whole vocabulary (no token has probability > 0) at "
            f"response positions {v.format_positions(allinf)}"
        )
    return z, mask


def _entropy(z: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Exact softmax entropy on validated input, ``[B, T]``, 0 at padding."""
    z = torch.where(mask[:, :, None], z, 0.0)  # padding may hold anything
    shifted = z - z.detach().amax(dim=2, keepdim=True)  # the shift is a constant: H unchanged
    logp = torch.log_softmax(shifted, dim=2)
    p = logp.exp()
    # 0 log 0 = 0 (-inf logits, underflow); log p replaced before the product, so no
    # 0 * -inf reaches the forward or the backward pass
    safe = torch.where(p > 0, logp, 0.0)
    h = torch.where(mask, -(p * safe).sum(dim=2), 0.0)
    if not bool(torch.isfinite(h).all()):
        raise NumericalError(f"entropy is not finite in {z.dtype}; compute in float32 or float64")
    return h


def token_entropy(*, logits: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``H[b, t] = -sum_v softmax(z)_v log softmax(z)_v``, ``[B, T]``, exactly 0 at padding
    (where logits may be NaN and get zero gradient). Computed in the logits' dtype."""
    z, mask = _logits(logits, response_mask)
    return _entropy(z, mask)


def entropy_bonus(
    *,
    logits: torch.Tensor,
    response_mask: torch.Tensor,
    mode: Aggregation | str = Aggregation.TOKEN_MEAN,
    budget: int | None = None,
) -> torch.Tensor:
    """The aggregated entropy ``aggregate(H, response_mask, mode)``: a quantity to
    maximise (a trainer subtracts ``coef * bonus`` from its loss). Token-mean by default,
    as verl's ``compute_entropy_loss``."""
    h = token_entropy(logits=logits, response_mask=response_mask)
    return aggregate(h, response_mask=response_mask, mode=mode, budget=budget)


def sampled_token_entropy(*, logprobs: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """The one-sample Monte Carlo estimate ``-log pi(y_t)``, ``[B, T]``, 0 at padding.

    ``E_{y ~ pi}[-log pi(y)] = H(pi)``: unbiased only for tokens sampled from ``pi``
    itself; its gradient is not the entropy gradient (``grad -log pi(y)`` has expectation
    ``0``, not ``grad H``), so it is a diagnostic, not a bonus to differentiate.
    """
    mask, t = v.require_token_inputs(
        response_mask, tokens={"logprobs": logprobs}, nonpositive=("logprobs",)
    )
    return torch.where(mask, -t["logprobs"], 0.0)
