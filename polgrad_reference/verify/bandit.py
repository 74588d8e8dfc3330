"""A softmax bandit: a one-token "LLM" whose policy gradient and KL are known exactly.

Arms ``k = 1..K``, logits ``theta``, policy ``pi = softmax(theta)``, rewards ``r_k``,
reference policy ``pi_ref = softmax(theta_ref)``. In closed form:

- objective ``J = sum_k pi_k r_k``, gradient ``dJ/dtheta = pi * (r - J)``;
- ``KL(pi || pi_ref) = sum_k pi_k (log pi_k - log ref_k)``, gradient
  ``pi * (log pi - log ref - KL)`` (differentiate ``pi_k = exp(theta_k) / Z``).

A response is one sampled arm: ``logprobs = log pi(a)``, ``[n, 1]``. The expected gradient
of a per-sample loss estimator is estimated by Monte Carlo with its standard error, so a
claim "estimator X is unbiased for gradient G" is checked within CLT tolerances and "is
biased" by a distance of many of them (docs/derivations/kl.md). ``train`` runs a registry
algorithm's loss, a config or the user's own loss on the bandit to convergence.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch

from ..advantages import compute_advantages
from ..config import (
    AdvantageConfig,
    AdvantageEstimator,
    Aggregation,
    KLEstimator,
    PolicyLossConfig,
)
from ..errors import InputError, InputTypeError
from ..kl import k_values
from ..registry import get_algorithm
from ._convention import LossLike, loss_callable, require_positive
from ._errors import VerificationError

__all__ = ["GradientEstimate", "SoftmaxBandit", "TrainingRun", "kl_loss_gradient", "train"]

F64 = torch.float64


@dataclasses.dataclass(frozen=True)
class SoftmaxBandit:
    """``K`` arms with ``rewards`` and a reference policy given by ``ref_logits``."""

    rewards: torch.Tensor
    ref_logits: torch.Tensor

    def __post_init__(self) -> None:
        for name in ("rewards", "ref_logits"):
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.numel() < 2:
                raise InputError(f"{name} must be a 1-D tensor of at least 2 arms")
            if not bool(torch.isfinite(t).all()):
                raise InputError(f"{name} must be finite")
        if self.rewards.shape != self.ref_logits.shape:
            raise InputError(
                f"rewards and ref_logits must have the same shape, got "
                f"{list(self.rewards.shape)} and {list(self.ref_logits.shape)}"
            )
        object.__setattr__(self, "rewards", self.rewards.to(F64))
        object.__setattr__(self, "ref_logits", self.ref_logits.to(F64))

    @property
    def arms(self) -> int:
        return self.rewards.numel()

    def objective(self, logits: torch.Tensor) -> torch.Tensor:
        """``J = sum_k pi_k r_k``."""
        return (torch.softmax(logits, 0) * self.rewards).sum()

    def objective_gradient(self, logits: torch.Tensor) -> torch.Tensor:
        """``dJ/dtheta = pi * (r - J)``."""
        pi = torch.softmax(logits.detach(), 0)
        return pi * (self.rewards - (pi * self.rewards).sum())

    def kl(self, logits: torch.Tensor) -> torch.Tensor:
        """``KL(pi || pi_ref)``."""
        logp, logq = torch.log_softmax(logits, 0), torch.log_softmax(self.ref_logits, 0)
        return (logp.exp() * (logp - logq)).sum()

    def kl_gradient(self, logits: torch.Tensor) -> torch.Tensor:
        """``dKL/dtheta = pi * (log pi - log ref - KL)``."""
        logp = torch.log_softmax(logits.detach(), 0)
        diff = logp - torch.log_softmax(self.ref_logits, 0)
        pi = logp.exp()
        return pi * (diff - (pi * diff).sum())

    def sample(self, logits: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
        """``n`` arms drawn from ``pi``."""
        return torch.multinomial(torch.softmax(logits.detach(), 0), n, True, generator=generator)


@dataclasses.dataclass(frozen=True)
class GradientEstimate:
    """Monte Carlo mean of per-sample gradients and its standard error, per logit."""

    mean: torch.Tensor
    stderr: torch.Tensor

    def distance(self, exact: torch.Tensor) -> float:
        """Largest ``|mean - exact| / stderr`` over the logits (CLT: ~N(0, 1) each)."""
        return float(((self.mean - exact).abs() / self.stderr.clamp(min=1e-300)).max())


def _per_sample(
    logits: torch.Tensor,
    arms: torch.Tensor,
    loss_of_logprob: Callable[[torch.Tensor], torch.Tensor],
) -> GradientEstimate:
    """Gradients of ``loss_of_logprob(log pi(a_i))`` per sample: ``l'(log pi(a)) (e_a - pi)``."""
    logp = torch.log_softmax(logits.detach(), 0)
    lp = logp[arms].clone().requires_grad_(True)
    (dl,) = torch.autograd.grad(loss_of_logprob(lp).sum(), lp)
    onehot = torch.nn.functional.one_hot(arms, logits.numel()).to(F64)
    grads = dl[:, None] * (onehot - logp.exp()[None, :])
    n = arms.numel()
    return GradientEstimate(grads.mean(0), grads.std(0, unbiased=True) / math.sqrt(n))


def kl_loss_gradient(
    bandit: SoftmaxBandit,
    logits: torch.Tensor,
    estimator: KLEstimator,
    *,
    samples: int,
    seed: int,
) -> GradientEstimate:
    """Expected gradient of the KL estimator used as a loss, ``E_{a ~ pi}[d k(a) / d theta]``,
    on-policy. Compare with :meth:`SoftmaxBandit.kl_gradient`: k2 (and the "+" variants,
    which carry k2's gradient) match it; k1's expectation is 0 and k3's is
    ``sum_a (pi_a - ref_a) d log pi_a``, the gradient of the forward ``KL(ref || pi)``
    (``pi - ref`` on the softmax), not of ``KL(pi || ref)``."""
    if not isinstance(bandit, SoftmaxBandit):
        raise InputTypeError(f"bandit must be a SoftmaxBandit, got {type(bandit).__name__}")
    if not isinstance(logits, torch.Tensor):
        raise InputTypeError(f"logits must be a tensor, got {type(logits).__name__}")
    if logits.shape != bandit.rewards.shape or not bool(torch.isfinite(logits).all()):
        raise InputError(
            f"logits must be finite, of the bandit's shape {list(bandit.rewards.shape)}, got "
            f"shape {list(logits.shape)}"
        )
    samples = _count("samples", samples, 2)
    seed = _count("seed", seed, -(2**63))
    try:
        estimator = KLEstimator(estimator)
    except ValueError:
        known = ", ".join(repr(e.value) for e in KLEstimator)
        raise InputError(f"estimator must be one of {known}, got {estimator!r}") from None
    g = torch.Generator().manual_seed(seed)
    arms = bandit.sample(logits, samples, g)
    ref = torch.log_softmax(bandit.ref_logits, 0)[arms]
    return _per_sample(logits, arms, lambda lp: k_values(estimator, ref - lp))


@dataclasses.dataclass(frozen=True)
class TrainingRun:
    """The policy after training and the objective along the way."""

    logits: torch.Tensor
    objectives: tuple[float, ...]

    @property
    def best_arm_probability(self) -> float:
        return float(torch.softmax(self.logits, 0).max())


def _advantages(cfg: AdvantageConfig, rewards: torch.Tensor, group: int) -> torch.Tensor:
    n = rewards.numel()
    mask = torch.ones(n, 1, dtype=torch.bool)
    est = cfg.estimator
    if est is AdvantageEstimator.GAE:
        return compute_advantages(
            cfg, rewards=rewards, response_mask=mask, values=torch.zeros(n, 1, dtype=F64)
        )
    if est is AdvantageEstimator.REINFORCE_PP:
        return compute_advantages(cfg, rewards=rewards, response_mask=mask)
    if est in (AdvantageEstimator.REINFORCE_PP_BASELINE, AdvantageEstimator.OPO):
        return compute_advantages(cfg, rewards=rewards, response_mask=mask, group_size=group)
    return compute_advantages(cfg, rewards=rewards, group_size=group)


_GROUPED = frozenset(
    {
        AdvantageEstimator.GRPO,
        AdvantageEstimator.RLOO,
        AdvantageEstimator.OPO,
        AdvantageEstimator.REINFORCE_PP_BASELINE,
    }
)


def _count(name: str, value: object, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputTypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < least:
        raise InputError(f"{name} must be >= {least}, got {value}")
    return value


def _advantage_config(advantage: AdvantageConfig | str | None, default: str) -> AdvantageConfig:
    if advantage is None:
        return get_algorithm(default).advantage
    if isinstance(advantage, str):
        return get_algorithm(advantage).advantage
    if not isinstance(advantage, AdvantageConfig):
        raise InputTypeError(
            f"advantage must be an AdvantageConfig or a registry name, got "
            f"{type(advantage).__name__}"
        )
    return advantage


def train(
    loss: LossLike,
    bandit: SoftmaxBandit,
    *,
    advantage: AdvantageConfig | str | None = None,
    steps: int = 200,
    group: int = 16,
    prompts: int = 4,
    lr: float = 0.5,
    epochs: int = 2,
    seed: int = 0,
) -> TrainingRun:
    """Optimise the bandit with a policy loss and an advantage estimator: per step,
    ``prompts`` groups of ``group`` sampled arms, ``epochs`` gradient steps on the same
    samples (so ratios leave 1 and clipping acts), plain SGD on the logits from zero.

    ``loss`` is a registry name (its own advantage estimator by default), a
    :class:`~polgrad_reference.PolicyLossConfig`, or a callable with the policy-loss
    calling convention (keyword tensors ``logprobs``, ``old_logprobs``, ``advantages``,
    ``response_mask``, ``ref_logprobs``, ``rollout_logprobs``: those it takes; ``[n, 1]``
    tensors, ``advantages`` ``[n]`` or ``[n, 1]``). ``advantage`` is an
    :class:`~polgrad_reference.AdvantageConfig` or a registry name whose estimator to
    use; without it, a config or callable gets GRPO's. The reference policy for an
    as-loss KL is ``bandit.ref_logits``; rollout log-probs equal the old ones (no
    mismatch). A registry config's token-sum-norm budget is the bandit's generation
    budget, one token (Dr.GRPO's constant, arXiv:2503.20783).

    ``steps``, ``prompts`` and ``epochs`` are ints >= 1, ``group`` >= 2 for a group
    estimator (a group of one carries no relative signal) and >= 1 otherwise, ``lr`` a
    positive finite float. Raises :class:`VerificationError` when the loss is not
    differentiable in the logits or the logits stop being finite (``lr`` too large).
    """
    default = loss if isinstance(loss, str) else "grpo"
    adv_cfg = _advantage_config(advantage, default)
    if not isinstance(bandit, SoftmaxBandit):
        raise InputTypeError(f"bandit must be a SoftmaxBandit, got {type(bandit).__name__}")
    steps = _count("steps", steps, 1)
    group = _count("group", group, 2 if adv_cfg.estimator in _GROUPED else 1)
    prompts = _count("prompts", prompts, 1)
    epochs = _count("epochs", epochs, 1)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InputTypeError(f"seed must be an int, got {type(seed).__name__} {seed!r}")
    rate = require_positive("lr", lr)
    if group * prompts < 2:
        raise InputError(f"group * prompts must be >= 2 samples per step, got {group * prompts}")
    if isinstance(loss, str):
        loss = get_algorithm(loss).loss
    if isinstance(loss, PolicyLossConfig) and loss.aggregation is Aggregation.TOKEN_SUM_NORM:
        loss = loss.replace(budget=1)
    offered: tuple[str, ...] = ("logprobs", "old_logprobs", "advantages", "response_mask")
    offered += ("ref_logprobs", "rollout_logprobs")
    call, _ = loss_callable(loss, offered)
    g = torch.Generator().manual_seed(seed)
    logits = torch.zeros(bandit.arms, dtype=F64, requires_grad=True)
    n = group * prompts
    mask = torch.ones(n, 1, dtype=torch.bool)
    ref_all = torch.log_softmax(bandit.ref_logits, 0)
    objectives = []
    for step in range(steps):
        arms = bandit.sample(logits, n, g)
        old = torch.log_softmax(logits.detach(), 0)[arms][:, None]
        adv = _advantages(adv_cfg, bandit.rewards[arms], group)
        for _ in range(epochs):
            lp = torch.log_softmax(logits, 0)[arms][:, None]
            value = call(
                {
                    "logprobs": lp,
                    "old_logprobs": old,
                    "advantages": adv,
                    "response_mask": mask,
                    "ref_logprobs": ref_all[arms][:, None],
                    "rollout_logprobs": old,
                }
            )
            if not value.requires_grad:
                raise VerificationError(
                    "the loss is not differentiable in logprobs (no grad_fn: it was detached, "
                    "computed under torch.no_grad(), or does not use logprobs)"
                )
            (grad,) = torch.autograd.grad(value, logits, allow_unused=True)
            if grad is None:
                raise VerificationError("the loss does not depend on logprobs (gradient is None)")
            with torch.no_grad():
                logits -= rate * grad
            if not bool(torch.isfinite(logits.detach()).all()):
                raise VerificationError(
                    f"the logits stopped being finite at step {step} (loss "
                    f"{float(value.detach())}); lower lr={lr!r}"
                )
        objectives.append(float(bandit.objective(logits.detach())))
    return TrainingRun(logits.detach(), tuple(objectives))
