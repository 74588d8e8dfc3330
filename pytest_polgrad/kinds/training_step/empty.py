"""The ``empty-micro-batches`` check of the training step (opt-in: ``checks=``).

Data loaders that drop, filter or pack samples hand a trainer micro-batches without
response tokens, and whole ranks without any (NeMo-RL #212: the loss divided by such a
micro-batch's token count, 0/0). The rank still runs its forward and backward, so the
all-reduce completes. The correct step is defined by the full-batch oracle, unchanged: an
empty micro-batch adds nothing to the step's loss or gradient, so the step's token-mean
still divides the step's summed token losses by the GLOBAL token count (DAPO
arXiv:2503.14476 Eq. 8) and the accumulated result equals the full-batch reference's.

An empty micro-batch reaches the function as tensors of zero rows (``[0, 0]`` for
``[B, T]`` inputs, ``[0]`` for ``[B]``) with ``micro_batch_tokens == 0`` (and
``rank_tokens == 0`` on a rank without rows); ``logprobs`` still requires grad and the
returned loss must depend on it (a rank must take part in the backward's reduction).
Opt-in, because a trainer whose loader never makes one need not handle it: a step that
calls code refusing an empty batch would fail here without a bug.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from hypothesis import strategies as st

from pytest_polgrad.core.corpus import canonical_corpus
from pytest_polgrad.core.kinds import KindCheck
from pytest_polgrad.core.options import ConformanceOptions
from pytest_polgrad.kinds.training_step import shared as _shared
from pytest_polgrad.kinds.training_step.execute import fold
from pytest_polgrad.strategies._sample import composite
from pytest_polgrad.strategies._splits import Split, splits

__all__ = ["EMPTY", "check_of", "corpus", "opted_in", "strategy"]

EMPTY = "empty-micro-batches"

Make = Callable[..., Any]
"""The kind's step type: ``make(batch, split, label=...)``."""


def check_of(check_split: Callable[[Any, Mapping[str, Any]], float]) -> KindCheck:
    """The check: the kind's split check (accumulated gradient and loss equal the
    full-batch reference's) on splits with empty micro-batches."""
    return KindCheck(
        EMPTY,
        "micro-batches and ranks without response tokens contribute nothing: the "
        "accumulated gradient and loss equal the full-batch reference's (opt-in: checks=)",
        check_split,
        domain=EMPTY,
    )


def opted_in(options: ConformanceOptions) -> bool:
    """Whether the marker's ``checks=`` names the check."""
    return options.checks is not None and EMPTY in options.checks


def corpus(ctx: Any, make: Make) -> dict[str, Any]:
    """The canonical ragged rows (response lengths 1, 3, 6, 8): a rank that holds no rows
    at all, empty micro-batches on two ranks (in the middle, and last), one on one rank.
    The multi-rank ones first: under ``distributed=`` they run on the process group."""
    ragged = canonical_corpus(dtype=ctx.tolerance.input_dtype, advantages=ctx.options.advantages)[
        "ragged"
    ]
    cases = {
        "empty-rank": Split((((0,), (1, 2, 3)), ((), ()))),
        "empty-micro-batches": Split((((0,), (), (1,)), ((2,), (3,), ()))),
        "empty-micro-batch": Split((((0, 1), (), (2, 3)),)),
    }
    return {name: make(ragged, split, label=name) for name, split in cases.items()}


def strategy(ctx: Any, make: Make) -> st.SearchStrategy[Any]:
    """Drawn steps (the kind's batches) under ``splits(..., empty=True)``, folded onto the
    process group's size under ``distributed=``."""
    drawn = _shared.drawn_batches(ctx, max(ctx.options.max_batch, 1))

    def _steps(draw: st.DrawFn) -> Any:
        tensors: dict[str, torch.Tensor] = draw(drawn).as_kwargs()
        lengths = tensors["response_mask"].sum(dim=1).tolist()
        if ctx.wrap is None:
            return make(tensors, draw(splits(lengths, empty=True)))
        split = draw(splits(lengths, empty=True, max_ranks=ctx.world))
        return make(tensors, fold(split, ctx.world))

    return composite(_steps)
