"""``assert_conforms``: the marker's checks from plain Python."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from pytest_polgrad.core.engine import (
    CheckResult,
    build_context,
    is_verdict,
    resolve_config,
    run_check,
)
from pytest_polgrad.core.expect import evidence_budget, excused_reason, judge
from pytest_polgrad.core.kinds import CallStore
from pytest_polgrad.core.options import MarkerError, parse_marker
from pytest_polgrad.core.verdicts import repeated_verdict, verdict_key
from pytest_polgrad.pytest.collect import checks_for_options
from pytest_polgrad.pytest.notes import passing_notes

__all__ = ["ConformanceError", "ConformanceReport", "assert_conforms"]


@dataclasses.dataclass(frozen=True)
class ConformanceReport:
    """Every check's result for one function against one reference.

    ``expected`` maps declared checks to their reason; ``unexcused`` maps a declared check
    whose failure the declaration does not excuse (a crash, a non-finite result, a
    deviation beyond its declared bound) to why.
    """

    function: str
    reference: str
    results: tuple[CheckResult, ...]
    expected: dict[str, str]
    kind: str = "policy_loss"
    unexcused: Mapping[str, str] = dataclasses.field(default_factory=dict)
    measured: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Declared check that failed -> its worst error on the canonical corpus, in
    tolerances (what a declared ``max_error`` bounds: :func:`~pytest_polgrad.core.expect.size`)."""
    bounds: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Declared check -> its declared ``max_error``, where one is declared."""

    @property
    def unexpected_failures(self) -> list[CheckResult]:
        return [
            r
            for r in self.results
            if not r.passed and (r.check not in self.expected or r.check in self.unexcused)
        ]

    @property
    def stale_expectations(self) -> list[CheckResult]:
        """Checks declared as known deviations that pass now."""
        return [r for r in self.results if r.passed and r.check in self.expected]

    @property
    def seconds(self) -> float:
        """Wall time of every check, in all."""
        return sum(r.seconds for r in self.results)

    @property
    def function_seconds(self) -> float:
        """Of :attr:`seconds`, the function's own calls (the rest is the kit's)."""
        return sum(r.function_seconds for r in self.results)

    def timing(self) -> str:
        """The summary's time row: the whole, the function's own calls, the kit's share, so
        a slow run is blamed on the right party (issue 32)."""
        total, own = self.seconds, self.function_seconds
        return (
            f"  {'time':<18} {total:.3f} s: the function's own calls {own:.3f} s, "
            f"the kit {total - own:.3f} s"
        )

    @property
    def ok(self) -> bool:
        return not self.unexpected_failures and not self.stale_expectations

    def _status(self, r: CheckResult) -> str:
        if r.passed:
            return (
                "passed" if r.check not in self.expected else "PASSED (declared as known deviation)"
            )
        if r.check in self.unexcused:
            return "FAILED (declared, but not excused: " + self.unexcused[r.check] + ")"
        if r.check in self.expected:
            measured = self.measured.get(r.check)
            if measured is None:
                return "expected failure: " + self.expected[r.check]
            reason = excused_reason(
                r.check, self.expected[r.check], measured, self.bounds.get(r.check), r.worst
            )
            return "expected failure, " + reason
        return "FAILED"

    def _counts(self, r: CheckResult) -> str:
        """What the row says after the status: what happened, for a verdict (the function
        raised, returned NaN or a non-tensor: no error in tolerances to show); else the
        examples and the worst error."""
        if not r.passed and is_verdict(r):
            # a declared check's status already quotes the verdict it does not excuse
            return "" if r.check in self.unexcused else f"(verdict: {brief(r.message)})"
        return f"({r.examples} examples, worst {r.worst:.3g} tol)"

    def summary(self) -> str:
        """One row per check: its status, then what happened (:meth:`_counts`); then the
        time row (:meth:`timing`) and the notes of passing checks."""
        lines = [f"{self.function} against {self.reference!r} ({self.kind}):"]
        for r in self.results:
            lines.append(f"  {r.check:<18} {self._status(r)}  {self._counts(r)}".rstrip())
        lines.append(self.timing())
        notes = passing_notes([(self.function, list(r.notes)) for r in self.results if r.passed])
        if notes:
            lines += ["  notes:", *(f"    {n.removeprefix(self.function + ': ')}" for n in notes)]
        return "\n".join(lines)

    def __str__(self) -> str:
        parts = [self.summary()]
        first: dict[str, str] = {}  # one full report per verdict, as the plugin prints
        for r in self.unexpected_failures:
            if not is_verdict(r):
                parts += ["", r.report]
                continue
            seen = first.setdefault(verdict_key(r.message), r.check)
            shown = r.report if seen == r.check else repeated_verdict(r.report, seen, self.function)
            parts += ["", shown]
        for r in self.stale_expectations:
            parts += [
                "",
                f"check {r.check!r} was declared as a known deviation "
                f"({self.expected[r.check]!r}) but it passes now; remove it from expect=",
            ]
        return "\n".join(parts)


def brief(message: str, limit: int = 140) -> str:
    """A verdict in a few words: its first line without the leading "the function "
    (``raised on a valid batch: RuntimeError: ...``), cut at ``limit`` characters."""
    lines = message.strip().splitlines()
    text = lines[0].strip().removeprefix("the function ") if lines else "no message"
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


class ConformanceError(AssertionError):
    """Raised by :func:`assert_conforms`; ``.report`` holds the :class:`ConformanceReport`."""

    def __init__(self, report: ConformanceReport) -> None:
        super().__init__(str(report))
        self.report = report


def assert_conforms(
    fn: Callable[..., Any],
    reference: object,
    *,
    max_examples: int | None = None,
    seed: int = 0,
    name: str | None = None,
    **options: Any,
) -> ConformanceReport:
    """Run every applicable check of ``fn`` against ``reference`` (a registry name or a
    config of the kind, ``kind="policy_loss"`` by default) with the marker's options;
    raise :class:`ConformanceError` on an undeclared failure, a declared one that
    ``expect=`` does not excuse (docs/conformance.md) or a stale ``expect=`` entry, and
    return the report otherwise. ``name`` is the function's name in reports."""

    if isinstance(seed, bool) or not isinstance(seed, int):
        raise MarkerError(f"seed must be an int, got {type(seed).__name__} {seed!r}")
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise MarkerError(f"name must be a non-empty string or None, got {name!r}")
    opts = parse_marker((reference,), {**options, "max_examples": max_examples})
    if "golden" in opts.expect:
        raise MarkerError("expect= names 'golden', which runs only under pytest (a snapshot)")
    checks = [c for c in checks_for_options(opts, resolve_config(opts)) if c != "golden"]
    if not checks:
        raise MarkerError(
            f"no check runs for checks={opts.checks!r} (golden runs only under pytest)"
        )
    label = name if name is not None else str(getattr(fn, "__qualname__", repr(fn)))
    budget = opts.max_examples or 100
    results = []
    unexcused: dict[str, str] = {}
    measured: dict[str, float] = {}
    calls = CallStore()  # this call's checks share the function's calls, no other's
    for check in checks:
        ctx = build_context(fn, opts, name=label)
        result = run_check(ctx, check, max_examples=budget, base_seed=seed, shared=calls)
        again = evidence_budget(budget) if result.passed and check in opts.expect else None
        if again is not None:  # a declared check is called stale at the default budget
            result = run_check(ctx, check, max_examples=again, base_seed=seed, shared=calls)
        if not result.passed and check in opts.expect:
            verdict = judge(ctx, result)
            measured[check] = verdict.measured
            if not verdict.excused:
                unexcused[check] = verdict.problem
        results.append(result)
    report = ConformanceReport(
        function=label,
        reference=opts.reference_id,
        results=tuple(results),
        expected=dict(opts.expect),
        kind=opts.kind,
        unexcused=unexcused,
        measured=measured,
        bounds=dict(opts.expect_bounds),
    )
    if not report.ok:
        raise ConformanceError(report)
    return report
