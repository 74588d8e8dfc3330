"""Multi-term steps (policy + KL + entropy) judged term by term, simulated: a correct step
passes in float64, float32 and from bfloat16 inputs; a mis-scaled term is named with its
factor and cause."""

from __future__ import annotations

import pytest

from pytest_polgrad.core.engine import CheckResult, build_context, run_check
from pytest_polgrad.core.options import ConformanceOptions
from pytest_polgrad.kinds.training_step import terms
from pytest_polgrad.strategies import Split
from tests.kinds.training_step import distributed_steps as S


def _run(fn, check: str = "micro-batches", examples: int = 5, **options) -> CheckResult:  # type: ignore[no-untyped-def]
    opts = ConformanceOptions("dapo", kind="training_step", **options)
    return run_check(build_context(fn, opts), check, max_examples=examples, base_seed=0)


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
@pytest.mark.parametrize("check", ["full-batch", "micro-batches", "data-parallel"])
def test_a_correct_multi_term_step_passes(check: str, dtype: str) -> None:
    result = _run(S.multi_term_global, check, dtype=dtype)
    assert result.passed, result.report


def test_a_k_fold_term_is_named_with_its_factor() -> None:
    result = _run(S.bug_kl_term_k_fold)
    assert not result.passed
    assert "the kl term is mis-scaled" in result.message, result.message
    assert "normalised per micro-batch" in result.message
    assert "the policy term" not in result.message


def test_a_term_weighted_per_micro_batch_is_named() -> None:
    result = _run(S.bug_entropy_mean_of_means, "data-parallel")
    assert not result.passed
    assert "the entropy term is mis-scaled" in result.message, result.message
    assert "not a uniform multiple" in result.message


def test_the_policy_term_is_judged_against_the_reference() -> None:
    """A KL term does not hide a policy term that computes another algorithm's loss:
    dapo's clip range judged as grpo's (0.2/0.2) fails full-batch on the policy term."""
    opts = ConformanceOptions("grpo", kind="training_step", checks=("full-batch",))
    assert not run_check(build_context(S.multi_term_global, opts), "full-batch",
                         max_examples=10, base_seed=0).passed  # fmt: skip


def test_a_plain_loss_is_not_a_multi_term_step() -> None:
    assert _run(S.token_mean_global).passed
    assert terms.term_names.__doc__


def spelled_k_fold(  # type: ignore[no-untyped-def]
    log_probs, old_log_probs, advantages, action_mask, global_tokens, world_size,
    gradient_accumulation_steps,
):  # fmt: skip
    """The K-fold KL step under OpenRLHF's spellings: still judged term by term."""
    return S.bug_kl_term_k_fold(log_probs, old_log_probs, advantages, action_mask,
                                global_tokens, world_size, gradient_accumulation_steps)  # fmt: skip


def test_a_step_under_the_frameworks_spellings_is_judged_term_by_term() -> None:
    result = _run(spelled_k_fold)
    assert not result.passed
    assert "the kl term is mis-scaled" in result.message, result.message


@pytest.mark.parametrize(
    ("c", "split", "words"),
    [
        (4.0, Split((((0,), (1,), (2,), (3,)),)), "normalised per micro-batch; 4 micro-batches"),
        (0.5, Split((((0,), (1,)),)), "divided by the 2 accumulation steps twice"),
        (0.5, Split((((0,),), ((1,),))), "the world-size factor is missing (2 ranks"),
    ],
)
def test_factor_meaning(c: float, split: Split, words: str) -> None:
    assert words in terms.factor_meaning(c, split)
