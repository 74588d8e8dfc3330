"""Marker and command-line options, parsed and validated without importing torch."""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from pytest_polgrad.core.kinds import KINDS, get_kind

__all__ = [
    "ADVANTAGE_SHAPES",
    "DISTRIBUTED",
    "DTYPES",
    "LAYOUTS",
    "MAX_TOLERANCE",
    "PROFILES",
    "WORLD_SIZES",
    "ConformanceOptions",
    "MarkerError",
    "did_you_mean",
    "override_keys",
    "parse_marker",
    "validate_check_names",
]

PROFILES: Mapping[str, int] = MappingProxyType({"quick": 20, "default": 100, "thorough": 1000})
"""Example budget per check for ``--polgrad-profile``."""

DTYPES = ("float64", "float32", "bfloat16", "float16")
LAYOUTS = ("right", "left", "packed")
ADVANTAGE_SHAPES = ("sequence", "token")
MAX_TOLERANCE = 1e3
"""Largest ``tolerance=`` multiplier for float64 and float32 inputs: a loss 1.5x the
reference passes ``value`` from about 4e4 and 2x from about 9e4 (float64 inputs; float32
ones 1.2e5 / 2.3e5), so at 1e3 every multiple of 1.5 or more still fails with a margin of
40 (``tests/core/test_tolerance_cap.py``)."""
MAX_HALF_TOLERANCE = 1.0
"""Largest ``tolerance=`` for half-precision inputs: at bfloat16 tolerance (``K u = 12.5%``
of the scale) a 1.5x loss passes ``value`` from a multiplier of about 1.8, and even
``strict=True`` adds one bfloat16 rounding of the result (``u = 2^-8`` per unit of scale),
so the default is already about the widest that tells a loss from 1.5x it."""
_MAX_ERROR = 1e6
"""Largest ``max_error`` of an ``expect=`` declaration, in tolerances."""
_DEVICE = re.compile(r"cpu|cuda(:\d+)?")
DISTRIBUTED = ("ddp", "fsdp")
"""``distributed=`` wraps of the training- and critic-step kinds' real process group (None:
simulated)."""
WORLD_SIZES = (2, 4)
"""``world_size=`` of the real process group (one pool of rank processes per size)."""

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


def did_you_mean(name: object, choices: Iterable[str]) -> str:
    """``" (did you mean 'grpo'?)"`` for the closest of ``choices`` (difflib), else ``""``."""
    if not isinstance(name, str):
        return ""
    options = list(choices)
    longer = [c for c in options if name and c.startswith(name) and c != name]
    if 1 <= len(longer) <= 3:  # a prefix ('seq-mean'): every choice it begins
        return f" (did you mean {' or '.join(map(repr, longer))}?)"
    close = difflib.get_close_matches(name, options, n=3, cutoff=0.6)
    if not close:
        return ""

    def score(choice: str) -> tuple[float, bool]:
        ratio = difflib.SequenceMatcher(None, name, choice).ratio()
        return ratio, sorted(choice) == sorted(name)  # a transposition ('gpro') wins ties

    best = max(close, key=score)
    return f" (did you mean {best!r}?)"


@dataclasses.dataclass(frozen=True)
class ConformanceOptions:
    """How one marked function is checked. Every field has a marker keyword of its name.

    ``reference`` is a registry name or a ``PolicyLossConfig``; ``overrides`` go to
    ``AlgorithmSpec.derive`` (``eps_high=0.28``, ``budget=8`` may also be given directly);
    ``advantages`` is ``"sequence"`` (``[B]``) or ``"token"`` (``[B, T]``); ``layout`` is how
    tensors reach the function; ``loss`` picks the loss out of a tuple/dict return;
    ``tolerance`` multiplies the default tolerance; ``strict`` flags anything beyond
    the finest precision's rounding (float64; float32 for float32 and half-precision
    inputs); ``expect`` maps a check to the reason it is known to fail;
    ``checks`` restricts the generated items; ``padding_nan`` puts NaN (not just finite
    garbage) at padding; ``max_batch`` / ``max_length`` bound the batches (Hypothesis
    draws at most 8 x 256; every pool adds a few realistic-size batches up to these
    bounds); ``kind``
    names the kind of target (``pytest_polgrad.core.kinds.KINDS``); ``holes`` draws masks
    with holes inside a response (multi-turn); ``device`` runs the function on ``"cpu"``
    or ``"cuda"``/``"cuda:N"`` tensors (the oracle stays on CPU in float64);
    ``distributed`` (``"ddp"`` / ``"fsdp"``, training- and critic-step kinds) runs the step's
    multi-rank splits on a real process group of ``world_size`` (2 or 4) ranks.

    Check names in ``expect``/``checks`` are validated here for the policy-loss kind;
    for other kinds the plugin validates them at collection against the kind's checks.
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
    """check -> reason; given as ``"reason"`` or ``("reason", max_error)`` (the bound is
    moved to :attr:`expect_bounds`, so ``expect`` always maps to the reason string)."""
    checks: tuple[str, ...] | None = None
    padding_nan: bool = False
    max_batch: int = 64
    max_length: int = 4096
    id: str | None = None
    kind: str = "policy_loss"
    holes: bool = False
    device: str = "cpu"
    distributed: str | None = None
    world_size: int = 2
    expect_bounds: Mapping[str, float] = dataclasses.field(
        default_factory=dict, init=False, compare=False
    )
    """check -> the largest deviation (in tolerances, on the canonical corpus) the
    declaration excuses; from ``expect={"value": ("reason", max_error)}``."""

    def __post_init__(self) -> None:
        ref = self.reference
        if not isinstance(self.kind, str) or self.kind not in KINDS:
            raise MarkerError(
                f"kind must be one of {', '.join(map(repr, KINDS))}, got {self.kind!r}"
                + did_you_mean(self.kind, KINDS)
            )
        policy = self.kind == "policy_loss"
        if policy and not isinstance(ref, str) and type(ref).__name__ != "PolicyLossConfig":
            raise MarkerError(
                f"reference must be a registry name (str) or a PolicyLossConfig, got {ref!r}"
            )
        if not isinstance(self.device, str) or not _DEVICE.fullmatch(self.device):
            raise MarkerError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        if self.distributed is not None:
            _one_of("distributed", self.distributed, DISTRIBUTED)
            if self.kind not in ("training_step", "critic_step"):
                raise MarkerError(
                    f"distributed={self.distributed!r} applies to kind='training_step' only "
                    f"and its critic twin kind='critic_step', got kind={self.kind!r}"
                )
        ws = self.world_size
        if isinstance(ws, bool) or ws not in WORLD_SIZES:
            raise MarkerError(
                f"world_size must be one of {', '.join(map(str, WORLD_SIZES))} (the real "
                f"process group's ranks), got {ws!r}"
            )
        if ws != 2 and self.distributed is None:
            raise MarkerError(
                f"world_size={ws} needs distributed='ddp' or 'fsdp' (the simulated step "
                "draws its own world sizes)"
            )
        _one_of("advantages", self.advantages, ADVANTAGE_SHAPES)
        _one_of("layout", self.layout, LAYOUTS)
        _one_of("dtype", self.dtype, DTYPES)
        loss = self.loss
        if loss is not None and (
            isinstance(loss, bool) or not isinstance(loss, (str, int)) or loss == ""
        ):
            raise MarkerError(f"loss must be a key (str) or index (int), got {loss!r}")
        ident = self.id
        if ident is not None and (
            not isinstance(ident, str)
            or not ident.strip()
            or not ident.isprintable()
            or any(c in ident for c in ("/", "::", "[", "]"))
        ):
            raise MarkerError(
                "id must be a non-empty printable string without '/', '::', '[' or ']' (it "
                f"becomes part of each item's node id), got {ident!r}"
            )
        tol = self.tolerance
        half = self.dtype in ("bfloat16", "float16")
        cap = MAX_HALF_TOLERANCE if half else MAX_TOLERANCE
        if (
            isinstance(tol, bool)
            or not isinstance(tol, (int, float))
            or not math.isfinite(tol)
            or not 0 < tol <= cap
        ):
            where = f" for dtype={self.dtype!r}" if half else ""
            raise MarkerError(
                f"tolerance must be a multiplier in (0, {cap:g}] of the default tolerance"
                f"{where} (a larger one cannot tell a loss from 1.5x it), got {tol!r}"
            )
        for flag in ("strict", "padding_nan", "holes"):
            if not isinstance(getattr(self, flag), bool):
                raise MarkerError(f"{flag} must be a bool, got {getattr(self, flag)!r}")
        n = self.max_examples
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise MarkerError(f"max_examples must be a positive int, got {n!r}")
        for name in ("max_batch", "max_length"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise MarkerError(f"{name} must be a positive int, got {v!r}")
        if not isinstance(self.expect, Mapping):
            raise MarkerError(f"expect must be a dict {{check: reason}}, got {self.expect!r}")
        reasons: dict[str, str] = {}
        bounds: dict[str, float] = {}
        for check, declared in self.expect.items():
            if policy:
                _known_check("expect", check, _policy_check_names())
            reason, bound = _declaration(check, declared)
            reasons[check] = reason
            if bound is not None:
                bounds[check] = bound
        object.__setattr__(self, "expect", reasons)
        object.__setattr__(self, "expect_bounds", MappingProxyType(bounds))
        if self.checks is not None:
            checks = self.checks
            if isinstance(checks, str):
                checks = (checks,)  # checks="value" is one check, not five characters
            elif not isinstance(checks, Iterable):
                raise MarkerError(f"checks must be a check name or a tuple of them, got {checks!r}")
            object.__setattr__(self, "checks", tuple(checks))
            for check in self.checks or ():
                if policy or not isinstance(check, str):
                    _known_check("checks", check, _policy_check_names())
        if policy:
            unknown = set(self.overrides) - _OVERRIDE_KEYS
            if unknown:
                raise MarkerError(
                    f"unknown override(s) {sorted(unknown)}"
                    + did_you_mean(min(unknown), _OVERRIDE_KEYS)
                    + f"; allowed: {sorted(_OVERRIDE_KEYS)}"
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


def _declaration(check: object, declared: object) -> tuple[str, float | None]:
    """``"reason"`` or ``("reason", max_error)`` -> (reason, bound or None)."""
    reason, bound = declared, None
    if isinstance(declared, tuple):
        if len(declared) != 2:
            raise MarkerError(
                f"expect[{check!r}] must be 'reason' or ('reason', max_error), got {declared!r}"
            )
        reason, bound = declared
        if (
            isinstance(bound, bool)
            or not isinstance(bound, (int, float))
            or not math.isfinite(bound)
            or not 0 < bound <= _MAX_ERROR
        ):
            raise MarkerError(
                f"expect[{check!r}] max_error must be a number of tolerances in "
                f"(0, {_MAX_ERROR:g}], got {bound!r}"
            )
    if not isinstance(reason, str) or not reason.strip():
        raise MarkerError(f"expect[{check!r}] must be a non-empty reason string, got {reason!r}")
    return reason, None if bound is None else float(bound)


def _one_of(field: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise MarkerError(
            f"{field} must be one of {', '.join(map(repr, allowed))}, got {value!r}"
            + did_you_mean(value, allowed)
        )


def _policy_check_names() -> tuple[str, ...]:
    """Every check of the policy-loss kind, in report order (:meth:`Kind.check_names
    <pytest_polgrad.core.kinds.Kind.check_names>`: its entries in
    ``kinds/policy_loss/checks.CHECKS``), and ``golden`` (the snapshot extension's). The
    kind's module, and so torch, is imported only once a marker names a check."""
    return (*get_kind("policy_loss").check_names(), "golden")


def _known_check(field: str, check: object, known: Iterable[str]) -> None:
    names = tuple(known)
    if check not in names:
        raise MarkerError(
            f"{field} names unknown check {check!r}{did_you_mean(check, names)}; checks are: "
            f"{', '.join(names)}"
        )


def validate_check_names(options: ConformanceOptions, known: Iterable[str]) -> None:
    """``expect=``/``checks=`` against the checks a kind defines (collection time)."""
    names = tuple(known)
    for check in options.expect:
        _known_check("expect", check, names)
    for check in options.checks or ():
        _known_check("checks", check, names)


def override_keys(kind: str) -> frozenset[str]:
    """Marker keywords the kind forwards to its reference config (imports the kind's
    module for kinds other than the policy loss)."""
    if kind == "policy_loss":
        return _OVERRIDE_KEYS
    try:
        return frozenset(get_kind(kind).override_keys)
    except ImportError as exc:
        raise MarkerError(f"kind {kind!r} is not available in this installation: {exc}") from exc


def parse_marker(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> ConformanceOptions:
    """Build options from ``polgrad_conforms(reference, **options)``; loss/clip fields may
    be given directly (``budget=8``) or in ``overrides={...}``."""
    if len(args) != 1:
        raise MarkerError(
            f"polgrad_conforms takes exactly one positional argument, the reference "
            f"(e.g. 'grpo'), got {len(args)}"
        )
    fields = {f.name for f in dataclasses.fields(ConformanceOptions) if f.init}
    kind = kwargs.get("kind", "policy_loss")
    if not isinstance(kind, str) or kind not in KINDS:
        raise MarkerError(
            f"kind must be one of {', '.join(map(repr, KINDS))}, got {kind!r}"
            + did_you_mean(kind, KINDS)
        )
    keys = override_keys(kind)
    direct = {k: v for k, v in kwargs.items() if k in keys}
    rest = {k: v for k, v in kwargs.items() if k not in keys}
    unknown = set(rest) - fields
    if unknown:
        raise MarkerError(
            f"polgrad_conforms got unknown option(s) {sorted(unknown)}"
            + did_you_mean(min(unknown), (*fields, *keys))
            + f"; options are {sorted(fields - {'reference'})} and the {kind} overrides "
            f"{sorted(keys)}"
        )
    given = rest.pop("overrides", {}) or {}
    if not isinstance(given, Mapping):
        raise MarkerError(f"overrides must be a dict {{field: value}}, got {given!r}")
    overrides = {**dict(given), **direct}
    if kind != "policy_loss":
        stray = set(overrides) - keys
        if stray:
            raise MarkerError(
                f"unknown override(s) {sorted(stray)}"
                + did_you_mean(min(stray), keys)
                + f"; the {kind} kind accepts: {sorted(keys)}"
            )
    return ConformanceOptions(reference=args[0], overrides=overrides, **rest)
