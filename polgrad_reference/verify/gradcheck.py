"""Float64 gradient checks of policy losses over ragged batches.

``gradcheck_policy_loss`` compares autograd's ``d loss / d logprobs`` with central finite
differences of the same loss with its stop-gradients frozen at the base point
(:class:`~polgrad_reference.verify.FrozenStopGradients`): the smooth function whose
gradient the stop-gradient semantics define. Clipped, truncated and detached branches are
therefore checked too. ``ragged_batch`` draws float64 batches that reach every clip region
and stay away from the non-differentiable points (clip and IS bounds) of a config.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from ..config import ISCorrection, ISLevel, PolicyLossConfig, RatioKind
from ..errors import InputError, InputTypeError
from ..loss import policy_loss
from ._frozen import FrozenStopGradients

__all__ = ["GradcheckResult", "VerificationError", "gradcheck_policy_loss", "ragged_batch"]

F64 = torch.float64


class VerificationError(AssertionError):
    """A verification found a gradient (or expectation) that disagrees with its reference."""


@dataclasses.dataclass(frozen=True)
class GradcheckResult:
    """Autograd against central finite differences at every response token."""

    analytic: torch.Tensor
    """``d loss / d logprobs`` from autograd, ``[B, T]``."""
    numeric: torch.Tensor
    """Central differences of the frozen-stop-gradient loss, ``[B, T]`` (0 at padding)."""
    tolerance: torch.Tensor
    """Per-token allowed ``|analytic - numeric|``."""

    @property
    def errors(self) -> torch.Tensor:
        """``|analytic - numeric| / tolerance`` per token (``<= 1`` passes)."""
        return (self.analytic - self.numeric).abs() / self.tolerance

    @property
    def ok(self) -> bool:
        return bool((self.errors <= 1.0).all())

    def summary(self) -> str:
        err = self.errors
        worst = int(err.argmax())
        b, t = divmod(worst, err.shape[1])
        return (
            f"gradcheck {'passed' if self.ok else 'FAILED'}: worst at (b, t) = ({b}, {t}): "
            f"autograd {float(self.analytic[b, t]):.12g}, finite differences "
            f"{float(self.numeric[b, t]):.12g} ({float(err[b, t]):.3g}x the tolerance)"
        )


def gradcheck_policy_loss(
    cfg: PolicyLossConfig,
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    ref_logprobs: torch.Tensor | None = None,
    rollout_logprobs: torch.Tensor | None = None,
    token_selection: torch.Tensor | None = None,
    step: float = 1e-6,
    rtol: float = 1e-6,
    atol: float = 1e-9,
    raise_on_failure: bool = True,
) -> GradcheckResult:
    """Check ``policy_loss(cfg, ...)``'s gradient at ``logprobs`` (float64 required).

    ``numeric[b, t] = (F(x + h e_bt) - F(x - h e_bt)) / 2h`` with ``F`` the loss with
    stop-gradients frozen at ``x``; the truncation error is ``O(h^2)`` and the rounding
    error ``O(u |F| / h)``, both far below ``atol + rtol |analytic|`` at the defaults.
    Raises :class:`VerificationError` with the worst token when it fails (unless
    ``raise_on_failure=False``).
    """
    if not isinstance(logprobs, torch.Tensor) or logprobs.dtype is not F64:
        got = logprobs.dtype if isinstance(logprobs, torch.Tensor) else type(logprobs).__name__
        raise InputTypeError(f"logprobs must be a float64 tensor for a gradcheck, got {got}")
    for name, value in (("step", step), ("rtol", rtol), ("atol", atol)):
        if not (isinstance(value, float) and math.isfinite(value) and value > 0):
            raise InputError(f"{name} must be a positive finite float, got {value!r}")
    extra = {
        k: v
        for k, v in (
            ("ref_logprobs", ref_logprobs),
            ("rollout_logprobs", rollout_logprobs),
            ("token_selection", token_selection),
        )
        if v is not None
    }

    def loss(lp: torch.Tensor) -> torch.Tensor:
        return policy_loss(
            cfg,
            logprobs=lp,
            old_logprobs=old_logprobs,
            advantages=advantages,
            response_mask=response_mask,
            **extra,
        ).loss

    x0 = logprobs.detach().clone().requires_grad_(True)
    (analytic,) = torch.autograd.grad(loss(x0), x0)
    frozen = FrozenStopGradients(loss)
    with torch.no_grad():
        frozen(x0.detach())
        numeric = torch.zeros_like(analytic)
        for b, t in response_mask.nonzero().tolist():
            up, down = x0.detach().clone(), x0.detach().clone()
            up[b, t] += step
            down[b, t] -= step
            numeric[b, t] = (frozen(up) - frozen(down)) / (2 * step)
    result = GradcheckResult(analytic, numeric, atol + rtol * analytic.abs())
    if raise_on_failure and not result.ok:
        raise VerificationError(result.summary())
    return result


def _bounds(cfg: PolicyLossConfig) -> list[float]:
    clip = cfg.clip
    return [b for b in (clip.low, clip.high, clip.dual_clip) if b is not None]


def _is_bounds(corr: ISCorrection | None) -> list[float]:
    if corr is None:
        return []
    return [b for b in (corr.cap, corr.low, corr.high) if b is not None]


def _far(values: torch.Tensor, bounds: list[float], margin: float) -> bool:
    return all(bool(((values - b).abs() > margin * b).all()) for b in bounds)


def ragged_batch(
    cfg: PolicyLossConfig,
    *,
    seed: int,
    lengths: tuple[int, ...] = (1, 3, 5, 8),
    margin: float = 1e-4,
) -> dict[str, torch.Tensor]:
    """A float64 right-padded batch for ``cfg`` whose ratios reach every clip region and
    stay at least ``margin`` (relative) away from each clip / IS bound.

    Row ``i`` draws log-ratios of scale ``(1e-4, 1e-2, 0.3, 1.2)[i % 4]``, so sequence
    ratios fall both inside and outside GSPO's 1 +- 4e-4 and token ratios reach CISPO's
    caps; rollout/trainer log-ratios (IS corrections) use the same row scales; advantages
    alternate in sign; NaN sits at padding.
    """
    if not lengths or any(not isinstance(n, int) or n < 1 for n in lengths):
        raise InputError(f"lengths must be positive ints, got {lengths!r}")
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    scales = torch.tensor([(1e-4, 1e-2, 0.3, 1.2)[i % 4] for i in range(len(lengths))], dtype=F64)
    for _ in range(1000):
        lp = -0.05 - 2.0 * torch.rand(mask.shape, generator=g, dtype=F64)
        log_r = scales[:, None] * torch.randn(mask.shape, generator=g, dtype=F64)
        log_rho = scales[:, None] * torch.randn(mask.shape, generator=g, dtype=F64)
        ref_gap = 0.3 * torch.randn(mask.shape, generator=g, dtype=F64)
        adv = torch.randn(len(lengths), generator=g, dtype=F64)
        adv = torch.where(torch.arange(len(lengths)) % 2 == 0, adv.abs() + 0.1, -adv.abs() - 0.1)
        token = torch.exp(torch.where(mask, log_r, 0.0))
        counts = mask.sum(1)
        seq = torch.exp(torch.where(mask, log_r, 0.0).sum(1) / counts)
        rho_tok = torch.exp(torch.where(mask, log_rho, 0.0))
        corr = cfg.is_correction
        rho = rho_tok[mask]
        if corr is not None and corr.level is ISLevel.SEQUENCE:
            rho = torch.exp(torch.where(mask, log_rho, 0.0).sum(1))
        elif corr is not None and corr.level is ISLevel.GEOMETRIC:
            rho = torch.exp(torch.where(mask, log_rho, 0.0).sum(1) / counts)
        ratios = token[mask] if cfg.ratio is RatioKind.TOKEN else seq
        if _far(ratios, _bounds(cfg), margin) and _far(rho, _is_bounds(corr), margin):
            nan = torch.full_like(lp, math.nan)
            return {
                "logprobs": torch.where(mask, lp, nan),
                "old_logprobs": torch.where(mask, lp - log_r, nan),
                "advantages": adv,
                "response_mask": mask,
                "ref_logprobs": torch.where(mask, lp - ref_gap, nan),
                "rollout_logprobs": torch.where(mask, lp - log_r - log_rho, nan),
            }
    raise InputError(f"no batch {margin=} away from the bounds of {cfg} in 1000 draws")
