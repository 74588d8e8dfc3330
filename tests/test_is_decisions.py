"""Rollout-IS keep/drop decisions at rounding distance of their band: the loss jumps
there, so value/gradient comparisons do not judge such a batch at that precision — and a
wrong band is still caught where the precision can tell."""

from __future__ import annotations

import torch

from polgrad_reference import ALGORITHMS, policy_loss
from pytest_polgrad import ConformanceError, assert_conforms
from pytest_polgrad.corpus import canonical_corpus
from pytest_polgrad.oracle import Oracle
from pytest_polgrad.tolerance import Tolerance

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
