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
    "PARAMS_TYPE",
    "AdvantageConfig",
    "AdvantageEstimator",
    "Aggregation",
    "ClipBounds",
    "ClipConfig",
    "CovarianceSelection",
    "DivergenceMask",
    "GammaWeight",
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
    "QuadraticPenalty",
    "RatioKind",
    "SingletonGroup",
    "SoftGate",
    "SurrogateKind",
    "SurrogateParams",
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
    SEQUENCE_PRODUCT = "sequence_product"
    """``exp(sum_t (logprobs_t - old_logprobs_t))``, the sequence likelihood ratio, broadcast
    over the row; with the CISPO surrogate only: verl 0.9.1's bypass mode with
    ``rollout_is="sequence"`` weights ``log pi`` by ``sg(min(prod_t r_t, C))``
    (core_algos.py ``compute_policy_loss_bypass_mode``)."""


class SurrogateKind(str, Enum):
    """The per-token objective whose gradient is the policy gradient.

    The surrogates after ``cispo`` need ``PolicyLossConfig.params`` of the type
    :data:`PARAMS_TYPE` names (their constants are stated, never defaulted silently) and
    the token ratio; formulas in ``polgrad_reference.surrogates`` and ``docs/losses.md``.
    """

    PG_CLIP = "pg_clip"
    """``-min(r A, clip(r, 1-eps_low, 1+eps_high) A)``, optional dual clip (arXiv:1707.06347
    Eq. 7; dual clip arXiv:1912.09729 Eq. 5)."""
    PG = "pg"
    """``-r A``: the unclipped importance-weighted policy gradient."""
    REINFORCE = "reinforce"
    """``-A log pi``: REINFORCE (Williams 1992); ignores ``old_logprobs``."""
    CISPO = "cispo"
    """``-sg(clip(r, 1-eps_low, 1+eps_high)) A log pi`` (MiniMax-M1, arXiv:2506.13585 Eq. 4)."""
    SAPO = "sapo"
    """``-(4/tau) sigmoid(tau (r - 1)) A``, a soft gate instead of the clip
    (arXiv:2511.20347); params :class:`SoftGate`; any ratio kind."""
    GMPO = "gmpo"
    """Geometric mean of log-space-clipped token ratios times the mean advantage, per
    sequence (arXiv:2507.20673; verl ``geo_mean``); clip eps are log-space bounds; needs
    ``seq-mean-token-mean`` (the objective is a mean over sequences); no params."""
    DPPO_TV = "dppo_tv"
    """``-A sg(min(r, cap)) log pi`` on tokens inside a total-variation trust region
    (arXiv:2602.04879; verl ``dppo_tv``); params :class:`DivergenceMask`."""
    DPPO_KL = "dppo_kl"
    """As ``dppo_tv`` with the binary-KL trust region (verl ``dppo_kl``)."""
    DRO = "dro"
    """``-(A log pi - beta/2 (log r)^2)`` (verl 0.9.1 ``dro``); params
    :class:`QuadraticPenalty`."""
    VESPO = "vespo"
    """``-sg(phi(w)) A log pi`` with a gamma weight of the sequence ratio
    (arXiv:2602.10693; TRL ``loss_type="vespo"``); params :class:`GammaWeight`."""
    CLIP_COV = "clip_cov"
    """PPO clip with the loss of selected high-covariance tokens set to 0
    (arXiv:2505.22617; verl ``clip_cov``); params :class:`CovarianceSelection`."""
    KL_COV = "kl_cov"
    """``-r A`` plus ``kl_coef |log r|`` at selected high-covariance tokens
    (arXiv:2505.22617; verl ``kl_cov``); params :class:`CovarianceSelection`."""


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


def _distance(a: str, b: str) -> int:
    """Edit distance with adjacent transpositions (optimal string alignment)."""
    d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[len(a)][len(b)]


def _closest(value: object, allowed: list[str]) -> str | None:
    """The allowed spelling a near miss most likely meant (``_`` for ``-``, case, typos)."""
    if not isinstance(value, str) or not allowed:
        return None
    spelled = value.strip().lower().replace("_", "-").replace(" ", "-")
    norm = {cand: cand.lower().replace("_", "-") for cand in allowed}
    for cand, n in norm.items():
        if spelled == n:
            return cand
    prefixed = [
        c
        for c, n in norm.items()
        if min(len(n), len(spelled)) >= 3 and (n.startswith(spelled) or spelled.startswith(n))
    ]
    if len(prefixed) == 1:
        return prefixed[0]
    best = min(allowed, key=lambda c: (_distance(spelled, norm[c]), c))
    return best if _distance(spelled, norm[best]) <= max(1, len(spelled) // 3) else None


def _suggest(value: object, allowed: list[str]) -> str:
    """``"; did you mean 'token-mean'?"`` for a near miss, else ``""``."""
    best = _closest(value, allowed)
    return "" if best is None else f"; did you mean {best!r}?"


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


def _positive(value: object, field: str) -> float:
    x = _real(value, field)
    if x <= 0.0:
        raise ConfigError(f"{field} must be > 0, got {x}")
    return x


@dataclasses.dataclass(frozen=True)
class SoftGate(_Derivable):
    """SAPO's gate temperatures (arXiv:2511.20347; its recommended 1.0 / 1.05 are TRL
    1.16.0's defaults, grpo_config.py ``sapo_temperature_pos/neg``)."""

    tau_pos: float = 1.0
    tau_neg: float = 1.05

    def __post_init__(self) -> None:
        for name in ("tau_pos", "tau_neg"):
            _set(self, name, _positive(getattr(self, name), name))


@dataclasses.dataclass(frozen=True)
class DivergenceMask(_Derivable):
    """DPPO's trust-region thresholds and IS truncation. verl 0.9.1 reads ``clip_ratio`` /
    ``_low`` / ``_high`` as the thresholds (default 0.2) and ``clip_ratio_c`` as the cap: its
    loss function falls back to 20 (a large cap, as arXiv:2602.04879 Sec. 5.4 recommends),
    but ``ActorConfig.clip_ratio_c`` defaults to 3.0 (the dual-clip constant), so a default
    verl run truncates at 3."""

    delta_low: float = 0.2
    delta_high: float = 0.2
    is_cap: float | None = 20.0

    def __post_init__(self) -> None:
        for name in ("delta_low", "delta_high"):
            _set(self, name, _positive(getattr(self, name), name))
        if self.is_cap is not None:
            _set(self, "is_cap", _positive(self.is_cap, "is_cap"))


@dataclasses.dataclass(frozen=True)
class QuadraticPenalty(_Derivable):
    """DRO's ``beta`` (verl 0.9.1 ``policy_loss.dro_beta``: required, no default)."""

    beta: float

    def __post_init__(self) -> None:
        _set(self, "beta", _positive(self.beta, "beta"))


@dataclasses.dataclass(frozen=True)
class GammaWeight(_Derivable):
    """VESPO's gamma-weight shapes (TRL 1.16.0 defaults ``vespo_k_pos=2``,
    ``vespo_lambda_pos=3``, ``vespo_k_neg=3``, ``vespo_lambda_neg=2``)."""

    k_pos: float = 2.0
    lambda_pos: float = 3.0
    k_neg: float = 3.0
    lambda_neg: float = 2.0

    def __post_init__(self) -> None:
        for name in ("k_pos", "k_neg"):
            v = _real(getattr(self, name), name)
            if v < 0.0:
                raise ConfigError(f"{name} must be >= 0, got {v}")
            _set(self, name, v)
        for name in ("lambda_pos", "lambda_neg"):
            _set(self, name, _positive(getattr(self, name), name))


@dataclasses.dataclass(frozen=True)
class CovarianceSelection(_Derivable):
    """Clip-Cov / KL-Cov token selection (arXiv:2505.22617; verl 0.9.1 defaults,
    workers/config/actor.py ``PolicyLossConfig``: fraction ``2e-4`` of the response tokens,
    at least one; clip_cov's covariance window ``(low, high) = (1, 5)``). ``kl_coef = 1`` is
    the loss function's own coefficient (``compute_policy_loss_kl_cov`` falls back to 1.0);
    a default verl run passes its config's ``ppo_kl_coef = 0.1`` instead.

    Clip-Cov draws ``k`` of its candidates at random (verl: ``torch.randperm`` on the
    global RNG). Here the draw uses a generator seeded with ``seed`` (unless a generator or
    an explicit ``token_selection`` is passed), so the loss is a pure function of its
    inputs and config; it coincides with any implementation whenever every candidate is
    selected (at most ``k`` of them).
    """

    fraction: float = 2e-4
    low: float = 1.0
    high: float = 5.0
    kl_coef: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        frac = _positive(self.fraction, "fraction")
        if frac > 1.0:
            raise ConfigError(f"fraction must lie in (0, 1], got {frac}")
        _set(self, "fraction", frac)
        _set(self, "low", _real(self.low, "low"))
        _set(self, "high", _real(self.high, "high"))
        if self.low >= self.high:
            raise ConfigError(f"low must be < high, got low={self.low}, high={self.high}")
        coef = _real(self.kl_coef, "kl_coef")
        if coef < 0.0:
            raise ConfigError(f"kl_coef must be >= 0, got {coef}")
        _set(self, "kl_coef", coef)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"seed must be a non-negative integer, got {self.seed!r}")


SurrogateParams = SoftGate | DivergenceMask | QuadraticPenalty | GammaWeight | CovarianceSelection
"""The constants of the surrogates that have their own (``PolicyLossConfig.params``)."""

PARAMS_TYPE: dict[SurrogateKind, type] = {
    SurrogateKind.SAPO: SoftGate,
    SurrogateKind.DPPO_TV: DivergenceMask,
    SurrogateKind.DPPO_KL: DivergenceMask,
    SurrogateKind.DRO: QuadraticPenalty,
    SurrogateKind.VESPO: GammaWeight,
    SurrogateKind.CLIP_COV: CovarianceSelection,
    SurrogateKind.KL_COV: CovarianceSelection,
}
"""Which params type each surrogate needs; the others take ``params=None``."""

TOKEN_RATIO_ONLY = frozenset(SurrogateKind) - {
    SurrogateKind.PG_CLIP,
    SurrogateKind.PG,
    SurrogateKind.SAPO,
}
"""Surrogates defined on the token ratio only (they read ``log pi`` or token log-ratios)."""

_CISPO_RATIOS = frozenset({RatioKind.TOKEN, RatioKind.SEQUENCE, RatioKind.SEQUENCE_PRODUCT})
"""CISPO's detached weight may be the token, GSPO sequence (TRL 1.16.0 ``cispo`` with
``importance_sampling_level="sequence"``) or sequence-product ratio (verl bypass)."""


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
    params: SurrogateParams | None = None

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
        if self.ratio is RatioKind.SEQUENCE_PRODUCT and self.surrogate is not SurrogateKind.CISPO:
            raise ConfigError(
                "ratio='sequence_product' is defined with surrogate='cispo' only (a truncated, "
                f"detached sequence weight), got surrogate={self.surrogate.value!r}"
            )
        cispo_weight = self.surrogate is SurrogateKind.CISPO and self.ratio in _CISPO_RATIOS
        token_only = self.surrogate in TOKEN_RATIO_ONLY and self.ratio is not RatioKind.TOKEN
        if token_only and not cispo_weight:
            allowed = "'token', 'sequence' or 'sequence_product'"
            if self.surrogate is not SurrogateKind.CISPO:
                allowed = "'token'"
            raise ConfigError(
                f"surrogate={self.surrogate.value!r} is defined with ratio={allowed} only, "
                f"got ratio={self.ratio.value!r}"
            )
        self._check_params()
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

    def _check_params(self) -> None:
        want = PARAMS_TYPE.get(self.surrogate)
        if want is None and self.params is not None:
            raise ConfigError(
                f"surrogate={self.surrogate.value!r} takes no params, "
                f"got {type(self.params).__name__}"
            )
        if want is not None and not isinstance(self.params, want):
            got = "None" if self.params is None else type(self.params).__name__
            raise ConfigError(
                f"surrogate={self.surrogate.value!r} needs params={want.__name__}(...) "
                f"stating its constants, got {got}"
            )
        if self.surrogate is SurrogateKind.GMPO:
            if self.aggregation is not Aggregation.SEQ_MEAN_TOKEN_MEAN:
                raise ConfigError(
                    "surrogate='gmpo' is a mean over sequences (arXiv:2507.20673): it needs "
                    f"aggregation='seq-mean-token-mean', got {self.aggregation.value!r}"
                )
            if self.clip.bounds is not ClipBounds.RELATIVE or self.clip.dual_clip is not None:
                raise ConfigError(
                    "surrogate='gmpo' reads eps_low/eps_high as log-space bounds: it takes "
                    "bounds='relative' and no dual_clip"
                )

    def replace(self, **changes: Any) -> PolicyLossConfig:
        """A validated copy with ``changes``. Changing ``surrogate`` without passing
        ``params`` drops params the new surrogate does not take (as ``derive`` drops a
        budget with its aggregation); one that needs other params must be given them."""
        if "surrogate" in changes and "params" not in changes:
            new = _enum(SurrogateKind, changes["surrogate"], "surrogate")
            want = PARAMS_TYPE.get(new)
            if want is None or not isinstance(self.params, want):
                changes["params"] = None
        out: PolicyLossConfig = dataclasses.replace(self, **changes)
        return out

    @property
    def on_policy_is_policy_gradient(self) -> bool:
        """True when, at ``old_logprobs = logprobs`` (and ``rollout = old``), the gradient is
        REINFORCE's with the same aggregation: every gate, clip and weight is 1 there.
        False for Clip-Cov, which removes its selected tokens (``tests/reference/test_variants.py``,
        ``test_on_policy_gradient_is_the_policy_gradient``)."""
        return self.surrogate is not SurrogateKind.CLIP_COV

    @property
    def couples_rows(self) -> bool:
        """True when a token's loss depends on other rows of the batch beyond the
        aggregation's denominators: the covariance selection of Clip-Cov / KL-Cov uses
        batch means and a batch-wide top-k, so those losses never decompose into
        per-row micro-batches."""
        return self.needs_selection

    @property
    def needs_selection(self) -> bool:
        """True for the covariance surrogates, whose selected tokens are an input."""
        return self.surrogate in (SurrogateKind.CLIP_COV, SurrogateKind.KL_COV)

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
