"""Shared pieces of the token-tensor kinds (training step, aggregation, KL): the inputs
object, the running context, a guarded call of the function under test, report helpers."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import torch

from polgrad_reference.config import Aggregation
from pytest_polgrad.core.calls import SignatureError, resolve_parameters
from pytest_polgrad.core.calls import guarded_call as call_guarded  # one safe call for every kind
from pytest_polgrad.core.kinds import KindCheck
from pytest_polgrad.core.options import ConformanceOptions, MarkerError, did_you_mean
from pytest_polgrad.core.tolerance import Comparison, Tolerance
from pytest_polgrad.core.verdicts import CheckFailure, Verdict
from pytest_polgrad.kinds._returned import scalar_result
from pytest_polgrad.strategies._snippet import snippet

__all__ = [
    "DTYPES",
    "Takes",
    "TokenContext",
    "TokenInputs",
    "aggregation_override",
    "as_passed",
    "call_guarded",
    "check_overrides",
    "fmt",
    "hygiene_checks",
    "named_reference",
    "parameters",
    "pick_output",
    "require_budget",
    "require_scalar",
    "tolerance_for",
    "unknown_overrides",
    "worst_entries",
]

DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def tolerance_for(options: ConformanceOptions) -> Tolerance:
    """The tolerance model for the marker's input dtype, strictness and multiplier."""
    return Tolerance(DTYPES[options.dtype], strict=options.strict, factor=options.tolerance)


def check_overrides(kind: str, options: ConformanceOptions, allowed: Iterable[str]) -> None:
    """Raise ``MarkerError`` naming an override key the kind does not know (and for a
    layout other than right padding, which these kinds do not convert)."""
    if options.layout != "right":
        raise MarkerError(
            f"the {kind} kind passes right-padded [B, T] tensors; layout={options.layout!r} "
            "is not supported for it (convert at your function's edge)"
        )
    unknown_overrides(kind, options, allowed)


_R = TypeVar("_R")


def unknown_overrides(kind: str, options: ConformanceOptions, allowed: Iterable[str]) -> None:
    """Raise ``MarkerError`` naming the first override key the kind does not know."""
    keys = sorted(allowed)
    for key in options.overrides:
        if key not in keys:
            raise MarkerError(
                f"the {kind} kind got unknown override {key!r}{did_you_mean(key, keys)}; "
                f"allowed: {keys}"
            )


def named_reference(kind: str, ref: object, references: Mapping[str, _R], cls: type[_R]) -> _R:
    """The marker's reference: an instance of ``cls`` as given, else the registered
    reference named ``ref``; ``MarkerError`` listing the names otherwise."""
    if isinstance(ref, cls):
        return ref
    if isinstance(ref, str) and ref in references:
        return references[ref]
    names = sorted(references)
    article = "an" if cls.__name__[0] in "AEIOU" else "a"
    raise MarkerError(
        f"the {kind} kind takes a reference among {names} or {article} {cls.__name__}, "
        f"got {ref!r}{did_you_mean(ref, names)}"
    )


def aggregation_override(over: dict[str, Any]) -> None:
    """Turn ``over["aggregation"]`` (a mode's name) into an :class:`Aggregation`, in place;
    ``MarkerError`` with the modes for an unknown one."""
    if "aggregation" not in over:
        return
    try:
        over["aggregation"] = Aggregation(over["aggregation"])
    except ValueError:
        allowed = [a.value for a in Aggregation]
        raise MarkerError(
            f"aggregation must be one of {allowed}, got {over['aggregation']!r}"
            + did_you_mean(over["aggregation"], allowed)
        ) from None


def require_budget(aggregation: Aggregation, budget: object) -> None:
    """``budget`` is a non-negative int for ``token-sum-norm`` (0: the padded width) and
    None for every other mode."""
    if aggregation is Aggregation.TOKEN_SUM_NORM:
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise MarkerError(
                "aggregation='token-sum-norm' needs budget=<positive int> (0: the padded "
                f"width), got {budget!r}"
            )
    elif budget is not None:
        raise MarkerError(f"budget applies to aggregation='token-sum-norm' only, got {budget!r}")


_Run = Callable[[Any, Mapping[str, Any]], float]


def hygiene_checks(
    inputs: str,
    result: str,
    *,
    padding_values: _Run,
    padding_columns: _Run,
    inputs_unchanged: _Run,
    deterministic: _Run,
) -> tuple[KindCheck, ...]:
    """The four non-semantic checks of a token kind whose result has a gradient, in report
    order: ``inputs`` (e.g. ``"logits"``) at padding and appended padding columns leave
    ``result`` (e.g. ``"loss"``) unchanged, no input is modified, two calls agree."""
    return (
        KindCheck(
            "padding-values",
            f"{inputs} at padding positions do not change the {result}",
            padding_values,
            semantic=False,
        ),
        KindCheck(
            "padding-columns",
            f"extra padding columns do not change the {result}",
            padding_columns,
            semantic=False,
        ),
        KindCheck(
            "inputs-unchanged",
            "the function does not modify its inputs in place",
            inputs_unchanged,
            semantic=False,
        ),
        KindCheck(
            "deterministic",
            f"the same batch gives the same {result} and gradient twice",
            deterministic,
            semantic=False,
        ),
    )


@dataclasses.dataclass(frozen=True, eq=False)
class TokenInputs:
    """Canonical ``[B, T]`` right-padded tensors by name (bool ``response_mask``)."""

    tensors: Mapping[str, torch.Tensor]
    label: str = ""

    def as_kwargs(self) -> dict[str, torch.Tensor]:
        return dict(self.tensors)

    def to_snippet(self) -> str:
        return snippet(self.tensors.items(), comment="pytest-polgrad inputs: " + self.describe())

    def describe(self) -> str:
        mask = self.tensors["response_mask"]
        dtypes = {str(t.dtype).removeprefix("torch.") for t in self.tensors.values()}
        dtypes.discard("bool")
        text = (
            f"B={mask.shape[0]}, T={mask.shape[1]}, response lengths "
            f"{mask.sum(dim=1).tolist()}, dtype={'/'.join(sorted(dtypes))}"
        )
        return f"{self.label}: {text}" if self.label else text


@dataclasses.dataclass
class TokenContext:
    """What a token kind's checks receive (see :class:`~pytest_polgrad.core.kinds.KindContext`)."""

    fn: Callable[..., Any]
    name: str
    options: ConformanceOptions
    config: Any
    tolerance: Tolerance
    takes: frozenset[str]
    """Parameter names of ``fn`` (every name when it has ``**kwargs``)."""
    worst: float = 0.0
    notes: set[str] = dataclasses.field(default_factory=set)

    def record(self, cmp: Comparison, what: str) -> float:
        self.worst = max(self.worst, cmp.error)
        finest = self.tolerance.precisions[0]
        if cmp.ok and cmp.precision is not finest:
            self.notes.add(
                f"{what}: consistent with {str(cmp.precision).removeprefix('torch.')} "
                f"arithmetic, not {str(finest).removeprefix('torch.')}; "
                "passes by default, fails with strict=True"
            )
        return cmp.error


class Takes(frozenset[str]):
    """The inputs a function takes, by canonical name, and the parameter each is passed as
    (``spelled``: canonical name -> the function's own name, e.g. ``log_probs``)."""

    spelled: Mapping[str, str]

    def __new__(cls, spelled: Mapping[str, str]) -> Takes:
        made = super().__new__(cls, spelled)
        made.spelled = dict(spelled)
        return made


def parameters(
    fn: Callable[..., Any],
    universe: Iterable[str],
    aliases: Mapping[str, tuple[str, ...]] | None = None,
) -> frozenset[str]:
    """The names of ``universe`` that ``fn`` accepts as keywords (all with ``**kwargs``),
    by canonical name or one of its ``aliases`` (none by default; the training step's:
    :data:`~pytest_polgrad.core.calls.ALIASES`), through the one resolver of every kind
    (:func:`~pytest_polgrad.core.calls.resolve_parameters`, not strict: a parameter the
    kit cannot fill shows as a failing call). The set is a :class:`Takes`, which says how
    each name is spelled (:func:`as_passed`); a kind may narrow it as a plain set."""
    try:
        found = resolve_parameters(fn, universe, aliases=aliases or {}, strict=False)
    except SignatureError as exc:
        raise Verdict(f"cannot read the signature of {fn!r}: {exc.__cause__}") from exc
    return Takes(found)


def as_passed(takes: frozenset[str], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` (by canonical name) under the function's own parameter names, when
    ``takes`` came from :func:`parameters` with aliases."""
    spelled = takes.spelled if isinstance(takes, Takes) else {}
    return {spelled.get(k, k): v for k, v in kwargs.items()}


def pick_output(result: object, key: object, default: str) -> object:
    """The entry of ``result`` the marker's ``loss=`` names: a dict's ``key`` (``default``
    when None), a tuple's or list's index ``key`` (0 when None); any other result itself."""
    if isinstance(result, Mapping):
        k = default if key is None else key
        if k not in result:
            raise Verdict(f"the function returned a dict without key {k!r}; name it with loss=")
        return result[k]
    if isinstance(result, (tuple, list)) and result:
        index = 0 if key is None else key
        if not isinstance(index, int) or not -len(result) <= index < len(result):
            raise Verdict(f"loss={key!r} does not index the returned {type(result).__name__}")
        return result[index]
    return result


def require_scalar(value: object, what: str) -> torch.Tensor:
    """A floating scalar tensor, or a :class:`Verdict` saying what came back instead."""
    return scalar_result(value, what, Verdict)


def fmt(x: float) -> str:
    return f"{x:.17g}" if math.isfinite(x) else str(x)


def worst_entries(
    ratios: torch.Tensor, expected: torch.Tensor, actual: torch.Tensor, k: int = 4
) -> list[tuple[tuple[int, ...], float, float]]:
    """The ``k`` entries furthest beyond tolerance: ``((b, t), expected, actual)``."""
    flat = torch.nan_to_num(ratios, nan=math.inf).flatten()
    out = []
    for i in flat.topk(min(k, flat.numel())).indices.tolist():
        if flat[i] <= 1.0:
            break
        pos = tuple(int(p) for p in torch.unravel_index(torch.tensor(i), ratios.shape))
        out.append((pos, float(expected[pos]), float(actual[pos])))
    return out


def compare_tensor(
    ctx: TokenContext,
    actual: torch.Tensor,
    expected: torch.Tensor,
    scale: torch.Tensor,
    where: torch.Tensor,
    what: str,
    context: str = "",
) -> float:
    """Elementwise comparison within tolerance; ``CheckFailure`` with the worst entries."""
    cmp, ratios = ctx.tolerance.tensor(actual, expected, scale, where)
    if not cmp.ok:
        n_bad = int((ratios > 1).sum())
        raise CheckFailure(
            f"{what} differs from the reference at {n_bad} response position(s), worst by "
            f"{cmp.error:.3g}x the tolerance{context}",
            entries=worst_entries(ratios, expected, actual.to(torch.float64)),
            error=cmp.error,
        )
    return ctx.record(cmp, what)


def compare_value(
    ctx: TokenContext,
    actual: float,
    expected: float,
    scale: float,
    n: int,
    what: str,
    context: str = "",
) -> float:
    """Scalar comparison within tolerance; ``CheckFailure`` with the numbers side by side."""
    cmp = ctx.tolerance.value(actual, expected, scale, n)
    if not cmp.ok:
        raise CheckFailure(
            f"{what} differs from the reference by {abs(actual - expected):.3g} "
            f"({cmp.error:.3g}x the tolerance){context}",
            numbers=[(what, fmt(expected), fmt(actual))],
            error=cmp.error,
        )
    return ctx.record(cmp, what)


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise 'same value', NaN equal to NaN."""
    return (a == b) | (torch.isnan(a) & torch.isnan(b))
