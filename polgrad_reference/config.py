"""Typed configuration of every semantic choice a policy-gradient loss makes.

Configs are frozen dataclasses with string-valued enums. Strings are accepted where an
enum is expected (``Aggregation("token-mean")``) and every value is range-checked at
construction, so an invalid config cannot exist.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from enum import Enum
from typing import Any, TypeVar

from .errors import ConfigError

__all__ = [
    "AdvantageConfig",
    "AdvantageEstimator",
    "Aggregation",
    "ClipBounds",
    "ClipConfig",
    "ISCorrection",
    "ISLevel",
    "ISMode",
    "ISWeight",
    "KLConfig",
    "KLEstimator",
    "KLPlacement",
    "KLRatioWeight",
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
    """Granularity of the rollout/trainer importance-sampling statistic ``rho``."""

    TOKEN = "token"
    """``rho[b, t] = exp(old_logprobs - rollout_logprobs)`` per token."""
    SEQUENCE = "sequence"
    """``rho_b = exp(sum_t (old - rollout))``: the product of the token ratios (verl
    ``rollout_is="sequence"``; TRL ``sequence_*`` modes, trl 1.16.0 grpo_trainer.py)."""
    GEOMETRIC = "geometric"
    """``rho_b = exp(mean_t (old - rollout))``: their geometric mean (OpenRLHF 0.11.2
    ``is_correction_level="seq"`` gating, openrlhf/models/loss.py; verl ``seq_mean_k1``
    geometric rejection sampling, verl 0.9.1 rollout_corr_helper.py)."""


class ISMode(str, Enum):
    """What is done with the rollout/trainer importance weight."""

    TRUNCATE = "truncate"
    """Multiply the loss by ``sg(clamp(rho, low, cap))`` (truncated IS, verl#2953; ``low`` is
    optional: TRL ``*_truncate`` and OpenRLHF ``clip`` clamp from below too)."""
    MASK = "mask"
    """Rejection: drop tokens (or whole sequences) whose ``rho`` leaves ``[low, high]`` from
    the response mask, so they leave the aggregation's denominators too (verl
    ``rollout_rs``)."""
    ZERO = "zero"
    """Masked IS (MIS / IcePop): tokens whose ``rho`` leaves ``[low, high]`` get weight 0 but
    stay in the denominators; the others are weighted by ``weight`` (IcePop,
    arXiv:2510.18855; verl ``rollout_is_threshold="low_high"``; TRL ``*_mask`` modes;
    OpenRLHF ``is_correction_mode="mask"``)."""


class ISWeight(str, Enum):
    """The weight a token keeps under an importance-sampling correction."""

    LEVEL = "level"
    """``rho`` of the correction's own level (truncated for ``truncate``)."""
    TOKEN = "token"
    """The per-token ratio ``exp(old - rollout)`` whatever the gating level (OpenRLHF 0.11.2
    ``mask`` mode at ``seq`` level: gate on the geometric mean, weight per token)."""
    ONE = "one"
    """No reweighting: the correction only selects tokens (rejection sampling)."""


class KLEstimator(str, Enum):
    """Per-token estimators of ``KL(pi || ref)`` from samples of ``pi`` (Schulman, 2020).

    A ``+`` suffix is the straight-through variant: the value of the base estimator, the
    gradient of k2, ``k2 - sg(k2) + sg(k)`` (verl 0.9.1 ``kl_penalty``, core_algos.py).
    """

    K1 = "k1"
    """``log pi - log ref``: unbiased, high variance, can be negative."""
    K2 = "k2"
    """``(log pi - log ref)^2 / 2``: biased, low variance; its gradient as a loss is the
    score-function gradient of the reverse KL."""
    K3 = "k3"
    """``exp(log ref - log pi) - 1 - (log ref - log pi)``: unbiased, non-negative."""
    ABS = "abs"
    """``|log pi - log ref|`` (verl ``kl_penalty="abs"``)."""
    K1_PLUS = "k1+"
    """k1's value, k2's gradient."""
    K3_PLUS = "k3+"
    """k3's value, k2's gradient (verl ``"k3+"`` / ``"low_var_kl+"``)."""
    ABS_PLUS = "abs+"
    """abs's value, k2's gradient."""

    @property
    def base(self) -> KLEstimator:
        """The estimator whose value this one reports (``k3+`` -> ``k3``)."""
        return KLEstimator(self.value.rstrip("+"))

    @property
    def straight_through(self) -> bool:
        """True for the ``+`` variants (gradient of k2)."""
        return self.value.endswith("+")


class KLRatioWeight(str, Enum):
    """Whether the per-token KL is multiplied by the policy ratio ``r`` of the loss.

    ``r`` is the loss's own importance ratio (``PolicyLossConfig.ratio``), optionally capped
    at ``KLConfig.ratio_cap``. With samples drawn from ``pi_old`` only ``undetached`` k3
    gives the reverse-KL gradient in expectation (``docs/kl.md``).
    """

    NONE = "none"
    """``kl_t`` as estimated."""
    UNDETACHED = "undetached"
    """``r_t * kl_t`` with the gradient through ``r`` too (TRL 1.16.0
    ``use_bias_correction_kl=True``, its default; DeepSeek-V3.2, arXiv:2512.02556)."""
    DETACHED = "detached"
    """``sg(r_t) * kl_t``: value and gradient scaled by a constant weight."""
    GRADIENT = "gradient"
    """Value ``kl_t``, gradient scaled by ``sg(min(r_t, ratio_cap))`` (OpenRLHF 0.11.2
    ``compute_approx_kl(unbiased_gradient=True)``, openrlhf/models/utils.py)."""


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
    OPO = "opo"
    """``r_i - sum_j L_j r_j / sum_j L_j``: the length-weighted group baseline of OPO
    (arXiv:2505.23585 Sec. 3; verl 0.9.1 ``compute_opo_outcome_advantage``)."""


class SingletonGroup(str, Enum):
    """What group normalisation does with a group of one sample (its std is undefined)."""

    ZERO = "zero"
    """Advantage 0: a lone sample carries no relative signal."""
    ERROR = "error"
    """Raise: the caller asked for groups and built one of size one."""
    RAW = "raw"
    """Baseline 0 and std 1: the lone sample keeps its raw reward (``r / (1 + eps)`` when
    scaled by the std), verl 0.9.1 ``core_algos`` (grpo, rloo, opo, reinforce++-baseline)."""


_E = TypeVar("_E", bound=Enum)


def _suggest(value: object, allowed: list[str]) -> str:
    """``"; did you mean 'token-mean'?"`` for a near miss (``_`` for ``-``, case, typos)."""
    if not isinstance(value, str):
        return ""
    spelled = value.strip().lower().replace("_", "-").replace(" ", "-")
    for cand in allowed:
        if spelled == cand.lower().replace("_", "-"):
            return f"; did you mean {cand!r}?"
    close = difflib.get_close_matches(value, allowed, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _enum(cls: type[_E], value: object, field: str) -> _E:
    if isinstance(value, cls):
        return value
    try:
        return cls(value)
    except ValueError:
        values = [str(m.value) for m in cls]
        allowed = ", ".join(repr(v) for v in values)
        raise ConfigError(
            f"{field} must be one of {allowed}, got {value!r}{_suggest(value, values)}"
        ) from None


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


class ClipBounds(str, Enum):
    """How ``ClipConfig``'s ``eps_low`` / ``eps_high`` turn into ratio bounds."""

    RELATIVE = "relative"
    """``[1 - eps_low, 1 + eps_high]`` (PPO, arXiv:1707.06347 Eq. 7)."""
    ABSOLUTE = "absolute"
    """``[eps_low, eps_high]``: the values are the bounds themselves. TRL 1.16.0's CISPO
    truncates at ``clamp(r, max=epsilon_high)`` (grpo_trainer.py ``loss_type="cispo"``,
    ScaleRL arXiv:2510.13786's ``eps_max``, recommended 5.0)."""


@dataclasses.dataclass(frozen=True)
class ClipConfig(_Derivable):
    """Ratio clipping range and optional dual-clip constant.

    With ``bounds="relative"`` (default) the range is ``[1 - eps_low, 1 + eps_high]``; with
    ``bounds="absolute"`` it is ``[eps_low, eps_high]``. ``None`` leaves that side unbounded
    (CISPO's one-sided truncation, arXiv:2506.13585 Sec. 3.1; verl 0.9.1 truncates CISPO on
    both sides, core_algos.py ``compute_policy_loss_cispo``). ``dual_clip`` (``c > 1``)
    bounds the loss of negative-advantage tokens at ``-c A`` (arXiv:1912.09729 Eq. 5); it
    applies to ``pg_clip`` with any ratio kind. GMPO reads ``eps_low`` / ``eps_high`` as
    log-space bounds ``[-eps_low, eps_high]`` (arXiv:2507.20673 Eq. 6).
    """

    eps_low: float | None = 0.2
    eps_high: float | None = 0.2
    dual_clip: float | None = None
    bounds: ClipBounds = ClipBounds.RELATIVE

    def __post_init__(self) -> None:
        _set(self, "bounds", _enum(ClipBounds, self.bounds, "bounds"))
        relative = self.bounds is ClipBounds.RELATIVE
        if self.eps_low is not None:
            low = _real(self.eps_low, "eps_low")
            if relative and not 0.0 <= low < 1.0:
                raise ConfigError(f"eps_low must lie in [0, 1) so that 1 - eps_low > 0, got {low}")
            if not relative and low < 0.0:
                raise ConfigError(f"eps_low (an absolute lower bound) must be >= 0, got {low}")
            _set(self, "eps_low", low)
        if self.eps_high is not None:
            high = _real(self.eps_high, "eps_high")
            if relative and high < 0.0:
                raise ConfigError(f"eps_high must be >= 0, got {high}")
            if not relative and high <= 0.0:
                raise ConfigError(f"eps_high (an absolute upper bound) must be > 0, got {high}")
            _set(self, "eps_high", high)
        lo, hi = self.low, self.high
        if lo is not None and hi is not None and lo > hi:
            raise ConfigError(f"the clip range is empty: lower bound {lo} > upper bound {hi}")
        if self.dual_clip is not None:
            c = _real(self.dual_clip, "dual_clip")
            if c <= 1.0:
                raise ConfigError(f"dual_clip must be > 1 (arXiv:1912.09729), got {c}")
            if hi is not None and c <= hi:
                what = "1 + eps_high" if relative else "eps_high"
                raise ConfigError(f"dual_clip must exceed {what} = {hi}, got {c}")
            _set(self, "dual_clip", c)

    @property
    def low(self) -> float | None:
        """Lower ratio bound (``1 - eps_low``, or ``eps_low`` when absolute; None: unbounded)."""
        if self.eps_low is None:
            return None
        return 1.0 - self.eps_low if self.bounds is ClipBounds.RELATIVE else self.eps_low

    @property
    def high(self) -> float | None:
        """Upper ratio bound (``1 + eps_high``, or ``eps_high`` when absolute; None: unbounded)."""
        if self.eps_high is None:
            return None
        return 1.0 + self.eps_high if self.bounds is ClipBounds.RELATIVE else self.eps_high


@dataclasses.dataclass(frozen=True)
class ISCorrection(_Derivable):
    """Rollout/trainer importance-sampling correction with ``rho = pi_old / pi_rollout``.

    ``level`` chooses the statistic (token ratio, its product over the row, or its
    geometric mean); ``mode`` what is done with it (truncate, reject, zero); ``weight`` the
    weight a surviving token carries (default: ``level`` for truncate/zero, ``one`` for
    mask). The weight is always detached (verl#2953; Yao et al. 2025, "Your efficient RL
    framework secretly brings you off-policy RL training"). Bounds are inclusive: a token
    is kept when ``low <= rho <= high``.
    """

    level: ISLevel = ISLevel.TOKEN
    mode: ISMode = ISMode.TRUNCATE
    cap: float | None = 2.0
    low: float | None = None
    high: float | None = None
    weight: ISWeight | None = None

    def __post_init__(self) -> None:
        _set(self, "level", _enum(ISLevel, self.level, "level"))
        _set(self, "mode", _enum(ISMode, self.mode, "mode"))
        if self.low is not None:
            lo = _real(self.low, "low")
            if lo < 0.0:
                raise ConfigError(f"low must be >= 0, got {lo}")
            _set(self, "low", lo)
        if self.mode is ISMode.TRUNCATE:
            if self.cap is None:
                raise ConfigError("cap is required for mode='truncate'")
            cap = _real(self.cap, "cap")
            if cap <= 0.0:
                raise ConfigError(f"cap must be > 0, got {cap}")
            _set(self, "cap", cap)
            if self.high is not None:
                raise ConfigError("high applies to modes 'mask' and 'zero'; use cap for 'truncate'")
            if self.low is not None and self.low > cap:
                raise ConfigError(f"low must be <= cap, got low={self.low}, cap={cap}")
        else:
            if self.low is None and self.high is None:
                raise ConfigError(f"mode={self.mode.value!r} needs low, high or both")
            if self.high is not None:
                hi = _real(self.high, "high")
                if hi <= 0.0:
                    raise ConfigError(f"high must be > 0, got {hi}")
                _set(self, "high", hi)
            if self.low is not None and self.high is not None and self.low >= self.high:
                raise ConfigError(f"low must be < high, got low={self.low}, high={self.high}")
            _set(self, "cap", None)
        default = ISWeight.ONE if self.mode is ISMode.MASK else ISWeight.LEVEL
        weight = default if self.weight is None else _enum(ISWeight, self.weight, "weight")
        if self.mode is ISMode.TRUNCATE and weight is not ISWeight.LEVEL:
            raise ConfigError(
                "mode='truncate' weights by the truncated rho of its level; "
                f"got weight={weight.value!r}"
            )
        _set(self, "weight", weight)


@dataclasses.dataclass(frozen=True)
class KLConfig(_Derivable):
    """A KL penalty towards a reference policy: estimator, placement and coefficient.

    ``aggregation=None`` reuses the policy loss's aggregation when placed in the loss.
    ``ratio_weight`` multiplies the per-token estimate by the loss's policy ratio
    (:class:`KLRatioWeight`), capped at ``ratio_cap`` when set (OpenRLHF 0.11.2 caps its
    gradient weight at ``KL_IS_WEIGHT_CLIP = 10``).
    """

    estimator: KLEstimator = KLEstimator.K3
    placement: KLPlacement = KLPlacement.LOSS
    coef: float = 0.04
    aggregation: Aggregation | None = None
    ratio_weight: KLRatioWeight = KLRatioWeight.NONE
    ratio_cap: float | None = None

    def __post_init__(self) -> None:
        _set(self, "estimator", _enum(KLEstimator, self.estimator, "estimator"))
        _set(self, "placement", _enum(KLPlacement, self.placement, "placement"))
        coef = _real(self.coef, "coef")
        if coef < 0.0:
            raise ConfigError(f"coef must be >= 0, got {coef}")
        _set(self, "coef", coef)
        if self.aggregation is not None:
            _set(self, "aggregation", _enum(Aggregation, self.aggregation, "aggregation"))
        _set(self, "ratio_weight", _enum(KLRatioWeight, self.ratio_weight, "ratio_weight"))
        if self.ratio_cap is not None:
            cap = _real(self.ratio_cap, "ratio_cap")
            if cap <= 0.0:
                raise ConfigError(f"ratio_cap must be > 0, got {cap}")
            if self.ratio_weight is KLRatioWeight.NONE:
                raise ConfigError("ratio_cap needs ratio_weight other than 'none'")
            _set(self, "ratio_cap", cap)
        if self.placement is KLPlacement.REWARD and self.ratio_weight is not KLRatioWeight.NONE:
            raise ConfigError("ratio_weight applies to a KL placed in the loss, not in the reward")


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
