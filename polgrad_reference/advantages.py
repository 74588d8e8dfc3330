"""Advantage estimators: group-normalised (GRPO), leave-one-out (RLOO), OPO's
length-weighted baseline, REINFORCE++ and GAE.

Sequence-level estimators (``grpo``, ``rloo``, ``opo``) map rewards ``[B]`` to advantages
``[B]``; token-level ones (``reinforce_pp``, ``reinforce_pp_baseline``, ``gae``) return
``[B, T]``, zero at padding. Everything computes in the input dtype and is differentiable
in the rewards (and values); nothing is detached. Statistics are taken of values divided by
an exact power of two (detached), so a group of float16 rewards of +-300 or float64
rewards of +-1e200 gets its true advantage, bitwise equal to the unscaled formula where
that one does not overflow; a result that is not representable in the dtype raises
:class:`NumericalError`, never a silent inf or 0. Derivations and golden cases:
``docs/advantages.md``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from enum import Enum

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
    "OPENRLHF_WHITENING",
    "REFERENCE_WHITENING",
    "VERL_WHITENING",
    "WHITEN_EPS",
    "WhitenEps",
    "Whitening",
    "compute_advantages",
    "discounted_returns",
    "gae",
    "grpo_advantages",
    "opo_advantages",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "rloo_advantages",
    "token_level_rewards",
    "whiten",
]

WHITEN_EPS = 1e-8
"""Added to the variance by :func:`whiten`: ``rsqrt(var + 1e-8)``, the convention of
verl 0.9.1 ``verl/utils/torch_functional.py::masked_whiten``. (OpenRLHF instead clamps the
population variance, ``var.clamp(min=1e-8).rsqrt()``: :data:`OPENRLHF_WHITENING`.)"""


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


# --------------------------------------------------------------------------- whitening conventions


class WhitenEps(str, Enum):
    """Where the whitening epsilon enters the inverse standard deviation."""

    ADD = "add"
    """``rsqrt(var + eps)`` (verl ``masked_whiten``)."""
    CLAMP = "clamp"
    """``rsqrt(max(var, eps))`` (OpenRLHF's advantage normalisation)."""


@dataclasses.dataclass(frozen=True)
class Whitening:
    """A whitening convention ``(x - mu) * inv_std`` over the response tokens.

    ``mu = S / (N + count_eps)`` and the variance ``sum (x - mu)^2 / (N + count_eps)``,
    times ``N / (N - 1)`` when ``unbiased`` (with ``count_eps = 0`` this is
    ``/ (N - 1)``); ``inv_std`` per ``eps_mode``. ``shift_mean=False`` adds ``mu`` back.
    """

    unbiased: bool = True
    eps: float = WHITEN_EPS
    eps_mode: WhitenEps | str = WhitenEps.ADD
    count_eps: float = 0.0
    shift_mean: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "unbiased", _flag(self.unbiased, "unbiased"))
        object.__setattr__(self, "shift_mean", _flag(self.shift_mean, "shift_mean"))
        object.__setattr__(self, "eps", _nonnegative(self.eps, "eps"))
        object.__setattr__(self, "count_eps", _nonnegative(self.count_eps, "count_eps"))
        object.__setattr__(self, "eps_mode", _enum(WhitenEps, self.eps_mode, "eps_mode"))

    def describe(self) -> str:
        """E.g. ``unbiased variance, rsqrt(var + 1e-08)``."""
        var = "unbiased" if self.unbiased else "population"
        inv = (
            f"rsqrt(var + {self.eps:g})"
            if self.eps_mode is WhitenEps.ADD
            else f"rsqrt(max(var, {self.eps:g}))"
        )
        count = f", counts N + {self.count_eps:g}" if self.count_eps else ""
        return f"{var} variance, {inv}{count}"


REFERENCE_WHITENING = Whitening()
"""The reference's whitening: mean over N, unbiased variance, ``rsqrt(var + 1e-8)``."""
VERL_WHITENING = Whitening(unbiased=True, eps=WHITEN_EPS, count_eps=1e-8)
"""verl 0.9.1 ``masked_whiten``: ``masked_mean`` divides by ``N + 1e-8``; the variance is
``masked_mean((x - mu)^2) * N / (N - 1)``; ``rsqrt(var + 1e-8)``."""
OPENRLHF_WHITENING = Whitening(unbiased=False, eps=WHITEN_EPS, eps_mode=WhitenEps.CLAMP)
"""OpenRLHF's global advantage normalisation: population variance,
``var.clamp(min=1e-8).rsqrt()``."""


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


def _pow2(magnitude: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The power of two ``2^e >= magnitude`` (``e >= 0``, capped so that ``2^e`` is
    finite in ``dtype``): dividing by it is exact and brings values to ``[-1, 1]``."""
    _, e = torch.frexp(magnitude.detach().to(torch.float64))
    e = e.clamp(min=0, max=math.frexp(torch.finfo(dtype).max)[1] - 1)
    return torch.pow(2.0, e.to(torch.float64)).to(dtype)


def _group_scale(r: torch.Tensor, inverse: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Per-row power of two bounding the row's group's ``|r|`` (detached, ``[B]``)."""
    top = torch.zeros(counts.shape[0], dtype=torch.float64, device=r.device)
    top = top.scatter_reduce(0, inverse, r.detach().abs().to(torch.float64), "amax")
    return _pow2(top, r.dtype)[inverse]


def _lone_rows(
    inverse: torch.Tensor, counts: torch.Tensor, singleton: SingletonGroup, name: str
) -> torch.Tensor:
    """``[B]`` bool: rows whose group has one member; raises under ``singleton='error'``."""
    lone = counts[inverse] == 1
    if singleton is SingletonGroup.ERROR and bool(lone.any()):
        rows = lone.nonzero().flatten().tolist()
        raise InputError(
            f"{name} makes groups of size 1 at rows {rows}; their std and leave-one-out "
            "mean are undefined (singleton='error'; use singleton='zero' to give them 0 "
            "or 'raw' to keep their reward)"
        )
    return lone


def _representable(name: str, out: torch.Tensor, where: torch.Tensor | None = None) -> None:
    """Raise :class:`NumericalError` when finite inputs gave a non-finite result: the true
    value exceeds the dtype's range (never a silent inf)."""
    bad = ~torch.isfinite(out)
    if where is not None:
        bad = bad & where
    if bool(bad.any()):
        top = torch.finfo(out.dtype).max
        advice = (
            "rescale the rewards (and values)"
            if out.dtype == torch.float64
            else "compute in float64 or rescale the rewards (and values)"
        )
        raise NumericalError(
            f"{name} overflow {out.dtype} (largest finite {top:.6g}) at positions "
            f"{v.format_positions(bad)}: the true values are not representable in this "
            f"dtype; {advice}"
        )


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
    eps_in_sqrt: bool = False,
) -> torch.Tensor:
    """Group-normalised advantages ``[B]``: ``(r_i - mean_g) / (std_g + std_eps)``
    (``eps_in_sqrt``: ``/ sqrt(var_g + std_eps)``, a variant some trainers use).

    GRPO outcome supervision, arXiv:2402.03300 Sec. 4.1.2. ``std_g`` uses Bessel's
    correction (``/(G-1)``) when ``unbiased_std`` else ``/G``; ``scale_by_std=False``
    gives ``r_i - mean_g`` (Dr.GRPO, arXiv:2503.20783 Sec. 3.1). Groups of one get 0
    (``singleton='zero'``), keep their reward as mean 0 / std 1 (``'raw'``: ``r / (1 +
    std_eps)``, verl 0.9.1) or raise (``'error'``).
    """
    scale = _flag(scale_by_std, "scale_by_std")
    inside = _flag(eps_in_sqrt, "eps_in_sqrt")
    eps = _nonnegative(std_eps, "std_eps")
    unbiased = _flag(unbiased_std, "unbiased_std")
    policy = _enum(SingletonGroup, singleton, "singleton")
    r = _rewards_1d(rewards)
    inverse, counts, name = _group_index(group_size, group_ids, r)
    lone = _lone_rows(inverse, counts, policy, name)
    n = counts[inverse].to(r.dtype)
    k = _group_scale(r, inverse, counts)  # exact power of two; statistics of r / k
    rs = r / k
    centred = rs - _group_sum(rs, inverse, counts) / n  # exactly 0 for a singleton (r - r/1)
    raw = lone & (policy is SingletonGroup.RAW)
    centred = torch.where(raw, rs, centred)
    if not scale:
        out = centred * k
        _representable("grpo advantages", out)
        return out
    dof = (n - 1.0).clamp(min=1.0) if unbiased else n
    var = _group_sum(centred * centred, inverse, counts) / dof
    std = torch.where(lone, 1.0 / (k * k), var).sqrt()  # singletons: std 1, in units of k
    flat = ~lone & (std == 0.0)
    if eps == 0.0 and bool(flat.any()):
        raise NumericalError(
            f"rewards are constant within the groups of rows {flat.nonzero().flatten().tolist()}"
            ", so their std is 0 and std_eps=0 makes the advantage 0/0; set std_eps > 0"
        )
    if inside:  # sqrt(var + eps) in units of k: sqrt(var_s + eps / k^2)
        out = centred / torch.where(lone, 1.0 / (k * k), var + eps / (k * k)).sqrt()
    else:
        out = centred / (std + eps / k)
    out = torch.where(lone & ~raw, 0.0, out)
    _representable("grpo advantages", out)
    return out


def rloo_advantages(
    *,
    rewards: torch.Tensor,
    group_size: int | None = None,
    group_ids: torch.Tensor | None = None,
    singleton: SingletonGroup | str = SingletonGroup.ZERO,
) -> torch.Tensor:
    """Leave-one-out advantages ``[B]``: ``r_i - (1/(G-1)) sum_{j != i} r_j``.

    RLOO, arXiv:2402.14740 (the leave-one-out baseline of Kool et al. 2019); equal to
    ``G/(G-1) (r_i - mean_g)``. Groups of one get 0 (``singleton='zero'``), their raw
    reward (``'raw'``, verl 0.9.1) or raise.
    """
    policy = _enum(SingletonGroup, singleton, "singleton")
    r = _rewards_1d(rewards)
    inverse, counts, name = _group_index(group_size, group_ids, r)
    lone = _lone_rows(inverse, counts, policy, name)
    k = _group_scale(r, inverse, counts)
    rs = r / k
    others = (counts[inverse] - 1).clamp(min=1).to(r.dtype)
    baseline = (_group_sum(rs, inverse, counts) - rs) / others
    lone_value = rs if policy is SingletonGroup.RAW else torch.zeros_like(rs)
    out = torch.where(lone, lone_value, rs - baseline) * k
    _representable("rloo advantages", out)
    return out


def opo_advantages(
    *,
    rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_size: int | None = None,
    group_ids: torch.Tensor | None = None,
    singleton: SingletonGroup | str = SingletonGroup.ZERO,
) -> torch.Tensor:
    """OPO advantages ``[B]``: ``r_i - sum_j L_j r_j / sum_j L_j`` over the group, with
    ``L_j`` the response length of row ``j`` (``response_mask.sum(-1)``).

    The length-weighted optimal baseline of OPO, arXiv:2505.23585 Sec. 3 (verl 0.9.1
    ``compute_opo_outcome_advantage``). Groups of one get 0 (``singleton='zero'``: the
    baseline is the reward itself), their raw reward (``'raw'``, verl) or raise.
    """
    policy = _enum(SingletonGroup, singleton, "singleton")
    r = _rewards_1d(rewards)
    mask = v.require_response_mask(response_mask)
    v.require_shape("response_mask", mask, (r.shape[0], mask.shape[1]), "[B, T] with B of rewards")
    v.require_same_device({"rewards": r, "response_mask": mask})
    inverse, counts, name = _group_index(group_size, group_ids, r)
    lone = _lone_rows(inverse, counts, policy, name)
    k = _group_scale(r, inverse, counts)
    rs = r / k
    length = mask.sum(dim=1).to(r.dtype)
    baseline = _group_sum(length * rs, inverse, counts) / _group_sum(length, inverse, counts)
    centred = torch.where(lone & (policy is SingletonGroup.RAW), rs, rs - baseline)
    out = torch.where(lone & (policy is not SingletonGroup.RAW), 0.0, centred) * k
    _representable("opo advantages", out)
    return out


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


def _reverse_discounted_sum(
    x: torch.Tensor, discount: float, carry: torch.Tensor | None = None
) -> torch.Tensor:
    """``y_t = x_t + discount * c_t * y_{t+1}`` along each row, ``y_T = 0``, with ``c_t``
    the continuation flag (``carry``, default 1). ``x`` must be zero at padding; with right
    padding ``y`` is then zero there and each row's sum stops at its last token."""
    acc = torch.zeros_like(x[:, 0])
    cols = []
    for t in range(x.shape[1] - 1, -1, -1):
        step = discount * acc if carry is None else torch.where(carry[:, t], discount * acc, 0.0)
        acc = x[:, t] + step
        cols.append(acc)
    return torch.stack(cols[::-1], dim=1)


def discounted_returns(
    *, token_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float
) -> torch.Tensor:
    """Reward-to-go ``G_t = sum_{s >= t} gamma^(s - t) r_s`` over each row's response
    tokens, ``[B, T]``, zero at padding (REINFORCE, Williams 1992; the REINFORCE++ return,
    arXiv:2501.03262). ``response_mask`` must be right-padded. A return beyond the dtype's
    range raises :class:`NumericalError`."""
    g = _unit(gamma, "gamma")
    mask, t = v.require_token_inputs(
        response_mask, tokens={"token_rewards": token_rewards}, right_padded=True
    )
    out = _reverse_discounted_sum(torch.where(mask, t["token_rewards"], 0.0), g)
    _representable("discounted returns", out, mask)
    return out


def whiten(
    x: torch.Tensor,
    *,
    response_mask: torch.Tensor,
    shift_mean: bool = True,
    unbiased: bool = True,
    eps: float = WHITEN_EPS,
    convention: Whitening | None = None,
) -> torch.Tensor:
    """``(x - mu) / sqrt(var + eps)`` with ``mu``, ``var`` over all response tokens of the
    batch, ``[B, T]``, zero at padding. ``var`` divides by ``N - 1`` when ``unbiased`` else
    by ``N``. ``shift_mean=False`` adds ``mu`` back (rescale only), the ``shift_mean``
    convention of verl's ``masked_whiten``. ``convention`` (a :class:`Whitening`) replaces
    the three keyword knobs, e.g. :data:`VERL_WHITENING` or :data:`OPENRLHF_WHITENING`."""
    if convention is None:
        convention = Whitening(unbiased=unbiased, eps=eps, shift_mean=shift_mean)
    elif not isinstance(convention, Whitening):
        raise ConfigError(f"convention must be a Whitening, got {type(convention).__name__}")
    mask, t = v.require_token_inputs(response_mask, tokens={"x": x}, nonempty=False)
    return _whiten(t["x"], mask, convention)


def _whiten(
    x: torch.Tensor, mask: torch.Tensor, w: Whitening, *, what: str = "response_mask selects"
) -> torch.Tensor:
    """Whiten on validated input. The statistics are taken of ``x / k`` with ``k`` an exact
    power of two bounding ``|x|``, so ``+-1e200`` whitens to ``+-1`` instead of 0."""
    count = int(mask.sum())
    if count < 1 + int(w.unbiased):
        raise InputError(
            f"{what} {count} value(s); whitening needs at least {1 + int(w.unbiased)} for "
            f"the {'unbiased' if w.unbiased else 'biased'} variance"
        )
    n = float(count)
    k = _pow2(torch.where(mask, x.detach(), 0.0).abs().amax(), x.dtype)
    xs = torch.where(mask, x, 0.0) / k
    mean = xs.sum() / (n + w.count_eps)
    dev = torch.where(mask, xs - mean, 0.0)
    if w.count_eps == 0.0:
        var = (dev * dev).sum() / (n - 1.0 if w.unbiased else n)
    else:
        var = (dev * dev).sum() / (n + w.count_eps) * (n / (n - 1.0) if w.unbiased else 1.0)
    if w.eps == 0.0 and bool(var == 0.0):
        raise NumericalError("x is constant over response_mask, so whitening with eps=0 is 0/0")
    floor = w.eps / (k * k)  # eps in the units of (x / k)^2
    inv = (
        torch.rsqrt(var + floor)
        if w.eps_mode is WhitenEps.ADD
        else torch.rsqrt(torch.clamp(var, min=floor))
    )
    out = dev * inv
    if not w.shift_mean:
        out = torch.where(mask, out + mean * k, 0.0)
    _representable("whitened values", out, mask)
    return out


def reinforce_pp_advantages(
    *,
    response_mask: torch.Tensor,
    rewards: torch.Tensor | None = None,
    token_rewards: torch.Tensor | None = None,
    gamma: float = 1.0,
    unbiased_std: bool = True,
    whitening: Whitening | None = None,
) -> torch.Tensor:
    """REINFORCE++ advantages ``[B, T]``: discounted returns of the token-level rewards
    (:func:`token_level_rewards`), whitened over every response token of the batch.

    arXiv:2501.03262 (outcome reward at the last token, per-token penalties, global
    advantage normalisation); the whitening is :func:`whiten` with ``eps = WHITEN_EPS``
    and ``unbiased_std`` (or the given ``whitening`` convention).
    """
    g = _unit(gamma, "gamma")
    unbiased = _flag(unbiased_std, "unbiased_std")
    w = whitening if whitening is not None else Whitening(unbiased=unbiased)
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
    _representable("discounted returns", returns, mask)
    return _whiten(returns, mask, w)


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
    whitening: Whitening | None = None,
) -> torch.Tensor:
    """REINFORCE++-baseline ``[B, T]``: rewards minus their group mean, then
    :func:`reinforce_pp_advantages` (returns, global whitening).

    arXiv:2501.03262 ("REINFORCE++ w/ baseline"); the centring is :func:`grpo_advantages`
    with ``scale_by_std=False``. (verl 0.9.1 broadcasts the centred reward to every token
    and whitens: the same as ``gamma = 1`` here.)
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
        whitening=whitening,
    )


def gae(
    *,
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
    dones: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation: ``(advantages, returns)``, both ``[B, T]``.

    ``A_t = delta_t + gamma lam (1 - d_t) A_{t+1}`` with
    ``delta_t = r_t + gamma (1 - d_t) V_{t+1} - V_t`` (arXiv:1506.02438 Eq. 16, with the
    episode-end flags ``d_t = dones[:, t]``: no bootstrap and no credit across an episode
    boundary). ``V = 0`` after each row's last response token (the episode ends there).
    ``returns = A + V`` are the value targets. ``response_mask`` must be right-padded;
    both outputs are zero at padding. A result beyond the dtype's range raises
    :class:`NumericalError`.
    """
    g = _unit(gamma, "gamma")
    lm = _unit(lam, "lam")
    mask, t = v.require_token_inputs(
        response_mask, tokens={"token_rewards": token_rewards, "values": values}, right_padded=True
    )
    carry = None
    if dones is not None:
        d = v.require_bool_mask("dones", dones)
        v.require_shape("dones", d, tuple(mask.shape), "[B, T] like response_mask")
        v.require_same_device({"dones": d, "response_mask": mask})
        carry = ~d
    r = torch.where(mask, t["token_rewards"], 0.0)
    val = torch.where(mask, t["values"], 0.0)
    next_val = torch.nn.functional.pad(val[:, 1:], (0, 1))  # right-padded: 0 after the end
    if carry is not None:
        next_val = torch.where(carry, next_val, 0.0)
    adv = _reverse_discounted_sum(r + g * next_val - val, g * lm, carry)  # 0 at padding
    _representable("gae advantages", adv, mask)
    returns = adv + val
    _representable("gae returns", returns, mask)
    return adv, returns


# --------------------------------------------------------------------------- dispatcher

_GROUP = frozenset({"rewards", "group"})
_USES: dict[AdvantageEstimator, frozenset[str]] = {
    AdvantageEstimator.GRPO: _GROUP,
    AdvantageEstimator.RLOO: _GROUP,
    AdvantageEstimator.OPO: _GROUP | {"response_mask"},
    AdvantageEstimator.REINFORCE_PP: frozenset({"rewards", "token_rewards", "response_mask"}),
    AdvantageEstimator.REINFORCE_PP_BASELINE: frozenset(
        {"rewards", "token_rewards", "response_mask", "group"}
    ),
    AdvantageEstimator.GAE: frozenset(
        {"rewards", "token_rewards", "response_mask", "values", "dones"}
    ),
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
    response_mask: torch.Tensor | None,
    whitening: Whitening,
) -> torch.Tensor:
    est = cfg.estimator
    if est is AdvantageEstimator.RLOO:
        adv = rloo_advantages(
            rewards=rewards, group_size=group_size, group_ids=group_ids, singleton=cfg.singleton
        )
    elif est is AdvantageEstimator.OPO:
        adv = opo_advantages(
            rewards=rewards,
            response_mask=_need(est, "response_mask", response_mask),
            group_size=group_size,
            group_ids=group_ids,
            singleton=cfg.singleton,
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
    return _whiten(adv[:, None], rows, whitening, what="rewards has")[:, 0]


def _gae_advantages(
    cfg: AdvantageConfig,
    mask: torch.Tensor,
    values: torch.Tensor,
    rewards: torch.Tensor | None,
    token_rewards: torch.Tensor | None,
    dones: torch.Tensor | None,
    whitening: Whitening,
) -> torch.Tensor:
    per_token = token_level_rewards(
        response_mask=mask, rewards=rewards, token_rewards=token_rewards
    )
    adv, _ = gae(
        token_rewards=per_token,
        values=values,
        response_mask=mask,
        gamma=cfg.gamma,
        lam=cfg.lam,
        dones=dones,
    )
    if not cfg.whiten:
        return adv
    return _whiten(adv, mask, whitening)


def compute_advantages(
    cfg: AdvantageConfig,
    *,
    rewards: torch.Tensor | None = None,
    group_size: int | None = None,
    group_ids: torch.Tensor | None = None,
    response_mask: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
    token_rewards: torch.Tensor | None = None,
    dones: torch.Tensor | None = None,
    whitening: Whitening | None = None,
) -> torch.Tensor:
    """Advantages under ``cfg``: ``[B]`` for ``grpo``, ``rloo`` and ``opo``; ``[B, T]``
    (zero at padding) for ``reinforce_pp``, ``reinforce_pp_baseline`` and ``gae``.

    ``cfg.whiten`` whitens ``grpo``/``rloo``/``opo`` advantages over the ``B`` rows and
    ``gae`` advantages over the response tokens; the REINFORCE++ estimators always whiten,
    so the flag does not apply to them. The whitening is ``whitening`` when given, else
    :class:`Whitening` with ``unbiased=cfg.unbiased_std`` and ``eps = WHITEN_EPS``. For
    ``gae`` the per-token reward is :func:`token_level_rewards` and ``dones`` are its
    episode ends. A tensor the estimator does not use is an error.
    """
    if not isinstance(cfg, AdvantageConfig):
        raise ConfigError(f"cfg must be an AdvantageConfig, got {type(cfg).__name__}")
    if whitening is None:
        whitening = Whitening(unbiased=cfg.unbiased_std)
    elif not isinstance(whitening, Whitening):
        raise ConfigError(f"whitening must be a Whitening, got {type(whitening).__name__}")
    est = cfg.estimator
    passed = {
        "rewards": rewards,
        "group": group_size if group_size is not None else group_ids,
        "response_mask": response_mask,
        "values": values,
        "token_rewards": token_rewards,
        "dones": dones,
    }
    _reject_unused(est, passed)
    if est in (AdvantageEstimator.GRPO, AdvantageEstimator.RLOO, AdvantageEstimator.OPO):
        return _sequence_level(
            cfg, _need(est, "rewards", rewards), group_size, group_ids, response_mask, whitening
        )
    mask = _need(est, "response_mask", response_mask)
    if est is AdvantageEstimator.GAE:
        return _gae_advantages(
            cfg, mask, _need(est, "values", values), rewards, token_rewards, dones, whitening
        )
    if est is AdvantageEstimator.REINFORCE_PP:
        return reinforce_pp_advantages(
            response_mask=mask,
            rewards=rewards,
            token_rewards=token_rewards,
            gamma=cfg.gamma,
            whitening=whitening,
        )
    return reinforce_pp_baseline_advantages(
        rewards=_need(est, "rewards", rewards),
        response_mask=mask,
        group_size=group_size,
        group_ids=group_ids,
        token_rewards=token_rewards,
        gamma=cfg.gamma,
        singleton=cfg.singleton,
        whitening=whitening,
    )
