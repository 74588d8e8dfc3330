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
import itertools
import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
from hypothesis import strategies as st

from ._cache import choice
from ._domain import Boundary, mantissa_bits
from ._plan import SeqTarget, TokenTarget, stream

__all__ = [
    "DELTAS",
    "Aim",
    "SeqRow",
    "aim_options",
    "aimed_log_ratio",
    "apply_seq_targets",
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
    lp: torch.Tensor,
    old: torch.Tensor,
    base: torch.Tensor,
    targets: Sequence[tuple[TokenTarget, int]],
) -> None:
    """Write every token target exactly at its index into the flat buffers, in one
    indexed write per buffer."""
    if not targets:
        return
    dtype = lp.dtype
    at = torch.tensor([i for _, i in targets], dtype=torch.int64)
    bases = [0.0] * len(targets) if _small(dtype) else base[at].tolist()
    olds, lps = [], []
    for (t, _), b in zip(targets, bases, strict=True):
        q = _quantum(abs(b) + 2.0 * (abs(math.log(t.boundary)) + 0.05) + 0.01, dtype)
        q = _aim_quantum(t.boundary, t.delta, q)
        o, v = _exact_pair(b, _target_gap(t.boundary, t.side, t.delta, q, dtype), q)
        olds.append(o)
        lps.append(v)
    old[at] = torch.tensor(olds, dtype=torch.float64).to(dtype)
    lp[at] = torch.tensor(lps, dtype=torch.float64).to(dtype)


class SeqRow(NamedTuple):
    """A sequence target with the flat indices of its row's response tokens."""

    target: SeqTarget
    at: list[int]
    seed: int
    max_log_ratio: float


def _row_gaps(row: SeqRow, peak: float, dtype: torch.dtype) -> tuple[float, float | torch.Tensor]:
    """``(q, gaps)`` of one row whose base values reach ``-peak``: the quantum and the
    aimed log-ratio, or with noise the per-token log-ratios (multiples of ``q`` around
    it, so the row mean is exactly the aimed one)."""
    target, n = row.target, len(row.at)
    centre = abs(math.log(target.boundary)) + 0.05
    noise = max(0.0, min(target.noise, (row.max_log_ratio - centre) / 2.0))
    q = _quantum(peak + 2.0 * (centre + 2.0 * noise) + 0.01, dtype)
    q = _aim_quantum(target.boundary, target.delta, q)
    gap = _target_gap(target.boundary, target.side, target.delta, q, dtype)
    if noise <= 0.0 or n <= 1:
        return q, gap
    u = torch.rand(n, generator=stream(row.seed, 64 + target.row), dtype=torch.float64)
    noisy = torch.round(noise * (u - u.mean()) / q) * q
    noisy[-1] -= noisy.sum()  # multiples of q: the sum is exact, so the row mean is exact
    return q, noisy.add_(gap)


def apply_seq_targets(
    lp: torch.Tensor, old: torch.Tensor, base: torch.Tensor, rows: Sequence[SeqRow]
) -> None:
    """Each row's mean log-ratio over its response tokens is exactly the aimed one: every
    row's values computed together and written in one indexed write per flat buffer."""
    if not rows:
        return
    dtype = lp.dtype
    at = torch.tensor([i for row in rows for i in row.at], dtype=torch.int64)
    lengths = [len(row.at) for row in rows]
    row_base = base[at].to(torch.float64)
    if _small(dtype):
        row_base = torch.zeros_like(row_base)
    counts = torch.tensor(lengths)
    owner = torch.arange(len(rows)).repeat_interleave(counts)
    peaks = torch.zeros(len(rows), dtype=torch.float64)
    peaks.scatter_reduce_(0, owner, row_base.abs(), "amax")
    fits = [_row_gaps(row, peak, dtype) for row, peak in zip(rows, peaks.tolist(), strict=True)]
    q = torch.tensor([fit[0] for fit in fits], dtype=torch.float64).repeat_interleave(counts)
    flat = [fit[1] if isinstance(fit[1], float) else 0.0 for fit in fits]
    g = torch.tensor(flat, dtype=torch.float64).repeat_interleave(counts)
    for (_, gaps), start, n in zip(
        fits, itertools.accumulate([0, *lengths]), lengths, strict=False
    ):
        if isinstance(gaps, torch.Tensor):
            g[start : start + n] = gaps
    o = torch.floor((row_base - g.clamp(min=0.0)) / q) * q
    v = o + g
    over = v > 0.0
    old[at] = torch.where(over, o - q, o).to(dtype)
    lp[at] = torch.where(over, v - q, v).to(dtype)
