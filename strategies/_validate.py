"""Eager argument checks: every public strategy validates before it returns.

Errors are Hypothesis' :class:`~hypothesis.errors.InvalidArgument` and name the argument,
the rule and the value, so a bad call fails at definition time, not mid-test.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from hypothesis.errors import InvalidArgument

from polgrad_reference.config import ClipConfig

from ._domain import DOMAINS, SUPPORTED_DTYPES, Domain

__all__ = [
    "check_bool",
    "check_choice",
    "check_clips",
    "check_domain",
    "check_dtype",
    "check_group_fits",
    "check_int",
    "check_range",
    "check_real",
]


def check_int(name: str, value: object, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name} must be an int, got {value!r}")
    if value < minimum:
        what = "a positive" if minimum == 1 else f"an int >= {minimum}, i.e. a non-negative"
        raise InvalidArgument(f"{name} must be {what} size, got {name}={value}")
    return value


def check_range(lo_name: str, lo: int, hi_name: str, hi: int) -> None:
    if lo > hi:
        raise InvalidArgument(f"{lo_name}={lo} must not exceed {hi_name}={hi}")


def check_bool(name: str, value: object, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, bool):
        allowed = "True, False or None" if optional else "True or False"
        raise InvalidArgument(f"{name} must be {allowed}, got {value!r}")


def check_choice(
    name: str, value: object, allowed: Sequence[str], *, optional: bool = False
) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or value not in allowed:
        listing = ", ".join(repr(a) for a in allowed) + (" or None" if optional else "")
        raise InvalidArgument(f"{name} must be one of {listing}, got {value!r}")


def check_dtype(value: object) -> torch.dtype:
    if not isinstance(value, torch.dtype) or value not in SUPPORTED_DTYPES:
        listing = ", ".join(str(d) for d in SUPPORTED_DTYPES)
        raise InvalidArgument(f"dtype must be one of {listing}, got {value!r}")
    return value


def check_domain(value: object) -> Domain:
    check_choice("domain", value, tuple(DOMAINS))
    return DOMAINS[str(value)]


def check_real(
    name: str, value: object, *, low: float, high: float, open_low: bool = True
) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidArgument(f"{name} must be a finite real number, got {value!r}")
    v = float(value)
    if (v <= low if open_low else v < low) or v > high:
        bracket = "(" if open_low else "["
        raise InvalidArgument(f"{name} must lie in {bracket}{low}, {high}], got {name}={v}")
    return v


def check_clips(value: object) -> tuple[ClipConfig, ...] | None:
    if value is None:
        return None
    if isinstance(value, ClipConfig):
        return (value,)
    if isinstance(value, (list, tuple)) and value and all(isinstance(c, ClipConfig) for c in value):
        return tuple(value)
    raise InvalidArgument(
        "clip must be a polgrad_reference ClipConfig, a non-empty sequence of them, or None, "
        f"got {value!r}"
    )


def check_group_fits(group_size: int, min_batch: int, max_batch: int) -> None:
    """``group_size`` must divide some batch size in ``[min_batch, max_batch]``."""
    if -(-min_batch // group_size) > max_batch // group_size:
        raise InvalidArgument(
            f"group_size={group_size} does not divide any batch size in "
            f"[min_batch, max_batch] = [{min_batch}, {max_batch}]; a batch holds whole groups"
        )
