"""Groups of G samples per prompt with one reward each (GRPO/RLOO-style batches).

Rewards are simple dyadic numbers (0/1 verifier outcomes, a short grid), so group means
are exact and a group of equal rewards has exactly zero spread: an estimator's ``+eps``
guard on the group std then decides nothing but the 0/0 case it exists for.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from hypothesis import strategies as st

from ._cache import choice
from ._domain import safe_magnitudes
from ._masks import draw_choices, draw_size
from ._plan import GroupPlan
from ._sample import composite
from ._validate import check_domain, check_dtype, check_group_fits, check_int, check_range

__all__ = ["REWARD_GRID", "Groups", "build_groups", "divisors", "draw_group_plan", "groups"]

REWARD_GRID = (0.0, 1.0, 0.5, -1.0, 0.25, 2.0, -0.5)
_ORDERS = choice(("contiguous", "interleaved"))
# Per group: 0/1 verifier outcomes, all equal (zero spread; weighs three), simple
# values, one success.
_GROUP_KINDS = ("binary", "equal", "grid", "one-hot", "equal", "equal")


@dataclasses.dataclass(frozen=True, eq=False)
class Groups:
    """``rewards`` (float, ``[B]``), ``group_ids`` (``int64``, ``[B]``) and the group size."""

    rewards: torch.Tensor
    group_ids: torch.Tensor
    group_size: int


def divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0)


@functools.lru_cache(maxsize=256)
def _sizes(batch: int) -> st.SearchStrategy[int]:
    """Group sizes dividing ``batch``; real groups (G >= 2) four times as likely as the
    singleton groups that shrinking reaches first."""
    sizes = divisors(batch)
    return choice(sizes[:1] + sizes[1:] * 4)


def draw_group_plan(
    draw: st.DrawFn, *, batch: int, size: int | None, magnitudes: tuple[float, ...]
) -> GroupPlan:
    """Group size (a divisor of ``batch`` unless fixed), id order and rewards."""
    if size is None:
        size = draw(_sizes(batch))
    order = draw(_ORDERS)
    count = batch // size
    kinds = draw_choices(draw, count, len(_GROUP_KINDS))
    picks = draw_choices(draw, batch, len(REWARD_GRID) * size)
    per_group: list[list[float]] = []
    for g, kind in enumerate(kinds):
        own = picks[g * size : (g + 1) * size]
        if _GROUP_KINDS[kind] == "binary":
            per_group.append([float(v % 2) for v in own])
        elif _GROUP_KINDS[kind] == "equal":
            per_group.append([REWARD_GRID[own[0] % len(REWARD_GRID)]] * size)
        elif _GROUP_KINDS[kind] == "grid":
            per_group.append([REWARD_GRID[v % len(REWARD_GRID)] for v in own])
        else:  # one success in the group
            hot = own[0] % size
            per_group.append([1.0 if k == hot else 0.0 for k in range(size)])
    scale = draw(choice(magnitudes)) if len(magnitudes) > 1 else 1.0
    rewards = [0.0] * batch
    for g, members in enumerate(per_group):
        for k, r in enumerate(members):
            index = g * size + k if order == "contiguous" else k * count + g
            rewards[index] = r * scale
    return GroupPlan(size=size, order=order, rewards=tuple(rewards))


def build_groups(plan: GroupPlan, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rewards, group_ids)`` of ``plan``."""
    batch = len(plan.rewards)
    count = batch // plan.size
    if plan.order == "contiguous":
        ids = torch.arange(count, dtype=torch.int64).repeat_interleave(plan.size)
    else:
        ids = torch.arange(batch, dtype=torch.int64) % count
    return torch.tensor(plan.rewards, dtype=torch.float64).to(dtype), ids


def groups(
    *,
    min_batch: int = 1,
    max_batch: int = 8,
    group_size: int | None = None,
    dtype: torch.dtype = torch.float64,
    domain: str = "semantic",
) -> st.SearchStrategy[Groups]:
    """Rewards and group ids for ``B`` samples in groups of ``G`` (``G`` divides ``B``).

    Reward patterns: 0/1 verifier outcomes, all equal (zero spread), a grid of simple
    values, or one success per group. Ids are contiguous (``0 0 1 1``) or interleaved
    (``0 1 0 1``). Shrinks to one group of one sample with reward 0.0.
    """
    check_int("min_batch", min_batch, minimum=1)
    check_int("max_batch", max_batch, minimum=1)
    check_range("min_batch", min_batch, "max_batch", max_batch)
    dt = check_dtype(dtype)
    dom = check_domain(domain)
    lo_count, hi_count = 1, max_batch
    if group_size is not None:
        check_int("group_size", group_size, minimum=1)
        lo_count, hi_count = -(-min_batch // group_size), max_batch // group_size
        check_group_fits(group_size, min_batch, max_batch)
    mags = safe_magnitudes(dom, dt)

    def _groups(draw: st.DrawFn) -> Groups:
        if group_size is None:
            batch = draw_size(draw, min_batch, max_batch)
        else:
            batch = group_size * draw_size(draw, lo_count, hi_count)
        plan = draw_group_plan(draw, batch=batch, size=group_size, magnitudes=mags)
        rewards, ids = build_groups(plan, dt)
        return Groups(rewards=rewards, group_ids=ids, group_size=plan.size)

    return composite(_groups)
