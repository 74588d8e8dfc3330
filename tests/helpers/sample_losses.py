"""Loss functions for the kit's own tests: independent correct implementations and one
deliberately wrong twin per check. Each docstring names the bug."""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable
from typing import Any

import torch

Tensor = torch.Tensor


def reference_loss(cfg: Any, name: str = "reference_loss") -> Callable[..., Tensor]:
    """The reference's own loss for ``cfg`` as a function under test, taking exactly the
    tensors ``cfg`` reads: the four core ones, plus ``ref_logprobs`` with an as-loss KL
    term and ``rollout_logprobs`` with an IS correction (the kit reads the signature)."""
    from polgrad_reference import policy_loss
    from pytest_polgrad.kinds.policy_loss.oracle import Oracle

    names = ("logprobs", "old_logprobs", "advantages", "response_mask", *Oracle(cfg).needs)

    def loss(**inputs: Tensor) -> Tensor:
        out: Tensor = policy_loss(cfg, **inputs).loss
        return out

    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    loss.__signature__ = inspect.Signature([inspect.Parameter(n, kind) for n in names])  # type: ignore[attr-defined]
    loss.__name__ = loss.__qualname__ = name
    return loss


def _token_mean(per_token: Tensor, response_mask: Tensor) -> Tensor:
    return torch.where(response_mask, per_token, 0.0).sum() / response_mask.sum()


def _ppo_per_token(
    lp: Tensor, old: Tensor, adv: Tensor, mask: Tensor, lo: float, hi: float
) -> Tensor:
    ratio = torch.exp(torch.where(mask, lp - old, 0.0))
    a = adv[:, None] if adv.dim() == 1 else torch.where(mask, adv, 0.0)
    return torch.maximum(-a * ratio, -a * ratio.clamp(1 - lo, 1 + hi))


def dapo(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """Correct DAPO: token-mean, clip 0.2 / 0.28."""
    per = _ppo_per_token(logprobs, old_logprobs, advantages, response_mask, 0.2, 0.28)
    return _token_mean(per, response_mask)


def grpo_no_kl(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """Correct GRPO policy term: seq-mean-token-mean, clip 0.2."""
    per = torch.where(
        response_mask,
        _ppo_per_token(logprobs, old_logprobs, advantages, response_mask, 0.2, 0.2),
        0.0,
    )
    return (per.sum(dim=1) / response_mask.sum(dim=1)).mean()


def cispo(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """Correct CISPO: sg(min(r, 3)) * A * log pi, token-mean."""
    ratio = torch.exp(torch.where(response_mask, logprobs - old_logprobs, 0.0))
    per = (
        -ratio.clamp(max=3.0).detach()
        * advantages[:, None]
        * torch.where(response_mask, logprobs, 0.0)
    )
    return per.sum() / response_mask.sum()


# ----------------------------------------------------------------- one wrong twin per check


def dapo_wrong_eps(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """value: clip-high 0.2 instead of 0.28."""
    per = _ppo_per_token(logprobs, old_logprobs, advantages, response_mask, 0.2, 0.2)
    return _token_mean(per, response_mask)


def cispo_no_stop_gradient(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """gradient / on-policy: the truncated weight is not detached (same value)."""
    ratio = torch.exp(torch.where(response_mask, logprobs - old_logprobs, 0.0))
    per = -ratio.clamp(max=3.0) * advantages[:, None] * torch.where(response_mask, logprobs, 0.0)
    return per.sum() / response_mask.sum()


def dapo_grad_into_padding(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """masked-positions: a zero-valued term that still sends gradient to padding."""
    leak = (logprobs - logprobs.detach())[~response_mask].sum()
    return dapo(logprobs, old_logprobs, advantages, response_mask) + leak


def dapo_leaky(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """padding-values: the numerator forgets the mask."""
    per = _ppo_per_token(logprobs, old_logprobs, advantages, response_mask, 0.2, 0.28)
    per = per + 0.0 * torch.exp(torch.clamp(logprobs - old_logprobs, max=30.0))  # reads padding
    return (per + 1e-3 * torch.nan_to_num(logprobs)).sum() / response_mask.sum()


def dapo_padded_width(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """padding-columns: divides by B * T (the padded width) instead of the token count."""
    per = _ppo_per_token(logprobs, old_logprobs, advantages, response_mask, 0.2, 0.28)
    return torch.where(response_mask, per, 0.0).sum() / response_mask.numel()


def dapo_inplace(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """inputs-unchanged: zeroes the padding of old_logprobs in place."""
    old_logprobs.masked_fill_(~response_mask, 0.0)
    return dapo(logprobs, old_logprobs, advantages, response_mask)


_calls = itertools.count()


def dapo_nondeterministic(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """deterministic: the result drifts by one part in 1e15 per call."""
    return dapo(logprobs, old_logprobs, advantages, response_mask) * (1 + 1e-15 * next(_calls))


def dapo_ratio_of_probs(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """extreme-finite: ratio as exp(lp) / exp(old), 0/0 for very unlikely tokens."""
    ratio = torch.where(response_mask, torch.exp(logprobs) / torch.exp(old_logprobs), 1.0)
    a = advantages[:, None]
    per = torch.maximum(-a * ratio, -a * ratio.clamp(0.8, 1.28))
    return _token_mean(per, response_mask)


def grpo_token_mean(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """micro-batch (and value): token-mean where GRPO means per sequence first."""
    per = _ppo_per_token(logprobs, old_logprobs, advantages, response_mask, 0.2, 0.2)
    return _token_mean(per, response_mask)


# ------------------------------------------ correct losses for every registry algorithm
# Written directly from each paper's equation (cited), independently of polgrad_reference,
# for the sweep test (tests/kinds/policy_loss/test_sweep_correct.py).


def _seq_mean_token_mean(per_token: Tensor, response_mask: Tensor) -> Tensor:
    per = torch.where(response_mask, per_token, 0.0)
    return (per.sum(dim=1) / response_mask.sum(dim=1)).mean()


def ppo(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """PPO clip, eps 0.2 (arXiv:1707.06347 Eq. 7), token-mean."""
    per = _ppo_per_token(logprobs, old_logprobs, advantages, response_mask, 0.2, 0.2)
    return _token_mean(per, response_mask)


reinforce_pp = ppo
"""REINFORCE++ (arXiv:2501.03262): PPO clip 0.2, token-mean; its KL sits in the reward."""


def grpo(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    ref_logprobs: Tensor,
) -> Tensor:
    """GRPO (arXiv:2402.03300 Eq. 3-4): seq-mean-token-mean of the clipped surrogate plus
    0.04 * the k3 estimate ``exp(ref - lp) - (ref - lp) - 1``, aggregated the same way."""
    per = _ppo_per_token(logprobs, old_logprobs, advantages, response_mask, 0.2, 0.2)
    d = torch.where(response_mask, ref_logprobs - logprobs, 0.0)
    k3 = torch.exp(d) - d - 1.0
    return _seq_mean_token_mean(per, response_mask) + 0.04 * _seq_mean_token_mean(k3, response_mask)


def grpo_tis(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    ref_logprobs: Tensor,
    rollout_logprobs: Tensor,
) -> Tensor:
    """GRPO with truncated token-level importance sampling (verl#2953): each token's
    surrogate is weighted by the constant ``min(exp(old - rollout), 2)``."""
    per = _ppo_per_token(logprobs, old_logprobs, advantages, response_mask, 0.2, 0.2)
    w = torch.exp(torch.where(response_mask, old_logprobs - rollout_logprobs, 0.0)).clamp(max=2.0)
    d = torch.where(response_mask, ref_logprobs - logprobs, 0.0)
    k3 = torch.exp(d) - d - 1.0
    return _seq_mean_token_mean(w * per, response_mask) + 0.04 * _seq_mean_token_mean(
        k3, response_mask
    )


def dr_grpo(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """Dr.GRPO (arXiv:2503.20783 Sec. 3.1): token sum over B * the generation budget 4096."""
    per = _ppo_per_token(logprobs, old_logprobs, advantages, response_mask, 0.2, 0.2)
    return torch.where(response_mask, per, 0.0).sum() / (response_mask.shape[0] * 4096)


def _gspo_ratio(logprobs: Tensor, old_logprobs: Tensor, response_mask: Tensor) -> Tensor:
    lr = torch.where(response_mask, logprobs - old_logprobs, 0.0)
    return torch.exp(lr.sum(dim=1) / response_mask.sum(dim=1))[:, None]


def _gspo_per_token(ratio: Tensor, advantages: Tensor) -> Tensor:
    a = advantages[:, None]
    return torch.maximum(-a * ratio, -a * ratio.clamp(1 - 3e-4, 1 + 4e-4))


def gspo(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """GSPO (arXiv:2507.18071 Eq. 5-7): sequence ratio ``exp(mean_t lr)``, clip 3e-4/4e-4."""
    s = _gspo_ratio(logprobs, old_logprobs, response_mask).expand_as(logprobs)
    return _seq_mean_token_mean(_gspo_per_token(s, advantages), response_mask)


def gspo_token(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """GSPO-token (arXiv:2507.18071 Eq. 13): ``sg(s) * exp(lp - sg(lp))`` per token."""
    s = _gspo_ratio(logprobs, old_logprobs, response_mask).detach()
    lp = torch.where(response_mask, logprobs, 0.0)
    r = s * torch.exp(lp - lp.detach())
    return _seq_mean_token_mean(_gspo_per_token(r, advantages), response_mask)


def rloo(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """RLOO (arXiv:2402.14740): REINFORCE ``-A * sum_t log pi`` per sequence, mean over rows."""
    per = torch.where(response_mask, -advantages[:, None] * logprobs, 0.0)
    return per.sum(dim=1).mean()


CORRECT: dict[str, Callable[..., Tensor]] = {
    "cispo": cispo,
    "dapo": dapo,
    "dr_grpo": dr_grpo,
    "grpo": grpo,
    "grpo_tis": grpo_tis,
    "gspo": gspo,
    "gspo_token": gspo_token,
    "ppo": ppo,
    "reinforce_pp": reinforce_pp,
    "rloo": rloo,
}
"""A correct loss for every registry algorithm, by name (cispo: eps_high 2.0 as its entry)."""
