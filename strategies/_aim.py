"""Aiming ratios at clip boundaries, exactly.

An *aim* is ``(kind, boundary, side, delta)``: the ratio ``boundary + side * delta``, just
past (``side = +1``) or just short of (``-1``) a boundary. Aimed values are Python
scalars rounded to a power-of-two quantum ``q`` that the target dtype represents exactly,
so ``logprobs - old_logprobs`` *is* the intended log-ratio in that dtype, and the ratio
lands on the intended side with a margin of several roundings of the dtype: an
implementation that computes ``exp(lp - old)`` in that dtype sees the same side.
"""

from __future__ import annotations

import functools
import math

import torch
from hypothesis import strategies as st

from ._cache import choice
from ._domain import Boundary, mantissa_bits
from ._plan import SeqTarget, TokenTarget, stream

__all__ = [
    "DELTAS",
    "Aim",
    "aim_options",
    "aimed_log_ratio",
    "apply_seq_target",
    "apply_token_targets",
    "draw_aim",
]

# Distances past (or short of) a boundary, in ratio units; 0.01 first, so shrinking ends
# on a round number. 0.025 keeps "just past 1 + eps_high" inside (1 + eps, 1 + eps + 0.03).
DELTAS = (0.01, 0.001, 0.02, 1e-4, 0.005, 1e-5, 1e-6, 0.025)

Aim = tuple[str, float, int, float]


@functools.lru_cache(maxsize=256)
def aim_options(pool: tuple[Boundary, ...], relevant: int = 0) -> tuple[Aim, ...]:
    """Every aim at ``pool``; the first ``relevant`` boundaries count twice. The first
    option (first boundary, just past it, by 0.01) is what shrinking reaches."""
    return tuple(
        (b.kind, b.ratio, side, delta)
        for k, b in enumerate(pool)
        for _ in range(2 if k < relevant else 1)
        for side in (1, -1)
        for delta in DELTAS
        if b.ratio - side * delta > 0.0
    )


def options_for_sign(sign: float, ordered: tuple[tuple[Boundary, ...], ...]) -> tuple[Aim, ...]:
    """Aims for a token or row whose advantage has ``sign``. The boundaries that decide
    clipping for that sign (upper for ``A > 0``; lower and dual-clip for ``A < 0``) come
    first and count twice; the others stay, since CISPO-style surrogates clip both ways."""
    positive, negative, every = ordered
    if sign > 0:
        return aim_options(positive, sum(b.kind == "high" for b in positive))
    if sign < 0:
        return aim_options(negative, sum(b.kind != "high" for b in negative))
    return aim_options(every)


def draw_aim(draw: st.DrawFn, sign: float, ordered: tuple[tuple[Boundary, ...], ...]) -> Aim | None:
    """One aim for ``sign`` (None when there is no boundary to aim at)."""
    options = options_for_sign(sign, ordered)
    if not options:
        return None
    aim: Aim = draw(choice(options))
    return aim


def _quantum(magnitude: float, dtype: torch.dtype) -> float:
    """A power of two ``q``: every multiple of ``q`` below ``2 * magnitude`` is exact."""
    exponent = math.frexp(magnitude)[1]
    return math.ldexp(1.0, exponent + 1 - mantissa_bits(dtype))


def _aim_quantum(boundary: float, delta: float, q_min: float) -> float:
    """The coarsest power of two that still lands within ``delta / 4`` of the aim, so an
    aimed value prints short (``-1.2548828125``, not 17 digits); never finer than the
    dtype allows (``q_min``)."""
    coarse = math.ldexp(1.0, math.floor(math.log2(delta / (4.0 * boundary))))
    return max(coarse, q_min)


def aimed_log_ratio(boundary: float, side: int, delta: float) -> float:
    """``log(boundary + side * delta)`` rounded to the coarse quantum of the aim: a short
    number, still past the boundary by at least three quarters of ``delta``."""
    q = _aim_quantum(boundary, delta, 0.0)
    return round(math.log(boundary + side * delta) / q) * q


def _target_gap(boundary: float, side: int, delta: float, q: float, dtype: torch.dtype) -> float:
    """The log-ratio, a multiple of ``q``, whose ratio is ``side``-wards of ``boundary``
    by at least twice the rounding of ``q`` plus a few roundings of the dtype itself."""
    unit = math.ldexp(1.0, -mantissa_bits(dtype))
    eff = max(delta, 2.0 * boundary * (q + 4.0 * unit))
    if boundary - eff <= 0.0:
        side = 1
    gap = round(math.log(boundary + side * eff) / q) * q
    while side * (math.exp(gap) - boundary) <= 0.0:  # pragma: no cover - rounding guard
        gap += side * q
    return gap


def _exact_pair(base: float, gap: float, q: float) -> tuple[float, float]:
    """``(old, lp)``, multiples of ``q``, with ``lp - old == gap`` and both ``<= 0``."""
    old = math.floor((base - max(gap, 0.0)) / q) * q
    lp = old + gap
    if lp > 0.0:
        old, lp = old - q, lp - q
    return old, lp


def _small(dtype: torch.dtype) -> bool:
    """Half precision aims from a zero base, so the quantum (and the miss) stays small."""
    return mantissa_bits(dtype) < 23


def apply_token_targets(
    lp: torch.Tensor, old: torch.Tensor, base: torch.Tensor, targets: tuple[TokenTarget, ...]
) -> None:
    """Write every token target exactly, in one indexed write per tensor."""
    if not targets:
        return
    dtype = lp.dtype
    rows = torch.tensor([t.row for t in targets], dtype=torch.int64)
    cols = torch.tensor([t.col for t in targets], dtype=torch.int64)
    bases = [0.0] * len(targets) if _small(dtype) else base[rows, cols].tolist()
    olds, lps = [], []
    for t, b in zip(targets, bases, strict=True):
        q = _quantum(abs(b) + 2.0 * (abs(math.log(t.boundary)) + 0.05) + 0.01, dtype)
        q = _aim_quantum(t.boundary, t.delta, q)
        o, v = _exact_pair(b, _target_gap(t.boundary, t.side, t.delta, q, dtype), q)
        olds.append(o)
        lps.append(v)
    old[rows, cols] = torch.tensor(olds, dtype=torch.float64).to(dtype)
    lp[rows, cols] = torch.tensor(lps, dtype=torch.float64).to(dtype)


def apply_seq_target(
    lp: torch.Tensor,
    old: torch.Tensor,
    base: torch.Tensor,
    target: SeqTarget,
    cols: list[int],
    seed: int,
    max_log_ratio: float,
) -> None:
    """Row ``target.row``: the mean log-ratio over ``cols`` is exactly the aimed one."""
    dtype = lp.dtype
    # a row without holes is a prefix: a slice, cheaper than gathering by an index tensor
    index: slice | torch.Tensor = (
        slice(0, len(cols)) if cols and cols[-1] == len(cols) - 1 else torch.tensor(cols)
    )
    row_base = base[target.row, index].to(torch.float64)
    if _small(dtype):
        row_base = torch.zeros_like(row_base)
    centre = abs(math.log(target.boundary)) + 0.05
    noise = max(0.0, min(target.noise, (max_log_ratio - centre) / 2.0))
    q = _quantum(float(row_base.abs().max()) + 2.0 * (centre + 2.0 * noise) + 0.01, dtype)
    q = _aim_quantum(target.boundary, target.delta, q)
    gap = _target_gap(target.boundary, target.side, target.delta, q, dtype)
    gaps: float | torch.Tensor = gap
    if noise > 0.0 and len(cols) > 1:
        u = torch.rand(len(cols), generator=stream(seed, 64 + target.row), dtype=torch.float64)
        n = torch.round(noise * (u - u.mean()) / q) * q
        n[-1] -= n.sum()  # multiples of q: the sum is exact, so the row mean is exact
        gaps = n.add_(gap)
    positive = gaps.clamp(min=0.0) if isinstance(gaps, torch.Tensor) else max(gap, 0.0)
    o = torch.floor((row_base - positive) / q) * q
    v = o + gaps
    over = v > 0.0
    old[target.row, index] = torch.where(over, o - q, o).to(dtype)
    lp[target.row, index] = torch.where(over, v - q, v).to(dtype)
