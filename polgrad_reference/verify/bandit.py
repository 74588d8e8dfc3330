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
algorithm's loss on the bandit to convergence.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch

from ..advantages import compute_advantages
from ..config import AdvantageEstimator, Aggregation, KLEstimator
from ..errors import InputError
from ..kl import k_values
from ..loss import policy_loss
from ..registry import get_algorithm

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
    if samples < 2:
        raise InputError(f"samples must be >= 2, got {samples}")
    g = torch.Generator().manual_seed(seed)
    arms = bandit.sample(logits, samples, g)
    ref = torch.log_softmax(bandit.ref_logits, 0)[arms]
    return _per_sample(logits, arms, lambda lp: k_values(KLEstimator(estimator), ref - lp))


@dataclasses.dataclass(frozen=True)
class TrainingRun:
    """The policy after training and the objective along the way."""

    logits: torch.Tensor
    objectives: tuple[float, ...]

    @property
    def best_arm_probability(self) -> float:
        return float(torch.softmax(self.logits, 0).max())


def _advantages(name: str, rewards: torch.Tensor, group: int) -> torch.Tensor:
    cfg = get_algorithm(name).advantage
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


def train(
    name: str,
    bandit: SoftmaxBandit,
    *,
    steps: int = 200,
    group: int = 16,
    prompts: int = 4,
    lr: float = 0.5,
    epochs: int = 2,
    seed: int = 0,
) -> TrainingRun:
    """Optimise the bandit with registry algorithm ``name``'s advantage estimator and
    policy loss: per step, ``prompts`` groups of ``group`` sampled arms, ``epochs``
    gradient steps on the same samples (so ratios leave 1 and clipping acts), plain SGD on
    the logits from zero. The reference policy for an as-loss KL is ``bandit.ref_logits``;
    rollout log-probs equal the old ones (no mismatch). A token-sum-norm budget is the
    bandit's generation budget, one token (Dr.GRPO's constant, arXiv:2503.20783)."""
    spec = get_algorithm(name)
    loss_cfg = spec.loss
    if loss_cfg.aggregation is Aggregation.TOKEN_SUM_NORM:
        loss_cfg = loss_cfg.replace(budget=1)
    g = torch.Generator().manual_seed(seed)
    logits = torch.zeros(bandit.arms, dtype=F64, requires_grad=True)
    n = group * prompts
    mask = torch.ones(n, 1, dtype=torch.bool)
    ref_all = torch.log_softmax(bandit.ref_logits, 0)
    objectives = []
    for _ in range(steps):
        arms = bandit.sample(logits, n, g)
        old = torch.log_softmax(logits.detach(), 0)[arms][:, None]
        adv = _advantages(name, bandit.rewards[arms], group)
        for _ in range(epochs):
            lp = torch.log_softmax(logits, 0)[arms][:, None]
            extra: dict[str, torch.Tensor] = {}
            if loss_cfg.kl_in_loss:
                extra["ref_logprobs"] = ref_all[arms][:, None]
            if loss_cfg.is_correction is not None:
                extra["rollout_logprobs"] = old
            out = policy_loss(
                loss_cfg,
                logprobs=lp,
                old_logprobs=old,
                advantages=adv,
                response_mask=mask,
                **extra,
            )
            (grad,) = torch.autograd.grad(out.loss, logits)
            with torch.no_grad():
                logits -= lr * grad
        objectives.append(float(bandit.objective(logits.detach())))
    return TrainingRun(logits.detach(), tuple(objectives))
