"""Rollout-IS keep/drop decisions at rounding distance of their band: the loss jumps
there, so value/gradient comparisons do not judge such a batch at that precision — and a
wrong band is still caught where the precision can tell."""

from __future__ import annotations

import math

import torch

from polgrad_reference import ALGORITHMS, policy_loss
from pytest_polgrad import ConformanceError, assert_conforms
from pytest_polgrad.core.corpus import canonical_corpus
from pytest_polgrad.core.tolerance import Tolerance
from pytest_polgrad.kinds.policy_loss.oracle import Oracle

GEO = ALGORITHMS["grpo_geo_rs"].loss


def _row(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    # clip-boundaries row 2, five tokens: the mean log rho is 0 in exact arithmetic and
    # -0.0016 after bfloat16 rounding, against a band of +-0.001.
    batch = canonical_corpus(dtype=dtype)["clip-boundaries"]
    return {k: v[2:3, :5] if v.dim() == 2 else v[2:3] for k, v in batch.items()}


def test_a_decision_within_rounding_of_the_band_is_undecided_in_bfloat16_only() -> None:
    for dtype, expected in ((torch.bfloat16, True), (torch.float64, False)):
        eps, native = Tolerance(dtype).kink_band
        result = Oracle(GEO)(_row(dtype), kink_eps=eps, grad=False, native_kinks=native)
        assert result.undecided is expected, dtype


def test_truncation_is_never_undecided() -> None:
    eps, native = Tolerance(torch.bfloat16).kink_band
    tis = ALGORITHMS["grpo_tis"].loss.replace(kl=None)
    assert not Oracle(tis)(_row(torch.bfloat16), kink_eps=eps, native_kinks=native).undecided


def _geo(low: float, high: float):  # type: ignore[no-untyped-def]
    cfg = GEO.replace(is_correction=GEO.is_correction.replace(low=low, high=high))  # type: ignore[union-attr]

    def loss(logprobs, old_logprobs, advantages, response_mask, rollout_logprobs):  # type: ignore[no-untyped-def]
        return policy_loss(
            cfg,
            logprobs=logprobs,
            old_logprobs=old_logprobs,
            advantages=advantages,
            response_mask=response_mask,
            rollout_logprobs=rollout_logprobs,
        ).loss

    return loss


def test_a_correct_band_passes_in_bfloat16() -> None:
    assert GEO.is_correction is not None
    right = _geo(GEO.is_correction.low or 0.0, GEO.is_correction.high or 1.0)
    assert assert_conforms(right, "grpo_geo_rs", max_examples=5, dtype="bfloat16").ok


def test_a_wrong_band_is_caught_in_float64() -> None:
    wrong = _geo(0.9, 1.1)  # verl's band read as a 10% tolerance
    try:
        assert_conforms(wrong, "grpo_geo_rs", max_examples=5)
    except ConformanceError as exc:
        failed = {r.check for r in exc.report.unexpected_failures}
        assert {"value", "gradient"} & failed
    else:
        raise AssertionError("a geometric rejection band of [0.9, 1.1] passed")


def _one_token_off(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """128 tokens, one with ``log rho = 0.375``: the row's mean 0.00293 is outside the band
    of +-0.001 (dropped in float64), while bfloat16 rounds ``exp(0.00293)`` and the bounds
    1/1.001 and 1/0.999 all to 1.0 (kept). Each token's own rounding is far smaller than
    that: the comparison's rounding decides (a false alarm of the default-size sweep at
    --polgrad-seed 24)."""
    old = torch.full((1, 128), -2.0, dtype=torch.float64)
    rollout = old.clone()
    rollout[0, 7] = -2.375
    batch = {
        "logprobs": old - 0.25,
        "old_logprobs": old,
        "advantages": torch.tensor([0.25], dtype=torch.float64),
        "response_mask": torch.ones(1, 128, dtype=torch.bool),
        "rollout_logprobs": rollout,
    }
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in batch.items()}


def test_the_comparisons_own_rounding_makes_a_decision_undecided_in_bfloat16_only() -> None:
    for dtype, expected in ((torch.bfloat16, True), (torch.float64, False)):
        eps, native = Tolerance(dtype).kink_band
        result = Oracle(GEO)(_one_token_off(dtype), kink_eps=eps, native_kinks=native)
        assert result.undecided is expected, dtype


def test_a_rows_summation_error_widens_its_band() -> None:
    """A row sum of n terms rounds by ``1 + log2 n`` roundings of ``sum |log rho|``: 1000
    tokens of +-0.5 with mean 0.0005, 1.5e-6 inside the band's edge, are undecided at
    float32 (the summation term is 1.3e-6 of a band of 2.1e-6 there), not in float64."""
    old = torch.full((1, 1000), -2.0, dtype=torch.float64)
    step = torch.tensor([0.5, -0.5], dtype=torch.float64).repeat(500)
    step[0] += 0.5  # the mean log rho is 0.0005
    batch = {
        "logprobs": old,
        "old_logprobs": old,
        "advantages": torch.tensor([1.0], dtype=torch.float64),
        "response_mask": torch.ones(1, 1000, dtype=torch.bool),
        "rollout_logprobs": old - step,
    }
    edge = math.exp(0.0005 + 1.5e-6)
    cfg = GEO.replace(is_correction=GEO.is_correction.replace(high=edge))  # type: ignore[union-attr]
    for dtype, expected in ((torch.float32, True), (torch.float64, False)):
        eps, native = Tolerance(dtype, strict=True).kink_band
        cast = {k: v.to(dtype) if v.is_floating_point() else v for k, v in batch.items()}
        assert Oracle(cfg)(cast, kink_eps=eps, native_kinks=native).undecided is expected, dtype
