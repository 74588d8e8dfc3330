"""False alarms reported in issue 14, reproduced, and the precision-aware clip band.

Checks that compare the function with itself (micro-batch, padding-values,
padding-columns) accumulate in float64 and use the same kink-aware tolerance as value and
gradient, scaled by the function's own magnitude as well as the reference's. The clip band
follows the rounding possible in the ratio, so bfloat16 runs still see eps 0.2 vs 0.28.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from pytest_polgrad import ConformanceError, assert_conforms
from pytest_polgrad.core.engine import build_context, run_check
from pytest_polgrad.core.options import parse_marker
from pytest_polgrad.core.verdicts import CheckFailure
from pytest_polgrad.kinds.policy_loss.checks import CHECKS
from tests.helpers import sample_losses as L

Tensor = torch.Tensor


def _rloo_sum(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """Correct RLOO (REINFORCE, seq-mean-token-sum), float64 throughout."""
    return torch.where(response_mask, -advantages[:, None] * logprobs, 0.0).sum(-1).mean()


def _ppo_over_numel(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """Token-sum divided by B * T: decomposes into one-row micro-batches (as verl's
    Dr.GRPO does), and is far larger than dr_grpo's reference (budget 4096)."""
    per = L._ppo_per_token(logprobs, old_logprobs, advantages, response_mask, 0.2, 0.2)
    return torch.where(response_mask, per, 0.0).sum() / response_mask.numel()


def _batch(lp: Any, old: Any, adv: Any, dtype: torch.dtype = torch.float64) -> dict[str, Tensor]:
    logprobs = torch.tensor(lp, dtype=dtype)
    return {
        "logprobs": logprobs,
        "old_logprobs": torch.tensor(old, dtype=dtype),
        "advantages": torch.tensor(adv, dtype=dtype),
        "response_mask": torch.ones(logprobs.shape, dtype=torch.bool),
    }


def test_float64_decomposable_loss_passes_micro_batch_strict() -> None:
    """Issue 14: the one-row losses were accumulated in a float32 tensor (3.7e6x tol)."""
    report = assert_conforms(
        _rloo_sum, "rloo", strict=True, max_examples=20, checks=("micro-batch",)
    )
    assert report.ok


def test_loss_much_larger_than_the_reference_passes_micro_batch_at_b1() -> None:
    """Issue 14: the scale came from the reference alone; at B=1, T=1 the float32
    accumulation of a loss 4096x the reference's failed."""
    ctx = build_context(_ppo_over_numel, parse_marker(("dr_grpo",), {}))
    for lp, old, adv in [
        ([[-1.3]], [[-1.1]], [0.7]),
        ([[-0.1]], [[-0.4]], [-1.9]),
        ([[-2.0, -0.5], [-0.25, -3.0]], [[-2.1, -0.6], [-0.2, -2.95]], [1.0, -0.3]),
    ]:
        assert CHECKS["micro-batch"].run(ctx, _batch(lp, old, adv)) <= 1.0
    report = assert_conforms(
        _ppo_over_numel, "dr_grpo", max_examples=20, checks=("micro-batch",), seed=3
    )
    assert report.ok


def _grpo_float32(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """Correct GRPO policy term computed in float32 internally."""
    lp, old, adv = (t.float() for t in (logprobs, old_logprobs, advantages))
    return L.grpo_no_kl(lp, old, adv, response_mask).to(logprobs.dtype)


KINK = (
    [[-20.0], [-1.0], [-1.0]],
    [[-20.18232238292694], [-1.0], [-1.0]],
    [1.0, 1.0, 1.0],
)


@pytest.mark.parametrize("check", ["micro-batch", "padding-columns", "padding-values"])
def test_float32_grpo_at_a_clip_kink_passes_self_comparisons(check: str) -> None:
    """Issue 14: ratio exp(0.18232238292694) sits on 1 + 0.2; the function's two
    evaluations round to either side, and the one-token row's scale collapsed to 0."""
    ctx = build_context(_grpo_float32, parse_marker(("grpo",), {}))
    batch = _batch(*KINK)
    ref = ctx.expected(batch)
    assert bool(ref.ambiguous[0, 0]) and not bool(ref.ambiguous[1:].any())
    assert CHECKS[check].run(ctx, batch) <= 1.0


def test_self_comparisons_still_catch_a_real_difference_at_the_kink_batch() -> None:
    """The same kink batch with a loss that reads padding still fails padding-values."""
    ctx = build_context(L.dapo_leaky, parse_marker(("dapo",), {}))
    lp, old, adv = KINK
    batch = _batch([[*row, -3.0] for row in lp], [[*row, -2.0] for row in old], adv)
    batch["response_mask"][:, 1] = False
    with pytest.raises(CheckFailure, match="changes when only the values at padding"):
        CHECKS["padding-values"].run(ctx, batch)


def test_self_comparison_rejects_a_non_decomposable_loss_larger_than_the_reference() -> None:
    """The function-own scale does not hide a real micro-batch difference: token-mean over
    B * T with lengths that differ between rows does not decompose."""

    def token_mean_big(
        logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
    ) -> Tensor:
        return 1e3 * L.grpo_token_mean(logprobs, old_logprobs, advantages, response_mask)

    ctx = build_context(token_mean_big, parse_marker(("grpo",), {}))
    batch = _batch(
        [[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]],
        [[-1.1, -0.6, -2.0], [-0.2, -1.0, -0.7]],
        [1.0, -0.5],
    )
    batch["response_mask"][0, 1:] = False
    with pytest.raises(CheckFailure, match="one-row micro-batches"):
        CHECKS["micro-batch"].run(ctx, batch)


# -------------------------------------------------------------- bf16 clip band (item 3)


def test_bfloat16_band_follows_the_ratio_rounding_not_k_ulps() -> None:
    tol = build_context(L.dapo, parse_marker(("dapo",), {"dtype": "bfloat16"})).tolerance
    eps, native = tol.kink_band
    assert native and eps == pytest.approx(4 * 2.0**-8)
    # the band around 1.2 and the band around 1.28 leave ratios between them comparable
    lr = math.log(1.24)
    assert 1.2 * (1 + eps * (1 + lr)) < 1.24 < 1.28 * (1 - eps * (1 + lr))


def test_bfloat16_run_distinguishes_eps_0_2_from_0_28() -> None:
    """Issue 14: at bfloat16 the band was K * u = 12.5% of the ratio and the gradient
    scale carried cond = 1 + |logprobs| + |old| even for exact inputs."""
    with pytest.raises(ConformanceError) as info:
        assert_conforms(L.dapo_wrong_eps, "dapo", dtype="bfloat16", max_examples=30)
    failed = {r.check for r in info.value.report.unexpected_failures}
    assert "gradient" in failed


def test_bfloat16_correct_dapo_passes() -> None:
    def dapo_bf16_internal(
        logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
    ) -> Tensor:
        assert logprobs.dtype is torch.bfloat16
        return L.dapo(logprobs, old_logprobs, advantages, response_mask)

    for fn in (L.dapo, dapo_bf16_internal):
        assert assert_conforms(fn, "dapo", dtype="bfloat16", max_examples=30).ok


# ------------------------------------------------------------- notes vs verdict (item 4)


def test_a_note_never_says_passes_on_a_failing_check() -> None:
    """Issue 14: 'consistent with float32 ... passes by default' appeared on a failing
    on-policy check: examples that passed at float32 precision added the note before a
    later example failed."""

    def cispo_float32_no_sg(
        logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
    ) -> Tensor:
        """Correct in float32 on short rows; drops the stop-gradient once a row is long."""
        f = (logprobs.float(), old_logprobs.float(), advantages.float(), response_mask)
        long_rows = bool((response_mask.sum(dim=1) > 6).any())
        return (L.cispo_no_stop_gradient(*f) if long_rows else L.cispo(*f)).double()

    ctx = build_context(cispo_float32_no_sg, parse_marker(("cispo",), {"eps_high": 2.0}))
    result = run_check(ctx, "on-policy", max_examples=40, base_seed=0, diagnose=False)
    assert not result.passed
    assert not any("passes by default" in n for n in result.notes), result.notes
    assert "passes by default" not in result.report
    # the same float32 function with the stop-gradient passes, and says so in a note
    ok = build_context(
        lambda logprobs, old_logprobs, advantages, response_mask: L.cispo(
            logprobs.float(), old_logprobs.float(), advantages.float(), response_mask
        ).double(),
        parse_marker(("cispo",), {"eps_high": 2.0}),
    )
    passed = run_check(ok, "on-policy", max_examples=20, base_seed=0, diagnose=False)
    assert passed.passed and any("passes by default" in n for n in passed.notes)


# ------------------------------------------- a result rounded to a half-precision subnormal


@pytest.mark.parametrize(
    ("dtype", "expected", "rounded"),
    [
        # bypass_pg's product ratio of a 944-token row, fed bfloat16, upcast (sweep, seed 101)
        (torch.bfloat16, -6.499961428556032e-41, -9.183549615799121e-41),
        # grpo fed float16, upcast: the gradient of a token in a 46 x 96 batch
        (torch.float16, -1.4920375787303787e-07, -1.7881393432617188e-07),
    ],
)
def test_a_gradient_rounded_to_the_inputs_subnormals_is_not_a_deviation(
    dtype: torch.dtype, expected: float, rounded: float
) -> None:
    """A function fed half precision gets its gradient in that dtype (the leaf's), whatever
    it computes in: below the smallest normal the gradient is a multiple of the subnormal
    spacing (9e-41 for bfloat16, 6e-8 for float16), so strict judging at float32 allows one
    spacing. Ten spacings off is still a deviation."""
    from pytest_polgrad.core.tolerance import UNDERFLOW, Tolerance

    assert torch.tensor(expected).to(dtype).item() in (rounded, 0.0, rounded / 2)
    tol = Tolerance(dtype, strict=True)
    scale = torch.tensor([abs(expected) * 20.0], dtype=torch.float64)
    where = torch.tensor([True])
    exp = torch.tensor([expected], dtype=torch.float64)
    ok, _ = tol.tensor(torch.tensor([rounded], dtype=dtype), exp, scale, where)
    assert ok.ok, ok
    far = torch.tensor([expected - 10 * UNDERFLOW[dtype]], dtype=torch.float64).to(dtype)
    bad, _ = tol.tensor(far, exp, scale, where)
    assert not bad.ok
    assert tol.value(rounded, expected, abs(expected) * 20.0, 1).ok
    assert not tol.value(float(far), expected, abs(expected) * 20.0, 1).ok


def test_the_sweeps_bfloat16_subnormal_false_alarm_passes() -> None:
    """The false alarm ``bench/false_alarms.py --seeds 101`` found: bypass_pg computed by the
    reference in float32 from bfloat16 inputs, strict, on a realistic-size batch."""
    from tests.kinds.policy_loss import test_sweep_correct as sweep

    fn = sweep._float32_inside(sweep._reference_function("bypass_pg"))
    budget = sweep.CORPUS + sweep.POOLED // 3
    report = assert_conforms(
        fn,
        "bypass_pg",
        max_examples=budget,
        seed=101,
        dtype="bfloat16",
        strict=True,
        checks=("gradient",),
    )
    assert report.ok


# ------------------------------------------------------- float16's range on extreme batches


@pytest.mark.parametrize("upcast", [False, True], ids=["float16-arithmetic", "upcast-strict"])
def test_float16_extreme_batches_past_its_range_are_not_judged(upcast: bool) -> None:
    """Extreme-domain batches drive a correct loss's terms past 65504 (|A| |log pi| with
    log pi down to -1000, exp of a log-ratio up to 50, k3 of a gap of 50): in float16 that
    is inf, however the loss computes. Not judged there, and said; a loss that makes 0/0
    of representable values is still flagged."""
    from tests.kinds.policy_loss import test_sweep_correct as sweep

    wrap = sweep._float32_inside if upcast else (lambda f: f)
    options: dict[str, Any] = {"dtype": "float16", "strict": upcast}
    notes: list[str] = []
    for name in ("rloo", "grpo"):
        result = run_check(
            build_context(wrap(L.CORRECT[name]), parse_marker((name,), options)),
            "extreme-finite",
            max_examples=100,
            base_seed=0,
            diagnose=False,
        )
        assert result.passed, result.report
        notes += result.notes
    assert any("not judged for finiteness" in n for n in notes), notes
    wrong = run_check(
        build_context(wrap(L.dapo_ratio_of_probs), parse_marker(("dapo",), options)),
        "extreme-finite",
        max_examples=100,
        base_seed=0,
        diagnose=False,
    )
    assert not wrong.passed


# ---------------------------------------------- the canonical corpus's padding in float16


def _dapo_times_mask(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """DAPO in the inputs' dtype, masked by multiplying (``(x * m).sum() / m.sum()``)."""
    m = response_mask.to(logprobs.dtype)
    ratio = torch.exp(logprobs - old_logprobs)
    per = torch.maximum(-advantages[:, None] * ratio, -advantages[:, None] * ratio.clamp(0.8, 1.28))
    return (per * m).sum() / m.sum()


def test_the_float16_corpus_keeps_exp_of_its_padding_finite() -> None:
    """Version 2 put log-ratios of +/-30 at padding: exp is inf in float16, and a loss that
    multiplies by the mask returned NaN on the canonical batches (six checks failed with
    "returned nan for a valid batch": a new-user trial finding). float16's corpus is
    version 3, with garbage a third as large; the other dtypes' are unchanged."""
    from pytest_polgrad.core.corpus import CORPUS_VERSION, canonical_corpus, corpus_version

    assert corpus_version(torch.float16) == 3
    assert {corpus_version(d) for d in (torch.float64, torch.float32, torch.bfloat16)} == {
        CORPUS_VERSION
    }
    half, full = canonical_corpus(dtype=torch.float16), canonical_corpus()
    for name, batch in half.items():
        mask = batch["response_mask"]
        for key in ("logprobs", "ref_logprobs", "rollout_logprobs"):
            gap = (batch[key].float() - batch["old_logprobs"].float()).abs()
            assert bool(torch.isfinite(gap.exp().half()).all()), (name, key)
            same = full[name][key].half()
            assert torch.equal(torch.where(mask, batch[key], 0), torch.where(mask, same, 0))
    checks = ("value", "gradient", "masked-positions", "micro-batch")
    report = assert_conforms(
        _dapo_times_mask, "dapo", dtype="float16", checks=checks, max_examples=40
    )
    assert report.ok
