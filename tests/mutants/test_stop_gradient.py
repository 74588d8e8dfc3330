"""Stop-gradient losses on batches that reach their clipped branches.

The mutation audit of issue 13 found that the stop-gradient tests never reached a clipped
branch: CISPO ratios stayed in 0.77-1.45 against its cap of 3, GSPO-token's sequence ratios
in 1 +- 1e-4 against its range (1 - 3e-4, 1 + 4e-4). Here every batch is built by hand so
that each branch is reached (asserted), and checked two ways: the fp64 gradcheck with the
stop-gradients frozen at the base point (``polgrad_reference.verify``), and the gradient
each derivation in docs/losses.md predicts, token by token.
"""

from __future__ import annotations

import math

import torch

from polgrad_reference import ALGORITHMS, policy_loss
from polgrad_reference.verify import gradcheck_policy_loss

F64 = torch.float64


def _batch(log_ratios: list[list[float]], adv: list[float]) -> dict[str, torch.Tensor]:
    lr = torch.tensor(log_ratios, dtype=F64)
    old = torch.full_like(lr, -3.0)  # logprobs = old + lr stay <= 0 up to ratio 8
    return {
        "logprobs": old + lr,
        "old_logprobs": old,
        "advantages": torch.tensor(adv, dtype=F64),
        "response_mask": torch.ones_like(lr, dtype=torch.bool),
    }


def _gradcheck(name: str, b: dict[str, torch.Tensor]) -> bool:
    result = gradcheck_policy_loss(
        ALGORITHMS[name].loss,
        logprobs=b["logprobs"],
        old_logprobs=b["old_logprobs"],
        advantages=b["advantages"],
        response_mask=b["response_mask"],
    )
    return bool(result.ok)


def _grad(name: str, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    lp = batch["logprobs"].clone().requires_grad_()
    out = policy_loss(ALGORITHMS[name].loss, **{**batch, "logprobs": lp})
    return torch.autograd.grad(out.loss, lp)[0]


# CISPO (cap 1 + 2 = 3, no lower bound): ratios 0.5, 2.0, 4.0, 8.0 in one row, A = +1 and
# A = -1 rows; token-mean over 8 tokens.
CISPO = _batch([[math.log(r) for r in (0.5, 2.0, 4.0, 8.0)]] * 2, [1.0, -1.0])


def test_cispo_reaches_the_cap_and_gradchecks() -> None:
    ratio = torch.exp(CISPO["logprobs"] - CISPO["old_logprobs"])
    assert bool((ratio > 3).any()) and bool((ratio < 3).any())
    assert _gradcheck("cispo", CISPO)


def test_cispo_gradient_is_the_truncated_weight_times_the_advantage() -> None:
    """``d/d lp [-sg(min(r, 3)) A lp] / N = -min(r, 3) A / N``: capped tokens keep a
    gradient (unlike PPO clip), with weight exactly 3."""
    w = torch.tensor([0.5, 2.0, 3.0, 3.0], dtype=F64)
    want = torch.stack([-w, w]) / 8
    assert torch.allclose(_grad("cispo", CISPO), want, rtol=1e-14, atol=0)


# GSPO-token (range 1 - 3e-4 .. 1 + 4e-4 on the sequence ratio s = exp(mean lr)):
# row 0: s = e^0.01 > 1 + 4e-4 with A > 0 (clipped); row 1: s = e^1e-5 inside (A > 0);
# row 2: s = e^-0.01 < 1 - 3e-4 with A < 0 (clipped); row 3: s = e^0.01 with A < 0 (a
# ratio above the range does not clip a negative advantage).
GSPO = _batch(
    [[0.01] * 3, [2e-5, 0.0, 1e-5], [-0.01] * 3, [0.01] * 3],
    [1.0, 1.0, -1.0, -1.0],
)


def test_gspo_token_reaches_both_clipped_sides_and_gradchecks() -> None:
    s = torch.exp((GSPO["logprobs"] - GSPO["old_logprobs"]).mean(dim=1))
    assert bool(s[0] > 1 + 4e-4) and bool(abs(s[1] - 1) < 3e-4) and bool(s[2] < 1 - 3e-4)
    assert _gradcheck("gspo_token", GSPO)


def test_gspo_token_gradient_is_zero_on_clipped_rows_and_token_local_elsewhere() -> None:
    """arXiv:2507.18071 Eq. 13-14: token value ``sg(s) pi_t / sg(pi_t)``, so an unclipped
    token's gradient is ``-A s / |y|`` times the row weight (seq-mean-token-mean: 1 / B)
    and a clipped row has none."""
    g = _grad("gspo_token", GSPO)
    s = torch.exp((GSPO["logprobs"] - GSPO["old_logprobs"]).mean(dim=1))
    rows, length = 4, 3
    assert bool((g[0] == 0).all()) and bool((g[2] == 0).all())
    for b in (1, 3):
        want = -GSPO["advantages"][b] * s[b] / (length * rows)
        assert torch.allclose(g[b], want.expand(length), rtol=1e-14, atol=0)
