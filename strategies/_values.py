"""Logprob streams and log-ratio gaps, including values aimed at clip boundaries.

Bulk values come from seeded ``torch.Generator`` streams, one kernel plus a few in-place
ops per tensor; only the values that matter (aimed tokens and rows, rare tokens) are
Python scalars, chosen by Hypothesis and written exactly (see ``_aim.py``).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence

import torch
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from polgrad_reference.config import ClipConfig

from ._aim import (
    SeqRow,
    aim_options,
    aimed_log_ratio,
    apply_seq_targets,
    apply_token_targets,
    draw_aim,
    options_for_sign,
)
from ._cache import choice, ints
from ._domain import DEFAULT_CLIPS, DOMAINS, Boundary, Domain, boundaries
from ._masks import Hole, Positions, draw_choices, own, valid_positions
from ._plan import BatchPlan, SeqTarget, Style, TokenTarget, ValuePlan, stream
from ._sample import composite
from ._validate import check_clips, check_domain, check_dtype, check_int, check_real

__all__ = [
    "base_floor",
    "build_logprob_pairs",
    "draw_value_plan",
    "log_ratio_gaps",
    "logprobs",
]

# Advantage magnitudes written at aimed tokens when advantages are per-token.
_TARGET_MAGNITUDES = (1.0, 0.5, 2.0)
_SEQ_NOISE = (0.0, 0.1, 1.0)
# How many tokens get an aimed ratio: none first (for shrinking), otherwise several, so
# one batch covers several boundary regions at once.
_TARGET_COUNTS = choice((0, 4, 8, 12))
_FEW = choice((0, 1, 2))
# Every k-th column aimed at a boundary region (none first, to shrink).
_STRIDES = choice((0, 2, 3, 2))
_COLUMN_DELTAS = (0.01, 0.001, 0.02, 0.005, 0.025)
_STYLES: st.SearchStrategy[Style] = choice(("constant", "grid", "random", "random"))


def _gen_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def base_floor(domain: Domain, max_log_ratio: float) -> float:
    """How far below 0 a *base* logprob may go: with the log-ratio and then the reference
    or rollout gap on top, every logprob stays ``>= domain.min_logprob``."""
    others = max(domain.max_ref_gap, domain.max_rollout_gap)
    return -domain.min_logprob - max_log_ratio - others - 1.0


@functools.lru_cache(maxsize=64)
def _column_aims(pool: tuple[Boundary, ...]) -> tuple[tuple[float, int, float], ...]:
    """(ratio, side, delta) for the aimed columns: each delta in turn over every
    (boundary, side) pair, so a dozen consecutive aimed columns cover every region."""
    return tuple(
        (b.ratio, side, delta)
        for delta in _COLUMN_DELTAS
        for b in pool
        for side in (1, -1)
        if b.ratio - side * delta > 0.0
    )


@functools.lru_cache(maxsize=8)
def _random_shapes(domain: Domain) -> st.SearchStrategy[tuple[tuple[float, int], float]]:
    """Base shape x log-ratio scale of the random style, as one choice."""
    return choice(tuple(itertools.product(domain.base_shapes, domain.gap_scales)))


def draw_value_plan(
    draw: st.DrawFn,
    *,
    domain: Domain,
    max_log_ratio: float,
    extents: tuple[int, ...],
    holes: tuple[Hole, ...],
    row_signs: Sequence[float],
    token_advantages: bool,
    clips: Sequence[ClipConfig],
    dtype: torch.dtype,
) -> ValuePlan:
    """Draw the structure of ``logprobs``/``old_logprobs``: style, scales, targets.

    Per-row and per-token choices come in single ``bytes`` draws (cheap at B = 64); every
    choice shrinks toward its first option.
    """
    ordered = boundaries(clips, max_log_ratio)
    style = draw(_STYLES)
    base_scale, base_power, gap_scale = 1.0, 1, 0.0
    if style == "random":
        (base_scale, base_power), gap_scale = draw(_random_shapes(domain))
        base_scale = min(base_scale, base_floor(domain, max_log_ratio))
        gap_scale = min(gap_scale, max_log_ratio)
    aim_stride, column_aims = 0, tuple[tuple[float, int, float], ...]()
    aims = _column_aims(ordered[2])
    if dtype in (torch.float32, torch.float64) and aims:  # half precision can't aim
        aim_stride = draw(_STRIDES)
    if aim_stride:
        start = draw(ints(0, len(aims) - 1))
        column_aims = aims[start:] + aims[:start]
    positions = Positions(extents, holes)

    rare = []
    floor = -base_floor(domain, max_log_ratio)
    count = draw(_FEW)
    if count:
        picks = draw_choices(draw, count, positions.total * len(domain.rare_values))
        for v in picks:
            row, col = positions.locate(v % positions.total)
            value = domain.rare_values[v // positions.total]
            rare.append((row, col, max(value, floor)))

    seq_targets: list[SeqTarget] = []
    for _ in range(min(draw(_FEW), len(extents))):
        row = draw(ints(0, len(extents) - 1))
        aim = draw_aim(draw, row_signs[row], ordered)
        if aim is None or any(t.row == row for t in seq_targets):
            continue
        exact_noise = dtype == torch.float64 and style == "random"
        noise = draw(choice(_SEQ_NOISE)) if exact_noise else 0.0
        seq_targets.append(SeqTarget(row, *aim[1:], noise))

    token_targets: list[TokenTarget] = []
    skip = {(t.row, -1) for t in seq_targets}  # a targeted row's mean must not move
    count = draw(_TARGET_COUNTS)
    if count:
        spots = draw_choices(draw, count, positions.total)
        picks = draw_choices(draw, count, 1 << 16)
        for spot, v in zip(spots, picks, strict=True):
            row, col = positions.locate(spot)
            if (row, -1) in skip or (row, col) in skip:
                continue
            target = _token_target(row, col, v, row_signs[row], token_advantages, ordered)
            if target is not None:
                skip.add((row, col))
                token_targets.append(target)
    return ValuePlan(
        style=style,
        base_scale=base_scale,
        base_power=base_power,
        gap_scale=gap_scale,
        aim_stride=aim_stride,
        column_aims=column_aims,
        rare=tuple(rare),
        seq_targets=tuple(seq_targets),
        token_targets=tuple(token_targets),
    )


def _token_target(
    row: int,
    col: int,
    pick: int,
    row_sign: float,
    token_advantages: bool,
    ordered: tuple[tuple[Boundary, ...], ...],
) -> TokenTarget | None:
    """Decode one drawn integer into an aim (and, per-token, the token's advantage).

    With per-sequence advantages the aim suits the row's sign. With per-token advantages
    the aim comes first and the token's advantage takes the sign for which that boundary
    decides clipping three times in four (the opposite sign otherwise).
    """
    if not token_advantages:
        options = options_for_sign(row_sign, ordered)
        if not options:
            return None
        _, ratio, side, delta = options[pick % len(options)]
        return TokenTarget(row, col, ratio, side, delta)
    options = aim_options(ordered[2])
    if not options:
        return None
    kind, ratio, side, delta = options[pick % len(options)]
    rest = pick // len(options)
    sign = 1.0 if kind == "high" else -1.0
    if (rest // len(_TARGET_MAGNITUDES)) % 4 == 3:
        sign = -sign
    advantage = sign * _TARGET_MAGNITUDES[rest % len(_TARGET_MAGNITUDES)]
    return TokenTarget(row, col, ratio, side, delta, advantage)


def grid(
    shape: tuple[int, ...],
    gen: torch.Generator,
    dtype: torch.dtype,
    step: float,
    low: int,
    high: int,
) -> torch.Tensor:
    """Values ``step * k`` with ``k`` uniform in ``[low, high]``: one uniform draw and
    three in-place ops (``torch.randint`` costs twice a ``torch.rand``)."""
    return _grid_into(torch.empty(shape, dtype=dtype), gen, step, low, high)


def _grid_into(
    out: torch.Tensor, gen: torch.Generator, step: float, low: int, high: int
) -> torch.Tensor:
    """:func:`grid` written into ``out`` (a view of a larger buffer: the same values)."""
    u = torch.rand(out.shape, generator=gen, dtype=out.dtype, out=out)
    return u.mul_(high - low + 1).floor_().add_(low).mul_(step)


def _bulk_base(
    plan: ValuePlan,
    shape: tuple[int, int],
    dtype: torch.dtype,
    seed: int,
    domain: Domain,
    max_log_ratio: float,
) -> torch.Tensor:
    return _fill_base(plan, torch.empty(shape, dtype=dtype), seed, domain, max_log_ratio)


def _fill_base(
    plan: ValuePlan, out: torch.Tensor, seed: int, domain: Domain, max_log_ratio: float
) -> torch.Tensor:
    """The base logprobs of ``plan``, written into ``out``."""
    if plan.style == "constant":
        return out.fill_(-1.0)
    gen = stream(seed, 0)
    if plan.style == "grid":
        count = min(9, int(base_floor(domain, max_log_ratio) // domain.base_grid_step))
        return _grid_into(out, gen, -domain.base_grid_step, 0, count)
    u = torch.rand(out.shape, generator=gen, dtype=out.dtype, out=out)
    for _ in range(plan.base_power.bit_length() - 1):  # power is 1, 2 or 4
        u.mul_(u)
    return u.mul_(-plan.base_scale)


def _fill_gap(
    plan: ValuePlan, out: torch.Tensor, seed: int, domain: Domain, max_log_ratio: float
) -> None:
    """The log-ratios of ``plan`` before targets, written into ``out``."""
    if plan.style == "constant":
        out.zero_()
    elif plan.style == "grid":
        step = min(domain.gap_grid_step, max_log_ratio / 4.0)
        _grid_into(out, stream(seed, 1), step, -4, 4)
    else:
        out.uniform_(-1.0, 1.0, generator=stream(seed, 1)).mul_(plan.gap_scale)
    if plan.aim_stride and plan.column_aims:
        _aim_columns(out, plan.aim_stride, plan.column_aims)


def _aim_columns(
    gap: torch.Tensor, stride: int, aims: tuple[tuple[float, int, float], ...]
) -> None:
    """Every ``stride``-th column gets the log-ratio of the next aim, in place: two
    broadcast ops, no extra random numbers."""
    keep, centre = _column_pattern(gap.shape[1], stride, aims, gap.dtype)
    gap.mul_(keep).add_(centre)


def _column_pattern(
    width: int, stride: int, aims: tuple[tuple[float, int, float], ...], dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(keep, centre)`` of :func:`_aim_columns` for one width (shared, never written):
    the first ``width`` columns of the pattern for the next power of two (from 256), which
    are that width's own pattern, so one pattern serves every width below it."""
    keep, centre = _wide_pattern(max(256, 1 << (width - 1).bit_length()), stride, aims, dtype)
    return keep[:width], centre[:width]


@functools.lru_cache(maxsize=256)
def _wide_pattern(
    width: int, stride: int, aims: tuple[tuple[float, int, float], ...], dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    count = len(range(0, width, stride))
    cycle = _aim_logs(aims)
    logs = cycle.repeat(-(-count // cycle.numel()))[:count].to(dtype)
    keep = torch.ones(width, dtype=dtype)
    keep[::stride] = 0.0
    centre = torch.zeros(width, dtype=dtype)
    centre[::stride] = logs
    return keep, centre


@functools.lru_cache(maxsize=256)
def _aim_logs(aims: tuple[tuple[float, int, float], ...]) -> torch.Tensor:
    """The log-ratios of a cycle of column aims (float64, computed once per cycle)."""
    return torch.tensor([aimed_log_ratio(*a) for a in aims], dtype=torch.float64)


def _clip_cast(
    lp: torch.Tensor, old: torch.Tensor, bounds: list[float], starts: list[int]
) -> torch.Tensor:
    """After rounding lp and old to half precision separately, a log-ratio may exceed the
    bound by an ulp; such (rare) positions get log-ratio 0. ``bounds[k]`` holds for the
    values from ``starts[k]`` to ``starts[k + 1]``."""
    size = (lp.to(torch.float32) - old.to(torch.float32)).abs()
    if len(set(bounds)) == 1:
        over = size > bounds[0]
    else:
        over = torch.cat(
            [size[a:b] > m for a, b, m in zip(starts, starts[1:], bounds, strict=False)]
        )
    return torch.where(over, old, lp)


def build_logprob_pairs(
    plans: Sequence[BatchPlan], dtype: torch.dtype
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(logprobs, old_logprobs)`` ``[B, T]`` in ``dtype`` of each plan, right-padded,
    padding included: computed in one buffer, so the arithmetic and the exact writes of
    every plan's aimed and rare values are one operation each for all of them, then
    copied out (:func:`own`). Each plan draws from its own streams, so its pair is
    bitwise the same alone or among others.

    ``old = base - relu(gap)`` and ``logprobs = old + gap`` keep both ``<= 0`` whatever
    the sign of the gap. Targets and rare tokens are then written exactly.
    """
    gen_dtype = _gen_dtype(dtype)
    shapes = [(len(p.extents), p.width) for p in plans]
    sizes = [rows * width for rows, width in shapes]
    starts = [0, *itertools.accumulate(sizes)]
    base = torch.empty(starts[-1], dtype=gen_dtype)
    gap = torch.empty(starts[-1], dtype=gen_dtype)
    rare_at: list[int] = []
    rare_values: list[float] = []
    seq_rows: list[SeqRow] = []
    tokens: list[tuple[TokenTarget, int]] = []
    for p, (rows, width), start, size in zip(plans, shapes, starts, sizes, strict=False):
        domain = DOMAINS[p.domain]
        _fill_base(
            p.values, base[start : start + size].view(rows, width), p.seed, domain, p.max_log_ratio
        )
        _fill_gap(
            p.values, gap[start : start + size].view(rows, width), p.seed, domain, p.max_log_ratio
        )
        rare_at += [start + r * width + c for r, c, _ in p.values.rare]
        rare_values += [v for _, _, v in p.values.rare]
        for seq in p.values.seq_targets:
            cols = valid_positions(p.extents[seq.row], seq.row, p.holes)
            at = start + seq.row * width
            seq_rows.append(SeqRow(seq, [at + c for c in cols], p.seed, p.max_log_ratio))
        tokens += [(t, start + t.row * width + t.col) for t in p.values.token_targets]
    if rare_at:
        base[torch.tensor(rare_at)] = torch.tensor(rare_values, dtype=gen_dtype)
    old = gap.clamp(min=0.0).neg_().add_(base)
    lp = old + gap
    if gen_dtype != dtype:
        lp, old, base = lp.to(dtype), old.to(dtype), base.to(dtype)
        lp = _clip_cast(lp, old, [p.max_log_ratio for p in plans], starts)
    apply_seq_targets(lp, old, base, seq_rows)
    apply_token_targets(lp, old, base, tokens)
    shared = len(plans) > 1
    pieces = zip(lp.split_with_sizes(sizes), old.split_with_sizes(sizes), strict=True)
    return [
        (own(x.view(shape), shared), own(y.view(shape), shared))
        for (x, y), shape in zip(pieces, shapes, strict=True)
    ]


def _check_shape(shape: object) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, int) else shape
    if not isinstance(dims, tuple):
        raise InvalidArgument(f"shape must be an int or a tuple of ints, got {shape!r}")
    for i, d in enumerate(dims):
        check_int(f"shape[{i}]", d, minimum=0)
    return dims


def logprobs(
    shape: int | tuple[int, ...],
    *,
    dtype: torch.dtype = torch.float64,
    domain: str = "semantic",
) -> st.SearchStrategy[torch.Tensor]:
    """Valid logprob tensors of ``shape``: finite, ``<= 0``, ``>= domain.min_logprob``.

    Values are constant (-1.0), from a table of simple numbers, or random with a tail
    that reaches rare tokens (down to -32 in the semantic domain, -899 in the extreme
    one); a few positions may be set to a rare value explicitly. Shrinks to all -1.0.
    """
    dims = _check_shape(shape)
    dt = check_dtype(dtype)
    dom = check_domain(domain)

    def _logprobs(draw: st.DrawFn) -> torch.Tensor:
        style = draw(_STYLES)
        scale, power = draw(choice(dom.base_shapes))
        seed = draw(ints(0, 2**32 - 1))
        plan = ValuePlan(style=style, base_scale=scale, base_power=power)
        numel = math.prod(dims)
        flat = _bulk_base(plan, (1, numel), _gen_dtype(dt), seed, dom, dom.max_log_ratio)
        for _ in range(draw(ints(0, 2)) if numel else 0):
            flat[0, draw(ints(0, numel - 1))] = draw(choice(dom.rare_values))
        return flat.to(dt).reshape(dims)

    return composite(_logprobs)


def log_ratio_gaps(
    *,
    clip: ClipConfig | Sequence[ClipConfig] | None = None,
    domain: str = "semantic",
    max_log_ratio: float | None = None,
) -> st.SearchStrategy[float]:
    """Log-ratios ``log r = logprobs - old_logprobs`` that land near and across the clip
    boundaries of ``clip`` (default: :data:`DEFAULT_CLIPS`), on both sides, at distances
    from 1e-6 to 0.025 in ratio units; mixed with 0.0, simple grid values and uniform
    values in ``[-max_log_ratio, max_log_ratio]``.
    """
    clips = check_clips(clip) or DEFAULT_CLIPS
    dom = check_domain(domain)
    bound = (
        dom.max_log_ratio
        if max_log_ratio is None
        else check_real("max_log_ratio", max_log_ratio, low=0.0, high=dom.log_ratio_cap)
    )
    ordered = boundaries(clips, bound)
    aims = aim_options(ordered[2] or (Boundary("high", 1.0),))
    targeted = st.sampled_from(aims).map(lambda a: aimed_log_ratio(*a[1:]))
    step = min(dom.gap_grid_step, bound / 4.0)
    return st.one_of(
        st.just(0.0),
        targeted,
        st.integers(-4, 4).map(lambda k: k * step),
        st.floats(-bound, bound, allow_nan=False, allow_infinity=False),
    )
