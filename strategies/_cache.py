"""Strategy objects built once and reused: constructing and validating a fresh
``st.integers`` / ``st.sampled_from`` on every draw costs more than the draw itself.
Keys are typed: ``lru_cache`` would otherwise hand the strategy built for ``1.0`` to a
caller asking for ``1``."""

from __future__ import annotations

import functools
from collections.abc import Hashable
from typing import Any

from hypothesis import strategies as st

__all__ = ["BOOLS", "binary", "choice", "ints"]

BOOLS = st.booleans()


@functools.lru_cache(maxsize=8192, typed=True)
def ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    """``st.integers(lo, hi)``, cached."""
    return st.integers(lo, hi)


def choice(options: tuple[Hashable, ...]) -> st.SearchStrategy[Any]:
    """``st.sampled_from(options)``, cached; shrinks toward ``options[0]``. The key carries
    the options' types: ``(1, 2)`` and ``(1.0, 2.0)`` are equal tuples, not equal options."""
    return _choice(options, tuple(type(o) for o in options))


@functools.lru_cache(maxsize=1024)
def _choice(options: tuple[Hashable, ...], types: tuple[type, ...]) -> st.SearchStrategy[Any]:
    return st.sampled_from(options)


@functools.lru_cache(maxsize=1024, typed=True)
def binary(size: int) -> st.SearchStrategy[bytes]:
    """``st.binary`` of exactly ``size`` bytes, cached."""
    return st.binary(min_size=size, max_size=size)
