"""The diagnosis does less reference work without changing what it says (issue 8): a
candidate's gradient stops at the first corpus batch that rejects it, every decision is
then taken on exactly scored candidates, and reference results on the corpus are shared
by every diagnosis in the process. Counts of reference evaluations, never wall times."""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from polgrad_reference import PolgradError
from pytest_polgrad.core.corpus import canonical_corpus
from pytest_polgrad.core.engine import build_context
from pytest_polgrad.core.options import parse_marker
from pytest_polgrad.kinds.policy_loss.diagnose.diagnosis import (
    _REFERENCES,
    Match,
    _ReferenceCache,
    diagnose,
    explain,
)
from pytest_polgrad.kinds.policy_loss.oracle import Oracle

Loss = Callable[..., torch.Tensor]


def _grpo(divide_by_length_plus: float) -> Loss:
    """A hand-written GRPO policy term dividing each row by its length + ``k``."""

    def loss(logprobs, old_logprobs, advantages, response_mask):  # type: ignore[no-untyped-def]
        ratio = torch.exp(logprobs - old_logprobs)
        a = advantages[:, None]
        per = torch.maximum(-a * ratio, -a * ratio.clamp(0.8, 1.2))
        per = torch.where(response_mask, per, 0.0)
        lengths = response_mask.sum(-1).to(per.dtype)
        return (per.sum(-1) / (lengths + divide_by_length_plus)).mean()

    return loss


@pytest.fixture
def cold() -> Iterator[None]:
    """A diagnosis from an empty reference cache (counts do not depend on test order)."""
    _REFERENCES.clear()
    yield
    _REFERENCES.clear()


def _ctx(fn: Loss, dtype: str = "bfloat16"):  # type: ignore[no-untyped-def]
    return build_context(fn, parse_marker(("grpo",), {"dtype": dtype}))


def _explain(fn: Loss, dtype: str = "bfloat16") -> str:
    ctx = _ctx(fn, dtype)
    found = explain(ctx.fut, ctx.config, ctx.tolerance, reference="grpo", reference_id="grpo")
    return found.text


def _full_gradient_error(ctx, m) -> float:  # type: ignore[no-untyped-def]
    """A candidate's gradient error scored on every corpus batch, straight from the oracle."""
    corpus = canonical_corpus(dtype=ctx.tolerance.input_dtype)
    worst = 0.0
    for batch in corpus.values():
        cfg = m.config
        if m.padded_width_budget:
            cfg = cfg.replace(budget=batch["response_mask"].shape[1])
        ev = ctx.fut.call(batch)
        ref = Oracle(cfg)(batch, kink_eps=ctx.tolerance.loosest)
        where = batch["response_mask"] & ~ref.ambiguous
        err = ctx.tolerance.tensor(ev.grad, ref.grad, ref.grad_scale, where)[0].error
        worst = max(worst, err)
    return worst


@dataclasses.dataclass(frozen=True)
class _Case:
    ctx: Any
    text: str
    lazy_calls: int
    """Reference gradient evaluations of the diagnosis (explain), from an empty cache."""
    again: str
    again_computed: int
    """A second diagnosis of another function object with the same semantics: its text and
    the reference evaluations it made (none: it reuses the first one's)."""
    ranking: list[Match]
    all_calls: int
    """The same after settling the whole ranking (``diagnose(top=0)``)."""
    looked_up: set[tuple[Any, ...]]
    """The reference results the cold bfloat16 diagnosis asked the cache for."""
    float64_cold: str
    float64_after: str
    float64_looked_up: set[tuple[Any, ...]]
    """A float64 diagnosis from an empty cache, the same once the cache holds the
    bfloat16 diagnosis's references, and what that second one asked the cache for."""
    top3_after: list[Match]
    """The bfloat16 head of the ranking again, with the float64 references in the cache."""


@contextlib.contextmanager
def _lookups() -> Iterator[set[tuple[Any, ...]]]:
    """The keys every diagnosis inside the block asks the shared reference cache for."""
    keys: set[tuple[Any, ...]] = set()
    get = _REFERENCES.get

    def recording(key: tuple[Any, ...], compute: Callable[[], Any]) -> Any:
        keys.add(key)
        return get(key, compute)

    _REFERENCES.get = recording  # type: ignore[method-assign]
    try:
        yield keys
    finally:
        del _REFERENCES.get


@pytest.fixture(scope="module")
def bf16_case() -> Iterator[_Case]:
    """GRPO dividing each row by its length + 1, diagnosed from bfloat16 inputs, cold; then
    diagnosed again (another function object), its whole ranking settled, and a float64
    diagnosis beside it. One cold bfloat16 diagnosis serves every test of this file: it is
    the expensive one (about 5 000 reference evaluations)."""
    _REFERENCES.clear()
    float64_cold = _explain(_grpo(1.0), "float64")
    _REFERENCES.clear()
    ctx = _ctx(_grpo(1.0))
    with _lookups() as looked_up:
        found = explain(ctx.fut, ctx.config, ctx.tolerance, reference="grpo", reference_id="grpo")
    lazy = _REFERENCES.computed["call"]
    computed = sum(_REFERENCES.computed.values())
    again = _explain(_grpo(1.0), "bfloat16")
    again_computed = sum(_REFERENCES.computed.values()) - computed
    ranking = diagnose(ctx.fut, ctx.config, ctx.tolerance, top=0)
    all_calls = _REFERENCES.computed["call"]
    with _lookups() as float64_looked_up:
        float64_after = _explain(_grpo(1.0), "float64")
    top3_after = diagnose(ctx.fut, ctx.config, ctx.tolerance, top=3)
    yield _Case(
        ctx, found.text, lazy, again, again_computed, ranking, all_calls, looked_up,
        float64_cold, float64_after, float64_looked_up, top3_after,
    )  # fmt: skip
    _REFERENCES.clear()


def test_a_bfloat16_diagnosis_scores_fewer_gradients_than_value_matches(
    bf16_case: _Case,
) -> None:
    # at bfloat16 some 400 candidates match the corpus values and about half of them the
    # gradient too: a candidate's gradient stops at the first batch that rejects it
    value_matches = sum(m.value_matches for m in bf16_case.ranking)
    full_matches = sum(m.matches for m in bf16_case.ranking)
    assert value_matches > full_matches + 100, (value_matches, full_matches)
    batches = len(canonical_corpus())
    # every full match is scored on every batch, a rejected one on fewer than all
    assert full_matches * batches <= bf16_case.lazy_calls < value_matches * batches * 0.75
    assert bf16_case.all_calls > bf16_case.lazy_calls  # settling completes the rejected


def test_the_count_of_other_matches_is_exact(bf16_case: _Case) -> None:
    # the sentence names how many other candidates match: candidates left unfinished by
    # the early stop are all non-matches, so the count is that of the full ranking
    said = re.search(r"at this precision (\d+) other candidate\(s\) do too", bf16_case.text)
    assert said is not None, bf16_case.text
    assert int(said.group(1)) == sum(m.matches for m in bf16_case.ranking) - 1


def test_every_reported_gradient_error_is_scored_on_every_batch(bf16_case: _Case) -> None:
    # a candidate stopped early holds a lower bound of its gradient error; the returned
    # ranking never does (the head asked for, or all of it for top=0)
    ctx, ranking = bf16_case.ctx, bf16_case.ranking
    scored = [m for m in ranking if m.value_matches and not m.matches]
    assert len(scored) > 100
    for m in scored[::20] + ranking[:3]:
        assert m.grad_error == _full_gradient_error(ctx, m), m.describe()
        assert m.error == max(m.value_error, m.grad_error)
    assert [m.error for m in ranking] == sorted(m.error for m in ranking)
    assert diagnose(ctx.fut, ctx.config, ctx.tolerance, top=5) == ranking[:5]


@pytest.mark.parametrize("dtype", ["bfloat16", "float64"])
def test_a_second_diagnosis_reuses_the_references_and_says_the_same(
    dtype: str, request: pytest.FixtureRequest
) -> None:
    if dtype == "bfloat16":  # the module's one cold bfloat16 diagnosis, then a second one
        case: _Case = request.getfixturevalue("bf16_case")
        assert case.again == case.text
        assert case.again_computed == 0  # nothing evaluated again
        return
    request.getfixturevalue("cold")
    first = _explain(_grpo(1.0), dtype)
    computed = sum(_REFERENCES.computed.values())
    again = _explain(_grpo(1.0), dtype)  # another function object, the same semantics
    assert again == first
    assert sum(_REFERENCES.computed.values()) == computed  # nothing evaluated again


def test_the_candidate_space_is_built_once_for_the_same_target_and_inputs(cold: None) -> None:
    """The first pass's configs depend on the function only through the optional tensors
    it takes: a second diagnosis against the same target reuses them (and says the same)."""
    from pytest_polgrad.kinds.policy_loss.diagnose import diagnosis as d

    d._first_pass_of.cache_clear()
    first = _explain(_grpo(1.0), "float64")
    assert d._first_pass_of.cache_info().misses == 1
    assert _explain(_grpo(1.0), "float64") == first
    info = d._first_pass_of.cache_info()
    assert (info.misses, info.hits) == (1, 1)
    ctx = build_context(_grpo(1.0), parse_marker(("grpo",), {}))
    built = list(d._generate_first_pass(ctx.config, ctx.fut))
    assert list(d._first_pass(ctx.config, ctx.fut)) == built  # the same configs, in order


def test_references_are_not_shared_across_input_dtypes(bf16_case: _Case) -> None:
    # the corpus in bfloat16 is another set of tensors: a float64 diagnosis made while the
    # cache holds the bfloat16 references asks for none of them, says what it says from an
    # empty cache, and leaves the bfloat16 ranking as it was
    assert bf16_case.looked_up and bf16_case.float64_looked_up
    assert not bf16_case.looked_up & bf16_case.float64_looked_up
    assert bf16_case.float64_after == bf16_case.float64_cold
    assert bf16_case.top3_after == bf16_case.ranking[:3]


def test_the_cache_is_bounded_and_remembers_errors() -> None:
    cache = _ReferenceCache(2)
    calls: list[str] = []

    def compute(key: str) -> Callable[[], str]:
        def run() -> str:
            calls.append(key)
            return key.upper()

        return run

    assert cache.get(("value", "a"), compute("a")) == "A"
    assert cache.get(("value", "b"), compute("b")) == "B"
    assert cache.get(("value", "a"), compute("a")) == "A"  # served: a is now the newest
    assert cache.get(("value", "c"), compute("c")) == "C"  # b, the oldest, is dropped
    assert cache.get(("value", "a"), compute("a")) == "A"
    assert cache.get(("value", "b"), compute("b")) == "B"
    assert calls == ["a", "b", "c", "b"]

    def fails() -> str:
        calls.append("bad")
        raise PolgradError("no such config")

    for _ in range(2):
        with pytest.raises(PolgradError, match="no such config"):
            cache.get(("value", "bad"), fails)
    assert calls.count("bad") == 1
