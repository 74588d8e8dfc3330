"""The registry of named algorithms: immutable specs with sources and unstated knobs.

Every constant is traced to its paper (or the paper's released code). Where a paper leaves
a knob open, the value chosen here is recorded in ``unstated`` as data, so a user can see
and override it (:meth:`AlgorithmSpec.derive`) instead of inheriting a silent default.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from .config import (
    AdvantageConfig,
    AdvantageEstimator,
    Aggregation,
    ClipConfig,
    ISCorrection,
    KLConfig,
    KLEstimator,
    KLPlacement,
    PolicyLossConfig,
    RatioKind,
    SurrogateKind,
)
from .errors import ConfigError

__all__ = ["ALGORITHMS", "AlgorithmSpec", "Unstated", "describe_algorithm", "get_algorithm"]


@dataclasses.dataclass(frozen=True)
class Unstated:
    """A knob the source leaves open, the value chosen here, and why."""

    knob: str
    value: object
    note: str


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
    """A named algorithm: loss config, advantage estimator, sources and open knobs."""

    name: str
    title: str
    loss: PolicyLossConfig
    advantage: AdvantageConfig
    sources: tuple[str, ...]
    unstated: tuple[Unstated, ...] = ()

    def derive(self, **changes: Any) -> AlgorithmSpec:
        """A validated copy with loss, clip or advantage fields changed; the registry is
        untouched. Clip fields (``eps_low``, ``eps_high``, ``dual_clip``) and loss fields
        (``aggregation``, ``budget``, ``ratio``, ``surrogate``, ``kl``, ``is_correction``,
        ``clip``) are routed by name; ``advantage=`` replaces the advantage config.
        Changing ``aggregation`` away from token-sum-norm drops the budget.
        """
        clip_fields = {f.name for f in dataclasses.fields(ClipConfig)}
        loss_fields = {f.name for f in dataclasses.fields(PolicyLossConfig)}
        clip_changes = {k: changes.pop(k) for k in list(changes) if k in clip_fields}
        advantage = changes.pop("advantage", self.advantage)
        unknown = set(changes) - loss_fields
        if unknown:
            allowed = sorted(clip_fields | loss_fields | {"advantage"})
            raise ConfigError(f"unknown override(s) {sorted(unknown)}; allowed: {allowed}")
        if not isinstance(advantage, AdvantageConfig):
            raise ConfigError(f"advantage must be an AdvantageConfig, got {advantage!r}")
        loss_changes = dict(changes)
        if clip_changes:
            base = loss_changes.get("clip", self.loss.clip)
            loss_changes["clip"] = base.replace(**clip_changes)
        new_agg = loss_changes.get("aggregation")
        if (
            new_agg is not None
            and "budget" not in loss_changes
            and Aggregation(new_agg) is not Aggregation.TOKEN_SUM_NORM
        ):
            loss_changes["budget"] = None
        loss = self.loss.replace(**loss_changes)
        return dataclasses.replace(self, loss=loss, advantage=advantage)


def _clip(low: float | None, high: float | None, dual: float | None = None) -> ClipConfig:
    return ClipConfig(eps_low=low, eps_high=high, dual_clip=dual)


_CLIP_02 = Unstated("clip", "eps_low=eps_high=0.2", "the paper does not state eps; 0.2 is PPO's")
_STD = (
    Unstated("advantage.std_eps", 1e-6, "epsilon added to the group std is not stated"),
    Unstated("advantage.unbiased_std", True, "Bessel's correction of the group std not stated"),
)

_SPECS = (
    AlgorithmSpec(
        name="ppo",
        title="PPO, clipped surrogate",
        loss=PolicyLossConfig(
            ratio=RatioKind.TOKEN,
            surrogate=SurrogateKind.PG_CLIP,
            clip=_clip(0.2, 0.2),
            aggregation=Aggregation.TOKEN_MEAN,
        ),
        advantage=AdvantageConfig(estimator=AdvantageEstimator.GAE, gamma=1.0, lam=0.95),
        sources=(
            "arXiv:1707.06347 Eq. 7 (clipped surrogate), Sec. 6.1 (eps = 0.2)",
            "arXiv:1506.02438 Eq. 16 (GAE)",
        ),
        unstated=(
            Unstated("aggregation", "token-mean", "the paper averages over timesteps of a batch"),
            Unstated("advantage.gamma", 1.0, "paper uses 0.99 for control; LLM RLHF uses 1"),
            Unstated("advantage.lam", 0.95, "the paper's Mujoco value (Table 3)"),
        ),
    ),
    AlgorithmSpec(
        name="grpo",
        title="GRPO (DeepSeekMath)",
        loss=PolicyLossConfig(
            ratio=RatioKind.TOKEN,
            surrogate=SurrogateKind.PG_CLIP,
            clip=_clip(0.2, 0.2),
            aggregation=Aggregation.SEQ_MEAN_TOKEN_MEAN,
            kl=KLConfig(estimator=KLEstimator.K3, placement=KLPlacement.LOSS, coef=0.04),
        ),
        advantage=AdvantageConfig(estimator=AdvantageEstimator.GRPO, scale_by_std=True),
        sources=(
            "arXiv:2402.03300 Eq. 3 (1/G sum_i 1/|o_i| sum_t), Eq. 4 (k3 KL in the loss)",
            "arXiv:2402.03300 Sec. 4.1.2 (group-normalised outcome advantages)",
            "arXiv:2402.03300 Sec. 4.2 (KL coefficient 0.04)",
        ),
        unstated=(_CLIP_02, *_STD),
    ),
    AlgorithmSpec(
        name="dr_grpo",
        title="Dr. GRPO (GRPO done right)",
        loss=PolicyLossConfig(
            ratio=RatioKind.TOKEN,
            surrogate=SurrogateKind.PG_CLIP,
            clip=_clip(0.2, 0.2),
            aggregation=Aggregation.TOKEN_SUM_NORM,
            budget=4096,
        ),
        advantage=AdvantageConfig(estimator=AdvantageEstimator.GRPO, scale_by_std=False),
        sources=(
            "arXiv:2503.20783 Sec. 3.1 (no 1/|o_i|, no std; divide by a constant)",
            "arXiv:2503.20783 released code: the constant is the generation budget",
        ),
        unstated=(
            Unstated(
                "budget",
                4096,
                "the constant is the run's generation budget (max new tokens); set it with "
                "derive(budget=...)",
            ),
            _CLIP_02,
        ),
    ),
    AlgorithmSpec(
        name="dapo",
        title="DAPO",
        loss=PolicyLossConfig(
            ratio=RatioKind.TOKEN,
            surrogate=SurrogateKind.PG_CLIP,
            clip=_clip(0.2, 0.28),
            aggregation=Aggregation.TOKEN_MEAN,
        ),
        advantage=AdvantageConfig(estimator=AdvantageEstimator.GRPO, scale_by_std=True),
        sources=(
            "arXiv:2503.14476 Eq. 8 (token-level mean over the batch)",
            "arXiv:2503.14476 Sec. 3.1 (clip-higher: eps_low 0.2, eps_high 0.28)",
            "arXiv:2503.14476 Sec. 2.3 (no KL term)",
        ),
        unstated=_STD,
    ),
    AlgorithmSpec(
        name="gspo",
        title="GSPO, sequence-level ratio",
        loss=PolicyLossConfig(
            ratio=RatioKind.SEQUENCE,
            surrogate=SurrogateKind.PG_CLIP,
            clip=_clip(3e-4, 4e-4),
            aggregation=Aggregation.SEQ_MEAN_TOKEN_MEAN,
        ),
        advantage=AdvantageConfig(estimator=AdvantageEstimator.GRPO, scale_by_std=True),
        sources=(
            "arXiv:2507.18071 Eq. 5-7 (length-normalised sequence ratio, sequence clipping)",
            "arXiv:2507.18071 Sec. 5.1 (clip ranges 3e-4 / 4e-4)",
        ),
        unstated=_STD,
    ),
    AlgorithmSpec(
        name="gspo_token",
        title="GSPO-token, sequence-ratio value with token-local gradient",
        loss=PolicyLossConfig(
            ratio=RatioKind.SEQUENCE_TOKEN,
            surrogate=SurrogateKind.PG_CLIP,
            clip=_clip(3e-4, 4e-4),
            aggregation=Aggregation.SEQ_MEAN_TOKEN_MEAN,
        ),
        advantage=AdvantageConfig(estimator=AdvantageEstimator.GRPO, scale_by_std=True),
        sources=("arXiv:2507.18071 Eq. 13-14 (GSPO-token)",),
        unstated=_STD,
    ),
    AlgorithmSpec(
        name="cispo",
        title="CISPO (MiniMax-M1)",
        loss=PolicyLossConfig(
            ratio=RatioKind.TOKEN,
            surrogate=SurrogateKind.CISPO,
            clip=_clip(None, 2.0),
            aggregation=Aggregation.TOKEN_MEAN,
        ),
        advantage=AdvantageConfig(estimator=AdvantageEstimator.GRPO, scale_by_std=True),
        sources=(
            "arXiv:2506.13585 Eq. 4 (sg(clipped IS weight) * A * log pi, token-level mean)",
            "arXiv:2506.13585 Sec. 3.1 (no lower bound on the IS weight)",
        ),
        unstated=(
            Unstated("clip.eps_high", 2.0, "the paper tunes eps_high but does not publish it"),
            *_STD,
        ),
    ),
    AlgorithmSpec(
        name="rloo",
        title="RLOO (REINFORCE leave-one-out)",
        loss=PolicyLossConfig(
            ratio=RatioKind.TOKEN,
            surrogate=SurrogateKind.REINFORCE,
            clip=_clip(0.2, 0.2),
            aggregation=Aggregation.SEQ_MEAN_TOKEN_SUM,
            kl=KLConfig(estimator=KLEstimator.K1, placement=KLPlacement.REWARD, coef=0.05),
        ),
        advantage=AdvantageConfig(estimator=AdvantageEstimator.RLOO),
        sources=(
            "arXiv:2402.14740 Eq. 6 (leave-one-out baseline)",
            "arXiv:2402.14740 Sec. 3 (whole completion is one action: sum of token log-probs)",
        ),
        unstated=(Unstated("kl.coef", 0.05, "the KL-in-reward coefficient varies per experiment"),),
    ),
    AlgorithmSpec(
        name="reinforce_pp",
        title="REINFORCE++",
        loss=PolicyLossConfig(
            ratio=RatioKind.TOKEN,
            surrogate=SurrogateKind.PG_CLIP,
            clip=_clip(0.2, 0.2),
            aggregation=Aggregation.TOKEN_MEAN,
            kl=KLConfig(estimator=KLEstimator.K1, placement=KLPlacement.REWARD, coef=0.01),
        ),
        advantage=AdvantageConfig(
            estimator=AdvantageEstimator.REINFORCE_PP, gamma=1.0, whiten=True
        ),
        sources=(
            "arXiv:2501.03262 Sec. 3 (token-level KL penalty in the reward, PPO clip, "
            "global advantage normalisation)",
        ),
        unstated=(
            Unstated("kl.coef", 0.01, "coefficient differs across the paper's experiments"),
            Unstated("aggregation", "token-mean", "follows the OpenRLHF implementation"),
        ),
    ),
    AlgorithmSpec(
        name="grpo_tis",
        title="GRPO with truncated importance sampling for rollout/trainer mismatch",
        loss=PolicyLossConfig(
            ratio=RatioKind.TOKEN,
            surrogate=SurrogateKind.PG_CLIP,
            clip=_clip(0.2, 0.2),
            aggregation=Aggregation.SEQ_MEAN_TOKEN_MEAN,
            kl=KLConfig(estimator=KLEstimator.K3, placement=KLPlacement.LOSS, coef=0.04),
            is_correction=ISCorrection(cap=2.0),
        ),
        advantage=AdvantageConfig(estimator=AdvantageEstimator.GRPO, scale_by_std=True),
        sources=(
            "Yao et al. 2025, 'Your efficient RL framework secretly brings you off-policy RL "
            "training' (token-level TIS, cap C = 2)",
            "verl#2953 (truncated IS correction for rollout/trainer logprob mismatch)",
            "arXiv:2402.03300 Eq. 3 (the GRPO loss it corrects)",
        ),
        unstated=(_CLIP_02, *_STD),
    ),
)

ALGORITHMS: Mapping[str, AlgorithmSpec] = MappingProxyType({s.name: s for s in _SPECS})
"""Read-only mapping from algorithm name to its :class:`AlgorithmSpec`."""


def get_algorithm(name: str) -> AlgorithmSpec:
    """Look up a registry entry; the error lists the known names."""
    try:
        return ALGORITHMS[name]
    except (KeyError, TypeError):
        raise ConfigError(
            f"unknown algorithm {name!r}; known: {', '.join(sorted(ALGORITHMS))}"
        ) from None


def _fmt(value: object) -> str:
    return value.value if hasattr(value, "value") else repr(value)


def describe_algorithm(name: str) -> str:
    """A readable card: every loss and advantage setting, the sources, the open knobs."""
    spec = get_algorithm(name)
    loss, clip = spec.loss, spec.loss.clip
    lines = [f"{spec.name}: {spec.title}", "loss:"]
    lines += [
        f"  ratio          {_fmt(loss.ratio)}",
        f"  surrogate      {_fmt(loss.surrogate)}",
        f"  clip           eps_low={clip.eps_low} eps_high={clip.eps_high} "
        f"dual_clip={clip.dual_clip}",
        f"  aggregation    {_fmt(loss.aggregation)}"
        + (f" (budget {loss.budget})" if loss.budget is not None else ""),
    ]
    if loss.kl is None:
        lines.append("  kl             none")
    else:
        kl = loss.kl
        lines.append(
            f"  kl             {_fmt(kl.estimator)} in the {_fmt(kl.placement)}, coef {kl.coef}"
        )
    corr = loss.is_correction
    lines.append(
        "  rollout IS     none"
        if corr is None
        else f"  rollout IS     {_fmt(corr.level)}-level {_fmt(corr.mode)} "
        f"(cap={corr.cap}, low={corr.low}, high={corr.high})"
    )
    adv = spec.advantage
    lines.append(
        f"advantage: {_fmt(adv.estimator)} (scale_by_std={adv.scale_by_std}, "
        f"std_eps={adv.std_eps}, unbiased_std={adv.unbiased_std}, gamma={adv.gamma}, "
        f"lam={adv.lam}, whiten={adv.whiten})"
    )
    lines.append("sources:")
    lines += [f"  - {s}" for s in spec.sources]
    if spec.unstated:
        lines.append("left open by the source (value chosen here):")
        lines += [f"  - {u.knob} = {u.value!r}: {u.note}" for u in spec.unstated]
    return "\n".join(lines)
