"""Bad input to policy_loss and to configs: a clear error naming the argument, never a raw
torch error and never a silent NaN."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from polgrad_reference import (
    ALGORITHMS,
    ClipConfig,
    ConfigError,
    InputError,
    InputTypeError,
    ISCorrection,
    KLConfig,
    NumericalError,
    PolicyLossConfig,
    policy_loss,
)
from tests.helpers.ragged import build

CFG = PolicyLossConfig()


def batch(**changes: object) -> dict:
    b = build([1, 3], seed=0, width=4)
    del b["ref_logprobs"], b["rollout_logprobs"]
    b.update(changes)
    return b


def test_valid_batch_with_nan_padding_is_fine() -> None:
    out = policy_loss(CFG, **batch())
    assert out.loss.isfinite()


@pytest.mark.parametrize(
    ("changes", "error", "words"),
    [
        (
            {"logprobs": torch.zeros(2, 5, dtype=torch.float64)},
            InputError,
            r"logprobs must have shape .*\[2, 4\], got \[2, 5\]",
        ),
        (
            {"advantages": torch.zeros(3, dtype=torch.float64)},
            InputError,
            r"advantages must have shape \[B\] = \[2\], got \[3\]",
        ),
        (
            {"advantages": torch.zeros(2, 3, dtype=torch.float64)},
            InputError,
            r"advantages must have shape",
        ),
        (
            {"response_mask": torch.ones(2, 4)},
            InputTypeError,
            r"response_mask must be a torch.bool tensor, got torch.float32",
        ),
        (
            {"response_mask": torch.ones(2, 4, dtype=torch.long)},
            InputTypeError,
            r"response_mask must be a torch.bool",
        ),
        (
            {"response_mask": torch.ones(0, 4, dtype=torch.bool)},
            InputError,
            r"B >= 1 and T >= 1, got shape \[0, 4\]",
        ),
        (
            {"response_mask": torch.ones(2, 0, dtype=torch.bool)},
            InputError,
            r"B >= 1 and T >= 1, got shape \[2, 0\]",
        ),
        (
            {"response_mask": torch.tensor([[True] * 4, [False] * 4])},
            InputError,
            r"response_mask has rows with no response token: rows \[1\]",
        ),
        (
            {"logprobs": torch.zeros(2, 4, dtype=torch.long)},
            InputTypeError,
            r"logprobs must have a floating-point dtype, got torch.int64",
        ),
        (
            {"old_logprobs": torch.zeros(2, 4, dtype=torch.float32)},
            InputTypeError,
            r"share one dtype.*old_logprobs=torch.float32",
        ),
        (
            {"logprobs": np.zeros((2, 4))},
            InputTypeError,
            r"logprobs must be a torch.Tensor, got numpy.ndarray; .*torch.from_numpy",
        ),
        ({"advantages": [1.0, 2.0]}, InputTypeError, r"advantages must be a torch.Tensor"),
        (
            {"old_logprobs": torch.zeros(2, 4, dtype=torch.float64, device="meta")},
            InputTypeError,
            r"one device.*old_logprobs on meta",
        ),
    ],
)
def test_malformed_inputs(changes: dict, error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        policy_loss(CFG, **batch(**changes))


@pytest.mark.parametrize("name", ["logprobs", "old_logprobs"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_at_response_positions(name: str, value: float) -> None:
    b = batch()
    bad = b[name].clone()
    bad[1, 2] = value
    kind = "NaN" if value != value else "inf"
    with pytest.raises(InputError, match=rf"{name} holds {kind} at response positions \(1, 2\)"):
        policy_loss(CFG, **{**b, name: bad})


def test_non_finite_advantages() -> None:
    b = batch()
    with pytest.raises(InputError, match=r"advantages holds NaN at positions \(1\)"):
        policy_loss(
            CFG, **{**b, "advantages": torch.tensor([0.5, float("nan")], dtype=torch.float64)}
        )
    per_token = torch.zeros(2, 4, dtype=torch.float64)
    per_token[0, 3] = float("nan")  # padding: fine
    assert policy_loss(CFG, **{**b, "advantages": per_token}).loss.isfinite()
    per_token[1, 1] = float("inf")
    with pytest.raises(InputError, match=r"advantages holds inf at response positions \(1, 1\)"):
        policy_loss(CFG, **{**b, "advantages": per_token})


def test_ratio_overflow_is_reported_not_returned() -> None:
    mask = torch.ones(1, 2, dtype=torch.bool)
    lp = torch.tensor([[-0.5, -1.0]])
    old = torch.tensor([[-0.5, -101.0]])  # log-ratio 100: exp overflows float32
    adv = torch.tensor([-1.0])
    with pytest.raises(NumericalError, match=r"overflows torch.float32 at positions \(0, 1\)"):
        policy_loss(CFG, logprobs=lp, old_logprobs=old, advantages=adv, response_mask=mask)
    # in float64 the same ratio is finite and the loss is exact
    out = policy_loss(
        CFG,
        logprobs=lp.double(),
        old_logprobs=old.double(),
        advantages=adv.double(),
        response_mask=mask,
    )
    assert out.loss.isfinite()


def test_loss_overflow_is_reported() -> None:
    b = batch(advantages=torch.tensor([1e308, -1e308], dtype=torch.float64))
    with pytest.raises(NumericalError, match="loss is"):
        policy_loss(PolicyLossConfig(aggregation="token-sum"), **b)


def test_required_optional_tensors() -> None:
    with pytest.raises(InputError, match=r"ref_logprobs is required because .*KL term"):
        policy_loss(ALGORITHMS["grpo"].loss, **batch())
    with pytest.raises(InputError, match=r"rollout_logprobs is required because .*importance"):
        policy_loss(CFG.replace(is_correction=ISCorrection()), **batch())
    with pytest.raises(InputError, match="ref_logprobs must have shape"):
        policy_loss(
            ALGORITHMS["grpo"].loss, **batch(ref_logprobs=torch.zeros(2, 2, dtype=torch.float64))
        )
    with pytest.raises(ConfigError, match="cfg must be a PolicyLossConfig"):
        policy_loss("grpo", **batch())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("build_config", "words"),
    [
        (lambda: ClipConfig(eps_low=-0.1), r"eps_low must lie in \[0, 1\)"),
        (lambda: ClipConfig(eps_low=1.0), r"eps_low must lie in \[0, 1\)"),
        (lambda: ClipConfig(eps_high=-0.2), "eps_high must be >= 0"),
        (lambda: ClipConfig(eps_high=float("inf")), "eps_high must be finite"),
        (lambda: ClipConfig(eps_high="0.2"), "eps_high must be a real number"),
        (lambda: ClipConfig(dual_clip=1.0), "dual_clip must be > 1"),
        (lambda: ClipConfig(dual_clip=1.1), r"dual_clip must exceed 1 \+ eps_high"),
        (lambda: PolicyLossConfig(aggregation="token-sum-norm"), "budget must be a positive"),
        (lambda: PolicyLossConfig(aggregation="token-sum-norm", budget=8.0), "budget must be"),
        (lambda: PolicyLossConfig(aggregation="token-sum-norm", budget=-3), "budget must be"),
        (lambda: PolicyLossConfig(budget=8), "budget applies to aggregation='token-sum-norm'"),
        (lambda: PolicyLossConfig(aggregation="mean"), "aggregation must be one of"),
        (lambda: PolicyLossConfig(ratio="sequence", surrogate="reinforce"), "ratio='token' only"),
        (lambda: PolicyLossConfig(clip=(0.2, 0.2)), "clip must be a ClipConfig"),
        (lambda: ISCorrection(cap=0.0), "cap must be > 0"),
        (lambda: ISCorrection(mode="mask"), "needs low, high or both"),
        (lambda: ISCorrection(mode="mask", low=2.0, high=1.0), "low must be < high"),
        (lambda: ISCorrection(high=3.0), "high applies to modes 'mask' and 'zero'"),
        (lambda: KLConfig(coef=-1.0), "coef must be >= 0"),
        (lambda: KLConfig(estimator="k4"), "estimator must be one of"),
        (lambda: ALGORITHMS["dapo"].derive(eps_lo=0.1), r"unknown override\(s\) \['eps_lo'\]"),
    ],
)
def test_out_of_range_config_values(build_config: object, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        build_config()  # type: ignore[operator]


def test_kl_overflow_is_reported() -> None:
    b = batch(ref_logprobs=torch.zeros(2, 4, dtype=torch.float64))
    ref = b["ref_logprobs"].clone()
    ref[1, 1] = 800.0  # exp(800 - logprobs) overflows float64
    with pytest.raises(NumericalError, match=r"KL estimate overflows .* positions \(1, 1\)"):
        policy_loss(ALGORITHMS["grpo"].loss, **{**b, "ref_logprobs": ref})


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_ratio_overflow_advice_follows_the_dtype(dtype: torch.dtype) -> None:
    """In float64 there is no wider dtype to advise: the message says what overflowed,
    where, and that the log-ratio is impossible for log-probabilities of the same tokens.
    In float32 computing in float64 is a fix worth naming."""
    mask = torch.ones(1, 2, dtype=torch.bool)
    lp = torch.tensor([[-0.5, -1.0]], dtype=dtype)
    gap = 800.0 if dtype == torch.float64 else 100.0
    old = torch.tensor([[-0.5, -1.0 - gap]], dtype=dtype)
    adv = torch.tensor([-1.0], dtype=dtype)
    with pytest.raises(NumericalError) as info:
        policy_loss(CFG, logprobs=lp, old_logprobs=old, advantages=adv, response_mask=mask)
    message = str(info.value)
    assert f"overflows {dtype} at positions (0, 1)" in message
    assert "largest log-ratio" in message and "old_logprobs" in message
    if dtype == torch.float64:
        assert "compute in float64" not in message and "709.78" in message
    else:
        assert "compute in float64" in message


def test_float64_kl_overflow_does_not_advise_float64() -> None:
    b = batch(ref_logprobs=torch.zeros(2, 4, dtype=torch.float64))
    ref = b["ref_logprobs"].clone()
    ref[1, 1] = 800.0
    with pytest.raises(NumericalError) as info:
        policy_loss(ALGORITHMS["grpo"].loss, **{**b, "ref_logprobs": ref})
    assert "compute in float64" not in str(info.value) and "709.78" in str(info.value)


def test_derive_rejects_a_misspelt_aggregation_with_the_allowed_values() -> None:
    with pytest.raises(ConfigError) as info:
        ALGORITHMS["dapo"].derive(aggregation="token_mean")
    message = str(info.value)
    assert "aggregation must be one of 'token-mean', 'seq-mean-token-mean'" in message
    assert message.endswith("got 'token_mean'; did you mean 'token-mean'?")
