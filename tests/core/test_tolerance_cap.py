"""The ``tolerance=`` cap (issue 28 item 2): at the largest multiplier the marker accepts a
check can still tell a loss from a multiple of it. A loss 2x the reference fails ``value``
and ``gradient`` at the cap, and one 1.5x it fails ``value``, in every input dtype (half
precision, whose result is rounded to bfloat16 or float16 even with ``strict``, is capped
at the default, 1)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from pytest_polgrad.core.engine import build_context, run_check
from pytest_polgrad.core.options import (
    MAX_HALF_TOLERANCE,
    MAX_TOLERANCE,
    MarkerError,
    parse_marker,
)
from tests.helpers.sample_losses import dapo

Tensor = torch.Tensor

# (dtype, strict, the cap that applies)
_CAPS = [
    ("float64", False, MAX_TOLERANCE),
    ("float32", False, MAX_TOLERANCE),
    ("bfloat16", True, MAX_HALF_TOLERANCE),
    ("bfloat16", False, MAX_HALF_TOLERANCE),
    ("float16", False, MAX_HALF_TOLERANCE),
]


def _times(k: float) -> Any:
    def scaled(
        logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
    ) -> Tensor:
        return dapo(logprobs, old_logprobs, advantages, response_mask) * k

    return scaled


def _passes(k: float, check: str, dtype: str, strict: bool, tolerance: float) -> bool:
    opts = parse_marker(("dapo",), {"dtype": dtype, "strict": strict, "tolerance": tolerance})
    result = run_check(
        build_context(_times(k), opts), check, max_examples=40, base_seed=0, diagnose=False
    )
    return bool(result.passed)


@pytest.mark.parametrize(("dtype", "strict", "cap"), _CAPS)
@pytest.mark.parametrize(("k", "check"), [(2.0, "value"), (2.0, "gradient"), (1.5, "value")])
def test_a_multiple_of_the_loss_fails_at_the_cap(
    dtype: str, strict: bool, cap: float, k: float, check: str
) -> None:
    assert not _passes(k, check, dtype, strict, cap)


@pytest.mark.parametrize(("dtype", "strict", "cap"), _CAPS)
def test_the_correct_loss_passes_at_the_cap_and_past_it_is_refused(
    dtype: str, strict: bool, cap: float
) -> None:
    assert _passes(1.0, "value", dtype, strict, cap)
    with pytest.raises(MarkerError, match=r"tolerance must be a multiplier in \(0, "):
        parse_marker(("dapo",), {"dtype": dtype, "strict": strict, "tolerance": cap * 1.01})
