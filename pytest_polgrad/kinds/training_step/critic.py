"""The critic's training step: the value loss under micro-batch and data-parallel splits.

The marked function computes the value loss of ONE micro-batch, the one the trainer calls
``backward()`` on, from ``values`` (requires grad), ``old_values``, ``returns``,
``response_mask`` and any :class:`~pytest_polgrad.strategies.StepInfo` field by name. The
step is correct when its gradient, summed over micro-batches and averaged over ranks, is
that of the value loss over the WHOLE step,

    L = (1/N) sum_{b,t} m[b, t] l[b, t],   l = 1/2 max((V - R)^2, (clip(V, V_old +- c) - R)^2)

(token-mean over the step's ``N`` response tokens; PPO arXiv:1707.06347 Eq. 9, clipped as
verl's ``compute_value_loss``). verl PR #6957 normalised it per micro-batch, so its gradient
grew K-fold with K micro-batches; :func:`check_critic_step` names that factor.

:func:`check_critic_step` runs a split simulated (per-rank sums averaged over ranks) or, with
``wrap="ddp"``/``"fsdp"``, on a real process group (:func:`.distributed.run_step` with
``through="values"``). The reference is ``polgrad_reference.value`` (no other kind's oracle).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from polgrad_reference.value import value_loss_per_token
from pytest_polgrad.core.verdicts import CheckFailure, Verdict
from pytest_polgrad.kinds.training_step.distributed import run_step
from pytest_polgrad.kinds.training_step.terms import factor_meaning
from pytest_polgrad.strategies._splits import Split, StepInfo

__all__ = ["CRITIC_INPUTS", "Critic", "check_critic_step", "critic_batch", "expected_critic"]

CRITIC_INPUTS = ("values", "old_values", "returns", "response_mask")
_RTOL = {torch.float64: 1e-10, torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 5e-3}
"""Relative error allowed against ``|grad_ref| + max |grad_ref|``, by the inputs' dtype."""


@dataclasses.dataclass(frozen=True)
class Critic:
    """A critic step as the kit accumulated it: loss and ``d loss / d values`` ``[B, T]``."""

    loss: float
    grad: torch.Tensor


def critic_batch(
    lengths: tuple[int, ...], *, seed: int = 0, dtype: torch.dtype = torch.float64
) -> dict[str, torch.Tensor]:
    """Right-padded rows of response ``lengths``: values near returns, some outside the clip
    range of 0.2 around ``old_values``, NaN at padding."""
    g = torch.Generator().manual_seed(seed)
    b, width = len(lengths), max(lengths)
    mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    ret = torch.randn((b, width), generator=g, dtype=torch.float64)
    old = ret + torch.randn((b, width), generator=g, dtype=torch.float64) * 0.3
    val = old + torch.randn((b, width), generator=g, dtype=torch.float64) * 0.3
    nan = torch.tensor(float("nan"), dtype=torch.float64)
    out = {"values": val, "old_values": old, "returns": ret}
    return {
        **{k: torch.where(mask, v, nan).to(dtype) for k, v in out.items()},
        "response_mask": mask,
    }


def expected_critic(
    batch: Mapping[str, torch.Tensor], clip_range: float | None = 0.2
) -> tuple[float, torch.Tensor]:
    """The float64 token-mean value loss of the whole step and its gradient in ``values``."""
    mask = batch["response_mask"]
    val = batch["values"].detach().to(torch.float64).requires_grad_(True)
    per_token = value_loss_per_token(
        values=val,
        old_values=batch["old_values"].detach().to(torch.float64),
        returns=batch["returns"].detach().to(torch.float64),
        response_mask=mask,
        clip_range=clip_range,
    )
    loss = torch.where(mask, per_token, 0.0).sum() / mask.sum()
    (grad,) = torch.autograd.grad(loss, val)
    return float(loss.detach()), grad.detach()


def _takes(fn: Callable[..., Any]) -> frozenset[str]:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError) as exc:
        raise Verdict(f"the critic step {fn!r} has no readable signature") from exc
    return frozenset(params)


def _accumulate(fn: Callable[..., Any], batch: Mapping[str, torch.Tensor], split: Split) -> Critic:
    mask = batch["response_mask"]
    cols = torch.arange(mask.shape[1])
    takes = _takes(fn)
    grad = torch.zeros(mask.shape, dtype=torch.float64)
    total, world = 0.0, split.world_size
    for rank in split.infos(mask):
        for info in rank:
            index = torch.tensor(info.rows, dtype=torch.long)
            width = int(torch.where(mask[index], cols + 1, 0).max()) if info.rows else 0
            kwargs: dict[str, Any] = {
                n: batch[n][index][:, :width].detach().clone() for n in CRITIC_INPUTS if n in takes
            }
            val = kwargs["values"].requires_grad_(True)
            for f in dataclasses.fields(StepInfo):
                if f.name in takes:
                    kwargs[f.name] = getattr(info, f.name)
            where = f"rank {info.rank} micro-batch {info.micro_batch}"
            loss = fn(**kwargs)
            if isinstance(loss, Mapping):
                loss = loss["loss"]
            elif isinstance(loss, (tuple, list)):
                loss = loss[0]
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.requires_grad:
                raise Verdict(f"{where}: the critic step must return a scalar loss of values")
            (g,) = torch.autograd.grad(loss, val, allow_unused=True)
            if g is None:
                raise Verdict(f"{where}: the returned loss does not depend on values")
            grad[index, :width] += g.detach().to(torch.float64) / world
            total += float(loss.detach()) / world
    return Critic(total, grad)


def _at_the_clip(batch: Mapping[str, torch.Tensor], clip_range: float | None) -> torch.Tensor:
    """Tokens whose ``|V - V_old|`` lies within the inputs' rounding of the clip range: a
    step computing in their dtype may take either side of the kink there (the gradient
    jumps between ``V - R`` and 0), so their gradient is not judged."""
    mask = batch["response_mask"]
    if clip_range is None:
        return torch.zeros_like(mask)
    v, old = (batch[k].detach().to(torch.float64) for k in ("values", "old_values"))
    eps = torch.finfo(batch["values"].dtype).eps
    near = ((v - old).abs() - clip_range).abs() <= 4 * eps * (v.abs() + old.abs() + clip_range)
    return mask & near


def check_critic_step(
    fn: Callable[..., Any],
    batch: Mapping[str, torch.Tensor],
    split: Split,
    *,
    clip_range: float | None = 0.2,
    wrap: str | None = None,
) -> float:
    """The critic step's accumulated gradient (per token, in ``values``) and loss against
    the whole step's token-mean value loss; the worst error relative to the dtype's
    tolerance, or ``CheckFailure`` naming the factor and its cause. ``wrap``: ``"ddp"`` /
    ``"fsdp"`` runs a multi-rank split on a real process group."""
    if "values" not in _takes(fn):
        raise Verdict(f"the critic step {fn!r} takes no 'values'")
    if wrap is not None and split.world_size > 1:
        tensors = {k: v for k, v in batch.items() if k in CRITIC_INPUTS}
        ran = run_step(fn, tensors, split, wrap=wrap, through="values")
        got = Critic(ran.loss, ran.grad)
    else:
        got = _accumulate(fn, batch, split)
    loss, grad = expected_critic(batch, clip_range)
    mask = batch["response_mask"] & ~_at_the_clip(batch, clip_range)
    rtol = _RTOL.get(batch["values"].dtype, 1e-4)
    scale = grad.abs() + grad.abs().max()
    err = float(((got.grad - grad).abs() / (rtol * scale))[mask].max()) if mask.any() else 0.0
    err = max(err, abs(got.loss - loss) / (rtol * max(abs(loss), 1e-300)))
    if err <= 1.0 and bool(torch.isfinite(got.grad).all()):
        return err
    g, r = got.grad[mask], grad[mask]
    c = float((g * r).sum() / (r * r).sum())
    uniform = math.isfinite(c) and float((g - c * r).abs().max()) <= rtol * float(scale.max())
    if uniform:
        meaning = factor_meaning(c, split)
        how = f"{c:.6g}x the reference's" + (f": {meaning}" if meaning else "")
    else:
        how = "not a uniform multiple of the reference's (weighted differently per micro-batch)"
    raise CheckFailure(
        f"the value term is mis-scaled with the split {split.describe()}: the critic step's "
        f"accumulated gradient is {how}",
        numbers=[("value loss (whole step, accumulated)", f"{loss:.6g}", f"{got.loss:.6g}")],
        error=err,
    )
