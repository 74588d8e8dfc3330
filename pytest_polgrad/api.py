"""``assert_conforms``: the marker's checks from plain Python."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from .engine import CheckResult, applicable_checks, build_context, resolve_config, run_check
from .options import parse_marker

__all__ = ["ConformanceError", "ConformanceReport", "assert_conforms"]


@dataclasses.dataclass(frozen=True)
class ConformanceReport:
    """Every check's result for one function against one reference."""

    function: str
    reference: str
    results: tuple[CheckResult, ...]
    expected: dict[str, str]

    @property
    def unexpected_failures(self) -> list[CheckResult]:
        return [r for r in self.results if not r.passed and r.check not in self.expected]

    @property
    def stale_expectations(self) -> list[CheckResult]:
        """Checks declared as known deviations that pass now."""
        return [r for r in self.results if r.passed and r.check in self.expected]

    @property
    def ok(self) -> bool:
        return not self.unexpected_failures and not self.stale_expectations

    def summary(self) -> str:
        lines = [f"{self.function} against {self.reference!r}:"]
        for r in self.results:
            if r.passed:
                status = (
                    "passed"
                    if r.check not in self.expected
                    else "PASSED (declared as known deviation)"
                )
            else:
                status = (
                    "expected failure: " + self.expected[r.check]
                    if r.check in self.expected
                    else "FAILED"
                )
            lines.append(
                f"  {r.check:<18} {status}  ({r.examples} examples, worst {r.worst:.3g} tol)"
            )
        return "\n".join(lines)

    def __str__(self) -> str:
        parts = [self.summary()]
        for r in self.unexpected_failures:
            parts += ["", r.report]
        for r in self.stale_expectations:
            parts += [
                "",
                f"check {r.check!r} was declared as a known deviation "
                f"({self.expected[r.check]!r}) but it passes now; remove it from expect=",
            ]
        return "\n".join(parts)


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
    **options: Any,
) -> ConformanceReport:
    """Run every applicable check of ``fn`` against ``reference`` (a registry name or a
    ``PolicyLossConfig``) with the marker's options; raise :class:`ConformanceError` on an
    undeclared failure or a stale ``expect=`` entry, return the report otherwise."""
    opts = parse_marker((reference,), {**options, "max_examples": max_examples})
    budget = opts.max_examples or 100
    checks = applicable_checks(resolve_config(opts), opts)
    stray = set(opts.expect) - set(checks)
    if not checks or stray:
        raise ValueError(
            f"assert_conforms runs the checks {checks} for these options (golden needs "
            f"pytest); expect= names {sorted(stray)} which do not run"
            if stray
            else f"no check runs for checks={opts.checks!r} (golden runs only under pytest)"
        )
    results = tuple(
        run_check(build_context(fn, opts), check, max_examples=budget, base_seed=seed)
        for check in checks
    )
    report = ConformanceReport(
        function=getattr(fn, "__qualname__", repr(fn)),
        reference=opts.reference_id,
        results=results,
        expected=dict(opts.expect),
    )
    if not report.ok:
        raise ConformanceError(report)
    return report
