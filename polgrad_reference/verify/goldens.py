"""Hand-derived golden cases: tiny inputs whose exact outputs are worked out by hand.

Each case states what it pins, the arithmetic (rendered into
``docs/derivations/goldens.md`` by :func:`goldens_markdown`, and checked to be current),
and evaluates the reference against the hand-computed numbers with
:func:`check_golden`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch

from ..advantages import grpo_advantages, rloo_advantages
from ..config import (
    Aggregation,
    ClipConfig,
    KLEstimator,
    PolicyLossConfig,
    RatioKind,
    SurrogateKind,
)
from ..errors import InputTypeError
from ..kl import kl_estimate
from ..loss import policy_loss
from ._convention import require_tolerance
from .gradcheck import VerificationError

__all__ = ["GOLDEN_CASES", "GoldenCase", "check_golden", "goldens_markdown"]

F64 = torch.float64


@dataclasses.dataclass(frozen=True)
class GoldenCase:
    """One hand-derived case: ``evaluate() -> (computed, expected)``."""

    name: str
    claim: str
    arithmetic: tuple[str, ...]
    evaluate: Callable[[], tuple[torch.Tensor, torch.Tensor]]


def check_golden(case: GoldenCase, *, rtol: float = 1e-14, atol: float = 1e-15) -> None:
    """Raise :class:`~polgrad_reference.verify.VerificationError` when the reference's
    output differs from the hand-derived numbers. ``rtol``/``atol`` are finite floats
    ``>= 0``, not both 0."""
    if not isinstance(case, GoldenCase):
        raise InputTypeError(f"case must be a GoldenCase, got {type(case).__name__} {case!r}")
    rtol, atol = require_tolerance(rtol, atol)
    computed, expected = case.evaluate()
    if computed.shape != expected.shape or not torch.allclose(
        computed.to(F64), expected.to(F64), rtol=rtol, atol=atol
    ):
        raise VerificationError(
            f"golden {case.name!r}: computed {computed.tolist()}, derived {expected.tolist()}"
        )


def _golden_batch() -> dict[str, torch.Tensor]:
    """Row 0: one token, ratio 1.5, A = +1. Row 1: ratios (1.0, 0.5), A = -2."""
    old = torch.tensor([[-1.0, math.nan], [-1.0, -1.0]], dtype=F64)
    log_r = torch.tensor([[math.log(1.5), 0.0], [0.0, math.log(0.5)]], dtype=F64)
    return {
        "logprobs": old + log_r,
        "old_logprobs": old,
        "advantages": torch.tensor([1.0, -2.0], dtype=F64),
        "response_mask": torch.tensor([[True, False], [True, True]]),
    }


def _loss_and_grad(cfg: PolicyLossConfig, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """``[loss, d loss / d logprobs (flattened, padding included)]``."""
    lp = batch["logprobs"].clone().requires_grad_(True)
    out = policy_loss(cfg, **{**batch, "logprobs": lp})
    (grad,) = torch.autograd.grad(out.loss, lp)
    return torch.cat([out.loss.detach().reshape(1), grad.flatten()])


def _aggregation_case(mode: str, loss: float, grad_10: float, divisor: str) -> GoldenCase:
    budget = 4 if mode == "token-sum-norm" else None
    cfg = PolicyLossConfig(clip=ClipConfig(0.2, 0.2), aggregation=Aggregation(mode), budget=budget)

    def evaluate() -> tuple[torch.Tensor, torch.Tensor]:
        expected = torch.tensor([loss, 0.0, 0.0, grad_10, 0.0], dtype=F64)
        return _loss_and_grad(cfg, _golden_batch()), expected

    return GoldenCase(
        name=f"pg-clip-{mode}",
        claim=f"PPO-clip (eps 0.2) aggregated with {mode}",
        arithmetic=(
            "token losses: (0,0) r=1.5, A=+1: max(-1.5, -1.2) = -1.2 (clipped, no gradient);",
            "(1,0) r=1, A=-2: max(2, 2) = 2, d/dlogp = -A r = 2; (1,1) r=0.5, A=-2:",
            "max(1.0, 1.6) = 1.6 (clipped at 0.8, no gradient).",
            f"{mode}: {divisor}",
        ),
        evaluate=evaluate,
    )


def _dual_clip() -> tuple[torch.Tensor, torch.Tensor]:
    batch = {
        "logprobs": torch.zeros(1, 1, dtype=F64),  # log-probabilities are <= 0
        "old_logprobs": torch.tensor([[-math.log(4.0)]], dtype=F64),
        "advantages": torch.tensor([-1.0], dtype=F64),
        "response_mask": torch.tensor([[True]]),
    }
    cfg = PolicyLossConfig(clip=ClipConfig(0.2, 0.2, dual_clip=3.0))
    return _loss_and_grad(cfg, batch), torch.tensor([3.0, 0.0], dtype=F64)


def _cispo() -> tuple[torch.Tensor, torch.Tensor]:
    batch = {
        "logprobs": torch.tensor([[-0.5]], dtype=F64),
        "old_logprobs": torch.tensor([[-0.5 - math.log(1.5)]], dtype=F64),
        "advantages": torch.tensor([1.0], dtype=F64),
        "response_mask": torch.tensor([[True]]),
    }
    cfg = PolicyLossConfig(surrogate=SurrogateKind.CISPO, clip=ClipConfig(None, 0.2))
    return _loss_and_grad(cfg, batch), torch.tensor([0.6, -1.2], dtype=F64)


def _gspo() -> tuple[torch.Tensor, torch.Tensor]:
    batch = {
        "logprobs": torch.tensor([[-1.0 + 1e-4, -1.0 - 1e-4]], dtype=F64),
        "old_logprobs": torch.tensor([[-1.0, -1.0]], dtype=F64),
        "advantages": torch.tensor([1.0], dtype=F64),
        "response_mask": torch.tensor([[True, True]]),
    }
    cfg = PolicyLossConfig(
        ratio=RatioKind.SEQUENCE,
        clip=ClipConfig(3e-4, 4e-4),
        aggregation=Aggregation.SEQ_MEAN_TOKEN_MEAN,
    )
    return _loss_and_grad(cfg, batch), torch.tensor([-1.0, -0.5, -0.5], dtype=F64)


def _k3() -> tuple[torch.Tensor, torch.Tensor]:
    lp = torch.tensor([[math.log(0.4), math.log(0.2)]], dtype=F64)
    ref = torch.tensor([[math.log(0.2), math.log(0.2)]], dtype=F64)
    mask = torch.tensor([[True, True]])
    out = kl_estimate(KLEstimator.K3, logprobs=lp, ref_logprobs=ref, response_mask=mask)
    return out, torch.tensor([[0.5 - 1.0 + math.log(2.0), 0.0]], dtype=F64)


def _rloo() -> tuple[torch.Tensor, torch.Tensor]:
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=F64)
    out = rloo_advantages(rewards=rewards, group_size=4)
    return out, torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3], dtype=F64)


def _grpo() -> tuple[torch.Tensor, torch.Tensor]:
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=F64)
    out = grpo_advantages(
        rewards=rewards, group_size=4, scale_by_std=True, std_eps=1e-6, unbiased_std=True
    )
    hi, lo = 0.75 / (0.5 + 1e-6), -0.25 / (0.5 + 1e-6)
    return out, torch.tensor([hi, lo, lo, lo], dtype=F64)


GOLDEN_CASES: tuple[GoldenCase, ...] = (
    _aggregation_case(
        "token-mean", 2.4 / 3, 2.0 / 3, "(-1.2 + 2 + 1.6) / 3 tokens = 0.8; grad 2/3"
    ),
    _aggregation_case(
        "seq-mean-token-mean",
        0.3,
        2.0 / 4,
        "rows -1.2/1 and (2 + 1.6)/2 = 1.8; mean 0.3; grad 2 / 2 tokens / 2 rows = 0.5",
    ),
    _aggregation_case(
        "seq-mean-token-sum", 1.2, 1.0, "rows -1.2 and 3.6; mean 1.2; grad 2 / 2 rows = 1"
    ),
    _aggregation_case("token-sum", 2.4, 2.0, "-1.2 + 2 + 1.6 = 2.4; grad 2"),
    _aggregation_case(
        "token-sum-norm",
        0.3,
        2.0 / 8,
        "budget 4: rows -1.2/4 and 3.6/4, mean 0.3; grad 2 / 4 / 2 rows = 0.25",
    ),
    GoldenCase(
        name="dual-clip",
        claim="the dual clip caps a negative-advantage token's loss at -c A",
        arithmetic=(
            "r = 4, A = -1, eps 0.2, c = 3: PPO-clip gives max(4, 1.2) = 4; the dual clip",
            "takes min(4, -c A) = 3, a constant: loss 3, gradient 0.",
        ),
        evaluate=_dual_clip,
    ),
    GoldenCase(
        name="cispo",
        claim="CISPO: -sg(min(r, 1 + eps_high)) A log pi",
        arithmetic=(
            "r = 1.5 truncated to 1.2 (eps_high 0.2), A = 1, log pi = -0.5:",
            "loss = -1.2 * 1 * (-0.5) = 0.6; d/dlog pi = -1.2 (the weight is detached).",
        ),
        evaluate=_cispo,
    ),
    GoldenCase(
        name="gspo-sequence-ratio",
        claim="GSPO's ratio is exp(mean_t log r_t) and its gradient reaches every token",
        arithmetic=(
            "log r = (+1e-4, -1e-4): s = exp(0) = 1, inside 1 +- 4e-4; A = 1:",
            "loss = -A s = -1; d s / d logp_t = s / L = 1/2, so each gradient is -0.5.",
        ),
        evaluate=_gspo,
    ),
    GoldenCase(
        name="k3-value",
        claim="k3 = exp(lr) - 1 - lr with lr = log ref - log pi",
        arithmetic=(
            "pi = 0.4, ref = 0.2: lr = log 0.5; k3 = 0.5 - 1 - log 0.5 = log 2 - 0.5",
            "= 0.19314718...; pi = ref gives 0.",
        ),
        evaluate=_k3,
    ),
    GoldenCase(
        name="rloo-advantages",
        claim="RLOO: A_i = r_i - mean_{j != i} r_j",
        arithmetic=("rewards (1, 0, 0, 1): 1 - (0 + 0 + 1)/3 = 2/3 and 0 - (1 + 0 + 1)/3 = -2/3.",),
        evaluate=_rloo,
    ),
    GoldenCase(
        name="grpo-advantages",
        claim="GRPO: (r - mean) / (sample std + 1e-6)",
        arithmetic=(
            "rewards (1, 0, 0, 0): mean 0.25; sample variance (0.75^2 + 3 * 0.25^2) / 3",
            "= 0.25, std 0.5; A = 0.75 / 0.500001 and -0.25 / 0.500001.",
        ),
        evaluate=_grpo,
    ),
)
"""Every hand-derived case, in the order of ``docs/derivations/goldens.md``."""


def goldens_markdown() -> str:
    """The generated block of ``docs/derivations/goldens.md``: each case's claim and
    arithmetic."""
    lines = []
    for case in GOLDEN_CASES:
        lines += [f"### `{case.name}`", "", f"{case.claim}.", "", "```text"]
        lines += list(case.arithmetic)
        lines += ["```", ""]
    return "\n".join(lines).rstrip() + "\n"
