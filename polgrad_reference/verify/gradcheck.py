"""Float64 gradient checks of policy losses over ragged batches.

``gradcheck_policy_loss`` compares autograd's ``d loss / d logprobs`` with central finite
differences of the same loss with its stop-gradients frozen at the base point
(:class:`~polgrad_reference.verify.FrozenStopGradients`): the smooth function whose
gradient the stop-gradient semantics define. Clipped, truncated and detached branches are
therefore checked too, however the stop-gradient is written. The loss is a registry
config, a registry name, or the user's own function with the policy-loss calling
convention (``polgrad_reference.verify._convention``). ``ragged_batch`` draws float64
batches that reach every clip region and stay away from the non-differentiable points
(clip and IS bounds) of a config.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from ..config import ISCorrection, ISLevel, PolicyLossConfig, RatioKind
from ..errors import InputError, InputTypeError
from ..registry import get_algorithm
from . import _convention as conv
from ._errors import VerificationError
from ._frozen import FrozenStopGradients

__all__ = ["GradcheckResult", "VerificationError", "gradcheck_policy_loss", "ragged_batch"]

F64 = torch.float64


@dataclasses.dataclass(frozen=True)
class GradcheckResult:
    """Autograd against central finite differences at every response token; at padding
    the gradient must be exactly 0."""

    analytic: torch.Tensor
    """``d loss / d logprobs`` from autograd, ``[B, T]``."""
    numeric: torch.Tensor
    """Central differences of the frozen-stop-gradient loss, ``[B, T]`` (0 at padding)."""
    tolerance: torch.Tensor
    """Per-token allowed ``|analytic - numeric|``."""
    response_mask: torch.Tensor | None = None
    """The response tokens compared; elsewhere the gradient must be exactly 0 (None: all)."""

    @property
    def errors(self) -> torch.Tensor:
        """``|analytic - numeric| / tolerance`` per response token (``<= 1`` passes; NaN
        counts as inf); at padding 0 when the gradient is exactly 0 there, else inf."""
        err = ((self.analytic - self.numeric).abs() / self.tolerance).nan_to_num(nan=math.inf)
        if self.response_mask is None:
            return err
        leak = torch.where(self.analytic == 0, 0.0, math.inf).to(err.dtype)
        return torch.where(self.response_mask, err, leak)

    @property
    def ok(self) -> bool:
        return bool((self.errors <= 1.0).all())

    def summary(self) -> str:
        err = self.errors
        worst = int(err.argmax())
        b, t = divmod(worst, err.shape[1])
        if self.response_mask is not None and not bool(self.response_mask[b, t]):
            return (
                f"gradcheck FAILED: the gradient at padding position (b, t) = ({b}, {t}) is "
                f"{float(self.analytic[b, t]):.12g}, not 0: the loss reads a position "
                "response_mask excludes (mask with torch.where, not by multiplying: NaN * 0 "
                "is NaN)"
            )
        return (
            f"gradcheck {'passed' if self.ok else 'FAILED'}: worst at (b, t) = ({b}, {t}): "
            f"autograd {float(self.analytic[b, t]):.12g}, finite differences "
            f"{float(self.numeric[b, t]):.12g} ({float(err[b, t]):.3g}x the tolerance)"
            + ("" if self.ok else _WHY)
        )


_WHY = (
    "; autograd's gradient is not the derivative of the loss's own values (stop-gradients "
    "held at the base point): a hand-written backward (torch.autograd.Function) or a value "
    "autograd does not see (an in-place write through .data) is the usual cause"
)


def _differentiable(loss: torch.Tensor, label: str) -> None:
    if not loss.requires_grad:
        raise VerificationError(
            f"{label} is not differentiable in logprobs (no grad_fn: it was detached, computed "
            "under torch.no_grad(), or does not use logprobs)"
        )


def _finite(value: torch.Tensor, label: str) -> None:
    if not bool(torch.isfinite(value)):
        raise VerificationError(
            f"{label} is {float(value)} at the base point; ragged_batch puts NaN at padding, "
            "which a loss must not read: mask with torch.where (multiplying by the mask keeps "
            "NaN, NaN * 0 = NaN), or draw the batch with ragged_batch(..., padding='garbage')"
        )


def gradcheck_policy_loss(
    loss: conv.LossLike,
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
    """Check the gradient of ``loss`` in ``logprobs`` (float64 required) at every response
    token, and that it is exactly 0 at padding.

    ``loss`` is a :class:`~polgrad_reference.PolicyLossConfig`, a registry name, or a
    callable with the policy-loss calling convention: keyword tensors (``logprobs``,
    ``old_logprobs``, ``advantages``, ``response_mask``, ``ref_logprobs``,
    ``rollout_logprobs``, ``token_selection``: those it takes) returning the scalar loss
    (or a tuple, mapping or object holding it as ``[0]``, ``["loss"]``, ``.loss``).

    ``numeric[b, t] = (F(x + h e_bt) - F(x - h e_bt)) / 2h`` with ``F`` the loss with
    stop-gradients frozen at ``x`` (``detach`` in any spelling, ``.data``, ``no_grad``
    regions: :mod:`~polgrad_reference.verify._frozen`); the truncation error is ``O(h^2)``
    and the rounding error ``O(u |F| / h)``, both far below ``atol + rtol |analytic|`` at
    the defaults. Raises :class:`VerificationError` with the worst token when it fails
    (unless ``raise_on_failure=False``), and when the loss is not differentiable, not
    finite at the base point, or its code path changes within ``h``.
    """
    if not isinstance(logprobs, torch.Tensor) or logprobs.dtype is not F64:
        got = logprobs.dtype if isinstance(logprobs, torch.Tensor) else type(logprobs).__name__
        raise InputTypeError(f"logprobs must be a float64 tensor for a gradcheck, got {got}")
    h = conv.require_positive("step", step)
    rtol, atol = conv.require_tolerance(rtol, atol)
    conv.require_bool("raise_on_failure", raise_on_failure)
    given = {
        k: v
        for k, v in (
            ("logprobs", logprobs),
            ("old_logprobs", old_logprobs),
            ("advantages", advantages),
            ("response_mask", response_mask),
            ("ref_logprobs", ref_logprobs),
            ("rollout_logprobs", rollout_logprobs),
            ("token_selection", token_selection),
        )
        if v is not None
    }
    if not isinstance(response_mask, torch.Tensor) or response_mask.dtype is not torch.bool:
        raise InputTypeError("response_mask must be a torch.bool tensor")
    if response_mask.shape != logprobs.shape:
        raise InputError(
            f"response_mask must have the shape of logprobs {list(logprobs.shape)}, got "
            f"{list(response_mask.shape)}"
        )
    call, _ = conv.loss_callable(loss, tuple(given))
    label = "the loss"
    if not isinstance(loss, (str, PolicyLossConfig)):
        label = f"loss {getattr(loss, '__qualname__', loss)}"

    def value(lp: torch.Tensor) -> torch.Tensor:
        return call({**given, "logprobs": lp})

    x0 = logprobs.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        frozen = FrozenStopGradients(value)
        base = frozen(x0)
        _differentiable(base, label)
        _finite(base.detach(), label)
        (analytic,) = torch.autograd.grad(base, x0, allow_unused=True)
        analytic = torch.zeros_like(x0) if analytic is None else analytic
        numeric = torch.zeros_like(analytic)
        for b, t in response_mask.nonzero().tolist():
            up = x0.detach().clone()
            down = x0.detach().clone()
            up[b, t] += h
            down[b, t] -= h
            f_up = frozen(up.requires_grad_(True)).detach()
            f_down = frozen(down.requires_grad_(True)).detach()
            numeric[b, t] = (f_up - f_down) / (2 * h)
    result = GradcheckResult(analytic, numeric, atol + rtol * analytic.abs(), response_mask)
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


_PADDING = ("nan", "garbage")


def ragged_batch(
    cfg: PolicyLossConfig | str,
    *,
    seed: int,
    lengths: tuple[int, ...] = (1, 3, 5, 8),
    margin: float = 1e-4,
    padding: str = "nan",
) -> dict[str, torch.Tensor]:
    """A float64 right-padded batch for ``cfg`` (a config or a registry name) whose ratios
    reach every clip region and stay at least ``margin`` (relative) away from each clip /
    IS bound.

    Row ``i`` draws log-ratios of scale ``(1e-4, 1e-2, 0.3, 1.2)[i % 4]``, so sequence
    ratios fall both inside and outside GSPO's 1 +- 4e-4 and token ratios reach CISPO's
    caps; rollout/trainer log-ratios (IS corrections) use the same row scales; advantages
    alternate in sign. Padding holds NaN (``padding="nan"``, which a loss that masks by
    multiplying cannot survive) or finite values of order 1e4 (``"garbage"``); pass
    ``where=batch["response_mask"]`` to :func:`check_gradient_formula` to compare only the
    response tokens.
    """
    if isinstance(cfg, str):
        cfg = get_algorithm(cfg).loss
    if not isinstance(cfg, PolicyLossConfig):
        raise InputTypeError(
            f"cfg must be a PolicyLossConfig or a registry name, got {type(cfg).__name__}"
        )
    if (
        not isinstance(lengths, tuple)
        or not lengths
        or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in lengths)
    ):
        raise InputError(f"lengths must be positive ints, got {lengths!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InputTypeError(f"seed must be an int, got {type(seed).__name__} {seed!r}")
    margin = conv.require_positive("margin", margin)
    if padding not in _PADDING:
        raise InputError(f"padding must be one of {_PADDING}, got {padding!r}")
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
            if padding == "nan":
                nan = torch.full_like(lp, math.nan)
            else:
                nan = 1e4 * (2 * torch.rand(mask.shape, generator=g, dtype=F64) - 1)
            return {
                "logprobs": torch.where(mask, lp, nan),
                "old_logprobs": torch.where(mask, lp - log_r, nan),
                "advantages": adv,
                "response_mask": mask,
                "ref_logprobs": torch.where(mask, lp - ref_gap, nan),
                "rollout_logprobs": torch.where(mask, lp - log_r - log_rho, nan),
            }
    raise InputError(f"no batch {margin=} away from the bounds of {cfg} in 1000 draws")
