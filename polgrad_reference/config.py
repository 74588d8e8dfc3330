"""Typed configuration of every semantic choice a policy-gradient loss makes.

Configs are frozen dataclasses with string-valued enums. Strings are accepted where an
enum is expected (``Aggregation("token-mean")``) and every value is range-checked at
construction, so an invalid config cannot exist.
"""

from __future__ import annotations

import dataclasses
import math
from enum import Enum
from typing import Any, TypeVar

from .errors import ConfigError

__all__ = [
    "AdvantageConfig",
    "AdvantageEstimator",
    "Aggregation",
    "ClipConfig",
    "ISCorrection",
    "ISLevel",
    "ISMode",
    "KLConfig",
    "KLEstimator",
    "KLPlacement",
    "MicroBatchScaling",
    "PolicyLossConfig",
    "RatioKind",
    "SingletonGroup",
    "SurrogateKind",
]


class RatioKind(str, Enum):
    """How the importance ratio between the current and the behaviour policy is formed."""

    TOKEN = "token"
    """``r_t = exp(logprobs_t - old_logprobs_t)`` (PPO, arXiv:1707.06347 Eq. 6)."""
    SEQUENCE = "sequence"
    """``s = exp(mean_t (logprobs_t - old_logprobs_t))``, gradient through every token
    (GSPO, arXiv:2507.18071 Eq. 7)."""
    SEQUENCE_TOKEN = "sequence_token"
    """Value of the sequence ratio, token-local gradient (GSPO-token, arXiv:2507.18071 Eq. 13)."""


class SurrogateKind(str, Enum):
    """The per-token objective whose gradient is the policy gradient."""

    PG_CLIP = "pg_clip"
    """``-min(r A, clip(r, 1-eps_low, 1+eps_high) A)``, optional dual clip (arXiv:1707.06347
    Eq. 7; dual clip arXiv:1912.09729 Eq. 5)."""
    PG = "pg"
    """``-r A``: the unclipped importance-weighted policy gradient."""
    REINFORCE = "reinforce"
    """``-A log pi``: REINFORCE (Williams 1992); ignores ``old_logprobs``."""
    CISPO = "cispo"
    """``-sg(clip(r, 1-eps_low, 1+eps_high)) A log pi`` (MiniMax-M1, arXiv:2506.13585 Eq. 4)."""


class Aggregation(str, Enum):
    """How per-token losses ``x[b, t]`` become one scalar; each is ``sum w[b, t] x[b, t]``."""

    TOKEN_MEAN = "token-mean"
    """``sum x / sum mask`` (DAPO, arXiv:2503.14476 Eq. 8)."""
    SEQ_MEAN_TOKEN_MEAN = "seq-mean-token-mean"
    """``mean_b (sum_t x / L_b)`` (GRPO, arXiv:2402.03300 Eq. 3)."""
    SEQ_MEAN_TOKEN_SUM = "seq-mean-token-sum"
    """``mean_b sum_t x`` (sequence log-likelihood objective, e.g. RLOO arXiv:2402.14740)."""
    TOKEN_SUM = "token-sum"
    """``sum x``."""
    TOKEN_SUM_NORM = "token-sum-norm"
    """``sum x / (B * budget)`` with a fixed generation budget (Dr.GRPO, arXiv:2503.20783
    Sec. 3.1 and its released code)."""


class MicroBatchScaling(str, Enum):
    """How micro-batch losses are combined under gradient accumulation."""

    MEAN = "mean"
    """Each micro-batch loss is divided by the number of micro-batches (the usual
    ``loss / gradient_accumulation_steps``)."""
    SUM = "sum"
    """Micro-batch losses are summed unscaled."""


class ISLevel(str, Enum):
    """Granularity of the rollout/trainer importance-sampling correction."""

    TOKEN = "token"
    SEQUENCE = "sequence"


class ISMode(str, Enum):
    """What is done with the rollout/trainer importance weight."""

    TRUNCATE = "truncate"
    """Multiply the loss by ``sg(min(rho, cap))`` (truncated IS, verl#2953)."""
    MASK = "mask"
    """Drop tokens (or whole sequences) whose ``rho`` leaves ``[low, high]`` from the
    response mask, so they leave the aggregation's denominators too."""


class KLEstimator(str, Enum):
    """Per-token estimators of ``KL(pi || ref)`` from samples of ``pi`` (Schulman, 2020)."""

    K1 = "k1"
    """``log pi - log ref``: unbiased, high variance, can be negative."""
    K2 = "k2"
    """``(log pi - log ref)^2 / 2``: biased, low variance; its gradient as a loss is the
    score-function gradient of the reverse KL."""
    K3 = "k3"
    """``exp(log ref - log pi) - 1 - (log ref - log pi)``: unbiased, non-negative."""


class KLPlacement(str, Enum):
    """Where a KL penalty enters the objective."""

    LOSS = "loss"
    """Added to the loss with its own coefficient and aggregation (GRPO, arXiv:2402.03300 Eq. 3)."""
    REWARD = "reward"
    """Subtracted per token from the reward before advantages (InstructGPT, arXiv:2203.02155
    Eq. 2)."""


class AdvantageEstimator(str, Enum):
    """How advantages are computed from rewards."""

    GRPO = "grpo"
    """``(r - mean_group) / (std_group + eps)`` (arXiv:2402.03300 Sec. 4.1.2)."""
    RLOO = "rloo"
    """``r_i - mean_{j != i} r_j`` (arXiv:2402.14740 Eq. 6)."""
    REINFORCE_PP = "reinforce_pp"
    """Per-token discounted return, whitened over the global batch (arXiv:2501.03262 Sec. 3)."""
    REINFORCE_PP_BASELINE = "reinforce_pp_baseline"
    """Group-mean baseline, then global whitening (arXiv:2501.03262 v3, 'REINFORCE++-baseline')."""
    GAE = "gae"
    """Generalised advantage estimation with a critic (arXiv:1506.02438 Eq. 16)."""


class SingletonGroup(str, Enum):
    """What group normalisation does with a group of one sample (its std is undefined)."""

    ZERO = "zero"
    """Advantage 0: a lone sample carries no relative signal."""
    ERROR = "error"
    """Raise: the caller asked for groups and built one of size one."""


_E = TypeVar("_E", bound=Enum)


def _enum(cls: type[_E], value: object, field: str) -> _E:
    if isinstance(value, cls):
        return value
    try:
        return cls(value)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in cls)
        raise ConfigError(f"{field} must be one of {allowed}, got {value!r}") from None


def _real(value: object, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{field} must be a real number, got {value!r}")
    if not math.isfinite(value):
        raise ConfigError(f"{field} must be finite, got {value!r}")
    return float(value)


def _positive_int(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{field} must be a positive integer, got {value!r}")
    if value < 1:
        raise ConfigError(f"{field} must be a positive integer, got {value!r}")
    return value


def _set(obj: object, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)


class _Derivable:
    """Adds :meth:`replace`, a validated copy with some fields changed."""

    def replace(self: Any, **changes: Any) -> Any:
        """Return a copy with ``changes`` applied; the copy is validated again."""
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class ClipConfig(_Derivable):
    """Ratio clipping range ``[1 - eps_low, 1 + eps_high]`` and optional dual-clip constant.

    ``None`` for ``eps_low``/``eps_high`` leaves that side unbounded (CISPO's one-sided
    truncation, arXiv:2506.13585 Sec. 3.1). ``dual_clip`` (``c > 1``) bounds the loss of
    negative-advantage tokens at ``-c A`` (arXiv:1912.09729 Eq. 5).
    """

    eps_low: float | None = 0.2
    eps_high: float | None = 0.2
    dual_clip: float | None = None

    def __post_init__(self) -> None:
        if self.eps_low is not None:
            low = _real(self.eps_low, "eps_low")
            if not 0.0 <= low < 1.0:
                raise ConfigError(f"eps_low must lie in [0, 1) so that 1 - eps_low > 0, got {low}")
            _set(self, "eps_low", low)
        if self.eps_high is not None:
            high = _real(self.eps_high, "eps_high")
            if high < 0.0:
                raise ConfigError(f"eps_high must be >= 0, got {high}")
            _set(self, "eps_high", high)
        if self.dual_clip is not None:
            c = _real(self.dual_clip, "dual_clip")
            if c <= 1.0:
                raise ConfigError(f"dual_clip must be > 1 (arXiv:1912.09729), got {c}")
            if self.eps_high is not None and c <= 1.0 + self.eps_high:
                raise ConfigError(
                    f"dual_clip must exceed 1 + eps_high = {1.0 + self.eps_high}, got {c}"
                )
            _set(self, "dual_clip", c)

    @property
    def low(self) -> float | None:
        """Lower ratio bound ``1 - eps_low`` (None when unbounded)."""
        return None if self.eps_low is None else 1.0 - self.eps_low

    @property
    def high(self) -> float | None:
        """Upper ratio bound ``1 + eps_high`` (None when unbounded)."""
        return None if self.eps_high is None else 1.0 + self.eps_high


@dataclasses.dataclass(frozen=True)
class ISCorrection(_Derivable):
    """Rollout/trainer importance-sampling correction with ``rho = pi_old / pi_rollout``.

    Token level uses ``rho_t = exp(old_logprobs_t - rollout_logprobs_t)``; sequence level
    uses ``rho = exp(sum_t (old_logprobs_t - rollout_logprobs_t))``. The weight is always
    detached (verl#2953; Yao et al. 2025, "Your efficient RL framework secretly brings you
    off-policy RL training").
    """

    level: ISLevel = ISLevel.TOKEN
    mode: ISMode = ISMode.TRUNCATE
    cap: float | None = 2.0
    low: float | None = None
    high: float | None = None

    def __post_init__(self) -> None:
        _set(self, "level", _enum(ISLevel, self.level, "level"))
        _set(self, "mode", _enum(ISMode, self.mode, "mode"))
        if self.mode is ISMode.TRUNCATE:
            if self.cap is None:
                raise ConfigError("cap is required for mode='truncate'")
            cap = _real(self.cap, "cap")
            if cap <= 0.0:
                raise ConfigError(f"cap must be > 0, got {cap}")
            _set(self, "cap", cap)
            if self.low is not None or self.high is not None:
                raise ConfigError("low/high apply to mode='mask' only; use cap for 'truncate'")
        else:
            if self.low is None and self.high is None:
                raise ConfigError("mode='mask' needs low, high or both")
            if self.low is not None:
                lo = _real(self.low, "low")
                if lo < 0.0:
                    raise ConfigError(f"low must be >= 0, got {lo}")
                _set(self, "low", lo)
            if self.high is not None:
                hi = _real(self.high, "high")
                if hi <= 0.0:
                    raise ConfigError(f"high must be > 0, got {hi}")
                _set(self, "high", hi)
            if self.low is not None and self.high is not None and self.low >= self.high:
                raise ConfigError(f"low must be < high, got low={self.low}, high={self.high}")
            _set(self, "cap", None)


@dataclasses.dataclass(frozen=True)
class KLConfig(_Derivable):
    """A KL penalty towards a reference policy: estimator, placement and coefficient.

    ``aggregation=None`` reuses the policy loss's aggregation when placed in the loss.
    """

    estimator: KLEstimator = KLEstimator.K3
    placement: KLPlacement = KLPlacement.LOSS
    coef: float = 0.04
    aggregation: Aggregation | None = None

    def __post_init__(self) -> None:
        _set(self, "estimator", _enum(KLEstimator, self.estimator, "estimator"))
        _set(self, "placement", _enum(KLPlacement, self.placement, "placement"))
        coef = _real(self.coef, "coef")
        if coef < 0.0:
            raise ConfigError(f"coef must be >= 0, got {coef}")
        _set(self, "coef", coef)
        if self.aggregation is not None:
            _set(self, "aggregation", _enum(Aggregation, self.aggregation, "aggregation"))


@dataclasses.dataclass(frozen=True)
class PolicyLossConfig(_Derivable):
    """One point of the loss algebra: ratio x surrogate x clip x aggregation x corrections."""

    ratio: RatioKind = RatioKind.TOKEN
    surrogate: SurrogateKind = SurrogateKind.PG_CLIP
    clip: ClipConfig = dataclasses.field(default_factory=ClipConfig)
    aggregation: Aggregation = Aggregation.TOKEN_MEAN
    budget: int | None = None
    is_correction: ISCorrection | None = None
    kl: KLConfig | None = None

    def __post_init__(self) -> None:
        _set(self, "ratio", _enum(RatioKind, self.ratio, "ratio"))
        _set(self, "surrogate", _enum(SurrogateKind, self.surrogate, "surrogate"))
        _set(self, "aggregation", _enum(Aggregation, self.aggregation, "aggregation"))
        if not isinstance(self.clip, ClipConfig):
            raise ConfigError(f"clip must be a ClipConfig, got {type(self.clip).__name__}")
        if self.aggregation is Aggregation.TOKEN_SUM_NORM:
            _set(self, "budget", _positive_int(self.budget, "budget"))
        elif self.budget is not None:
            raise ConfigError(
                f"budget applies to aggregation='token-sum-norm' only, "
                f"got budget={self.budget!r} with aggregation={self.aggregation.value!r}"
            )
        if self.surrogate in (SurrogateKind.REINFORCE, SurrogateKind.CISPO) and (
            self.ratio is not RatioKind.TOKEN
        ):
            raise ConfigError(
                f"surrogate={self.surrogate.value!r} is defined with ratio='token' only, "
                f"got ratio={self.ratio.value!r}"
            )
        if self.kl is not None and not isinstance(self.kl, KLConfig):
            raise ConfigError(f"kl must be a KLConfig or None, got {type(self.kl).__name__}")
        if (
            self.kl is not None
            and self.kl.aggregation is Aggregation.TOKEN_SUM_NORM
            and self.budget is None
        ):
            raise ConfigError("kl.aggregation='token-sum-norm' needs the loss's budget to be set")
        if self.is_correction is not None and not isinstance(self.is_correction, ISCorrection):
            raise ConfigError(
                f"is_correction must be an ISCorrection or None, "
                f"got {type(self.is_correction).__name__}"
            )

    @property
    def kl_in_loss(self) -> bool:
        """True when a KL term with a positive coefficient is part of this loss."""
        return self.kl is not None and self.kl.placement is KLPlacement.LOSS and self.kl.coef > 0.0


@dataclasses.dataclass(frozen=True)
class AdvantageConfig(_Derivable):
    """How rewards become advantages, with every knob papers leave implicit made explicit."""

    estimator: AdvantageEstimator = AdvantageEstimator.GRPO
    scale_by_std: bool = True
    std_eps: float = 1e-6
    unbiased_std: bool = True
    singleton: SingletonGroup = SingletonGroup.ZERO
    gamma: float = 1.0
    lam: float = 1.0
    whiten: bool = False

    def __post_init__(self) -> None:
        _set(self, "estimator", _enum(AdvantageEstimator, self.estimator, "estimator"))
        _set(self, "singleton", _enum(SingletonGroup, self.singleton, "singleton"))
        eps = _real(self.std_eps, "std_eps")
        if eps < 0.0:
            raise ConfigError(f"std_eps must be >= 0, got {eps}")
        _set(self, "std_eps", eps)
        for name in ("gamma", "lam"):
            v = _real(getattr(self, name), name)
            if not 0.0 <= v <= 1.0:
                raise ConfigError(f"{name} must lie in [0, 1], got {v}")
            _set(self, name, v)
        for name in ("scale_by_std", "unbiased_std", "whiten"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be a bool, got {getattr(self, name)!r}")
