"""Advantage estimators: golden cases, loop references, identities, padding, bad input.

Each identity here is stated and derived in docs/advantages.md.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from polgrad_reference.advantages import (
    OPENRLHF_WHITENING,
    VERL_WHITENING,
    WHITEN_EPS,
    Whitening,
    compute_advantages,
    discounted_returns,
    gae,
    grpo_advantages,
    opo_advantages,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
    token_level_rewards,
    whiten,
)
from polgrad_reference.config import AdvantageConfig, AdvantageEstimator
from polgrad_reference.errors import ConfigError, InputError, InputTypeError, NumericalError

F64 = torch.float64
NAN = float("nan")
EPS = torch.finfo(F64).eps
NOT_A_BOOL: Any = None


def _t(values: list[Any]) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


def _ragged(lengths: list[int], seed: int, pad: int = 1) -> dict[str, torch.Tensor]:
    """Right-padded token rewards and values with NaN at padding, plus scalar rewards."""
    width = max(lengths) + pad
    g = torch.Generator().manual_seed(seed)
    mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    shape = (len(lengths), width)
    return {
        "response_mask": mask,
        "token_rewards": torch.where(mask, torch.randn(shape, generator=g, dtype=F64), NAN),
        "values": torch.where(mask, torch.randn(shape, generator=g, dtype=F64), NAN),
        "rewards": torch.randn(len(lengths), generator=g, dtype=F64),
    }


def _rows(x: torch.Tensor, mask: torch.Tensor) -> list[list[float]]:
    return [[float(x[b, t]) for t in range(int(mask[b].sum()))] for b in range(len(x))]


def _loop_returns(r: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """``G_t = sum_{s >= t} gamma^(s-t) r_s``, row by row, as the definition reads."""
    out = torch.zeros_like(r)
    for b, row in enumerate(_rows(r, mask)):
        for t in range(len(row)):
            out[b, t] = sum(gamma ** (s - t) * row[s] for s in range(t, len(row)))
    return out


def _loop_gae(
    r: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> torch.Tensor:
    """``A_t = sum_l (gamma lam)^l delta_{t+l}`` (arXiv:1506.02438 Eq. 16), row by row."""
    out = torch.zeros_like(r)
    for b, (rew, val) in enumerate(zip(_rows(r, mask), _rows(v, mask), strict=True)):
        nxt = [*val[1:], 0.0]
        delta = [rew[t] + gamma * nxt[t] - val[t] for t in range(len(rew))]
        for t in range(len(rew)):
            out[b, t] = sum((gamma * lam) ** k * delta[t + k] for k in range(len(rew) - t))
    return out


def _whiten_python(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    flat = [float(v) for v in x[mask]]
    mean = statistics.fmean(flat)
    var = statistics.variance(flat) if unbiased else statistics.pvariance(flat)
    return torch.where(mask, (x - mean) / math.sqrt(var + WHITEN_EPS), 0.0)


BadCases = dict[str, tuple[dict[str, Any], type[Exception], str]]


def _cfg(name: str, **options: Any) -> AdvantageConfig:
    return AdvantageConfig(AdvantageEstimator(name), **options)


GRPO_REWARDS = [1.0, 0.0, 0.0, 1.0, 3.0, 5.0, 7.0, 9.0]

# ----------------------------------------------------------------------- GRPO


def test_grpo_hand_golden_unbiased_and_biased() -> None:
    r = _t(GRPO_REWARDS)
    # docs/advantages.md "GRPO golden": group 1 mean 1/2, group 2 mean 6.
    unbiased = grpo_advantages(rewards=r, group_size=4, std_eps=0.0)
    h, a, c = math.sqrt(3) / 2, 3 / math.sqrt(20 / 3), 1 / math.sqrt(20 / 3)
    assert unbiased.tolist() == pytest.approx([h, -h, -h, h, -a, -c, c, a], rel=1e-15)
    biased = grpo_advantages(rewards=r, group_size=4, std_eps=0.0, unbiased_std=False)
    s5 = math.sqrt(5)
    expected = [1.0, -1.0, -1.0, 1.0, -3 / s5, -1 / s5, 1 / s5, 3 / s5]
    assert biased.tolist() == pytest.approx(expected, rel=1e-15)


def test_grpo_eps_is_added_to_the_std() -> None:
    # group (0, 2): mean 1, unbiased std sqrt(2); eps 0.5 -> +-1/(sqrt 2 + 0.5), not
    # +-1/sqrt(2 + 0.5) (eps added to the variance).
    got = grpo_advantages(rewards=_t([0.0, 2.0]), group_size=2, std_eps=0.5)
    assert got.tolist() == pytest.approx([-1 / (math.sqrt(2) + 0.5), 1 / (math.sqrt(2) + 0.5)])


def test_grpo_without_std_scaling_is_centring() -> None:
    got = grpo_advantages(rewards=_t(GRPO_REWARDS), group_size=4, scale_by_std=False)
    assert got.tolist() == [0.5, -0.5, -0.5, 0.5, -3.0, -1.0, 1.0, 3.0]


@pytest.mark.parametrize("seed", range(3))
def test_group_ids_equal_consecutive_groups_in_any_order(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(12, generator=g, dtype=F64)
    perm = torch.randperm(12, generator=g)
    ids = (torch.arange(12) // 4 * 7 + 100)[perm]  # arbitrary labels, shuffled rows
    for fn in (grpo_advantages, rloo_advantages):
        by_size = fn(rewards=r, group_size=4)
        by_ids = fn(rewards=r[perm], group_ids=ids)
        assert torch.allclose(by_ids, by_size[perm], rtol=0, atol=1e-14)


@given(
    r=st.lists(st.floats(-50, 50), min_size=4, max_size=4),
    scale=st.floats(0.1, 10),
    shift=st.floats(-100, 100),
)
def test_grpo_is_invariant_to_positive_affine_rewards(
    r: list[float], scale: float, shift: float
) -> None:
    x = _t(r)
    assume(float(x.std()) > 0.1)  # near-constant groups are ill-conditioned with eps = 0
    base = grpo_advantages(rewards=x, group_size=4, std_eps=0.0)
    moved = grpo_advantages(rewards=scale * x + shift, group_size=4, std_eps=0.0)
    assert torch.allclose(moved, base, rtol=0, atol=1e-9)


def test_singleton_groups_zero_policy() -> None:
    r = _t([1.0, 3.0, 7.0])
    ids = torch.tensor([5, 5, 9])
    got = grpo_advantages(rewards=r, group_ids=ids, std_eps=0.0)
    assert got.tolist() == pytest.approx([-1 / math.sqrt(2), 1 / math.sqrt(2), 0.0], rel=1e-15)
    assert rloo_advantages(rewards=r, group_ids=ids).tolist() == [-2.0, 2.0, 0.0]
    for unbiased in (True, False):
        lone = grpo_advantages(rewards=r, group_size=1, unbiased_std=unbiased)
        assert lone.tolist() == [0.0, 0.0, 0.0]


def test_singleton_groups_error_policy() -> None:
    r = _t([1.0, 3.0, 7.0])
    with pytest.raises(InputError, match=r"group_ids makes groups of size 1 at rows \[2\]"):
        grpo_advantages(rewards=r, group_ids=torch.tensor([0, 0, 1]), singleton="error")
    with pytest.raises(InputError, match=r"group_size makes groups of size 1 at rows \[0, 1, 2\]"):
        rloo_advantages(rewards=r, group_size=1, singleton="error")


def test_constant_group_with_zero_eps_raises_and_default_eps_gives_zero() -> None:
    r = _t([2.0, 2.0, 1.0, 3.0])
    with pytest.raises(NumericalError, match=r"constant within the groups of rows \[0, 1\]"):
        grpo_advantages(rewards=r, group_size=2, std_eps=0.0)
    assert grpo_advantages(rewards=r, group_size=2)[:2].tolist() == [0.0, 0.0]


def test_gradcheck_group_estimators() -> None:
    r = torch.randn(6, generator=torch.Generator().manual_seed(0), dtype=F64).requires_grad_()
    ids = torch.tensor([0, 1, 0, 1, 1, 2])
    assert torch.autograd.gradcheck(lambda x: grpo_advantages(rewards=x, group_ids=ids), (r,))
    assert torch.autograd.gradcheck(lambda x: rloo_advantages(rewards=x, group_ids=ids), (r,))


# ----------------------------------------------------------------------- RLOO


def test_rloo_hand_golden() -> None:
    # (1, 0, 0, 1): 1 - (0 + 0 + 1)/3 = 2/3 and 0 - (1 + 0 + 1)/3 = -2/3.
    got = rloo_advantages(rewards=_t([1.0, 0.0, 0.0, 1.0]), group_size=4)
    assert got.tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3], rel=1e-15)


@given(
    size=st.integers(2, 6),
    n_groups=st.integers(1, 4),
    data=st.data(),
)
def test_rloo_equals_scaled_centred_reward(size: int, n_groups: int, data: st.DataObject) -> None:
    flat = data.draw(
        st.lists(st.floats(-1e3, 1e3), min_size=size * n_groups, max_size=size * n_groups)
    )
    r = _t(flat)
    got = rloo_advantages(rewards=r, group_size=size)
    groups = r.view(n_groups, size)
    identity = (size / (size - 1) * (groups - groups.mean(dim=1, keepdim=True))).flatten()
    tol = 64 * EPS * size * (1.0 + float(r.abs().max()))
    assert torch.allclose(got, identity, rtol=0, atol=tol)


# ----------------------------------------------------------------------- returns, REINFORCE++


@pytest.mark.parametrize("gamma", [1.0, 0.9, 0.5, 0.0])
@pytest.mark.parametrize("seed", range(3))
def test_discounted_returns_match_a_loop(gamma: float, seed: int) -> None:
    b = _ragged([3, 1, 5, 2], seed)
    got = discounted_returns(
        token_rewards=b["token_rewards"], response_mask=b["response_mask"], gamma=gamma
    )
    want = _loop_returns(b["token_rewards"], b["response_mask"], gamma)
    assert torch.allclose(got, want, rtol=1e-14, atol=1e-14)
    assert bool((got[~b["response_mask"]] == 0).all())


def test_token_level_rewards_hand_case() -> None:
    mask = torch.tensor([[True, True, True], [True, False, False]])
    got = token_level_rewards(
        response_mask=mask,
        rewards=_t([1.0, 2.0]),
        token_rewards=_t([[0.25, 0.5, 0.0], [-1.0, NAN, NAN]]),
    )
    assert got.tolist() == [[0.25, 0.5, 1.0], [1.0, 0.0, 0.0]]


def test_reinforce_pp_hand_golden() -> None:
    # returns (1, 1 | 0): mean 2/3, unbiased var 1/3 (docs/advantages.md).
    mask = torch.tensor([[True, True], [True, False]])
    got = reinforce_pp_advantages(response_mask=mask, rewards=_t([1.0, 0.0]))
    s = math.sqrt(1 / 3 + WHITEN_EPS)
    expected = [1 / 3 / s, 1 / 3 / s, -2 / 3 / s, 0.0]
    assert got.flatten().tolist() == pytest.approx(expected, rel=1e-14)


@pytest.mark.parametrize(("gamma", "unbiased"), [(1.0, True), (0.9, False), (0.5, True)])
@pytest.mark.parametrize("seed", range(3))
def test_reinforce_pp_matches_loop_returns_then_global_whitening(
    gamma: float, unbiased: bool, seed: int
) -> None:
    b = _ragged([4, 2, 6, 1], seed)
    mask = b["response_mask"]
    got = reinforce_pp_advantages(
        response_mask=mask,
        rewards=b["rewards"],
        token_rewards=b["token_rewards"],
        gamma=gamma,
        unbiased_std=unbiased,
    )
    per_token = torch.where(mask, b["token_rewards"], 0.0)
    last = mask.sum(dim=1) - 1
    per_token[torch.arange(4), last] += b["rewards"]
    want = _whiten_python(_loop_returns(per_token, mask, gamma), mask, unbiased)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)


def test_reinforce_pp_baseline_subtracts_the_group_mean_first() -> None:
    b = _ragged([3, 2, 4, 1], seed=7)
    mask, r = b["response_mask"], b["rewards"]
    got = reinforce_pp_baseline_advantages(
        rewards=r, response_mask=mask, group_size=2, token_rewards=b["token_rewards"]
    )
    centred = r - r.view(2, 2).mean(dim=1).repeat_interleave(2)
    want = reinforce_pp_advantages(
        response_mask=mask, rewards=centred, token_rewards=b["token_rewards"]
    )
    assert torch.allclose(got, want, rtol=0, atol=1e-14)
    plain = reinforce_pp_advantages(response_mask=mask, rewards=r, token_rewards=b["token_rewards"])
    assert (got - plain).abs().max() > 0.1


# ----------------------------------------------------------------------- GAE


def test_gae_hand_golden() -> None:
    # docs/advantages.md "GAE golden": gamma = lam = 1/2, so gamma * lam = 1/4.
    mask = torch.tensor([[True, True, True], [True, True, False]])
    r = _t([[0.0, 0.0, 1.0], [1.0, 2.0, NAN]])
    v = _t([[0.5, 0.25, 0.5], [1.0, 0.5, NAN]])
    adv, ret = gae(token_rewards=r, values=v, response_mask=mask, gamma=0.5, lam=0.5)
    assert adv.tolist() == [[-0.34375, 0.125, 0.5], [0.625, 1.5, 0.0]]
    assert ret.tolist() == [[0.15625, 0.375, 1.0], [1.625, 2.0, 0.0]]


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95), (0.0, 0.5), (0.5, 0.0)])
@pytest.mark.parametrize("seed", range(3))
def test_gae_matches_a_loop(gamma: float, lam: float, seed: int) -> None:
    b = _ragged([5, 1, 3, 7], seed, pad=2)
    mask = b["response_mask"]
    adv, ret = gae(
        token_rewards=b["token_rewards"],
        values=b["values"],
        response_mask=mask,
        gamma=gamma,
        lam=lam,
    )
    want = _loop_gae(b["token_rewards"], b["values"], mask, gamma, lam)
    assert torch.allclose(adv, want, rtol=1e-13, atol=1e-13)
    assert torch.equal(ret, torch.where(mask, adv + b["values"], 0.0))


@pytest.mark.parametrize("gamma", [1.0, 0.8])
def test_gae_limits_lambda_zero_is_td_error_and_one_is_return_minus_value(gamma: float) -> None:
    b = _ragged([4, 2, 5], seed=11)
    mask, r, v = b["response_mask"], b["token_rewards"], b["values"]
    td, _ = gae(token_rewards=r, values=v, response_mask=mask, gamma=gamma, lam=0.0)
    nxt = torch.nn.functional.pad(torch.where(mask, v, 0.0)[:, 1:], (0, 1))
    assert torch.allclose(td, torch.where(mask, r + gamma * nxt - v, 0.0), atol=1e-15)
    mc, _ = gae(token_rewards=r, values=v, response_mask=mask, gamma=gamma, lam=1.0)
    returns = discounted_returns(token_rewards=r, response_mask=mask, gamma=gamma)
    assert torch.allclose(mc, torch.where(mask, returns - v, 0.0), rtol=1e-13, atol=1e-13)


def test_gae_padding_never_leaks_and_gradcheck() -> None:
    b = _ragged([3, 1, 2], seed=2, pad=2)
    mask = b["response_mask"]
    r = b["token_rewards"].clone().requires_grad_()
    v = b["values"].clone().requires_grad_()
    adv, ret = gae(token_rewards=r, values=v, response_mask=mask, gamma=0.9, lam=0.8)
    assert bool((adv[~mask] == 0).all()) and bool((ret[~mask] == 0).all())
    gr, gv = torch.autograd.grad((adv + ret).sum(), (r, v))
    assert bool(gr.isfinite().all()) and bool((gr[~mask] == 0).all())
    assert bool(gv.isfinite().all()) and bool((gv[~mask] == 0).all())

    def f(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return gae(token_rewards=x, values=y, response_mask=mask, gamma=0.9, lam=0.8)

    finite = {k: torch.where(mask, b[k], 0.0).requires_grad_() for k in ("token_rewards", "values")}
    assert torch.autograd.gradcheck(f, (finite["token_rewards"], finite["values"]))


# ----------------------------------------------------------------------- whitening


def test_whiten_hand_case_and_moments() -> None:
    mask = torch.tensor([[True, True, True], [True, False, False]])
    x = _t([[1.0, 2.0, 3.0], [4.0, NAN, NAN]])
    got = whiten(x, response_mask=mask, eps=0.0)
    # mean 5/2, unbiased variance (9/4 + 1/4 + 1/4 + 9/4) / 3 = 5/3.
    s = math.sqrt(5 / 3)
    expected = [-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s, 0.0, 0.0]
    assert got.flatten().tolist() == pytest.approx(expected, rel=1e-15)
    assert float(got[mask].mean()) == pytest.approx(0.0, abs=1e-15)
    assert float(got[mask].var()) == pytest.approx(1.0, rel=1e-14)
    kept = whiten(x, response_mask=mask, shift_mean=False, unbiased=False, eps=0.0)
    assert float(kept[mask].mean()) == pytest.approx(2.5, rel=1e-15)
    assert float(kept[mask].var(correction=0)) == pytest.approx(1.0, rel=1e-14)
    assert kept[~mask].tolist() == [0.0, 0.0]


def test_gradcheck_whiten_and_reinforce_pp() -> None:
    b = _ragged([3, 2, 4], seed=3)
    mask = b["response_mask"]
    x = torch.where(mask, b["token_rewards"], 0.0).requires_grad_()
    r = b["rewards"].clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda y: whiten(y, response_mask=mask), (x,))
    assert torch.autograd.gradcheck(
        lambda y, z: reinforce_pp_advantages(
            response_mask=mask, rewards=z, token_rewards=y, gamma=0.9
        ),
        (x, r),
    )


# ----------------------------------------------------------------------- dispatcher


def _batch() -> dict[str, torch.Tensor]:
    return _ragged([3, 1, 4, 2], seed=9)


def test_dispatcher_sequence_level_estimators_return_b() -> None:
    r = _batch()["rewards"]
    grpo = compute_advantages(_cfg("grpo", std_eps=0.25), rewards=r, group_size=2)
    assert torch.equal(grpo, grpo_advantages(rewards=r, group_size=2, std_eps=0.25))
    drgrpo = _cfg("grpo", scale_by_std=False)
    expected = grpo_advantages(rewards=r, group_size=2, scale_by_std=False)
    assert torch.equal(compute_advantages(drgrpo, rewards=r, group_size=2), expected)
    rloo = compute_advantages(_cfg("rloo"), rewards=r, group_ids=torch.tensor([0] * 4))
    assert rloo.shape == (4,)
    assert torch.equal(rloo, rloo_advantages(rewards=r, group_size=4))
    whitened = compute_advantages(_cfg("rloo", whiten=True), rewards=r, group_size=4)
    assert torch.allclose(whitened, (rloo - rloo.mean()) / (rloo.var() + WHITEN_EPS).sqrt())


def test_dispatcher_token_level_estimators_return_bt() -> None:
    b = _batch()
    mask, r, tr, v = b["response_mask"], b["rewards"], b["token_rewards"], b["values"]
    cfg = _cfg("reinforce_pp", gamma=0.9)
    got = compute_advantages(cfg, rewards=r, response_mask=mask, token_rewards=tr)
    assert got.shape == mask.shape
    want = reinforce_pp_advantages(response_mask=mask, rewards=r, token_rewards=tr, gamma=0.9)
    assert torch.equal(got, want)
    cfg = _cfg("reinforce_pp_baseline")
    got = compute_advantages(cfg, rewards=r, response_mask=mask, group_size=2)
    assert torch.equal(
        got, reinforce_pp_baseline_advantages(rewards=r, response_mask=mask, group_size=2)
    )
    cfg = _cfg("gae", gamma=0.9, lam=0.8)
    got = compute_advantages(cfg, rewards=r, response_mask=mask, values=v, token_rewards=tr)
    per_token = token_level_rewards(response_mask=mask, rewards=r, token_rewards=tr)
    want, _ = gae(token_rewards=per_token, values=v, response_mask=mask, gamma=0.9, lam=0.8)
    assert torch.equal(got, want)
    white = compute_advantages(
        cfg.replace(whiten=True), rewards=r, response_mask=mask, values=v, token_rewards=tr
    )
    assert torch.equal(white, whiten(want, response_mask=mask))


@pytest.mark.parametrize(
    ("estimator", "kwargs", "words"),
    [
        ("grpo", {"rewards": "r", "group_size": 2, "values": "v"}, "values is not used by"),
        ("rloo", {"rewards": "r", "group_size": 2, "response_mask": "m"}, "response_mask is not"),
        (
            "reinforce_pp",
            {"rewards": "r", "response_mask": "m", "group_size": 2},
            "group_size/group_ids is not used",
        ),
        ("gae", {"rewards": "r", "response_mask": "m", "group_ids": "i"}, "group_size/group_ids"),
        ("rloo", {"group_size": 2}, "rewards is required by estimator='rloo'"),
        ("gae", {"rewards": "r", "response_mask": "m"}, "values is required by estimator='gae'"),
        ("reinforce_pp", {"rewards": "r"}, "response_mask is required"),
        ("reinforce_pp_baseline", {"response_mask": "m", "group_size": 2}, "rewards is required"),
        ("reinforce_pp", {"response_mask": "m"}, "pass rewards"),
    ],
)
def test_dispatcher_rejects_unused_and_missing_tensors(
    estimator: str, kwargs: dict[str, Any], words: str
) -> None:
    b = _batch()
    real = {"r": b["rewards"], "v": b["values"], "m": b["response_mask"], "i": torch.zeros(4)}
    args: dict[str, Any] = {k: real.get(v, v) for k, v in kwargs.items()}
    with pytest.raises(InputError, match=words):
        compute_advantages(_cfg(estimator), **args)


def test_dispatcher_whitening_needs_two_rows() -> None:
    with pytest.raises(InputError, match=r"rewards has 1 value\(s\); whitening needs at least 2"):
        compute_advantages(_cfg("grpo", whiten=True), rewards=_t([1.0]), group_size=1)


def test_dispatcher_rejects_a_non_config() -> None:
    with pytest.raises(ConfigError, match="cfg must be an AdvantageConfig"):
        compute_advantages("grpo", rewards=_t([1.0, 2.0]), group_size=2)  # type: ignore[arg-type]


# ----------------------------------------------------------------------- bad input


R4 = _t([1.0, 2.0, 3.0, 4.0])

GROUP_CASES: BadCases = {
    "numpy": ({"rewards": np.ones(4)}, InputTypeError, "rewards must be a torch.Tensor"),
    "int": (
        {"rewards": torch.ones(4, dtype=torch.long)},
        InputTypeError,
        "rewards must have a floating-point dtype",
    ),
    "2d": ({"rewards": torch.ones(4, 1, dtype=F64)}, InputError, r"rewards must have shape \[B\]"),
    "empty": ({"rewards": torch.ones(0, dtype=F64)}, InputError, "B >= 1"),
    "nan": (
        {"rewards": _t([1.0, NAN, 0.0, 0.0])},
        InputError,
        r"rewards holds NaN at positions \(1\)",
    ),
    "inf": ({"rewards": _t([1.0, 0.0, 0.0, -math.inf])}, InputError, r"rewards holds inf .*\(3\)"),
    "not-dividing": (
        {"group_size": 3},
        InputError,
        "group_size=3 does not divide the batch size B=4",
    ),
    "size-zero": ({"group_size": 0}, ConfigError, "group_size must be a positive integer"),
    "size-bool": ({"group_size": True}, ConfigError, "group_size must be a positive integer"),
    "size-float": ({"group_size": 2.0}, ConfigError, "group_size must be a positive integer"),
    "both": ({"group_ids": torch.zeros(4, dtype=torch.long)}, InputError, "exactly one of"),
    "neither": ({"group_size": None}, InputError, "exactly one of group_size"),
    "ids-float": (
        {"group_size": None, "group_ids": torch.zeros(4)},
        InputTypeError,
        "group_ids must have an integer dtype",
    ),
    "ids-bool": (
        {"group_size": None, "group_ids": torch.zeros(4, dtype=torch.bool)},
        InputTypeError,
        "group_ids must have an integer dtype",
    ),
    "ids-shape": (
        {"group_size": None, "group_ids": torch.zeros(5, dtype=torch.long)},
        InputError,
        r"group_ids must have shape \[B\] like rewards = \[4\], got \[5\]",
    ),
    "ids-numpy": (
        {"group_size": None, "group_ids": np.zeros(4, dtype=np.int64)},
        InputTypeError,
        "group_ids must be a torch.Tensor",
    ),
    "ids-device": (
        {"group_size": None, "group_ids": torch.zeros(4, dtype=torch.long, device="meta")},
        InputTypeError,
        "group_ids on meta",
    ),
    "singleton": ({"singleton": "drop"}, ConfigError, "singleton must be one of 'zero', 'error'"),
}


@pytest.mark.parametrize("case", list(GROUP_CASES))
@pytest.mark.parametrize("fn", [grpo_advantages, rloo_advantages], ids=["grpo", "rloo"])
def test_group_estimators_bad_input(fn: Any, case: str) -> None:
    changes, error, words = GROUP_CASES[case]
    with pytest.raises(error, match=words):
        fn(**{"rewards": R4, "group_size": 2, **changes})


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"std_eps": -1e-6}, "std_eps must be >= 0"),
        ({"std_eps": math.inf}, "std_eps must be finite"),
        ({"scale_by_std": 1}, "scale_by_std must be a bool"),
        ({"unbiased_std": "yes"}, "unbiased_std must be a bool"),
    ],
)
def test_grpo_bad_options(changes: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        grpo_advantages(rewards=R4, group_size=2, **changes)


def _gae_args() -> dict[str, Any]:
    b = _ragged([3, 1, 2], seed=0)
    return {
        "token_rewards": b["token_rewards"],
        "values": b["values"],
        "response_mask": b["response_mask"],
        "gamma": 0.9,
        "lam": 0.8,
    }


def _poke(name: str, pos: tuple[int, int], value: float) -> dict[str, Any]:
    args = _gae_args()
    args[name] = args[name].clone()
    args[name][pos] = value
    return args


TOKEN_CASES: BadCases = {
    "numpy": ({"values": np.zeros((3, 4))}, InputTypeError, "values must be a torch.Tensor"),
    "int": (
        {"token_rewards": torch.zeros(3, 4, dtype=torch.int32)},
        InputTypeError,
        "token_rewards must have a floating-point dtype",
    ),
    "mixed": (
        {"values": torch.zeros(3, 4)},
        InputTypeError,
        "token_rewards=torch.float64, values=torch.float32",
    ),
    "shape": (
        {"values": torch.zeros(3, 3, dtype=F64)},
        InputError,
        r"values must have shape \[B, T\] like response_mask = \[3, 4\], got \[3, 3\]",
    ),
    "float-mask": (
        {"response_mask": torch.ones(3, 4)},
        InputTypeError,
        "response_mask must be a torch.bool",
    ),
    "3d-mask": (
        {"response_mask": torch.ones(3, 4, 1, dtype=torch.bool)},
        InputError,
        "response_mask must be 2-D",
    ),
    "empty-row": (
        {"response_mask": torch.tensor([[True] * 4, [False] * 4, [True] * 4])},
        InputError,
        r"response_mask has rows with no response token: rows \[1\]",
    ),
    "left-padded": (
        {
            "response_mask": torch.tensor(
                [[True] * 4, [False, True, True, True], [True, False, True, False]]
            )
        },
        InputError,
        r"right-padded.*positions \(1, 1\), \(2, 2\)",
    ),
    "nan": (
        _poke("values", (0, 2), NAN),
        InputError,
        r"values holds NaN at response positions \(0, 2\)",
    ),
    "inf": (
        _poke("token_rewards", (2, 1), math.inf),
        InputError,
        r"token_rewards holds inf at response positions \(2, 1\)",
    ),
    "gamma": ({"gamma": 1.5}, ConfigError, r"gamma must lie in \[0, 1\]"),
    "lam": ({"lam": -0.1}, ConfigError, r"lam must lie in \[0, 1\]"),
    "lam-nan": ({"lam": NAN}, ConfigError, "lam must be finite"),
}


@pytest.mark.parametrize("case", list(TOKEN_CASES))
def test_gae_bad_input(case: str) -> None:
    changes, error, words = TOKEN_CASES[case]
    with pytest.raises(error, match=words):
        gae(**{**_gae_args(), **changes})


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (
            lambda a: discounted_returns(
                token_rewards=a["token_rewards"], response_mask=a["response_mask"], gamma=-1.0
            ),
            ConfigError,
            "gamma",
        ),
        (
            lambda a: reinforce_pp_advantages(response_mask=a["response_mask"]),
            InputError,
            "pass rewards",
        ),
        (
            lambda a: reinforce_pp_advantages(
                response_mask=torch.tensor([[True, False]]), rewards=_t([1.0])
            ),
            InputError,
            "response_mask selects 1 value.*at least 2",
        ),
        (
            lambda a: reinforce_pp_advantages(
                response_mask=a["response_mask"],
                rewards=torch.ones(3),
                token_rewards=a["token_rewards"],
            ),
            InputTypeError,
            "rewards=torch.float32",
        ),
        (
            lambda a: reinforce_pp_advantages(
                response_mask=a["response_mask"], rewards=torch.ones(4, dtype=F64)
            ),
            InputError,
            r"rewards must have shape \[B\] = \[3\]",
        ),
        (
            lambda a: token_level_rewards(response_mask=a["response_mask"]),
            InputError,
            "pass rewards",
        ),
        (
            lambda a: whiten(a["values"], response_mask=a["response_mask"], eps=-1.0),
            ConfigError,
            "eps must be >= 0",
        ),
        (
            lambda a: whiten(a["values"], response_mask=a["response_mask"], shift_mean=NOT_A_BOOL),
            ConfigError,
            "shift_mean must be a bool",
        ),
        (
            lambda a: whiten(
                torch.ones(1, 2, dtype=F64), response_mask=torch.ones(1, 2).bool(), eps=0.0
            ),
            NumericalError,
            "constant",
        ),
        (
            lambda a: whiten(a["values"].long(), response_mask=a["response_mask"]),
            InputTypeError,
            "x must have a floating-point dtype",
        ),
    ],
)
def test_other_token_level_bad_input(call: Any, error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        call(_gae_args())


# ----------------------------------------------------------------------- OPO, singleton policies


def test_opo_hand_golden_and_singletons() -> None:
    """docs/advantages.md "OPO": rewards (1, 0 | 1, 1 | 2) with lengths (1, 3 | 2, 1 | 2):
    baseline (1*1 + 3*0)/4 = 1/4 -> (3/4, -1/4); a constant group -> 0; the lone row 0
    ('zero') or 2 ('raw')."""
    rewards = _t([1.0, 0.0, 1.0, 1.0, 2.0])
    mask = torch.arange(3)[None, :] < torch.tensor([[1], [3], [2], [1], [2]])
    ids = torch.tensor([0, 0, 1, 1, 2])
    zero = opo_advantages(rewards=rewards, response_mask=mask, group_ids=ids)
    raw = opo_advantages(rewards=rewards, response_mask=mask, group_ids=ids, singleton="raw")
    assert zero.tolist() == [0.75, -0.25, 0.0, 0.0, 0.0]
    assert raw.tolist() == [0.75, -0.25, 0.0, 0.0, 2.0]
    same = torch.ones_like(mask)  # equal lengths: OPO is the plain centred reward
    assert torch.equal(
        opo_advantages(rewards=rewards, response_mask=same, group_ids=ids),
        grpo_advantages(rewards=rewards, group_ids=ids, scale_by_std=False),
    )


def test_singleton_raw_policy_keeps_the_reward() -> None:
    """verl 0.9.1 gives a lone sample mean 0 and std 1: GRPO ``r / (1 + eps)`` (``r``
    unscaled), RLOO ``r``, REINFORCE++-baseline whitens the raw reward."""
    rewards, ids = _t([1.0, 3.0, 7.0]), torch.tensor([5, 5, 9])
    grpo = grpo_advantages(rewards=rewards, group_ids=ids, singleton="raw", std_eps=0.5)
    assert float(grpo[2]) == 7.0 / 1.5
    plain = grpo_advantages(rewards=rewards, group_ids=ids, singleton="raw", scale_by_std=False)
    assert plain.tolist() == [-1.0, 1.0, 7.0]
    assert rloo_advantages(rewards=rewards, group_ids=ids, singleton="raw").tolist() == [
        -2.0,
        2.0,
        7.0,
    ]
    mask = torch.ones(3, 1, dtype=torch.bool)
    base = reinforce_pp_baseline_advantages(
        rewards=rewards, response_mask=mask, group_ids=ids, singleton="raw"
    )
    assert torch.allclose(base[:, 0], _whiten_python(_t([[-1.0], [1.0], [7.0]]), mask)[:, 0])


def test_grpo_eps_inside_the_square_root() -> None:
    """Rewards (0, 2), eps 1/2: ``+-1 / sqrt(2 + 1/2) = +-0.6324555320336759``."""
    out = grpo_advantages(rewards=_t([0.0, 2.0]), group_size=2, std_eps=0.5, eps_in_sqrt=True)
    assert torch.allclose(out, _t([-0.6324555320336759, 0.6324555320336759]), rtol=1e-15)


# ----------------------------------------------------------------------- GAE with dones


def test_gae_dones_hand_golden() -> None:
    """docs/advantages.md "Episode ends": gamma = lam = 1/2, r = (0, 1, 0, 2),
    V = (1/2, 1/4, 1/2, 1/4), done after t = 1 -> A = (-3/16, 3/4, 1/16, 7/4)."""
    mask = torch.ones(1, 4, dtype=torch.bool)
    dones = torch.tensor([[False, True, False, False]])
    adv, ret = gae(
        token_rewards=_t([[0.0, 1.0, 0.0, 2.0]]),
        values=_t([[0.5, 0.25, 0.5, 0.25]]),
        response_mask=mask,
        gamma=0.5,
        lam=0.5,
        dones=dones,
    )
    assert adv.tolist() == [[-0.1875, 0.75, 0.0625, 1.75]]
    assert ret.tolist() == [[0.3125, 1.0, 0.5625, 2.0]]


@pytest.mark.parametrize("seed", [0, 1])
def test_gae_dones_split_rows_into_independent_episodes(seed: int) -> None:
    """A done after token t makes ``A[:t+1]`` the GAE of the prefix alone (bootstrap 0)
    and ``A[t+1:]`` the GAE of the suffix alone."""
    b = _ragged([6, 6], seed, pad=0)
    cut = 2
    dones = torch.zeros(2, 6, dtype=torch.bool)
    dones[:, cut] = True
    full, _ = gae(
        token_rewards=b["token_rewards"],
        values=b["values"],
        response_mask=b["response_mask"],
        gamma=0.9,
        lam=0.8,
        dones=dones,
    )
    for part in (slice(0, cut + 1), slice(cut + 1, 6)):
        alone, _ = gae(
            token_rewards=b["token_rewards"][:, part].contiguous(),
            values=b["values"][:, part].contiguous(),
            response_mask=b["response_mask"][:, part].contiguous(),
            gamma=0.9,
            lam=0.8,
        )
        assert torch.allclose(full[:, part], alone, rtol=1e-14, atol=1e-15)


def test_gae_dones_bad_input() -> None:
    b = _ragged([2, 1], 0)
    args = {k: b[k] for k in ("token_rewards", "values", "response_mask")}
    with pytest.raises(InputTypeError, match=r"dones must be a torch\.bool tensor"):
        gae(**args, gamma=1.0, lam=1.0, dones=torch.zeros(2, 3))
    with pytest.raises(InputError, match=r"dones must have shape \[B, T\] like response_mask"):
        gae(**args, gamma=1.0, lam=1.0, dones=torch.zeros(2, 2, dtype=torch.bool))


# ----------------------------------------------------------------------- whitening conventions


def test_whitening_conventions_verl_and_openrlhf() -> None:
    """verl 0.9.1 ``masked_whiten``: counts ``N + 1e-8``, Bessel ``N / (N - 1)``,
    ``rsqrt(var + 1e-8)``; OpenRLHF 0.11.2: population variance, ``rsqrt(max(var, 1e-8))``."""
    x = _t([[1.0, 2.0, 3.0], [4.0, NAN, NAN]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    vals = [1.0, 2.0, 3.0, 4.0]
    n = 4.0
    mean = math.fsum(vals) / (n + 1e-8)
    var = math.fsum((v - mean) ** 2 for v in vals) / (n + 1e-8) * n / (n - 1)
    want = [(v - mean) / math.sqrt(var + 1e-8) for v in vals]
    got = whiten(x, response_mask=mask, convention=VERL_WHITENING)[mask].tolist()
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) <= 4e-16
    pop = whiten(x, response_mask=mask, convention=OPENRLHF_WHITENING)[mask]
    assert torch.allclose(pop, (_t(vals) - 2.5) / math.sqrt(1.25), rtol=1e-15)
    flat = whiten(
        _t([[3.0, 3.0]]),
        response_mask=torch.ones(1, 2, dtype=torch.bool),
        convention=OPENRLHF_WHITENING,
    )
    assert flat.tolist() == [[0.0, 0.0]]
    assert OPENRLHF_WHITENING.describe() == "population variance, rsqrt(max(var, 1e-08))"
    with pytest.raises(ConfigError, match="eps_mode must be one of 'add', 'clamp'"):
        Whitening(eps_mode="sqrt")


# ----------------------------------------------------------------------- non-finite (issue 15)


def test_power_of_two_rescaling_is_exact() -> None:
    """Statistics are taken of ``r / 2^k``: multiplying the rewards by ``2^40`` gives the
    same GRPO advantages bitwise (``std_eps = 0``), and the same whitened values."""
    g = torch.Generator().manual_seed(5)
    r = torch.randn(12, generator=g, dtype=F64)
    assert torch.equal(
        grpo_advantages(rewards=r, group_size=4, std_eps=0.0),
        grpo_advantages(rewards=r * 2.0**40, group_size=4, std_eps=0.0),
    )
    mask = torch.ones(3, 4, dtype=torch.bool)
    x = r.reshape(3, 4)
    assert torch.equal(
        whiten(x, response_mask=mask, eps=0.0), whiten(x * 2.0**600, response_mask=mask, eps=0.0)
    )


def _f16(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float16)


SQRT3_2 = math.sqrt(3.0) / 2.0  # GRPO of (a, -a, a, -a): +-sqrt(3)/2


def test_large_rewards_give_their_true_advantages() -> None:
    """issue 15: float16 rewards +-300 and float64 +-1e200 gave all zeros; whitening of
    +-1e200 gave zeros."""
    half = grpo_advantages(rewards=_f16([300.0, -300.0, 300.0, -300.0]), group_size=4)
    want = _t([SQRT3_2, -SQRT3_2, SQRT3_2, -SQRT3_2])
    assert torch.allclose(half.double(), want, rtol=4 * 2.0**-11, atol=0)  # float16 rounding
    big = grpo_advantages(rewards=_t([1e200, -1e200, 1e200, -1e200]), group_size=4)
    assert torch.allclose(big, want, rtol=1e-15)
    mask = torch.ones(1, 4, dtype=torch.bool)
    white = whiten(_t([[1e200, -1e200, 1e200, -1e200]]), response_mask=mask)
    assert torch.allclose(white, want[None, :], rtol=1e-15)
    fits = rloo_advantages(rewards=_f16([3e4, -3e4]), group_size=2)  # 2 r = +-6e4 fits
    assert fits.tolist() == _f16([6e4, -6e4]).tolist()


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (
            lambda: rloo_advantages(rewards=_f16([6e4, -6e4]), group_size=2),
            r"rloo advantages overflow torch.float16 \(largest finite 65504\) at positions "
            r"\(0\), \(1\)",
        ),
        (
            lambda: discounted_returns(
                token_rewards=_t([[1e308, 1e308]]),
                response_mask=torch.ones(1, 2, dtype=torch.bool),
                gamma=1.0,
            ),
            r"discounted returns overflow torch.float64 .* at positions \(0, 0\)",
        ),
        (
            lambda: gae(
                token_rewards=_t([[1e308, 1e308]]),
                values=_t([[0.0, 0.0]]),
                response_mask=torch.ones(1, 2, dtype=torch.bool),
                gamma=1.0,
                lam=1.0,
            ),
            r"gae advantages overflow torch.float64",
        ),
        (
            lambda: reinforce_pp_advantages(
                rewards=_t([1e308, 1e308]),
                token_rewards=_t([[1e308, 0.0], [0.0, 0.0]]),
                response_mask=torch.ones(2, 2, dtype=torch.bool),
            ),
            r"discounted returns overflow",
        ),
    ],
    ids=["rloo-f16", "returns-1e308", "gae-1e308", "reinforce-pp-1e308"],
)
def test_unrepresentable_results_raise_a_named_error(call: Any, words: str) -> None:
    with pytest.raises(NumericalError, match=words) as info:
        call()
    wider = "compute in float64" in str(info.value)
    assert wider == ("float16" in str(info.value))  # float64 is never advised for float64


@pytest.mark.parametrize(
    ("x", "expected"),
    [
        # population variance 1.25 >> 1e-8: exactly (x - mean) / sqrt(var), no eps at all
        ([1.0, 2.0, 3.0, 4.0], [(v - 2.5) / math.sqrt(1.25) for v in (1.0, 2.0, 3.0, 4.0)]),
        # variance 1e-10 < 1e-8: clamped to 1e-8, so +-1e-5 / 1e-4 = +-0.1 (adding eps: 0.0995)
        ([0.0, 2e-5], [-0.1, 0.1]),
    ],
)
def test_openrlhf_whitening_clamps_the_variance_it_does_not_add_eps(
    x: list[float], expected: list[float]
) -> None:
    """OpenRLHF 0.11.2 ``var.clamp(min=1e-8).rsqrt()``: at unit variance ``rsqrt(var + eps)``
    differs by 5e-9 relative, which ``allclose``'s default ``atol=1e-8`` hid (issue 27),
    so the comparison here is relative, to 4 ulps."""
    from polgrad_reference.advantages import OPENRLHF_WHITENING, whiten

    t = torch.tensor([x], dtype=torch.float64)
    out = whiten(
        t, response_mask=torch.ones_like(t, dtype=torch.bool), convention=OPENRLHF_WHITENING
    )
    assert out[0].tolist() == pytest.approx(expected, rel=1e-15, abs=0.0)
