"""policy_loss: hand-derived goldens, identities between surrogates, gradchecks.

The golden arithmetic is written out in docs/losses.md.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from polgrad_reference import (
    ALGORITHMS,
    Aggregation,
    ClipConfig,
    ISCorrection,
    PolicyLossConfig,
    RatioKind,
    SurrogateKind,
    clip_region,
    policy_loss,
)
from tests.helpers.ragged import build, ragged

F64 = torch.float64


def golden_batch() -> dict[str, torch.Tensor]:
    """Row 0: one token, ratio 1.5, A = +1. Row 1: ratios (1.0, 0.5), A = -2."""
    old = torch.tensor([[-1.0, float("nan")], [-1.0, -1.0]], dtype=F64)
    log_r = torch.tensor([[math.log(1.5), 0.0], [0.0, math.log(0.5)]], dtype=F64)
    return {
        "logprobs": old + log_r,
        "old_logprobs": old,
        "advantages": torch.tensor([1.0, -2.0], dtype=F64),
        "response_mask": torch.tensor([[True, False], [True, True]]),
    }


def loss_and_grad(cfg: PolicyLossConfig, batch: dict) -> tuple[float, torch.Tensor]:
    lp = batch["logprobs"].clone().requires_grad_()
    out = policy_loss(cfg, **{**batch, "logprobs": lp})
    (grad,) = torch.autograd.grad(out.loss, lp)
    return out.loss.item(), grad


# Per-token losses of the golden batch with clip 0.2: -1.2 (clipped), 2.0 (r = 1), 1.6
# (clipped at 0.8); only token (1, 0) has a non-zero gradient, d/dlp = -A r = 2.
GOLDEN = {
    "token-mean": (2.4 / 3, 2.0 / 3),
    "seq-mean-token-mean": (0.3, 2.0 / 4),
    "seq-mean-token-sum": (1.2, 2.0 / 2),
    "token-sum": (2.4, 2.0),
    "token-sum-norm": (0.3, 2.0 / 8),
}


@pytest.mark.parametrize("mode", list(GOLDEN))
def test_pg_clip_golden(mode: str) -> None:
    budget = 4 if mode == "token-sum-norm" else None
    cfg = PolicyLossConfig(aggregation=mode, budget=budget)
    loss, grad = loss_and_grad(cfg, golden_batch())
    expect_loss, expect_grad = GOLDEN[mode]
    assert loss == pytest.approx(expect_loss, rel=1e-15)
    want = torch.zeros(2, 2, dtype=F64)
    want[1, 0] = expect_grad
    assert torch.allclose(grad, want, rtol=1e-15, atol=0)


def test_dual_clip_golden() -> None:
    # r = 4, A = -1, c = 3: max(4, 1.2) = 4 is capped at 3; the gradient is zero.
    batch = {
        "logprobs": torch.zeros(1, 1, dtype=F64),  # log-probabilities are <= 0
        "old_logprobs": torch.tensor([[-math.log(4.0)]], dtype=F64),
        "advantages": torch.tensor([-1.0], dtype=F64),
        "response_mask": torch.tensor([[True]]),
    }
    cfg = PolicyLossConfig(clip=ClipConfig(0.2, 0.2, dual_clip=3.0))
    loss, grad = loss_and_grad(cfg, batch)
    assert loss == pytest.approx(3.0, rel=1e-15)
    assert grad.item() == 0.0
    loss_plain, grad_plain = loss_and_grad(PolicyLossConfig(), batch)
    assert loss_plain == pytest.approx(4.0, rel=1e-15) and grad_plain.item() != 0.0


def test_cispo_golden() -> None:
    # r = 1.5 truncated to 1.2, A = 1, log pi = -0.5: loss = -1.2 * 1 * -0.5 = 0.6, grad -1.2.
    batch = {
        "logprobs": torch.tensor([[-0.5]], dtype=F64),
        "old_logprobs": torch.tensor([[-0.5 - math.log(1.5)]], dtype=F64),
        "advantages": torch.tensor([1.0], dtype=F64),
        "response_mask": torch.tensor([[True]]),
    }
    cfg = PolicyLossConfig(surrogate="cispo", clip=ClipConfig(None, 0.2))
    loss, grad = loss_and_grad(cfg, batch)
    assert loss == pytest.approx(0.6, rel=1e-15)
    assert grad.item() == pytest.approx(-1.2, rel=1e-15)


# The framework variants agree to rounding only (tests/reference/test_variants.py).
ON_POLICY_BITWISE = [
    SurrogateKind.PG_CLIP,
    SurrogateKind.PG,
    SurrogateKind.REINFORCE,
    SurrogateKind.CISPO,
]


@pytest.mark.parametrize("mode", list(Aggregation), ids=lambda m: m.value)
@settings(max_examples=30)  # a bitwise identity per mode: any wrong branch breaks it on
# nearly every ragged batch; 30 per mode x 5 modes instead of 500
@given(batch=ragged())
def test_on_policy_pg_clip_pg_reinforce_cispo_gradients_coincide_bitwise(
    mode: Aggregation, batch: dict
) -> None:
    batch = {**batch, "old_logprobs": batch["logprobs"].clone()}
    budget = 32 if mode is Aggregation.TOKEN_SUM_NORM else None
    grads = []
    for kind in ON_POLICY_BITWISE:
        cfg = PolicyLossConfig(surrogate=kind, aggregation=mode, budget=budget)
        grads.append(loss_and_grad(cfg, batch)[1])
    for g in grads[1:]:
        assert torch.equal(g, grads[0])


@given(batch=ragged())
def test_gspo_token_value_equals_gspo_and_gradients_agree_for_sequence_advantages(
    batch: dict,
) -> None:
    gspo, token = ALGORITHMS["gspo"].loss, ALGORITHMS["gspo_token"].loss
    seq_out = policy_loss(gspo, **batch)
    tok_out = policy_loss(token, **batch)
    assert torch.equal(seq_out.loss, tok_out.loss)
    assert torch.equal(seq_out.ratio, tok_out.ratio)
    _, grad_s = loss_and_grad(gspo, batch)
    _, grad_t = loss_and_grad(token, batch)
    assert torch.allclose(grad_s, grad_t, rtol=1e-12, atol=1e-15)


def test_gspo_token_gradient_is_token_local() -> None:
    batch = build([3, 2], seed=3, gap=1e-4)
    mask = batch["response_mask"]
    per_token_adv = torch.tensor([[1.0, -2.0, 3.0], [0.5, 4.0, 0.0]], dtype=F64)
    batch = {**batch, "advantages": per_token_adv}
    cfg = ALGORITHMS["gspo_token"].loss.replace(clip=ClipConfig(None, None))
    _, grad = loss_and_grad(cfg, batch)
    s = policy_loss(cfg, **batch).ratio
    weights = policy_loss(cfg, **batch).weights
    # d/dlp[b,t] of sum_t w (-A_t s_b) with token-local gradient is -w A_t s_b.
    want = torch.where(mask, -weights * per_token_adv * s, 0.0)
    assert torch.allclose(grad, want, rtol=1e-13, atol=0)
    _, grad_seq = loss_and_grad(ALGORITHMS["gspo"].loss.replace(clip=ClipConfig(None, None)), batch)
    assert not torch.allclose(grad_seq, grad)


@given(batch=ragged(), dual=st.sampled_from([None, 2.0, 3.0]))
def test_clip_region_equals_autograd_zero_tokens(batch: dict, dual: float | None) -> None:
    batch = build(
        [int(n) for n in batch["response_mask"].sum(1)],
        seed=int(batch["advantages"].numel()),
        gap=1.6,
    )
    cfg = PolicyLossConfig(aggregation="token-sum", clip=ClipConfig(0.2, 0.28, dual_clip=dual))
    out = policy_loss(cfg, **batch)
    _, grad = loss_and_grad(cfg, batch)
    mask = batch["response_mask"]
    adv = batch["advantages"][:, None].expand_as(mask)
    region = clip_region(ratio=out.ratio, advantages=adv, clip=cfg.clip)
    assert torch.equal(region & mask, (grad == 0) & mask & (adv != 0))


STOP_GRADIENT = {"cispo", "gspo_token"}  # checked by test_stop_gradient_losses_match_sg_free_forms
# detached-weight surrogates of the framework modes: tests/reference/test_variants.py
# (test_detached_weight_losses_match_their_coefficients)
DETACHED_WEIGHT = {"bypass_pg", "dppo_kl", "dppo_tv", "scalerl_cispo", "vespo"}
_DETACHED_KINDS = {
    SurrogateKind.CISPO,
    SurrogateKind.DPPO_TV,
    SurrogateKind.DPPO_KL,
    SurrogateKind.VESPO,
}


def test_stop_gradient_set_is_complete() -> None:
    sg = {
        n
        for n, s in ALGORITHMS.items()
        if s.loss.ratio is RatioKind.SEQUENCE_TOKEN or s.loss.surrogate in _DETACHED_KINDS
    }
    assert sg == STOP_GRADIENT | DETACHED_WEIGHT


@pytest.mark.parametrize("name", sorted(set(ALGORITHMS) - STOP_GRADIENT - DETACHED_WEIGHT))
def test_gradcheck_fp64_every_algorithm(name: str) -> None:
    cfg = ALGORITHMS[name].loss
    batch = build([1, 3, 5], seed=11, width=6, gap=0.4)
    frozen = {k: t for k, t in batch.items() if k != "logprobs"}

    def f(lp: torch.Tensor) -> torch.Tensor:
        return policy_loss(cfg, logprobs=lp, **frozen).loss

    lp = torch.where(batch["response_mask"], batch["logprobs"], -1.0).requires_grad_()
    assert torch.autograd.gradcheck(f, (lp,), eps=1e-6, atol=1e-9, rtol=1e-7)


@pytest.mark.parametrize("name", sorted(STOP_GRADIENT))
def test_stop_gradient_losses_match_sg_free_forms(name: str) -> None:
    """Freeze the stop-gradient factor at lp0 into a constant: the resulting sg-free
    function passes gradcheck, and its gradient at lp0 equals the sg loss's gradient."""
    cfg = ALGORITHMS[name].loss
    batch = build([1, 3, 5], seed=5, width=6, gap=0.4 if name == "cispo" else 2e-4)
    mask = batch["response_mask"]
    lp0 = torch.where(mask, batch["logprobs"], -1.0)
    out0 = policy_loss(cfg, **{**batch, "logprobs": lp0})
    adv = batch["advantages"][:, None]
    w = out0.weights
    if name == "cispo":
        c = out0.ratio.clamp(max=cfg.clip.high)

        def sg_free(lp: torch.Tensor) -> torch.Tensor:
            return (torch.where(mask, -(c * adv) * lp, 0.0) * w).sum()
    else:
        s = out0.ratio.detach()
        lo, hi = cfg.clip.low, cfg.clip.high

        def sg_free(lp: torch.Tensor) -> torch.Tensor:
            r = s * torch.exp(lp - lp0)
            per_tok = torch.maximum(-adv * r, -adv * r.clamp(lo, hi))
            return (torch.where(mask, per_tok, 0.0) * w).sum()

    x = lp0.clone().requires_grad_()
    assert torch.autograd.gradcheck(sg_free, (x,), eps=1e-6, atol=1e-9, rtol=1e-7)
    (want,) = torch.autograd.grad(sg_free(x), x)
    _, got = loss_and_grad(cfg, {**batch, "logprobs": lp0})
    assert torch.allclose(got, want, rtol=1e-13, atol=1e-16)


def test_truncated_is_weight_is_detached_and_capped() -> None:
    batch = build([2, 3], seed=2, gap=1.0)
    base = PolicyLossConfig(aggregation="token-sum")
    tis = base.replace(is_correction=ISCorrection(cap=1.1))
    _, g0 = loss_and_grad(base, batch)
    _, g1 = loss_and_grad(tis, batch)
    mask = batch["response_mask"]
    rho = torch.exp(torch.where(mask, batch["old_logprobs"] - batch["rollout_logprobs"], 0.0))
    assert torch.allclose(g1, g0 * rho.clamp(max=1.1), rtol=1e-14, atol=0)
    seq = base.replace(is_correction=ISCorrection(level="sequence", cap=1e9))
    _, g2 = loss_and_grad(seq, batch)
    assert torch.allclose(g2, g0 * rho.prod(dim=1, keepdim=True), rtol=1e-12, atol=0)


def test_masked_is_drops_tokens_from_the_denominator() -> None:
    batch = build([2, 3], seed=2, gap=1.0)
    cfg = PolicyLossConfig(is_correction=ISCorrection(mode="mask", low=0.9, high=1.1))
    out = policy_loss(cfg, **batch)
    mask = batch["response_mask"]
    rho = torch.exp(torch.where(mask, batch["old_logprobs"] - batch["rollout_logprobs"], 0.0))
    keep = mask & (rho >= 0.9) & (rho <= 1.1)
    assert torch.equal(out.response_mask, keep)
    plain = (
        policy_loss(PolicyLossConfig(), **{**batch, "response_mask": keep})
        if keep.any(1).all()
        else None
    )
    if plain is not None:
        assert torch.allclose(out.loss, plain.loss, rtol=1e-15)
    everything = PolicyLossConfig(is_correction=ISCorrection(mode="mask", low=1e6))
    assert policy_loss(everything, **batch).loss.item() == 0.0
