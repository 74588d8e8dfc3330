"""Per-token estimators of ``KL(pi || ref)`` and the ways a KL penalty enters the objective.

With ``lr = ref_logprobs - logprobs`` at a token sampled from ``pi`` (Schulman 2020,
"Approximating KL Divergence", http://joschu.net/blog/kl-approx.html):

- ``k1 = -lr``: unbiased for ``KL(pi || ref)``;
- ``k2 = lr^2 / 2``: biased (third order in ``lr``), low variance;
- ``k3 = exp(lr) - 1 - lr``: unbiased and non-negative.

Unbiased *values* do not make unbiased *gradients*: differentiated as a loss, k1 has
expected gradient 0 and k3 the gradient of the forward ``KL(ref || pi)``; k2's gradient is
the score-function gradient of ``KL(pi || ref)``, equal to :func:`reverse_kl_surrogate`'s.
Derivations: ``docs/kl.md``.
"""

from __future__ import annotations

import torch

from . import _validate as v
from .advantages import _REWARDS, _some_reward, _token_level
from .config import KLEstimator, KLRatioWeight, _enum, _real
from .errors import ConfigError, InputError, NumericalError

__all__ = [
    "categorical_kl",
    "kl_estimate",
    "kl_penalized_rewards",
    "ratio_weighted",
    "reverse_kl_surrogate",
]


def _log_ratio(mask: torch.Tensor, t: dict[str, torch.Tensor]) -> torch.Tensor:
    """``lr = ref_logprobs - logprobs`` at response tokens and exactly 0 at padding.

    The ``where`` comes before any ``exp``, so padding values (NaN allowed) never reach
    the result or the gradient.
    """
    return torch.where(mask, t["ref_logprobs"] - t["logprobs"], 0.0)


_LOGPROBS = ("logprobs",)


def _kl_inputs(
    logprobs: object, ref_logprobs: object, response_mask: object
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Validated inputs; rows without tokens are allowed (they are all padding)."""
    return v.require_token_inputs(
        response_mask,
        tokens={"logprobs": logprobs, "ref_logprobs": ref_logprobs},
        nonempty=False,
        nonpositive=_LOGPROBS,
    )


def k_values(est: KLEstimator, lr: torch.Tensor) -> torch.Tensor:
    """The estimator's formula on a padding-zeroed ``lr = ref_logprobs - logprobs``, with
    no checks (the hot path of ``policy_loss``, which probes finiteness itself).

    A ``+`` estimator returns ``k2 - sg(k2) + sg(k)``: the base estimator's value with
    k2's gradient (verl 0.9.1 ``kl_penalty``, core_algos.py).
    """
    base = est.base
    if base is KLEstimator.K1:
        k = -lr
    elif base is KLEstimator.K2:
        k = 0.5 * (lr * lr)
    elif base is KLEstimator.ABS:
        k = lr.abs()
    else:
        k = torch.expm1(lr) - lr  # expm1: no cancellation in exp(lr) - 1 for small lr
    if not est.straight_through or base is KLEstimator.K2:
        return k
    k2 = 0.5 * (lr * lr)
    return k2 - k2.detach() + k.detach()  # value sg(k), gradient d k2


def ratio_weighted(
    kl: torch.Tensor, ratio: torch.Tensor, weight: KLRatioWeight, cap: float | None
) -> torch.Tensor:
    """The per-token KL multiplied by the policy ratio ``r`` as ``weight`` says.

    ``undetached``: ``r kl`` (gradient through ``r`` too; TRL 1.16.0 grpo_trainer.py,
    ``use_bias_correction_kl``); ``detached``: ``sg(r) kl``; ``gradient``: value ``kl``,
    gradient ``sg(r) d kl`` (OpenRLHF 0.11.2 utils.py ``compute_approx_kl``). ``cap``
    bounds ``r`` from above first. ``ratio`` must be 1 at padding, where ``kl`` is 0.
    """
    if weight is KLRatioWeight.NONE:
        return kl
    r = ratio if cap is None else ratio.clamp(max=cap)
    if weight is KLRatioWeight.UNDETACHED:
        return r * kl
    if weight is KLRatioWeight.DETACHED:
        return r.detach() * kl
    return kl.detach() + r.detach() * (kl - kl.detach())


def _estimate(est: KLEstimator, lr: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    k = k_values(est, lr)
    bad = ~torch.isfinite(k) & mask
    if bool(bad.any()):
        worst = lr.detach()[bad].abs().max().item()
        raise NumericalError(
            f"the {est.value} estimate overflows {k.dtype} at positions "
            f"{v.format_positions(bad)} (|ref_logprobs - logprobs| up to {worst:.6g}); "
            + (
                "float64 holds exp(x) only for x < 709.78, so ref_logprobs cannot be "
                "log-probabilities of the same tokens: check them"
                if k.dtype == torch.float64
                else "check that ref_logprobs belong to the same tokens; if they do, compute "
                "in float64"
            )
        )
    return k  # lr = 0 at padding makes every estimator exactly 0 there


def kl_estimate(
    estimator: KLEstimator | str,
    *,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
) -> torch.Tensor:
    """Per-token estimate ``[B, T]`` of ``KL(pi || ref)``, exactly 0 at padding.

    With ``lr = ref_logprobs - logprobs``: ``k1 = -lr``, ``k2 = lr^2 / 2``,
    ``k3 = expm1(lr) - lr`` (Schulman 2020). Padding values may be NaN; they get zero
    gradient. Raises ``NumericalError`` instead of returning inf (``exp`` overflow).
    """
    est = _enum(KLEstimator, estimator, "estimator")
    mask, t = _kl_inputs(logprobs, ref_logprobs, response_mask)
    return _estimate(est, _log_ratio(mask, t), mask)


def reverse_kl_surrogate(
    *, logprobs: torch.Tensor, ref_logprobs: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """``sg(logprobs - ref_logprobs) * logprobs`` per token ``[B, T]``, 0 at padding.

    Its value is not a KL; its gradient, ``(log pi - log ref) grad log pi`` at a sample of
    ``pi``, is the unbiased score-function estimator of ``grad KL(pi || ref)`` (the ``+1``
    of ``grad (log pi - log ref) + (log pi - log ref) grad log pi`` has expectation 0 under
    ``pi``). The stop-gradient is the ``detach`` below.
    """
    mask, t = _kl_inputs(logprobs, ref_logprobs, response_mask)
    neg_lr = -_log_ratio(mask, t)
    return neg_lr.detach() * torch.where(mask, t["logprobs"], 0.0)


def kl_penalized_rewards(
    *,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    coef: float,
    rewards: torch.Tensor | None = None,
    token_rewards: torch.Tensor | None = None,
    estimator: KLEstimator | str = KLEstimator.K1,
) -> torch.Tensor:
    """KL as a per-token reward penalty, ``[B, T]``: ``r_t - coef * kl_t``.

    ``r_t`` is ``token_rewards`` plus the scalar ``rewards[b]`` at row ``b``'s last
    response token (at least one given). With k1, the row sum is
    ``r(x, y) - coef * log(pi(y|x) / ref(y|x))``, the InstructGPT objective
    (arXiv:2203.02155 Eq. 2, without the pretraining term). Zero at padding. The result is
    not detached; a reward is a constant to the policy gradient, so detach it before use.
    """
    est = _enum(KLEstimator, estimator, "estimator")
    beta = _real(coef, "coef")
    if beta < 0.0:
        raise ConfigError(f"coef must be >= 0, got {beta}")
    mask, t = v.require_token_inputs(
        response_mask,
        tokens={"logprobs": logprobs, "ref_logprobs": ref_logprobs, "token_rewards": token_rewards},
        rows={"rewards": rewards},
        optional=_REWARDS,
        nonpositive=_LOGPROBS,
    )
    _some_reward(t)
    base = _token_level(mask, t.get("rewards"), t.get("token_rewards"))
    return base - beta * _estimate(est, _log_ratio(mask, t), mask)


def _where(bad: torch.Tensor) -> str:
    return f"positions {v.format_positions(bad)}" if bad.dim() else "its only distribution"


def categorical_kl(*, p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """Exact ``KL(p || q) = sum_i p_i (log p_i - log q_i)`` over the last dimension, where
    ``p = softmax(p_logits)`` and ``q = softmax(q_logits)``; shape ``[...]``.

    ``-inf`` marks an excluded token, as in :func:`~polgrad_reference.token_entropy`: its
    term is ``0 log 0 = 0`` where ``p_i = 0``; where ``q_i = 0`` but ``p_i > 0`` the KL is
    ``+inf``, refused with the positions. NaN and ``+inf`` logits are refused, and so is a
    distribution that is ``-inf`` everywhere.
    """
    p = v.require_float_tensor("p_logits", p_logits)
    q = v.require_float_tensor("q_logits", q_logits)
    if p.dim() == 0 or p.shape[-1] == 0:
        raise InputError(f"p_logits must have a non-empty last dimension, got {list(p.shape)}")
    v.require_shape("q_logits", q, p.shape, "like p_logits")
    v.require_same_dtype({"p_logits": p, "q_logits": q})
    v.require_same_device({"p_logits": p, "q_logits": q})
    for name, z in (("p_logits", p), ("q_logits", q)):
        bad = torch.isnan(z) | (z == torch.inf)
        if bool(bad.any()):
            kind = "NaN" if bool(torch.isnan(z).any()) else "+inf"
            raise InputError(f"{name} holds {kind} at positions {v.format_positions(bad)}")
        empty = (z == -torch.inf).all(dim=-1)
        if bool(empty.any()):
            raise InputError(
                f"{name} is -inf over the whole last dimension (no outcome has probability "
                f"> 0) at {_where(empty)}"
            )
    infinite = (q == -torch.inf) & (p > -torch.inf)
    if bool(infinite.any()):
        raise InputError(
            "KL(p || q) is +inf: q_logits are -inf where p has probability > 0, at positions "
            f"{v.format_positions(infinite)}"
        )
    log_p = torch.log_softmax(p, dim=-1)
    log_q = torch.log_softmax(q, dim=-1)
    keep = p > -torch.inf  # 0 log 0 = 0, selected before any -inf - -inf is formed
    diff = torch.where(keep, log_p, 0.0) - torch.where(keep, log_q, 0.0)
    return (log_p.exp() * diff).sum(dim=-1)
