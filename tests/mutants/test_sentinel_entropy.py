"""Issue 31's sentinel-1.0 entropy (TRL PR #6121): padding filled with the sentinel logprob
1.0 and counted in the entropy bonus makes it negative; the entropy kind fails ``value``
and its diagnosis names the sentinel. The same bonus selecting response positions first
passes."""

from __future__ import annotations

from typing import Any

import torch

from pytest_polgrad import assert_conforms
from pytest_polgrad.api import ConformanceError, ConformanceReport

T = torch.Tensor
INVALID_LOGPROB = 1.0


def _run(fn: Any, **options: Any) -> ConformanceReport:
    try:
        return assert_conforms(fn, "entropy", kind="entropy", max_examples=6, seed=3, **options)
    except ConformanceError as exc:
        return exc.report


def sentinel_bonus(logits: T, response_mask: T) -> T:
    """log-softmax with INVALID_LOGPROB at padding, every position in the sum."""
    logp = torch.log_softmax(logits.double(), dim=-1)
    logp = torch.where(response_mask[..., None], logp, INVALID_LOGPROB)
    return -(logp.exp() * logp).sum(dim=-1).sum() / response_mask.sum()


def selected_bonus(logits: T, response_mask: T) -> T:
    logp = torch.log_softmax(logits.double(), dim=-1)
    logp = torch.where(response_mask[..., None], logp, INVALID_LOGPROB)
    h = -(logp.exp() * logp).sum(dim=-1)
    return torch.where(response_mask, h, 0.0).sum() / response_mask.sum()


def test_the_sentinel_entropy_is_flagged_and_named() -> None:
    failed = {r.check: r for r in _run(sentinel_bonus).results if not r.passed}
    assert "value" in failed, sorted(failed)
    diagnosis = failed["value"].diagnosis
    assert "entropy is negative" in diagnosis and "sentinel logprob" in diagnosis, diagnosis
    assert not [r for r in _run(selected_bonus).results if not r.passed]
