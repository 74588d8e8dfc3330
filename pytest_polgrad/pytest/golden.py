"""The ``golden`` item of a marked function: its loss and gradient on every canonical corpus
batch, stored as a polgrad snapshot and compared within the engine's tolerance.

The item is a plain pytest function taking syrupy's ``snapshot`` fixture, so
``--snapshot-update``, unused-snapshot reports and xdist all behave as for any syrupy test.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from syrupy.assertion import SnapshotAssertion

from pytest_polgrad.core.calls import Verdict
from pytest_polgrad.core.engine import build_context, kind_of
from pytest_polgrad.core.golden_format import (
    RETAIN,
    PolgradSnapshotExtension,
    Tolerant,
    write_error,
)
from pytest_polgrad.core.options import ConformanceOptions, MarkerError

__all__ = ["GoldenMismatch", "golden_test"]


def _location(snapshot: SnapshotAssertion) -> str:
    return str(
        snapshot.extension.get_location(test_location=snapshot.test_location, index=snapshot.index)
    )


class GoldenMismatch(pytest.fail.Exception):  # type: ignore[misc,name-defined]
    """The golden snapshot differs from the function's outputs: the only golden failure a
    declared ``expect={"golden": ...}`` excuses (never a function that cannot be evaluated,
    a missing snapshot or a failed write)."""

    # pytest's own outcomes do this: the short summary line reads "GoldenMismatch: golden
    # ...", not a module path that the terminal width cuts to "pytest_polgrad.golde..."
    __module__ = "builtins"


def _note(request: pytest.FixtureRequest, **fields: object) -> None:
    """Add fields to the item's polgrad entry (for the summary and the JSON report)."""
    props = request.node.user_properties
    for i, (key, value) in enumerate(props):
        if key == "polgrad":
            props[i] = (key, json.dumps({**json.loads(str(value)), **fields}))


def golden_test(
    fn: Callable[..., Any], options: ConformanceOptions, *, name: str | None = None
) -> Callable[..., None]:
    """The test function of ``fn[<reference>-golden]``; it takes syrupy's ``snapshot``.
    ``name`` is the name pytest collected the function under (reports use it)."""
    shown = name if name is not None else str(getattr(fn, "__qualname__", fn))
    label = f"{shown} (reference {options.reference_id})"

    def golden(snapshot: SnapshotAssertion, request: pytest.FixtureRequest) -> None:
        snap = snapshot.use_extension(PolgradSnapshotExtension)
        location = _location(snap)
        stored = Path(location).is_file()
        problem = unusable = ""
        try:
            ctx = build_context(fn, options, name=shown)
            data: Tolerant | None = kind_of(options).golden(ctx)
        except Verdict as exc:
            data, problem = None, str(exc)
        except MarkerError as exc:  # e.g. device="cuda" on a machine without CUDA
            data, unusable = None, str(exc)
        if unusable:
            pytest.fail(f"golden: {label}: {unusable}", pytrace=False)
        if data is None:
            if stored:
                _ = snap == RETAIN  # keep the stored golden: this failure is not a new value
            _note(request, match="cannot be evaluated")
            pytest.fail(f"golden: {label} could not be evaluated {problem}", pytrace=False)
        if snap != data:
            failed_write = write_error(location)
            if failed_write:
                pytest.fail(f"golden: {label}: {failed_write}", pytrace=False)
            if not stored:
                _note(request, golden="missing", match="golden not recorded yet")
                pytest.fail(
                    f"no golden snapshot of {label} is recorded yet (see the polgrad summary: "
                    "review the function, run pytest --snapshot-update, commit the file)",
                    pytrace=False,
                )
            diff = "\n".join(snap.get_assert_diff())
            raise GoldenMismatch(
                f"golden snapshot of {label} does not match its outputs on the canonical corpus "
                f"(keys read <batch>/<loss|grad>[b,t]):\n{diff}",
                pytrace=False,
            )

    attribute = name.split("[", 1)[0] if name else getattr(fn, "__name__", "golden")
    golden.__name__ = attribute
    golden.__qualname__ = attribute
    golden.__module__ = getattr(fn, "__module__", __name__)
    golden.__doc__ = f"Golden snapshot of {label} on the canonical corpus."
    return golden
