"""The KL-in-loss term of ``policy_loss``: its own aggregation and its mask (issue 27).

Two mutants survived the suite: the KL term aggregated with the policy loss's weights
although ``KLConfig(aggregation=...)`` names another mode (no test set it), and the KL
term masked with the input ``response_mask`` instead of the mask masked IS reduced (so
``out.kl`` was non-zero at IS-dropped tokens). Every batch is built by hand.
"""

from __future__ import annotations

import math

import pytest
import torch

from polgrad_reference import (
    Aggregation,
    ISCorrection,
    ISMode,
    KLConfig,
    KLEstimator,
    PolicyLossConfig,
    policy_loss,
)

F64 = torch.float64


def _ragged() -> dict[str, torch.Tensor]:
    """Two on-policy rows of lengths 1 and 3: every ratio is 1, a token's loss is ``-A``;
    ``ref_logprobs - logprobs`` is 0.5 everywhere, so each token's k1 is -0.5."""
    mask = torch.tensor([[True, False, False], [True, True, True]])
    lp = torch.full(mask.shape, -1.0, dtype=F64)
    return {
        "logprobs": lp,
        "old_logprobs": lp.clone(),
        "advantages": torch.tensor([1.0, -2.0], dtype=F64),
        "response_mask": mask,
        "ref_logprobs": lp + 0.5,
    }


@pytest.mark.parametrize(
    ("kl_agg", "kl_mean"),
    [
        (None, -0.5),  # the policy's seq-mean-token-mean: (-0.5 + -0.5) / 2
        (Aggregation.TOKEN_MEAN, -0.5),  # 4 tokens of -0.5
        (Aggregation.SEQ_MEAN_TOKEN_SUM, (-0.5 + -1.5) / 2),  # row sums -0.5, -1.5
        (Aggregation.TOKEN_SUM, -2.0),
    ],
)
def test_kl_term_uses_its_own_aggregation(kl_agg: Aggregation | None, kl_mean: float) -> None:
    """``loss = aggregate(token_loss, policy mode) + coef * aggregate(kl, KL's mode)``; the
    policy part is seq-mean-token-mean: ``(-1 + 2) / 2 = 0.5``."""
    kl = KLConfig(estimator=KLEstimator.K1, coef=0.1, aggregation=kl_agg)
    cfg = PolicyLossConfig(aggregation=Aggregation.SEQ_MEAN_TOKEN_MEAN, kl=kl)
    out = policy_loss(cfg, **_ragged())
    assert out.kl_loss is not None
    assert out.kl_loss.item() == pytest.approx(0.1 * kl_mean, rel=1e-14)
    assert out.loss.item() == pytest.approx(0.5 + 0.1 * kl_mean, rel=1e-14)


def test_kl_term_is_masked_where_masked_is_drops_a_token() -> None:
    """Masked IS drops the middle token of row 1 (``rho = 1.5`` outside [0.9, 1.1]): its
    KL value is 0, the KL term's gradient there is 0, and moving its ``ref_logprobs``
    leaves the loss unchanged."""
    b = _ragged()
    rho = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.5, 1.0]], dtype=F64)
    b["rollout_logprobs"] = b["old_logprobs"] - rho.log()
    corr = ISCorrection(mode=ISMode.MASK, low=0.9, high=1.1)
    cfg = PolicyLossConfig(
        aggregation=Aggregation.TOKEN_MEAN,
        is_correction=corr,
        kl=KLConfig(estimator=KLEstimator.K3, coef=0.1),
    )
    lp = b["logprobs"].clone().requires_grad_(True)
    out = policy_loss(cfg, **{**b, "logprobs": lp})
    assert not bool(out.response_mask[1, 1])
    assert out.kl is not None
    assert out.kl[1, 1].item() == 0.0
    (grad,) = torch.autograd.grad(out.loss, lp)
    assert grad[1, 1].item() == 0.0
    moved = b["ref_logprobs"].clone()
    moved[1, 1] = -30.0
    again = policy_loss(cfg, **{**b, "ref_logprobs": moved})
    assert again.loss.item() == out.loss.item()
    assert not math.isnan(out.loss.item())
