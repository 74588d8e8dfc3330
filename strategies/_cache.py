"""Strategy objects built once and reused: constructing and validating a fresh
``st.integers`` / ``st.sampled_from`` on every draw costs more than the draw itself."""

from __future__ import annotations

import functools
from collections.abc import Hashable
from typing import Any

from hypothesis import strategies as st

__all__ = ["BOOLS", "binary", "choice", "ints"]

BOOLS = st.booleans()


@functools.lru_cache(maxsize=8192)
def ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    """``st.integers(lo, hi)``, cached."""
    return st.integers(lo, hi)


@functools.lru_cache(maxsize=1024)
def choice(options: tuple[Hashable, ...]) -> st.SearchStrategy[Any]:
    """``st.sampled_from(options)``, cached; shrinks toward ``options[0]``."""
    return st.sampled_from(options)


@functools.lru_cache(maxsize=1024)
def binary(size: int) -> st.SearchStrategy[bytes]:
    """``st.binary`` of exactly ``size`` bytes, cached."""
    return st.binary(min_size=size, max_size=size)
