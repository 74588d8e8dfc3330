"""The engine's pool, corpus-first order, seeds and verdicts for misbehaving functions
(issue 8 section 1, issue 14 'luck and names decide', issue 15 'FlakyFailure')."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch

from pytest_polgrad import assert_conforms
from pytest_polgrad.api import ConformanceError
from pytest_polgrad.core import engine
from pytest_polgrad.core.corpus import canonical_corpus
from pytest_polgrad.core.engine import NON_DETERMINISTIC, build_context, checks_for, run_check
from pytest_polgrad.core.options import parse_marker
from tests.helpers import sample_losses as L

Tensor = torch.Tensor


def _ppo_terms(lp: Tensor, old: Tensor, adv: Tensor, mask: Tensor, dual: float | None) -> Tensor:
    ratio = torch.exp(torch.where(mask, lp - old, 0.0))
    a = adv[:, None] if adv.dim() == 1 else adv
    per = torch.maximum(-a * ratio, -a * ratio.clamp(0.8, 1.28))
    if dual is not None:  # dual clip (arXiv:1912.09729), on for A < 0 only
        per = torch.where(a < 0, torch.minimum(per, -a * dual), per)
    return torch.where(mask, per, 0.0)


def dapo_with_dual_clip(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """DAPO's clip-higher token-mean loss with verl's always-on dual clip c = 3."""
    per = _ppo_terms(logprobs, old_logprobs, advantages, response_mask, 3.0)
    return per.sum() / response_mask.sum()


def _renamed(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    def wrapper(**kw: Tensor) -> Tensor:
        out: Tensor = fn(**kw)
        return out

    wrapper.__name__ = wrapper.__qualname__ = name
    return wrapper


@pytest.mark.parametrize("name", ["dapo_with_dual_clip", "actor_loss"])
def test_corpus_finds_the_dual_clip_at_every_seed_and_name(name: str) -> None:
    """Issue 14: the corpus runs first, so 5 examples and any seed are enough."""
    opts = parse_marker(("dapo",), {})
    fn = _renamed(dapo_with_dual_clip, name)
    for seed in range(20):
        failed = any(  # the first check that fails is enough: the rest are not run
            not run_check(
                build_context(fn, opts), check, max_examples=5, base_seed=seed, diagnose=False
            ).passed
            for check in ("value", "gradient")
        )
        assert failed, f"seed {seed}: the dual clip passed as 'dapo'"


def test_the_dual_clip_loss_without_dual_clip_conforms() -> None:
    def dapo_plain(**kw: Tensor) -> Tensor:
        per = _ppo_terms(
            kw["logprobs"], kw["old_logprobs"], kw["advantages"], kw["response_mask"], None
        )
        return per.sum() / kw["response_mask"].sum()

    assert_conforms(dapo_plain, "dapo", max_examples=12, checks=("value", "gradient"))


def test_renaming_a_function_changes_no_result() -> None:
    opts = parse_marker(("dapo",), {})
    cases = [(L.dapo, c) for c in checks_for(opts)]
    cases += [(L.dapo_padded_width, c) for c in ("value", "padding-columns")]
    for fn, check in cases:
        a, b = (
            run_check(
                build_context(fn, opts, name=name),
                check,
                max_examples=12,
                base_seed=3,
                diagnose=False,
            )
            for name in ("first_name", "other.name")
        )
        assert (a.passed, a.examples, a.worst, a.message) == (
            b.passed,
            b.examples,
            b.worst,
            b.message,
        ), check
        assert (a.function, b.function) == ("first_name", "other.name")
    assert not a.passed  # the padded-width loss fails padding-columns under both names


def test_the_pool_is_drawn_once_for_every_check_and_function(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine.clear_pools()
    draws: list[int] = []
    real = engine._draw_pool

    def counting(strategy: Any, seed: int, n: int) -> tuple[Any, ...]:
        draws.append(seed)
        return real(strategy, seed, n)

    monkeypatch.setattr(engine, "_draw_pool", counting)
    opts = parse_marker(("dapo",), {"max_batch": 4, "max_length": 16})  # small: cheap
    semantic = [c for c in checks_for(opts) if c != "extreme-finite"]
    assert "on-policy" in semantic  # a prepared check shares the pool too
    for fn in (L.dapo, _renamed(L.dapo, "another_dapo")):
        for check in semantic:
            assert run_check(build_context(fn, opts), check, max_examples=12, base_seed=9).passed
    assert len(draws) == 1
    run_check(build_context(L.dapo, opts), "extreme-finite", max_examples=12, base_seed=9)
    assert len(draws) == 2  # another domain, another pool


@pytest.fixture
def oracle_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """``[n]``: how many times the reference oracle itself has run (cache hits excluded:
    the shared oracle calls it only on a miss); reset it by assigning ``calls[0] = 0``."""
    from pytest_polgrad.kinds.policy_loss.oracle import Oracle

    calls = [0]
    real = Oracle.__call__

    def counting(self: Oracle, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Oracle, "__call__", counting)
    return calls


def test_a_prepared_check_computes_each_reference_once_for_every_function(
    oracle_calls: list[int],
) -> None:
    """'on-policy' prepares each pooled batch (old = logprobs) once while it lives, so a
    second function's check finds every reference result in the oracle's cache."""
    engine.clear_pools()
    calls = oracle_calls
    opts = parse_marker(("dapo",), {"max_batch": 4, "max_length": 16})
    first = run_check(build_context(L.dapo, opts), "on-policy", max_examples=12, base_seed=9)
    assert first.passed and calls[0] > 0
    calls[0] = 0
    again = run_check(
        build_context(_renamed(L.dapo, "another_dapo"), opts),
        "on-policy",
        max_examples=12,
        base_seed=9,
    )
    assert again.passed and again.examples == first.examples
    assert calls[0] == 0


def test_golden_items_compute_each_reference_once_for_every_function(
    monkeypatch: pytest.MonkeyPatch, oracle_calls: list[int]
) -> None:
    """Every golden item evaluates on the same corpus tensors (built once per process), so
    a second function's golden data finds every reference result in the oracle's cache;
    the stored values are the ones a fresh corpus gives."""
    from pytest_polgrad.kinds.policy_loss import corpus, golden

    monkeypatch.setattr(corpus, "_CORPORA", {})  # no corpus yet in this process
    calls = oracle_calls
    opts = parse_marker(("dapo",), {})
    first = golden.golden_data(L.dapo, opts)
    assert calls[0] == len(canonical_corpus())
    calls[0] = 0

    def another_dapo(
        logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
    ) -> Tensor:
        out: Tensor = L.dapo(logprobs, old_logprobs, advantages, response_mask)
        return out

    again = golden.golden_data(another_dapo, opts)
    assert calls[0] == 0
    fresh = canonical_corpus()  # new tensors: the values a golden item stored before
    fut = build_context(L.dapo, opts).fut
    assert isinstance(first.data, dict) and isinstance(again.data, dict)
    for name, values in first.data.items():
        ev = fut.call(fresh[name], grad=True)
        for got in (values, again.data[name]):
            assert torch.equal(got["loss"], ev.loss) and torch.equal(got["grad"], ev.grad)


def test_examples_count_what_ran() -> None:
    corpus = len(canonical_corpus())  # the corpus batches always run
    opts = parse_marker(("dapo",), {})
    for budget in (1, 5, 20, 60):
        result = run_check(build_context(L.dapo, opts), "value", max_examples=budget, base_seed=0)
        assert result.passed
        assert result.examples == max(budget, corpus)


def sliced_at_12(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """Wrong only past 12 tokens: the corpus (T <= 10) cannot show it, the pool can."""
    sl = slice(0, 12)
    return L.dapo(
        logprobs=logprobs[:, sl],
        old_logprobs=old_logprobs[:, sl],
        advantages=advantages,
        response_mask=response_mask[:, sl],
    )


def test_a_pool_failure_is_reproduced_and_shrunk_by_hypothesis() -> None:
    opts = parse_marker(("dapo",), {})
    result = run_check(build_context(sliced_at_12, opts), "value", max_examples=100, base_seed=0)
    assert not result.passed
    assert "(the smallest Hypothesis found)" in result.report
    shrunk = re.search(r"B=(\d+), T=(\d+), response lengths", result.report)
    assert shrunk is not None and shrunk.group(1) == "1", result.report
    assert 13 <= int(shrunk.group(2)) <= 17  # the bug needs 13 tokens; the size classes
    assert not any("not shrunk" in n for n in result.notes)


class Alternating:
    """A stateful loss: every other call returns a different value."""

    def __init__(self) -> None:
        self.calls = itertools.count()
        self.__name__ = self.__qualname__ = "alternating"

    def __call__(
        self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
    ) -> Tensor:
        loss = L.dapo(logprobs, old_logprobs, advantages, response_mask)
        return loss * 1.5 if next(self.calls) % 2 else loss


def drifting(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """Non-deterministic: off by half on a random half of the calls."""
    loss = L.dapo(logprobs, old_logprobs, advantages, response_mask)
    return loss * 1.5 if float(torch.rand(())) < 0.5 else loss


@pytest.mark.parametrize("make", [Alternating, lambda: drifting], ids=["stateful", "random"])
@pytest.mark.parametrize("check", ["value", "gradient", "deterministic"])
def test_a_misbehaving_loss_gets_a_verdict_not_a_hypothesis_error(make: Any, check: str) -> None:
    torch.manual_seed(0)
    opts = parse_marker(("dapo",), {})
    result = run_check(build_context(make(), opts), check, max_examples=30, base_seed=0)
    assert not result.passed
    text = result.message + result.report
    assert NON_DETERMINISTIC in text or "two calls on the same batch" in text, result.report
    assert "Flaky" not in result.report and "reproduce (standalone" in result.report


def test_assert_conforms_reports_a_stateful_loss_and_runs_every_check() -> None:
    with pytest.raises(ConformanceError) as info:
        assert_conforms(Alternating(), "dapo", max_examples=20)
    report = info.value.report
    assert [r.check for r in report.results] == checks_for(parse_marker(("dapo",), {}))
    assert any(NON_DETERMINISTIC in r.message for r in report.results)


def test_a_corpus_failure_is_reduced_by_the_kits_shrinker() -> None:
    opts = parse_marker(("dapo",), {})
    result = run_check(
        build_context(dapo_with_dual_clip, opts), "value", max_examples=5, base_seed=0
    )
    assert not result.passed
    line = next(ln for ln in result.report.splitlines() if ln.strip().startswith("batch"))
    # the dual clip shows on the clip-boundaries row with A = -2 and ratios 2.9, 3.1, ...:
    # one token past the dual clip is left (truncation keeps two, deleting the first one)
    assert "B=1, T=1" in line and "canonical corpus batch 'clip-boundaries'" in line, line
    assert "reduced by the kit's shrinker" in line
    assert result.examples > 1  # the corpus batch, then the shrinker's calls
