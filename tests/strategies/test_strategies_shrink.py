"""Shrinking: planted failures shrink to small, readable batches."""

from __future__ import annotations

from collections.abc import Callable

import torch
from hypothesis import find, settings

from pytest_polgrad.strategies import Batch, batches

SHRINK = settings(max_examples=100, database=None, derandomize=True)  # same result every run


def shrink(condition: Callable[[Batch], bool], **kwargs: object) -> Batch:
    return find(batches(**kwargs), condition, settings=SHRINK)  # type: ignore[arg-type]


def _longest_literal(b: Batch) -> int:
    """Characters of the longest number in the batch's snippet."""
    words = b.to_snippet().replace("[", " ").replace("]", " ").replace(",", " ").split()
    numbers = [w for w in words if w.lstrip("-")[:1].isdigit()]
    return max((len(w) for w in numbers), default=0)


def test_row_of_length_one_shrinks_to_tiny_batch() -> None:
    found = shrink(lambda b: 1 in b.lengths)
    assert found.batch_size <= 2 and found.width <= 2
    assert (found.batch_size, found.width) == (1, 1)


def test_ratio_past_clip_with_positive_advantage_shrinks_to_one_short_simple_row() -> None:
    def planted(b: Batch) -> bool:
        r = torch.exp(b.logprobs.double() - b.old_logprobs.double())
        adv = b.advantages.double()
        adv = adv if adv.dim() == 2 else adv[:, None].expand(r.shape)
        return bool(((r > 1.28) & (adv > 0) & b.response_mask).any())

    found = shrink(planted)
    assert found.batch_size == 1 and found.width <= 8
    assert found.ref_logprobs is None and found.rollout_logprobs is None and found.rewards is None
    assert _longest_literal(found) <= 14, found.to_snippet()


def test_long_rows_shrink_to_the_smallest_long_row() -> None:
    found = shrink(lambda b: b.width > 64)
    assert found.batch_size == 1
    assert found.width == 65 and found.lengths == (65,)


def test_ragged_failure_shrinks_to_two_rows() -> None:
    found = shrink(lambda b: len(set(b.lengths)) > 1)
    assert found.batch_size == 2
    assert sorted(found.lengths) == [1, 2]


def test_values_shrink_to_simple_numbers() -> None:
    found = shrink(lambda b: b.width >= 3)
    m = found.response_mask
    assert bool((found.logprobs[m] == -1.0).all()) and bool((found.old_logprobs[m] == -1.0).all())
    assert set(found.logprobs[~m].tolist()) <= {-3.0}  # padding: simple garbage
    assert set(found.advantages.tolist()) <= {0.0, 1.0}
