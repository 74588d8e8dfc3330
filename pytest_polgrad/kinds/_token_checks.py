"""Check bodies the logits and value kinds (entropy, value_loss, logprobs) share: the
comparison with the function's own result, the in-place and determinism checks over the
kind's call, the golden built over the canonical corpus, and :class:`TableKind`, the hooks
of a kind whose checks are one fixed table."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Any

import torch

from pytest_polgrad.core.calls import on_canonical_batch
from pytest_polgrad.core.golden_format import EntryScale, Tolerant
from pytest_polgrad.core.kinds import Kind, KindCheck
from pytest_polgrad.core.options import ConformanceOptions
from pytest_polgrad.core.tolerance import Tolerance
from pytest_polgrad.core.verdicts import CheckFailure, Verdict
from pytest_polgrad.kinds._packed import for_layout
from pytest_polgrad.kinds._tokens import (
    TokenContext,
    bitwise_equal,
    fmt,
    hygiene_checks,
    parameters,
    tolerance_for,
)

__all__ = [
    "TableKind",
    "against_own",
    "corpus_golden",
    "deterministic_check",
    "inputs_unchanged_check",
    "token_hygiene",
    "unchanged_inputs",
]


@contextlib.contextmanager
def against_own(why: str, own: str = "result") -> Iterator[None]:
    """A comparison of the function with itself (padding changed, columns appended): a
    ``CheckFailure`` inside says ``why`` and that the function's ``own`` result was the
    reference."""
    try:
        yield
    except CheckFailure as exc:
        raise CheckFailure(
            f"{why}: {exc.message} (compared with the function's own {own})",
            numbers=exc.numbers,
            entries=exc.entries,
            error=exc.error,
        ) from None


def unchanged_inputs(given: Mapping[str, Any], before: Mapping[str, torch.Tensor]) -> None:
    """``CheckFailure`` naming the first tensor of ``given`` (after the call) that differs
    from its copy in ``before`` (NaN equal to NaN), with up to four positions."""
    for name, t in given.items():
        if not isinstance(t, torch.Tensor):
            continue
        same = bitwise_equal(t.detach(), before[name])
        if not bool(same.all()):
            pos = [tuple(p) for p in (~same).nonzero()[:4].tolist()]
            raise CheckFailure(f"the function modified its input {name!r} in place at {pos}")


_Call = Callable[..., tuple[torch.Tensor, torch.Tensor | None, dict[str, torch.Tensor]]]
"""A kind's call of the function: ``call(ctx, kw)`` -> ``(result, gradient, tensors as
passed)``, the result detached."""
_Run = Callable[[Any, Mapping[str, Any]], float]


def inputs_unchanged_check(
    call: _Call, before: Callable[[Any, Mapping[str, Any]], Mapping[str, torch.Tensor]]
) -> _Run:
    """The 'inputs-unchanged' check: ``before(ctx, kw)`` copies the tensors as the function
    will get them, ``call`` runs it with its gradient, then :func:`unchanged_inputs`."""

    def run(ctx: Any, kw: Mapping[str, Any]) -> float:
        copies = before(ctx, kw)
        _, _, given = call(ctx, kw)
        unchanged_inputs(given, copies)
        return 0.0

    return run


def deterministic_check(call: _Call, numbers: str | None = None) -> _Run:
    """The 'deterministic' check: two calls of ``call`` on one batch give the same result
    and gradient, bit for bit (NaN equal to NaN); a failure shows both results as the
    quantity ``numbers`` (for a scalar result; None: no numbers)."""

    def run(ctx: Any, kw: Mapping[str, Any]) -> float:
        a, ga, _ = call(ctx, kw)
        b, gb, _ = call(ctx, kw)
        assert ga is not None and gb is not None
        if not (bool(bitwise_equal(a, b).all()) and bool(bitwise_equal(ga, gb).all())):
            raise CheckFailure(
                "the function returned different results for the same batch on two calls",
                numbers=[] if numbers is None else [(numbers, fmt(float(a)), fmt(float(b)))],
            )
        return 0.0

    return run


def token_hygiene(
    inputs: str,
    result: str,
    call: _Call,
    before: Callable[[Any, Mapping[str, Any]], Mapping[str, torch.Tensor]],
    *,
    padding_values: _Run,
    padding_columns: _Run,
    numbers: str | None = None,
) -> tuple[KindCheck, ...]:
    """:func:`~pytest_polgrad.kinds._tokens.hygiene_checks` with the kind's own padding
    checks, and its in-place and determinism checks made from ``call``
    (:func:`inputs_unchanged_check` with ``before``, :func:`deterministic_check` with
    ``numbers``)."""
    return hygiene_checks(
        inputs,
        result,
        padding_values=padding_values,
        padding_columns=padding_columns,
        inputs_unchanged=inputs_unchanged_check(call, before),
        deterministic=deterministic_check(call, numbers),
    )


class TableKind(Kind):
    """A token kind whose checks are one fixed ``table`` (by name, in report order, each
    for the layouts :func:`~pytest_polgrad.kinds._packed.for_layout` keeps), whose context
    is a ``context`` (a :class:`~pytest_polgrad.kinds._tokens.TokenContext`) over the
    tensors ``inputs`` (the first one required), and whose inputs' shape for a check is
    :meth:`shape` (checks with equal shapes share a pool)."""

    def __init__(
        self,
        table: Mapping[str, KindCheck],
        inputs: tuple[str, ...],
        context: type[TokenContext] = TokenContext,
    ) -> None:
        self.table = table
        self.inputs = inputs
        self.context_class = context

    def missing(self, name: str) -> str:
        """The verdict for a function ``name`` without the first of :attr:`inputs`."""
        raise NotImplementedError

    def shape(self, ctx: Any, check: KindCheck) -> dict[str, Any]:
        """The strategy's keywords for ``check``."""
        raise NotImplementedError

    def checks(self, config: Any, options: ConformanceOptions) -> list[KindCheck]:
        return for_layout(list(self.table.values()), options)

    def check(self, name: str) -> KindCheck | None:
        return self.table.get(name)

    def context(
        self, fn: Callable[..., Any], name: str, config: Any, options: ConformanceOptions
    ) -> TokenContext:
        takes = parameters(fn, self.inputs)
        if self.inputs[0] not in takes:
            raise Verdict(self.missing(name))
        return self.context_class(
            fn=fn,
            name=name,
            options=options,
            config=config,
            tolerance=tolerance_for(options),
            takes=takes,
        )

    def pool_key(self, ctx: Any, check: KindCheck) -> Hashable:
        return tuple(sorted((k, repr(v)) for k, v in self.shape(ctx, check).items()))


_Entry = tuple[dict[str, torch.Tensor], dict[str, EntryScale]]


def corpus_golden(
    corpus: Mapping[str, Any],
    call: Callable[[Mapping[str, Any]], Any],
    entry: Callable[[Mapping[str, Any], Any], _Entry],
    *,
    tolerance: Tolerance,
    version: int,
) -> Tolerant:
    """The golden over ``corpus``: ``call(kw)`` on each batch's keywords (a failure names
    the batch), then ``entry(kw, called)`` gives its tensors and their scales by key."""
    data: dict[str, dict[str, torch.Tensor]] = {}
    scales: dict[str, EntryScale] = {}
    for name, batch in corpus.items():
        kw = batch.as_kwargs()
        with on_canonical_batch(name):
            called = call(kw)
        data[name], own = entry(kw, called)
        scales.update({f"{name}/{key}": scale for key, scale in own.items()})
    return Tolerant(data, tolerance=tolerance, scales=scales, corpus=version)
