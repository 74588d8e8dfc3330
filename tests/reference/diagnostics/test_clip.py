"""Clip report (docs/diagnostics.md, "Clip report").

The killed set equals autograd's zero set of ``policy_loss`` for token, sequence and
sequence-token ratios with and without dual clip, [B] and [B, T] advantages. Calibration:
with log-ratios i.i.d. N(0, sigma^2) and A = +-1 with probability 1/2, the high-clip
fraction is 0.5 (1 - Phi(log(1 + eps_high) / sigma)) and the low-clip fraction
0.5 Phi(log(1 - eps_low) / sigma); tolerance 4 binomial standard errors.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import pytest
import torch

from polgrad_reference import (
    Aggregation,
    ClipConfig,
    PolicyLossConfig,
    RatioKind,
    SurrogateKind,
    policy_loss,
)
from polgrad_reference.diagnostics import clip_report
from polgrad_reference.errors import ConfigError, InputError, InputTypeError

CONFIGS = {
    "token": PolicyLossConfig(ratio=RatioKind.TOKEN, clip=ClipConfig(eps_low=0.2, eps_high=0.28)),
    "token-dual": PolicyLossConfig(
        ratio=RatioKind.TOKEN, clip=ClipConfig(eps_low=0.2, eps_high=0.2, dual_clip=1.6)
    ),
    "sequence": PolicyLossConfig(
        ratio=RatioKind.SEQUENCE, clip=ClipConfig(eps_low=0.1, eps_high=0.1)
    ),
    "sequence-dual": PolicyLossConfig(
        ratio=RatioKind.SEQUENCE, clip=ClipConfig(eps_low=0.1, eps_high=0.1, dual_clip=1.3)
    ),
    "sequence_token": PolicyLossConfig(
        ratio=RatioKind.SEQUENCE_TOKEN, clip=ClipConfig(eps_low=0.1, eps_high=0.1)
    ),
    "sequence_token-dual": PolicyLossConfig(
        ratio=RatioKind.SEQUENCE_TOKEN,
        clip=ClipConfig(eps_low=0.1, eps_high=0.1, dual_clip=1.3),
        aggregation=Aggregation.SEQ_MEAN_TOKEN_MEAN,
    ),
}


def _batch(
    seed: int, *, token_adv: bool, b: int = 24, t: int = 12
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.arange(t)[None] < torch.randint(1, t + 1, (b, 1), generator=g)
    lp = -2.0 * torch.rand((b, t), generator=g, dtype=torch.float64)
    # per-row offsets drive some sequence ratios past each bound, token noise the rest
    shift = 0.5 * torch.randn((b, 1), generator=g, dtype=torch.float64)
    old = lp + shift + 0.3 * torch.randn((b, t), generator=g, dtype=torch.float64)
    shape = (b, t) if token_adv else (b,)
    adv = torch.randn(shape, generator=g, dtype=torch.float64)
    adv = torch.where(adv.abs() < 0.05, 0.5, adv)  # no exact zeros: every live token moves
    return lp, old, adv, mask


def _autograd_zero_set(
    cfg: PolicyLossConfig,
    lp: torch.Tensor,
    old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
) -> torch.Tensor:
    x = lp.clone().requires_grad_(True)
    out = policy_loss(cfg, logprobs=x, old_logprobs=old, advantages=adv, response_mask=mask)
    (grad,) = torch.autograd.grad(out.loss, x)
    zero: torch.Tensor = mask & (grad == 0)
    return zero


@pytest.mark.parametrize("token_adv", [False, True], ids=["adv[B]", "adv[B,T]"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_killed_set_equals_autograd_zero_set(name: str, token_adv: bool) -> None:
    cfg = CONFIGS[name]
    killed_any = live_any = False
    for seed in range(4):
        lp, old, adv, mask = _batch(seed, token_adv=token_adv)
        rep = clip_report(cfg, logprobs=lp, old_logprobs=old, advantages=adv, response_mask=mask)
        zero = _autograd_zero_set(cfg, lp, old, adv, mask)
        assert torch.equal(rep.killed, zero), (name, seed, (rep.killed ^ zero).nonzero().tolist())
        killed_any |= bool(zero.any())
        live_any |= bool((mask & ~zero).any())
        assert rep.frac_killed == int(zero.sum()) / int(mask.sum())
    assert killed_any and live_any  # the comparison is not vacuous


def test_sequence_ratio_kills_whole_rows() -> None:
    lp, old, adv, mask = _batch(11, token_adv=False)
    rep = clip_report(
        CONFIGS["sequence"], logprobs=lp, old_logprobs=old, advantages=adv, response_mask=mask
    )
    rows = rep.killed.any(dim=1)
    assert torch.equal(rep.killed, mask & rows[:, None]) and rep.rows_killed == int(rows.sum()) > 0


def test_the_boundary_itself_is_not_killed() -> None:
    # r exactly 1 + eps_high: the gradient is still non-zero (open region); log-probs <= 0
    x = math.log(1.25) - 1.0
    while math.exp(x - -1.0) != 1.25:  # pragma: no cover - depends on libm rounding
        x = math.nextafter(x, 1.0 if math.exp(x - -1.0) < 1.25 else -2.0)
    cfg = PolicyLossConfig(clip=ClipConfig(eps_low=0.2, eps_high=0.25))
    old = torch.full((1, 2), -1.0, dtype=torch.float64)
    lp = torch.tensor([[x, x + 1e-3]], dtype=torch.float64)
    adv = torch.ones(1, dtype=torch.float64)
    mask = torch.ones((1, 2), dtype=torch.bool)
    rep = clip_report(cfg, logprobs=lp, old_logprobs=old, advantages=adv, response_mask=mask)
    assert rep.killed.tolist() == [[False, True]]
    assert torch.equal(rep.killed, _autograd_zero_set(cfg, lp, old, adv, mask))


@pytest.mark.parametrize("surrogate", ["cispo", "pg", "reinforce"])
def test_surrogates_without_a_gradient_killing_clip_kill_nothing(surrogate: str) -> None:
    cfg = PolicyLossConfig(
        surrogate=SurrogateKind(surrogate), clip=ClipConfig(eps_low=0.2, eps_high=0.2)
    )
    lp, old, adv, mask = _batch(12, token_adv=False)
    rep = clip_report(cfg, logprobs=lp, old_logprobs=old, advantages=adv, response_mask=mask)
    assert not bool(rep.killed.any()) and rep.frac_killed == 0.0
    assert not bool(_autograd_zero_set(cfg, lp, old, adv, mask).any())
    if surrogate == "cispo":
        assert rep.frac_outside_range > 0.0  # the truncated fraction is still reported


def test_on_policy_kills_nothing() -> None:
    lp, _, adv, mask = _batch(13, token_adv=False)
    for cfg in CONFIGS.values():
        rep = clip_report(
            cfg, logprobs=lp, old_logprobs=lp.clone(), advantages=adv, response_mask=mask
        )
        assert rep.frac_killed == rep.frac_outside_range == 0.0


@pytest.mark.parametrize("sigma", [0.1, 0.3])
def test_region_fractions_match_the_lognormal_closed_form(sigma: float) -> None:
    g = torch.Generator().manual_seed(14)
    b, t = 256, 64
    mask = torch.ones((b, t), dtype=torch.bool)
    lp = -torch.rand((b, t), generator=g, dtype=torch.float64)
    old = lp - sigma * torch.randn((b, t), generator=g, dtype=torch.float64)
    adv = torch.where(torch.rand((b, t), generator=g) < 0.5, -1.0, 1.0).double()
    cfg = CONFIGS["token"]
    rep = clip_report(cfg, logprobs=lp, old_logprobs=old, advantages=adv, response_mask=mask)
    phi = NormalDist().cdf
    n = b * t
    expect_high = 0.5 * (1 - phi(math.log(1.28) / sigma))
    expect_low = 0.5 * phi(math.log(0.8) / sigma)
    for got, p in ((rep.frac_high, expect_high), (rep.frac_low, expect_low)):
        assert abs(got - p) <= 4 * math.sqrt(p * (1 - p) / n) + 1.0 / n, (got, p)
    assert rep.frac_killed == pytest.approx(rep.frac_high + rep.frac_low, abs=1e-15)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_inputs_equal_float64_of_the_same_values(dtype: torch.dtype) -> None:
    lp, old, adv, mask = _batch(15, token_adv=True)
    lp, old, adv = lp.to(dtype), old.to(dtype), adv.to(dtype)
    for cfg in CONFIGS.values():
        low = clip_report(cfg, logprobs=lp, old_logprobs=old, advantages=adv, response_mask=mask)
        ref = clip_report(
            cfg,
            logprobs=lp.double(),
            old_logprobs=old.double(),
            advantages=adv.double(),
            response_mask=mask,
        )
        assert low == ref and torch.equal(low.killed, ref.killed)


def test_bad_inputs_are_named() -> None:
    lp, old, adv, mask = _batch(16, token_adv=False)
    cfg = CONFIGS["token"]
    with pytest.raises(ConfigError, match="cfg must be a PolicyLossConfig"):
        clip_report(ClipConfig(), logprobs=lp, old_logprobs=old, advantages=adv, response_mask=mask)  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"advantages must have shape \[B\] = \[24\]"):
        clip_report(cfg, logprobs=lp, old_logprobs=old, advantages=adv[:3], response_mask=mask)
    with pytest.raises(InputTypeError, match=r"advantages must be a torch\.Tensor"):
        clip_report(cfg, logprobs=lp, old_logprobs=old, advantages=[1.0], response_mask=mask)  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"old_logprobs must have shape"):
        clip_report(cfg, logprobs=lp, old_logprobs=old[:, :3], advantages=adv, response_mask=mask)
