"""Turn the adapter catalogue (``pytest_polgrad.frameworks.cases.CASES``) into functions
marked with the kit, one per case, defined in the calling test module.

Each case's function carries up to two markers: ``id="shipped"``, the reference config the
framework code equals, with every check (the golden is the recorded output in
``snapshots/frameworks/``, so it is not repeated); and, when the case names the algorithm
its option is called after, that algorithm with ``expect=`` for each check on which they
differ (only those checks run there: the others are the shipped marker's job).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, MutableMapping
from typing import Any

import pytest

from polgrad_reference import get_algorithm
from pytest_polgrad.frameworks.cases import CASES, Case, Reference

# Overrides the policy-loss marker takes by name; any other (a surrogate's params such as
# DPPO's is_cap) is applied by passing the derived PolicyLossConfig as the reference.
MARKER_OVERRIDES = frozenset(
    {"aggregation", "budget", "clip", "dual_clip", "eps_high", "eps_low", "is_correction",
     "kl", "ratio", "surrogate"}
)  # fmt: skip

# Every check of the policy-loss kind except the golden (see the module docstring).
SHIPPED_CHECKS = (
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


def adapter(case: Case) -> Callable[..., Any]:
    """The adapter function for ``case`` (imports its framework)."""
    module = importlib.import_module(f"pytest_polgrad.frameworks.{case.framework}")
    factory = getattr(module, case.factory)
    options = dict(case.options)
    positional = [options.pop("mode")] if "mode" in options else []
    fn: Callable[..., Any] = factory(*positional, **options)
    return fn


def _marker(ref: Reference, **options: Any) -> pytest.MarkDecorator:
    if set(ref.overrides) <= MARKER_OVERRIDES:
        return pytest.mark.polgrad_conforms(ref.name, **options, **ref.overrides)
    config = get_algorithm(ref.name).derive(**dict(ref.overrides)).loss
    options.setdefault("id", ref.name)
    return pytest.mark.polgrad_conforms(config, **options)


def _marked(case: Case) -> Callable[..., Any]:
    inner = adapter(case)
    if case.takes_ref:

        def fn(
            logprobs: Any, old_logprobs: Any, advantages: Any, response_mask: Any, ref_logprobs: Any
        ) -> Any:
            return inner(
                logprobs=logprobs,
                old_logprobs=old_logprobs,
                advantages=advantages,
                response_mask=response_mask,
                ref_logprobs=ref_logprobs,
            )
    else:

        def fn(logprobs: Any, old_logprobs: Any, advantages: Any, response_mask: Any) -> Any:
            return inner(
                logprobs=logprobs,
                old_logprobs=old_logprobs,
                advantages=advantages,
                response_mask=response_mask,
            )

    fn.__name__ = fn.__qualname__ = case.id
    fn.__doc__ = f"{case.entry} with {dict(case.options)!r}"
    if case.claims is not None and case.expect:
        fn = _marker(
            case.claims,
            advantages=case.advantages,
            expect=dict(case.expect),
            checks=tuple(case.expect),
        )(fn)
    if not case.equals.batch_dependent:
        fn = _marker(
            case.equals,
            id="shipped",
            advantages=case.advantages,
            checks=SHIPPED_CHECKS,
            expect=dict(case.shipped_expect),
        )(fn)
    return fn


def define_cases(framework: str, namespace: MutableMapping[str, Any]) -> None:
    """Define every case of ``framework`` as a marked function in ``namespace``."""
    for case in CASES:
        if case.framework == framework:
            namespace[case.id] = _marked(case)
