"""polgrad_reference: reference semantics of LLM policy-gradient losses.

Pure functions over torch tensors, exact in float64, every choice typed and cited. The
conformance kit (``pytest_polgrad``) is checked against this package; it imports nothing
but torch.
"""

from __future__ import annotations

from .aggregate import aggregate, microbatch_token_weights, token_weights
from .config import (
    AdvantageConfig,
    AdvantageEstimator,
    Aggregation,
    ClipConfig,
    ISCorrection,
    ISLevel,
    ISMode,
    KLConfig,
    KLEstimator,
    KLPlacement,
    MicroBatchScaling,
    PolicyLossConfig,
    RatioKind,
    SingletonGroup,
    SurrogateKind,
)
from .errors import ConfigError, InputError, InputTypeError, NumericalError, PolgradError
from .loss import PolicyLossOutput, policy_loss
from .ratios import ratio
from .registry import ALGORITHMS, AlgorithmSpec, Unstated, describe_algorithm, get_algorithm
from .surrogates import clip_region, surrogate

__all__ = [
    "ALGORITHMS",
    "AdvantageConfig",
    "AdvantageEstimator",
    "Aggregation",
    "AlgorithmSpec",
    "ClipConfig",
    "ConfigError",
    "ISCorrection",
    "ISLevel",
    "ISMode",
    "InputError",
    "InputTypeError",
    "KLConfig",
    "KLEstimator",
    "KLPlacement",
    "MicroBatchScaling",
    "NumericalError",
    "PolgradError",
    "PolicyLossConfig",
    "PolicyLossOutput",
    "RatioKind",
    "SingletonGroup",
    "SurrogateKind",
    "Unstated",
    "aggregate",
    "clip_region",
    "describe_algorithm",
    "get_algorithm",
    "microbatch_token_weights",
    "policy_loss",
    "ratio",
    "surrogate",
    "token_weights",
]
