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
    ClipBounds,
    ClipConfig,
    CovarianceSelection,
    DivergenceMask,
    GammaWeight,
    ISCorrection,
    ISLevel,
    ISMode,
    KLConfig,
    KLEstimator,
    KLPlacement,
    PolicyLossConfig,
    QuadraticPenalty,
    RatioKind,
    SoftGate,
    SurrogateKind,
    _closest,
    _enum,
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
        """A validated copy with loss, clip, surrogate-params or advantage fields changed; the
        registry is untouched. Clip fields (``eps_low``, ``eps_high``, ``dual_clip``,
        ``bounds``), the fields of the entry's ``params`` (e.g. ``tau_neg`` for SAPO) and
        loss fields (``aggregation``, ``budget``, ``ratio``, ``surrogate``, ``kl``,
        ``is_correction``, ``clip``, ``params``) are routed by name; ``advantage=``
        replaces the advantage config. Changing ``aggregation`` away from token-sum-norm
        drops the budget. Every error is a :class:`ConfigError` naming the allowed values.
        """
        clip_fields = {f.name for f in dataclasses.fields(ClipConfig)}
        loss_fields = {f.name for f in dataclasses.fields(PolicyLossConfig)}
        params = self.loss.params
        param_fields = {f.name for f in dataclasses.fields(params)} if params is not None else set()
        param_fields -= clip_fields | loss_fields
        clip_changes = {k: changes.pop(k) for k in list(changes) if k in clip_fields}
        param_changes = {k: changes.pop(k) for k in list(changes) if k in param_fields}
        advantage = changes.pop("advantage", self.advantage)
        unknown = set(changes) - loss_fields
        if unknown:
            allowed = sorted(clip_fields | loss_fields | param_fields | {"advantage"})
            raise ConfigError(f"unknown override(s) {sorted(unknown)}; allowed: {allowed}")
        if not isinstance(advantage, AdvantageConfig):
            raise ConfigError(f"advantage must be an AdvantageConfig, got {advantage!r}")
        loss_changes = dict(changes)
        if clip_changes:
            base = loss_changes.get("clip", self.loss.clip)
            loss_changes["clip"] = base.replace(**clip_changes)
        if param_changes:
            assert params is not None
            loss_changes["params"] = loss_changes.get("params", params).replace(**param_changes)
        new_agg = loss_changes.get("aggregation")
        if new_agg is not None:
            new_agg = loss_changes["aggregation"] = _enum(Aggregation, new_agg, "aggregation")
            if "budget" not in loss_changes and new_agg is not Aggregation.TOKEN_SUM_NORM:
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


_GRPO_ADV = AdvantageConfig(estimator=AdvantageEstimator.GRPO, scale_by_std=True)
_VERL = "verl 0.9.1 verl/trainer/ppo/core_algos.py"
_VERL_RC = "verl 0.9.1 verl/trainer/ppo/rollout_corr_helper.py and trainer/config/algorithm.py"
_TRL = "trl 1.16.0 trl/trainer/grpo_trainer.py (GRPOTrainer._compute_loss)"
_TOKEN_MEAN_VERL = Unstated(
    "aggregation", "token-mean", "the source leaves it open; verl's default loss_agg_mode"
)


_DPPO_CAP = Unstated(
    "params.is_cap",
    20.0,
    "verl's loss function falls back to 20 (arXiv:2602.04879 Sec. 5.4: a large cap), but "
    "ActorConfig.clip_ratio_c defaults to 3.0, so a default verl run truncates at 3",
)


def _grpo_is(corr: ISCorrection) -> PolicyLossConfig:
    """The GRPO paper's loss (no KL) under a rollout IS correction."""
    return PolicyLossConfig(
        ratio=RatioKind.TOKEN,
        surrogate=SurrogateKind.PG_CLIP,
        clip=_clip(0.2, 0.2),
        aggregation=Aggregation.SEQ_MEAN_TOKEN_MEAN,
        is_correction=corr,
    )


_IS_BASE = Unstated(
    "loss", "grpo without its KL term", "a correction applies to any loss; GRPO's is the carrier"
)

_VARIANTS = (
    AlgorithmSpec(
        name="ppo_dual_clip",
        title="PPO with dual clip",
        loss=PolicyLossConfig(clip=_clip(0.2, 0.2, 3.0), aggregation=Aggregation.TOKEN_MEAN),
        advantage=AdvantageConfig(estimator=AdvantageEstimator.GAE, gamma=1.0, lam=0.95),
        sources=(
            "arXiv:1912.09729 Eq. 5 (dual clip, c = 3)",
            f"{_VERL} compute_policy_loss_vanilla (clip_ratio_c = 3.0, always applied)",
        ),
        unstated=(Unstated("aggregation", "token-mean", "as the ppo entry"),),
    ),
    AlgorithmSpec(
        name="sapo",
        title="SAPO, soft adaptive policy optimization",
        loss=PolicyLossConfig(
            surrogate=SurrogateKind.SAPO,
            aggregation=Aggregation.SEQ_MEAN_TOKEN_MEAN,
            params=SoftGate(tau_pos=1.0, tau_neg=1.05),
        ),
        advantage=_GRPO_ADV,
        sources=(
            "arXiv:2511.20347 (sigmoid gate 4/tau sigmoid(tau (r - 1)); tau_pos 1.0, tau_neg 1.05)",
            f"{_VERL} compute_policy_loss_sapo (seq-mean-token-mean, whatever loss_agg_mode)",
            f"{_TRL} loss_type='sapo' (temperature per advantage sign, A <= 0 takes tau_neg)",
        ),
        unstated=_STD,
    ),
    AlgorithmSpec(
        name="gmpo",
        title="GMPO, geometric-mean policy optimization",
        loss=PolicyLossConfig(
            surrogate=SurrogateKind.GMPO,
            clip=_clip(0.4, 0.4),
            aggregation=Aggregation.SEQ_MEAN_TOKEN_MEAN,
        ),
        advantage=_GRPO_ADV,
        sources=(
            "arXiv:2507.20673 Eq. 6 (geometric mean of token ratios, clipped in log space)",
            "arXiv:2507.20673 Sec. 4 (clip range (e^-0.4, e^0.4))",
            f"{_VERL} compute_policy_loss_geo_mean (mean over sequences)",
        ),
        unstated=_STD,
    ),
    AlgorithmSpec(
        name="dppo_tv",
        title="DPPO, binary total-variation trust region",
        loss=PolicyLossConfig(
            surrogate=SurrogateKind.DPPO_TV,
            aggregation=Aggregation.TOKEN_MEAN,
            params=DivergenceMask(delta_low=0.2, delta_high=0.2, is_cap=20.0),
        ),
        advantage=_GRPO_ADV,
        sources=(
            "arXiv:2602.04879 (divergence trust region on the sampled token's probability)",
            "arXiv:2602.04879 Sec. 5.4 (truncated IS weight with a large cap instead of dual clip)",
            f"{_VERL} compute_policy_loss_dppo_tv (cap clip_ratio_c, function fallback 20)",
        ),
        unstated=(
            *(
                Unstated(
                    f"params.{side}",
                    0.2,
                    "verl reads its clip_ratio (0.2) as the TV threshold; the paper's "
                    f"value is not recorded here; set it with derive({side}=...)",
                )
                for side in ("delta_low", "delta_high")
            ),
            _DPPO_CAP,
            _TOKEN_MEAN_VERL,
            *_STD,
        ),
    ),
    AlgorithmSpec(
        name="dppo_kl",
        title="DPPO, binary KL trust region",
        loss=PolicyLossConfig(
            surrogate=SurrogateKind.DPPO_KL,
            aggregation=Aggregation.TOKEN_MEAN,
            params=DivergenceMask(delta_low=0.2, delta_high=0.2, is_cap=20.0),
        ),
        advantage=_GRPO_ADV,
        sources=(
            "arXiv:2602.04879 (binary KL between Bernoulli(p_old) and Bernoulli(p))",
            f"{_VERL} compute_policy_loss_dppo_kl (cap clip_ratio_c, function fallback 20)",
        ),
        unstated=(
            *(
                Unstated(
                    f"params.{side}",
                    0.2,
                    "verl reads its clip_ratio (0.2) as the KL threshold; the paper's "
                    f"value is not recorded here; set it with derive({side}=...)",
                )
                for side in ("delta_low", "delta_high")
            ),
            _DPPO_CAP,
            _TOKEN_MEAN_VERL,
            *_STD,
        ),
    ),
    AlgorithmSpec(
        name="gpg",
        title="GPG, group policy gradient",
        loss=PolicyLossConfig(
            surrogate=SurrogateKind.REINFORCE, aggregation=Aggregation.TOKEN_MEAN
        ),
        advantage=AdvantageConfig(estimator=AdvantageEstimator.GRPO, scale_by_std=False),
        sources=(
            "arXiv:2504.02546 (plain policy gradient -A log pi, no ratio, no clip, no KL)",
            f"{_VERL} compute_policy_loss_gpg and compute_gpg_outcome_advantage",
        ),
        unstated=(
            Unstated(
                "advantage.alpha",
                "not modelled",
                "GPG rescales group-centred rewards by B / (number of non-zero rewards); "
                "the reference advantage omits that factor",
            ),
            _TOKEN_MEAN_VERL,
        ),
    ),
    AlgorithmSpec(
        name="clip_cov",
        title="Clip-Cov (entropy mechanism)",
        loss=PolicyLossConfig(
            surrogate=SurrogateKind.CLIP_COV,
            clip=_clip(0.2, 0.2),
            aggregation=Aggregation.TOKEN_MEAN,
            params=CovarianceSelection(fraction=2e-4, low=1.0, high=5.0),
        ),
        advantage=_GRPO_ADV,
        sources=(
            "arXiv:2505.22617 Sec. 4 (detach the gradient of a few high-covariance tokens)",
            f"{_VERL} compute_policy_loss_clip_cov (fraction 2e-4, window (1, 5))",
        ),
        unstated=(
            Unstated(
                "token_selection",
                "every candidate when there are at most k; else k drawn with seed 0",
                "verl draws k of the candidates with the global RNG; the reference draws with "
                "a seeded generator (params.seed) or takes token_selection= as an input",
            ),
            _TOKEN_MEAN_VERL,
            *_STD,
        ),
    ),
    AlgorithmSpec(
        name="kl_cov",
        title="KL-Cov (entropy mechanism)",
        loss=PolicyLossConfig(
            surrogate=SurrogateKind.KL_COV,
            aggregation=Aggregation.TOKEN_MEAN,
            params=CovarianceSelection(fraction=2e-4, kl_coef=1.0),
        ),
        advantage=_GRPO_ADV,
        sources=(
            "arXiv:2505.22617 Sec. 4 (KL penalty |log r| on the top-k covariance tokens)",
            f"{_VERL} compute_policy_loss_kl_cov (fraction 2e-4, coefficient 1.0)",
        ),
        unstated=(
            Unstated(
                "token_selection", "top-k, ties by lowest index", "verl's topk leaves ties open"
            ),
            Unstated(
                "params.kl_coef",
                1.0,
                "the loss function's coefficient; verl's ActorConfig passes ppo_kl_coef = 0.1 "
                "(verl/workers/config/actor.py): set it with derive(kl_coef=0.1)",
            ),
            _TOKEN_MEAN_VERL,
            *_STD,
        ),
    ),
    AlgorithmSpec(
        name="dro",
        title="DRO, direct reward optimization with a quadratic log-ratio penalty",
        loss=PolicyLossConfig(
            surrogate=SurrogateKind.DRO,
            aggregation=Aggregation.TOKEN_MEAN,
            params=QuadraticPenalty(beta=1.0),
        ),
        advantage=_GRPO_ADV,
        sources=(f"{_VERL} compute_policy_loss_dro (-(A log pi - beta/2 (log r)^2))",),
        unstated=(
            Unstated(
                "params.beta",
                1.0,
                "verl requires policy_loss.dro_beta > 0 and ships no default; set it with "
                "derive(beta=...)",
            ),
            _TOKEN_MEAN_VERL,
            *_STD,
        ),
    ),
    AlgorithmSpec(
        name="luspo",
        title="LUSPO, length-unbiased sequence policy optimization",
        loss=PolicyLossConfig(
            ratio=RatioKind.SEQUENCE,
            surrogate=SurrogateKind.PG_CLIP,
            clip=_clip(3e-4, 4e-4),
            aggregation=Aggregation.SEQ_MEAN_TOKEN_SUM,
        ),
        advantage=_GRPO_ADV,
        sources=(
            "arXiv:2602.05261 (GSPO with each sequence's loss scaled by its length)",
            f"{_TRL} loss_type='luspo' ((per_token_loss * mask).sum(-1).mean())",
        ),
        unstated=(
            Unstated(
                "clip", "eps 3e-4 / 4e-4", "GSPO's ranges; the LUSPO value is not recorded here"
            ),
            *_STD,
        ),
    ),
    AlgorithmSpec(
        name="vespo",
        title="VESPO, gamma-weighted sequence-level soft policy optimization",
        loss=PolicyLossConfig(
            surrogate=SurrogateKind.VESPO,
            aggregation=Aggregation.TOKEN_MEAN,
            params=GammaWeight(k_pos=2.0, lambda_pos=3.0, k_neg=3.0, lambda_neg=2.0),
        ),
        advantage=_GRPO_ADV,
        sources=(
            "arXiv:2602.10693 (gamma weighting phi(w) = e^lambda w^k e^(-lambda w) of the "
            "sequence IS ratio)",
            f"{_TRL} loss_type='vespo' and get_gamma_weights (k/lambda 2/3 for A >= 0, 3/2 "
            "else; token-mean over the batch)",
        ),
        unstated=_STD,
    ),
    AlgorithmSpec(
        name="scalerl_cispo",
        title="CISPO with an absolute truncation cap (ScaleRL)",
        loss=PolicyLossConfig(
            surrogate=SurrogateKind.CISPO,
            clip=ClipConfig(None, 5.0, bounds=ClipBounds.ABSOLUTE),
            aggregation=Aggregation.TOKEN_MEAN,
        ),
        advantage=_GRPO_ADV,
        sources=(
            "arXiv:2510.13786 (CISPO with eps_max = 5)",
            f"{_TRL} loss_type='cispo': clamp(r, max=epsilon_high), epsilon_high the cap itself",
        ),
        unstated=_STD,
    ),
    AlgorithmSpec(
        name="grpo_mis",
        title="GRPO with token-level masked importance sampling",
        loss=_grpo_is(ISCorrection(level=ISLevel.TOKEN, mode=ISMode.ZERO, high=3.0)),
        advantage=_GRPO_ADV,
        sources=(
            f"{_TRL} vllm_importance_sampling_mode='token_mask' (ratio > C_max -> 0; C_max 3.0)",
        ),
        unstated=(_IS_BASE, _CLIP_02, *_STD),
    ),
    AlgorithmSpec(
        name="grpo_seq_tis",
        title="GRPO with sequence-level truncated importance sampling",
        loss=_grpo_is(ISCorrection(level=ISLevel.SEQUENCE, mode=ISMode.TRUNCATE, cap=2.0)),
        advantage=_GRPO_ADV,
        sources=(
            f"{_VERL_RC}: rollout_is='sequence', rollout_is_threshold 2.0 (the defaults)",
            "verl#2953 (truncated IS correction for rollout/trainer mismatch)",
        ),
        unstated=(_IS_BASE, _CLIP_02, *_STD),
    ),
    AlgorithmSpec(
        name="grpo_seq_mis",
        title="GRPO with sequence-level masked importance sampling",
        loss=_grpo_is(ISCorrection(level=ISLevel.SEQUENCE, mode=ISMode.ZERO, high=3.0)),
        advantage=_GRPO_ADV,
        sources=(f"{_TRL} vllm_importance_sampling_mode='sequence_mask' (the default), C_max 3.0",),
        unstated=(_IS_BASE, _CLIP_02, *_STD),
    ),
    AlgorithmSpec(
        name="icepop",
        title="IcePop: token-level masked IS with a two-sided band",
        loss=_grpo_is(ISCorrection(level=ISLevel.TOKEN, mode=ISMode.ZERO, low=0.5, high=5.0)),
        advantage=_GRPO_ADV,
        sources=(
            "arXiv:2510.18855 (IcePop: zero the gradient of tokens whose training/inference "
            "probability ratio leaves [alpha, beta])",
            f"{_VERL_RC} decoupled_token_icepop (band 0.5_5.0; weights outside set to 0, "
            "response_mask unchanged)",
        ),
        unstated=(_IS_BASE, _CLIP_02, *_STD),
    ),
    AlgorithmSpec(
        name="grpo_geo_rs",
        title="GRPO with geometric-mean rejection sampling",
        loss=_grpo_is(
            ISCorrection(
                level=ISLevel.GEOMETRIC, mode=ISMode.MASK, low=1.0 / 1.001, high=1.0 / 0.999
            )
        ),
        advantage=_GRPO_ADV,
        sources=(
            f"{_VERL_RC} decoupled_geo_rs: rollout_rs='seq_mean_k1', threshold 0.999_1.001",
            "verl 0.9.1 rollout_corr_helper.py compute_rollout_rejection_mask tests "
            "mean(log(pi_rollout / pi_old)) against log(0.999), log(1.001): in "
            "rho = pi_old / pi_rollout that is [1/1.001, 1/0.999]",
        ),
        unstated=(_IS_BASE, _CLIP_02, *_STD),
    ),
    AlgorithmSpec(
        name="bypass_pg",
        title="verl bypass mode, REINFORCE with a truncated sequence IS weight",
        loss=PolicyLossConfig(
            ratio=RatioKind.SEQUENCE_PRODUCT,
            surrogate=SurrogateKind.CISPO,
            clip=ClipConfig(None, 2.0, bounds=ClipBounds.ABSOLUTE),
            aggregation=Aggregation.TOKEN_MEAN,
        ),
        advantage=_GRPO_ADV,
        sources=(
            f"{_VERL} compute_policy_loss_bypass_mode, loss_type='reinforce': "
            "-A log pi sg(min(pi / pi_rollout, C)) with old_logprobs = rollout_logprobs",
            f"{_VERL_RC} bypass_pg_is (rollout_is='sequence', threshold 2.0)",
        ),
        unstated=(_TOKEN_MEAN_VERL, *_STD),
    ),
)

ALGORITHMS: Mapping[str, AlgorithmSpec] = MappingProxyType({s.name: s for s in _SPECS + _VARIANTS})
"""Read-only mapping from algorithm name to its :class:`AlgorithmSpec`."""


def get_algorithm(name: str) -> AlgorithmSpec:
    """Look up a registry entry; the error lists the known names."""
    try:
        return ALGORITHMS[name]
    except (KeyError, TypeError):
        best = _closest(name, sorted(ALGORITHMS))
        hint = "" if best is None else f" (did you mean {best!r}?)"
        raise ConfigError(
            f"unknown algorithm {name!r}{hint}; known: {', '.join(sorted(ALGORITHMS))}"
        ) from None


def _fmt(value: object) -> str:
    return value.value if hasattr(value, "value") else repr(value)


_READS_CLIP = frozenset(
    {SurrogateKind.PG_CLIP, SurrogateKind.CISPO, SurrogateKind.GMPO, SurrogateKind.CLIP_COV}
)


def describe_algorithm(name: str) -> str:
    """A readable card: every loss and advantage setting, the sources, the open knobs."""
    spec = get_algorithm(name)
    loss, clip = spec.loss, spec.loss.clip
    lines = [f"{spec.name}: {spec.title}", "loss:"]
    lines += [
        f"  ratio          {_fmt(loss.ratio)}",
        f"  surrogate      {_fmt(loss.surrogate)}",
        f"  clip           eps_low={clip.eps_low} eps_high={clip.eps_high} "
        f"dual_clip={clip.dual_clip} bounds={_fmt(clip.bounds)}"
        + ("" if loss.surrogate in _READS_CLIP else " (not read by this surrogate)"),
        f"  aggregation    {_fmt(loss.aggregation)}"
        + (f" (budget {loss.budget})" if loss.budget is not None else ""),
    ]
    if loss.params is not None:
        fields = ", ".join(
            f"{f.name}={getattr(loss.params, f.name)!r}" for f in dataclasses.fields(loss.params)
        )
        lines.append(f"  params         {type(loss.params).__name__}({fields})")
    if loss.kl is None:
        lines.append("  kl             none")
    else:
        kl = loss.kl
        weight = (
            "" if kl.ratio_weight.value == "none" else f", ratio weight {_fmt(kl.ratio_weight)}"
        )
        cap = "" if kl.ratio_cap is None else f" (cap {kl.ratio_cap})"
        lines.append(
            f"  kl             {_fmt(kl.estimator)} in the {_fmt(kl.placement)}, coef {kl.coef}"
            f"{weight}{cap}"
        )
    corr = loss.is_correction
    lines.append(
        "  rollout IS     none"
        if corr is None
        else f"  rollout IS     {_fmt(corr.level)}-level {_fmt(corr.mode)} "
        f"(cap={corr.cap}, low={corr.low}, high={corr.high}, weight={_fmt(corr.weight)})"
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
