"""The ``golden`` item of a marked function: its loss and gradient on every canonical corpus
batch, stored as a polgrad snapshot and compared within the engine's tolerance.

The item is a plain pytest function taking syrupy's ``snapshot`` fixture, so
``--snapshot-update``, unused-snapshot reports and xdist all behave as for any syrupy test.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from syrupy.assertion import SnapshotAssertion

from .corpus import CORPUS_VERSION, canonical_corpus
from .engine import build_context
from .options import ConformanceOptions
from .snapshot import RETAIN, EntryScale, PolgradSnapshotExtension, Tolerant
from .target import Verdict

__all__ = ["golden_data", "golden_test"]


def _own_scale(values: torch.Tensor) -> torch.Tensor:
    """``|v| + max |v|`` over the finite values: a floor that keeps the tolerance in
    proportion to the function's own outputs when they differ from the reference's."""
    v = torch.nan_to_num(values.detach().to(torch.float64), nan=0.0, posinf=0.0, neginf=0.0)
    return v.abs() + v.abs().max()


def golden_data(fn: Callable[..., Any], options: ConformanceOptions) -> Tolerant:
    """Evaluate ``fn`` on the canonical corpus: ``{batch: {"loss": ..., "grad": ...}}`` with
    the tolerance the engine would apply (scales and clip kinks from the reference oracle).

    Raises :class:`~pytest_polgrad.target.Verdict` naming the batch when ``fn`` misbehaves.
    """
    ctx = build_context(fn, options)
    corpus = canonical_corpus(dtype=ctx.tolerance.input_dtype, advantages=options.advantages)
    data: dict[str, dict[str, torch.Tensor]] = {}
    scales: dict[str, EntryScale] = {}
    for name, batch in corpus.items():
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
    return Tolerant(data, tolerance=ctx.tolerance, scales=scales, corpus=CORPUS_VERSION)


def _stored(snapshot: SnapshotAssertion) -> bool:
    location = snapshot.extension.get_location(
        test_location=snapshot.test_location, index=snapshot.index
    )
    return Path(location).is_file()


def golden_test(fn: Callable[..., Any], options: ConformanceOptions) -> Callable[..., None]:
    """The test function of ``fn[<reference>-golden]``; it takes syrupy's ``snapshot``."""
    label = f"{getattr(fn, '__qualname__', fn)} (reference {options.reference_id})"

    def golden(snapshot: SnapshotAssertion) -> None:
        snap = snapshot.use_extension(PolgradSnapshotExtension)
        stored = _stored(snap)
        try:
            data: Tolerant | None = golden_data(fn, options)
        except Verdict as exc:
            data, problem = None, str(exc)
        if data is None:
            if stored:
                _ = snap == RETAIN  # keep the stored golden: this failure is not a new value
            pytest.fail(f"golden: {label} could not be evaluated {problem}", pytrace=False)
        if snap != data:
            if not stored:
                pytest.fail(
                    f"no golden snapshot of {label} is recorded yet: review the function, then "
                    "record it with `pytest --snapshot-update` and commit the new file",
                    pytrace=False,
                )
            diff = "\n".join(snap.get_assert_diff())
            pytest.fail(
                f"golden snapshot of {label} does not match its outputs on the canonical corpus "
                f"(keys read <batch>/<loss|grad>[b,t]):\n{diff}",
                pytrace=False,
            )

    golden.__name__ = getattr(fn, "__name__", "golden")
    golden.__qualname__ = getattr(fn, "__qualname__", golden.__name__)
    golden.__module__ = getattr(fn, "__module__", __name__)
    golden.__doc__ = f"Golden snapshot of {label} on the canonical corpus."
    return golden
