"""Advantages: per-sequence ``[B]`` or per-token ``[B, T]``, with the sign structure
(zero, ties, opposite signs that cancel) decided by Hypothesis and bulk magnitudes seeded.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from hypothesis import strategies as st

from ._cache import BOOLS, choice, ints
from ._domain import safe_magnitudes
from ._masks import Hole, draw_choices
from ._plan import AdvantagePattern, AdvantagePlan, AdvantageShape, TokenTarget, stream
from ._sample import composite
from ._validate import check_choice, check_domain, check_dtype, check_int

__all__ = [
    "ADVANTAGE_GRID",
    "advantages",
    "build_advantages",
    "draw_advantage_plan",
    "fill_invalid",
    "row_advantages",
    "row_signs",
]

ADVANTAGE_GRID = (1.0, -1.0, 0.0, 0.5, -0.5, 2.0, -2.0, 0.0, 0.25, -3.0)
_CANCEL = (1.0, 0.5, 2.0, 0.25, 3.0)
_NOISE = (0.0, 0.5, 1.0)
# Random magnitudes lie in [0.1, 8.1]: GRPO's largest advantage is (G - 1) / sqrt(G) for one
# success in a group of G, 3.75 at G = 16 and 7.9 at G = 64, so a loss that clamps
# advantages to [-3, 3] (or token ones to [-4.5, 4.5]) is seen (issue 15).
_RANDOM_MAX = 8.1


# Simple values per row (first: the shrink target) weigh twice.
_PATTERNS: tuple[AdvantagePattern, ...] = ("grid", "zero", "tie", "cancel", "random", "grid")


@functools.lru_cache(maxsize=4)
def _kinds(
    shape: AdvantageShape | None,
) -> st.SearchStrategy[tuple[AdvantageShape, AdvantagePattern, float]]:
    """Shape x sign pattern x per-token noise as one choice (one draw instead of three)."""
    shapes: tuple[AdvantageShape, ...] = ("sequence", "token") if shape is None else (shape,)
    options = [
        (s, p, n)
        for s in shapes
        for p in _PATTERNS
        for n in ((0.0,) if s == "sequence" else _NOISE)
    ]
    if shape is None:  # as likely per-sequence as per-token, however many noise levels
        options = [o for o in options if o[0] == "sequence"] * len(_NOISE) + [
            o for o in options if o[0] == "token"
        ]
    return choice(tuple(options))


def draw_advantage_plan(
    draw: st.DrawFn,
    *,
    batch: int,
    shape: AdvantageShape | None,
    magnitudes: tuple[float, ...],
) -> AdvantagePlan:
    """Draw shape, sign pattern, row values and (extreme domain) row magnitudes."""
    shape, pattern, noise = draw(_kinds(shape))
    values: tuple[float, ...]
    if pattern == "grid":
        values = tuple(ADVANTAGE_GRID[i] for i in draw_choices(draw, batch, len(ADVANTAGE_GRID)))
    elif pattern == "zero":
        values = (0.0,) * batch
    elif pattern == "tie":
        values = (draw(choice(ADVANTAGE_GRID)),) * batch
    elif pattern == "cancel":
        pairs = [_CANCEL[i] for i in draw_choices(draw, batch // 2, len(_CANCEL))]
        values = tuple(v for p in pairs for v in (p, -p)) + ((0.0,) if batch % 2 else ())
    else:  # random: Hypothesis picks the signs (or zero), the generator the magnitudes
        values = tuple((1.0, -1.0, 0.0)[i] for i in draw_choices(draw, batch, 3))
    scales: tuple[float, ...] | None = None
    if len(magnitudes) > 1:
        if draw(BOOLS):
            scales = tuple(magnitudes[i] for i in draw_choices(draw, batch, len(magnitudes)))
        else:
            scales = (draw(choice(magnitudes)),) * batch
        if all(s == 1.0 for s in scales):
            scales = None
    return AdvantagePlan(
        shape=shape, pattern=pattern, values=values, magnitudes=scales, noise=noise
    )


def row_signs(plan: AdvantagePlan) -> tuple[float, ...]:
    """The sign (+1, -1, 0) of each row's advantage, known before any tensor exists."""
    return tuple(float((v > 0) - (v < 0)) for v in plan.values)


def fill_invalid(
    x: torch.Tensor,
    extents: Sequence[int],
    holes: Sequence[Hole],
    value: float | torch.Tensor,
) -> None:
    """Overwrite the padding columns and holes of a right-padded ``[B, T]`` tensor.

    ``value`` is a scalar or a same-shape tensor to copy from. One slice per row: cheaper
    than a full-size mask at realistic sizes.
    """
    width = x.shape[1]
    spans = [(b, e, width) for b, e in enumerate(extents) if e < width]
    spans += list(holes)
    for row, start, stop in spans:
        if isinstance(value, torch.Tensor):
            x[row, start:stop] = value[row, start:stop]
        else:
            x[row, start:stop] = value


def row_advantages(
    plans: Sequence[tuple[AdvantagePlan, int]],
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(rows, scales)`` (float64 ``[B]``) of each ``(plan, seed)``: the row advantages
    ``value * magnitude * scale`` (``random`` plans draw their magnitudes in ``[0.1,
    8.1]`` from their own stream; other patterns have magnitude 1) and the row scales.
    Views of one buffer: one operation each for all plans (copy before handing out)."""
    sizes = [len(plan.values) for plan, _ in plans]
    for plan, _ in plans:
        if plan.magnitudes is not None and len(plan.magnitudes) != len(plan.values):
            raise ValueError(
                f"AdvantagePlan.magnitudes has {len(plan.magnitudes)} entries for "
                f"{len(plan.values)} rows"
            )
    values = torch.tensor([v for plan, _ in plans for v in plan.values], dtype=torch.float64)
    scales = torch.tensor(
        [m for plan, _ in plans for m in plan.magnitudes or (1.0,) * len(plan.values)],
        dtype=torch.float64,
    )
    if any(plan.pattern == "random" for plan, _ in plans):
        mags = torch.empty(len(values), dtype=torch.float64)  # read where random only
        for (plan, seed), piece in zip(plans, mags.split_with_sizes(sizes), strict=True):
            if plan.pattern == "random":
                torch.rand(len(piece), generator=stream(seed, 2), dtype=torch.float64, out=piece)
        drawn = torch.tensor([plan.pattern == "random" for plan, _ in plans for _ in plan.values])
        values = values * torch.where(drawn, mags * (_RANDOM_MAX - 0.1) + 0.1, 1.0)
    rows = values * scales
    return list(zip(rows.split_with_sizes(sizes), scales.split_with_sizes(sizes), strict=True))


def build_advantages(
    plan: AdvantagePlan,
    *,
    extents: tuple[int, ...],
    width: int,
    holes: tuple[Hole, ...],
    dtype: torch.dtype,
    seed: int,
    token_targets: Sequence[TokenTarget] = (),
    rows_and_scales: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """The advantages tensor of ``plan`` (``[B]`` or right-padded ``[B, T]``);
    ``rows_and_scales``: its :func:`row_advantages`, when built with other plans'."""
    batch = len(extents)
    gen_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    rows, scales = rows_and_scales or row_advantages([(plan, seed)])[0]
    if plan.shape == "sequence":
        # a view of other plans' buffer (row_advantages) is copied out
        return rows.to(dtype, copy=rows_and_scales is not None)
    col_scales = scales.to(gen_dtype)[:, None]
    padded = bool(holes) or any(e < width for e in extents)
    if plan.noise > 0.0:
        adv = torch.empty((batch, width), dtype=gen_dtype)
        adv.uniform_(-1.0, 1.0, generator=stream(seed, 3))
        # rows of zero advantage (a group with equal rewards) stay exactly zero
        varied = (rows != 0.0).to(gen_dtype)[:, None]
        adv.mul_(col_scales * varied * plan.noise).add_(rows.to(gen_dtype)[:, None])
        zero_rows = [r for r, v in enumerate(plan.values) if v == 0.0]
        if padded and zero_rows:  # their padding still holds garbage
            keep = set(zero_rows)
            fill_invalid(
                adv,
                [e if r in keep else width for r, e in enumerate(extents)],
                [h for h in holes if h[0] in keep],
                float(scales[zero_rows[0]]),
            )
    else:
        adv = rows.to(gen_dtype)[:, None].repeat(1, width)
        if padded:  # garbage from the same range at padding and holes
            u = torch.empty((batch, width), dtype=gen_dtype)
            u.uniform_(-1.0, 1.0, generator=stream(seed, 3))
            fill_invalid(adv, extents, holes, u.mul_(col_scales * _RANDOM_MAX))
    for target in token_targets:
        if target.advantage is not None:
            adv[target.row, target.col] = target.advantage * float(scales[target.row])
    return adv.to(dtype)


def advantages(
    *,
    batch_size: int,
    width: int = 1,
    shape: AdvantageShape | None = None,
    dtype: torch.dtype = torch.float64,
    domain: str = "semantic",
) -> st.SearchStrategy[torch.Tensor]:
    """Advantages ``[batch_size]`` or ``[batch_size, width]`` (``shape="token"``).

    Patterns: simple values per row, all zero, ties (one value everywhere), pairs of
    opposite signs that cancel, or random magnitudes with Hypothesis-chosen signs. Per-token
    advantages add optional per-token variation. The extreme domain scales rows by
    magnitudes from 1e-30 to 1e6. Shrinks to ``[1.0, 1.0, ...]``.
    """
    check_int("batch_size", batch_size, minimum=1)
    check_int("width", width, minimum=1)
    check_choice("shape", shape, ("sequence", "token"), optional=True)
    dt = check_dtype(dtype)
    dom = check_domain(domain)
    mags = safe_magnitudes(dom, dt)

    def _advantages(draw: st.DrawFn) -> torch.Tensor:
        plan = draw_advantage_plan(draw, batch=batch_size, shape=shape, magnitudes=mags)
        seed = draw(ints(0, 2**32 - 1))
        return build_advantages(
            plan, extents=(width,) * batch_size, width=width, holes=(), dtype=dt, seed=seed
        )

    return composite(_advantages)
