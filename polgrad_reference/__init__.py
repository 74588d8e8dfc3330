"""polgrad_reference: reference semantics of LLM policy-gradient losses.

Pure functions over torch tensors, exact in float64, every choice typed and cited. The
conformance kit (``pytest_polgrad``) is checked against this package; it imports nothing
but torch.
"""

from __future__ import annotations

from .advantages import (
    compute_advantages,
    discounted_returns,
    gae,
    grpo_advantages,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
    token_level_rewards,
    whiten,
)
from .aggregate import aggregate, microbatch_token_weights, token_weights
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
    ISWeight,
    KLConfig,
    KLEstimator,
    KLPlacement,
    KLRatioWeight,
    MicroBatchScaling,
    PolicyLossConfig,
    QuadraticPenalty,
    RatioKind,
    SingletonGroup,
    SoftGate,
    SurrogateKind,
    SurrogateParams,
)
from .errors import ConfigError, InputError, InputTypeError, NumericalError, PolgradError
from .kl import categorical_kl, kl_estimate, kl_penalized_rewards, reverse_kl_surrogate
from .loss import PolicyLossOutput, covariance_selection, policy_loss
from .ratios import ratio
from .registry import ALGORITHMS, AlgorithmSpec, Unstated, describe_algorithm, get_algorithm
from .surrogates import clip_region, kink_ratios, surrogate
from .value import clipped_value_loss, value_loss_per_token

__all__ = [
    "ALGORITHMS",
    "AdvantageConfig",
    "AdvantageEstimator",
    "Aggregation",
    "AlgorithmSpec",
    "ClipBounds",
    "ClipConfig",
    "ConfigError",
    "CovarianceSelection",
    "DivergenceMask",
    "GammaWeight",
    "ISCorrection",
    "ISLevel",
    "ISMode",
    "ISWeight",
    "InputError",
    "InputTypeError",
    "KLConfig",
    "KLEstimator",
    "KLPlacement",
    "KLRatioWeight",
    "MicroBatchScaling",
    "NumericalError",
    "PolgradError",
    "PolicyLossConfig",
    "PolicyLossOutput",
    "QuadraticPenalty",
    "RatioKind",
    "SingletonGroup",
    "SoftGate",
    "SurrogateKind",
    "SurrogateParams",
    "Unstated",
    "aggregate",
    "categorical_kl",
    "clip_region",
    "clipped_value_loss",
    "compute_advantages",
    "covariance_selection",
    "describe_algorithm",
    "discounted_returns",
    "gae",
    "get_algorithm",
    "grpo_advantages",
    "kink_ratios",
    "kl_estimate",
    "kl_penalized_rewards",
    "microbatch_token_weights",
    "policy_loss",
    "ratio",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "reverse_kl_surrogate",
    "rloo_advantages",
    "surrogate",
    "token_level_rewards",
    "token_weights",
    "value_loss_per_token",
    "whiten",
]
