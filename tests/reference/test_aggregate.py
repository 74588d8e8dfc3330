"""Aggregation modes: closed-form weights, inner-product identity, micro-batch weights."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from polgrad_reference import (
    Aggregation,
    ConfigError,
    InputError,
    InputTypeError,
    NumericalError,
    aggregate,
    microbatch_token_weights,
    token_weights,
)
from tests.helpers.ragged import ragged

MODES = list(Aggregation)

# Identities of the closed-form weights (to 1e-13 or bitwise), per mode and scaling: a
# wrong weight breaks them on nearly every ragged batch, so 30 batches per mode (sizes 1-6 x 1-12,
# pad 0-3, drawn as in the 100-example profile) prove it; the modes x scalings multiply
# the profile's default 100 into ~2,000 batches for one file.
EXACT = settings(max_examples=30)


def _budget(mode: Aggregation) -> int | None:
    return 16 if mode is Aggregation.TOKEN_SUM_NORM else None


def naive(x: torch.Tensor, mask: torch.Tensor, mode: Aggregation, budget: int | None) -> float:
    """Each mode written as the equation in its paper, with Python loops."""
    rows = [[float(x[b, t]) for t in range(x.shape[1]) if mask[b, t]] for b in range(len(x))]
    n_tok = sum(len(r) for r in rows)
    if mode is Aggregation.TOKEN_MEAN:
        return sum(sum(r) for r in rows) / n_tok
    if mode is Aggregation.SEQ_MEAN_TOKEN_MEAN:
        return sum(sum(r) / len(r) for r in rows) / len(rows)
    if mode is Aggregation.SEQ_MEAN_TOKEN_SUM:
        return sum(sum(r) for r in rows) / len(rows)
    if mode is Aggregation.TOKEN_SUM:
        return sum(sum(r) for r in rows)
    assert budget is not None
    return sum(sum(r) for r in rows) / (len(rows) * budget)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@EXACT
@given(batch=ragged())
def test_aggregate_matches_the_papers_equation(mode: Aggregation, batch: dict) -> None:
    x, mask = batch["logprobs"], batch["response_mask"]
    got = aggregate(x, response_mask=mask, mode=mode, budget=_budget(mode)).item()
    assert got == pytest.approx(naive(x, mask, mode, _budget(mode)), rel=1e-13, abs=1e-15)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@EXACT
@given(batch=ragged())
def test_gradient_is_the_weights_bitwise(mode: Aggregation, batch: dict) -> None:
    mask = batch["response_mask"]
    x = batch["logprobs"].clone().requires_grad_()
    w = token_weights(mask, mode, budget=_budget(mode))
    loss = aggregate(x, response_mask=mask, mode=mode, budget=_budget(mode))
    (grad,) = torch.autograd.grad(loss, x)
    assert torch.equal(grad, w)
    assert torch.equal(loss, (torch.where(mask, x, 0.0) * w).sum())
    assert bool((grad[~mask] == 0).all())


def test_weights_closed_forms_on_a_hand_case() -> None:
    mask = torch.tensor([[True, False, False], [True, True, True]])
    expect = {
        "token-mean": [[1 / 4, 0, 0], [1 / 4] * 3],
        "seq-mean-token-mean": [[1 / 2, 0, 0], [1 / 6] * 3],
        "seq-mean-token-sum": [[1 / 2, 0, 0], [1 / 2] * 3],
        "token-sum": [[1, 0, 0], [1] * 3],
    }
    for mode, w in expect.items():
        assert torch.allclose(token_weights(mask, mode), torch.tensor(w, dtype=torch.float64))
    got = token_weights(mask, "token-sum-norm", budget=5)
    assert torch.allclose(got, mask.double() / 10)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("scaling", ["mean", "sum"])
@EXACT
@given(batch=ragged(max_batch=7), size=st.integers(1, 4))
def test_microbatch_weights_equal_autograd_of_an_accumulation_loop(
    mode: Aggregation, scaling: str, batch: dict, size: int
) -> None:
    mask = batch["response_mask"]
    x = batch["logprobs"].clone().requires_grad_()
    chunks = list(zip(x.split(size), mask.split(size), strict=True))
    scale = 1.0 / len(chunks) if scaling == "mean" else 1.0
    for xc, mc in chunks:  # an explicit gradient-accumulation loop
        (aggregate(xc, response_mask=mc, mode=mode, budget=_budget(mode)) * scale).backward()
    w = microbatch_token_weights(
        mask, mode, micro_batch_size=size, scaling=scaling, budget=_budget(mode)
    )
    assert x.grad is not None
    assert torch.equal(x.grad, w)


def test_microbatching_changes_token_mean_by_the_predicted_factor() -> None:
    mask = torch.arange(8)[None, :] < torch.tensor([[1], [8]])  # chunks of 1 and 8 tokens
    full = token_weights(mask, "token-mean")
    micro = microbatch_token_weights(mask, "token-mean", micro_batch_size=1)
    # full batch: every token 1/9; accumulated: the lone token 1/2, the others 1/16.
    assert micro[0, 0] / full[0, 0] == pytest.approx(9 / 2)
    assert micro[1, 0] / full[1, 0] == pytest.approx(9 / 16)
    equal = microbatch_token_weights(mask, "seq-mean-token-mean", micro_batch_size=1)
    assert torch.allclose(equal, token_weights(mask, "seq-mean-token-mean"))


def test_padding_garbage_never_leaks() -> None:
    mask = torch.tensor([[True, False]])
    x = torch.tensor([[2.0, float("nan")]], dtype=torch.float64)
    for mode in MODES:
        assert aggregate(x, response_mask=mask, mode=mode, budget=_budget(mode)).isfinite()


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"mode": "mean"}, ConfigError, "mode must be one of"),
        ({"mode": "token-sum-norm"}, ConfigError, "budget must be a positive integer"),
        ({"mode": "token-sum-norm", "budget": 8.5}, ConfigError, "budget"),
        ({"mode": "token-sum-norm", "budget": True}, ConfigError, "budget"),
        ({"mode": "token-sum-norm", "budget": 0}, ConfigError, "budget"),
        ({"mode": "token-mean", "budget": 8}, ConfigError, "applies to mode=.token-sum-norm. only"),
    ],
)
def test_bad_config_values(kwargs: dict, error: type, words: str) -> None:
    mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(error, match=words):
        token_weights(mask, **kwargs)


def test_bad_masks_and_shapes() -> None:
    with pytest.raises(InputTypeError, match=r"response_mask must be a torch\.bool"):
        token_weights(torch.ones(2, 3), "token-mean")
    with pytest.raises(InputError, match=r"response_mask must be 2-D"):
        token_weights(torch.ones(3, dtype=torch.bool), "token-mean")
    with pytest.raises(InputError, match=r"B >= 1 and T >= 1.*\[0, 3\]"):
        token_weights(torch.ones(0, 3, dtype=torch.bool), "token-mean")
    with pytest.raises(InputError, match=r"B >= 1 and T >= 1.*\[2, 0\]"):
        token_weights(torch.ones(2, 0, dtype=torch.bool), "token-mean")
    with pytest.raises(InputError, match=r"no response token: rows \[1\]"):
        token_weights(torch.tensor([[True], [False]]), "token-mean")
    with pytest.raises(InputError, match=r"x must have shape"):
        aggregate(
            torch.ones(2, 4), response_mask=torch.ones(2, 3, dtype=torch.bool), mode="token-sum"
        )
    with pytest.raises(InputError, match=r"x must have a floating-point dtype"):
        aggregate(
            torch.ones(2, 3, dtype=torch.long),
            response_mask=torch.ones(2, 3, dtype=torch.bool),
            mode="token-sum",
        )
    with pytest.raises(ConfigError, match="micro_batch_size"):
        microbatch_token_weights(
            torch.ones(2, 3, dtype=torch.bool), "token-mean", micro_batch_size=0
        )


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")], ids=str)
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_non_finite_response_value_raises_naming_positions(mode: Aggregation, bad: float) -> None:
    """Issue 15: NaN/inf at a response token is an InputError (as in policy_loss), not NaN."""
    mask = torch.tensor([[True, True, False], [True, False, False]])
    x = torch.tensor([[1.0, 2.0, 0.0], [bad, 0.0, float("nan")]], dtype=torch.float64)
    with pytest.raises(InputError, match=r"x holds (NaN|inf) at response positions \(1, 0\)"):
        aggregate(x, response_mask=mask, mode=mode, budget=_budget(mode))


def test_overflowing_sum_raises_numerical_error() -> None:
    mask = torch.ones(1, 4, dtype=torch.bool)
    x = torch.full((1, 4), 6.0e4, dtype=torch.float16)  # finite; the float16 sum is not
    with pytest.raises(NumericalError, match="overflows"):
        aggregate(x, response_mask=mask, mode="token-sum")
