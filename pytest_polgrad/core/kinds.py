"""Kinds of conformance target: one module per kind, registered in :data:`KINDS`.

A *kind* is everything the kit needs to check one sort of function (policy loss,
training step, advantages, KL, aggregation, value loss, entropy):

- its calling convention (which keyword tensors the function takes, what it returns),
- the reference it is compared with (``resolve``: marker reference + overrides -> config),
- its named checks, in report order (``checks``),
- how inputs are drawn (``strategy``: a Hypothesis strategy of :class:`Inputs`) and the
  canonical inputs every check runs first, before any drawn one (``corpus``),
- its diagnosis (``diagnose``: which registered semantics the function computes instead),
- its standalone reproduction snippet and its golden data.

The engine (:mod:`pytest_polgrad.core.engine`) is kind-agnostic: it builds the context, runs the
corpus then a shared pool of drawn inputs through each check, searches and shrinks with
Hypothesis only when something fails, and formats the report. Adding a kind is adding one
module that defines a :class:`Kind` and one line in :data:`KINDS`.

This module imports neither torch nor Hypothesis at import time (the plugin loads it).
"""

from __future__ import annotations

import contextvars
import dataclasses
import importlib
import weakref
from collections.abc import Callable, Hashable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch
    from hypothesis.strategies import SearchStrategy

    from pytest_polgrad.core.options import ConformanceOptions

__all__ = [
    "KINDS",
    "OPTIONAL_HOOKS",
    "SHARED_CALLS",
    "CallStore",
    "Diagnosis",
    "Inputs",
    "Kind",
    "KindCheck",
    "KindContext",
    "get_kind",
    "remember",
]


class CallStore(dict[Any, Any]):
    """Results of calls on batches, kept while the batches live: one function's calls
    shared between its checks (see :data:`SHARED_CALLS`), or the oracle's. A dict that
    entries can refer to weakly, so a store lives only as long as its owner."""


def remember(
    store: CallStore, key: tuple[Hashable, ...], value: object, owners: tuple[object, ...]
) -> None:
    """``store[key] = value`` until any of ``owners`` (the tensors or inputs whose ids
    ``key`` holds) is freed, so a key never names other objects; the entry refers to
    ``store`` weakly. ``TypeError`` (nothing stored) for an owner that takes no weak
    reference."""
    for owner in owners:
        weakref.ref(owner)
    store[key] = value
    ref = weakref.ref(store)
    for owner in owners:
        weakref.finalize(owner, _forget, ref, key)


def _forget(ref: weakref.ref[CallStore], key: tuple[Hashable, ...]) -> None:
    store = ref()
    if store is not None:
        store.pop(key, None)


SHARED_CALLS: contextvars.ContextVar[CallStore | None] = contextvars.ContextVar(
    "polgrad_shared_calls", default=None
)
"""While the engine runs a check over the corpus and the pool: the store in which a kind
may keep one call of the function per input for its other checks (the value and gradient
checks then compare the same call). The caller of :func:`~pytest_polgrad.core.engine.run_check`
chooses the store's scope (one ``assert_conforms`` call; one marked function's items) and
None shares nothing; the search, the shrinking and the re-run of a failure always call
the function afresh, so a flaky function is still caught."""


class Inputs(Protocol):
    """One drawn (or canonical) input of a kind: the tensors, and Python that rebuilds them."""

    def as_kwargs(self) -> dict[str, torch.Tensor]:
        """The tensors by parameter name, canonical layout."""
        ...

    def to_snippet(self) -> str:
        """Standalone Python (``import torch`` + literal tensors) that rebuilds them."""
        ...

    def describe(self) -> str:
        """One line for the report, e.g. ``B=3, T=5, response lengths [1, 5, 2]``."""
        ...


class KindContext(Protocol):
    """What a kind's checks receive: the function, its reference, the tolerance model, and
    the running record of the worst error (in tolerances) and notes for the report."""

    name: str
    """The function's name as pytest collected it (used in reports and snippets)."""
    options: ConformanceOptions
    worst: float
    notes: set[str]


@dataclasses.dataclass(frozen=True)
class KindCheck:
    """One named property of a kind. ``run(ctx, inputs)`` returns the worst error it saw
    (in units of tolerance, ``<= 1``) or raises ``CheckFailure`` / ``Verdict``.
    ``domain`` names the input domain the strategy draws for it (e.g. ``"semantic"``,
    ``"extreme"``)."""

    name: str
    summary: str
    run: Callable[[Any, Mapping[str, Any]], float]
    domain: str = "semantic"
    semantic: bool = True
    """A failure means 'computes other semantics', so a diagnosis is worth running."""
    prepare: Callable[[Any], Any] | None = None
    """A function-independent transform of each drawn input before the check runs (e.g.
    policy loss 'on-policy': ``old_logprobs = logprobs``); the input is reported as
    prepared. Checks whose untransformed inputs are alike share one pool."""


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """What a failing function computes instead: the full sentence and the short form for
    the summary table (``match == ""`` when nothing registered matches)."""

    text: str
    match: str


class Kind(Protocol):
    """The contract every kind module satisfies (see the module docstring)."""

    name: str
    """The marker's ``kind=`` value, e.g. ``"advantages"``."""
    summary: str
    """One line: the calling convention, for docs and errors."""
    override_keys: frozenset[str]
    """Marker keywords this kind forwards to its reference config."""

    def resolve(self, options: ConformanceOptions) -> Any:
        """The reference config for the marker (raise ``MarkerError`` naming the problem)."""
        ...

    def checks(self, config: Any, options: ConformanceOptions) -> list[KindCheck]:
        """The checks that apply to this config and options, in report order."""
        ...

    def context(
        self, fn: Callable[..., Any], name: str, config: Any, options: ConformanceOptions
    ) -> KindContext:
        """Wire the function, its oracle and the tolerance model (``name``: as collected)."""
        ...

    def strategy(self, ctx: KindContext, check: KindCheck) -> SearchStrategy[Inputs]:
        """Inputs for ``check`` (depends on the config and options, never on the function)."""
        ...

    def corpus(self, ctx: KindContext) -> dict[str, Inputs]:
        """Canonical inputs every check runs first, by name (deterministic literals)."""
        ...

    def diagnose(self, ctx: KindContext, inputs: Inputs | None) -> Diagnosis:
        """Which registered semantics the function matches (on the corpus, and whether
        that match holds on the failing ``inputs``)."""
        ...

    def snippet(self, ctx: KindContext, inputs: Inputs, check: KindCheck) -> str:
        """Standalone Python reproducing what ``check`` compared on ``inputs``."""
        ...

    def golden(self, ctx: KindContext) -> Any:
        """The function's outputs on the corpus with their tolerances (a snapshot value)."""
        ...


OPTIONAL_HOOKS = {
    "check": "check(name) -> KindCheck | None: any check by name, applicable or not",
    "pool_key": (
        "pool_key(ctx, check) -> Hashable: what shapes the check's inputs; checks and "
        "functions with equal keys share one pool (default: no sharing across checks)"
    ),
    "extra_inputs": (
        "extra_inputs(ctx, check, seed) -> list[Inputs]: inputs added to the pool after the "
        "drawn ones (e.g. realistic sizes too costly for every drawn example)"
    ),
    "corpus_for": (
        "corpus_for(ctx, check) -> dict[str, Inputs]: the canonical inputs of one check, when "
        "not all of the kind's corpus is in its domain (default: ``corpus(ctx)``)"
    ),
    "shrink": (
        "shrink(ctx, inputs, fails) -> Inputs: a smaller failing input when Hypothesis does "
        "not reproduce a failure (``fails(x)`` says whether ``x`` still fails)"
    ),
    "report": (
        "report(ctx, check, exc, inputs, replay, diagnose) -> (text, diagnosis, match): the "
        "kind's own failure report (default: the engine's, from snippet and diagnose)"
    ),
    "shown": (
        "shown(ctx, inputs) -> Inputs: the failing inputs as the engine's report describes "
        "them and its snippet builds them (e.g. only the tensors the function reads)"
    ),
}
"""Methods a kind may define beyond :class:`Kind`; the engine uses them when present."""


KINDS: Mapping[str, str] = {
    "policy_loss": "pytest_polgrad.kinds.policy_loss.kind",
    "training_step": "pytest_polgrad.kinds.training_step.kind",
    "advantages": "pytest_polgrad.kinds.advantages",
    "kl": "pytest_polgrad.kinds.kl",
    "aggregation": "pytest_polgrad.kinds.aggregation",
    "value_loss": "pytest_polgrad.kinds.value_loss",
    "entropy": "pytest_polgrad.kinds.entropy",
}
"""Kind name -> module defining ``KIND`` (imported on first use)."""


def get_kind(name: str) -> Kind:
    """The :class:`Kind` registered under ``name``; ``ValueError`` listing the kinds."""
    if name not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(map(repr, KINDS))}, got {name!r}")
    module = importlib.import_module(KINDS[name])
    kind: Kind = module.KIND
    return kind
