"""The policy-loss kind's golden data: the function's loss and gradient on every canonical
corpus batch, with the tolerance the engine would apply (the snapshot value of the
``golden`` item, :mod:`pytest_polgrad.pytest.golden`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from pytest_polgrad.core.calls import on_canonical_batch
from pytest_polgrad.core.corpus import corpus_version
from pytest_polgrad.core.engine import build_context
from pytest_polgrad.core.golden_format import EntryScale, Tolerant
from pytest_polgrad.core.options import ConformanceOptions
from pytest_polgrad.kinds.policy_loss.corpus import whole_corpus

__all__ = ["golden_data"]


def _own_scale(values: torch.Tensor) -> torch.Tensor:
    """``|v| + max |v|`` over the finite values: a floor that keeps the tolerance in
    proportion to the function's own outputs when they differ from the reference's."""
    v = torch.nan_to_num(values.detach().to(torch.float64), nan=0.0, posinf=0.0, neginf=0.0)
    return v.abs() + v.abs().max()


def golden_data(fn: Callable[..., Any], options: ConformanceOptions) -> Tolerant:
    """Evaluate ``fn`` on the canonical corpus: ``{batch: {"loss": ..., "grad": ...}}`` with
    the tolerance the engine would apply (scales and clip kinks from the reference oracle).

    Raises :class:`~pytest_polgrad.core.verdicts.Verdict` naming the batch when ``fn`` misbehaves.
    """
    ctx = build_context(fn, options)
    # the kind's per-process corpus, every tensor kept: the same tensors for every golden
    # item, so the shared oracle computes each reference result once for every function
    corpus = whole_corpus(ctx.tolerance.input_dtype, options.advantages)
    data: dict[str, dict[str, torch.Tensor]] = {}
    scales: dict[str, EntryScale] = {}
    for name, whole in corpus.items():
        batch = whole.as_kwargs()
        with on_canonical_batch(name):
            result = ctx.fut.call(batch, grad=True)
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
