"""The critic's training step (value loss) under splits, simulated: verl PR #6957's
per-micro-batch normalisation is flagged and named with its K-fold factor; the correct
step passes in float64, float32 and from bfloat16 inputs."""

from __future__ import annotations

import pytest
import torch

from pytest_polgrad.core.verdicts import CheckFailure
from pytest_polgrad.kinds.training_step.critic import check_critic_step, critic_batch
from pytest_polgrad.strategies import Split
from tests.kinds.training_step import distributed_steps as S

EQUAL = (4, 4, 4, 4)  # equal micro-batches: the bug is an exact K-fold factor
RAGGED = (1, 3, 6, 8)
SPLITS = [
    Split((((0,), (1,), (2,), (3,)),)),
    Split((((0, 1), (2, 3)),)),
    Split((((0,), (1,)), ((2,), (3,)))),
    Split((((0, 1, 2),), ((3,),))),
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("split", SPLITS, ids=lambda s: s.describe())
def test_the_correct_critic_step_passes(split: Split, dtype: torch.dtype) -> None:
    assert check_critic_step(S.critic_global, critic_batch(RAGGED, dtype=dtype), split) <= 1.0


def test_the_per_micro_batch_value_loss_is_k_fold_and_named() -> None:
    split = Split((((0,), (1,), (2,), (3,)),))
    with pytest.raises(CheckFailure) as info:
        check_critic_step(S.bug_critic_per_micro_batch, critic_batch(EQUAL), split)
    text = str(info.value)
    assert "the value term is mis-scaled" in text
    assert "4x the reference's: normalised per micro-batch; 4 micro-batches" in text, text


def test_with_uneven_micro_batches_it_is_named_as_non_uniform() -> None:
    with pytest.raises(CheckFailure, match="not a uniform multiple"):
        check_critic_step(S.bug_critic_per_micro_batch, critic_batch(RAGGED), SPLITS[1])


def test_one_micro_batch_cannot_show_the_bug() -> None:
    """No false alarm where the bug cannot show: one rank, one micro-batch."""
    whole = Split((((0, 1, 2, 3),),))
    assert check_critic_step(S.bug_critic_per_micro_batch, critic_batch(RAGGED), whole) <= 1.0
