"""kind="training_step" with distributed="ddp"/"fsdp": the split checks on a real process group.

The multi-rank splits of the checks run on gloo ranks (:mod:`.distributed`), the reducer of
DDP / FSDP2 doing the averaging; the known scaling bugs are flagged there and named. One
module-scoped pool per world size (module on one xdist worker: ``ONE_WORKER``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from pytest_polgrad.core.engine import CheckResult, build_context, run_check
from pytest_polgrad.core.kinds import get_kind
from pytest_polgrad.core.options import ConformanceOptions, MarkerError
from pytest_polgrad.core.verdicts import CheckFailure, Verdict
from pytest_polgrad.kinds.training_step import distributed as D
from pytest_polgrad.kinds.training_step.execute import fold
from pytest_polgrad.kinds.training_step.kind import StepInputs
from pytest_polgrad.strategies import Split
from tests.kinds.training_step import distributed_steps as S


@pytest.fixture(scope="module", autouse=True)
def _stop_pools() -> Iterator[None]:
    yield
    D.shutdown(zygote=False)  # the zygote stays for the next module's pools
    assert D.pools() == []


EMPTY = "empty-micro-batches"


def _on_step(ctx, inputs, name: str = "data-parallel") -> float:  # type: ignore[no-untyped-def]
    """The kind's check ``name`` on one step (the engine's corpus holds 2-rank splits only,
    and a small budget draws nothing beyond it: a 4-rank split is run this way)."""
    (check,) = [c for c in get_kind("training_step").checks(ctx.config, ctx.options)
                if c.name == name]  # fmt: skip
    return check.run(ctx, inputs)


def _run(fn, reference: str, check: str = "data-parallel", examples: int = 4,
         **options) -> CheckResult:  # type: ignore[no-untyped-def]  # fmt: skip
    opts = ConformanceOptions(reference, kind="training_step", **options)
    return run_check(build_context(fn, opts), check, max_examples=examples, base_seed=0)


CORRECT = [
    (S.token_mean_global, "dapo", {}),
    (S.seq_mean_token_mean, "grpo", {}),
    (S.seq_mean_token_sum_norm, "dapo", {"aggregation": "token-sum-norm", "budget": S.BUDGET}),
    (S.dr_grpo_constant, "dr_grpo", {"budget": S.BUDGET}),
]
DTYPES = [  # float64; computed in float32 inside; from bfloat16 inputs
    (None, "float64"),
    (S.token_mean_float32_inside, "float32"),
    (None, "bfloat16"),
]


@pytest.mark.parametrize(("wrap", "world"), [("ddp", 2), ("fsdp", 2), ("ddp", 4), ("fsdp", 4)])
def test_correct_steps_pass_on_the_real_group(wrap: str, world: int) -> None:
    """The corpus (2-rank data-parallel steps) through the engine, and a step of ``world``
    ranks with very different token counts (:data:`S.LENGTHS`) through the check itself."""
    D.shutdown(zygote=False)
    for fn, reference, overrides in CORRECT:
        for replacement, dtype in DTYPES:
            step = replacement if replacement is not None and fn is S.token_mean_global else fn
            on = {"distributed": wrap, "world_size": world, "dtype": dtype, "overrides": overrides}
            result = _run(step, reference, **on)
            assert result.passed, (step.__name__, dtype, result.report)
            ctx = build_context(step, ConformanceOptions(reference, kind="training_step", **on))
            batch = S.step_batch(getattr(torch, dtype))
            assert _on_step(ctx, {**batch, "split": S.split_of(world)}) <= 1.0, step.__name__
    assert sorted({p.world_size for p in D.pools()}) == sorted({2, world}), D.pools()


MUTANTS = [  # (step, what the diagnosis names)
    (S.bug_rank_tokens, "normalised per rank by the rank's own counts (no all-reduce"),
    (S.bug_mean_of_means, "the mean of micro-batch means"),
    (S.bug_accumulation_twice, "divided by the accumulation steps twice"),
    (S.bug_sample_weighted, "weighted by sample counts, not token counts"),
    (S.bug_no_world_size, "without the world-size factor"),
]


@pytest.mark.parametrize("wrap", ["ddp", "fsdp"])
@pytest.mark.parametrize(("fn", "named"), MUTANTS, ids=[m[0].__name__ for m in MUTANTS])
def test_a_scaling_bug_is_flagged_on_the_real_group_and_named(fn, named, wrap) -> None:  # type: ignore[no-untyped-def]
    result = _run(fn, "dapo", distributed=wrap)
    assert not result.passed
    assert "2 rank(s)" in result.message, result.message
    assert named in result.diagnosis, result.diagnosis


@pytest.mark.parametrize("wrap", ["ddp", "fsdp"])
@pytest.mark.parametrize(("fn", "named"), MUTANTS, ids=[m[0].__name__ for m in MUTANTS])
def test_a_scaling_bug_is_flagged_on_4_ranks_and_named(fn, named, wrap) -> None:  # type: ignore[no-untyped-def]
    """The same bugs on a step of 4 ranks (one row per micro-batch, token counts 1 to 6)."""
    opts = ConformanceOptions("dapo", kind="training_step", distributed=wrap, world_size=4)
    ctx = build_context(fn, opts)
    step = StepInputs(S.step_batch(), S.split_of(4))
    with pytest.raises(CheckFailure, match=r"4 rank\(s\) x 2 micro-batch\(es\)"):
        _on_step(ctx, step.as_kwargs())
    assert named in get_kind("training_step").diagnose(ctx, step).text
    assert 4 in [p.world_size for p in D.pools()], D.pools()


@pytest.mark.parametrize("wrap", ["ddp", "fsdp"])
def test_division_by_empty_micro_batches_is_flagged_on_the_real_group_and_named(wrap) -> None:  # type: ignore[no-untyped-def]
    """NeMo-RL #212 on the real group: the canonical step with a rank that holds no rows
    (checks=('empty-micro-batches',)); a correct token-mean step passes it there."""
    empty = {"checks": ("empty-micro-batches",), "distributed": wrap}
    result = _run(S.bug_divides_by_empty, "dapo", "empty-micro-batches", **empty)
    assert not result.passed
    assert f"on a real {wrap} process group (2 ranks, rank 1)" in result.message, result.message
    assert "division by empty micro-batches, NeMo-RL #212" in result.message
    assert _run(S.token_mean_global, "dapo", "empty-micro-batches", **empty).passed


def test_empty_micro_batches_on_4_fsdp_ranks() -> None:
    """The check on a 4-rank split (rank 2 without rows, empty micro-batches on ranks 1 and
    3; the canonical steps hold 2 ranks): the division by an empty micro-batch is named on
    its rank, the correct token-mean step and the drawn 4-rank steps pass."""
    opts = ConformanceOptions("dapo", kind="training_step", checks=(EMPTY,), distributed="fsdp",
                              world_size=4)  # fmt: skip
    four = Split((((0, 1), (2,)), ((3,), ()), ((), ()), ((4, 5), (6, 7))))
    inputs = {**S.step_batch(), "split": four}
    named = r"on a real fsdp process group \(4 ranks, rank [123]\)"
    with pytest.raises((Verdict, CheckFailure), match=named) as info:
        _on_step(build_context(S.bug_divides_by_empty, opts), inputs, EMPTY)
    assert "division by empty micro-batches, NeMo-RL #212" in str(info.value)
    good = build_context(S.token_mean_global, opts)
    assert _on_step(good, inputs, EMPTY) <= 1.0
    assert run_check(good, EMPTY, max_examples=4, base_seed=0).passed


@pytest.mark.parametrize(("wrap", "world"), [("ddp", 2), ("fsdp", 2), ("ddp", 4)])
def test_a_multi_term_step_is_judged_term_by_term_on_the_real_group(wrap: str, world: int) -> None:
    """policy + KL + entropy: each term's accumulated gradient comes from the real group's
    reduction, on the corpus's 2-rank steps and on a step of ``world`` ranks; the K-fold KL
    term is named, the correct step passes."""
    on = {"distributed": wrap, "world_size": world}
    assert _run(S.multi_term_global, "dapo", examples=2, **on).passed
    result = _run(S.bug_kl_term_k_fold, "dapo", examples=2, **on)
    assert not result.passed
    assert "the kl term is mis-scaled" in result.message, result.message
    assert "2 rank(s) x 2 micro-batch(es)" in result.message
    assert "normalised per micro-batch; 2 micro-batches" in result.message
    opts = ConformanceOptions("dapo", kind="training_step", **on)
    step = {**S.step_batch(), "split": S.split_of(world)}
    D.shutdown(zygote=False)
    assert _on_step(build_context(S.multi_term_global, opts), step) <= 1.0
    assert [p.world_size for p in D.pools()] == [world], D.pools()
    named = rf"the kl term is mis-scaled with the split {world} rank\(s\) x 2 micro-batch"
    with pytest.raises(CheckFailure, match=named) as info:
        _on_step(build_context(S.bug_kl_term_k_fold, opts), step)
    assert "normalised per micro-batch; 2 micro-batches" in str(info.value)


@pytest.mark.parametrize(("wrap", "world"), [("ddp", 2), ("fsdp", 4)])
def test_the_critic_step_on_the_real_group(wrap: str, world: int) -> None:
    """verl PR #6957 on the real group: the per-micro-batch value loss is K-fold and named;
    the global token-mean critic step passes (float64 and bf16 inputs)."""
    from pytest_polgrad.kinds.training_step.critic import check_critic_step, critic_batch

    split = S.split_of(world)
    for dtype in (torch.float64, torch.bfloat16):
        batch = critic_batch(S.LENGTHS, dtype=dtype)
        assert check_critic_step(S.critic_global, batch, split, wrap=wrap) <= 1.0
    equal = critic_batch((3,) * 8)
    with pytest.raises(CheckFailure, match="2x the reference's: normalised per micro-batch"):
        check_critic_step(S.bug_critic_per_micro_batch, equal, split, wrap=wrap)


def test_a_step_that_all_reduces_its_own_count_runs_as_written() -> None:
    """verl / prime-rl / OpenRLHF all-reduce the token count inside the step: it passes on
    the real group and cannot run in the simulated one (no process group there), which
    also shows the data-parallel check ran on the real group."""
    assert _run(S.token_mean_all_reduced, "dapo", distributed="ddp").passed
    simulated = _run(S.token_mean_all_reduced, "dapo")
    assert not simulated.passed and "process group" in simulated.message, simulated.message


def test_a_rank_fault_is_a_verdict_naming_the_rank() -> None:
    result = _run(S.raises_on_rank_1, "dapo", distributed="ddp")
    assert not result.passed
    assert "real ddp process group" in result.message and "rank 1" in result.message


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"distributed": "dpp", "kind": "training_step"}, "did you mean 'ddp'"),
        ({"distributed": "ddp"}, "kind='training_step' only"),
        ({"distributed": "ddp", "kind": "training_step", "world_size": 3}, "world_size"),
        ({"kind": "training_step", "world_size": 4}, "needs distributed="),
    ],
)
def test_bad_distributed_options_are_named(options, named) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(MarkerError, match=r"distributed|world_size") as info:
        ConformanceOptions("dapo", **options)
    assert named in str(info.value)


def test_fold_keeps_every_row_once_and_the_accumulation_steps() -> None:
    three = Split((((0,), (1,)), ((2,), (3, 4)), ((5,), (6,))), steps_per_generation=4,
                  outside_tokens=9, outside_rows=7)  # fmt: skip
    two = fold(three, 4)
    assert two.ranks == (((0, 5), (1, 6)), ((2,), (3, 4)))
    assert (two.steps_per_generation, two.outside_tokens, two.outside_rows) == (4, 9, 7)
    four = Split(tuple(((i,),) for i in range(4)))
    assert fold(four, 4) is four and fold(four, 2).world_size == 2
    one = Split((((0, 1),),))
    assert fold(one, 2) is one
