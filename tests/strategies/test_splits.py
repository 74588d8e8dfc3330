"""Split strategies: every shape issue 9 names is reached, splits are valid, and the
per-micro-batch counts (StepInfo) are what a trainer would compute."""

from __future__ import annotations

import pytest
import torch
from hypothesis import find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from pytest_polgrad.strategies import SPLIT_FAMILIES, Split, splits

LENGTHS = (1, 3, 6, 8, 2, 5)
QUICK = settings(max_examples=40, derandomize=True, database=None)


def _mask(lengths) -> torch.Tensor:
    return torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]


def _tokens(split: Split, lengths) -> list[int]:
    return [sum(lengths[i] for mb in rank for i in mb) for rank in split.ranks]


def _find(condition, family=None, lengths=LENGTHS) -> Split:
    return find(splits(lengths, family=family), condition,
                settings=settings(max_examples=400, derandomize=True, database=None))  # fmt: skip


@pytest.mark.parametrize(
    ("family", "what", "condition"),
    [
        ("micro-batches", "even sizes", lambda s: len({len(mb) for mb in s.ranks[0]}) == 1),
        ("micro-batches", "uneven sizes", lambda s: len({len(mb) for mb in s.ranks[0]}) > 1),
        (
            "micro-batches",
            "one row per micro-batch",
            lambda s: all(len(mb) == 1 for mb in s.ranks[0]),
        ),
        (
            "micro-batches",
            "only short rows next to only long rows",
            lambda s: (
                max(LENGTHS[i] for i in s.ranks[0][0]) < min(LENGTHS[i] for i in s.ranks[0][-1])
            ),
        ),
        (
            "data-parallel",
            "ranks with different token counts",
            lambda s: len(set(_tokens(s, LENGTHS))) == s.world_size,
        ),
        (
            "generation-steps",
            "steps_per_generation > accumulation",
            lambda s: s.steps_per_generation > s.gradient_accumulation_steps,
        ),
        (
            "generation-steps",
            "steps_per_generation < accumulation",
            lambda s: s.steps_per_generation < s.gradient_accumulation_steps,
        ),
    ],
)
def test_every_named_shape_is_reached(family, what, condition) -> None:
    assert condition(_find(condition, family)), what


@QUICK
@given(split=splits(LENGTHS))
def test_drawn_splits_are_valid_and_in_their_family(split: Split) -> None:
    rows = sorted(i for rank in split.ranks for mb in rank for i in mb)
    assert rows == list(range(len(LENGTHS)))
    assert split.family in SPLIT_FAMILIES
    assert len({len(rank) for rank in split.ranks}) == 1


@pytest.mark.parametrize("family", SPLIT_FAMILIES)
def test_family_is_respected(family) -> None:
    @QUICK
    @given(split=splits(LENGTHS, family=family))
    def prop(split: Split) -> None:
        assert split.family == family

    prop()


def test_step_infos_count_tokens_and_rows_like_a_trainer() -> None:
    lengths = (1, 3, 6, 8)
    split = Split((((0,), (1,)), ((2,), (3,))), steps_per_generation=1)
    infos = split.infos(_mask(lengths))
    first, last = infos[0][0], infos[1][1]
    assert (first.rank, first.micro_batch, first.world_size) == (0, 0, 2)
    assert (first.micro_batch_tokens, first.rank_tokens, first.global_tokens) == (1, 4, 18)
    assert (last.micro_batch_tokens, last.rank_tokens, last.rank_rows) == (8, 14, 2)
    # steps_per_generation=1: each micro-step (on both ranks) is its own generation batch
    assert (first.generation_tokens, last.generation_tokens) == (1 + 6, 3 + 8)
    later = Split((((0, 1), (2, 3)),), steps_per_generation=4, outside_tokens=11, outside_rows=4)
    info = later.infos(_mask(lengths))[0][1]
    assert (info.generation_tokens, info.generation_rows, info.global_tokens) == (29, 8, 18)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"ranks": ((((0,), (1,)), ((2,),)))}, "same number of micro-batches"),
        ({"ranks": (((), ()),)}, "at least one row; every micro-batch is empty"),
        ({"ranks": (((0, 2),),)}, "exactly once"),
        ({"ranks": (((0,), (1,), (2,)),), "steps_per_generation": 2}, "divisor or multiple"),
        ({"ranks": (((0,),),), "outside_tokens": 3}, "steps_per_generation > accumulation"),
    ],
)
def test_invalid_splits_are_named_errors(kwargs, words) -> None:
    with pytest.raises(ValueError, match=words):
        Split(**kwargs)


def test_strategy_arguments_are_validated() -> None:
    with pytest.raises(InvalidArgument, match="family"):
        splits((1, 2), family="pipeline").example()
    with pytest.raises(InvalidArgument, match="needs at least 2 rows"):
        splits((1,), family="data-parallel").example()
    with pytest.raises(ValueError, match="B = 2 rows"):
        Split((((0,), (1,)),)).infos(_mask((1, 2, 3)))


def test_empty_micro_batches_and_ranks_are_splits_with_zero_counts() -> None:
    """NeMo-RL #212: micro-batches (and whole ranks) without response tokens exist."""
    split = Split((((0,), (1, 2)), ((), ())))
    infos = split.infos(_mask((1, 2, 3)))
    assert [(i.micro_batch_tokens, i.rank_tokens, i.global_tokens) for i in infos[1]] == [
        (0, 0, 6),
        (0, 0, 6),
    ]
    assert "rank 1 [(empty) | (empty)]" in split.describe()
    assert Split(eval(split.to_python().removeprefix("Split(ranks=")[:-1])) == split


@QUICK
@given(data=st.data())
def test_empty_true_draws_empty_micro_batches_covering_every_row(data) -> None:
    lengths = data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=7))
    family = data.draw(st.sampled_from([None, "micro-batches", "data-parallel"]))
    split = data.draw(splits(lengths, family=family, empty=True))
    mbs = [mb for rank in split.ranks for mb in rank]
    assert any(not mb for mb in mbs), split
    assert sorted(i for mb in mbs for i in mb) == list(range(len(lengths)))
    assert split.family in ("micro-batches", "data-parallel")


def test_empty_true_is_validated() -> None:
    with pytest.raises(InvalidArgument, match="empty must be a bool"):
        splits((1, 2), empty=1).example()  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="not family='generation-steps'"):
        splits((1, 2), family="generation-steps", empty=True).example()
