"""Calls shared between the checks of one function (``run_check(shared=...)``,
``targets.SHARED_CALLS``): the value and gradient checks compare one call per batch;
nothing is shared across ``assert_conforms`` calls, a flaky function is still caught, a
function that is not differentiable still gets a value verdict, and a store lives no
longer than its owner."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_polgrad import ConformanceError, assert_conforms
from pytest_polgrad.core.engine import NON_DETERMINISTIC, build_context, run_check
from pytest_polgrad.core.kinds import CallStore
from pytest_polgrad.core.options import parse_marker
from tests.helpers import inline_run
from tests.helpers import sample_losses as L

pytest_plugins = ["pytester"]

Tensor = torch.Tensor
OPTS = parse_marker(("dapo",), {"max_batch": 4, "max_length": 24})


def _counting(fn: Callable[..., Tensor]) -> tuple[Callable[..., Tensor], list[int]]:
    calls = [0]

    def counted(
        logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
    ) -> Tensor:
        calls[0] += 1
        return fn(logprobs, old_logprobs, advantages, response_mask)

    return counted, calls


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "not-shared"])
def test_value_and_gradient_compare_one_call_per_batch(shared: bool) -> None:
    fn, calls = _counting(L.dapo)
    store = CallStore() if shared else None
    examples = []
    for check in ("value", "gradient", "masked-positions", "deterministic"):
        result = run_check(
            build_context(fn, OPTS), check, max_examples=20, base_seed=1, shared=store
        )
        assert result.passed, result.report
        examples.append(result.examples)
    assert examples == [20, 20, 20, 20]
    # deterministic compares the shared call with one fresh call (two fresh ones without)
    assert calls[0] == (20 + 20 if shared else 60 + 40)


def test_deterministic_with_a_shared_first_call_still_catches_drift() -> None:
    """The shared call and the fresh one are separate calls: a result that drifts by one
    part in 1e15 per call differs between them."""
    store = CallStore()
    ctx = build_context(L.dapo_nondeterministic, OPTS)
    assert run_check(ctx, "value", max_examples=20, base_seed=1, shared=store).passed
    result = run_check(ctx, "deterministic", max_examples=20, base_seed=1, shared=store)
    assert not result.passed and "two calls on the same batch" in result.message


def test_deterministic_compares_with_the_inputs_unchanged_call() -> None:
    """inputs-unchanged makes a fresh call on every batch; with a store, deterministic
    compares the shared call with that one instead of calling a third time, and still
    catches a result that changes from one call to the next."""
    fn, calls = _counting(L.dapo)
    store = CallStore()
    for check in ("value", "inputs-unchanged", "deterministic"):
        result = run_check(
            build_context(fn, OPTS), check, max_examples=20, base_seed=1, shared=store
        )
        assert result.passed, result.report
    assert calls[0] == 20 + 20
    store = CallStore()
    ctx = build_context(L.dapo_nondeterministic, OPTS)
    for check in ("value", "inputs-unchanged"):
        assert run_check(ctx, check, max_examples=20, base_seed=1, shared=store).passed
    result = run_check(ctx, "deterministic", max_examples=20, base_seed=1, shared=store)
    assert not result.passed and "two calls on the same batch" in result.message


def test_nothing_is_shared_across_assert_conforms_calls() -> None:
    """A function whose behaviour changes between two calls (a global setting, as in
    many trainers) is judged on what it computes now, on the very same pooled batches."""
    setting = {"eps_high": 0.28}

    def configured(
        logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
    ) -> Tensor:
        ratio = torch.exp(torch.where(response_mask, logprobs - old_logprobs, 0.0))
        a = advantages if advantages.dim() == 2 else advantages[:, None]
        clipped = ratio.clamp(0.8, 1.0 + setting["eps_high"])
        per = torch.where(response_mask, torch.maximum(-a * ratio, -a * clipped), 0.0)
        return per.sum() / response_mask.sum()

    kw: dict[str, Any] = {"max_examples": 20, "seed": 3, "checks": ["value", "gradient"]}
    assert_conforms(configured, "dapo", **kw)
    setting["eps_high"] = 0.2
    with pytest.raises(ConformanceError, match="check 'value' failed"):
        assert_conforms(configured, "dapo", **kw)


def test_a_flaky_function_is_still_caught_with_shared_calls() -> None:
    """Every other call is off by half: the value check's failing batch is re-run afresh
    (not from the store), which passes, so its verdict is non-determinism; the gradient
    check meets the stored bad call and fails too."""
    state = [0]

    def alternating(
        logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
    ) -> Tensor:
        state[0] += 1
        loss = L.dapo(logprobs, old_logprobs, advantages, response_mask)
        return loss * 1.5 if state[0] % 2 == 0 else loss

    store = CallStore()
    value = run_check(
        build_context(alternating, OPTS), "value", max_examples=30, base_seed=0, shared=store
    )
    assert NON_DETERMINISTIC in value.message, value.message
    gradient = run_check(
        build_context(alternating, OPTS), "gradient", max_examples=30, base_seed=0, shared=store
    )
    assert not gradient.passed


def test_a_function_that_is_not_differentiable_still_gets_a_value_verdict() -> None:
    def detached(
        logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
    ) -> Tensor:
        return L.dapo(logprobs.detach(), old_logprobs, advantages, response_mask)

    store = CallStore()
    value = run_check(
        build_context(detached, OPTS), "value", max_examples=10, base_seed=0, shared=store
    )
    assert value.passed, value.report
    gradient = run_check(
        build_context(detached, OPTS), "gradient", max_examples=10, base_seed=0, shared=store
    )
    assert not gradient.passed and "not differentiable" in gradient.message


def test_a_store_lives_no_longer_than_its_owner() -> None:
    """The pool outlives a function's checks; its entries must not keep the store (and
    every gradient in it) alive."""
    store = CallStore()
    assert run_check(
        build_context(L.dapo, OPTS), "gradient", max_examples=10, base_seed=0, shared=store
    ).passed
    assert len(store) == 10
    ref = weakref.ref(store)
    del store
    gc.collect()
    assert ref() is None


def test_the_items_of_one_marked_function_share_its_calls(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(
        test_counted="""
import pytest
from tests.helpers import sample_losses as L

CALLS = []


@pytest.mark.polgrad_conforms("dapo", checks=["value", "gradient"], max_batch=4, max_length=24)
def counted(logprobs, old_logprobs, advantages, response_mask):
    CALLS.append(1)
    return L.dapo(logprobs, old_logprobs, advantages, response_mask)


def test_zz_calls():
    assert len(CALLS) == 12, len(CALLS)  # 12 batches, one call each for both items
"""
    )
    monkeypatch.syspath_prepend(str(Path(__file__).parents[2]))
    result = inline_run.run(
        pytester, "-p", "no:cacheprovider", "-p", "no:randomly", "--polgrad-max-examples=12"
    )
    result.assert_outcomes(passed=3)
