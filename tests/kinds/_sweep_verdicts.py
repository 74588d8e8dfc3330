"""The false-alarm sweep's runs, shared by ``tests/kinds/test_sweep.py`` and the padded half
of ``tests/kinds/test_packed.py``: both run every check of the same correct implementations
on the same small batches (:data:`SIZES`), :data:`EXAMPLES` drawn inputs per check, at the
same seeds, so a test process that runs both makes each run once. A check's result depends
only on the context's options, the check and the seed (the engine's pools are seeded), not
on what ran before: a result served from here is the one a fresh run makes."""

from __future__ import annotations

from typing import Any

from pytest_polgrad.core.engine import CheckResult, build_context, run_check
from pytest_polgrad.core.kinds import get_kind
from pytest_polgrad.core.options import ConformanceOptions

SIZES: dict[str, Any] = {"max_batch": 6, "max_length": 32}
EXAMPLES = 3
"""Drawn inputs per check and seed after the canonical corpus."""

_Key = tuple[Any, ...]
_CONTEXTS: dict[_Key, tuple[Any, ConformanceOptions]] = {}
_RESULTS: dict[_Key, CheckResult] = {}


def _key(kind: str, fn: Any, reference: str, options: dict[str, Any], strict: bool) -> _Key:
    return (kind, fn, reference, repr(sorted(options.items())), strict)


def _context(
    kind: str, fn: Any, reference: str, options: dict[str, Any], strict: bool
) -> tuple[Any, ConformanceOptions]:
    key = _key(kind, fn, reference, options, strict)
    if key not in _CONTEXTS:
        opts = ConformanceOptions(reference, kind=kind, strict=strict, **SIZES, **options)
        _CONTEXTS[key] = (build_context(fn, opts), opts)
    return _CONTEXTS[key]


def check_names(
    kind: str, fn: Any, reference: str, options: dict[str, Any], *, strict: bool = False
) -> list[str]:
    """The checks the kind runs for ``fn`` with these options."""
    ctx, opts = _context(kind, fn, reference, options, strict)
    return [check.name for check in get_kind(kind).checks(ctx.config, opts)]


def result(
    kind: str,
    fn: Any,
    reference: str,
    options: dict[str, Any],
    *,
    check: str,
    seed: int,
    strict: bool = False,
) -> CheckResult:
    """``run_check`` of ``check`` at ``seed``, :data:`EXAMPLES` inputs (made once)."""
    key = (*_key(kind, fn, reference, options, strict), check, seed)
    if key not in _RESULTS:
        ctx, _ = _context(kind, fn, reference, options, strict)
        _RESULTS[key] = run_check(ctx, check, max_examples=EXAMPLES, base_seed=seed)
    return _RESULTS[key]
