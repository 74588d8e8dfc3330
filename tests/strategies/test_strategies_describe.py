"""``Batch.describe()``: the one line reports print for a batch (the ``Inputs`` contract)."""

from __future__ import annotations

import torch

from pytest_polgrad.strategies import Batch


def test_describe_names_sizes_and_lengths_in_every_layout() -> None:
    mask = torch.tensor([[True, False, False], [True, True, True], [True, True, False]])
    lp = torch.zeros(3, 3, dtype=torch.float64)
    batch = Batch(logprobs=lp, old_logprobs=lp, advantages=torch.ones(3), response_mask=mask)
    assert batch.describe() == "B=3, T=3, response lengths [1, 3, 2]"
    assert batch.to_layout("left").describe() == batch.describe()
    assert batch.to_layout("packed").describe() == "B=3, T=3, response lengths [1, 3, 2]"
