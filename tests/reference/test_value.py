"""Clipped value loss: hand goldens, gradient regions, aggregation, padding, bad input.

Each identity here is stated and derived in docs/value.md.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from polgrad_reference.aggregate import aggregate, token_weights
from polgrad_reference.config import Aggregation
from polgrad_reference.errors import ConfigError, InputError, InputTypeError
from polgrad_reference.value import clipped_value_loss, value_loss_per_token

F64 = torch.float64
NAN = float("nan")
MODES = list(Aggregation)


def _budget(mode: Aggregation) -> int | None:
    return 8 if mode is Aggregation.TOKEN_SUM_NORM else None


def _golden() -> dict[str, Any]:
    """docs/value.md "Golden case": clip range 1/4, four tokens in rows of length 3 and 1."""
    return {
        "values": torch.tensor([[1.0, 1.0, 0.125], [-1.0, NAN, NAN]], dtype=F64),
        "old_values": torch.tensor([[0.0, 0.0, 0.0], [0.0, NAN, NAN]], dtype=F64),
        "returns": torch.tensor([[2.0, 0.0, 1.0], [-2.0, NAN, NAN]], dtype=F64),
        "response_mask": torch.tensor([[True, True, True], [True, False, False]]),
        "clip_range": 0.25,
    }


def _random(seed: int, lengths: tuple[int, ...] = (3, 1, 5, 2)) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    width = max(lengths) + 1
    mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    shape = (len(lengths), width)
    old = torch.randn(shape, generator=g, dtype=F64)
    values = old + 0.5 * torch.randn(shape, generator=g, dtype=F64)
    returns = old + torch.randn(shape, generator=g, dtype=F64)
    return {
        "values": torch.where(mask, values, NAN),
        "old_values": torch.where(mask, old, NAN),
        "returns": torch.where(mask, returns, NAN),
        "response_mask": mask,
        "clip_range": 0.2,
    }


def test_per_token_golden() -> None:
    got = value_loss_per_token(**_golden())
    # max((v-R)^2, (clip(v, -1/4, 1/4) - R)^2) / 2 per token; 0 at padding.
    assert got.tolist() == [[1.53125, 0.5, 0.3828125], [1.53125, 0.0, 0.0]]


@pytest.mark.parametrize(
    ("mode", "loss", "grad"),
    [
        ("token-mean", 0.986328125, [[0.0, 0.25, -0.21875], [0.0, 0.0, 0.0]]),
        ("seq-mean-token-mean", 1.16796875, [[0.0, 1 / 6, -0.875 / 6], [0.0, 0.0, 0.0]]),
        ("token-sum", 3.9453125, [[0.0, 1.0, -0.875], [0.0, 0.0, 0.0]]),
    ],
)
def test_aggregated_golden_and_gradient(mode: str, loss: float, grad: list[list[float]]) -> None:
    args = _golden()
    v = args["values"].clone().requires_grad_()
    out = clipped_value_loss(**{**args, "values": v}, mode=mode)
    assert out.item() == loss
    (g,) = torch.autograd.grad(out, v)
    assert torch.allclose(g, torch.tensor(grad, dtype=F64), rtol=0, atol=1e-16)


def test_default_mode_is_token_mean() -> None:
    args = _golden()
    assert clipped_value_loss(**args).item() == 0.986328125


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("seed", range(3))
def test_loss_is_the_aggregate_of_the_per_token_loss(mode: Aggregation, seed: int) -> None:
    args = _random(seed)
    got = clipped_value_loss(**args, mode=mode, budget=_budget(mode))
    per_token = value_loss_per_token(**args)
    want = aggregate(
        per_token, response_mask=args["response_mask"], mode=mode, budget=_budget(mode)
    )
    assert torch.equal(got, want)


@pytest.mark.parametrize("seed", range(5))
def test_inside_the_clip_range_it_is_half_the_squared_error(seed: int) -> None:
    args = _random(seed)
    mask = args["response_mask"]
    args["values"] = args["old_values"] + 0.1 * torch.tanh(args["values"])  # |v - v_old| < 0.2
    got = value_loss_per_token(**args)
    assert torch.equal(got[mask], 0.5 * (args["values"] - args["returns"])[mask] ** 2)


@pytest.mark.parametrize("seed", range(5))
def test_gradient_is_zero_exactly_where_the_clipped_term_dominates(seed: int) -> None:
    args = _random(seed, lengths=(6, 3, 8, 5, 7))
    mask, c = args["response_mask"], args["clip_range"]
    v = args["values"].clone().requires_grad_()
    loss = clipped_value_loss(**{**args, "values": v}, mode="token-sum")
    (grad,) = torch.autograd.grad(loss, v)
    old, ret = args["old_values"], args["returns"]
    clipped = torch.minimum(torch.maximum(args["values"], old - c), old + c)
    outside = (args["values"] - old).abs() > c
    dominated = outside & ((clipped - ret) ** 2 > (args["values"] - ret) ** 2) & mask
    expected = torch.where(mask & ~dominated, args["values"] - ret, 0.0)
    assert bool(dominated.any()) and bool((mask & ~dominated).any())
    assert torch.allclose(grad, expected, rtol=0, atol=1e-15)


def test_padding_never_leaks() -> None:
    args = _random(0)
    mask = args["response_mask"]
    tensors = {k: args[k].clone().requires_grad_() for k in ("values", "old_values", "returns")}
    loss = clipped_value_loss(**{**args, **tensors}, mode="seq-mean-token-mean")
    assert bool(loss.isfinite())
    for g in torch.autograd.grad(loss, list(tensors.values())):
        assert bool(g.isfinite().all()) and bool((g[~mask] == 0).all())
    garbage = {k: torch.where(mask, args[k], 1e6) for k in tensors}
    again = clipped_value_loss(**{**args, **garbage}, mode="seq-mean-token-mean")
    assert torch.equal(loss.detach(), again)


def test_gradcheck_float64() -> None:
    args = _random(4)
    mask = args["response_mask"]
    finite = [
        torch.where(mask, args[k], 0.0).requires_grad_()
        for k in ("values", "old_values", "returns")
    ]

    def f(v: torch.Tensor, old: torch.Tensor, ret: torch.Tensor) -> torch.Tensor:
        return clipped_value_loss(
            values=v, old_values=old, returns=ret, response_mask=mask, clip_range=0.2
        )

    assert torch.autograd.gradcheck(f, tuple(finite))


def test_weights_of_the_aggregation_reach_the_gradient() -> None:
    args = _random(1)
    mask = args["response_mask"]
    args["values"] = args["old_values"] + 0.1 * torch.tanh(args["values"])  # unclipped
    v = args["values"].clone().requires_grad_()
    (grad,) = torch.autograd.grad(clipped_value_loss(**{**args, "values": v}), v)
    w = token_weights(mask, "token-mean")
    assert torch.allclose(grad, torch.where(mask, w * (args["values"] - args["returns"]), 0.0))


# ----------------------------------------------------------------------- bad input


def _poke(name: str, pos: tuple[int, int], value: float) -> dict[str, Any]:
    args = _golden()
    args[name] = args[name].clone()
    args[name][pos] = value
    return args


BAD: dict[str, tuple[dict[str, Any], type[Exception], str]] = {
    "numpy": ({"values": np.zeros((2, 3))}, InputTypeError, "values must be a torch.Tensor"),
    "int": (
        {"old_values": torch.zeros(2, 3, dtype=torch.long)},
        InputTypeError,
        "old_values must have a floating-point dtype",
    ),
    "mixed": (
        {"returns": torch.zeros(2, 3)},
        InputTypeError,
        "old_values=torch.float64, returns=torch.float32",
    ),
    "shape": (
        {"returns": torch.zeros(2, 2, dtype=F64)},
        InputError,
        r"returns must have shape \[B, T\] like response_mask = \[2, 3\], got \[2, 2\]",
    ),
    "mask-int": (
        {"response_mask": torch.ones(2, 3, dtype=torch.int64)},
        InputTypeError,
        "response_mask must be a torch.bool",
    ),
    "mask-1d": (
        {"response_mask": torch.ones(3, dtype=torch.bool)},
        InputError,
        "response_mask must be 2-D",
    ),
    "empty-row": (
        {"response_mask": torch.tensor([[True, True, True], [False, False, False]])},
        InputError,
        r"response_mask has rows with no response token: rows \[1\]",
    ),
    "nan-values": (
        _poke("values", (0, 2), NAN),
        InputError,
        r"values holds NaN at response positions \(0, 2\)",
    ),
    "inf-returns": (
        _poke("returns", (1, 0), -math.inf),
        InputError,
        r"returns holds inf at response positions \(1, 0\)",
    ),
    "nan-old": (
        _poke("old_values", (0, 0), NAN),
        InputError,
        r"old_values holds NaN at response positions \(0, 0\)",
    ),
    "device": (
        {"values": torch.zeros(2, 3, dtype=F64, device="meta")},
        InputTypeError,
        "values on meta",
    ),
    "clip-zero": ({"clip_range": 0.0}, ConfigError, "clip_range must be > 0"),
    "clip-negative": ({"clip_range": -0.2}, ConfigError, "clip_range must be > 0"),
    "clip-nan": ({"clip_range": NAN}, ConfigError, "clip_range must be finite"),
    "clip-str": ({"clip_range": "0.2"}, ConfigError, "clip_range must be a real number"),
    "clip-bool": ({"clip_range": True}, ConfigError, "clip_range must be a real number"),
    "mode": ({"mode": "mean"}, ConfigError, "mode must be one of"),
    "budget-missing": ({"mode": "token-sum-norm"}, ConfigError, "budget"),
    "budget-unused": ({"budget": 8}, ConfigError, "budget applies to mode='token-sum-norm'"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_raises_naming_the_argument(case: str) -> None:
    changes, error, words = BAD[case]
    with pytest.raises(error, match=words):
        clipped_value_loss(**{**_golden(), **changes})


def test_unclipped_is_half_the_squared_error_everywhere() -> None:
    """``clip_range=None``: ``0.5 (V - R)^2`` also where the clipped form would clip (the
    golden batch's tokens (0, 0) and (1, 0)), and the gradient is ``w (V - R)``."""
    args = {**_golden(), "clip_range": None}
    values = args["values"].clone().requires_grad_(True)
    per_token = value_loss_per_token(**{**args, "values": values})
    mask = args["response_mask"]
    expected = torch.where(mask, 0.5 * (args["values"] - args["returns"]) ** 2, 0.0)
    assert torch.equal(per_token, expected)
    assert float(per_token[0, 0].detach()) == 0.5 and float(per_token[1, 0].detach()) == 0.5
    loss = clipped_value_loss(**{**args, "values": values})
    (grad,) = torch.autograd.grad(loss, values)
    n = int(mask.sum())
    assert torch.equal(grad, torch.where(mask, (args["values"] - args["returns"]) / n, 0.0))
