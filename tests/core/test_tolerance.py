"""The tolerance model: precision-aware, cancellation-proof (docs/tolerance.md)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from pytest_polgrad.core.engine import build_context, run_check
from pytest_polgrad.core.options import parse_marker
from pytest_polgrad.core.tolerance import Tolerance
from tests.helpers.sample_losses import dapo

Tensor = torch.Tensor


def _cast(dtype: torch.dtype, eps_guard: float = 0.0) -> Any:
    def loss(
        logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
    ) -> Tensor:
        lp, old, adv = (t.to(dtype) for t in (logprobs, old_logprobs, advantages))
        r = torch.exp(torch.where(response_mask, lp - old, 0.0))
        a = adv[:, None]
        per = torch.maximum(-a * r, -a * r.clamp(0.8, 1.28))
        out = torch.where(response_mask, per, 0.0).sum() / (
            response_mask.sum().to(dtype) + eps_guard
        )
        return out.to(logprobs.dtype)

    return loss


def _run(fn: Any, check: str = "value", **options: Any) -> Any:
    ctx = build_context(fn, parse_marker(("dapo",), options))
    return run_check(ctx, check, max_examples=50, base_seed=1, diagnose=False)


def test_float32_internal_passes_with_a_note_and_fails_strict() -> None:
    for check in ("value", "gradient"):
        result = _run(_cast(torch.float32), check)
        assert result.passed, result.report
        assert any("consistent with float32" in n for n in result.notes)
        assert not _run(_cast(torch.float32), check, strict=True).passed
    assert not any("consistent" in n for n in _run(dapo).notes)


def test_bfloat16_arithmetic_fails() -> None:
    assert not _run(_cast(torch.bfloat16)).passed
    assert not _run(_cast(torch.bfloat16), dtype="float32").passed
    assert not _run(_cast(torch.bfloat16), "gradient", dtype="float32").passed


def test_epsilon_guard_passes_by_default_fails_strict() -> None:
    guarded = _cast(torch.float64, eps_guard=1e-8)
    assert _run(guarded).passed
    strict = _run(guarded, strict=True)
    assert not strict.passed and "check 'value' failed" in strict.report


def test_float32_inputs() -> None:
    assert _run(_cast(torch.float32), dtype="float32").passed
    assert _run(_cast(torch.float32), "gradient", dtype="float32").passed


def test_cancelling_advantages_keep_a_meaningful_scale() -> None:
    tol = Tolerance(torch.float64, strict=True)
    # A loss that cancels to ~1e-17 from terms of size 1: an error of 1e-15 is rounding.
    assert tol.value(1e-15, 1e-17, scale=2.0, n=4).ok
    assert not tol.value(1e-12, 1e-17, scale=2.0, n=4).ok
    # The same error measured against |loss| would have been rejected.
    assert not tol.value(1e-15, 1e-17, scale=1e-17, n=4).ok
    # Default (float32 accepted): 1e-9 is float32 rounding of O(1) terms, 1e-4 is not.
    assert Tolerance(torch.float64).value(1e-9, 1e-17, scale=2.0, n=4).ok
    assert not Tolerance(torch.float64).value(1e-4, 1e-17, scale=2.0, n=4).ok


def test_native_scale_applies_to_arithmetic_in_the_input_dtype_only() -> None:
    """Exact inputs: only the log-ratio rounds, so the input dtype's own arithmetic gets
    the native scale; a coarser precision keeps the rounded-input scale (tolerance.md)."""
    strict = Tolerance(torch.float64, strict=True)
    assert strict.value(1.0 + 1e-13, 1.0, scale=100.0, n=1).ok
    assert not strict.value(1.0 + 1e-13, 1.0, scale=100.0, n=1, native_scale=1.0).ok
    default = Tolerance(torch.float64).value(1.0 + 1e-13, 1.0, 100.0, 1, native_scale=1.0)
    assert default.ok and default.precision is torch.float32
    g, one = torch.tensor([1.0 + 1e-13], dtype=torch.float64), torch.ones(1, dtype=torch.float64)
    where = torch.ones(1, dtype=torch.bool)
    assert strict.tensor(g, one, 100.0 * one, where)[0].ok
    assert not strict.tensor(g, one, 100.0 * one, where, native_scale=one)[0].ok


def test_kink_band_names_the_loosest_precision_and_whether_inputs_are_exact() -> None:
    assert Tolerance(torch.float64).kink_band == (4 * 2.0**-24, False)
    assert Tolerance(torch.float64, strict=True).kink_band == (4 * 2.0**-53, True)
    assert Tolerance(torch.bfloat16, factor=2.0).kink_band == (8 * 2.0**-8, True)


def test_a_value_below_the_dtypes_subnormals_is_rounding() -> None:
    """A true gradient of -3.4e-47 is not representable in float32 (its subnormals are
    multiples of 2^-149, 1.4e-45): a correct float32 function gives -0. Without a floor of
    the subnormal spacing the difference read 98x the tolerance (VESPO, float32 inputs,
    --polgrad-seed 14); a difference the dtype can represent is still judged, and an
    exact 0 (every term of the scale vanishes) still admits no difference."""
    tol = Tolerance(torch.float32, strict=True)
    where = torch.ones(1, 3, dtype=torch.bool)
    expected = torch.tensor([[-3.4479804751840827e-47, 1e-30, 0.0]], dtype=torch.float64)
    scale = torch.tensor([[3.4e-47, 1e-30, 0.0]], dtype=torch.float64)
    actual = torch.tensor([[-0.0, 0.0, 0.0]], dtype=torch.float32)
    _, ratios = tol.tensor(actual, expected, scale, where)
    assert float(ratios[0, 0]) <= 1.0 and float(ratios[0, 1]) > 1e5 and float(ratios[0, 2]) == 0
    _, nonzero_at_exact = tol.tensor(torch.tensor([[0.0, 0.0, 1e-45]]), expected, scale, where)
    assert float(nonzero_at_exact[0, 2]) == float("inf")


def test_a_float32_vespo_with_underflowing_gradients_passes() -> None:
    from polgrad_reference import ALGORITHMS
    from pytest_polgrad import assert_conforms
    from tests.helpers.sample_losses import reference_loss

    fn = reference_loss(ALGORITHMS["vespo"].loss)
    opts: dict[str, Any] = {"dtype": "float32", "strict": True, "max_batch": 4, "max_length": 24}
    assert_conforms(fn, "vespo", max_examples=34, seed=14, checks=("gradient",), **opts)


def test_half_precision_inputs_accept_float32_first() -> None:
    """bfloat16 and float16 are exact in float32: a loss that upcasts computes there."""
    for half in (torch.bfloat16, torch.float16):
        assert Tolerance(half).precisions == (torch.float32, half)
        assert Tolerance(half, strict=True).precisions == (torch.float32,)
        assert Tolerance(half).exact_in(torch.float32)  # the native scale applies there
    assert not Tolerance(torch.float64).exact_in(torch.float32)
    assert not Tolerance(torch.bfloat16).exact_in(torch.float16)  # bfloat16's range
    assert Tolerance(torch.float64).precisions == (torch.float64, torch.float32)
    assert Tolerance(torch.float32).precisions == (torch.float32,)


def _upcast(eps_high: float) -> Any:
    """A DAPO fed bfloat16 that upcasts to float32 (as verl and TRL do), ``eps_high``."""

    def loss(
        logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
    ) -> Tensor:
        lp, old, adv = (t.float() for t in (logprobs, old_logprobs, advantages))
        r = torch.exp(torch.where(response_mask, lp - old, 0.0))
        a = adv[:, None]
        per = torch.maximum(-a * r, -a * r.clamp(0.8, 1.0 + eps_high))
        return torch.where(response_mask, per, 0.0).sum() / response_mask.sum()

    return loss


def test_a_bfloat16_fed_loss_that_upcasts_is_judged_at_float32_with_strict() -> None:
    """Its gradient is bfloat16 (the leaf's dtype) yet passes strict: the result's one
    rounding to bfloat16 is allowed. An eps_high of 0.25 instead of 0.28 (a few per cent
    on the tokens between) is caught by value and gradient with strict, where bfloat16
    tolerance lets the value pass (with the note saying so)."""
    for check in ("value", "gradient"):
        assert _run(_upcast(0.28), check, dtype="bfloat16", strict=True).passed, check
        assert not _run(_upcast(0.25), check, dtype="bfloat16", strict=True).passed, check
    loose = _run(_upcast(0.25), "value", dtype="bfloat16")
    assert loose.passed and any("consistent with bfloat16" in n for n in loose.notes)


def test_a_bfloat16_native_loss_passes_by_default_and_fails_strict() -> None:
    """A DAPO computed in bfloat16 passes by default. With strict its clip kinks are judged
    at float32's band, where bfloat16 rounding takes the other branch: the gradient fails
    (its value error, within one bfloat16 rounding of the result, cannot tell the two
    apart)."""
    native = _cast(torch.bfloat16)
    for check in ("value", "gradient"):
        assert _run(native, check, dtype="bfloat16").passed, check
    strict = _run(native, "gradient", dtype="bfloat16", strict=True)
    assert not strict.passed
    # its report says what strict does here (the diagnosis may name another cause)
    assert any("strict=True judges bfloat16 inputs at float32" in n for n in strict.notes)
    assert not any("strict=True judges" in n for n in _run(native, "gradient").notes)
    assert not any("consistent" in n for n in _run(_upcast(0.28), dtype="bfloat16").notes)


def test_loss_tolerance_grows_with_the_square_root_of_the_token_count() -> None:
    """``tol = factor u (K + sqrt(N)) scale + floor`` (docs/tolerance.md): differences of
    tolerances cancel K, the floor and the result's rounding, leaving the sqrt(N) term, so
    ``(tol(1e6) - tol(1e4)) / (tol(1e4) - tol(1e2)) = 900 / 90``; a tolerance linear in N
    gives 100 (issue 27: the mutant survived)."""
    tol = Tolerance(torch.float64, strict=True)
    diff = 1e-3

    def width(n: int) -> float:
        return diff / tol.value(diff, 0.0, 1.0, n).error

    assert (width(10**6) - width(10**4)) / (width(10**4) - width(100)) == pytest.approx(10.0)
