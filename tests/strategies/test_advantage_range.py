"""The semantic domain reaches realistic advantages (issue 15): GRPO's largest advantage
for one success in a group of G is (G - 1) / sqrt(G), 3.75 at G = 16 and 7.9 at G = 64,
so a loss that clamps advantages is caught with default options."""

from __future__ import annotations

import math

import pytest
import torch

from polgrad_reference import get_algorithm, policy_loss
from pytest_polgrad import ConformanceError, assert_conforms

DAPO = get_algorithm("dapo").loss


def _clamped(bound: float | None):  # type: ignore[no-untyped-def]
    def loss(logprobs, old_logprobs, advantages, response_mask):  # type: ignore[no-untyped-def]
        adv = advantages if bound is None else advantages.clamp(-bound, bound)
        return policy_loss(
            DAPO,
            logprobs=logprobs,
            old_logprobs=old_logprobs,
            advantages=adv,
            response_mask=response_mask,
        ).loss

    return loss


def test_the_bound_quoted_is_grpo_s_extreme_advantage() -> None:
    assert (16 - 1) / math.sqrt(16) == 3.75
    assert round((64 - 1) / math.sqrt(64), 2) == 7.88


@pytest.mark.parametrize(("shape", "bound"), [("sequence", 3.0), ("token", 4.5)])
def test_a_loss_clamping_advantages_is_caught_with_default_options(
    shape: str, bound: float
) -> None:
    with pytest.raises(ConformanceError) as info:
        assert_conforms(_clamped(bound), "dapo", advantages=shape, checks=("value", "gradient"))
    failed = {r.check for r in info.value.report.unexpected_failures}
    assert failed & {"value", "gradient"}


@pytest.mark.parametrize("shape", ["sequence", "token"])
def test_the_unclamped_loss_passes(shape: str) -> None:
    report = assert_conforms(_clamped(None), "dapo", advantages=shape, checks=("value", "gradient"))
    assert report.ok


def test_drawn_advantages_reach_eight() -> None:
    from hypothesis import given, settings

    from pytest_polgrad.strategies import batches

    seen: list[float] = []

    @settings(max_examples=200, database=None, derandomize=True)
    @given(batches(max_batch=8, max_length=16))
    def collect(batch):  # type: ignore[no-untyped-def]
        seen.append(float(batch.advantages.abs().max()))

    collect()
    assert max(seen) > 7.9
    assert torch.tensor(seen).median() < 3.0  # most batches stay plain
