"""Bad arguments fail eagerly, with Hypothesis' InvalidArgument and a message that names
the argument and the rule."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis.errors import InvalidArgument

from polgrad_reference.config import ClipConfig
from pytest_polgrad.strategies import (
    advantages,
    algorithm_names,
    batches,
    groups,
    lengths,
    log_ratio_gaps,
    logprobs,
    loss_configs,
    response_masks,
)

BAD: list[tuple[Callable[..., Any], dict[str, Any], str]] = [
    (batches, {"min_batch": 5, "max_batch": 2}, r"min_batch=5 must not exceed max_batch=2"),
    (batches, {"min_length": 9, "max_length": 3}, r"min_length=9 must not exceed max_length=3"),
    (batches, {"min_batch": -1}, r"min_batch must be a positive size, got min_batch=-1"),
    (batches, {"max_length": 0}, r"max_length must be a positive size"),
    (batches, {"min_length": 0}, r"min_length must be a positive size"),
    (batches, {"max_batch": 2.5}, r"max_batch must be an int"),
    (batches, {"width": 0}, r"width must be a positive size"),
    (batches, {"min_length": 8, "width": 4}, r"min_length=8 must not exceed width=4"),
    (batches, {"dtype": torch.int64}, r"dtype must be one of torch.float64, .*got torch.int64"),
    (batches, {"dtype": "float32"}, r"dtype must be one of"),
    (batches, {"dtype": torch.complex64}, r"dtype must be one of"),
    (
        batches,
        {"group_size": 4, "min_batch": 6, "max_batch": 6},
        r"group_size=4 does not divide any batch size in \[min_batch, max_batch\] = \[6, 6\]",
    ),
    (batches, {"group_size": 3, "max_batch": 2}, r"group_size=3 does not divide any batch"),
    (batches, {"group_size": 0}, r"group_size must be a positive size"),
    (batches, {"group_size": 2, "with_rewards": False}, r"group_size needs rewards"),
    (batches, {"layout": "middle"}, r"layout must be one of 'right', 'left', 'packed'"),
    (batches, {"domain": "hostile"}, r"domain must be one of 'semantic', 'extreme'"),
    (batches, {"advantage_shape": "[B]"}, r"advantage_shape must be one of 'sequence', 'token'"),
    (batches, {"padding": "zeros"}, r"padding must be one of 'garbage', 'nan'"),
    (batches, {"holes": 1}, r"holes must be True or False"),
    (batches, {"with_ref_logprobs": "yes"}, r"with_ref_logprobs must be True, False or None"),
    (batches, {"max_log_ratio": 0.0}, r"max_log_ratio must lie in \(0.0, 10.0\]"),
    (batches, {"max_log_ratio": 12.0}, r"max_log_ratio must lie in \(0.0, 10.0\]"),
    (batches, {"max_log_ratio": float("nan")}, r"max_log_ratio must be a finite real number"),
    (batches, {"clip": 0.2}, r"clip must be a polgrad_reference ClipConfig"),
    (batches, {"clip": []}, r"clip must be a polgrad_reference ClipConfig"),
    (lengths, {"min_batch": 3, "max_batch": 1}, r"min_batch=3 must not exceed max_batch=1"),
    (lengths, {"min_length": -2}, r"min_length must be a positive size"),
    (response_masks, {"layout": "packed"}, r"layout must be one of 'right', 'left'"),
    (response_masks, {"max_length": 2, "min_length": 3}, r"must not exceed max_length=2"),
    (logprobs, {"shape": (2, -1)}, r"shape\[1\] must be an int >= 0"),
    (logprobs, {"shape": [2, 3]}, r"shape must be an int or a tuple of ints"),
    (logprobs, {"shape": 3, "dtype": torch.int32}, r"dtype must be one of"),
    (log_ratio_gaps, {"max_log_ratio": -1.0}, r"max_log_ratio must lie in"),
    (log_ratio_gaps, {"clip": "dapo"}, r"clip must be a polgrad_reference ClipConfig"),
    (advantages, {"batch_size": 0}, r"batch_size must be a positive size"),
    (advantages, {"batch_size": 2, "shape": "scalar"}, r"shape must be one of"),
    (
        groups,
        {"group_size": 4, "min_batch": 5, "max_batch": 7},
        r"group_size=4 does not divide any batch size",
    ),
    (groups, {"dtype": torch.bool}, r"dtype must be one of"),
    (loss_configs, {"algorithms": ["grpo", "trpo"]}, r"unknown algorithm\(s\) \['trpo'\]"),
    (loss_configs, {"algorithms": "grpo"}, r"algorithms must be a non-empty list or tuple"),
    (loss_configs, {"vary": "yes"}, r"vary must be True or False"),
    (algorithm_names, {"algorithms": []}, r"algorithms must be a non-empty list or tuple"),
]


@pytest.mark.parametrize(
    ("factory", "kwargs", "message"),
    BAD,
    ids=[f"{f.__name__}-{'-'.join(map(str, k))}" for f, k, _ in BAD],
)
def test_bad_arguments_raise_invalid_argument_eagerly(
    factory: Callable[..., Any], kwargs: dict[str, Any], message: str
) -> None:
    args: dict[str, Any] = dict(kwargs)
    if factory is logprobs:
        shape = args.pop("shape")
        with pytest.raises(InvalidArgument, match=message):
            factory(shape, **args)  # raised at call time: nothing is drawn
        return
    with pytest.raises(InvalidArgument, match=message):
        factory(**args)


def test_extreme_domain_allows_larger_log_ratios() -> None:
    batches(domain="extreme", max_log_ratio=50.0)
    with pytest.raises(InvalidArgument, match=r"max_log_ratio must lie in \(0.0, 80.0\]"):
        batches(domain="extreme", max_log_ratio=90.0)


def test_valid_edge_arguments_are_accepted() -> None:
    batches(min_batch=6, max_batch=6, group_size=3)
    batches(min_batch=5, max_batch=7, group_size=6)
    batches(min_length=4, max_length=4, width=4)
    batches(clip=[ClipConfig(0.2, 0.28), ClipConfig(eps_low=None, eps_high=2.0)])
    batches(clip=ClipConfig(eps_low=None, eps_high=None))
    logprobs(0)
    logprobs((2, 0, 3))
