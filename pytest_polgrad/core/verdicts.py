"""What a check can end in, for every kind: a :class:`CheckFailure` (a property does not
hold; the report shows its numbers) or a :class:`Verdict` (the function did something no
check can compare), and how reports of one verdict are shown once."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

__all__ = ["CheckFailure", "Verdict", "repeated_verdict", "value_tables", "verdict_key"]


class Verdict(AssertionError):
    """The function under test did something no check can compare: raised, returned a
    non-scalar / integer / non-tensor, or a loss not differentiable in ``logprobs``."""


class CheckFailure(AssertionError):
    """A property does not hold on a batch; carries what the report shows."""

    def __init__(
        self,
        message: str,
        *,
        numbers: list[tuple[str, str, str]] | None = None,
        entries: list[tuple[tuple[int, ...], float, float]] | None = None,
        error: float = math.inf,
        columns: tuple[str, str] = ("expected", "actual"),
    ) -> None:
        super().__init__(message)
        self.message = message
        self.error = error
        """How far off, in units of tolerance (inf for exact-equality properties)."""
        self.numbers = numbers or []
        """``(quantity, expected, actual)`` rows."""
        self.entries = entries or []
        """Worst gradient entries: ``((b, t), expected, actual)``."""
        self.columns = columns
        """The headings of the two value columns (an input's ``before`` and ``after``)."""


def value_tables(exc: BaseException, position: str) -> list[str]:
    """The report's tables of a failure: its ``numbers`` (quantity, expected, actual) and
    its ``entries`` (``position``, then the two value columns it names)."""
    out: list[str] = []
    numbers: Sequence[tuple[str, str, str]] = getattr(exc, "numbers", [])
    if numbers:
        out += ["", f"  {'quantity':<28} {'expected':>24} {'actual':>24}"]
        out += [f"  {q:<28} {e:>24} {a:>24}" for q, e, a in numbers]
    entries: Sequence[tuple[Any, float, float]] = getattr(exc, "entries", [])
    if entries:
        first, second = getattr(exc, "columns", ("expected", "actual"))
        out += ["", f"  {position:<28} {first:>24} {second:>24}"]
        out += [f"  {p!s:<28} {e:>24.17g} {a:>24.17g}" for p, e, a in entries]
    return out


def verdict_key(message: str) -> str:
    """What makes two verdicts the same: their message with every number masked (the
    same cause on differently sized batches is the same verdict)."""
    return re.sub(r"\d+", "#", message)


def repeated_verdict(report: str, first: str, label: str) -> str:
    """``report`` of a verdict already reported in full by check ``first`` of ``label``:
    its first line, property and verdict, a pointer to that report, and the replay line."""
    lines = report.splitlines()
    kept = lines[:1] + [x for x in lines if x.startswith(("  property ", "  verdict "))]
    replay = [x for x in lines if x.lstrip().startswith("replay ")]
    pointer = (
        f"  (the same verdict as check {first!r} of {label}: its report has the batch and the "
        "snippet)"
    )
    return "\n".join([*kept, pointer, *replay])
