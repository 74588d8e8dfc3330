"""Framework variants of the loss algebra: hand-computed values and gradients, exact
expectations, stop-gradients. Each identity is stated in docs/losses.md or docs/kl.md.

Hand batches put tokens on both sides of every bound so each truncated / gated / clipped
branch is reached.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings

from polgrad_reference import (
    ALGORITHMS,
    ClipConfig,
    ConfigError,
    CovarianceSelection,
    DivergenceMask,
    GammaWeight,
    InputError,
    InputTypeError,
    ISCorrection,
    KLConfig,
    KLEstimator,
    KLRatioWeight,
    NumericalError,
    PolicyLossConfig,
    QuadraticPenalty,
    RatioKind,
    SoftGate,
    categorical_kl,
    covariance_selection,
    kink_ratios,
    kl_estimate,
    policy_loss,
)
from tests.helpers.ragged import build, ragged

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
@settings(max_examples=30)  # bitwise identities per estimator: a straight-through term
# that leaks its base gradient breaks them on nearly every ragged batch
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


# ------------------------------------------------------------------ new surrogates


def _row(lp: list[list[float]], lr: list[list[float]], adv: list[float]) -> dict[str, torch.Tensor]:
    """Full-mask batch with log pi ``lp`` and log-ratios ``lr = log pi - log pi_old``."""
    logprobs = torch.tensor(lp, dtype=F64)
    return {
        "logprobs": logprobs,
        "old_logprobs": logprobs - torch.tensor(lr, dtype=F64),
        "advantages": torch.tensor(adv, dtype=F64),
        "response_mask": torch.ones(logprobs.shape, dtype=torch.bool),
    }


def _sig(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def test_sapo_hand_values() -> None:
    # r = 2 with A = +1 (tau_pos = 1) and r = 0.5 with A = -1 (tau_neg = 1.05); token-sum.
    batch = _row([[-1.0], [-2.0]], [[math.log(2.0)], [math.log(0.5)]], [1.0, -1.0])
    cfg = PolicyLossConfig(surrogate="sapo", aggregation="token-sum", params=SoftGate())
    loss, grad = _grad(cfg, batch)
    s1, s2 = _sig(1.0), _sig(1.05 * -0.5)
    assert loss == pytest.approx(-4.0 * s1 + (4.0 / 1.05) * s2, rel=1e-14)
    # d/dlp of -(4/tau) sigmoid(tau (r - 1)) A = -4 sigmoid' * r * A
    want = [-4.0 * s1 * (1 - s1) * 2.0, 4.0 * s2 * (1 - s2) * 0.5]
    assert grad[:, 0].tolist() == pytest.approx(want, rel=1e-13)


def test_gmpo_hand_values_reach_both_log_space_clips() -> None:
    # lr = (0.5, -0.1), eps 0.4 in log space. A = +1: min(lr, clamp) = (0.4, -0.1), mean
    # 0.15: loss -e^0.15, token 0 clipped (no gradient), token 1 gradient -e^0.15 / 2.
    # A = -1: max(lr, clamp) = (0.5, -0.1), mean 0.2: loss e^0.2, both tokens e^0.2 / 2.
    cfg = PolicyLossConfig(
        surrogate="gmpo", clip=ClipConfig(0.4, 0.4), aggregation="seq-mean-token-mean"
    )
    for adv, value, grads in (
        (1.0, -math.exp(0.15), [0.0, -math.exp(0.15) / 2]),
        (-1.0, math.exp(0.2), [math.exp(0.2) / 2, math.exp(0.2) / 2]),
    ):
        loss, grad = _grad(cfg, _row([[-1.0, -2.0]], [[0.5, -0.1]], [adv]))
        assert loss == pytest.approx(value, rel=1e-14)
        assert grad[0].tolist() == pytest.approx(grads, rel=1e-14, abs=0.0)


def test_gmpo_needs_a_mean_over_sequences() -> None:
    with pytest.raises(ConfigError, match="needs aggregation='seq-mean-token-mean'"):
        PolicyLossConfig(surrogate="gmpo", aggregation="token-mean")
    with pytest.raises(ConfigError, match="defined with ratio='token' only"):
        PolicyLossConfig(surrogate="gmpo", ratio="sequence", aggregation="seq-mean-token-mean")


def _prob_row(p: list[float], p_old: list[float], adv: float) -> dict[str, torch.Tensor]:
    lp = [[math.log(x) for x in p]]
    return _row(lp, [[math.log(a) - math.log(b) for a, b in zip(p, p_old, strict=True)]], [adv])


def _binary_kl(p: float, q: float) -> float:
    """KL(Bernoulli(q) || Bernoulli(p)) with q = p_old, as DPPO's gate."""
    return q * math.log(q / p) + (1 - q) * math.log((1 - q) / (1 - p))


@pytest.mark.parametrize(
    ("kind", "p", "p_old", "adv", "valid"),
    [
        # TV: A > 0 keeps p - p_old <= 0.2; A <= 0 keeps p - p_old >= -0.2
        ("dppo_tv", [0.9, 0.6, 0.021], [0.5, 0.5, 0.001], 1.0, [False, True, True]),
        ("dppo_tv", [0.2, 0.45, 0.9], [0.5, 0.5, 0.5], -1.0, [False, True, True]),
        # binary KL: A > 0 keeps D <= 0.2 or p <= p_old; A <= 0 keeps D <= 0.2 or p >= p_old
        ("dppo_kl", [0.9, 0.55, 0.05], [0.5, 0.5, 0.5], 1.0, [False, True, True]),
        ("dppo_kl", [0.05, 0.45, 0.9], [0.5, 0.5, 0.5], -1.0, [False, True, True]),
    ],
)
def test_dppo_hand_values_reach_the_gate_and_the_cap(
    kind: str, p: list[float], p_old: list[float], adv: float, valid: list[bool]
) -> None:
    if kind == "dppo_kl":  # the expected gate, computed independently
        assert [
            _binary_kl(a, b) <= 0.2 or (a <= b if adv > 0 else a >= b)
            for a, b in zip(p, p_old, strict=True)
        ] == valid
    cfg = PolicyLossConfig(surrogate=kind, aggregation="token-sum", params=DivergenceMask())
    loss, grad = _grad(cfg, _prob_row(p, p_old, adv))
    w = [min(a / b, 20.0) if ok else 0.0 for a, b, ok in zip(p, p_old, valid, strict=True)]
    assert loss == pytest.approx(
        sum(-wi * adv * math.log(a) for wi, a in zip(w, p, strict=True)), rel=1e-13
    )
    assert grad[0].tolist() == pytest.approx([-wi * adv for wi in w], rel=1e-13, abs=0.0)
    if kind == "dppo_tv" and adv > 0:
        assert w[2] == 20.0  # r = 21 is truncated at the cap


def test_dro_hand_values() -> None:
    # -(A lp - beta/2 lr^2): lp = -1, lr = 0.3, A = 2, beta = 0.5 -> 2 + 0.0225; grad -2 + 0.15.
    cfg = PolicyLossConfig(
        surrogate="dro", aggregation="token-sum", params=QuadraticPenalty(beta=0.5)
    )
    loss, grad = _grad(cfg, _row([[-1.0]], [[0.3]], [2.0]))
    assert loss == pytest.approx(2.0 + 0.25 * 0.09, rel=1e-14)
    assert grad.item() == pytest.approx(-2.0 + 0.5 * 0.3, rel=1e-14)


def _phi(log_w: float, k: float, lam: float) -> float:
    return math.exp(lam + k * log_w - lam * math.exp(log_w))


@pytest.mark.parametrize("adv", [1.0, 0.0, -1.5])
def test_vespo_hand_values(adv: float) -> None:
    # one row, lr = (0.2, 0.3): w = e^0.5; (k, lambda) = (2, 3) for A >= 0, (3, 2) else.
    k, lam = (2.0, 3.0) if adv >= 0 else (3.0, 2.0)
    phi = _phi(0.5, k, lam)
    cfg = PolicyLossConfig(surrogate="vespo", aggregation="token-sum", params=GammaWeight())
    loss, grad = _grad(cfg, _row([[-1.0, -2.0]], [[0.2, 0.3]], [adv]))
    assert loss == pytest.approx(-phi * adv * -3.0, rel=1e-13, abs=1e-300)
    assert grad[0].tolist() == pytest.approx([-phi * adv] * 2, rel=1e-13, abs=0.0)
    assert _phi(0.0, k, lam) == pytest.approx(1.0, rel=1e-15)  # on-policy weight is 1


def test_vespo_overflowing_sequence_ratio_gives_zero_weight_not_nan() -> None:
    cfg = PolicyLossConfig(surrogate="vespo", aggregation="token-sum", params=GammaWeight())
    loss, grad = _grad(cfg, _row([[-1.0, -2.0]], [[400.0, 400.0]], [1.0]))
    assert loss == 0.0 and torch.equal(grad, torch.zeros_like(grad))


def test_bypass_sequence_weight_is_truncated_and_detached() -> None:
    # verl bypass_pg_is: w = sg(min(prod r, 2)); row 0 prod e^1 -> 2, row 1 prod e^-0.4.
    cfg = PolicyLossConfig(
        ratio="sequence_product",
        surrogate="cispo",
        clip=ClipConfig(None, 2.0, bounds="absolute"),
        aggregation="token-sum",
    )
    batch = _row([[-1.0, -2.0], [-0.5, -0.5]], [[0.5, 0.5], [-0.2, -0.2]], [1.0, 1.0])
    loss, grad = _grad(cfg, batch)
    w1 = math.exp(-0.4)
    assert loss == pytest.approx(2.0 * 3.0 + w1 * 1.0, rel=1e-14)
    want = torch.tensor([[-2.0, -2.0], [-w1, -w1]], dtype=F64)
    assert torch.allclose(grad, want, rtol=1e-14, atol=0)
    with pytest.raises(ConfigError, match="sequence_product' is defined with surrogate='cispo'"):
        PolicyLossConfig(ratio="sequence_product")


# ------------------------------------------------------------------ Clip-Cov / KL-Cov


def _cov_batch() -> dict[str, torch.Tensor]:
    # Two rows of three tokens; A = (+2, -2); ratios inside the clip range except (0, 2).
    lp = [[-0.2, -3.0, -0.1], [-2.5, -0.3, -4.0]]
    lr = [[0.05, -0.05, 0.5], [0.1, 0.0, -0.1]]
    return _row(lp, lr, [2.0, -2.0])


def _cov(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    adv = batch["advantages"][:, None].expand(2, 3)
    lp = batch["logprobs"]
    return (adv - adv.mean()) * (lp - lp.mean())


def test_kl_cov_selects_the_top_covariance_tokens_and_adds_the_penalty() -> None:
    batch = _cov_batch()
    params = CovarianceSelection(fraction=2 / 6, kl_coef=0.5)  # k = 2 of 6 tokens
    cfg = PolicyLossConfig(surrogate="kl_cov", aggregation="token-sum", params=params)
    cov = _cov(batch)
    top = torch.zeros(6, dtype=torch.bool)
    top[torch.argsort(cov.flatten(), descending=True)[:2]] = True
    sel = covariance_selection(cfg, **batch)
    assert torch.equal(sel, top.view(2, 3))
    loss, grad = _grad(cfg, batch)
    r = torch.exp(torch.tensor([[0.05, -0.05, 0.5], [0.1, 0.0, -0.1]], dtype=F64))
    adv = batch["advantages"][:, None]
    lr = torch.log(r)
    want = torch.where(sel, -adv * r + 0.5 * lr.abs(), -adv * r)
    assert loss == pytest.approx(float(want.sum()), rel=1e-14)
    want_grad = -adv * r + torch.where(sel, 0.5 * torch.sign(lr), 0.0)
    assert torch.allclose(grad, want_grad, rtol=1e-14, atol=0)


def test_clip_cov_zeroes_the_selected_tokens_value_and_gradient() -> None:
    batch = _cov_batch()
    cov = _cov(batch)
    # the window (low, high) around two of the unclipped tokens' covariances
    unclipped = torch.ones(2, 3, dtype=torch.bool)
    unclipped[0, 2] = False  # r = e^0.5 > 1.2 with A > 0: clipped already
    vals = sorted(float(c) for c in cov[unclipped])
    low, high = vals[-3] + 1e-9, vals[-1] + 1e-9  # the top two unclipped covariances
    many = CovarianceSelection(fraction=1.0, low=low, high=high)  # k = 6 >= 2 candidates
    cfg = PolicyLossConfig(surrogate="clip_cov", aggregation="token-sum", params=many)
    sel = covariance_selection(cfg, **batch)
    assert torch.equal(sel, unclipped & (cov > low) & (cov < high)) and int(sel.sum()) == 2
    loss, grad = _grad(cfg, batch)
    ppo = PolicyLossConfig(aggregation="token-sum")
    ppo_out = policy_loss(ppo, **batch)
    _, ppo_grad = _grad(ppo, batch)
    assert loss == pytest.approx(float(ppo_out.token_loss[~sel].sum()), rel=1e-14)
    assert torch.equal(grad, torch.where(sel, 0.0, ppo_grad))
    # one of two candidates (k = 1): a seeded draw, reproducible, overridable
    one = PolicyLossConfig(
        surrogate="clip_cov",
        aggregation="token-sum",
        params=CovarianceSelection(fraction=1e-6, low=low, high=high, seed=3),
    )
    drawn = covariance_selection(one, **batch)
    assert int(drawn.sum()) == 1 and bool((drawn & ~sel).sum() == 0)
    assert torch.equal(drawn, covariance_selection(one, **batch))
    other = sel & ~drawn
    explicit = policy_loss(one, **batch, token_selection=other).loss.item()
    assert explicit == pytest.approx(float(ppo_out.token_loss[~other].sum()), rel=1e-14)


def test_token_selection_is_validated() -> None:
    batch = _cov_batch()
    with pytest.raises(InputError, match="token_selection applies to surrogates"):
        policy_loss(
            PolicyLossConfig(), **batch, token_selection=torch.zeros(2, 3, dtype=torch.bool)
        )
    cfg = ALGORITHMS["kl_cov"].loss
    with pytest.raises(InputTypeError, match=r"token_selection must be a torch\.bool tensor"):
        policy_loss(cfg, **batch, token_selection=torch.zeros(2, 3))
    with pytest.raises(InputError, match=r"token_selection must have shape \[B, T\]"):
        policy_loss(cfg, **batch, token_selection=torch.zeros(2, 2, dtype=torch.bool))
    with pytest.raises(ConfigError, match="seed must be a non-negative integer"):
        CovarianceSelection(seed=-1)


# ------------------------------------------------------------------ every registry entry

DETACHED = ("bypass_pg", "cispo", "dppo_kl", "dppo_tv", "scalerl_cispo", "vespo")


def _coefficient(name: str, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The detached per-token coefficient ``c`` of ``-c A log pi``, computed here from its
    formula (not from the library)."""
    mask = batch["response_mask"]
    lr = torch.where(mask, batch["logprobs"] - batch["old_logprobs"], 0.0)
    r = torch.exp(lr)
    adv = batch["advantages"][:, None].expand_as(lr)
    if name == "cispo":
        return r.clamp(max=3.0)
    if name == "scalerl_cispo":
        return r.clamp(max=5.0)
    if name == "bypass_pg":
        return torch.exp(lr.sum(1, keepdim=True)).clamp(max=2.0).expand_as(lr)
    if name == "vespo":
        log_w = lr.sum(1, keepdim=True)
        k = torch.where(adv >= 0, 2.0, 3.0).to(F64)
        lam = torch.where(adv >= 0, 3.0, 2.0).to(F64)
        return torch.exp(lam + k * log_w - lam * torch.exp(log_w))
    p = torch.exp(torch.where(mask, batch["logprobs"], 0.0))
    q = torch.exp(torch.where(mask, batch["old_logprobs"], 0.0))
    if name == "dppo_tv":
        valid = torch.where(adv > 0, p - q <= 0.2, p - q >= -0.2)
    else:
        d = q * torch.log(q / p) + (1 - q) * torch.log((1 - q) / (1 - p))
        valid = torch.where(adv > 0, (d <= 0.2) | (p <= q), (d <= 0.2) | (p >= q))
    return torch.where(valid, r.clamp(max=20.0), 0.0)


@pytest.mark.parametrize("name", DETACHED)
@pytest.mark.parametrize(("seed", "gap"), [(0, 1.0), (1, 1.0), (2, 2.5)])
def test_detached_weight_losses_match_their_coefficients(name: str, seed: int, gap: float) -> None:
    """Value ``sum w (-c A log pi)`` and gradient ``-w c A`` with ``c`` frozen: the
    stop-gradient is where the docstring says, and the coefficient is the formula. The
    last batch reaches every formula's truncated / gated branch (asserted)."""
    keep = ("logprobs", "old_logprobs", "advantages", "response_mask")
    batch = {k: t for k, t in build([1, 3, 5], seed=seed, width=6, gap=gap).items() if k in keep}
    cfg = ALGORITHMS[name].loss
    out = policy_loss(cfg, **batch)
    c = _coefficient(name, batch)
    mask = batch["response_mask"]
    adv = batch["advantages"][:, None]
    lp0 = torch.where(mask, batch["logprobs"], 0.0)
    per_token = torch.where(mask, -c * adv * lp0, 0.0)
    assert out.loss.item() == pytest.approx(float((per_token * out.weights).sum()), rel=1e-12)
    _, grad = _grad(cfg, batch)
    want = torch.where(mask, -c * adv * out.weights, 0.0)
    assert torch.allclose(grad, want, rtol=1e-12, atol=1e-15)
    if gap > 2.0:
        lr = torch.where(mask, batch["logprobs"] - batch["old_logprobs"], 0.0)
        assert bool(((c - torch.exp(lr)).abs() > 1e-9)[mask].any())


# The claim is per entry: 25 ragged batches for each of the registry's entries (100 for
# each cost 8 s of the suite's CPU; the suite's profile draws the same batches every run).
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
@settings(max_examples=25)
@given(batch=ragged())
def test_every_entry_ignores_padding_and_is_finite(
    name: str, batch: dict[str, torch.Tensor]
) -> None:
    cfg = ALGORITHMS[name].loss
    lp = batch["logprobs"].clone().requires_grad_()
    out = policy_loss(cfg, **{**batch, "logprobs": lp})
    (grad,) = torch.autograd.grad(out.loss, lp)
    mask = batch["response_mask"]
    assert bool(torch.isfinite(out.loss)) and bool(torch.isfinite(grad).all())
    assert bool((grad[~mask] == 0).all())
    other = {
        k: (torch.where(mask, t, 7.0) if t.dim() == 2 and t.is_floating_point() else t)
        for k, t in batch.items()
    }
    assert torch.equal(policy_loss(cfg, **other).loss, out.loss.detach())


ON_POLICY_AS_REINFORCE = sorted(
    n for n, spec in ALGORITHMS.items() if spec.loss.on_policy_is_policy_gradient
)


def test_only_clip_cov_departs_from_the_policy_gradient_on_policy() -> None:
    assert set(ALGORITHMS) - set(ON_POLICY_AS_REINFORCE) == {"clip_cov"}
    batch = build([1, 3, 5], seed=7, width=6, gap=0.3)
    lp = torch.where(batch["response_mask"], batch["logprobs"], -1.0)
    batch = {**batch, "logprobs": lp, "old_logprobs": lp.clone()}
    # a window that holds candidates on this batch, all selected (fraction 1)
    cfg = PolicyLossConfig(
        surrogate="clip_cov", params=CovarianceSelection(fraction=1.0, low=-10.0, high=10.0)
    )
    assert not cfg.on_policy_is_policy_gradient and cfg.couples_rows
    _, g = _grad(cfg, batch)
    _, want = _grad(PolicyLossConfig(surrogate="reinforce"), batch)
    assert not torch.allclose(g, want)


def test_replace_drops_params_the_new_surrogate_does_not_take() -> None:
    sapo = ALGORITHMS["sapo"].loss
    assert sapo.replace(surrogate="reinforce").params is None
    assert sapo.replace(surrogate="sapo", ratio="sequence").params == SoftGate()
    with pytest.raises(ConfigError, match=r"needs params=GammaWeight\(\.\.\.\)"):
        sapo.replace(surrogate="vespo")
    with pytest.raises(ConfigError, match="takes no params"):
        PolicyLossConfig(params=SoftGate())


@pytest.mark.parametrize("name", ON_POLICY_AS_REINFORCE)
def test_on_policy_gradient_is_the_policy_gradient(name: str) -> None:
    """At ``old = logprobs`` (and ``rollout = old``) each entry's policy gradient is
    REINFORCE's with the same aggregation: every gate, clip and weight is 1 there. Clip-Cov
    is the exception: it removes the selected tokens."""
    batch = build([1, 3, 5], seed=7, width=6, gap=0.3)
    mask = batch["response_mask"]
    lp = torch.where(mask, batch["logprobs"], -1.0)
    batch = {**batch, "logprobs": lp, "old_logprobs": lp.clone(), "rollout_logprobs": lp.clone()}
    cfg = ALGORITHMS[name].loss.replace(kl=None)
    reinforce = PolicyLossConfig(
        surrogate="reinforce", aggregation=cfg.aggregation, budget=cfg.budget
    )
    _, g = _grad(cfg, batch)
    _, want = _grad(reinforce, batch)
    assert torch.allclose(g, want, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_low_precision_inputs_agree_with_float64_of_the_same_values(
    name: str, dtype: torch.dtype
) -> None:
    """Computing in float32 (or from bfloat16 inputs) gives the float64 answer for the very
    same (rounded) input values, within the dtype's rounding of the loss's magnitude."""
    batch = build([2, 4, 7], seed=11, width=8, gap=0.3)
    low = {k: (t.to(dtype) if t.is_floating_point() else t) for k, t in batch.items()}
    exact = {k: (t.to(F64) if t.is_floating_point() else t) for k, t in low.items()}
    cfg = ALGORITHMS[name].loss
    got, g_low = _grad(cfg, low)
    want, g = _grad(cfg, exact)
    eps = torch.finfo(dtype).eps
    token_loss = policy_loss(cfg, **exact).token_loss
    scale = 1.0 + float(token_loss[exact["response_mask"]].abs().max())
    assert abs(got - want) <= 64 * eps * scale
    assert torch.allclose(g_low.to(F64), g, rtol=64 * eps, atol=64 * eps * float(g.abs().max()))


def test_cispo_with_the_sequence_ratio_trl_sequence_level() -> None:
    # TRL 1.16.0 cispo with importance_sampling_level="sequence": w = sg(min(s_b, cap)),
    # s_b = exp(mean_t lr). Row lr = (0.3, 0.5): s = e^0.4 = 1.4918 capped at 1.2 (absolute).
    cfg = PolicyLossConfig(
        ratio="sequence",
        surrogate="cispo",
        clip=ClipConfig(None, 1.2, bounds="absolute"),
        aggregation="token-sum",
    )
    loss, grad = _grad(
        cfg, _row([[-1.0, -2.0], [-0.5, -0.5]], [[0.3, 0.5], [0.1, -0.1]], [1.0, 1.0])
    )
    assert loss == pytest.approx(1.2 * 3.0 + 1.0 * 1.0, rel=1e-14)
    assert torch.allclose(grad, torch.tensor([[-1.2, -1.2], [-1.0, -1.0]], dtype=F64), rtol=1e-14)
    with pytest.raises(ConfigError, match="ratio='token', 'sequence' or 'sequence_product' only"):
        PolicyLossConfig(ratio="sequence_token", surrogate="cispo")


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_kink_ratios_are_where_the_gradient_jumps(name: str) -> None:
    """Token ratios a hair either side of each kink the reference names give different
    gradients; a hair either side of 1.3 (a point no entry names) gives the same (within
    rounding). Token-ratio entries only; the sequence kinds share the values per row."""
    cfg = ALGORITHMS[name].loss.replace(kl=None, is_correction=None)
    if cfg.ratio is not RatioKind.TOKEN:
        cfg = cfg.replace(ratio="token")
    kinks = kink_ratios(cfg)
    for adv in (1.0, -1.0):

        def grad_at(r: float, adv: float = adv) -> float:
            batch = _row([[-0.7]], [[math.log(r)]], [adv])
            if cfg.needs_selection:  # select the token, so the kl_cov penalty is live
                return _grad_sel(cfg, batch)
            return _grad(cfg, batch)[1].item()

        for k in kinks:
            jumps = abs(grad_at(k * (1 + 1e-7)) - grad_at(k * (1 - 1e-7))) > 1e-4
            assert jumps or _one_sided(cfg, k, adv), (name, k, adv)
        assert abs(grad_at(1.3 * (1 + 1e-7)) - grad_at(1.3 * (1 - 1e-7))) < 1e-5 or any(
            abs(k - 1.3) < 1e-3 for k in kinks
        )


def _grad_sel(cfg: PolicyLossConfig, batch: dict[str, torch.Tensor]) -> float:
    lp = batch["logprobs"].clone().requires_grad_()
    sel = torch.ones_like(batch["response_mask"])
    out = policy_loss(cfg, **{**batch, "logprobs": lp}, token_selection=sel)
    (g,) = torch.autograd.grad(out.loss, lp)
    return g.item()


def _one_sided(cfg: PolicyLossConfig, k: float, adv: float) -> bool:
    """A PPO-style bound acts on one advantage sign only (upper for A > 0, lower and dual
    for A < 0); CISPO's truncated weight is continuous (its gradient -min(r, c) A does not
    jump); and a selected Clip-Cov token has no gradient on either side."""
    clip = cfg.clip
    if cfg.surrogate.value in ("cispo", "clip_cov"):
        return True
    if cfg.surrogate.value == "gmpo":
        return (adv > 0 and k < 1.0) or (adv < 0 and k > 1.0)
    if adv > 0:
        return k != clip.high
    return k == clip.high


NO_RATIO_IN_GRAPH = [
    "cispo",
    "dppo_kl",
    "dppo_tv",
    "dro",
    "gmpo",
    "gpg",
    "rloo",
    "scalerl_cispo",
    "vespo",
]


@pytest.mark.parametrize("name", NO_RATIO_IN_GRAPH)
def test_an_overflowing_ratio_is_no_error_where_the_loss_never_differentiates_it(name: str) -> None:
    """float32, log-ratio 100: exp overflows, but these surrogates read log-ratios or a
    detached truncation, so loss and gradient are finite and no error is raised (a false
    alarm otherwise). PPO-clip, whose gradient would be NaN, still raises
    (tests/reference/test_validation.py::test_ratio_overflow_is_reported_not_returned)."""
    lp = torch.tensor([[-0.5, -1.0]])
    batch = {
        "logprobs": lp,
        "old_logprobs": torch.tensor([[-0.5, -101.0]]),
        "advantages": torch.tensor([1.0]),
        "response_mask": torch.ones(1, 2, dtype=torch.bool),
    }
    cfg = ALGORITHMS[name].loss
    loss, grad = _grad(cfg, batch)
    assert math.isfinite(loss) and bool(torch.isfinite(grad).all())
    with pytest.raises(NumericalError, match=r"overflows torch\.float32"):
        policy_loss(PolicyLossConfig(), **batch)
