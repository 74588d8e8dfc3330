"""Plans: the plain-data structure Hypothesis draws and :func:`build` turns into tensors.

A plan holds only Python scalars and tuples, so it is hashable, printable and picklable;
the tensors are a pure function of it (bulk values come from ``torch.Generator`` streams
seeded by ``seed``). Rebuilding a plan in any process gives bitwise-identical tensors.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch

from ._masks import Hole

__all__ = [
    "AdvantagePlan",
    "BatchPlan",
    "GroupPlan",
    "RefPlan",
    "RolloutPlan",
    "SeqTarget",
    "TokenTarget",
    "ValuePlan",
    "stream",
]

Style = Literal["constant", "grid", "random"]
AdvantageShape = Literal["sequence", "token"]
AdvantagePattern = Literal["grid", "zero", "tie", "cancel", "random"]
Padding = Literal["garbage", "nan"]


def stream(seed: int, k: int) -> torch.Generator:
    """The ``k``-th independent generator of a plan seeded with ``seed``.

    Separate streams keep one component's values unchanged when another is toggled (for
    example adding ``ref_logprobs`` leaves ``logprobs`` bitwise the same), which keeps
    shrinking stable.
    """
    return torch.Generator().manual_seed(seed * 2**20 + k)


@dataclasses.dataclass(frozen=True)
class TokenTarget:
    """Token ``(row, col)`` gets ratio ``boundary + side * delta`` (delta widened as the
    dtype requires); with per-token advantages its advantage becomes ``advantage``."""

    row: int
    col: int
    boundary: float
    side: int
    delta: float
    advantage: float | None = None


@dataclasses.dataclass(frozen=True)
class SeqTarget:
    """Row ``row`` gets sequence ratio ``exp(mean_t log r_t) = boundary + side * delta``;
    its token log-ratios scatter around the mean with amplitude ``noise`` (float64)."""

    row: int
    boundary: float
    side: int
    delta: float
    noise: float = 0.0


@dataclasses.dataclass(frozen=True)
class ValuePlan:
    """How ``logprobs`` / ``old_logprobs`` are filled.

    ``style``: ``constant`` (every value -1.0, ratio 1), ``grid`` (values from a short
    table of simple numbers) or ``random`` (``-base_scale * u ** base_power`` with a
    uniform log-ratio in ``[-gap_scale, gap_scale]``). With ``aim_stride`` k > 0 (any
    style), every k-th column instead holds the log-ratio of ``column_aims`` (ratio,
    side, delta) in turn: every long enough row has a token in every boundary region.
    """

    style: Style = "constant"
    base_scale: float = 1.0
    base_power: int = 1
    gap_scale: float = 0.0
    aim_stride: int = 0
    column_aims: tuple[tuple[float, int, float], ...] = ()
    rare: tuple[tuple[int, int, float], ...] = ()
    seq_targets: tuple[SeqTarget, ...] = ()
    token_targets: tuple[TokenTarget, ...] = ()


@dataclasses.dataclass(frozen=True)
class AdvantagePlan:
    """Advantages: ``shape`` ``[B]`` or ``[B, T]``; per-row ``values`` (for ``random``
    only their signs count: magnitudes come from the generator); ``magnitudes`` scale
    rows (extreme domain); ``noise`` adds per-token variation to ``[B, T]`` advantages."""

    shape: AdvantageShape = "sequence"
    pattern: AdvantagePattern = "grid"
    values: tuple[float, ...] = ()
    magnitudes: tuple[float, ...] | None = None
    noise: float = 0.0


@dataclasses.dataclass(frozen=True)
class GroupPlan:
    """``size`` samples per prompt, ids contiguous (``0 0 1 1``) or interleaved
    (``0 1 0 1``), one reward per sample."""

    size: int
    order: Literal["contiguous", "interleaved"]
    rewards: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class RefPlan:
    """``ref = -|logprobs + d|`` with ``d`` uniform in ``[-scale, scale]`` (0: ref == lp)."""

    scale: float = 0.0


@dataclasses.dataclass(frozen=True)
class RolloutPlan:
    """``rollout = -|old + d|``: small uniform ``d`` everywhere plus ``spikes``
    ``(row, col, d)``, the catastrophic tokens a rollout engine produces."""

    scale: float = 0.0
    spikes: tuple[tuple[int, int, float], ...] = ()


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """Everything needed to rebuild a :class:`~pytest_polgrad.strategies.Batch` exactly."""

    extents: tuple[int, ...]
    width: int
    holes: tuple[Hole, ...] = ()
    dtype: str = "float64"
    domain: str = "semantic"
    layout: str = "right"
    padding: Padding = "garbage"
    max_log_ratio: float = 4.0
    seed: int = 0
    values: ValuePlan = dataclasses.field(default_factory=ValuePlan)
    advantages: AdvantagePlan = dataclasses.field(default_factory=AdvantagePlan)
    ref: RefPlan | None = None
    rollout: RolloutPlan | None = None
    groups: GroupPlan | None = None

    @property
    def torch_dtype(self) -> torch.dtype:
        dtype = getattr(torch, self.dtype)
        assert isinstance(dtype, torch.dtype)
        return dtype
