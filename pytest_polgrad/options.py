"""Marker and command-line options, parsed and validated without importing torch."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

__all__ = [
    "ADVANTAGE_SHAPES",
    "CHECK_NAMES",
    "DTYPES",
    "LAYOUTS",
    "PROFILES",
    "ConformanceOptions",
    "MarkerError",
    "parse_marker",
]

CHECK_NAMES = (
    "value",
    "gradient",
    "masked-positions",
    "padding-values",
    "padding-columns",
    "inputs-unchanged",
    "deterministic",
    "extreme-finite",
    "micro-batch",
    "on-policy",
)
"""Every check the engine knows, in report order (``golden`` is added by the snapshot
extension)."""

PROFILES: Mapping[str, int] = MappingProxyType({"quick": 20, "default": 100, "thorough": 1000})
"""Example budget per check for ``--polgrad-profile``."""

DTYPES = ("float64", "float32", "bfloat16", "float16")
LAYOUTS = ("right", "left", "packed")
ADVANTAGE_SHAPES = ("sequence", "token")

# Loss/clip fields accepted directly on the marker and forwarded to AlgorithmSpec.derive.
_OVERRIDE_KEYS = frozenset(
    {
        "eps_low",
        "eps_high",
        "dual_clip",
        "aggregation",
        "budget",
        "ratio",
        "surrogate",
        "kl",
        "is_correction",
        "clip",
    }
)


class MarkerError(ValueError):
    """A ``polgrad_conforms`` marker or option was given an invalid value."""


@dataclasses.dataclass(frozen=True)
class ConformanceOptions:
    """How one marked function is checked. Every field has a marker keyword of its name.

    ``reference`` is a registry name or a ``PolicyLossConfig``; ``overrides`` go to
    ``AlgorithmSpec.derive`` (``eps_high=0.28``, ``budget=8`` may also be given directly);
    ``advantages`` is ``"sequence"`` (``[B]``) or ``"token"`` (``[B, T]``); ``layout`` is how
    tensors reach the function; ``loss`` picks the loss out of a tuple/dict return;
    ``tolerance`` multiplies the default tolerance; ``strict`` flags anything beyond
    float64 rounding; ``expect`` maps a check to the reason it is known to fail;
    ``checks`` restricts the generated items; ``padding_nan`` puts NaN (not just finite
    garbage) at padding; ``max_batch`` / ``max_length`` bound the drawn batches.
    """

    reference: object
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    advantages: str = "sequence"
    layout: str = "right"
    dtype: str = "float64"
    loss: str | int | None = None
    tolerance: float = 1.0
    strict: bool = False
    max_examples: int | None = None
    expect: Mapping[str, str] = dataclasses.field(default_factory=dict)
    checks: tuple[str, ...] | None = None
    padding_nan: bool = False
    max_batch: int = 8
    max_length: int = 256
    id: str | None = None

    def __post_init__(self) -> None:
        ref = self.reference
        if not isinstance(ref, str) and type(ref).__name__ != "PolicyLossConfig":
            raise MarkerError(
                f"reference must be a registry name (str) or a PolicyLossConfig, got {ref!r}"
            )
        _one_of("advantages", self.advantages, ADVANTAGE_SHAPES)
        _one_of("layout", self.layout, LAYOUTS)
        _one_of("dtype", self.dtype, DTYPES)
        if self.loss is not None and not isinstance(self.loss, (str, int)):
            raise MarkerError(f"loss must be a key (str) or index (int), got {self.loss!r}")
        tol = self.tolerance
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not tol > 0:
            raise MarkerError(f"tolerance must be a positive multiplier, got {tol!r}")
        if not isinstance(self.strict, bool) or not isinstance(self.padding_nan, bool):
            raise MarkerError("strict and padding_nan must be bools")
        n = self.max_examples
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise MarkerError(f"max_examples must be a positive int, got {n!r}")
        for name in ("max_batch", "max_length"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise MarkerError(f"{name} must be a positive int, got {v!r}")
        if not isinstance(self.expect, Mapping):
            raise MarkerError(f"expect must be a dict {{check: reason}}, got {self.expect!r}")
        for check, reason in self.expect.items():
            _known_check("expect", check)
            if not isinstance(reason, str) or not reason.strip():
                raise MarkerError(f"expect[{check!r}] must be a non-empty reason string")
        if self.checks is not None:
            object.__setattr__(self, "checks", tuple(self.checks))
            for check in self.checks:
                _known_check("checks", check)
        unknown = set(self.overrides) - _OVERRIDE_KEYS
        if unknown:
            raise MarkerError(
                f"unknown override(s) {sorted(unknown)}; allowed: {sorted(_OVERRIDE_KEYS)}"
            )
        object.__setattr__(self, "overrides", MappingProxyType(dict(self.overrides)))
        object.__setattr__(self, "expect", MappingProxyType(dict(self.expect)))

    @property
    def reference_id(self) -> str:
        """The reference's part of item ids: the marker's ``id``, the registry name, or
        ``custom`` for a config object."""
        if self.id is not None:
            return self.id
        return self.reference if isinstance(self.reference, str) else "custom"


def _one_of(field: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise MarkerError(f"{field} must be one of {', '.join(map(repr, allowed))}, got {value!r}")


def _known_check(field: str, check: object) -> None:
    if check not in (*CHECK_NAMES, "golden"):
        raise MarkerError(
            f"{field} names unknown check {check!r}; checks are: "
            f"{', '.join((*CHECK_NAMES, 'golden'))}"
        )


def parse_marker(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> ConformanceOptions:
    """Build options from ``polgrad_conforms(reference, **options)``; loss/clip fields may
    be given directly (``budget=8``) or in ``overrides={...}``."""
    if len(args) != 1:
        raise MarkerError(
            f"polgrad_conforms takes exactly one positional argument, the reference "
            f"(e.g. 'grpo'), got {len(args)}"
        )
    fields = {f.name for f in dataclasses.fields(ConformanceOptions)}
    direct = {k: v for k, v in kwargs.items() if k in _OVERRIDE_KEYS}
    rest = {k: v for k, v in kwargs.items() if k not in _OVERRIDE_KEYS}
    unknown = set(rest) - fields
    if unknown:
        raise MarkerError(
            f"polgrad_conforms got unknown option(s) {sorted(unknown)}; options are "
            f"{sorted(fields - {'reference'})} and the loss overrides {sorted(_OVERRIDE_KEYS)}"
        )
    overrides = {**dict(rest.pop("overrides", {}) or {}), **direct}
    return ConformanceOptions(reference=args[0], overrides=overrides, **rest)
