"""Framework variants of the loss algebra: hand-computed values and gradients, exact
expectations, stop-gradients. Each identity is stated in docs/losses.md or docs/kl.md.

Hand batches put tokens on both sides of every bound so each truncated / gated / clipped
branch is reached.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given

from polgrad_reference import (
    ClipConfig,
    ConfigError,
    ISCorrection,
    KLConfig,
    KLEstimator,
    KLRatioWeight,
    PolicyLossConfig,
    categorical_kl,
    kl_estimate,
    policy_loss,
)
from tests.ragged import ragged

F64 = torch.float64


def _grad(cfg: PolicyLossConfig, batch: dict[str, torch.Tensor]) -> tuple[float, torch.Tensor]:
    lp = batch["logprobs"].clone().requires_grad_()
    out = policy_loss(cfg, **{**batch, "logprobs": lp})
    (g,) = torch.autograd.grad(out.loss, lp)
    return out.loss.item(), g


# ------------------------------------------------------------------ CISPO bounds

# One row, ratios 0.5, 1.5, 1.1, A = +1, log pi = -1.0, -0.5, -2.0; token-sum.
_LP = [-1.0, -0.5, -2.0]
_R = [0.5, 1.5, 1.1]


def _cispo_batch() -> dict[str, torch.Tensor]:
    lp = torch.tensor([_LP], dtype=F64)
    return {
        "logprobs": lp,
        "old_logprobs": lp - torch.log(torch.tensor([_R], dtype=F64)),
        "advantages": torch.tensor([1.0], dtype=F64),
        "response_mask": torch.ones(1, 3, dtype=torch.bool),
    }


@pytest.mark.parametrize(
    ("clip", "weights"),
    [
        # the paper's one-sided truncation (arXiv:2506.13585 Sec. 3.1)
        (ClipConfig(None, 0.28), [0.5, 1.28, 1.1]),
        # verl 0.9.1: clamp(r, 1 - eps_low, 1 + eps_high), both sides
        (ClipConfig(0.2, 0.28), [0.8, 1.28, 1.1]),
        # TRL 1.16.0: clamp(r, max=epsilon_high), the value is the cap itself
        (ClipConfig(None, 1.2, bounds="absolute"), [0.5, 1.2, 1.1]),
        # the same number read as a relative eps: cap 2.2, nothing truncated from above
        (ClipConfig(None, 1.2), [0.5, 1.5, 1.1]),
    ],
    ids=["paper", "verl-two-sided", "trl-absolute", "relative-1.2"],
)
def test_cispo_truncation_bounds_hand_values(clip: ClipConfig, weights: list[float]) -> None:
    cfg = PolicyLossConfig(surrogate="cispo", clip=clip, aggregation="token-sum")
    loss, grad = _grad(cfg, _cispo_batch())
    # loss = -sum_t w_t A log pi_t; the weight is detached, so d/d log pi_t = -w_t A.
    assert loss == pytest.approx(
        -sum(w * lp for w, lp in zip(weights, _LP, strict=True)), rel=1e-14
    )
    assert grad[0].tolist() == pytest.approx([-w for w in weights], rel=1e-14)


def test_absolute_bounds_validation_and_properties() -> None:
    clip = ClipConfig(0.5, 5.0, bounds="absolute")
    assert (clip.low, clip.high) == (0.5, 5.0)
    assert (ClipConfig(0.2, 0.28).low, ClipConfig(0.2, 0.28).high) == (0.8, 1.28)
    with pytest.raises(ConfigError, match=r"lower bound 3\.0 > upper bound 2\.0"):
        ClipConfig(3.0, 2.0, bounds="absolute")
    with pytest.raises(ConfigError, match="absolute upper bound\\) must be > 0"):
        ClipConfig(None, 0.0, bounds="absolute")
    with pytest.raises(ConfigError, match=r"dual_clip must exceed eps_high = 5\.0"):
        ClipConfig(None, 5.0, dual_clip=4.0, bounds="absolute")
    with pytest.raises(ConfigError, match="did you mean 'absolute'"):
        ClipConfig(bounds="Absolute ")


# ------------------------------------------------------------------ dual clip


@pytest.mark.parametrize("ratio", ["token", "sequence", "sequence_token"])
def test_dual_clip_caps_every_ratio_kind(ratio: str) -> None:
    # Two tokens with log-ratio ln 4 each: token and sequence ratios are all 4. A = -1,
    # c = 3: the loss max(4, 1.2) = 4 is capped at 3 and has no gradient.
    lp = torch.tensor([[-1.0, -2.0]], dtype=F64)
    batch = {
        "logprobs": lp,
        "old_logprobs": lp - math.log(4.0),
        "advantages": torch.tensor([-1.0], dtype=F64),
        "response_mask": torch.ones(1, 2, dtype=torch.bool),
    }
    dual = PolicyLossConfig(ratio=ratio, clip=ClipConfig(0.2, 0.2, dual_clip=3.0))
    loss, grad = _grad(dual, batch)
    assert loss == pytest.approx(3.0, rel=1e-14)
    assert torch.equal(grad, torch.zeros_like(grad))
    plain_loss, plain_grad = _grad(dual.replace(clip=ClipConfig(0.2, 0.2)), batch)
    assert plain_loss == pytest.approx(4.0, rel=1e-14) and bool((plain_grad != 0).any())


# ------------------------------------------------------------------ KL "+" variants


@pytest.mark.parametrize("est", ["k1+", "k3+", "abs+"])
@given(batch=ragged())
def test_straight_through_kl_has_base_value_and_k2_gradient_bitwise(
    est: str, batch: dict[str, torch.Tensor]
) -> None:
    plus = KLEstimator(est)
    args = {"ref_logprobs": batch["old_logprobs"], "response_mask": batch["response_mask"]}
    lp = batch["logprobs"].clone().requires_grad_()
    value = kl_estimate(plus, logprobs=lp, **args)
    base = kl_estimate(plus.base, logprobs=batch["logprobs"], **args)
    assert torch.equal(value.detach(), base)
    (g_plus,) = torch.autograd.grad(value.sum(), lp)
    lp2 = batch["logprobs"].clone().requires_grad_()
    (g_k2,) = torch.autograd.grad(kl_estimate("k2", logprobs=lp2, **args).sum(), lp2)
    assert torch.equal(g_plus, g_k2)
    lp3 = batch["logprobs"].clone().requires_grad_()
    (g_base,) = torch.autograd.grad(kl_estimate(plus.base, logprobs=lp3, **args).sum(), lp3)
    mask = batch["response_mask"]
    lr = (batch["old_logprobs"] - batch["logprobs"])[mask]
    if bool((lr.abs() > 1e-3).any()):  # the stop-gradient really changes the gradient
        assert not torch.equal(g_plus, g_base)


def test_straight_through_kl_hand_values_in_the_loss() -> None:
    # lr = ref - lp = ln 2: k3 = 1 - ln 2 (value); k2's gradient d/dlp (lr^2 / 2) = -lr.
    ln2 = math.log(2.0)
    batch = {
        "logprobs": torch.tensor([[-1.0]], dtype=F64),
        "old_logprobs": torch.tensor([[-1.0]], dtype=F64),
        "advantages": torch.tensor([0.0], dtype=F64),
        "response_mask": torch.tensor([[True]]),
        "ref_logprobs": torch.tensor([[-1.0 + ln2]], dtype=F64),
    }
    for est, grad in (("k3+", -ln2), ("k3", 1.0 - 2.0)):  # d k3/dlp = 1 - exp(lr) = -1
        cfg = PolicyLossConfig(aggregation="token-sum", kl=KLConfig(estimator=est, coef=1.0))
        loss, g = _grad(cfg, batch)
        assert loss == pytest.approx(1.0 - ln2, rel=1e-14)
        assert g.item() == pytest.approx(grad, rel=1e-14)


# ------------------------------------------------------------------ ratio-weighted KL


def _categorical(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple(1.2 * torch.randn(6, generator=g, dtype=F64) for _ in range(3))  # type: ignore[return-value]


def _expected_kl_term(
    theta: torch.Tensor, old: torch.Tensor, ref: torch.Tensor, kl: KLConfig
) -> torch.Tensor:
    """``E_{y ~ pi_old}[kl term(y)]``, summed exactly over the support of a categorical,
    each outcome a one-token row (advantages 0: only the KL term remains)."""
    lp = torch.log_softmax(theta, dim=-1)[:, None]
    old_lp = torch.log_softmax(old, dim=-1)[:, None]
    batch = {
        "logprobs": lp,
        "old_logprobs": old_lp,
        "advantages": torch.zeros(6, dtype=F64),
        "response_mask": torch.ones(6, 1, dtype=torch.bool),
        "ref_logprobs": torch.log_softmax(ref, dim=-1)[:, None],
    }
    out = policy_loss(PolicyLossConfig(aggregation="token-sum", kl=kl), **batch)
    assert out.kl is not None
    return (old_lp.exp()[:, 0] * out.kl[:, 0]).sum()


def _grad_theta(f: object, theta: torch.Tensor) -> torch.Tensor:
    x = theta.clone().requires_grad_()
    (g,) = torch.autograd.grad(f(x), x)  # type: ignore[operator]
    return g


@pytest.mark.parametrize("seed", range(4))
def test_ratio_weighted_k3_expectations_exactly(seed: int) -> None:
    """Samples from pi_old. ``r k3`` undetached (TRL's bias correction): expected value
    ``KL(pi || ref)`` and expected gradient ``grad KL(pi || ref)``. Detached ``sg(r) k3``:
    the same value, but the gradient of the forward ``KL(ref || pi)``. k3+ with the
    gradient-only weight (OpenRLHF): the reverse-KL gradient."""
    theta, old, ref = _categorical(seed)
    reverse = _grad_theta(lambda x: categorical_kl(p_logits=x, q_logits=ref), theta)
    forward = _grad_theta(lambda x: categorical_kl(p_logits=ref, q_logits=x), theta)
    kl_value = categorical_kl(p_logits=theta, q_logits=ref).item()

    def term(kl: KLConfig) -> object:
        return lambda x: _expected_kl_term(x, old, ref, kl)

    for weight in ("undetached", "detached"):
        cfg = KLConfig(estimator="k3", coef=1.0, ratio_weight=weight)
        assert _expected_kl_term(theta, old, ref, cfg).item() == pytest.approx(kl_value, rel=1e-12)
    undetached = _grad_theta(
        term(KLConfig(estimator="k3", coef=1.0, ratio_weight="undetached")), theta
    )
    detached = _grad_theta(term(KLConfig(estimator="k3", coef=1.0, ratio_weight="detached")), theta)
    grad_only = _grad_theta(
        term(KLConfig(estimator="k3+", coef=1.0, ratio_weight="gradient")), theta
    )
    unweighted = _grad_theta(term(KLConfig(estimator="k3", coef=1.0)), theta)
    assert torch.allclose(undetached, reverse, rtol=1e-10, atol=1e-13)
    assert torch.allclose(detached, forward, rtol=1e-10, atol=1e-13)
    assert torch.allclose(grad_only, reverse, rtol=1e-10, atol=1e-13)
    assert not torch.allclose(detached, reverse, rtol=1e-3)
    assert not torch.allclose(unweighted, reverse, rtol=1e-3)


def test_ratio_weighted_kl_hand_values_and_cap() -> None:
    # r = 2 (lp - old = ln 2), lr = ref - lp = ln 2: k3 = 1 - ln 2, d k3/dlp = -1,
    # d k2/dlp = -ln 2, d r/dlp = r.
    ln2 = math.log(2.0)
    batch = {
        "logprobs": torch.tensor([[-1.0]], dtype=F64),
        "old_logprobs": torch.tensor([[-1.0 - ln2]], dtype=F64),
        "advantages": torch.tensor([0.0], dtype=F64),
        "response_mask": torch.tensor([[True]]),
        "ref_logprobs": torch.tensor([[-1.0 + ln2]], dtype=F64),
    }
    k3 = 1.0 - ln2
    cases = {
        ("k3", "undetached", None): (2 * k3, 2 * -1.0 + 2 * k3),
        ("k3", "detached", None): (2 * k3, 2 * -1.0),
        ("k3", "detached", 1.5): (1.5 * k3, 1.5 * -1.0),
        ("k3+", "gradient", None): (k3, 2 * -ln2),
        ("k3+", "gradient", 1.5): (k3, 1.5 * -ln2),
    }
    for (est, weight, cap), (value, grad) in cases.items():
        kl = KLConfig(estimator=est, coef=1.0, ratio_weight=weight, ratio_cap=cap)
        loss, g = _grad(PolicyLossConfig(aggregation="token-sum", kl=kl), batch)
        assert loss == pytest.approx(value, rel=1e-14), (est, weight, cap)
        assert g.item() == pytest.approx(grad, rel=1e-14), (est, weight, cap)


def test_ratio_weight_validation() -> None:
    assert KLConfig(ratio_weight="undetached").ratio_weight is KLRatioWeight.UNDETACHED
    with pytest.raises(ConfigError, match="ratio_cap needs ratio_weight"):
        KLConfig(ratio_cap=10.0)
    with pytest.raises(ConfigError, match="not in the reward"):
        KLConfig(placement="reward", ratio_weight="detached")
    with pytest.raises(ConfigError, match=r"ratio_weight must be one of .*did you mean 'detached'"):
        KLConfig(ratio_weight="detach")


# ------------------------------------------------------------------ rollout IS modes


def _is_batch() -> dict[str, torch.Tensor]:
    """On-policy (r = 1), A = +1, pg surrogate: each token's loss is -w, its gradient -w/N.
    rho = pi_old / pi_rollout: row 0 (0.5, 1.5), row 1 (1.0, 3.0)."""
    lp = torch.tensor([[-1.0, -2.0], [-0.5, -1.5]], dtype=F64)
    rho = torch.tensor([[0.5, 1.5], [1.0, 3.0]], dtype=F64)
    return {
        "logprobs": lp,
        "old_logprobs": lp.clone(),
        "rollout_logprobs": lp - torch.log(rho),
        "advantages": torch.tensor([1.0, 1.0], dtype=F64),
        "response_mask": torch.ones(2, 2, dtype=torch.bool),
    }


_SQ3, _SQ75 = math.sqrt(3.0), math.sqrt(0.75)
IS_CASES = {
    # two-sided truncation (TRL *_truncate, OpenRLHF clip): clamp(rho, 0.8, 2)
    "truncate-two-sided": (ISCorrection(low=0.8, cap=2.0), [[0.8, 1.5], [1.0, 2.0]], 4),
    # masked IS / IcePop per token: out of [0.6, 2] -> weight 0, still counted
    "zero-token": (ISCorrection(mode="zero", low=0.6, high=2.0), [[0, 1.5], [1.0, 0]], 4),
    # rejection sampling per token: out-of-band tokens leave the denominator
    "mask-token": (ISCorrection(mode="mask", low=0.6, high=2.0), [[0, 1], [1, 0]], 2),
    # OpenRLHF mask at seq level: gate on the geometric mean (0.866, 1.732), weight per token
    "zero-geometric-token-weight": (
        ISCorrection(level="geometric", mode="zero", low=0.9, high=2.0, weight="token"),
        [[0, 0], [1.0, 3.0]],
        4,
    ),
    "zero-geometric-level-weight": (
        ISCorrection(level="geometric", mode="zero", low=0.9, high=2.0),
        [[0, 0], [_SQ3, _SQ3]],
        4,
    ),
    # TRL sequence_mask: product ratio (0.75, 3.0) gated to [0.5, 2], weight the product
    "zero-sequence": (
        ISCorrection(level="sequence", mode="zero", low=0.5, high=2.0),
        [[0.75, 0.75], [0, 0]],
        4,
    ),
    # geometric rejection sampling: whole rows whose geometric mean leaves [0.9, 2]
    "mask-geometric": (
        ISCorrection(level="geometric", mode="mask", low=0.9, high=2.0),
        [[0, 0], [1, 1]],
        2,
    ),
    "truncate-geometric": (
        ISCorrection(level="geometric", cap=1.5),
        [[_SQ75, _SQ75], [1.5, 1.5]],
        4,
    ),
}


@pytest.mark.parametrize("case", list(IS_CASES))
def test_rollout_is_modes_hand_values(case: str) -> None:
    corr, weights, denominator = IS_CASES[case]
    cfg = PolicyLossConfig(surrogate="pg", aggregation="token-mean", is_correction=corr)
    loss, grad = _grad(cfg, _is_batch())
    w = torch.tensor(weights, dtype=F64)
    assert loss == pytest.approx(-float(w.sum()) / denominator, rel=1e-14)
    assert torch.allclose(grad, -w / denominator, rtol=1e-14, atol=0)


def test_zero_mode_never_leaks_an_overflowing_weight() -> None:
    # Sequence product exp(800) overflows float64; the row is out of band -> weight 0.
    batch = _is_batch()
    batch["rollout_logprobs"] = batch["rollout_logprobs"] - torch.tensor([[400.0, 400.0], [0, 0]])
    cfg = PolicyLossConfig(
        surrogate="pg", is_correction=ISCorrection(level="sequence", mode="zero", high=4.0)
    )
    loss, grad = _grad(cfg, batch)
    assert math.isfinite(loss) and bool(torch.isfinite(grad).all())
    assert loss == pytest.approx(-(3.0 + 3.0) / 4, rel=1e-14)  # row 1: product 3 <= 4, kept


def test_is_correction_validation() -> None:
    assert ISCorrection(mode="mask", low=0.5).weight.value == "one"
    assert ISCorrection(mode="zero", low=0.5).weight.value == "level"
    with pytest.raises(ConfigError, match="mode='truncate' weights by the truncated rho"):
        ISCorrection(weight="token")
    with pytest.raises(ConfigError, match="low must be <= cap"):
        ISCorrection(low=3.0, cap=2.0)
    with pytest.raises(ConfigError, match="mode='zero' needs low, high or both"):
        ISCorrection(mode="zero")
    with pytest.raises(ConfigError, match=r"level must be one of .*did you mean 'geometric'"):
        ISCorrection(level="geometric_mean")
