"""reward_batches / value_batches / logit_batches: what they reach, what they never
produce, argument validation, determinism and shrinking (docs/strategies.md, "Rewards,
critic values and logits")."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import find, given, settings
from hypothesis.errors import InvalidArgument

from pytest_polgrad.strategies import (
    LogitBatch,
    RewardBatch,
    ValueBatch,
    logit_batches,
    reward_batches,
    value_batches,
)

NOT_A_BOOL: Any = "yes"
FIND = settings(max_examples=300, database=None, derandomize=True)


def _find(strategy: Any, condition: Callable[[Any], bool]) -> Any:
    return find(strategy, condition, settings=FIND)


@pytest.mark.parametrize(
    ("what", "condition"),
    [
        ("a singleton group", lambda b: 1 in b.group_sizes),
        ("a group of 16", lambda b: 16 in b.group_sizes),
        ("tied rewards in a group of 3+", lambda b: "equal" in b.kinds and max(b.group_sizes) >= 3),
        ("one success", lambda b: "one-hot" in b.kinds),
        ("continuous rewards", lambda b: "continuous" in b.kinds),
        ("interleaved groups", lambda b: len(b.group_sizes) > 1 and not _contiguous(b)),
        ("padding", lambda b: not bool(b.response_mask.all())),
        ("a done inside a row", lambda b: b.dones is not None and bool(b.dones.any())),
    ],
)
def test_reward_batches_reach(what: str, condition: Callable[[RewardBatch], bool]) -> None:
    found = _find(reward_batches(values=True, dones=True), condition)
    assert condition(found), what


def _contiguous(b: RewardBatch) -> bool:
    ids = b.group_ids.tolist()
    changes = sum(1 for x, y in itertools.pairwise(ids) if x != y)
    return changes == len(b.group_sizes) - 1


@settings(max_examples=60, database=None, derandomize=True)
@given(reward_batches(token_rewards=True, values=True, dones=True, equal_sizes=True))
def test_reward_batches_are_valid(b: RewardBatch) -> None:
    mask = b.response_mask
    assert b.rewards.shape == b.group_ids.shape == (mask.shape[0],)
    assert b.group_ids.dtype == torch.int64 and bool(mask.any(dim=1).all())
    assert len(set(b.group_sizes)) == 1  # equal sizes
    assert b.token_rewards is not None and b.values is not None and b.dones is not None
    assert bool(torch.isfinite(b.rewards).all())
    assert bool(torch.isfinite(b.values[mask]).all())
    assert not bool((b.dones & ~mask).any())


@settings(max_examples=60, database=None, derandomize=True)
@given(value_batches(clip_range=0.25))
def test_value_batches_keep_away_from_the_clip_boundary(b: ValueBatch) -> None:
    step = (b.values - b.old_values)[b.response_mask].abs()
    inside, outside = step < 0.125 + 1e-12, step > 1.5 * 0.25 - 1e-12
    assert bool((inside | outside).all())


@settings(max_examples=60, database=None, derandomize=True)
@given(logit_batches(patterns=("large",)))
def test_large_logits_are_offset_by_1e4(b: LogitBatch) -> None:
    z = b.logits[b.response_mask]
    assert bool((z.abs().amax(dim=-1) > 9e3).all())


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: reward_batches(min_groups=0), "min_groups must be a positive size"),
        (lambda: reward_batches(min_groups=3, max_groups=2), "min_groups=3 must not exceed"),
        (lambda: reward_batches(max_group_size=0), "max_group_size must be a positive"),
        (lambda: reward_batches(kinds=("binary", "gaussian")), "kinds must be one of"),
        (lambda: reward_batches(kinds=()), "kinds must be a non-empty tuple"),
        (lambda: reward_batches(dtype=torch.int64), "dtype must be one of"),
        (lambda: reward_batches(shuffle=NOT_A_BOOL), "shuffle must be True, False or None"),
        (lambda: reward_batches(domain="wild"), "domain must be one of"),
        (lambda: value_batches(clip_range=0.0), r"clip_range must lie in \(0.0"),
        (lambda: logit_batches(min_vocab=5, max_vocab=2), "min_vocab=5 must not exceed"),
        (lambda: logit_batches(patterns=("spiky",)), "patterns must be one of"),
    ],
)
def test_bad_arguments_fail_at_definition(make: Callable[[], object], words: str) -> None:
    with pytest.raises(InvalidArgument, match=words):
        make()


def _draw(seed_value: int) -> list[str]:
    from hypothesis import seed

    out: list[str] = []

    @settings(max_examples=5, database=None)
    @seed(seed_value)
    @given(reward_batches(values=True))
    def collect(b: RewardBatch) -> None:
        out.append(b.to_snippet())

    collect()
    return out


def test_same_seed_same_batch() -> None:
    assert _draw(1234) == _draw(1234)


def test_shrinks_to_one_group_of_one_row() -> None:
    found = _find(reward_batches(), lambda b: True)
    assert found.group_sizes == [1] and found.kinds == ("binary",)
    assert "rewards = torch.tensor(" in found.to_snippet()
