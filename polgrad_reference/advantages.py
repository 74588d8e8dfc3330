"""Advantage estimators: group-normalised (GRPO), leave-one-out (RLOO), REINFORCE++ and GAE.

Sequence-level estimators (``grpo``, ``rloo``) map rewards ``[B]`` to advantages ``[B]``;
token-level ones (``reinforce_pp``, ``reinforce_pp_baseline``, ``gae``) return ``[B, T]``,
zero at padding. Everything computes in the input dtype and is differentiable in the
rewards (and values); nothing is detached. Derivations and golden cases:
``docs/advantages.md``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from . import _validate as v
from .config import (
    AdvantageConfig,
    AdvantageEstimator,
    SingletonGroup,
    _enum,
    _positive_int,
    _real,
)
from .errors import ConfigError, InputError, InputTypeError, NumericalError

__all__ = [
    "WHITEN_EPS",
    "compute_advantages",
    "discounted_returns",
    "gae",
    "grpo_advantages",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "rloo_advantages",
    "token_level_rewards",
    "whiten",
]

WHITEN_EPS = 1e-8
"""Added to the variance by :func:`whiten` (the ``rsqrt(var + 1e-8)`` whitening convention
of verl's ``masked_whiten`` and OpenRLHF's REINFORCE++ normalisation)."""


# --------------------------------------------------------------------------- validation


def _some_reward(t: dict[str, torch.Tensor]) -> None:
    if "rewards" not in t and "token_rewards" not in t:
        raise InputError("pass rewards ([B]), token_rewards ([B, T]) or both")


def _rewards_1d(rewards: object) -> torch.Tensor:
    """Float ``[B]`` rewards, ``B >= 1``, finite everywhere."""
    r = v.require_float_tensor("rewards", rewards)
    if r.dim() != 1 or r.shape[0] == 0:
        raise InputError(f"rewards must have shape [B] with B >= 1, got {list(r.shape)}")
    v.require_finite_where("rewards", r, None)
    return r


def _flag(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be a bool, got {value!r}")
    return value


def _unit(value: object, name: str) -> float:
    x = _real(value, name)
    if not 0.0 <= x <= 1.0:
        raise ConfigError(f"{name} must lie in [0, 1], got {x}")
    return x


def _nonnegative(value: object, name: str) -> float:
    x = _real(value, name)
    if x < 0.0:
        raise ConfigError(f"{name} must be >= 0, got {x}")
    return x


# --------------------------------------------------------------------------- groups


def _group_index(
    group_size: object, group_ids: object, rewards: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Dense group index ``[B]``, group sizes ``[n_groups]`` and the argument's name.

    ``group_size=G`` puts rows ``[kG, (k+1)G)`` in group ``k``; ``group_ids`` labels rows
    with arbitrary integers (rows sharing a label form a group, in any order).
    """
    batch = rewards.shape[0]
    if (group_size is None) == (group_ids is None):
        raise InputError("pass exactly one of group_size (int) or group_ids (LongTensor [B])")
    if group_size is not None:
        size = _positive_int(group_size, "group_size")
        if batch % size:
            raise InputError(
                f"group_size={size} does not divide the batch size B={batch} of rewards"
            )
        ids = torch.arange(batch, device=rewards.device) // size
        name = "group_size"
    else:
        ids = v.require_tensor("group_ids", group_ids)
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise InputTypeError(
                f"group_ids must have an integer dtype (torch.long), got {ids.dtype}"
            )
        v.require_shape("group_ids", ids, (batch,), "[B] like rewards")
        v.require_same_device({"rewards": rewards, "group_ids": ids})
        name = "group_ids"
    _, inverse, counts = torch.unique(ids, return_inverse=True, return_counts=True)
    return inverse, counts, name


def _group_sum(x: torch.Tensor, inverse: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Per-row sum over the row's group, ``[B]`` (differentiable ``index_add``)."""
    sums = torch.zeros(counts.shape[0], dtype=x.dtype, device=x.device).index_add(0, inverse, x)
    return sums[inverse]


def _lone_rows(
    inverse: torch.Tensor, counts: torch.Tensor, singleton: SingletonGroup, name: str
) -> torch.Tensor:
    """``[B]`` bool: rows whose group has one member; raises under ``singleton='error'``."""
    lone = counts[inverse] == 1
    if singleton is SingletonGroup.ERROR and bool(lone.any()):
        rows = lone.nonzero().flatten().tolist()
        raise InputError(
            f"{name} makes groups of size 1 at rows {rows}; their std and leave-one-out "
            "mean are undefined (singleton='error'; use singleton='zero' to give them 0)"
        )
    return lone


# --------------------------------------------------------------------------- sequence-level


def grpo_advantages(
    *,
    rewards: torch.Tensor,
    group_size: int | None = None,
    group_ids: torch.Tensor | None = None,
    scale_by_std: bool = True,
    std_eps: float = 1e-6,
    unbiased_std: bool = True,
    singleton: SingletonGroup | str = SingletonGroup.ZERO,
) -> torch.Tensor:
    """Group-normalised advantages ``[B]``: ``(r_i - mean_g) / (std_g + std_eps)``.

    GRPO outcome supervision, arXiv:2402.03300 Sec. 4.1.2. ``std_g`` uses Bessel's
    correction (``/(G-1)``) when ``unbiased_std`` else ``/G``; ``scale_by_std=False``
    gives ``r_i - mean_g`` (Dr.GRPO, arXiv:2503.20783 Sec. 3.1). Groups of one get 0
    (``singleton='zero'``) or raise (``'error'``).
    """
    scale = _flag(scale_by_std, "scale_by_std")
    eps = _nonnegative(std_eps, "std_eps")
    unbiased = _flag(unbiased_std, "unbiased_std")
    policy = _enum(SingletonGroup, singleton, "singleton")
    r = _rewards_1d(rewards)
    inverse, counts, name = _group_index(group_size, group_ids, r)
    lone = _lone_rows(inverse, counts, policy, name)
    n = counts[inverse].to(r.dtype)
    centred = r - _group_sum(r, inverse, counts) / n  # exactly 0 for a singleton (r - r/1)
    if not scale:
        return centred
    dof = (n - 1.0).clamp(min=1.0) if unbiased else n
    var = _group_sum(centred * centred, inverse, counts) / dof
    std = torch.where(lone, 1.0, var).sqrt()  # singletons: 0 / (1 + eps) = 0, finite gradient
    flat = ~lone & (std == 0.0)
    if eps == 0.0 and bool(flat.any()):
        raise NumericalError(
            f"rewards are constant within the groups of rows {flat.nonzero().flatten().tolist()}"
            ", so their std is 0 and std_eps=0 makes the advantage 0/0; set std_eps > 0"
        )
    return centred / (std + eps)


def rloo_advantages(
    *,
    rewards: torch.Tensor,
    group_size: int | None = None,
    group_ids: torch.Tensor | None = None,
    singleton: SingletonGroup | str = SingletonGroup.ZERO,
) -> torch.Tensor:
    """Leave-one-out advantages ``[B]``: ``r_i - (1/(G-1)) sum_{j != i} r_j``.

    RLOO, arXiv:2402.14740 (the leave-one-out baseline of Kool et al. 2019); equal to
    ``G/(G-1) (r_i - mean_g)``. Groups of one get 0 (``singleton='zero'``) or raise.
    """
    policy = _enum(SingletonGroup, singleton, "singleton")
    r = _rewards_1d(rewards)
    inverse, counts, name = _group_index(group_size, group_ids, r)
    lone = _lone_rows(inverse, counts, policy, name)
    others = (counts[inverse] - 1).clamp(min=1).to(r.dtype)
    baseline = (_group_sum(r, inverse, counts) - r) / others
    return torch.where(lone, 0.0, r - baseline)


# --------------------------------------------------------------------------- token-level

_REWARDS = ("rewards", "token_rewards")


def token_level_rewards(
    *,
    response_mask: torch.Tensor,
    rewards: torch.Tensor | None = None,
    token_rewards: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token rewards ``[B, T]``: ``token_rewards`` plus the scalar ``rewards[b]`` placed
    at row ``b``'s last response token (the outcome-reward convention of InstructGPT,
    arXiv:2203.02155, and REINFORCE++, arXiv:2501.03262). At least one must be given;
    zero at padding."""
    mask, t = v.require_token_inputs(
        response_mask,
        tokens={"token_rewards": token_rewards},
        rows={"rewards": rewards},
        optional=_REWARDS,
    )
    _some_reward(t)
    return _token_level(mask, t.get("rewards"), t.get("token_rewards"))


def _token_level(
    mask: torch.Tensor, rewards: torch.Tensor | None, token_rewards: torch.Tensor | None
) -> torch.Tensor:
    """:func:`token_level_rewards` on validated input (rows of ``mask`` non-empty)."""
    if token_rewards is not None:
        out = torch.where(mask, token_rewards, 0.0)
    else:
        assert rewards is not None
        out = torch.zeros(mask.shape, dtype=rewards.dtype, device=rewards.device)
    if rewards is not None:
        pos = torch.arange(mask.shape[1], device=mask.device)
        last = torch.where(mask, pos, -1).amax(dim=1, keepdim=True)
        out = out + torch.where(pos == last, rewards[:, None], 0.0)
    return out


def _reverse_discounted_sum(x: torch.Tensor, discount: float) -> torch.Tensor:
    """``y_t = x_t + discount * y_{t+1}`` along each row, ``y_T = 0``. ``x`` must be zero at
    padding; with right padding ``y`` is then zero there and each row's sum stops at its
    last token."""
    acc = torch.zeros_like(x[:, 0])
    cols = []
    for t in range(x.shape[1] - 1, -1, -1):
        acc = x[:, t] + discount * acc
        cols.append(acc)
    return torch.stack(cols[::-1], dim=1)


def discounted_returns(
    *, token_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float
) -> torch.Tensor:
    """Reward-to-go ``G_t = sum_{s >= t} gamma^(s - t) r_s`` over each row's response
    tokens, ``[B, T]``, zero at padding (REINFORCE, Williams 1992; the REINFORCE++ return,
    arXiv:2501.03262). ``response_mask`` must be right-padded."""
    g = _unit(gamma, "gamma")
    mask, t = v.require_token_inputs(
        response_mask, tokens={"token_rewards": token_rewards}, right_padded=True
    )
    return _reverse_discounted_sum(torch.where(mask, t["token_rewards"], 0.0), g)


def whiten(
    x: torch.Tensor,
    *,
    response_mask: torch.Tensor,
    shift_mean: bool = True,
    unbiased: bool = True,
    eps: float = WHITEN_EPS,
) -> torch.Tensor:
    """``(x - mu) / sqrt(var + eps)`` with ``mu``, ``var`` over all response tokens of the
    batch, ``[B, T]``, zero at padding. ``var`` divides by ``N - 1`` when ``unbiased`` else
    by ``N``. ``shift_mean=False`` adds ``mu`` back (rescale only), the ``shift_mean``
    convention of ``masked_whiten`` in verl and TRL."""
    shift = _flag(shift_mean, "shift_mean")
    bessel = _flag(unbiased, "unbiased")
    e = _nonnegative(eps, "eps")
    mask, t = v.require_token_inputs(response_mask, tokens={"x": x}, nonempty=False)
    return _whiten(t["x"], mask, shift=shift, unbiased=bessel, eps=e)


def _whiten(
    x: torch.Tensor,
    mask: torch.Tensor,
    *,
    shift: bool,
    unbiased: bool,
    eps: float,
    what: str = "response_mask selects",
) -> torch.Tensor:
    count = int(mask.sum())
    if count < 1 + int(unbiased):
        raise InputError(
            f"{what} {count} value(s); whitening needs at least {1 + int(unbiased)} for "
            f"the {'unbiased' if unbiased else 'biased'} variance"
        )
    n = float(count)
    mean = torch.where(mask, x, 0.0).sum() / n
    dev = torch.where(mask, x - mean, 0.0)
    var = (dev * dev).sum() / (n - 1.0 if unbiased else n)
    if eps == 0.0 and bool(var == 0.0):
        raise NumericalError("x is constant over response_mask, so whitening with eps=0 is 0/0")
    out = dev / torch.sqrt(var + eps)
    return out if shift else torch.where(mask, out + mean, 0.0)


def reinforce_pp_advantages(
    *,
    response_mask: torch.Tensor,
    rewards: torch.Tensor | None = None,
    token_rewards: torch.Tensor | None = None,
    gamma: float = 1.0,
    unbiased_std: bool = True,
) -> torch.Tensor:
    """REINFORCE++ advantages ``[B, T]``: discounted returns of the token-level rewards
    (:func:`token_level_rewards`), whitened over every response token of the batch.

    arXiv:2501.03262 (outcome reward at the last token, per-token penalties, global
    advantage normalisation); the whitening is :func:`whiten` with ``eps = WHITEN_EPS``.
    """
    g = _unit(gamma, "gamma")
    unbiased = _flag(unbiased_std, "unbiased_std")
    mask, t = v.require_token_inputs(
        response_mask,
        tokens={"token_rewards": token_rewards},
        rows={"rewards": rewards},
        optional=_REWARDS,
        right_padded=True,
    )
    _some_reward(t)
    per_token = _token_level(mask, t.get("rewards"), t.get("token_rewards"))
    returns = _reverse_discounted_sum(per_token, g)
    return _whiten(returns, mask, shift=True, unbiased=unbiased, eps=WHITEN_EPS)


def reinforce_pp_baseline_advantages(
    *,
    rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_size: int | None = None,
    group_ids: torch.Tensor | None = None,
    token_rewards: torch.Tensor | None = None,
    gamma: float = 1.0,
    unbiased_std: bool = True,
    singleton: SingletonGroup | str = SingletonGroup.ZERO,
) -> torch.Tensor:
    """REINFORCE++-baseline ``[B, T]``: rewards minus their group mean, then
    :func:`reinforce_pp_advantages` (returns, global whitening).

    arXiv:2501.03262 ("REINFORCE++ w/ baseline"); the centring is :func:`grpo_advantages`
    with ``scale_by_std=False``.
    """
    centred = grpo_advantages(
        rewards=rewards,
        group_size=group_size,
        group_ids=group_ids,
        scale_by_std=False,
        singleton=singleton,
    )
    return reinforce_pp_advantages(
        response_mask=response_mask,
        rewards=centred,
        token_rewards=token_rewards,
        gamma=gamma,
        unbiased_std=unbiased_std,
    )


def gae(
    *,
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation: ``(advantages, returns)``, both ``[B, T]``.

    ``A_t = sum_l (gamma lam)^l delta_{t+l}`` with ``delta_t = r_t + gamma V_{t+1} - V_t``
    (arXiv:1506.02438 Eq. 16); ``V = 0`` after each row's last response token (the episode
    ends there). ``returns = A + V`` are the value targets. ``response_mask`` must be
    right-padded; both outputs are zero at padding.
    """
    g = _unit(gamma, "gamma")
    lm = _unit(lam, "lam")
    mask, t = v.require_token_inputs(
        response_mask, tokens={"token_rewards": token_rewards, "values": values}, right_padded=True
    )
    r = torch.where(mask, t["token_rewards"], 0.0)
    val = torch.where(mask, t["values"], 0.0)
    next_val = torch.nn.functional.pad(val[:, 1:], (0, 1))  # right-padded: 0 after the end
    adv = _reverse_discounted_sum(r + g * next_val - val, g * lm)  # 0 at padding
    return adv, adv + val


# --------------------------------------------------------------------------- dispatcher

_USES: dict[AdvantageEstimator, frozenset[str]] = {
    AdvantageEstimator.GRPO: frozenset({"rewards", "group"}),
    AdvantageEstimator.RLOO: frozenset({"rewards", "group"}),
    AdvantageEstimator.REINFORCE_PP: frozenset({"rewards", "token_rewards", "response_mask"}),
    AdvantageEstimator.REINFORCE_PP_BASELINE: frozenset(
        {"rewards", "token_rewards", "response_mask", "group"}
    ),
    AdvantageEstimator.GAE: frozenset({"rewards", "token_rewards", "response_mask", "values"}),
}


def _reject_unused(est: AdvantageEstimator, passed: Mapping[str, object]) -> None:
    for name, value in passed.items():
        if value is not None and name not in _USES[est]:
            shown = "group_size/group_ids" if name == "group" else name
            raise InputError(f"{shown} is not used by estimator={est.value!r}; leave it None")


def _need(est: AdvantageEstimator, name: str, value: torch.Tensor | None) -> torch.Tensor:
    if value is None:
        raise InputError(f"{name} is required by estimator={est.value!r}")
    return value


def _sequence_level(
    cfg: AdvantageConfig,
    rewards: torch.Tensor,
    group_size: int | None,
    group_ids: torch.Tensor | None,
) -> torch.Tensor:
    if cfg.estimator is AdvantageEstimator.RLOO:
        adv = rloo_advantages(
            rewards=rewards, group_size=group_size, group_ids=group_ids, singleton=cfg.singleton
        )
    else:
        adv = grpo_advantages(
            rewards=rewards,
            group_size=group_size,
            group_ids=group_ids,
            scale_by_std=cfg.scale_by_std,
            std_eps=cfg.std_eps,
            unbiased_std=cfg.unbiased_std,
            singleton=cfg.singleton,
        )
    if not cfg.whiten:
        return adv
    rows = torch.ones((adv.shape[0], 1), dtype=torch.bool, device=adv.device)
    white = _whiten(
        adv[:, None],
        rows,
        shift=True,
        unbiased=cfg.unbiased_std,
        eps=WHITEN_EPS,
        what="rewards has",
    )
    return white[:, 0]


def _gae_advantages(
    cfg: AdvantageConfig,
    mask: torch.Tensor,
    values: torch.Tensor,
    rewards: torch.Tensor | None,
    token_rewards: torch.Tensor | None,
) -> torch.Tensor:
    per_token = token_level_rewards(
        response_mask=mask, rewards=rewards, token_rewards=token_rewards
    )
    adv, _ = gae(
        token_rewards=per_token, values=values, response_mask=mask, gamma=cfg.gamma, lam=cfg.lam
    )
    if not cfg.whiten:
        return adv
    return _whiten(adv, mask, shift=True, unbiased=cfg.unbiased_std, eps=WHITEN_EPS)


def compute_advantages(
    cfg: AdvantageConfig,
    *,
    rewards: torch.Tensor | None = None,
    group_size: int | None = None,
    group_ids: torch.Tensor | None = None,
    response_mask: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
    token_rewards: torch.Tensor | None = None,
) -> torch.Tensor:
    """Advantages under ``cfg``: ``[B]`` for ``grpo`` and ``rloo``; ``[B, T]`` (zero at
    padding) for ``reinforce_pp``, ``reinforce_pp_baseline`` and ``gae``.

    ``cfg.whiten`` whitens ``grpo``/``rloo`` advantages over the ``B`` rows and ``gae``
    advantages over the response tokens (eps ``WHITEN_EPS``); the REINFORCE++ estimators
    always whiten, so the flag does not apply to them. For ``gae`` the per-token reward is
    :func:`token_level_rewards`. A tensor the estimator does not use is an error.
    """
    if not isinstance(cfg, AdvantageConfig):
        raise ConfigError(f"cfg must be an AdvantageConfig, got {type(cfg).__name__}")
    est = cfg.estimator
    passed = {
        "rewards": rewards,
        "group": group_size if group_size is not None else group_ids,
        "response_mask": response_mask,
        "values": values,
        "token_rewards": token_rewards,
    }
    _reject_unused(est, passed)
    if est in (AdvantageEstimator.GRPO, AdvantageEstimator.RLOO):
        return _sequence_level(cfg, _need(est, "rewards", rewards), group_size, group_ids)
    mask = _need(est, "response_mask", response_mask)
    if est is AdvantageEstimator.GAE:
        return _gae_advantages(cfg, mask, _need(est, "values", values), rewards, token_rewards)
    if est is AdvantageEstimator.REINFORCE_PP:
        return reinforce_pp_advantages(
            response_mask=mask,
            rewards=rewards,
            token_rewards=token_rewards,
            gamma=cfg.gamma,
            unbiased_std=cfg.unbiased_std,
        )
    return reinforce_pp_baseline_advantages(
        rewards=_need(est, "rewards", rewards),
        response_mask=mask,
        group_size=group_size,
        group_ids=group_ids,
        token_rewards=token_rewards,
        gamma=cfg.gamma,
        unbiased_std=cfg.unbiased_std,
        singleton=cfg.singleton,
    )
