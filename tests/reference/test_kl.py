"""KL estimators: exact expectations, k2's bias, gradients as a loss, padding, bad input.

Each identity here is stated and derived in docs/kl.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from decimal import Decimal, localcontext
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings

from polgrad_reference.aggregate import aggregate
from polgrad_reference.config import Aggregation, KLEstimator
from polgrad_reference.errors import ConfigError, InputError, InputTypeError, NumericalError
from polgrad_reference.kl import (
    categorical_kl,
    kl_estimate,
    kl_penalized_rewards,
    reverse_kl_surrogate,
)
from tests.helpers.ragged import build, ragged

F64 = torch.float64
NAN = float("nan")
ESTIMATORS = list(KLEstimator)
# The "+" estimators' gradient is not their value's derivative (tests/reference/test_variants.py).
SMOOTH = [e for e in KLEstimator if not e.straight_through]


def _t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=F64)


def _outcomes(p_logits: torch.Tensor, q_logits: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every outcome of a categorical as a ``[K, 1]`` batch, with its probability ``[K]``."""
    lp = torch.log_softmax(p_logits, dim=-1)
    return {
        "logprobs": lp[:, None],
        "ref_logprobs": torch.log_softmax(q_logits, dim=-1)[:, None],
        "response_mask": torch.ones(p_logits.shape[0], 1, dtype=torch.bool),
        "prob": lp.exp(),
    }


def _logits(seed: int, k: int = 6, scale: float = 1.5) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(k, generator=g, dtype=F64), scale * torch.randn(
        k, generator=g, dtype=F64
    )


def _expectation(est: KLEstimator, p_logits: torch.Tensor, q_logits: torch.Tensor) -> float:
    """``E_{y ~ p}[k(y)]`` by summing over the support, weighted by the probabilities."""
    o = _outcomes(p_logits, q_logits)
    k = kl_estimate(
        est,
        logprobs=o["logprobs"],
        ref_logprobs=o["ref_logprobs"],
        response_mask=o["response_mask"],
    )
    return float((o["prob"] * k[:, 0]).sum())


# ----------------------------------------------------------------------- values


def test_estimators_on_a_hand_case() -> None:
    # lr = ref - logprobs = ln 2, -ln 2, 0 (docs/kl.md, "Golden values").
    ln2 = math.log(2.0)
    lp = _t([[-1.0, -1.0, -0.5]])
    ref = _t([[-1.0 + ln2, -1.0 - ln2, -0.5]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    got = {
        e: kl_estimate(e, logprobs=lp, ref_logprobs=ref, response_mask=mask)[0].tolist()
        for e in ESTIMATORS
    }
    assert got[KLEstimator.K1] == pytest.approx([-ln2, ln2, 0.0], abs=1e-15)
    assert got[KLEstimator.K2] == pytest.approx([ln2**2 / 2, ln2**2 / 2, 0.0], abs=1e-15)
    assert got[KLEstimator.K3] == pytest.approx([1 - ln2, ln2 - 0.5, 0.0], abs=1e-15)


@pytest.mark.parametrize("est", [KLEstimator.K1, KLEstimator.K3], ids=lambda e: e.value)
@pytest.mark.parametrize("seed", range(5))
def test_k1_and_k3_expectations_equal_kl_exactly(est: KLEstimator, seed: int) -> None:
    p_logits, q_logits = _logits(seed)
    exact = categorical_kl(p_logits=p_logits, q_logits=q_logits).item()
    assert exact > 0.05
    assert _expectation(est, p_logits, q_logits) == pytest.approx(exact, rel=1e-13, abs=0)


def test_k2_bias_on_a_hand_bernoulli() -> None:
    # p = (1/2, 1/2), q = (1/4, 3/4): KL = ln(4/3)/2, E[k2] = ((ln 2)^2 + (ln 2/3)^2)/4.
    p_logits = torch.log(_t([[0.5, 0.5]]))[0]
    q_logits = torch.log(_t([[0.25, 0.75]]))[0]
    kl = 0.5 * math.log(4 / 3)
    e_k2 = (math.log(2) ** 2 + math.log(2 / 3) ** 2) / 4
    assert categorical_kl(p_logits=p_logits, q_logits=q_logits).item() == pytest.approx(kl)
    assert _expectation(KLEstimator.K2, p_logits, q_logits) == pytest.approx(e_k2, rel=1e-14)
    assert e_k2 - kl == pytest.approx(0.0173727057, rel=1e-8)  # biased upwards by 12%


@pytest.mark.parametrize("seed", range(3))
def test_k2_bias_is_third_order_with_the_predicted_coefficient(seed: int) -> None:
    # E[k2] - KL = E_p[l^3]/6 + O(delta^4), l = log p - log q = O(delta).
    p_logits, direction = _logits(seed)
    for delta, tol in ((1e-2, 5e-2), (1e-3, 5e-3)):
        q_logits = p_logits + delta * direction
        o = _outcomes(p_logits, q_logits)
        ell = (o["logprobs"] - o["ref_logprobs"])[:, 0]
        predicted = float((o["prob"] * ell**3).sum()) / 6
        bias = (
            _expectation(KLEstimator.K2, p_logits, q_logits)
            - categorical_kl(p_logits=p_logits, q_logits=q_logits).item()
        )
        assert bias / predicted == pytest.approx(1.0, abs=tol)


@pytest.mark.parametrize("lr", [1e-12, -3e-10, 1e-8, -1e-6, 2e-4, 0.3, -2.5, 5.0])
def test_k3_is_accurate_for_tiny_and_large_log_ratios(lr: float) -> None:
    # exp(lr) - 1 - lr computed naively loses everything below |lr| ~ 1e-8 (error ~ eps).
    lp = _t([[-1.0]])
    ref = _t([[lr - 1.0]])
    lr_used = float(ref - lp)  # the log-ratio the function forms (rounded once)
    with localcontext() as ctx:
        ctx.prec = 60
        exact = float(Decimal(lr_used).exp() - 1 - Decimal(lr_used))
    got = kl_estimate("k3", logprobs=lp, ref_logprobs=ref, response_mask=torch.ones(1, 1).bool())
    eps = torch.finfo(F64).eps
    assert abs(got.item() - exact) <= 2 * eps * (abs(lr_used) + exact)
    assert got.item() >= 0.0


# ----------------------------------------------------------------------- gradients


@pytest.mark.parametrize("mode", list(Aggregation), ids=lambda m: m.value)
@settings(max_examples=30)  # a bitwise identity per mode: a wrong k2 or surrogate gradient
# breaks it on nearly every ragged batch; 30 per mode x 5 modes instead of 500
@given(batch=ragged())
def test_k2_loss_gradient_equals_surrogate_gradient_bitwise(
    mode: Aggregation, batch: dict[str, torch.Tensor]
) -> None:
    budget = 16 if mode is Aggregation.TOKEN_SUM_NORM else None
    mask, ref = batch["response_mask"], batch["ref_logprobs"]
    grads = []
    for fn in (lambda **kw: kl_estimate("k2", **kw), reverse_kl_surrogate):
        lp = batch["logprobs"].clone().requires_grad_()
        per_token = fn(logprobs=lp, ref_logprobs=ref, response_mask=mask)
        loss = aggregate(per_token, response_mask=mask, mode=mode, budget=budget)
        grads.append(torch.autograd.grad(loss, lp)[0])
    assert torch.equal(grads[0], grads[1])
    assert bool(grads[0].isfinite().all())


def _softmax_policy(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    theta = torch.tensor([1.0, 0.0, -1.0, 0.5], dtype=F64) + 0.1 * torch.randn(
        4, generator=g, dtype=F64
    )
    return theta, torch.tensor([0.0, 1.0, 0.5, -1.0], dtype=F64)


def _per_sample_grads(
    loss_fn: Callable[..., torch.Tensor],
    theta: torch.Tensor,
    q_logits: torch.Tensor,
    samples: torch.Tensor,
) -> torch.Tensor:
    """Gradient of each sample's per-token loss w.r.t. the policy logits, ``[N, K]``."""
    rep = theta.expand(samples.shape[0], -1).clone().requires_grad_()
    lp = torch.log_softmax(rep, dim=-1).gather(1, samples[:, None])
    ref = torch.log_softmax(q_logits, dim=-1)[samples][:, None]
    mask = torch.ones_like(lp, dtype=torch.bool)
    loss = loss_fn(logprobs=lp, ref_logprobs=ref, response_mask=mask).sum()
    return torch.autograd.grad(loss, rep)[0]


def _grad_of(fn: Callable[[torch.Tensor], torch.Tensor], theta: torch.Tensor) -> torch.Tensor:
    x = theta.clone().requires_grad_()
    return torch.autograd.grad(fn(x), x)[0]


def _expected_grad(
    loss_fn: Callable[..., torch.Tensor], theta: torch.Tensor, q_logits: torch.Tensor
) -> torch.Tensor:
    """``E_{y ~ pi}[grad loss(y)]`` exactly: per-outcome gradients weighted by ``pi(y)``."""
    support = torch.arange(theta.shape[0])
    grads = _per_sample_grads(loss_fn, theta, q_logits, support)
    return torch.softmax(theta, dim=-1) @ grads


def _k(est: str) -> Callable[..., torch.Tensor]:
    return lambda **kw: kl_estimate(est, **kw)


@pytest.mark.parametrize("seed", range(3))
def test_expected_loss_gradients_exactly(seed: int) -> None:
    theta, q_logits = _softmax_policy(seed)
    p, q = torch.softmax(theta, -1), torch.softmax(q_logits, -1)
    reverse = _grad_of(lambda x: categorical_kl(p_logits=x, q_logits=q_logits), theta)
    forward = _grad_of(lambda x: categorical_kl(p_logits=q_logits, q_logits=x), theta)
    # docs/kl.md, "Gradients as a loss": k1 -> 0, k2 and surrogate -> grad KL(pi||ref),
    # k3 -> p - q = grad KL(ref||pi).
    assert torch.allclose(
        _expected_grad(_k("k1"), theta, q_logits), torch.zeros(4, dtype=F64), atol=1e-15
    )
    assert torch.allclose(_expected_grad(_k("k2"), theta, q_logits), reverse, rtol=0, atol=1e-14)
    assert torch.allclose(
        _expected_grad(reverse_kl_surrogate, theta, q_logits), reverse, atol=1e-14
    )
    assert torch.allclose(_expected_grad(_k("k3"), theta, q_logits), p - q, rtol=0, atol=1e-14)
    assert torch.allclose(forward, p - q, rtol=0, atol=1e-14)
    assert (reverse - forward).abs().max() > 0.1


def test_monte_carlo_k3_loss_gradient_is_not_grad_kl_but_surrogate_is() -> None:
    theta, q_logits = _softmax_policy(0)
    n = 20_000
    gen = torch.Generator().manual_seed(1234)
    samples = torch.multinomial(torch.softmax(theta, -1), n, replacement=True, generator=gen)
    target = _grad_of(lambda x: categorical_kl(p_logits=x, q_logits=q_logits), theta)

    def z_scores(loss_fn: Callable[..., torch.Tensor]) -> torch.Tensor:
        g = _per_sample_grads(loss_fn, theta, q_logits, samples)
        se = g.std(dim=0) / math.sqrt(n)
        return (g.mean(dim=0) - target).abs() / se

    # CLT: each component of the mean is within 5 standard errors (seeded, deterministic).
    assert z_scores(reverse_kl_surrogate).max() < 5.0
    # k3 as a loss converges to p - q instead: more than 10 standard errors away.
    assert z_scores(_k("k3")).max() > 10.0


def test_surrogate_value_and_gradient_formula() -> None:
    lp = _t([[-1.0, -2.0, NAN]]).requires_grad_()
    ref = _t([[-1.5, -1.0, NAN]])
    mask = torch.tensor([[True, True, False]])
    out = reverse_kl_surrogate(logprobs=lp, ref_logprobs=ref, response_mask=mask)
    # value sg(lp - ref) * lp = (0.5 * -1, -1 * -2, 0); gradient sg(lp - ref) = (0.5, -1, 0)
    assert out.tolist() == [[-0.5, 2.0, 0.0]]
    (grad,) = torch.autograd.grad(out.sum(), lp)
    assert grad.tolist() == [[0.5, -1.0, 0.0]]


@pytest.mark.parametrize("est", SMOOTH, ids=lambda e: e.value)
def test_gradcheck_estimators(est: KLEstimator) -> None:
    b = build([3, 1, 4], seed=3)
    lp = b["logprobs"].clone().requires_grad_()
    ref = b["ref_logprobs"].clone().requires_grad_()
    mask = b["response_mask"]
    assert torch.autograd.gradcheck(
        lambda x, y: kl_estimate(est, logprobs=x, ref_logprobs=y, response_mask=mask), (lp, ref)
    )


def test_gradcheck_penalized_rewards_and_categorical_kl() -> None:
    b = build([3, 1, 4], seed=4)
    mask = b["response_mask"]
    args = (
        b["logprobs"].clone().requires_grad_(),
        b["ref_logprobs"].clone().requires_grad_(),
        torch.randn(3, dtype=F64).requires_grad_(),
        torch.randn(3, 4, dtype=F64).requires_grad_(),
    )

    def f(lp: torch.Tensor, ref: torch.Tensor, r: torch.Tensor, tr: torch.Tensor) -> torch.Tensor:
        return kl_penalized_rewards(
            logprobs=lp,
            ref_logprobs=ref,
            response_mask=mask,
            coef=0.3,
            rewards=r,
            token_rewards=tr,
            estimator="k3",
        )

    assert torch.autograd.gradcheck(f, args)
    p, q = _logits(7)
    assert torch.autograd.gradcheck(
        lambda x, y: categorical_kl(p_logits=x, q_logits=y),
        (p.requires_grad_(), q.requires_grad_()),
    )


# ----------------------------------------------------------------------- padding


def _kl_functions() -> dict[str, Callable[..., torch.Tensor]]:
    fns: dict[str, Callable[..., torch.Tensor]] = {e.value: _k(e.value) for e in ESTIMATORS}
    fns["surrogate"] = reverse_kl_surrogate
    fns["penalized"] = lambda **kw: kl_penalized_rewards(
        **kw, coef=0.5, rewards=torch.ones(kw["logprobs"].shape[0], dtype=F64), estimator="k3"
    )
    return fns


@pytest.mark.parametrize("name", list(_kl_functions()))
def test_padding_is_exactly_zero_and_never_leaks(name: str) -> None:
    fn = _kl_functions()[name]
    b = build([2, 5, 1], seed=5, width=7)  # NaN at every padding position
    mask = b["response_mask"]
    lp = b["logprobs"].clone().requires_grad_()
    out = fn(logprobs=lp, ref_logprobs=b["ref_logprobs"], response_mask=mask)
    assert bool((out[~mask] == 0).all())
    (grad,) = torch.autograd.grad(out.sum(), lp)
    assert bool(grad.isfinite().all()) and bool((grad[~mask] == 0).all())
    other = torch.where(mask, b["logprobs"], 123.0)
    again = fn(
        logprobs=other, ref_logprobs=torch.where(mask, b["ref_logprobs"], -7.0), response_mask=mask
    )
    assert torch.equal(out.detach(), again)


def test_kl_estimate_allows_rows_without_tokens() -> None:
    # policy_loss passes masks whose rows the rollout-IS 'mask' mode has emptied.
    mask = torch.tensor([[True, False], [False, False]])
    out = kl_estimate(
        "k3",
        logprobs=_t([[-1.0, NAN], [NAN, NAN]]),
        ref_logprobs=_t([[-2.0, NAN], [NAN, NAN]]),
        response_mask=mask,
    )
    # lr = -1: k3 = exp(-1) - 1 + 1; every other position is padding.
    assert out[0, 0].item() == pytest.approx(math.exp(-1), rel=1e-15)
    assert out.flatten()[1:].tolist() == [0.0, 0.0, 0.0]


# ----------------------------------------------------------------------- reward placement


def test_penalized_rewards_hand_case() -> None:
    lp = _t([[-1.0, -2.0, NAN], [-0.5, NAN, NAN]])
    ref = _t([[-1.5, -1.0, NAN], [-0.75, NAN, NAN]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    out = kl_penalized_rewards(
        logprobs=lp,
        ref_logprobs=ref,
        response_mask=mask,
        coef=0.5,
        rewards=_t([[1.0, 2.0]])[0],
        token_rewards=_t([[0.25, 0.0, NAN], [0.0, NAN, NAN]]),
    )
    # k1 = lp - ref = (0.5, -1 | 0.25); r_t - 0.5 k1, reward at the last token.
    assert out.tolist() == [[0.25 - 0.25, 1.0 + 0.5, 0.0], [2.0 - 0.125, 0.0, 0.0]]


@given(batch=ragged())
def test_penalized_k1_row_sum_is_the_instructgpt_objective(batch: dict[str, torch.Tensor]) -> None:
    mask = batch["response_mask"]
    rewards = batch["advantages"]  # any [B] float tensor
    out = kl_penalized_rewards(
        logprobs=batch["logprobs"],
        ref_logprobs=batch["ref_logprobs"],
        response_mask=mask,
        coef=0.1,
        rewards=rewards,
    )
    seq_log_ratio = torch.where(mask, batch["logprobs"] - batch["ref_logprobs"], 0.0).sum(1)
    assert torch.allclose(out.sum(1), rewards - 0.1 * seq_log_ratio, rtol=1e-13, atol=1e-13)


def test_categorical_kl_hand_values() -> None:
    p = torch.log(_t([[0.5, 0.5], [0.2, 0.8]]))
    q = torch.log(_t([[0.25, 0.75], [0.2, 0.8]]))
    got = categorical_kl(p_logits=p, q_logits=q)
    assert got.tolist() == pytest.approx([0.5 * math.log(4 / 3), 0.0], abs=1e-15)


# ----------------------------------------------------------------------- bad input


def _valid() -> dict[str, Any]:
    mask = torch.tensor([[True, True, False], [True, False, False]])
    return {
        "logprobs": _t([[-1.0, -2.0, NAN], [-0.5, NAN, NAN]]),
        "ref_logprobs": _t([[-1.5, -1.0, NAN], [-0.7, NAN, NAN]]),
        "response_mask": mask,
    }


def _with(name: str, value: Any) -> dict[str, Any]:
    kw = _valid()
    kw[name] = value
    return kw


def _at(name: str, pos: tuple[int, int], value: float) -> dict[str, Any]:
    kw = _valid()
    kw[name] = kw[name].clone()
    kw[name][pos] = value
    return kw


BAD_INPUTS = {
    "numpy": (_with("logprobs", np.zeros((2, 3))), InputTypeError, "logprobs must be a torch"),
    "int": (
        _with("ref_logprobs", torch.zeros(2, 3, dtype=torch.long)),
        InputTypeError,
        "ref_logprobs must have a floating-point dtype",
    ),
    "float-mask": (
        _with("response_mask", torch.ones(2, 3)),
        InputTypeError,
        "response_mask must be a torch.bool",
    ),
    "1d-mask": (
        _with("response_mask", torch.ones(3, dtype=torch.bool)),
        InputError,
        "response_mask must be 2-D",
    ),
    "shape": (
        _with("ref_logprobs", torch.zeros(2, 4, dtype=F64)),
        InputError,
        r"ref_logprobs must have shape \[B, T\] like response_mask = \[2, 3\], got \[2, 4\]",
    ),
    "mixed-dtype": (
        _with("logprobs", torch.zeros(2, 3)),
        InputTypeError,
        "logprobs=torch.float32, ref_logprobs=torch.float64",
    ),
    "device": (
        _with("logprobs", torch.zeros(2, 3, dtype=F64, device="meta")),
        InputTypeError,
        "logprobs on meta",
    ),
    "nan": (
        _at("logprobs", (1, 0), NAN),
        InputError,
        r"logprobs holds NaN at response positions \(1, 0\)",
    ),
    "inf": (
        _at("ref_logprobs", (0, 1), math.inf),
        InputError,
        r"ref_logprobs holds inf at response positions \(0, 1\)",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
@pytest.mark.parametrize("name", ["k1", "k3", "surrogate", "penalized"])
def test_bad_tensors_raise_naming_the_argument(case: str, name: str) -> None:
    kwargs, error, words = BAD_INPUTS[case]
    with pytest.raises(error, match=words):
        _kl_functions()[name](**kwargs)


@pytest.mark.parametrize(
    ("changes", "error", "words"),
    [
        ({"estimator": "k4"}, ConfigError, "estimator must be one of 'k1', 'k2', 'k3'"),
        ({"coef": -0.1}, ConfigError, "coef must be >= 0"),
        ({"coef": NAN}, ConfigError, "coef must be finite"),
        ({"coef": "0.1"}, ConfigError, "coef must be a real number"),
        ({"rewards": None}, InputError, "pass rewards"),
        ({"rewards": torch.ones(3, dtype=F64)}, InputError, r"rewards must have shape \[B\]"),
        ({"rewards": _t([[1.0, NAN]])[0]}, InputError, r"rewards holds NaN at positions \(1\)"),
        ({"rewards": torch.ones(2)}, InputTypeError, "rewards=torch.float32"),
        ({"token_rewards": torch.ones(2, 3)}, InputTypeError, "token_rewards=torch.float32"),
        (
            {"token_rewards": _t([[1.0, NAN, 0], [0, 0, 0]])},
            InputError,
            r"token_rewards holds NaN at response positions \(0, 1\)",
        ),
        (
            {"response_mask": torch.tensor([[True, True, False], [False, False, False]])},
            InputError,
            r"response_mask has rows with no response token: rows \[1\]",
        ),
    ],
)
def test_penalized_rewards_bad_arguments(changes: dict[str, Any], error: type, words: str) -> None:
    kwargs = {**_valid(), "coef": 0.1, "rewards": torch.ones(2, dtype=F64), **changes}
    with pytest.raises(error, match=words):
        kl_penalized_rewards(**kwargs)


def test_kl_estimate_rejects_unknown_estimator() -> None:
    with pytest.raises(ConfigError, match="estimator"):
        kl_estimate("reverse", **_valid())


@pytest.mark.parametrize(
    ("est", "dtype", "lr"),
    [("k3", torch.float32, 100.0), ("k3", F64, 800.0), ("k2", torch.float16, 300.0)],
)
def test_overflow_raises_instead_of_returning_inf(est: str, dtype: torch.dtype, lr: float) -> None:
    lp = torch.tensor([[-1.0, -1.0]], dtype=dtype)
    ref = torch.tensor([[-1.0, lr - 1.0]], dtype=dtype)
    mask = torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(NumericalError, match=r"overflows .* at positions \(0, 1\)"):
        kl_estimate(est, logprobs=lp, ref_logprobs=ref, response_mask=mask)


@pytest.mark.parametrize(
    ("p", "q", "error", "words"),
    [
        (np.zeros(3), torch.zeros(3, dtype=F64), InputTypeError, "p_logits must be a torch"),
        (torch.zeros(3, dtype=F64), torch.zeros(4, dtype=F64), InputError, "q_logits must have"),
        (torch.zeros(3, dtype=F64), torch.zeros(3), InputTypeError, "q_logits=torch.float32"),
        (torch.zeros(3, dtype=torch.long), torch.zeros(3), InputTypeError, "p_logits must have a"),
        (torch.zeros(0, dtype=F64), torch.zeros(0, dtype=F64), InputError, "non-empty last"),
        (
            torch.tensor([0.0, NAN], dtype=F64),
            torch.zeros(2, dtype=F64),
            InputError,
            r"p_logits holds NaN at positions \(1\)",
        ),
    ],
)
def test_categorical_kl_bad_arguments(p: Any, q: Any, error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        categorical_kl(p_logits=p, q_logits=q)


def test_float64_overflow_message_does_not_advise_float64() -> None:
    lp = torch.tensor([[-1.0, -1.0]], dtype=F64)
    ref = torch.tensor([[-1.0, 799.0]], dtype=F64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(NumericalError) as info:
        kl_estimate("k3", logprobs=lp, ref_logprobs=ref, response_mask=mask)
    assert "compute in float64" not in str(info.value) and "709.78" in str(info.value)
