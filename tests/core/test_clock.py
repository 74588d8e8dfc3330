"""The function's own time apart from the kit's (issue 32, ``pytest_polgrad/core/clock.py``):
a check's result says how long it took and how much of that the function's own calls took.
No assertion here times the kit: the lower bounds come from ``time.sleep`` in the function,
the upper bound is the check's own total."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from pytest_polgrad.core import clock
from pytest_polgrad.core.engine import build_context, run_check
from pytest_polgrad.core.options import parse_marker
from tests.helpers import sample_losses as L

DELAY = 0.01


def test_a_nested_charge_counts_once() -> None:
    before = clock.spent()
    start = time.perf_counter()
    with clock.charged(), clock.charged():
        time.sleep(DELAY)
    elapsed = time.perf_counter() - start
    inside = clock.spent() - before
    assert DELAY <= inside <= elapsed  # counted twice, it would be about 2 x elapsed
    with clock.charged():
        pass
    time.sleep(DELAY)  # outside any charge: not the function's
    assert clock.spent() - before - inside < DELAY


def _sleepy() -> tuple[Callable[..., torch.Tensor], list[int]]:
    calls = [0]

    def sleepy_dapo(
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
    ) -> torch.Tensor:
        calls[0] += 1
        time.sleep(DELAY)
        return L.dapo(logprobs, old_logprobs, advantages, response_mask)

    return sleepy_dapo, calls


def test_a_slow_function_shows_as_function_time() -> None:
    """Every call's sleep is charged to the function (without the charge in
    ``guarded_call`` its share is 0), and the function's share never exceeds the whole."""
    fn, calls = _sleepy()
    opts = parse_marker(("dapo",), {})
    result = run_check(build_context(fn, opts), "value", max_examples=8, base_seed=1)
    assert result.passed and calls[0] >= result.examples > 0
    assert result.function_seconds >= calls[0] * DELAY, (result.function_seconds, calls[0])
    assert result.function_seconds <= result.seconds


def test_a_failing_check_times_its_search_and_report() -> None:
    """A failure's search, shrinking and report are inside ``seconds``; the function's
    calls during the search are its own time."""
    opts = parse_marker(("ppo",), {})
    ctx = build_context(L.dapo, opts)
    result = run_check(ctx, "value", max_examples=8, base_seed=1, diagnose=False)
    assert not result.passed
    assert 0.0 < result.function_seconds <= result.seconds


def test_timing_does_not_change_a_result() -> None:
    """Two runs of one check differ in their times only: the timing fields take no part
    in a result's equality."""
    opts = parse_marker(("dapo",), {})
    a, b = (
        run_check(build_context(L.dapo, opts), "gradient", max_examples=6, base_seed=2)
        for _ in range(2)
    )
    assert a == b
    assert a.as_dict().keys() >= {"seconds", "function_seconds"}
