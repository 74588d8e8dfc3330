"""Loss configurations drawn from the reference registry, optionally varied."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from polgrad_reference.config import Aggregation, ClipConfig, PolicyLossConfig
from polgrad_reference.registry import ALGORITHMS

from ._cache import BOOLS, choice
from ._domain import DEFAULT_CLIPS
from ._sample import composite
from ._validate import check_bool

__all__ = ["algorithm_names", "loss_configs"]

_BUDGETS = (4096, 8, 1024)


def _names(algorithms: Sequence[str] | None) -> tuple[str, ...]:
    if algorithms is None:
        return tuple(ALGORITHMS)
    if isinstance(algorithms, str) or not isinstance(algorithms, (list, tuple)) or not algorithms:
        raise InvalidArgument(
            f"algorithms must be a non-empty list or tuple of registry names, got {algorithms!r}"
        )
    unknown = [a for a in algorithms if a not in ALGORITHMS]
    if unknown:
        raise InvalidArgument(
            f"unknown algorithm(s) {unknown}; known: {', '.join(sorted(ALGORITHMS))}"
        )
    return tuple(algorithms)


def algorithm_names(*, algorithms: Sequence[str] | None = None) -> st.SearchStrategy[str]:
    """Names of registry algorithms (all ten by default). Shrinks to the first, ``ppo``."""
    return st.sampled_from(_names(algorithms))


def _vary_clip(draw: st.DrawFn, clip: ClipConfig) -> ClipConfig:
    if clip.eps_low is None or not draw(BOOLS):
        return clip  # keep one-sided (CISPO) truncation as registered
    other = draw(choice(DEFAULT_CLIPS))
    dual = other.dual_clip if draw(BOOLS) else None
    return ClipConfig(eps_low=other.eps_low, eps_high=other.eps_high, dual_clip=dual)


def loss_configs(
    *, algorithms: Sequence[str] | None = None, vary: bool = False
) -> st.SearchStrategy[PolicyLossConfig]:
    """``spec.loss`` of registry algorithms (``polgrad_reference.registry.ALGORITHMS``).

    With ``vary=True`` the aggregation, the clip range and the dual-clip constant may be
    swapped for other common values (neighbours a diagnosis has to tell apart); every
    drawn config is valid by construction.
    """
    names = _names(algorithms)
    check_bool("vary", vary)

    def _configs(draw: st.DrawFn) -> PolicyLossConfig:
        config = ALGORITHMS[draw(choice(names))].loss
        if not vary:
            return config
        aggregation = draw(choice((config.aggregation, *Aggregation)))
        budget = None
        if aggregation is Aggregation.TOKEN_SUM_NORM:
            budget = config.budget or draw(choice(_BUDGETS))
        varied: PolicyLossConfig = config.replace(
            aggregation=aggregation, budget=budget, clip=_vary_clip(draw, config.clip)
        )
        return varied

    return composite(_configs)
