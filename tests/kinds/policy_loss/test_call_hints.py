"""Hints where the user's function is called (``target.guarded_call``, new-user trial): a
bare ``AssertionError`` says where it was raised (the innermost frame outside the kit and
torch: file, line, source), and torch's broadcast error between the batch size B and the
width T names the likely cause, a ``[B]`` advantages tensor used against ``[B, T]`` ones
without ``[:, None]``."""

from __future__ import annotations

import importlib.util
import inspect
import os
from pathlib import Path

import pytest
import torch

from pytest_polgrad.core.calls import guarded_call
from pytest_polgrad.core.engine import build_context, run_check
from pytest_polgrad.core.options import parse_marker
from pytest_polgrad.core.verdicts import Verdict

FRAMEWORK = """
def checked_loss(logprobs, advantages):
    assert advantages.dim() == 2
    return (logprobs * advantages).sum()
"""


def _here() -> str:
    rel = os.path.relpath(__file__)
    return rel if not rel.startswith("..") else __file__


def _raises_bare(x: torch.Tensor) -> torch.Tensor:
    if x.sum() > 0:
        raise AssertionError  # what a bare ``assert`` outside a test module raises
    return x


def test_a_bare_assertion_error_says_where_it_was_raised() -> None:
    with pytest.raises(Verdict) as info:
        guarded_call(_raises_bare, {"x": torch.ones(2)})
    line = inspect.getsourcelines(_raises_bare)[1] + 2
    assert str(info.value) == (
        "the function raised on a valid batch: AssertionError "
        f"(raised at {_here()}:{line}: raise AssertionError  # what a bare ``assert`` outside "
        "a test module raises)"
    )


def test_a_frameworks_own_assert_is_located_in_the_framework(tmp_path: Path) -> None:
    """The innermost frame outside the kit: the framework's file, not the wrapper."""
    path = tmp_path / "some_framework.py"
    path.write_text(FRAMEWORK)
    spec = importlib.util.spec_from_file_location("some_framework", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def wrapper(logprobs: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
        return module.checked_loss(logprobs, advantages)  # type: ignore[no-any-return]

    with pytest.raises(Verdict) as info:
        guarded_call(wrapper, {"logprobs": torch.ones(2, 3), "advantages": torch.ones(2)})
    assert f"(raised at {path}:3: assert advantages.dim() == 2)" in str(info.value)


def test_an_assert_with_a_message_keeps_it_and_gains_the_place(tmp_path: Path) -> None:
    path = tmp_path / "checked.py"
    path.write_text('def fn(x):\n    assert x.sum() < 0, "x must be negative"\n    return x\n')
    spec = importlib.util.spec_from_file_location("checked", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(Verdict) as info:
        guarded_call(module.fn, {"x": torch.ones(2)})
    assert str(info.value) == (
        "the function raised on a valid batch: AssertionError: x must be negative "
        f'(raised at {path}:2: assert x.sum() < 0, "x must be negative")'
    )


def forgets_the_new_axis(logprobs, old_logprobs, advantages, response_mask):  # type: ignore[no-untyped-def]
    ratio = torch.exp(logprobs - old_logprobs)
    per = -advantages * ratio  # advantages [B] against [B, T]
    return torch.where(response_mask, per, 0.0).sum() / response_mask.sum()


def test_a_b_against_t_broadcast_error_names_the_missing_new_axis() -> None:
    ctx = build_context(forgets_the_new_axis, parse_marker(("dapo",), {}))
    result = run_check(ctx, "value", max_examples=2, base_seed=0)
    assert not result.passed
    assert "The size of tensor a" in result.report  # torch's own words stay
    assert "likely cause: 'advantages' has shape [B] = [" in result.report, result.report
    assert "(write advantages[:, None])" in result.report


def test_other_shape_errors_get_no_advantages_hint() -> None:
    """No false hint: sizes that are not the batch's B and T."""

    def fn(logprobs: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
        return logprobs[:, :3] * torch.ones(5)

    with pytest.raises(Verdict) as info:
        guarded_call(fn, {"logprobs": torch.ones(2, 4), "advantages": torch.ones(2)})
    assert "The size of tensor a" in str(info.value)
    assert "likely cause" not in str(info.value)


def test_a_square_batch_gets_no_hint() -> None:
    """B == T: the message cannot tell which axis was meant."""

    def fn(logprobs: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
        return logprobs * torch.ones(5)

    with pytest.raises(Verdict) as info:
        guarded_call(fn, {"logprobs": torch.ones(3, 3), "advantages": torch.ones(3)})
    assert "likely cause" not in str(info.value)
