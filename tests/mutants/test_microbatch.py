"""Micro-batch accumulation with token-sum, in the reference and in the kit's check.

Written for a surviving mutant of the mutation audit (issue 13): replacing the sum scaling
of token-sum by mean scaling (in ``microbatch_token_weights`` or in the ``micro-batch``
check) survived because no test used token-sum. Token-sum is the one aggregation whose
micro-batch losses are summed unscaled; every other decomposable mode divides by the
number of micro-batches.
"""

from __future__ import annotations

import pytest
import torch

from polgrad_reference import microbatch_token_weights, token_weights
from pytest_polgrad import assert_conforms

MASK = torch.tensor(
    [[True, True, False], [True, False, False], [True, True, True], [True, True, False]]
)


@pytest.mark.parametrize("size", [1, 2, 3])
def test_token_sum_with_sum_scaling_reproduces_the_full_batch_weights(size: int) -> None:
    full = token_weights(MASK, "token-sum")
    summed = microbatch_token_weights(MASK, "token-sum", micro_batch_size=size, scaling="sum")
    assert torch.equal(summed, full)
    meaned = microbatch_token_weights(MASK, "token-sum", micro_batch_size=size, scaling="mean")
    chunks = -(-MASK.shape[0] // size)
    assert torch.equal(meaned, full / chunks)  # the mean divides by the number of chunks


def test_seq_mean_with_mean_scaling_over_equal_chunks_reproduces_the_full_batch() -> None:
    full = token_weights(MASK, "seq-mean-token-mean")
    got = microbatch_token_weights(MASK, "seq-mean-token-mean", micro_batch_size=2)
    assert torch.allclose(got, full, rtol=1e-15, atol=0)
    summed = microbatch_token_weights(
        MASK, "seq-mean-token-mean", micro_batch_size=2, scaling="sum"
    )
    assert torch.allclose(summed, 2 * full, rtol=1e-15, atol=0)


def _per_token(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor
) -> torch.Tensor:
    ratio = torch.exp(logprobs - old_logprobs)
    clipped = torch.clamp(ratio, 0.8, 1.28)
    return torch.maximum(-advantages[:, None] * ratio, -advantages[:, None] * clipped)


def token_sum_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
) -> torch.Tensor:
    """A correct token-sum DAPO-clip loss: the sum over every response token."""
    return (_per_token(logprobs, old_logprobs, advantages) * response_mask).sum()


def seq_mean_token_sum_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
) -> torch.Tensor:
    """Divides token-sum by the number of rows: what mean scaling would accept."""
    return token_sum_loss(logprobs, old_logprobs, advantages, response_mask) / len(advantages)


def test_micro_batch_check_accepts_a_correct_token_sum_loss() -> None:
    """Under mean scaling the check would expect 1/B of this loss and fail it."""
    report = assert_conforms(
        token_sum_loss,
        "dapo",
        aggregation="token-sum",
        checks=("micro-batch", "value"),
        max_examples=10,
    )
    assert report.ok
    (mb,) = [r for r in report.results if r.check == "micro-batch"]
    assert mb.passed


def test_micro_batch_check_rejects_a_loss_that_decomposes_with_mean_scaling() -> None:
    """``seq_mean_token_sum_loss`` accumulates exactly under mean scaling (full = mean of
    the one-row losses), so only the sum scaling of token-sum tells it from token-sum."""
    with pytest.raises(AssertionError) as info:
        assert_conforms(
            seq_mean_token_sum_loss,
            "dapo",
            aggregation="token-sum",
            checks=("micro-batch",),
            max_examples=10,
        )
    assert "micro-batch" in str(info.value)
