"""The two input domains, the supported dtypes and the clip boundaries values aim at.

A *domain* fixes the ranges every drawn value lives in. The semantic domain stays inside
the region where mainstream trainers' numerical guards never fire, so a conformance
comparison measures semantics, not guards; the extreme domain holds valid but hostile
values for robustness checks. Every bound below is data, so docs and tests can cite it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Literal

import torch

from polgrad_reference.config import ClipConfig

__all__ = [
    "DEFAULT_CLIPS",
    "DOMAINS",
    "EXTREME",
    "SEMANTIC",
    "SUPPORTED_DTYPES",
    "Boundary",
    "Domain",
    "DomainName",
    "boundaries",
    "mantissa_bits",
    "safe_magnitudes",
]

DomainName = Literal["semantic", "extreme"]


@dataclasses.dataclass(frozen=True)
class Domain:
    """Ranges of one input domain; every drawn value satisfies them by construction.

    ``min_logprob``
        every logprob (current, old, reference, rollout) is ``>= min_logprob`` and ``<= 0``.
    ``max_log_ratio``
        default bound on ``|logprobs - old_logprobs|`` at every position.
    ``max_ref_gap``
        bound on ``|ref_logprobs - logprobs|``.
    ``max_rollout_gap``
        bound on ``|old_logprobs - rollout_logprobs|`` at a single token.
    ``max_rollout_seq``
        bound on ``|sum_t (old_logprobs - rollout_logprobs)|`` over a row (None: unbounded).
    ``magnitudes``
        scales applied to advantages and rewards (1.0 first: it is what shrinking reaches).
    """

    name: DomainName
    min_logprob: float
    max_log_ratio: float
    log_ratio_cap: float
    max_ref_gap: float
    max_rollout_gap: float
    max_rollout_seq: float | None
    base_shapes: tuple[tuple[float, int], ...]
    base_grid_step: float
    gap_scales: tuple[float, ...]
    gap_grid_step: float
    rare_values: tuple[float, ...]
    rollout_spikes: tuple[float, ...]
    magnitudes: tuple[float, ...]


# The semantic bounds, and the guards they keep inactive:
# - |log-ratio| <= 4 < 10: verl clamps GSPO's sequence log-ratio at 10 and the token
#   log-ratio at +/-20 before exp (verl/trainer/ppo/core_algos.py, compute_policy_loss_*);
#   4 still reaches the dual-clip constant 3 (log 3 = 1.0986) with room to spare.
# - |ref - logprobs| <= 2: the k3 estimator stays below e^2 - 3 = 4.39, under the +/-10
#   clamp verl applies to "low_var_kl" / "k3" (core_algos.py, kl_penalty).
# - per-row sum of (old - rollout) <= 10 in magnitude: sequence-level rollout importance
#   weights stay under the +/-20 log clamp (SAFETY_BOUND = 20.0) of verl's rollout
#   correction helper, while single "catastrophic" tokens (|gap| up to 1.5) cross the
#   usual TIS cap 2 (log 2 = 0.69, verl#2953).
# - logprobs >= -40: exp(logprob) stays a normal float32 (smallest normal ~ exp(-87.3)).
SEMANTIC = Domain(
    name="semantic",
    min_logprob=-40.0,
    max_log_ratio=4.0,
    log_ratio_cap=10.0,
    max_ref_gap=2.0,
    max_rollout_gap=1.5,
    max_rollout_seq=10.0,
    base_shapes=((1.0, 1), (4.0, 2), (32.0, 4)),
    base_grid_step=0.5,
    gap_scales=(0.3, 0.05, 1.0, 4.0),
    gap_grid_step=0.25,
    rare_values=(-20.0, -32.0, -27.5),
    rollout_spikes=(-1.0, 1.0, -0.75, 0.75, -1.5, 1.5),
    magnitudes=(1.0,),
)

# The extreme bounds: valid but hostile. A loss may guard however it likes on these, but
# its output must stay finite. Worst case of a plain float32 loss: |A| * exp(50) * B * T
# = 1e6 * 5.2e21 * 2.6e5 ~ 1.4e33 < 3.4e38, so finiteness is achievable without guards.
EXTREME = Domain(
    name="extreme",
    min_logprob=-1000.0,
    max_log_ratio=50.0,
    log_ratio_cap=80.0,
    max_ref_gap=50.0,
    max_rollout_gap=50.0,
    max_rollout_seq=None,
    base_shapes=((10.0, 1), (100.0, 2), (899.0, 4)),
    base_grid_step=100.0,
    gap_scales=(10.0, 1.0, 50.0),
    gap_grid_step=12.5,
    rare_values=(-500.0, -899.0, -100.5),
    rollout_spikes=(25.0, -25.0, 50.0, -50.0),
    magnitudes=(1.0, 1e-30, 1e-12, 1e-6, 1e3, 1e6),
)

DOMAINS: dict[str, Domain] = {"semantic": SEMANTIC, "extreme": EXTREME}

# Explicit mantissa widths (bits after the implicit one) of the supported dtypes.
_MANTISSA = {
    torch.float64: 52,
    torch.float32: 23,
    torch.float16: 10,
    torch.bfloat16: 7,
}
SUPPORTED_DTYPES: tuple[torch.dtype, ...] = tuple(_MANTISSA)


def safe_magnitudes(domain: Domain, dtype: torch.dtype) -> tuple[float, ...]:
    """The domain's magnitudes that keep scaled advantages and rewards finite in ``dtype``
    with room for a loss to sum them (float16 drops 1e6)."""
    limit = torch.finfo(dtype).max / 256.0
    return tuple(m for m in domain.magnitudes if m <= limit)


def mantissa_bits(dtype: torch.dtype) -> int:
    """Explicit mantissa bits of a supported floating dtype."""
    return _MANTISSA[dtype]


# Common clip settings, used when no clip config is given: PPO/GRPO's symmetric 0.2
# (arXiv:1707.06347 Sec. 6.1) with the dual-clip constant 3 (arXiv:1912.09729; verl's
# clip_ratio_c default), DAPO's clip-higher 0.2/0.28 (arXiv:2503.14476 Sec. 3.1) and
# GSPO's sequence-level 3e-4/4e-4 (arXiv:2507.18071 Sec. 5.1).
DEFAULT_CLIPS: tuple[ClipConfig, ...] = (
    ClipConfig(eps_low=0.2, eps_high=0.2, dual_clip=3.0),
    ClipConfig(eps_low=0.2, eps_high=0.28),
    ClipConfig(eps_low=3e-4, eps_high=4e-4),
)

BoundaryKind = Literal["low", "high", "dual"]


@dataclasses.dataclass(frozen=True)
class Boundary:
    """A ratio value where a clipped surrogate changes branch."""

    kind: BoundaryKind
    ratio: float


def boundaries(
    clips: Sequence[ClipConfig], max_log_ratio: float
) -> tuple[tuple[Boundary, ...], tuple[Boundary, ...], tuple[Boundary, ...]]:
    """Boundaries worth aiming at, ordered for a positive, negative and zero advantage.

    With ``A > 0`` the upper bound ``1 + eps_high`` decides clipping, with ``A < 0`` the
    lower bound ``1 - eps_low`` and the dual-clip constant do; the other side still
    matters to surrogates that clip the weight regardless of sign (CISPO), so it follows.
    Boundaries whose neighbourhood leaves ``|log r| <= max_log_ratio`` are dropped.
    Cached: every plan of a pool asks for the same ones, and equal answers that are the
    same objects make the aim caches' lookups an identity check.
    """
    return _boundaries(tuple(clips), max_log_ratio)


@functools.lru_cache(maxsize=256)
def _boundaries(
    clips: tuple[ClipConfig, ...], max_log_ratio: float
) -> tuple[tuple[Boundary, ...], tuple[Boundary, ...], tuple[Boundary, ...]]:
    found: dict[tuple[str, float], Boundary] = {}
    for clip in clips:
        for kind, value in (("low", clip.low), ("high", clip.high), ("dual", clip.dual_clip)):
            if value is None or value <= 0.0:
                continue
            if abs(math.log(value)) + 0.03 > max_log_ratio:
                continue
            found.setdefault((kind, value), Boundary(kind, value))  # type: ignore[arg-type]
    ordered = list(found.values())
    highs = [b for b in ordered if b.kind == "high"]
    lows = [b for b in ordered if b.kind == "low"]
    duals = [b for b in ordered if b.kind == "dual"]
    positive = tuple(highs + lows + duals)
    negative = tuple(lows + duals + highs)
    return positive, negative, tuple(ordered)
