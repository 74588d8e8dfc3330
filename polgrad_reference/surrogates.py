"""Per-token surrogate objectives (as losses to minimise) and the clip zero-gradient region.

Every surrogate returns a ``[B, T]`` tensor whose aggregation is the policy loss. The
sequence-level ones (GMPO) return their row objective broadcast over the row's tokens, so
that ``seq-mean-token-mean`` aggregation yields the mean over sequences. Stop-gradients
are explicit ``detach`` calls, each commented with the quantity it freezes.
"""

from __future__ import annotations

import math

import torch

from .config import (
    ClipConfig,
    CovarianceSelection,
    DivergenceMask,
    GammaWeight,
    PolicyLossConfig,
    QuadraticPenalty,
    SoftGate,
    SurrogateKind,
    SurrogateParams,
)

__all__ = ["clip_region", "kink_ratios", "surrogate"]


def _clamp(x: torch.Tensor, low: float | None, high: float | None) -> torch.Tensor:
    if low is None and high is None:
        return x
    return torch.clamp(x, min=low, max=high)


def _pg_clip(ratio: torch.Tensor, advantages: torch.Tensor, clip: ClipConfig) -> torch.Tensor:
    loss = torch.maximum(-advantages * ratio, -advantages * _clamp(ratio, clip.low, clip.high))
    if clip.dual_clip is not None:
        loss = torch.where(advantages < 0, torch.minimum(loss, -clip.dual_clip * advantages), loss)
    return loss


def _sapo(ratio: torch.Tensor, advantages: torch.Tensor, gate: SoftGate) -> torch.Tensor:
    """``-(4 / tau) sigmoid(tau (r - 1)) A``, ``tau = tau_pos`` where ``A > 0`` else
    ``tau_neg`` (SAPO, arXiv:2511.20347 Eq. 5-6; verl 0.9.1 and TRL 1.16.0 choose
    ``tau_neg`` for ``A <= 0``). The gate's slope at ``r = 1`` is 1, so on-policy the
    gradient is the policy gradient."""
    tau = torch.full_like(advantages, gate.tau_neg).masked_fill_(advantages > 0, gate.tau_pos)
    return -(4.0 / tau) * torch.sigmoid(tau * (ratio - 1.0)) * advantages


def _gmpo(
    log_ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, clip: ClipConfig
) -> torch.Tensor:
    """GMPO (arXiv:2507.20673 Eq. 6): the geometric mean of the token ratios, each clipped
    in log space to ``[-eps_low, eps_high]`` on the side ``sgn(A)`` selects,
    ``l_b = -mean_t(A) * exp(mean_t sgn(A_t) min(sgn(A_t) lr_t, sgn(A_t) clamp(lr_t)))``,
    broadcast over the row (verl 0.9.1 ``geo_mean``). Tokens with ``A_t = 0`` add 0 to the
    mean log-ratio, as in the paper's formula."""
    lo = None if clip.eps_low is None else -clip.eps_low
    sign = torch.sign(advantages)
    clipped = sign * torch.minimum(sign * log_ratio, sign * _clamp(log_ratio, lo, clip.eps_high))
    lengths = mask.sum(dim=1, keepdim=True).clamp(min=1).to(log_ratio.dtype)
    seq_ratio = torch.exp(torch.where(mask, clipped, 0.0).sum(dim=1, keepdim=True) / lengths)
    adv = torch.where(mask, advantages.expand_as(mask), 0.0).sum(dim=1, keepdim=True) / lengths
    return (-adv * seq_ratio).expand_as(log_ratio)


def _dppo(
    kind: SurrogateKind,
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    params: DivergenceMask,
) -> torch.Tensor:
    """DPPO binary-TV / binary-KL (arXiv:2602.04879; verl 0.9.1 ``dppo_tv`` / ``dppo_kl``):
    ``-A sg(min(r, cap)) log pi * valid`` where ``valid`` (a constant) keeps a token whose
    step stays inside the divergence trust region in the direction ``A`` pushes it:

    - tv: ``A > 0``: ``p - p_old <= delta_high``; ``A <= 0``: ``p - p_old >= -delta_low``;
    - binary_kl, ``D = p_old log(p_old/p) + (1-p_old) log((1-p_old)/(1-p))``:
      ``A > 0``: ``D <= delta_high or p <= p_old``; ``A <= 0``: ``D <= delta_low or p >= p_old``.

    ``D`` is computed exactly (``log(1 - p)`` as ``log(-expm1(log p))``), with the limit
    ``0 log 0 = 0`` for the second term at ``p_old = 1``: there ``D = -log p``, finite for
    ``p > 0`` (``0 * log(0/x)`` would be NaN, and NaN fails both ``<=``, masking a token
    inside the region). verl adds 1e-8 inside its logs, which gives the same limit and moves
    the gate only where ``p`` is within ~1e-8 of 1.
    """
    with torch.no_grad():  # the trust-region gate is a constant (verl detaches it)
        p, p_old = torch.exp(logprobs), torch.exp(old_logprobs)
        if kind is SurrogateKind.DPPO_TV:
            pos_ok = (p - p_old) <= params.delta_high
            neg_ok = (p - p_old) >= -params.delta_low
        else:
            log1m, log1m_old = (
                torch.log(-torch.expm1(logprobs)),
                torch.log(-torch.expm1(old_logprobs)),
            )
            q_old = 1.0 - p_old
            # 0 log 0 = 0: at p_old = 1 the second term vanishes whatever p is.
            second = torch.where(q_old > 0, q_old * (log1m_old - log1m), 0.0)
            div = p_old * (old_logprobs - logprobs) + second
            pos_ok = (div <= params.delta_high) | (p <= p_old)
            neg_ok = (div <= params.delta_low) | (p >= p_old)
        valid = torch.where(advantages > 0, pos_ok, neg_ok)
    weight = _clamp(ratio, None, params.is_cap).detach()  # truncated IS weight, a constant
    return torch.where(valid, -(weight * advantages) * logprobs, 0.0)


def _vespo(
    log_ratio: torch.Tensor, advantages: torch.Tensor, logprobs: torch.Tensor, gamma: GammaWeight
) -> torch.Tensor:
    """VESPO (arXiv:2602.10693; TRL 1.16.0 ``get_gamma_weights``): ``-sg(phi(w)) A log pi``
    with the sequence ratio ``w = exp(sum_t lr_t)`` and the gamma weight
    ``phi(w) = exp(lambda + k log w - lambda w)`` (``phi(1) = 1``); ``(k, lambda)`` are the
    ``_pos`` pair where ``A >= 0``, else the ``_neg`` pair. Computed in log space; an
    overflowing ``w`` gives ``phi = 0``. TRL clamps ``log w`` to ``[log 1e-8, 20]``; the
    reference does not."""
    # phi is a detached gradient scale (TRL computes it under no_grad): sg(log w) below.
    log_w = log_ratio.sum(dim=1, keepdim=True).detach()
    pos = advantages >= 0
    k = torch.full_like(advantages, gamma.k_neg).masked_fill_(pos, gamma.k_pos)
    lam = torch.full_like(advantages, gamma.lambda_neg).masked_fill_(pos, gamma.lambda_pos)
    phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))
    return -(phi * advantages) * logprobs


def _covariance(
    kind: SurrogateKind,
    ratio: torch.Tensor,
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    clip: ClipConfig,
    params: CovarianceSelection,
    selection: torch.Tensor,
) -> torch.Tensor:
    """Clip-Cov / KL-Cov (arXiv:2505.22617 Sec. 4; verl 0.9.1 ``clip_cov`` / ``kl_cov``).

    clip_cov: the PPO-clip loss, with the selected tokens' loss set to 0 (value and
    gradient; verl multiplies by a 0/1 ``corr``). kl_cov: the unclipped ``-r A``, plus
    ``kl_coef * |log r|`` at the selected tokens. ``selection`` is an input (see
    :func:`polgrad_reference.covariance_selection`), so the loss is a pure function.
    """
    if kind is SurrogateKind.CLIP_COV:
        return torch.where(selection, 0.0, _pg_clip(ratio, advantages, clip))
    base = -advantages * ratio
    return torch.where(selection, base + params.kl_coef * log_ratio.abs(), base)


def surrogate(
    kind: SurrogateKind,
    *,
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    logprobs: torch.Tensor,
    clip: ClipConfig,
    log_ratio: torch.Tensor | None = None,
    old_logprobs: torch.Tensor | None = None,
    response_mask: torch.Tensor | None = None,
    params: SurrogateParams | None = None,
    selection: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token loss ``[B, T]`` of a surrogate; ``advantages`` broadcast to ``[B, T]``.

    - pg_clip: ``max(-r A, -clip(r) A)``, i.e. ``-min(r A, clip(r) A)`` (arXiv:1707.06347
      Eq. 7); with dual clip ``c`` the loss of ``A < 0`` tokens is further capped at
      ``-c A`` (arXiv:1912.09729 Eq. 5).
    - pg: ``-r A``.
    - reinforce: ``-A log pi`` (Williams 1992; the ratio is ignored).
    - cispo: ``-sg(clip(r)) A log pi`` (arXiv:2506.13585 Eq. 4); the truncated weight is a
      constant, so the gradient is ``-clip(r) A grad log pi``.
    - sapo, gmpo, dppo_tv, dppo_kl, dro, vespo, clip_cov, kl_cov: see the private helpers
      here and ``docs/losses.md``; they read ``log_ratio`` (0 at padding), ``old_logprobs``,
      ``response_mask``, ``params`` (the config's ``params``) and ``selection``.

    ``logprobs`` must be 0 at padding for the surrogates that read it (``policy_loss``
    ensures this).
    """
    if kind is SurrogateKind.PG_CLIP:
        return _pg_clip(ratio, advantages, clip)
    if kind is SurrogateKind.PG:
        return -advantages * ratio
    if kind is SurrogateKind.REINFORCE:
        return -advantages * logprobs
    if kind is SurrogateKind.CISPO:
        # stop-gradient on the truncated importance weight
        return -(_clamp(ratio, clip.low, clip.high).detach() * advantages) * logprobs
    if kind is SurrogateKind.SAPO:
        assert isinstance(params, SoftGate)
        return _sapo(ratio, advantages, params)
    assert log_ratio is not None, f"surrogate {kind.value!r} needs log_ratio"
    if kind is SurrogateKind.GMPO:
        assert response_mask is not None
        return _gmpo(log_ratio, advantages, response_mask, clip)
    if kind is SurrogateKind.DRO:
        assert isinstance(params, QuadraticPenalty)
        # -(A log pi - beta/2 (log r)^2) (verl 0.9.1 ``dro``)
        return -advantages * logprobs + 0.5 * params.beta * (log_ratio * log_ratio)
    if kind is SurrogateKind.VESPO:
        assert isinstance(params, GammaWeight)
        return _vespo(log_ratio, advantages, logprobs, params)
    if kind in (SurrogateKind.DPPO_TV, SurrogateKind.DPPO_KL):
        assert isinstance(params, DivergenceMask) and old_logprobs is not None
        return _dppo(kind, ratio, advantages, logprobs, old_logprobs, params)
    assert isinstance(params, CovarianceSelection) and selection is not None
    return _covariance(kind, ratio, log_ratio, advantages, clip, params, selection)


def clip_region(*, ratio: torch.Tensor, advantages: torch.Tensor, clip: ClipConfig) -> torch.Tensor:
    """Tokens whose pg_clip gradient is zero because a clip is active, as a bool ``[B, T]``.

    ``A > 0 and r > high``, ``A < 0 and r < low``, or, with dual clip ``c``,
    ``A < 0 and r > c`` (``low``/``high`` from :class:`ClipConfig`, relative or absolute).
    Boundaries are open: at ``r = high`` the gradient is still non-zero. Enforced against
    autograd in ``tests/reference/test_losses.py``.
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


def _selection(
    kind: SurrogateKind,
    params: CovarianceSelection,
    clip: ClipConfig,
    *,
    ratio: torch.Tensor,
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """The tokens Clip-Cov / KL-Cov treat specially, ``[B, T]`` bool (see
    :func:`covariance_selection`). All inputs are detached values."""
    adv = torch.where(mask, advantages.expand_as(mask), 0.0)
    n_tokens = int(mask.sum())
    cov = (adv - adv[mask].mean()) * (logprobs - logprobs[mask].mean())
    k = max(int(params.fraction * n_tokens), 1)
    if kind is SurrogateKind.KL_COV:
        flat = torch.where(mask, cov, -torch.inf).flatten()
        order = torch.sort(flat, descending=True, stable=True).indices[: min(k, n_tokens)]
        out = torch.zeros_like(flat, dtype=torch.bool)
        out[order] = True
        return out.view_as(mask) & mask
    clipped = -advantages * _clamp(ratio, clip.low, clip.high) > -advantages * ratio
    candidates = mask & ~clipped & (cov > params.low) & (cov < params.high)
    n = int(candidates.sum())
    if n <= k:
        return candidates
    if generator is None:  # a pure function of the inputs: the config's seed
        generator = torch.Generator().manual_seed(params.seed)
    idx = candidates.flatten().nonzero().flatten()
    perm = torch.randperm(n, generator=generator, device=generator.device)
    chosen = idx[perm[:k].to(idx.device)]
    out = torch.zeros(mask.numel(), dtype=torch.bool, device=mask.device)
    out[chosen] = True
    return out.view_as(mask)


def kink_ratios(cfg: PolicyLossConfig) -> tuple[float, ...]:
    """The ratio values at which ``cfg``'s per-token loss changes branch, for tolerance
    models that must not compare gradients across a kink: PPO-clip and Clip-Cov at
    ``low``, ``high`` and the dual clip; CISPO at its truncation bounds; GMPO at
    ``exp(-eps_low)`` and ``exp(eps_high)`` (its clip is in log space); KL-Cov at ``r = 1``
    (``|log r|``). The others are smooth in the ratio (SAPO, PG, REINFORCE, DRO, VESPO) or
    gate on probabilities rather than on the ratio (DPPO: ``p - p_old = delta`` or the
    binary KL reaching ``delta``), and return ``()``. The values apply to the ratio of
    ``cfg.ratio`` (a row's sequence ratio for the sequence kinds)."""
    clip, kind = cfg.clip, cfg.surrogate
    if kind in (SurrogateKind.PG_CLIP, SurrogateKind.CLIP_COV, SurrogateKind.CISPO):
        bounds = (clip.low, clip.high, clip.dual_clip if kind is not SurrogateKind.CISPO else None)
        return tuple(b for b in bounds if b is not None)
    if kind is SurrogateKind.GMPO:
        logs = (None if clip.eps_low is None else -clip.eps_low, clip.eps_high)
        return tuple(math.exp(x) for x in logs if x is not None)
    if kind is SurrogateKind.KL_COV:
        return (1.0,)
    return ()
