"""The clip range a PPO-clip loss actually uses, read off its gradient and loss.

Past its bound a PPO-clip token's gradient is exactly zero, before it the token is live
(Schulman et al. 2017, arXiv:1707.06347, eq. 7): with ``A > 0`` the token is clipped once
``r > 1 + eps_high``, with ``A < 0`` once ``r < 1 - eps_low``. So the function's gradient
on the canonical corpus brackets each bound: at least the farthest distance ``|r - 1|``
of a live token on that side, below the nearest one of a clipped token (:func:`bracket`).
Inside the bracket no token changes sides, and each clipped token contributes
``-A (1 + eps_high)`` (or ``-A (1 - eps_low)``): the loss is linear in the bound, so two
reference losses per batch give the bound that reproduces the function's losses
(:func:`linear`, :func:`solve`: both bounds at once when both moved), which
:func:`shortest` writes as the shortest decimal that still does.
The diagnosis scores the config with that bound like any other candidate: a bound read
wrongly (a gradient zero for another reason) simply matches nothing.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping

import torch

from polgrad_reference import RatioKind

__all__ = ["SIDES", "bracket", "intervals", "linear", "shortest", "solve"]

SIDES = {"eps_high": 1.0, "eps_low": -1.0}
"""Each relative bound and the sign of the advantages (and of ``r - 1``) it clips."""


def _ratios(batch: Mapping[str, torch.Tensor], ratio: RatioKind) -> torch.Tensor | None:
    """Each token's ratio ``r`` as ``ratio`` forms it (float64), or None for a ratio kind
    whose clipping is not one decision per token or per row."""
    mask = batch["response_mask"]
    lr = torch.where(mask, batch["logprobs"].double() - batch["old_logprobs"].double(), 0.0)
    if ratio is RatioKind.TOKEN:
        return lr.exp()
    if ratio is RatioKind.SEQUENCE:  # GSPO: exp of the row's mean log-ratio, for every token
        mean = lr.sum(dim=1) / mask.sum(dim=1).clamp(min=1)
        return mean.exp()[:, None].expand_as(lr)
    return None


def bracket(
    corpus: Mapping[str, Mapping[str, torch.Tensor]],
    grads: Mapping[str, torch.Tensor],
    ratio: RatioKind,
    side: float,
    reference: Mapping[str, torch.Tensor] | None = None,
) -> tuple[float, float] | None:
    """``(lower, upper)`` with the bound on ``side`` in ``[lower, upper)`` for the
    function whose gradient on corpus batch ``name`` is ``grads[name]``; None when no
    token on that side is clipped (nothing to read) or the tokens contradict each other
    (no single bound: not a PPO-clip loss, or not this ratio kind)."""
    lower, upper = 0.0, math.inf
    for name, batch in corpus.items():
        r = _ratios(batch, ratio)
        if r is None:
            return None
        adv = batch["advantages"].double()
        a = adv[:, None].expand_as(r) if adv.dim() == 1 else adv
        distance = side * (r - 1.0)
        on_side = batch["response_mask"] & (side * a > 0) & (distance > 0)
        zero = grads[name] == 0
        if reference is not None:  # a zero the reference has too (a masked row) says nothing
            on_side = on_side & (reference[name] != 0)
        clipped = on_side & zero
        live = on_side & ~zero
        if bool(live.any()):
            lower = max(lower, float(distance[live].max()))
        if bool(clipped.any()):
            upper = min(upper, float(distance[clipped].min()))
    # without a live token on that side nothing bounds it from below (a detached loss)
    return (lower, upper) if 0.0 < lower < upper < math.inf else None


def intervals(
    corpus: Mapping[str, Mapping[str, torch.Tensor]], limit: int = 64
) -> list[tuple[float, float]]:
    """The brackets ``[r_i - 1, r_{i+1} - 1)`` between consecutive distinct token ratios
    above 1 of the corpus (at most ``limit``, nearest 1 first): a CISPO weight
    ``sg(min(r, 1 + eps_high))`` (MiniMax 2025, arXiv:2506.13585) never zeroes a gradient,
    so its bound is not read off the gradient but tried in each bracket, where the loss is
    linear in it."""
    found: set[float] = set()
    for batch in corpus.values():
        r = _ratios(batch, RatioKind.TOKEN)
        assert r is not None
        found.update(x - 1.0 for x in r[batch["response_mask"] & (r > 1.0)].tolist())
    ordered: list[float] = []
    for x in sorted(found):  # one ratio written twice rounds to two neighbours: one threshold
        if not ordered or x - ordered[-1] > 1e-9 * (1.0 + abs(x)):
            ordered.append(x)
    return list(itertools.pairwise(ordered))[:limit]


def linear(lower: float, upper: float) -> tuple[float, float]:
    """Two bounds inside ``[lower, upper)`` at which to evaluate the reference: the loss is
    linear in the bound between them and across the whole bracket."""
    span = upper - lower
    return lower + span / 3.0, lower + 2.0 * span / 3.0


def solve(rows: list[tuple[float, float, list[float]]], rtol: float) -> list[float] | None:
    """The bounds ``x`` with ``observed = a + slopes . x`` on every batch, from one
    ``(observed, a, slopes)`` row per batch (least squares; batches on which no bound
    acts carry no information and are left out); None when the batches do not determine
    every bound or disagree beyond ``rtol`` (relative to the terms)."""
    if not all(math.isfinite(x) for r in rows for x in (r[0], r[1], *r[2])):
        return None  # a NaN loss determines no bound
    used = [r for r in rows if any(abs(s) > 1e-9 * (1.0 + abs(r[1])) for s in r[2])]
    if not used:
        return None
    a = torch.tensor([r[2] for r in used], dtype=torch.float64)
    y = torch.tensor([[r[0] - r[1]] for r in used], dtype=torch.float64)
    if int(torch.linalg.matrix_rank(a)) < a.shape[1]:
        return None
    x: list[float] = torch.linalg.lstsq(a, y).solution[:, 0].tolist()
    for observed, base, slopes in used:
        terms = [s * v for s, v in zip(slopes, x, strict=True)]
        if abs(observed - base - sum(terms)) > rtol * (abs(base) + sum(map(abs, terms))):
            return None
    return x


def shortest(value: float, lower: float, upper: float, rtol: float) -> float | None:
    """The shortest decimal within ``rtol`` of ``value`` in the bracket ``[lower, upper]``
    widened by that much (a token exactly at the bound is live, and its ratio rounds
    either way): a function's ``0.25`` fitted as ``0.2500000001`` is named ``0.25``. None
    when ``value`` lies outside."""
    slack = rtol * abs(value)
    if not lower - slack <= value <= upper + slack:
        return None
    for digits in range(1, 16):
        d = float(f"{value:.{digits}g}")
        if lower - slack <= d <= upper + slack and abs(d - value) <= slack:
            return d
    return value
