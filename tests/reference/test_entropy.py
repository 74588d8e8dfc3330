"""Exact softmax entropy, its aggregation and the sampled-token estimate (docs/entropy.md)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from polgrad_reference import InputError, InputTypeError
from polgrad_reference.aggregate import aggregate
from polgrad_reference.entropy import entropy_bonus, sampled_token_entropy, token_entropy

F64 = torch.float64
NAN = float("nan")
INF = float("inf")


def _loop_entropy(z: list[float]) -> float:
    """``-sum p log p`` with Python floats (math.fsum), ``p = exp(z - m) / sum exp(z - m)``."""
    finite = [x for x in z if x != -INF]
    m = max(finite)
    e = [math.exp(x - m) for x in finite]
    s = math.fsum(e)
    return -math.fsum((x / s) * math.log(x / s) for x in e if x > 0)


def test_golden_two_point_uniform_and_peaked() -> None:
    """docs/entropy.md "Golden cases": (0, 0) -> log 2; (0, 0, 0, 0) -> log 4; (1, 0) ->
    ``log(1 + e) - e / (1 + e)``; the padding row is 0."""
    z = torch.tensor(
        [[[0.0, 0.0, -INF, -INF], [0.0, 0.0, 0.0, 0.0]], [[1.0, 0.0, -INF, -INF], [NAN] * 4]],
        dtype=F64,
    )
    mask = torch.tensor([[True, True], [True, False]])
    h = token_entropy(logits=z, response_mask=mask)
    e = math.e
    expected = torch.tensor(
        [[math.log(2), math.log(4)], [math.log(1 + e) - e / (1 + e), 0.0]], dtype=F64
    )
    assert torch.allclose(h, expected, rtol=1e-15, atol=0)
    assert float(h[1, 1]) == 0.0


@pytest.mark.parametrize("offset", [0.0, 1e4, -1e4, 1e300])
def test_shift_invariance_and_stability_for_large_logits(offset: float) -> None:
    """``H(z + c) = H(z)``: 1e4 (where exp overflows without the max shift) and 1e300 give
    the entropy of the unshifted logits to float64 rounding of the shifted inputs."""
    g = torch.Generator().manual_seed(0)
    z = torch.randn(3, 4, 7, generator=g, dtype=F64)
    mask = torch.ones(3, 4, dtype=torch.bool)
    base = token_entropy(logits=z, response_mask=mask)
    shifted = token_entropy(logits=z + offset, response_mask=mask)
    rounding = (z + offset) - offset - z  # what the shift itself loses
    tol = 8 * float(rounding.abs().max()) + 1e-14
    assert torch.isfinite(shifted).all()
    assert float((shifted - base).abs().max()) <= tol


def test_matches_a_python_loop() -> None:
    g = torch.Generator().manual_seed(1)
    z = torch.randn(4, 5, 9, generator=g, dtype=F64) * 3
    z[0, 0, 3] = -INF
    mask = torch.arange(5)[None, :] < torch.tensor([[5], [1], [3], [4]])
    h = token_entropy(logits=z, response_mask=mask)
    for b in range(4):
        for t in range(5):
            want = _loop_entropy(z[b, t].tolist()) if mask[b, t] else 0.0
            assert abs(float(h[b, t]) - want) <= 1e-14 * (1 + abs(want))


def test_gradient_is_the_closed_form_and_zero_at_padding() -> None:
    """``dH/dz_v = -p_v (log p_v + H)``; 0 for a padding token (even with NaN logits) and
    for -inf entries; fp64 gradcheck."""
    g = torch.Generator().manual_seed(2)
    z = torch.randn(2, 3, 6, generator=g, dtype=F64)
    z[1, 2] = NAN
    z[0, 1, 4] = -INF
    mask = torch.tensor([[True, True, True], [True, True, False]])
    leaf = z.clone().requires_grad_(True)
    h = token_entropy(logits=leaf, response_mask=mask)
    (grad,) = torch.autograd.grad(h.sum(), leaf)
    zs = torch.where(mask[:, :, None], z, 0.0)
    logp = torch.log_softmax(zs, dim=2)
    p = logp.exp()
    closed = torch.where(p > 0, -p * (logp + h.detach()[:, :, None]), 0.0)
    closed = torch.where(mask[:, :, None], closed, 0.0)
    assert torch.isfinite(grad).all()
    assert torch.allclose(grad, closed, rtol=1e-12, atol=1e-15)
    assert bool((grad[1, 2] == 0).all()) and float(grad[0, 1, 4]) == 0.0
    finite = torch.randn(2, 3, 4, generator=g, dtype=F64, requires_grad=True)
    full = torch.ones(2, 3, dtype=torch.bool)
    assert torch.autograd.gradcheck(
        lambda x: token_entropy(logits=x, response_mask=full), (finite,)
    )


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "token-sum"])
def test_bonus_is_the_aggregate_of_the_per_token_entropy(mode: str) -> None:
    g = torch.Generator().manual_seed(3)
    z = torch.randn(3, 4, 5, generator=g, dtype=F64)
    mask = torch.arange(4)[None, :] < torch.tensor([[4], [2], [1]])
    h = token_entropy(logits=z, response_mask=mask)
    assert torch.equal(
        entropy_bonus(logits=z, response_mask=mask, mode=mode),
        aggregate(h, response_mask=mask, mode=mode),
    )


def test_sampled_token_estimate_is_unbiased_on_policy() -> None:
    """``E_{y ~ p}[-log p(y)] = H(p)``: 20000 seeded samples, within 5 CLT standard errors;
    tokens drawn from another distribution miss it by many."""
    g = torch.Generator().manual_seed(4)
    z = torch.tensor([2.0, 0.5, -1.0, 0.0, 1.0], dtype=F64)
    logp = torch.log_softmax(z, dim=0)
    n = 20000
    y = torch.multinomial(logp.exp(), n, replacement=True, generator=g)
    lp = logp[y].reshape(1, n)
    mask = torch.ones(1, n, dtype=torch.bool)
    est = sampled_token_entropy(logprobs=lp, response_mask=mask)
    h = float(token_entropy(logits=z.reshape(1, 1, 5), response_mask=mask[:, :1]))
    se = float(est.std()) / math.sqrt(n)
    assert abs(float(est.mean()) - h) <= 5 * se
    off = torch.multinomial(torch.softmax(-z, dim=0), n, replacement=True, generator=g)
    biased = -logp[off]
    assert abs(float(biased.mean()) - h) > 20 * se


BAD: dict[str, tuple[dict[str, Any], type[Exception], str]] = {
    "not-tensor": ({"logits": [[[0.0]]]}, InputTypeError, "logits must be a torch.Tensor"),
    "int": ({"logits": torch.zeros(1, 2, 3, dtype=torch.long)}, InputTypeError, "floating-point"),
    "2d": ({"logits": torch.zeros(1, 2, dtype=F64)}, InputError, r"shape \[B, T, V\]"),
    "empty-vocab": ({"logits": torch.zeros(1, 2, 0, dtype=F64)}, InputError, "V >= 1"),
    "mask-shape": (
        {"response_mask": torch.ones(2, 2, dtype=torch.bool)},
        InputError,
        r"response_mask must have shape \[B, T\] of logits",
    ),
    "mask-int": ({"response_mask": torch.ones(1, 2, dtype=torch.long)}, InputTypeError, "bool"),
    "nan": (
        {"logits": torch.tensor([[[0.0, NAN], [0.0, 0.0]]], dtype=F64)},
        InputError,
        r"NaN at response positions \(b, t, v\) \(0, 0, 1\)",
    ),
    "plus-inf": (
        {"logits": torch.tensor([[[0.0, INF], [0.0, 0.0]]], dtype=F64)},
        InputError,
        r"\+inf",
    ),
    "all-minus-inf": (
        {"logits": torch.tensor([[[-INF, -INF], [0.0, 0.0]]], dtype=F64)},
        InputError,
        "whole vocabulary",
    ),
    "empty-row": (
        {"response_mask": torch.tensor([[False, False]])},
        InputError,
        "no response token",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_raises_naming_the_argument(case: str) -> None:
    changes, error, words = BAD[case]
    args: dict[str, Any] = {
        "logits": torch.zeros(1, 2, 3, dtype=F64),
        "response_mask": torch.ones(1, 2, dtype=torch.bool),
        **changes,
    }
    with pytest.raises(error, match=words):
        token_entropy(**args)


def test_sampled_estimate_rejects_positive_logprobs() -> None:
    with pytest.raises(InputError, match=r"logprobs must be <= 0, got positive values at \(0, 1\)"):
        sampled_token_entropy(
            logprobs=torch.tensor([[-0.5, 0.25]], dtype=F64),
            response_mask=torch.ones(1, 2, dtype=torch.bool),
        )


def test_sampled_estimate_accepts_logprobs_of_exactly_zero() -> None:
    """A token sampled with probability 1 has ``log pi = 0`` (a valid log-probability, and
    ``-0.0`` too): its estimate is 0, not an error (issue 27: a ``>= 0`` rejection survived)."""
    lp = torch.tensor([[0.0, -0.0, -1.5]], dtype=F64)
    out = sampled_token_entropy(logprobs=lp, response_mask=torch.ones(1, 3, dtype=torch.bool))
    assert out[0].tolist() == [0.0, 0.0, 1.5]


def test_entropy_of_logits_near_the_dtypes_largest_value_is_finite() -> None:
    """The softmax is taken of ``z - max z`` (shift-invariant, never above 0): logits of
    3e38 in float32 give entropy 0, where ``z + max z`` would overflow to inf and NaN
    (the sampled ``make mutate`` run of issue 27 left that mutant alive)."""
    z = torch.tensor([[[3e38, 0.0, -3e38]]], dtype=torch.float32)
    h = token_entropy(logits=z, response_mask=torch.ones(1, 1, dtype=torch.bool))
    assert h.tolist() == [[0.0]]
