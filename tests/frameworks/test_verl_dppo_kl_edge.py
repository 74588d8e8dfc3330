"""verl 0.9.1 ``compute_policy_loss_dppo_kl`` and the reference agree at ``p_old = 1``
(``old_logprobs == -0.0``) and next to it: the binary KL's ``(1-p_old) log(...)`` term is
``0 log 0 = 0`` there, so ``D = -log p`` gates the token (issue 27, finding 1)."""

from __future__ import annotations

import math

import pytest
import torch

from polgrad_reference import ALGORITHMS, policy_loss
from pytest_polgrad.frameworks import verl

F64 = torch.float64
# p spans both sides of the gate (D = -log p = 0.2 at p ~ 0.819 when p_old = 1), away from it.
# p = 1 exactly is left out: there verl's 1e-8 keeps log(1 - p) finite and the two differ
# by design (the reference's D is +inf for p_old < 1), as the reference's docstring says.
PROBS = [0.05, 0.3, 0.5, 0.7, 0.9, 0.95, 0.999, 0.9999]


@pytest.mark.parametrize("old_logprob", [-0.0, -1e-12, -1e-6, -1e-3])
@pytest.mark.parametrize("adv", [-1.0, 1.0])
def test_dppo_kl_agrees_with_verl_at_and_near_p_old_one(old_logprob: float, adv: float) -> None:
    lp = torch.tensor([[math.log(p) for p in PROBS]], dtype=F64)
    old = torch.full_like(lp, old_logprob)
    adv_t = torch.full((1,), adv, dtype=F64)
    mask = torch.ones_like(lp, dtype=torch.bool)
    reference = ALGORITHMS["dppo_kl"].derive(is_cap=3.0).loss  # verl ActorConfig's cap

    def ref_fn(**batch: torch.Tensor) -> torch.Tensor:
        return policy_loss(reference, **batch).loss

    grads = []
    for fn in (verl.policy_loss("dppo_kl", loss_agg_mode="token-mean"), ref_fn):
        x = lp.clone().requires_grad_()
        loss = fn(logprobs=x, old_logprobs=old, advantages=adv_t, response_mask=mask)
        (g,) = torch.autograd.grad(loss, x)
        grads.append(g)
    verl_grad, ref_grad = grads
    assert (verl_grad != 0).tolist() == (ref_grad != 0).tolist()
    torch.testing.assert_close(verl_grad, ref_grad, rtol=1e-12, atol=0.0)
    if adv < 0:  # some token inside the region and some outside, at each p_old tried
        assert 0 < int((ref_grad != 0).sum()) < len(PROBS)
