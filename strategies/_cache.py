"""Strategy objects built once and reused: constructing and validating a fresh
``st.integers`` / ``st.sampled_from`` on every draw costs more than the draw itself. Each
is registered with its uniform sampler (:mod:`._sample`), for the pool's fast path.
Keys are typed: ``lru_cache`` would otherwise hand the strategy built for ``1.0`` to a
caller asking for ``1``."""

from __future__ import annotations

import functools
from collections.abc import Hashable
from typing import Any

from hypothesis import strategies as st

from ._sample import register

__all__ = ["BOOLS", "binary", "choice", "ints", "permutations", "subsets"]

BOOLS = register(st.booleans(), lambda d: d.rng.random() < 0.5)


@functools.lru_cache(maxsize=8192, typed=True)
def ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    """``st.integers(lo, hi)``, cached."""
    return register(st.integers(lo, hi), lambda d: d.rng.randint(lo, hi))


def choice(options: tuple[Hashable, ...]) -> st.SearchStrategy[Any]:
    """``st.sampled_from(options)``, cached; shrinks toward ``options[0]``. The key carries
    the options' types: ``(1, 2)`` and ``(1.0, 2.0)`` are equal tuples, not equal options.
    The same tuple object (a constant, or an ``lru_cache``'s result) is looked up by
    identity first; the entry holds the tuple, so its id is not reused meanwhile."""
    hit = _BY_IDENTITY.get(id(options))
    if hit is not None and hit[0] is options:
        return hit[1]
    found = _choice(options, tuple(type(o) for o in options))
    if len(_BY_IDENTITY) < 4096:
        _BY_IDENTITY[id(options)] = (options, found)
    return found


_BY_IDENTITY: dict[int, tuple[tuple[Hashable, ...], st.SearchStrategy[Any]]] = {}


@functools.lru_cache(maxsize=1024)
def _choice(options: tuple[Hashable, ...], types: tuple[type, ...]) -> st.SearchStrategy[Any]:
    return register(st.sampled_from(options), lambda d: options[d.rng.randrange(len(options))])


@functools.lru_cache(maxsize=1024, typed=True)
def binary(size: int) -> st.SearchStrategy[bytes]:
    """``st.binary`` of exactly ``size`` bytes, cached."""
    return register(st.binary(min_size=size, max_size=size), lambda d: d.rng.randbytes(size))


@functools.lru_cache(maxsize=1024, typed=True)
def subsets(lo: int, hi: int, size: int) -> st.SearchStrategy[frozenset[int]]:
    """Sets of exactly ``size`` distinct integers of ``[lo, hi]``, cached."""
    values = range(lo, hi + 1)
    return register(
        st.frozensets(ints(lo, hi), min_size=size, max_size=size),
        lambda d: frozenset(d.rng.sample(values, size)),
    )


@functools.lru_cache(maxsize=1024)
def permutations(items: tuple[int, ...]) -> st.SearchStrategy[list[int]]:
    """``st.permutations(items)``, cached."""
    return register(st.permutations(items), lambda d: d.rng.sample(items, len(items)))
