"""The tensors of plans: the pure, deterministic half of drawing a batch.

:func:`build_fields` turns plans into their right-padded tensors, many plans at once (a
pool), each exactly as it would be alone. It knows nothing of :class:`~._batch.Batch`:
``_batch`` wraps the fields (``build``, ``build_many``, ``Batch.rebuild``), so the two
modules import one way only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

import torch

from ._advantages import build_advantages, fill_invalid, row_advantages
from ._groups import build_groups
from ._masks import Hole, build_masks
from ._plan import BatchPlan, RefPlan, RolloutPlan, stream
from ._values import build_logprob_pairs, grid

__all__ = ["Fields", "build_fields"]

# Garbage for the padding of constant-style batches (random and grid styles already hold
# values from the same distribution there): plausible logprobs inside every domain bound,
# with a visible log-ratio of -1 between logprobs and old_logprobs.
_CONSTANT_GARBAGE = {"logprobs": -3.0, "old_logprobs": -2.0, "ref": -4.0, "rollout": -3.0}


class Fields(TypedDict):
    """A plan's tensors by :class:`~._batch.Batch` field name, right-padded."""

    logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    response_mask: torch.Tensor
    ref_logprobs: torch.Tensor | None
    rollout_logprobs: torch.Tensor | None
    rewards: torch.Tensor | None
    group_ids: torch.Tensor | None


def _gen_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _ref(plan: RefPlan, lp: torch.Tensor, style: str, seed: int) -> torch.Tensor:
    """``-|lp + d|``: ``|ref - lp| <= |d| <= scale`` and ``ref <= 0``."""
    if plan.scale == 0.0:
        return lp.clone()
    gen_dtype = _gen_dtype(lp.dtype)
    gen = stream(seed, 4)
    if style == "random":
        d = torch.empty(lp.shape, dtype=gen_dtype).uniform_(-plan.scale, plan.scale, generator=gen)
    else:
        d = grid(tuple(lp.shape), gen, gen_dtype, plan.scale / 4.0, -4, 4)
    return d.add_(lp.to(gen_dtype)).abs_().neg_().to(lp.dtype)


def _rollout(plan: RolloutPlan, old: torch.Tensor, seed: int) -> torch.Tensor:
    """``-|old + d|``: ``|old - rollout| <= |d|``, plus explicit catastrophic tokens."""
    gen_dtype = _gen_dtype(old.dtype)
    if plan.scale == 0.0:
        out = old.clone()
    else:
        d = torch.empty(old.shape, dtype=gen_dtype)
        d.uniform_(-plan.scale, plan.scale, generator=stream(seed, 5))
        out = d.add_(old.to(gen_dtype)).abs_().neg_().to(old.dtype)
    for row, col, spike in plan.spikes:
        out[row, col] = -abs(float(old[row, col]) + spike)
    return out


def _pad(
    tensors: dict[str, torch.Tensor],
    plan: BatchPlan,
    holes: tuple[Hole, ...],
) -> None:
    extents = plan.extents
    if plan.padding == "nan":
        for x in tensors.values():
            fill_invalid(x, extents, holes, float("nan"))
    elif plan.values.style == "constant":
        for name, x in tensors.items():
            key = name if name in _CONSTANT_GARBAGE else name.split("_")[0]
            if key in _CONSTANT_GARBAGE:
                fill_invalid(x, extents, holes, _CONSTANT_GARBAGE[key])


def build_fields(plans: Sequence[BatchPlan]) -> list[Fields]:
    """The right-padded tensors of each plan, bitwise as if built alone, with the logprobs
    of all plans of one dtype built together (:func:`build_logprob_pairs`): most of a small
    batch's cost is the fixed cost of each tensor operation, which they then share."""
    out: list[Fields | None] = [None] * len(plans)
    by_dtype: dict[torch.dtype, list[int]] = {}
    for i, plan in enumerate(plans):
        by_dtype.setdefault(plan.torch_dtype, []).append(i)
    for dtype, members in by_dtype.items():
        group = [plans[i] for i in members]
        pairs = build_logprob_pairs(group, dtype)
        masks = build_masks([(p.extents, p.width, p.holes) for p in group])
        rows = row_advantages([(p.advantages, p.seed) for p in group])
        for i, pair, mask, row in zip(members, pairs, masks, rows, strict=True):
            out[i] = _assemble(plans[i], pair, mask, row)
    return [fields for fields in out if fields is not None]


def _assemble(
    plan: BatchPlan,
    pair: tuple[torch.Tensor, torch.Tensor],
    mask: torch.Tensor,
    rows_and_scales: tuple[torch.Tensor, torch.Tensor],
) -> Fields:
    """The tensors of ``plan`` around its logprob pair, mask and row advantages."""
    lp, old = pair
    dtype = plan.torch_dtype
    extents, width, holes = plan.extents, plan.width, plan.holes
    adv = build_advantages(
        plan.advantages,
        extents=extents,
        width=width,
        holes=holes,
        dtype=dtype,
        seed=plan.seed,
        token_targets=plan.values.token_targets,
        rows_and_scales=rows_and_scales,
    )
    token: dict[str, torch.Tensor] = {"logprobs": lp, "old_logprobs": old}
    if plan.ref is not None:
        token["ref_logprobs"] = _ref(plan.ref, lp, plan.values.style, plan.seed)
    if plan.rollout is not None:
        token["rollout_logprobs"] = _rollout(plan.rollout, old, plan.seed)
    _pad(token, plan, holes)
    if plan.padding == "nan" and adv.dim() == 2:
        fill_invalid(adv, extents, holes, float("nan"))
    rewards = group_ids = None
    if plan.groups is not None:
        rewards, group_ids = build_groups(plan.groups, dtype)
    return {
        "logprobs": token["logprobs"],
        "old_logprobs": token["old_logprobs"],
        "advantages": adv,
        "response_mask": mask,
        "ref_logprobs": token.get("ref_logprobs"),
        "rollout_logprobs": token.get("rollout_logprobs"),
        "rewards": rewards,
        "group_ids": group_ids,
    }
