"""``policy_loss``: one code path that evaluates every point of the loss algebra.

``loss = aggregate(w_is * surrogate(ratio), mask') + coef * aggregate(kl, mask')`` where
``w_is`` / ``mask'`` come from the optional rollout importance-sampling correction and the
KL term is present only when the config places it in the loss.
"""

from __future__ import annotations

import dataclasses

import torch

from . import _validate as v
from .aggregate import _weights
from .config import (
    CovarianceSelection,
    ISCorrection,
    ISLevel,
    ISMode,
    ISWeight,
    PolicyLossConfig,
    SurrogateKind,
)
from .errors import ConfigError, InputError, NumericalError
from .kl import k_values, ratio_weighted
from .ratios import masked_log_ratio, ratio
from .surrogates import _selection, surrogate

__all__ = ["PolicyLossOutput", "covariance_selection", "policy_loss"]


@dataclasses.dataclass(frozen=True)
class PolicyLossOutput:
    """Everything ``policy_loss`` computed, for inspection and for the conformance kit."""

    loss: torch.Tensor
    """Scalar loss to minimise (policy term plus the KL term when it is in the loss)."""
    token_loss: torch.Tensor
    """Per-token policy objective ``[B, T]`` (IS-weighted); finite but meaningless at
    padding, where ``weights`` is 0."""
    ratio: torch.Tensor
    """Importance ratio ``[B, T]`` of the configured kind (1 at padding)."""
    weights: torch.Tensor
    """Aggregation weights ``[B, T]`` of the policy term, zero at padding."""
    response_mask: torch.Tensor
    """The mask that was aggregated over (the input mask less IS-masked tokens)."""
    kl: torch.Tensor | None = None
    """Per-token KL estimate ``[B, T]`` when the KL term is in the loss, else None."""
    kl_coef: float = 0.0
    """Coefficient of the KL term (0 when it is not in the loss)."""
    kl_weights: torch.Tensor | None = None
    """The KL term's aggregation weights when they differ from ``weights``, else None."""

    @property
    def policy_loss(self) -> torch.Tensor:
        """The policy term alone, ``sum(weights * token_loss)`` (differentiable)."""
        return (self.token_loss * self.weights).sum()

    @property
    def kl_loss(self) -> torch.Tensor | None:
        """The KL term alone, ``coef * aggregate(kl)``, or None (differentiable)."""
        if self.kl is None:
            return None
        weights = self.weights if self.kl_weights is None else self.kl_weights
        return self.kl_coef * (self.kl * weights).sum()


def _check_inputs(
    cfg: PolicyLossConfig,
    logprobs: object,
    old_logprobs: object,
    advantages: object,
    response_mask: object,
    ref_logprobs: object,
    rollout_logprobs: object,
    policy_only: bool = False,
) -> dict[str, torch.Tensor]:
    """Metadata-only checks: types, dtypes, devices, shapes, required optional tensors."""
    if not isinstance(cfg, PolicyLossConfig):
        raise ConfigError(f"cfg must be a PolicyLossConfig, got {type(cfg).__name__}")
    mask = v.require_response_mask(response_mask, nonempty=False)  # rows: after computing
    floats = {
        "logprobs": v.require_float_tensor("logprobs", logprobs),
        "old_logprobs": v.require_float_tensor("old_logprobs", old_logprobs),
        "advantages": v.require_float_tensor("advantages", advantages),
    }
    needs = {
        "ref_logprobs": (ref_logprobs, cfg.kl_in_loss, "the config places a KL term in the loss"),
        "rollout_logprobs": (
            rollout_logprobs,
            cfg.is_correction is not None,
            "the config has a rollout importance-sampling correction",
        ),
    }
    for name, (value, needed, why) in needs.items():
        if needed and not policy_only:
            if value is None:
                raise InputError(f"{name} is required because {why}")
            floats[name] = v.require_float_tensor(name, value)
    shape = tuple(mask.shape)
    for name, t in floats.items():
        if name == "advantages" and t.dim() == 1:
            v.require_shape(name, t, shape[:1], "[B]")
        else:
            v.require_shape(name, t, shape, "[B, T] (or [B] for advantages)")
    v.require_same_dtype(floats)
    v.require_same_device({**floats, "response_mask": mask})
    return {"response_mask": mask, **floats}


_READS_LOGPROBS = frozenset(
    {
        SurrogateKind.REINFORCE,
        SurrogateKind.CISPO,
        SurrogateKind.DPPO_TV,
        SurrogateKind.DPPO_KL,
        SurrogateKind.DRO,
        SurrogateKind.VESPO,
        SurrogateKind.CLIP_COV,
        SurrogateKind.KL_COV,
    }
)
_READS_OLD = frozenset({SurrogateKind.DPPO_TV, SurrogateKind.DPPO_KL})
# Surrogates that differentiate through the ratio itself. The others never do (REINFORCE,
# DRO, GMPO, VESPO read log-ratios; CISPO and DPPO a detached truncation), so an
# overflowing ratio is no error for them: their loss is probed instead.
_RATIO_IN_GRAPH = frozenset(
    {
        SurrogateKind.PG_CLIP,
        SurrogateKind.PG,
        SurrogateKind.SAPO,
        SurrogateKind.CLIP_COV,
        SurrogateKind.KL_COV,
    }
)


def _token_selection(
    cfg: PolicyLossConfig,
    given: object,
    lp: torch.Tensor,
    r: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    generator: torch.Generator | None,
) -> torch.Tensor:
    if given is not None:
        sel = v.require_bool_mask("token_selection", given)
        v.require_shape("token_selection", sel, tuple(mask.shape), "[B, T] like response_mask")
        v.require_same_device({"token_selection": sel, "response_mask": mask})
        return sel & mask
    if not bool(mask.any()):
        return torch.zeros_like(mask)
    assert isinstance(cfg.params, CovarianceSelection)
    return _selection(
        cfg.surrogate,
        cfg.params,
        cfg.clip,
        ratio=r.detach(),
        logprobs=lp.detach(),
        advantages=adv,
        mask=mask,
        generator=generator,
    )


def covariance_selection(
    cfg: PolicyLossConfig,
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The tokens a Clip-Cov / KL-Cov loss treats specially, bool ``[B, T]``
    (arXiv:2505.22617 Sec. 4; verl 0.9.1 ``compute_policy_loss_clip_cov`` / ``_kl_cov``).

    With ``cov = (A - mean A) (log pi - mean log pi)`` over the response tokens and
    ``k = max(floor(fraction * N), 1)``: KL-Cov takes the ``k`` largest ``cov`` (ties: the
    lowest flat index first, a deterministic choice where verl's ``topk`` leaves ties
    unspecified). Clip-Cov's candidates are the tokens with ``low < cov < high`` whose clip
    is not already active; it takes all of them when there are at most ``k``, else ``k``
    drawn uniformly with ``generator`` (default: seeded with ``cfg.params.seed``; verl
    draws with the global RNG, so its choice is not reproducible). The loss is then a pure
    function of its inputs, its config and the selection.
    """
    t = _check_inputs(cfg, logprobs, old_logprobs, advantages, response_mask, None, None, True)
    if not cfg.needs_selection:
        raise ConfigError(
            f"covariance_selection applies to surrogates 'clip_cov' and 'kl_cov', "
            f"got {cfg.surrogate.value!r}"
        )
    mask = t["response_mask"]
    for name in ("logprobs", "old_logprobs"):
        v.require_finite_where(name, t[name], mask)
    v.require_nonpositive_where("logprobs", t["logprobs"], mask)
    adv = t["advantages"].detach()
    v.require_finite_where("advantages", adv, mask if adv.dim() == 2 else None)
    adv = adv[:, None] if adv.dim() == 1 else torch.where(mask, adv, 0.0)
    lp = torch.where(mask, t["logprobs"].detach(), 0.0)
    r = ratio(cfg.ratio, masked_log_ratio(lp, t["old_logprobs"].detach(), mask), mask)
    return _token_selection(cfg, None, lp, r, adv, mask, generator)


def _log_rho(corr: ISCorrection, token_log_rho: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``log rho`` at the correction's level: ``[B, T]`` (token) or ``[B, 1]`` (row)."""
    if corr.level is ISLevel.TOKEN:
        return token_log_rho
    total = token_log_rho.sum(dim=1, keepdim=True)
    if corr.level is ISLevel.SEQUENCE:
        return total
    return total / mask.sum(dim=1, keepdim=True).clamp(min=1).to(total.dtype)  # GEOMETRIC


def _apply_is(
    corr: ISCorrection,
    token_loss: torch.Tensor,
    old: torch.Tensor,
    rollout: torch.Tensor,
    mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply a rollout IS correction; returns ``(token_loss, mask)``.

    ``rho = exp(old - rollout)`` (detached) at ``corr.level``; truncate multiplies by
    ``clamp(rho, low, cap)``; mask drops out-of-band units from ``mask`` (and so from every
    denominator); zero gives them weight 0 and keeps them in the denominators. Surviving
    units carry ``corr.weight``. Out-of-band weights are selected away with ``where``, never
    multiplied, so an overflowing ``rho`` there cannot leak inf or NaN.
    """
    token_log_rho = torch.where(mask, old - rollout, 0.0).detach()
    rho = torch.exp(_log_rho(corr, token_log_rho, mask))
    if corr.mode is ISMode.TRUNCATE:
        return token_loss * rho.clamp(min=corr.low, max=corr.cap), mask
    keep = torch.ones_like(rho, dtype=torch.bool)
    if corr.low is not None:
        keep &= rho >= corr.low
    if corr.high is not None:
        keep &= rho <= corr.high
    keep = keep.expand_as(mask)
    weight = None
    if corr.weight is ISWeight.LEVEL:
        weight = rho
    elif corr.weight is ISWeight.TOKEN:
        weight = torch.exp(token_log_rho)
    if weight is not None:
        token_loss = token_loss * torch.where(keep, weight, 1.0)
    if corr.mode is ISMode.MASK:
        mask = mask & keep
    return torch.where(mask & keep, token_loss, 0.0), mask


_LOGPROBS = ("logprobs", "old_logprobs", "ref_logprobs", "rollout_logprobs")


def _largest_logprob(lp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The largest ``logprobs`` at a response position (a probe: log-probabilities are
    ``<= 0``); ``-inf`` without response tokens."""
    return torch.where(mask, lp.detach(), -torch.inf).amax()


def _overflow_advice(dtype: torch.dtype, other: str) -> str:
    """What to do about an ``exp`` overflow: in float64 no wider dtype exists, and a
    log-ratio past ~709 means the two tensors do not describe the same tokens."""
    check = (
        f"check that {other} are log-probabilities of the same tokens as logprobs "
        "(not logits, probabilities or another row's values)"
    )
    if dtype == torch.float64:
        return (
            f"float64 holds exp(x) only for x < 709.78, and no pair of log-probabilities of "
            f"the same tokens is that far apart: {check}"
        )
    return f"{check}; if they are, compute in float64 (exp(x) is finite there for x < 709.78)"


def _explain_failure(
    cfg: PolicyLossConfig, t: dict[str, torch.Tensor], out: PolicyLossOutput
) -> None:
    """Slow path, run only when a cheap probe saw a non-finite value or an empty row.

    Raises the most specific error it can find; returns when the probe was a false alarm
    (a sum of large but finite values overflowing).
    """
    mask = t["response_mask"]
    v.require_nonempty_rows("response_mask", mask)
    for name in _LOGPROBS:
        if name in t:
            v.require_finite_where(name, t[name], mask)
    v.require_nonpositive_where("logprobs", t["logprobs"], mask)
    adv = t["advantages"]
    v.require_finite_where("advantages", adv, mask if adv.dim() == 2 else None)
    bad = ~torch.isfinite(out.ratio) & mask
    if cfg.surrogate in _RATIO_IN_GRAPH and bool(bad.any()):
        lr = (t["logprobs"] - t["old_logprobs"]).detach()[bad].max().item()
        raise NumericalError(
            f"the importance ratio exp(logprobs - old_logprobs) overflows "
            f"{out.ratio.dtype} at positions {v.format_positions(bad)} "
            f"(largest log-ratio {lr:.6g}); {_overflow_advice(out.ratio.dtype, 'old_logprobs')}"
        )
    if out.kl is not None:
        bad = ~torch.isfinite(out.kl) & out.response_mask
        if bool(bad.any()):
            raise NumericalError(
                f"the KL estimate overflows {out.kl.dtype} at positions "
                f"{v.format_positions(bad)}: ref_logprobs - logprobs is too large there; "
                f"{_overflow_advice(out.kl.dtype, 'ref_logprobs')}"
            )
    for name, value in (("kl_loss", out.kl_loss), ("loss", out.loss)):
        if value is not None and not bool(torch.isfinite(value)):
            raise NumericalError(
                f"the {name} is {value.item()} although every input is finite; the "
                "per-token terms overflow their dtype (advantages or log-ratios too large)"
            )


def policy_loss(
    cfg: PolicyLossConfig,
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    ref_logprobs: torch.Tensor | None = None,
    rollout_logprobs: torch.Tensor | None = None,
    token_selection: torch.Tensor | None = None,
) -> PolicyLossOutput:
    """Evaluate the policy loss ``cfg`` on a ``[B, T]`` right-padded batch.

    ``logprobs`` is the only differentiable input; ``old_logprobs``, ``advantages``
    (``[B]`` or ``[B, T]``), ``ref_logprobs`` and ``rollout_logprobs`` are treated as
    constants. Values at padding are ignored (NaN allowed) and get zero gradient. Computes
    in the inputs' dtype; the conformance oracle passes float64.

    ``token_selection`` (bool ``[B, T]``) is the set of tokens Clip-Cov / KL-Cov treat
    specially; when omitted it is :func:`covariance_selection` (Clip-Cov's random draw
    seeded by ``cfg.params.seed``).

    Raises ``InputError``/``InputTypeError`` for malformed input (naming the argument and
    positions: a log-probability ``> 0`` at a response position included) and
    ``NumericalError`` instead of returning inf/NaN.
    """
    t = _check_inputs(
        cfg, logprobs, old_logprobs, advantages, response_mask, ref_logprobs, rollout_logprobs
    )
    mask = t["response_mask"]
    lp = t["logprobs"]
    old = t["old_logprobs"].detach()
    adv = t["advantages"].detach()
    adv = adv[:, None] if adv.dim() == 1 else torch.where(mask, adv, 0.0)

    log_ratio = masked_log_ratio(lp, old, mask)
    r = ratio(cfg.ratio, log_ratio, mask)
    if cfg.surrogate in _READS_LOGPROBS:
        lp = torch.where(mask, lp, 0.0)  # these read log pi itself: keep padding out
    if cfg.surrogate in _READS_OLD:
        old = torch.where(mask, old, 0.0)
    selection = None
    if cfg.needs_selection:
        selection = _token_selection(cfg, token_selection, lp, r, adv, mask, None)
    elif token_selection is not None:
        raise InputError(
            f"token_selection applies to surrogates 'clip_cov' and 'kl_cov' only, "
            f"got surrogate={cfg.surrogate.value!r}"
        )
    token_loss = surrogate(
        cfg.surrogate,
        ratio=r,
        advantages=adv,
        logprobs=lp,
        clip=cfg.clip,
        log_ratio=log_ratio,
        old_logprobs=old,
        response_mask=mask,
        params=cfg.params,
        selection=selection,
    )
    probes = [log_ratio.detach().sum()]
    if cfg.surrogate in _RATIO_IN_GRAPH:  # an inf ratio there would make NaN gradients
        probes.append(r.detach().sum())
    del log_ratio  # autograd keeps what it needs; holding it would raise peak memory

    corr = cfg.is_correction
    if corr is not None:
        rollout = torch.where(mask, t["rollout_logprobs"].detach(), 0.0)
        probes.append(rollout.sum())
        token_loss, mask = _apply_is(corr, token_loss, old, rollout, mask)

    # Every per-token term is finite at padding from here on and every weight is 0 there, so each
    # aggregation is a plain inner product with its weights.
    weights = _weights(mask, cfg.aggregation, cfg.budget, lp.dtype)
    kl = kl_weights = None
    coef = 0.0
    if cfg.kl_in_loss:
        assert cfg.kl is not None
        ref_lr = (t["ref_logprobs"].detach() - lp).masked_fill_(~mask, 0.0)
        kl = ratio_weighted(
            k_values(cfg.kl.estimator, ref_lr), r, cfg.kl.ratio_weight, cfg.kl.ratio_cap
        )
        del ref_lr
        probes.append(kl.detach().sum())
        coef = cfg.kl.coef
        agg = cfg.kl.aggregation or cfg.aggregation
        if agg is cfg.aggregation:
            total = (torch.add(token_loss, kl, alpha=coef) * weights).sum()
        else:
            kl_weights = _weights(mask, agg, cfg.budget, lp.dtype)
            total = (token_loss * weights).sum() + coef * (kl * kl_weights).sum()
    else:
        total = (token_loss * weights).sum()
    out = PolicyLossOutput(total, token_loss, r, weights, mask, kl, coef, kl_weights)

    lengths_ok = t["response_mask"].any(dim=1).all()
    probes.append(total.detach())
    valid = torch.isfinite(torch.stack(probes)).all() & lengths_ok
    valid &= _largest_logprob(t["logprobs"], t["response_mask"]) <= 0
    if not bool(valid):
        _explain_failure(cfg, t, out)
    return out
