"""``batches()``: the public whole-batch strategy (validation, then a composite draw)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from polgrad_reference.config import ClipConfig

from ._advantages import draw_advantage_plan, row_signs
from ._batch import Batch, build_many
from ._cache import choice, ints
from ._domain import DEFAULT_CLIPS, Domain, safe_magnitudes
from ._groups import draw_group_plan
from ._layout import Layout
from ._masks import Positions, draw_choices, draw_extents, draw_holes, draw_size, draw_width
from ._plan import AdvantageShape, BatchPlan, Padding, RefPlan, RolloutPlan
from ._sample import staged
from ._validate import (
    check_bool,
    check_choice,
    check_clips,
    check_domain,
    check_dtype,
    check_group_fits,
    check_int,
    check_range,
    check_real,
)
from ._values import draw_value_plan

__all__ = ["batches"]


def _ref_scales(domain: Domain) -> tuple[float, ...]:
    top = domain.max_ref_gap
    return (0.0, min(0.1, top), min(1.0, top), top)


_SPIKE_COUNTS = choice((0, 2, 3, 4))


def _draw_rollout(
    draw: st.DrawFn, domain: Domain, extents: tuple[int, ...], width: int
) -> RolloutPlan:
    """Small drift everywhere, plus up to four catastrophic tokens.

    Semantic domain: the bulk drift is bounded so that every row's summed log-weight stays
    within ``domain.max_rollout_seq`` even with every spike at full size.
    """
    spikes_max = 4
    scales = (0.0, 0.001, 0.01, 0.1) if domain.name == "semantic" else (0.0, 1.0, 50.0)
    scale = draw(choice(scales))
    if domain.max_rollout_seq is not None:
        spike_room = spikes_max * max(abs(s) for s in domain.rollout_spikes)
        scale = min(scale, (domain.max_rollout_seq - spike_room) / width)
    positions = Positions(extents, ())
    count = draw(_SPIKE_COUNTS)
    kinds = len(domain.rollout_spikes)
    picks = draw_choices(draw, count, positions.total * kinds) if count else []
    spikes: list[tuple[int, int, float]] = []
    for v in picks:
        row, col = positions.locate(v % positions.total)
        if all((row, col) != (r, c) for r, c, _ in spikes):
            spikes.append((row, col, domain.rollout_spikes[v // positions.total]))
    return RolloutPlan(scale=scale, spikes=tuple(spikes))


def batches(
    *,
    min_batch: int = 1,
    max_batch: int = 8,
    min_length: int = 1,
    max_length: int = 256,
    width: int | None = None,
    dtype: torch.dtype = torch.float64,
    advantage_shape: AdvantageShape | None = None,
    group_size: int | None = None,
    max_log_ratio: float | None = None,
    layout: Layout = "right",
    clip: ClipConfig | Sequence[ClipConfig] | None = None,
    domain: str = "semantic",
    holes: bool = False,
    padding: Padding = "garbage",
    with_ref_logprobs: bool | None = None,
    with_rollout_logprobs: bool | None = None,
    with_rewards: bool | None = None,
) -> st.SearchStrategy[Batch]:
    """Whole batches of policy-loss inputs: see ``docs/strategies.md`` for every knob.

    ``B`` lies in ``[min_batch, max_batch]``; each row's extent in ``[min_length,
    max_length]``; ``T`` is the longest row plus, sometimes, a few padding columns (or
    exactly ``width``). ``advantage_shape`` is ``"sequence"`` (``[B]``), ``"token"``
    (``[B, T]``) or None (either). With ``group_size`` every batch is whole groups and
    carries rewards and group ids. Values aim at the boundaries of ``clip`` (default:
    :data:`DEFAULT_CLIPS`) and stay within ``domain``'s ranges; ``max_log_ratio`` bounds
    ``|logprobs - old_logprobs|`` (default: the domain's). ``with_*`` = None lets
    Hypothesis decide whether that optional tensor is present.
    """
    check_int("min_batch", min_batch, minimum=1)
    check_int("max_batch", max_batch, minimum=1)
    check_range("min_batch", min_batch, "max_batch", max_batch)
    check_int("min_length", min_length, minimum=1)
    check_int("max_length", max_length, minimum=1)
    check_range("min_length", min_length, "max_length", max_length)
    if width is not None:
        check_int("width", width, minimum=1)
        check_range("min_length", min_length, "width", width)
    dt = check_dtype(dtype)
    dom = check_domain(domain)
    check_choice("advantage_shape", advantage_shape, ("sequence", "token"), optional=True)
    check_choice("layout", layout, ("right", "left", "packed"))
    check_choice("padding", padding, ("garbage", "nan"))
    check_bool("holes", holes)
    for name, flag in (
        ("with_ref_logprobs", with_ref_logprobs),
        ("with_rollout_logprobs", with_rollout_logprobs),
        ("with_rewards", with_rewards),
    ):
        check_bool(name, flag, optional=True)
    if group_size is not None:
        check_int("group_size", group_size, minimum=1)
        check_group_fits(group_size, min_batch, max_batch)
        if with_rewards is False:
            raise InvalidArgument("group_size needs rewards; drop with_rewards=False")
    bound = dom.max_log_ratio
    if max_log_ratio is not None:
        bound = check_real("max_log_ratio", max_log_ratio, low=0.0, high=dom.log_ratio_cap)
    clips = check_clips(clip) or DEFAULT_CLIPS
    longest = max_length if width is None else min(max_length, width)
    mags = safe_magnitudes(dom, dt)
    dtype_name = str(dt).removeprefix("torch.")

    # Which optional tensors are present: one choice, shrinking to "none of them"; each
    # undecided one is present three times in four.
    fixed = (with_ref_logprobs, with_rollout_logprobs, True if group_size else with_rewards)
    combos = itertools.product(*[(False, True) if f is None else (f,) for f in fixed])
    optional = choice(
        tuple(
            c for c in combos for _ in range(3 ** sum(c[i] for i in range(3) if fixed[i] is None))
        )
    )

    def _plan(draw: st.DrawFn) -> BatchPlan:
        if group_size is None:
            batch = draw_size(draw, min_batch, max_batch)
        else:
            count = draw_size(draw, -(-min_batch // group_size), max_batch // group_size)
            batch = count * group_size
        extents = draw_extents(draw, batch, min_length, longest)
        cols = width if width is not None else draw_width(draw, extents, max_length)
        spans = draw_holes(draw, extents) if holes else ()
        want_ref, want_rollout, want_rewards = draw(optional)
        adv_plan = draw_advantage_plan(draw, batch=batch, shape=advantage_shape, magnitudes=mags)
        seed = draw(ints(0, 2**32 - 1))
        values = draw_value_plan(
            draw,
            domain=dom,
            max_log_ratio=bound,
            extents=extents,
            holes=spans,
            row_signs=row_signs(adv_plan),
            token_advantages=adv_plan.shape == "token",
            clips=clips,
            dtype=dt,
        )
        ref = RefPlan(draw(choice(_ref_scales(dom)))) if want_ref else None
        rollout = _draw_rollout(draw, dom, extents, cols) if want_rollout else None
        grouping = (
            draw_group_plan(draw, batch=batch, size=group_size, magnitudes=mags)
            if want_rewards
            else None
        )
        plan = BatchPlan(
            extents=extents,
            width=cols,
            holes=spans,
            dtype=dtype_name,
            domain=dom.name,
            layout=layout,
            padding=padding,
            max_log_ratio=bound,
            seed=seed,
            values=values,
            advantages=adv_plan,
            ref=ref,
            rollout=rollout,
            groups=grouping,
        )
        return plan

    return staged(_plan, build_many)
