"""Drawing from the kit's own strategies without Hypothesis: the shared pool's fast path.

The batch plans call ``draw(strategy)`` on a few leaf strategies (:func:`._cache.ints`,
:func:`._cache.choice`, :data:`._cache.BOOLS`, :func:`._cache.binary`) and on the
composites built from them. Each is registered here with a *sampler*: the same plan code
then runs either under Hypothesis (its ``draw``: search and shrinking) or under
:class:`RandomDraw`, whose choices come from ``random.Random(seed)``. A Hypothesis draw
costs about a millisecond per batch in engine bookkeeping; a random one costs what the
plan's own arithmetic costs. Choices are uniform: the plans already aim at clip
boundaries and size classes by construction, rather than relying on Hypothesis's
preference for small values. A :func:`staged` strategy (``batches()``) splits drawing a
plan from building its tensors, so :func:`sample` draws a pool's plans first and builds
them in one call.
"""

from __future__ import annotations

import random
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import hypothesis.strategies as st
from hypothesis.strategies import SearchStrategy

__all__ = [
    "RandomDraw",
    "composite",
    "filtered",
    "mapped",
    "register",
    "sample",
    "sampleable",
    "staged",
]

S = TypeVar("S")
T = TypeVar("T")
U = TypeVar("U")

Sampler = Callable[[Any], Any]
"""Called with a :class:`RandomDraw` (typed ``Any``: the plans are typed against
Hypothesis's ``DrawFn`` protocol, which a plain class cannot satisfy)."""

_SAMPLERS: dict[int, Sampler] = {}
"""id(strategy) -> sampler; an entry goes when its strategy is collected, before the id
can be reused."""


_STAGED: dict[int, tuple[Sampler, Callable[[list[Any]], list[Any]]]] = {}
"""id(strategy) -> (plan sampler, build_many) of a :func:`staged` strategy."""


def _keep(table: dict[int, Any], strategy: object, entry: Any) -> None:
    key = id(strategy)
    table[key] = entry
    weakref.finalize(strategy, table.pop, key, None)


def register(strategy: S, sampler: Sampler) -> S:
    """Record how to draw from ``strategy`` without Hypothesis; returns ``strategy``."""
    _keep(_SAMPLERS, strategy, sampler)
    return strategy


@st.composite
def _planned(draw: st.DrawFn, plan: Callable[[st.DrawFn], T]) -> T:
    return plan(draw)


def composite(plan: Callable[[st.DrawFn], T]) -> SearchStrategy[T]:
    """``st.composite(plan)()``, registered with ``plan`` as its sampler.

    One module-level composite runs every plan: ``st.composite`` itself re-reads and parses
    the decorated function's source each time it is applied (about 3 ms), which a strategy
    built per pool, or per drawn step, would pay every time."""
    return register(_planned(plan), plan)


def staged(
    draw_plan: Callable[[st.DrawFn], T], build_many: Callable[[list[T]], list[U]]
) -> SearchStrategy[U]:
    """``composite`` of ``build_many([draw_plan(draw)])[0]``. :func:`sample` draws all its
    plans first and builds them in one ``build_many`` call (which must give each plan the
    value it gives it alone), so a pool pays a builder's fixed costs once, not per input."""
    strategy = composite(lambda draw: build_many([draw_plan(draw)])[0])
    _keep(_STAGED, strategy, (draw_plan, build_many))
    return strategy


def sampleable(strategy: object) -> bool:
    """Whether :class:`RandomDraw` can draw from ``strategy``."""
    return id(strategy) in _SAMPLERS


class RandomDraw:
    """A ``draw`` function for the registered strategies, seeded: equal seeds give equal
    draws, in any process (``random.Random`` is not salted)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def __call__(self, strategy: SearchStrategy[T], label: object = None) -> T:
        sampler = _SAMPLERS.get(id(strategy))
        if sampler is None:
            raise LookupError(f"no sampler registered for {strategy!r}")
        found: T = sampler(self)
        return found


def sample(strategy: SearchStrategy[T], seed: int, n: int) -> tuple[T, ...]:
    """``n`` draws from ``strategy`` under ``seed``, in order."""
    draw = RandomDraw(seed)
    two_stage = _STAGED.get(id(strategy))
    if two_stage is not None:
        draw_plan, build_many = two_stage
        return tuple(build_many([draw_plan(draw) for _ in range(n)]))
    return tuple(draw(strategy) for _ in range(n))


def mapped(strategy: SearchStrategy[T], fn: Callable[[T], U]) -> SearchStrategy[U]:
    """``strategy.map(fn)``, registered when ``strategy`` is."""
    out = strategy.map(fn)
    if sampleable(strategy):
        register(out, lambda d: fn(d(strategy)))
    two_stage = _STAGED.get(id(strategy))
    if two_stage is not None:
        draw_plan, build_many = two_stage
        _keep(_STAGED, out, (draw_plan, lambda plans: [fn(x) for x in build_many(plans)]))
    return out


def filtered(
    strategy: SearchStrategy[T], keep: Callable[[T], bool], tries: int = 1000
) -> SearchStrategy[T]:
    """``strategy.filter(keep)``, registered when ``strategy`` is: a random draw retries up
    to ``tries`` times, then gives up with ``LookupError`` (the pool then asks Hypothesis)."""
    out = strategy.filter(keep)

    def sampler(d: RandomDraw) -> T:
        for _ in range(tries):
            found = d(strategy)
            if keep(found):
                return found
        raise LookupError(f"no draw of {strategy!r} passed the filter in {tries} tries")

    if sampleable(strategy):
        register(out, sampler)
    return out
