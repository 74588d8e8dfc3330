"""The conformance engine: run one named check of one function, for any kind of target.

A check runs, in order, on the kind's canonical corpus (explicit inputs, so a difference
visible there is never missed at any budget or seed), then on a pool of drawn inputs
shared by every check and every marked function with the same batch-shaping options.
The pool is drawn once per process by the strategies' own plan code with seeded random
choices (``strategies/_sample.py``: no Hypothesis bookkeeping per input; a strategy without
a sampler is drawn by Hypothesis instead). Hypothesis searches and shrinks only when a
pooled input fails, with the pool's seed; if it does not meet a failure within the
budget, the kind's shrinker reduces the pooled input. Seeds derive with SHA-256 from
``--polgrad-seed``, the kind and the batch-shaping options, never from the function's
name: every xdist worker, every rerun and every renaming draws the same inputs. The
Hypothesis example database is not used: nothing the user stored there is read or written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Any

from pytest_polgrad.core.clock import spent
from pytest_polgrad.core.kinds import (
    SHARED_CALLS,
    CallStore,
    Diagnosis,
    Kind,
    KindCheck,
    KindContext,
    get_kind,
    remember,
)
from pytest_polgrad.core.saved_snippets import reproduce_lines
from pytest_polgrad.core.verdicts import CheckFailure, Verdict, value_tables

__all__ = [
    "CheckResult",
    "applicable_checks",
    "build_context",
    "checks_for",
    "clear_pools",
    "derive_seed",
    "is_verdict",
    "kind_of",
    "resolve_config",
    "run_check",
]

NON_DETERMINISTIC = "the function returned different results for the same batch on two calls"
"""The verdict of a function whose failure does not reproduce on the same input."""


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """The outcome of one check; serialisable to JSON with :meth:`as_dict`."""

    function: str
    reference: str
    check: str
    passed: bool
    examples: int
    worst: float
    """Worst error seen, in units of tolerance (checks without tolerance report 0)."""
    message: str = ""
    report: str = ""
    diagnosis: str = ""
    match: str = ""
    """Short form of the diagnosis, for the summary table."""
    notes: tuple[str, ...] = ()
    kind: str = "policy_loss"
    seconds: float = dataclasses.field(default=0.0, compare=False)
    """Wall time of the check, search, shrinking, diagnosis and report included."""
    function_seconds: float = dataclasses.field(default=0.0, compare=False)
    """Of ``seconds``, the function's own calls (forward, and the backward through the
    loss it returned, where the kind takes one: :mod:`pytest_polgrad.core.clock`); the
    rest is the kit's. A call shared between checks counts for the check that made it."""

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-compatible data (a non-finite ``worst`` becomes the string "inf")."""
        data = dataclasses.asdict(self)
        data["worst"] = self.worst if math.isfinite(self.worst) else "inf"
        return data


def is_verdict(result: CheckResult) -> bool:
    """Whether ``result`` failed with a verdict (the function did something no check can
    compare: raised, returned NaN, a non-tensor, ...) rather than a finding: its
    ``verdict`` flag where the engine sets one, else its report's ``verdict`` line."""
    return bool(getattr(result, "verdict", False)) or "\n  verdict " in result.report


def _kind_name(options: Any) -> str:
    return str(getattr(options, "kind", "policy_loss"))


def kind_of(options: Any) -> Kind:
    """The :class:`~pytest_polgrad.core.kinds.Kind` that ``options`` names."""
    return get_kind(_kind_name(options))


def resolve_config(options: Any) -> Any:
    """The kind's reference config for the marker (reference + overrides)."""
    return kind_of(options).resolve(options)


def build_context(fn: Callable[..., Any], options: Any, name: str | None = None) -> Any:
    """Wire a function, its reference oracle and the tolerance model together.

    ``name`` is the name pytest collected the function under (default its
    ``__qualname__``); reports, snippets and summary rows use it.
    """
    kind = kind_of(options)
    label = name if name is not None else str(getattr(fn, "__qualname__", repr(fn)))
    return kind.context(fn, label, kind.resolve(options), options)


def _restrict(names: list[str], options: Any) -> list[str]:
    wanted = getattr(options, "checks", None)
    return names if wanted is None else [n for n in names if n in wanted]


def applicable_checks(cfg: Any, options: Any) -> list[str]:
    """Names of the checks that generate items for this config and options, in order."""
    return _restrict([c.name for c in kind_of(options).checks(cfg, options)], options)


def checks_for(options: Any) -> list[str]:
    """Names of the checks that generate items for ``options``, in report order."""
    return applicable_checks(resolve_config(options), options)


def check_of(kind: Kind, ctx: KindContext, name: str) -> KindCheck:
    """The check ``name`` for the context's function (:meth:`Kind.find_check`)."""
    config = getattr(ctx, "config", None)
    if config is None:
        config = kind.resolve(ctx.options)
    return kind.find_check(name, config, ctx.options)


def derive_seed(base: int, *parts: object) -> int:
    """Stable 64-bit seed (SHA-256 of the parts' ``repr``, not Python's salted ``hash``)."""
    text = ":".join([str(base), *(p if isinstance(p, str) else repr(p) for p in parts)])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


# ---- the shared pool ------------------------------------------------------------------

_POOLS: OrderedDict[tuple[Hashable, ...], tuple[tuple[Any, ...], tuple[Any, ...]]] = OrderedDict()
_POOL_LIMIT = 32


def clear_pools() -> None:
    """Forget every pooled input (tests and benchmarks that need a cold start)."""
    _POOLS.clear()


def _settings(max_examples: int, *, shrink: bool) -> Callable[[Any], Any]:
    from hypothesis import (  # hypothesis: when a check runs, not at plugin load
        HealthCheck,
        Phase,
        settings,
    )

    phases = (Phase.generate, Phase.shrink) if shrink else (Phase.generate,)
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        derandomize=False,
        phases=phases,
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
        print_blob=False,
    )


def _draw_pool(strategy: Any, seed: int, max_examples: int) -> tuple[Any, ...]:
    """``max_examples`` inputs of ``strategy`` under ``seed``, in order: drawn by the
    strategy's own plan code with seeded random choices where the strategy supports that
    (:mod:`strategies._sample`, no Hypothesis bookkeeping per input), else the inputs
    Hypothesis generates."""
    from hypothesis import given  # hypothesis: when a check runs, not at plugin load
    from hypothesis import seed as fix_seed  # hypothesis: when a check runs, not at plugin load

    from pytest_polgrad.strategies._sample import sample, sampleable  # torch, hypothesis: as above

    if sampleable(strategy):
        try:
            return sample(strategy, seed, max_examples)
        except LookupError:  # a nested strategy without a sampler, or a filter too strict
            pass

    drawn: list[Any] = []

    @_settings(max_examples, shrink=False)
    @fix_seed(seed)
    @given(inputs=strategy)
    def record(inputs: Any) -> None:
        drawn.append(inputs)

    record()
    return tuple(drawn)


def _cached(key: tuple[Hashable, ...], make: Callable[[], tuple[Any, ...]]) -> tuple[Any, ...]:
    if key in _POOLS:
        _POOLS.move_to_end(key)
        return _POOLS[key]
    _POOLS[key] = made = make()
    while len(_POOLS) > _POOL_LIMIT:
        _POOLS.popitem(last=False)
    return made


def _pool(
    kind: Kind, ctx: KindContext, check: KindCheck, seed: int, budget: int
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """``(drawn, extra)`` within ``budget`` inputs: the kind's ``extra_inputs`` (e.g.
    realistic sizes, too costly for every drawn example) take one eighth of the budget,
    rounded up, and the strategy draws the rest for the pool's seed."""
    key = (kind.name, kind.pool_key(ctx, check), seed)
    extra: tuple[Any, ...] = ()
    if budget > 0:
        extra = _cached((*key, "extra"), lambda: tuple(kind.extra_inputs(ctx, check, seed)))
        extra = extra[: -(-budget // 8)]
    n = budget - len(extra)
    drawn: tuple[Any, ...] = ()
    if n > 0:
        drawn = _cached((*key, n), lambda: _draw_pool(kind.strategy(ctx, check), seed, n))
    return drawn, extra


# ---- running a check ----------------------------------------------------------------------


@dataclasses.dataclass
class _Found:
    inputs: Any
    exc: AssertionError
    source: str
    """Where the failing input came from ("canonical corpus batch 'ragged'", "drawn batch
    of the pool", "realistic-size batch of the pool", "search")."""
    shrunk: bool = False


def _failures() -> tuple[type[BaseException], ...]:
    return (CheckFailure, Verdict)


_PREPARED = CallStore()
"""(prepare, id of the input) -> the prepared input, while the input lives."""


def prepared(check: KindCheck, inputs: Any) -> Any:
    """``check.prepare(inputs)``, made once per input while it lives: the transform does
    not depend on the function, so every function and check sees the same prepared
    tensors, and the oracle's per-batch cache serves them all (policy loss
    'on-policy')."""
    prepare = check.prepare
    if prepare is None:
        return inputs
    key = (prepare, id(inputs))
    if key in _PREPARED:
        return _PREPARED[key]
    made = prepare(inputs)
    with contextlib.suppress(TypeError):  # an input without weak references: every time
        remember(_PREPARED, key, made, (inputs,))
    return made


def _attempt(ctx: KindContext, check: KindCheck, inputs: Any) -> AssertionError | None:
    try:
        check.run(ctx, inputs.as_kwargs())
    except _failures() as exc:
        assert isinstance(exc, AssertionError)
        return exc
    return None


def _search(
    ctx: KindContext, check: KindCheck, strategy: Any, seed: int, max_examples: int
) -> tuple[_Found | None, int, bool]:
    """Hypothesis search + shrink; ``(found, examples, flaky)``. ``flaky`` is True when
    Hypothesis saw a failure it could not reproduce on the same input."""
    from hypothesis import given  # hypothesis: when a check runs, not at plugin load
    from hypothesis import seed as fix_seed  # hypothesis: when a check runs, not at plugin load
    from hypothesis.errors import Flaky  # hypothesis: when a check runs, not at plugin load

    counter = [0]
    last: list[Any] = [None]
    prepare = check.prepare

    @_settings(max_examples, shrink=True)
    @fix_seed(seed)
    @given(inputs=strategy)
    def prop(inputs: Any) -> None:
        counter[0] += 1
        prepared = inputs if prepare is None else prepare(inputs)
        last[0] = prepared
        check.run(ctx, prepared.as_kwargs())

    try:
        prop()
    except _failures() as exc:
        assert isinstance(exc, AssertionError)
        return _Found(last[0], exc, "search", shrunk=True), counter[0], False
    except Flaky:  # FlakyFailure, FlakyReplay, FlakyStrategyDefinition, FlakyBackendFailure
        return None, counter[0], True
    return None, counter[0], False


def corpus_of(kind: Kind, ctx: KindContext, check: KindCheck) -> dict[str, Any]:
    """The canonical inputs ``check`` runs first (:meth:`Kind.corpus_for`)."""
    return dict(kind.corpus_for(ctx, check))


def _candidates(
    kind: Kind, ctx: KindContext, check: KindCheck, seed: int, max_examples: int
) -> Iterator[tuple[str, Any]]:
    """The corpus (always whole, whatever the budget), then the pool: ``max_examples``
    inputs in all when the budget exceeds the corpus."""
    corpus = corpus_of(kind, ctx, check)
    for name, inputs in corpus.items():
        yield f"canonical corpus batch {name!r}", inputs
    drawn, extra = _pool(kind, ctx, check, seed, max(max_examples - len(corpus), 0))
    for inputs in drawn:
        yield "drawn batch of the pool", inputs
    for inputs in extra:
        yield "realistic-size batch of the pool", inputs


def run_check(
    ctx: KindContext,
    check_name: str,
    *,
    max_examples: int,
    base_seed: int,
    replay: str = "",
    diagnose: bool = True,
    shared: CallStore | None = None,
) -> CheckResult:
    """Run one check to completion: pass, or fail with the smallest input found and a report.

    ``shared``: a store that checks of the same function may share calls through while
    they screen the corpus and the pool (:data:`~pytest_polgrad.core.kinds.SHARED_CALLS`);
    pass one store to every check of one function, and a new one whenever the function's
    behaviour may have changed (None: nothing shared).

    Every corpus input and every pooled input runs (``examples`` counts them); on the
    first failure Hypothesis searches and shrinks with the pool's seed. A failure that
    does not happen again on the same input is the verdict :data:`NON_DETERMINISTIC`.
    ``seconds`` and ``function_seconds`` say how long it took and how much of that the
    function's own calls took.
    """
    start, charged = time.perf_counter(), spent()
    kind = kind_of(ctx.options)
    check = check_of(kind, ctx, check_name)
    seed = derive_seed(base_seed, kind.name, kind.pool_key(ctx, check))
    examples = 0
    found: _Found | None = None
    screening = SHARED_CALLS.set(shared)
    try:
        for source, raw in _candidates(kind, ctx, check, seed, max_examples):
            inputs = prepared(check, raw)
            examples += 1
            exc = _attempt(ctx, check, inputs)
            if exc is not None:
                found = _Found(inputs, exc, source)
                break
    finally:
        SHARED_CALLS.reset(screening)
    result = CheckResult(
        function=ctx.name,
        reference=str(getattr(ctx.options, "reference_id", "")),
        check=check.name,
        passed=found is None,
        examples=examples,
        worst=ctx.worst,
        kind=kind.name,
    )
    if found is None:
        seconds, own = _timing(start, charged)
        notes = tuple(sorted(ctx.notes))
        return dataclasses.replace(result, notes=notes, seconds=seconds, function_seconds=own)
    found, searched = _refine(kind, ctx, check, found, seed, max_examples)
    report, diagnosis, match = _report(kind, ctx, check, found, replay, diagnose=diagnose)
    exc = found.exc
    seconds, own = _timing(start, charged)
    return dataclasses.replace(
        result,
        examples=examples + searched,
        worst=max(ctx.worst, float(getattr(exc, "error", math.inf))),
        message=str(exc),
        report=report,
        diagnosis=diagnosis,
        match=match,
        notes=tuple(sorted(ctx.notes)),
        seconds=seconds,
        function_seconds=own,
    )


def _timing(start: float, charged: float) -> tuple[float, float]:
    """The seconds since ``start`` and, of them, the function's (charged since ``charged``)."""
    total = time.perf_counter() - start
    return total, min(spent() - charged, total)


def _refine(
    kind: Kind,
    ctx: KindContext,
    check: KindCheck,
    found: _Found,
    seed: int,
    max_examples: int,
) -> tuple[_Found, int]:
    """Make a found failure small, or turn one that does not recur into the
    non-determinism verdict.

    A pooled input: Hypothesis searches and shrinks with the pool's seed; if it does not
    meet a failure of its own within the budget, the kind's
    ``shrink`` reduces the input. A corpus input (canonical, small, literal values): the
    kind's ``shrink`` only, which is cheaper than a search and keeps the values.
    """
    again = _attempt(ctx, check, found.inputs)
    if again is None:
        return _non_deterministic(found), 0
    found.exc = again
    searched = 0
    corpus = found.source.startswith("canonical corpus")
    if not corpus:
        hit, searched, flaky = _search(ctx, check, kind.strategy(ctx, check), seed, max_examples)
        if flaky:
            return _non_deterministic(found), searched
        if hit is not None:
            return hit, searched
    reduced = ""
    same = type(found.exc)
    calls = [0]

    def fails(x: Any) -> bool:
        calls[0] += 1
        return isinstance(_attempt(ctx, check, x), same)

    smaller = kind.shrink(ctx, found.inputs, fails)
    searched += calls[0]
    exc = _attempt(ctx, check, smaller) if smaller is not found.inputs else None
    if isinstance(exc, same):
        found = _Found(smaller, exc, found.source)
        reduced = ", reduced by the kit's shrinker (rows dropped, columns cut; values kept)"
    if not corpus:  # the batch line names the input and the kit's shrinking
        ctx.notes.add(
            f"Hypothesis did not reproduce the failure within {max_examples} examples, so the "
            "batch shown is not one Hypothesis shrank"
        )
    found.source += reduced
    return found, searched


def _non_deterministic(found: _Found) -> _Found:
    verdict = Verdict(
        f"{NON_DETERMINISTIC} (first: {found.exc}; then it passed, or Hypothesis saw the "
        "same input give a different outcome)"
    )
    return _Found(found.inputs, verdict, found.source)


def _report(
    kind: Kind,
    ctx: KindContext,
    check: KindCheck,
    found: _Found,
    replay: str,
    *,
    diagnose: bool,
) -> tuple[str, str, str]:
    custom = kind.report(ctx, check, found.exc, found.inputs, replay, diagnose)
    if custom is not None:
        text, diagnosis, match = custom
    else:
        found = dataclasses.replace(found, inputs=kind.shown(ctx, found.inputs))
        text, diagnosis, match = _generic_report(kind, ctx, check, found, replay, diagnose)
    if not found.shrunk:
        text = text.replace("(the smallest Hypothesis found)", f"(the {found.source})")
    return str(text), str(diagnosis), str(match)


def _generic_report(
    kind: Kind,
    ctx: KindContext,
    check: KindCheck,
    found: _Found,
    replay: str,
    diagnose: bool,
) -> tuple[str, str, str]:
    """A report from the contract alone: property, verdict, numbers, diagnosis, snippet."""
    exc = found.exc
    label = "verdict" if isinstance(exc, Verdict) else "finding"
    ref = getattr(ctx.options, "reference_id", "")
    how = "the smallest Hypothesis found" if found.shrunk else f"the {found.source}"
    out = [
        f"{ctx.name} does not conform to {ref!r}: check {check.name!r} failed",
        f"  property   {check.summary}",
        f"  {label:<10} {exc}",
        f"  inputs     {found.inputs.describe()} ({how})",
    ]
    out += value_tables(exc, "position")
    diagnosis = match = ""
    if diagnose and check.semantic and not isinstance(exc, Verdict):
        d: Diagnosis = kind.diagnose(ctx, found.inputs)
        diagnosis, match = d.text, d.match
        out += ["", f"  diagnosis  {diagnosis}"]
    if ctx.notes:
        out += ["", "  notes"] + [f"    - {n}" for n in sorted(ctx.notes)]
    out.append("")  # flush left: it runs as printed
    out += reproduce_lines(kind.snippet(ctx, found.inputs, check), ctx.name, check.name)
    if replay:
        out += ["", f"  replay     {replay}"]
    return "\n".join(out), diagnosis, match
