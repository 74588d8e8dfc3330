"""Check bodies the logits and value kinds (entropy, value_loss, logprobs) share: the
comparison with the function's own result, the in-place check over what was passed, and
the golden built over the canonical corpus."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from pytest_polgrad.core.calls import on_canonical_batch
from pytest_polgrad.core.golden_format import EntryScale, Tolerant
from pytest_polgrad.core.tolerance import Tolerance
from pytest_polgrad.core.verdicts import CheckFailure
from pytest_polgrad.kinds._tokens import bitwise_equal

__all__ = ["against_own", "corpus_golden", "unchanged_inputs"]


@contextlib.contextmanager
def against_own(why: str, own: str = "result") -> Iterator[None]:
    """A comparison of the function with itself (padding changed, columns appended): a
    ``CheckFailure`` inside says ``why`` and that the function's ``own`` result was the
    reference."""
    try:
        yield
    except CheckFailure as exc:
        raise CheckFailure(
            f"{why}: {exc.message} (compared with the function's own {own})",
            numbers=exc.numbers,
            entries=exc.entries,
            error=exc.error,
        ) from None


def unchanged_inputs(given: Mapping[str, Any], before: Mapping[str, torch.Tensor]) -> None:
    """``CheckFailure`` naming the first tensor of ``given`` (after the call) that differs
    from its copy in ``before`` (NaN equal to NaN), with up to four positions."""
    for name, t in given.items():
        if not isinstance(t, torch.Tensor):
            continue
        same = bitwise_equal(t.detach(), before[name])
        if not bool(same.all()):
            pos = [tuple(p) for p in (~same).nonzero()[:4].tolist()]
            raise CheckFailure(f"the function modified its input {name!r} in place at {pos}")


_Entry = tuple[dict[str, torch.Tensor], dict[str, EntryScale]]


def corpus_golden(
    corpus: Mapping[str, Any],
    call: Callable[[Mapping[str, Any]], Any],
    entry: Callable[[Mapping[str, Any], Any], _Entry],
    *,
    tolerance: Tolerance,
    version: int,
) -> Tolerant:
    """The golden over ``corpus``: ``call(kw)`` on each batch's keywords (a failure names
    the batch), then ``entry(kw, called)`` gives its tensors and their scales by key."""
    data: dict[str, dict[str, torch.Tensor]] = {}
    scales: dict[str, EntryScale] = {}
    for name, batch in corpus.items():
        kw = batch.as_kwargs()
        with on_canonical_batch(name):
            called = call(kw)
        data[name], own = entry(kw, called)
        scales.update({f"{name}/{key}": scale for key, scale in own.items()})
    return Tolerant(data, tolerance=tolerance, scales=scales, corpus=version)
