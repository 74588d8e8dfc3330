"""Every public function of the reference x every tensor argument x one bad value each
(issue 28, the asserted bad-input count): a list instead of a tensor, an integer dtype,
a wrong shape, a 0-d tensor, NaN and inf at a response token; and each scalar argument's
bad values. Each case expects the named error (``InputError``, ``InputTypeError``,
``ConfigError``, ``NumericalError``: ``PolgradError``) with the argument's name in the
message, never a raw torch error or a silent NaN."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

import polgrad_reference as ref
from polgrad_reference import PolgradError, PolicyLossConfig

F64 = torch.float64
B, T, V = 4, 3, 5


def _base() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    lp = -0.1 - torch.rand(B, T, generator=g, dtype=F64)
    return {
        "mask": mask,
        "lp": lp,
        "lp2": lp - 0.05 * torch.rand(B, T, generator=g, dtype=F64),
        "adv": torch.tensor([1.0, -1.0, 0.5, -0.5], dtype=F64),
        "bt": torch.randn(B, T, generator=g, dtype=F64),
        "bt2": torch.randn(B, T, generator=g, dtype=F64),
        "bt3": torch.randn(B, T, generator=g, dtype=F64),
        "logits": torch.randn(B, T, V, generator=g, dtype=F64),
        "logits2": torch.randn(B, T, V, generator=g, dtype=F64),
        "rewards": torch.tensor([1.0, 0.0, 1.0, 0.5], dtype=F64),
    }


# function name -> (call(**tensors), {tensor argument: key of _base})
FUNCTIONS: dict[str, tuple[Callable[..., Any], dict[str, str]]] = {
    "policy_loss": (
        lambda **kw: ref.policy_loss(PolicyLossConfig(), **kw),
        {"logprobs": "lp", "old_logprobs": "lp2", "advantages": "adv", "response_mask": "mask"},
    ),
    "kl_estimate": (
        lambda **kw: ref.kl_estimate("k3", **kw),
        {"logprobs": "lp", "ref_logprobs": "lp2", "response_mask": "mask"},
    ),
    "reverse_kl_surrogate": (
        ref.reverse_kl_surrogate,
        {"logprobs": "lp", "ref_logprobs": "lp2", "response_mask": "mask"},
    ),
    "kl_penalized_rewards": (
        lambda **kw: ref.kl_penalized_rewards(coef=0.1, **kw),
        {"logprobs": "lp", "ref_logprobs": "lp2", "response_mask": "mask", "rewards": "rewards"},
    ),
    "aggregate": (
        lambda **kw: ref.aggregate(kw.pop("x"), mode="token-mean", **kw),
        {"x": "bt", "response_mask": "mask"},
    ),
    "token_weights": (
        lambda **kw: ref.token_weights(kw["response_mask"], "token-mean"),
        {"response_mask": "mask"},
    ),
    "clipped_value_loss": (
        lambda **kw: ref.clipped_value_loss(clip_range=0.2, **kw),
        {"values": "bt", "old_values": "bt2", "returns": "bt3", "response_mask": "mask"},
    ),
    "value_loss_per_token": (
        lambda **kw: ref.value_loss_per_token(clip_range=0.2, **kw),
        {"values": "bt", "old_values": "bt2", "returns": "bt3", "response_mask": "mask"},
    ),
    "token_entropy": (ref.token_entropy, {"logits": "logits", "response_mask": "mask"}),
    "entropy_bonus": (ref.entropy_bonus, {"logits": "logits", "response_mask": "mask"}),
    "sampled_token_entropy": (
        ref.sampled_token_entropy,
        {"logprobs": "lp", "response_mask": "mask"},
    ),
    "categorical_kl": (ref.categorical_kl, {"p_logits": "logits", "q_logits": "logits2"}),
    "grpo_advantages": (
        lambda **kw: ref.grpo_advantages(group_size=2, **kw),
        {"rewards": "rewards"},
    ),
    "rloo_advantages": (
        lambda **kw: ref.rloo_advantages(group_size=2, **kw),
        {"rewards": "rewards"},
    ),
    "discounted_returns": (
        lambda **kw: ref.discounted_returns(gamma=0.9, **kw),
        {"token_rewards": "bt", "response_mask": "mask"},
    ),
    "gae": (
        lambda **kw: ref.gae(gamma=0.9, lam=0.95, **kw),
        {"token_rewards": "bt", "values": "bt2", "response_mask": "mask"},
    ),
    "whiten": (
        lambda **kw: ref.whiten(kw.pop("x"), **kw),
        {"x": "bt", "response_mask": "mask"},
    ),
    "token_level_rewards": (
        ref.token_level_rewards,
        {"response_mask": "mask", "rewards": "rewards"},
    ),
}


def _wrong_shape(t: torch.Tensor) -> torch.Tensor:
    if t.dtype is torch.bool:  # the mask sets [B, T]: one more dimension is wrong alone
        return t[..., None]
    return torch.cat([t, t[:1]], dim=0)  # one row too many


def _at_token(t: torch.Tensor, value: float) -> torch.Tensor:
    out = t.clone()
    out.view(-1)[0] = value  # row 0, token 0: a response token
    return out


def _bad_values(t: torch.Tensor) -> dict[str, Callable[[torch.Tensor], Any]]:
    bad: dict[str, Callable[[torch.Tensor], Any]] = {
        "a list": lambda x: x.tolist(),
        "a wrong shape": _wrong_shape,
        "0-d": lambda x: x.reshape(-1)[0],
    }
    if t.dtype is torch.bool:
        bad["float"] = lambda x: x.to(F64)
        bad["int"] = lambda x: x.long()
    else:
        bad["int"] = lambda x: x.round().long()
        bad["NaN"] = lambda x: _at_token(x, math.nan)
        bad["inf"] = lambda x: _at_token(x, math.inf)
    return bad


def _tensor_cases() -> list[tuple[str, Callable[[], Any], str]]:
    base = _base()
    cases: list[tuple[str, Callable[[], Any], str]] = []
    for fname, (fn, args) in FUNCTIONS.items():
        for arg, key in args.items():
            for label, spoil in _bad_values(base[key]).items():

                def call(fn: Any = fn, args: Any = args, arg: str = arg, spoil: Any = spoil) -> Any:
                    b = _base()
                    kw = {a: b[k] for a, k in args.items()}
                    kw[arg] = spoil(kw[arg])
                    return fn(**kw)

                cases.append((f"{fname} {arg} {label}", call, arg))
    return cases


def _scalar(
    fname: str, call: Callable[..., Any], arg: str, values: dict[str, object]
) -> list[tuple[str, Callable[[], Any], str]]:
    out: list[tuple[str, Callable[[], Any], str]] = []
    for label, value in values.items():

        def one(call: Any = call, arg: str = arg, value: object = value) -> Any:
            return call(**{arg: value})

        out.append((f"{fname} {arg}={label}", one, arg))
    return out


def _agg(**kw: Any) -> Any:
    b = _base()
    return ref.aggregate(b["bt"], response_mask=b["mask"], **{"mode": "token-mean", **kw})


def _value(**kw: Any) -> Any:
    b = _base()
    args = {"clip_range": 0.2, **kw}
    return ref.clipped_value_loss(
        values=b["bt"], old_values=b["bt2"], returns=b["bt3"], response_mask=b["mask"], **args
    )


def _returns(**kw: Any) -> Any:
    b = _base()
    return ref.discounted_returns(
        token_rewards=b["bt"], response_mask=b["mask"], **{"gamma": 0.9, **kw}
    )


def _gae(**kw: Any) -> Any:
    b = _base()
    args = {"gamma": 0.9, "lam": 0.95, **kw}
    return ref.gae(token_rewards=b["bt"], values=b["bt2"], response_mask=b["mask"], **args)


def _grpo(**kw: Any) -> Any:
    return ref.grpo_advantages(rewards=_base()["rewards"], **{"group_size": 2, **kw})


def _kl(**kw: Any) -> Any:
    b = _base()
    args = {"estimator": "k3", **kw}
    return ref.kl_estimate(
        args.pop("estimator"), logprobs=b["lp"], ref_logprobs=b["lp2"], response_mask=b["mask"]
    )


def _penalized(**kw: Any) -> Any:
    b = _base()
    args = {"coef": 0.1, **kw}
    return ref.kl_penalized_rewards(
        logprobs=b["lp"],
        ref_logprobs=b["lp2"],
        response_mask=b["mask"],
        rewards=b["rewards"],
        **args,
    )


def _whiten(**kw: Any) -> Any:
    b = _base()
    return ref.whiten(b["bt"], response_mask=b["mask"], **kw)


NUMBER = {"nan": math.nan, "inf": math.inf, "a string": "0.9", "None": None, "negative": -1.0}
SCALAR_CASES = [
    *_scalar("aggregate", _agg, "mode", {"unknown": "tokn-mean", "int": 3, "None": None}),
    *_scalar("aggregate", _agg, "budget", {"zero": 0, "negative": -4, "float": 4.5, "str": "4"}),
    *_scalar(
        "clipped_value_loss", _value, "clip_range", {k: v for k, v in NUMBER.items() if k != "None"}
    ),
    *_scalar("clipped_value_loss", _value, "mode", {"unknown": "mean"}),
    *_scalar("discounted_returns", _returns, "gamma", {**NUMBER, "above 1": 1.5}),
    *_scalar("gae", _gae, "gamma", {**NUMBER, "above 1": 1.5}),
    *_scalar("gae", _gae, "lam", {**NUMBER, "above 1": 1.5}),
    *_scalar(
        "grpo_advantages",
        _grpo,
        "group_size",
        {"zero": 0, "not dividing": 3, "str": "2", "float": 2.0},
    ),
    *_scalar(
        "grpo_advantages", _grpo, "std_eps", {"nan": math.nan, "negative": -1e-6, "str": "1e-6"}
    ),
    *_scalar("grpo_advantages", _grpo, "singleton", {"unknown": "drop-all"}),
    *_scalar("grpo_advantages", _grpo, "scale_by_std", {"str": "yes", "None": None}),
    *_scalar("kl_estimate", _kl, "estimator", {"unknown": "k9", "int": 3}),
    *_scalar(
        "kl_penalized_rewards", _penalized, "coef", {"nan": math.nan, "inf": math.inf, "str": "0.1"}
    ),
    *_scalar("whiten", _whiten, "eps", {"nan": math.nan, "negative": -1.0, "str": "1e-8"}),
    *_scalar("whiten", _whiten, "shift_mean", {"str": "yes"}),
]

MATRIX_CASES = _tensor_cases() + SCALAR_CASES
MATRIX_BAD_INPUTS = len(MATRIX_CASES)


@pytest.mark.parametrize(("call", "arg"), [pytest.param(c, a, id=n) for n, c, a in MATRIX_CASES])
def test_a_bad_argument_is_a_named_error_naming_it(call: Callable[[], Any], arg: str) -> None:
    with pytest.raises(PolgradError) as info:
        call()
    assert arg in str(info.value), str(info.value)


def test_the_case_names_are_distinct() -> None:
    assert len({n for n, *_ in MATRIX_CASES}) == MATRIX_BAD_INPUTS
