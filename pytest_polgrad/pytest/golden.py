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
import torch
from syrupy.assertion import SnapshotAssertion

from pytest_polgrad.core.calls import Verdict
from pytest_polgrad.core.corpus import corpus_version
from pytest_polgrad.core.engine import build_context, kind_of
from pytest_polgrad.core.golden_format import (
    RETAIN,
    EntryScale,
    PolgradSnapshotExtension,
    Tolerant,
    write_error,
)
from pytest_polgrad.core.options import ConformanceOptions, MarkerError
from pytest_polgrad.kinds.policy_loss.kind import whole_corpus

__all__ = ["GoldenMismatch", "golden_data", "golden_test"]


def _own_scale(values: torch.Tensor) -> torch.Tensor:
    """``|v| + max |v|`` over the finite values: a floor that keeps the tolerance in
    proportion to the function's own outputs when they differ from the reference's."""
    v = torch.nan_to_num(values.detach().to(torch.float64), nan=0.0, posinf=0.0, neginf=0.0)
    return v.abs() + v.abs().max()


def golden_data(fn: Callable[..., Any], options: ConformanceOptions) -> Tolerant:
    """Evaluate ``fn`` on the canonical corpus: ``{batch: {"loss": ..., "grad": ...}}`` with
    the tolerance the engine would apply (scales and clip kinks from the reference oracle).

    Raises :class:`~pytest_polgrad.core.calls.Verdict` naming the batch when ``fn`` misbehaves.
    """
    ctx = build_context(fn, options)
    # the kind's per-process corpus, every tensor kept: the same tensors for every golden
    # item, so the shared oracle computes each reference result once for every function
    corpus = whole_corpus(ctx.tolerance.input_dtype, options.advantages)
    data: dict[str, dict[str, torch.Tensor]] = {}
    scales: dict[str, EntryScale] = {}
    for name, whole in corpus.items():
        batch = whole.as_kwargs()
        try:
            result = ctx.fut.call(batch, grad=True)
        except Verdict as exc:
            raise Verdict(f"on canonical batch {name!r}: {exc}") from exc
        assert result.grad is not None
        ref = ctx.expected(batch)
        data[name] = {"loss": result.loss, "grad": result.grad}
        loss_scale = max(ref.value_scale, float(_own_scale(result.loss.reshape(1)).max()))
        scales[f"{name}/loss"] = EntryScale(loss_scale, count=ref.n_tokens)
        scales[f"{name}/grad"] = EntryScale(
            torch.maximum(ref.grad_scale, _own_scale(result.grad)), skip=ref.ambiguous
        )
    return Tolerant(
        data,
        tolerance=ctx.tolerance,
        scales=scales,
        corpus=corpus_version(ctx.tolerance.input_dtype),
    )


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
