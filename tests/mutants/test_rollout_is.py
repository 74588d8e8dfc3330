"""Rollout importance-sampling corrections on batches that reach every branch.

Written for the surviving mutants of the suite's mutation audit (issue 13): the masked-IS
test of ``tests/reference/test_losses.py`` could draw an all-False keep-mask and skip its
comparison,
and no test reached a truncation cap, so ``ISMode.MASK`` behaving like ``ISMode.ZERO``
(dropped tokens kept in the denominators) and ``grpo_tis``'s cap 2 -> 10 both survived.
Every batch here is built by hand, with ``rho = pi_old / pi_rollout`` known exactly.
"""

from __future__ import annotations

import math

import pytest
import torch

from polgrad_reference import (
    ALGORITHMS,
    Aggregation,
    ISCorrection,
    ISMode,
    PolicyLossConfig,
    policy_loss,
)

F64 = torch.float64


def _batch(rho: list[list[float]], lengths: list[int], adv: list[float]) -> dict[str, torch.Tensor]:
    """On-policy rows (``logprobs == old_logprobs``, so every PPO ratio is 1 and each
    token's loss is ``-A_b``) whose rollout logprobs give the token IS ratios ``rho``."""
    width = len(rho[0])
    mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    old = torch.full((len(rho), width), -1.0, dtype=F64)
    rollout = old - torch.tensor(rho, dtype=F64).log()
    return {
        "logprobs": old.clone(),
        "old_logprobs": old,
        "rollout_logprobs": torch.where(mask, rollout, math.nan),
        "advantages": torch.tensor(adv, dtype=F64),
        "response_mask": mask,
    }


# Row 0 (A = +1): rho 1.0, 1.5, 1.0 -> the middle token is out of [0.9, 1.1].
# Row 1 (A = -2): rho 0.5, 1.0, 1.0 -> the first token is out. Each row keeps two.
MIXED = _batch([[1.0, 1.5, 1.0], [0.5, 1.0, 1.0]], [3, 3], [1.0, -2.0])
KEEP = torch.tensor([[True, False, True], [False, True, True]])
LOW, HIGH = 0.9, 1.1
MASK_BAND = ISCorrection(mode=ISMode.MASK, low=LOW, high=HIGH)
ZERO_BAND = ISCorrection(mode=ISMode.ZERO, cap=None, low=LOW, high=HIGH)


@pytest.mark.parametrize(
    ("aggregation", "masked", "zeroed"),
    [
        # kept token losses: -1, -1 (row 0) and 2, 2 (row 1)
        ("token-mean", 2.0 / 4, 2.0 / 6),  # / kept tokens vs / all tokens
        ("seq-mean-token-mean", (-1.0 + 2.0) / 2, (-2 / 3 + 4 / 3) / 2),
    ],
)
def test_masked_is_drops_out_of_band_tokens_from_every_denominator(
    aggregation: str, masked: float, zeroed: float
) -> None:
    base = PolicyLossConfig(aggregation=Aggregation(aggregation))
    mask_cfg = base.replace(is_correction=MASK_BAND)
    zero_cfg = base.replace(
        is_correction=ISCorrection(mode=ISMode.ZERO, cap=None, low=LOW, high=HIGH)
    )
    out = policy_loss(mask_cfg, **MIXED)
    assert torch.equal(out.response_mask, KEEP)  # a keep-mask that is neither all nor none
    assert out.loss.item() == pytest.approx(masked, rel=1e-15)
    assert policy_loss(zero_cfg, **MIXED).loss.item() == pytest.approx(zeroed, rel=1e-15)
    # and the same as the plain loss over the kept tokens only
    plain = policy_loss(base, **{**MIXED, "response_mask": KEEP})
    assert out.loss.item() == pytest.approx(plain.loss.item(), rel=1e-15)


def test_masked_is_gradient_is_zero_at_dropped_tokens_and_renormalised_elsewhere() -> None:
    cfg = PolicyLossConfig(
        aggregation=Aggregation.TOKEN_MEAN,
        is_correction=MASK_BAND,
    )
    lp = MIXED["logprobs"].clone().requires_grad_()
    (grad,) = torch.autograd.grad(policy_loss(cfg, **{**MIXED, "logprobs": lp}).loss, lp)
    # on-policy d/dlp of -A r is -A, weighted 1/4 (four kept tokens)
    want = torch.tensor([[-0.25, 0.0, -0.25], [0.0, 0.5, 0.5]], dtype=F64)
    assert torch.equal(grad, want)


# rho 0.5, 1.5, 3.0, 8.0: below and above GRPO-TIS's cap C = 2 (and below 10).
CAPPED = _batch([[0.5, 1.5, 3.0, 8.0]], [4], [1.0])


def test_grpo_tis_truncates_at_its_published_cap() -> None:
    """Yao et al. 2025 (token-level TIS, C = 2): the gradient of each token is the plain
    one times ``min(rho, 2)``; with a cap of 10 the last two tokens would differ."""
    tis = ALGORITHMS["grpo_tis"].loss.replace(kl=None)
    plain = tis.replace(is_correction=None)
    grads = []
    for cfg in (tis, plain):
        lp = CAPPED["logprobs"].clone().requires_grad_()
        (g,) = torch.autograd.grad(policy_loss(cfg, **{**CAPPED, "logprobs": lp}).loss, lp)
        grads.append(g)
    weight = torch.tensor([[0.5, 1.5, 2.0, 2.0]], dtype=F64)
    assert torch.allclose(grads[0], grads[1] * weight, rtol=1e-14, atol=0)
    assert bool((grads[1] != 0).all())  # every token carries a gradient to be weighted


def test_truncated_is_weight_comes_from_old_logprobs_not_the_current_ones() -> None:
    """Off-policy (``logprobs != old_logprobs``): the weight is ``pi_old / pi_rollout``;
    one computed from the current logprobs (``exp(lp - rollout)``) differs here."""
    batch = {**CAPPED, "logprobs": CAPPED["old_logprobs"] + torch.tensor([[0.1, -0.1, 0.05, 0.0]])}
    cfg = PolicyLossConfig(aggregation=Aggregation.TOKEN_SUM, is_correction=ISCorrection(cap=2.0))
    lp = batch["logprobs"].clone().requires_grad_()
    (g,) = torch.autograd.grad(policy_loss(cfg, **{**batch, "logprobs": lp}).loss, lp)
    lp0 = batch["logprobs"].clone().requires_grad_()
    plain = cfg.replace(is_correction=None)
    (g0,) = torch.autograd.grad(policy_loss(plain, **{**batch, "logprobs": lp0}).loss, lp0)
    assert torch.allclose(g, g0 * torch.tensor([[0.5, 1.5, 2.0, 2.0]], dtype=F64), rtol=1e-14)


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
@pytest.mark.parametrize("mode", ["truncate", "mask", "zero"])
def test_is_weight_is_detached_from_the_rollout_and_old_logprobs(level: str, mode: str) -> None:
    """The weight is a constant of the loss (verl#2953): no gradient reaches
    ``rollout_logprobs``, which enter the loss through the weight only."""
    kwargs: dict[str, object] = {"level": level, "mode": mode}
    if mode != "truncate":
        kwargs.update(cap=None, low=0.25, high=20.0)
    cfg = PolicyLossConfig(is_correction=ISCorrection(**kwargs))  # type: ignore[arg-type]
    batch = {**CAPPED, "logprobs": CAPPED["old_logprobs"] + 0.05}
    roll = batch["rollout_logprobs"].clone().requires_grad_()
    out = policy_loss(cfg, **{**batch, "rollout_logprobs": roll})
    assert not out.loss.requires_grad  # logprobs do not require grad here: only rho could


# Row 0 (A = +1): rho 1.0, 1.0 (kept); row 1 (A = -2): rho 1.5, 2.0, every token dropped.
ONE_ROW_LEFT = _batch([[1.0, 1.0], [1.5, 2.0]], [2, 2], [1.0, -2.0])


@pytest.mark.parametrize(
    ("aggregation", "want"),
    [
        ("seq-mean-token-mean", -1.0),  # one sequence left: mean -1 over 1 row, not 2
        ("seq-mean-token-sum", -2.0),
        ("token-mean", -1.0),
    ],
)
def test_a_row_with_every_token_dropped_is_not_counted(aggregation: str, want: float) -> None:
    """Masked IS is the only way a row can lose all its tokens; the seq-mean modes then
    average over the rows that still have one (docs/aggregation.md)."""
    cfg = PolicyLossConfig(
        aggregation=Aggregation(aggregation),
        is_correction=MASK_BAND,
    )
    out = policy_loss(cfg, **ONE_ROW_LEFT)
    assert out.response_mask.tolist() == [[True, True], [False, False]]
    assert out.loss.item() == pytest.approx(want, rel=1e-15)


@pytest.mark.parametrize(
    "aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "token-sum"]
)
def test_every_token_dropped_gives_a_zero_loss_and_gradient_not_nan(aggregation: str) -> None:
    cfg = PolicyLossConfig(
        aggregation=Aggregation(aggregation), is_correction=ISCorrection(mode=ISMode.MASK, low=10.0)
    )
    lp = MIXED["logprobs"].clone().requires_grad_()
    out = policy_loss(cfg, **{**MIXED, "logprobs": lp})
    assert not bool(out.response_mask.any())
    (grad,) = torch.autograd.grad(out.loss, lp)
    assert out.loss.item() == 0.0 and bool((grad == 0).all())
