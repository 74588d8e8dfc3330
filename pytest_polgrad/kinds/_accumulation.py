"""Per-row weights of the ways a trainer may scale micro-batch losses (diagnosis candidates).

Every policy loss of the registry aggregates ``sum_{b,t} w[b, t] l[b, t]`` with a weight
constant along a row, so one optimizer step under a split, after autograd accumulation and
an all-reduce MEAN over ``W`` ranks, is ``sum_b c_b sum_t l[b, t]`` for one coefficient
``c_b`` per row. :func:`schemes` lists the coefficients of the correct scaling (the
full-batch aggregation over the step) and of the wrong ones seen in frameworks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from polgrad_reference import Aggregation
from pytest_polgrad.strategies._splits import Split, StepInfo

__all__ = ["RowFacts", "Scheme", "row_facts", "schemes"]


@dataclasses.dataclass(frozen=True)
class RowFacts:
    """Per-row counts of one split, float64 ``[B]`` each (see :class:`StepInfo`)."""

    length: torch.Tensor
    mb_tokens: torch.Tensor
    mb_rows: torch.Tensor
    mb_width: torch.Tensor
    rank_tokens: torch.Tensor
    rank_rows: torch.Tensor
    gen_tokens: torch.Tensor
    tokens: float
    rows: float
    width: float
    world: float
    accum: float
    steps_per_generation: float


def row_facts(mask: torch.Tensor, split: Split) -> RowFacts:
    """Gather the counts each row's micro-batch, rank and generation batch hold."""
    b = mask.shape[0]
    cols = torch.arange(mask.shape[1])
    extent = torch.where(mask, cols + 1, 0).amax(dim=1)
    fields: dict[str, torch.Tensor] = {
        k: torch.zeros(b, dtype=torch.float64)
        for k in ("mb_tokens", "mb_rows", "mb_width", "rank_tokens", "rank_rows", "gen_tokens")
    }
    infos: list[StepInfo] = [i for rank in split.infos(mask) for i in rank]
    for info in infos:
        rows = list(info.rows)
        if not rows:  # an empty micro-batch: no row to weigh
            continue
        fields["mb_tokens"][rows] = float(info.micro_batch_tokens)
        fields["mb_rows"][rows] = float(info.micro_batch_rows)
        fields["mb_width"][rows] = float(extent[rows].max())
        fields["rank_tokens"][rows] = float(info.rank_tokens)
        fields["rank_rows"][rows] = float(info.rank_rows)
        fields["gen_tokens"][rows] = float(info.generation_tokens)
    s = split.steps_per_generation
    assert s is not None
    return RowFacts(
        length=mask.sum(dim=1).to(torch.float64),
        tokens=float(mask.sum()),
        rows=float(b),
        width=float(mask.shape[1]),
        world=float(split.world_size),
        accum=float(split.gradient_accumulation_steps),
        steps_per_generation=float(s),
        **fields,
    )


@dataclasses.dataclass(frozen=True)
class Scheme:
    """A way of scaling micro-batch losses: ``key`` for tables, ``text`` for reports."""

    key: str
    text: str
    weights: Callable[[RowFacts], torch.Tensor]
    correct: bool = False


Count = float | torch.Tensor


def _base(
    mode: Aggregation, length: torch.Tensor, tokens: Count, rows: Count, budget: Count | None
) -> torch.Tensor:
    """The per-row weight of ``mode`` when the normalising scope holds ``tokens``/``rows``."""
    one = torch.ones_like(length)
    if mode is Aggregation.TOKEN_MEAN:
        return one / tokens
    if mode is Aggregation.SEQ_MEAN_TOKEN_MEAN:
        return one / (length * rows)
    if mode is Aggregation.SEQ_MEAN_TOKEN_SUM:
        return one / rows
    if mode is Aggregation.TOKEN_SUM:
        return one
    assert budget is not None
    return one / (rows * budget)


def _mode_name(mode: Aggregation, budget: int | None, padded: str = "") -> str:
    if mode is not Aggregation.TOKEN_SUM_NORM:
        return str(mode.value)
    return f"token-sum-norm ({padded or f'budget {budget}'})"


def schemes(mode: Aggregation, budget: int | None) -> list[Scheme]:
    """The correct scheme for ``mode`` first, then every candidate (all modes x scopes)."""
    out: list[Scheme] = []
    modes = [mode, *(m for m in Aggregation if m is not mode)]
    for m in modes:
        budgets: list[tuple[int | None, str]] = [(None, "")]
        if m is Aggregation.TOKEN_SUM_NORM:
            budgets = [(budget, "")] if budget else []
            budgets.append((None, "budget = the batch's padded width"))
        for bud, padded in budgets:
            name = _mode_name(m, bud, padded)
            out += _scopes(m, bud, padded, name, correct=m is mode and bud == budget)
    out += _token_count_schemes()
    return out


def _scopes(
    m: Aggregation, bud: int | None, padded: str, name: str, *, correct: bool
) -> list[Scheme]:
    def full_budget(f: RowFacts) -> Count | None:
        return f.width if padded else (None if bud is None else float(bud))

    def mb_budget(f: RowFacts) -> Count | None:
        return f.mb_width if padded else (None if bud is None else float(bud))

    def step(f: RowFacts) -> torch.Tensor:
        return _base(m, f.length, f.tokens, f.rows, full_budget(f))

    def mb(f: RowFacts) -> torch.Tensor:
        return _base(m, f.length, f.mb_tokens, f.mb_rows, mb_budget(f))

    def rank(f: RowFacts) -> torch.Tensor:
        return _base(m, f.length, f.rank_tokens, f.rank_rows, full_budget(f))

    mb_text = (
        "a plain torch.mean over each micro-batch's padded [rows, T] entries (it bypasses "
        "the aggregation), divided by the accumulation steps"
        if m is Aggregation.TOKEN_SUM_NORM and padded
        else f"{name} of each micro-batch on its own, divided by the accumulation steps"
        + (" (the mean of micro-batch means)" if m is Aggregation.TOKEN_MEAN else "")
    )
    return [
        Scheme(f"{name}/step", f"{name} over the whole optimizer step", step, correct=correct),
        Scheme(f"{name}/micro-batch-mean", mb_text, lambda f: mb(f) / (f.accum * f.world)),
        Scheme(
            f"{name}/micro-batch-sum",
            f"{name} of each micro-batch on its own, summed without dividing by the "
            "accumulation steps",
            lambda f: mb(f) / f.world,
        ),
        Scheme(
            f"{name}/rank",
            f"{name} normalised per rank by the rank's own counts (no all-reduce of the "
            "token count), then the all-reduce mean",
            lambda f: rank(f) / f.world,
        ),
        Scheme(
            f"{name}/rank-times-world",
            f"{name} normalised per rank by the rank's own counts, times the world size",
            rank,
        ),
        Scheme(
            f"{name}/step-no-world",
            f"{name} over the whole step, without the world-size factor (the all-reduce "
            "mean then divides by the world size)",
            lambda f: step(f) / f.world,
        ),
        Scheme(
            f"{name}/step-over-accum",
            f"{name} over the whole step and divided by the accumulation steps as well "
            "(divided by the accumulation steps twice)",
            lambda f: step(f) / f.accum,
        ),
    ]


def _token_count_schemes() -> list[Scheme]:
    return [
        Scheme(
            "token-mean/sample-weighted",
            "token-mean of each micro-batch scaled by its share of the rank's samples "
            "(weighted by sample counts, not token counts)",
            lambda f: f.mb_rows / (f.mb_tokens * f.rank_rows * f.world),
        ),
        Scheme(
            "token-mean/generation",
            "token-mean over the generation batch's token count (num_items_in_batch of "
            "the whole generation batch, not of the optimizer step)",
            lambda f: 1.0 / f.gen_tokens,
        ),
        Scheme(
            "token-mean/generation-rescaled",
            "token-mean over the generation batch's token count rescaled by "
            "gradient_accumulation_steps / steps_per_generation (exact only when every "
            "optimizer step of a generation batch holds as many tokens)",
            lambda f: f.steps_per_generation / (f.accum * f.gen_tokens),
        ),
    ]
