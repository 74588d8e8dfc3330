"""Kinds of conformance target: one module per kind, registered in :data:`KINDS`.

A *kind* is everything the kit needs to check one sort of function (policy loss,
training step, advantages, KL, aggregation, value loss, entropy):

- its calling convention (which keyword tensors the function takes, what it returns),
- the reference it is compared with (``resolve``: marker reference + overrides -> config),
- its named checks, in report order (``checks``),
- how inputs are drawn (``strategy``: a Hypothesis strategy of :class:`Inputs`) and the
  canonical inputs every check runs first, before any drawn one (``corpus``),
- its diagnosis (``diagnose``: which registered semantics the function computes instead),
- its standalone reproduction snippet and its golden data,
- optional hooks with defaults (pool sharing, extra inputs, a per-check corpus, its own
  shrinker and report): :class:`Kind` is a base class, not a checklist.

The engine (:mod:`pytest_polgrad.core.engine`) is kind-agnostic: it builds the context, runs the
corpus then a shared pool of drawn inputs through each check, searches and shrinks with
Hypothesis only when something fails, and formats the report. Adding a kind is adding one
module that subclasses :class:`Kind` and one line in :data:`KINDS`.

This module imports neither torch nor Hypothesis at import time (the plugin loads it).
"""

from __future__ import annotations

import contextvars
import dataclasses
import importlib
import weakref
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch
    from hypothesis.strategies import SearchStrategy

    from pytest_polgrad.core.options import ConformanceOptions

__all__ = [
    "KINDS",
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


class Kind:
    """The contract every kind satisfies, with the default of each optional hook.

    A kind subclasses this and defines the required methods (``resolve`` to ``golden``,
    which raise ``NotImplementedError`` here); the optional hooks below them have defaults
    the engine relies on, so it never probes a kind for a method.
    """

    name: str
    """The marker's ``kind=`` value, e.g. ``"advantages"``."""
    summary: str
    """One line: the calling convention, for docs and errors."""
    override_keys: frozenset[str] = frozenset()
    """Marker keywords this kind forwards to its reference config."""

    # ---- required --------------------------------------------------------------------

    def resolve(self, options: ConformanceOptions) -> Any:
        """The reference config for the marker (raise ``MarkerError`` naming the problem)."""
        raise NotImplementedError

    def checks(self, config: Any, options: ConformanceOptions) -> list[KindCheck]:
        """The checks that apply to this config and options, in report order."""
        raise NotImplementedError

    def context(
        self, fn: Callable[..., Any], name: str, config: Any, options: ConformanceOptions
    ) -> KindContext:
        """Wire the function, its oracle and the tolerance model (``name``: as collected)."""
        raise NotImplementedError

    def strategy(self, ctx: Any, check: KindCheck) -> SearchStrategy[Any]:
        """Inputs for ``check`` (depends on the config and options, never on the function)."""
        raise NotImplementedError

    def corpus(self, ctx: Any) -> Mapping[str, Any]:
        """Canonical inputs every check runs first, by name (deterministic literals)."""
        raise NotImplementedError

    def diagnose(self, ctx: Any, inputs: Any) -> Diagnosis:
        """Which registered semantics the function matches (on the corpus, and whether
        that match holds on the failing ``inputs``)."""
        raise NotImplementedError

    def snippet(self, ctx: Any, inputs: Any, check: KindCheck) -> str:
        """Standalone Python reproducing what ``check`` compared on ``inputs``."""
        raise NotImplementedError

    def golden(self, ctx: Any) -> Any:
        """The function's outputs on the corpus with their tolerances (a snapshot value)."""
        raise NotImplementedError

    # ---- optional, with defaults -------------------------------------------------------

    def check(self, name: str) -> KindCheck | None:
        """Any check by name, applicable to the marker or not (None: look only among the
        applicable :meth:`checks`)."""
        return None

    def check_names(self) -> tuple[str, ...]:
        """Every check the kind defines, applicable or not, in report order: the names a
        marker may give before its config is resolved (the marker validates them at
        construction); default none (they are validated at collection instead)."""
        return ()

    def find_check(self, name: str, config: Any, options: ConformanceOptions) -> KindCheck:
        """The check ``name``: :meth:`check`, else the applicable one; ``ValueError``
        listing the applicable checks. The one lookup the engine and ``expect`` use."""
        found = self.check(name)
        if found is not None:
            return found
        checks = {c.name: c for c in self.checks(config, options)}
        if name not in checks:
            raise ValueError(
                f"check must be one of {', '.join(map(repr, checks))} for kind "
                f"{self.name!r}, got {name!r}"
            )
        return checks[name]

    def pool_key(self, ctx: Any, check: KindCheck) -> Hashable:
        """What shapes the check's inputs: checks and functions with equal keys share one
        pool (default: no sharing across checks)."""
        return (check.name, repr(ctx.options))

    def extra_inputs(self, ctx: Any, check: KindCheck, seed: int) -> Sequence[Any]:
        """Inputs added to the pool after the drawn ones (e.g. realistic sizes too costly
        for every drawn example); default none."""
        return ()

    def corpus_for(self, ctx: Any, check: KindCheck) -> Mapping[str, Any]:
        """The canonical inputs of one check, when not all of the kind's corpus is in its
        domain (default: the whole :meth:`corpus`)."""
        return self.corpus(ctx)

    def shrink(self, ctx: Any, inputs: Any, fails: Callable[[Any], bool]) -> Any:
        """A smaller failing input when Hypothesis does not reproduce a failure
        (``fails(x)`` says whether ``x`` still fails); default ``inputs`` itself."""
        return inputs

    def report(
        self,
        ctx: Any,
        check: KindCheck,
        exc: BaseException,
        inputs: Any,
        replay: str,
        diagnose: bool,
    ) -> tuple[str, str, str] | None:
        """The kind's own failure report ``(text, diagnosis, match)``; None (the default):
        the engine's, from :meth:`shown`, :meth:`snippet` and :meth:`diagnose`."""
        return None

    def shown(self, ctx: Any, inputs: Any) -> Any:
        """The failing inputs as the engine's report describes them and its snippet builds
        them (e.g. only the tensors the function reads); default ``inputs`` itself."""
        return inputs


KINDS: Mapping[str, str] = {
    "policy_loss": "pytest_polgrad.kinds.policy_loss.kind",
    "training_step": "pytest_polgrad.kinds.training_step.kind",
    "critic_step": "pytest_polgrad.kinds.training_step.critic",
    "advantages": "pytest_polgrad.kinds.advantages",
    "kl": "pytest_polgrad.kinds.kl",
    "aggregation": "pytest_polgrad.kinds.aggregation",
    "value_loss": "pytest_polgrad.kinds.value_loss",
    "entropy": "pytest_polgrad.kinds.entropy",
    "logprobs": "pytest_polgrad.kinds.logprobs.kind",
}
"""Kind name -> module defining ``KIND`` (imported on first use)."""


def get_kind(name: str) -> Kind:
    """The :class:`Kind` registered under ``name``; ``ValueError`` listing the kinds."""
    if name not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(map(repr, KINDS))}, got {name!r}")
    module = importlib.import_module(KINDS[name])
    kind: Kind = module.KIND
    return kind
