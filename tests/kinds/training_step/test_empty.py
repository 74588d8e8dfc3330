"""The opt-in ``empty-micro-batches`` check, simulated: micro-batches and ranks without
response tokens (NeMo-RL #212) contribute nothing; a step that divides by their count is
flagged and named, a correct one passes in float64, float32 and from bfloat16 inputs."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from pytest_polgrad.core.engine import CheckResult, build_context, run_check
from pytest_polgrad.core.kinds import get_kind
from pytest_polgrad.core.options import ConformanceOptions
from pytest_polgrad.kinds.training_step.kind import accumulate
from pytest_polgrad.strategies import Split
from tests.helpers import inline_run
from tests.kinds.training_step import distributed_steps as S

EMPTY = "empty-micro-batches"


def _run(fn, reference: str = "dapo", examples: int = 6, **options) -> CheckResult:  # type: ignore[no-untyped-def]
    opts = ConformanceOptions(reference, kind="training_step", checks=(EMPTY,), **options)
    return run_check(build_context(fn, opts), EMPTY, max_examples=examples, base_seed=0)


CORRECT = [
    (S.token_mean_global, "dapo", {}),
    (S.seq_mean_token_mean, "grpo", {}),
    (S.seq_mean_token_sum_norm, "dapo", {"aggregation": "token-sum-norm", "budget": S.BUDGET}),
    (S.dr_grpo_constant, "dr_grpo", {"budget": S.BUDGET}),
]


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
@pytest.mark.parametrize(("fn", "reference", "overrides"), CORRECT,
                         ids=[c[0].__name__ for c in CORRECT])  # fmt: skip
def test_correct_steps_pass_with_empty_micro_batches(fn, reference, overrides, dtype) -> None:  # type: ignore[no-untyped-def]
    if dtype == "float32" and fn is S.token_mean_global:
        fn = S.token_mean_float32_inside
    result = _run(fn, reference, dtype=dtype, overrides=overrides)
    assert result.passed, result.report


def test_an_empty_micro_batch_adds_nothing_to_the_accumulated_step() -> None:
    """The same rows with and without empty micro-batches and an empty rank: the same
    accumulated gradient and loss (the full-batch oracle's, unchanged)."""
    kind = get_kind("training_step")
    opts = ConformanceOptions("dapo", kind="training_step")
    ctx: Any = kind.context(S.token_mean_global, "step", kind.resolve(opts), opts)
    batch = S.step_batch()
    plain = accumulate(ctx, {**batch, "split": Split((((0, 1, 2, 3), (4, 5, 6, 7)),))})
    holed = Split((((0, 1, 2, 3), (), (4, 5, 6, 7)), ((), (), ())))
    with_empty = accumulate(ctx, {**batch, "split": holed})
    assert torch.equal(plain.grad, with_empty.grad)
    assert with_empty.loss == pytest.approx(plain.loss, rel=1e-15)


def test_division_by_an_empty_micro_batch_is_flagged_and_named() -> None:
    """NeMo-RL #212: exact wherever a micro-batch holds tokens (it passes every default
    check), NaN on an empty one."""
    result = _run(S.bug_divides_by_empty)
    assert not result.passed
    assert "it is an empty micro-batch (0 response tokens" in result.message, result.message
    assert "division by empty micro-batches" in result.message
    opts = ConformanceOptions("dapo", kind="training_step")
    ctx = build_context(S.bug_divides_by_empty, opts)
    for check in ("micro-batches", "data-parallel"):
        assert run_check(ctx, check, max_examples=4, base_seed=0).passed, check


def test_a_rank_without_tokens_names_the_rank_count() -> None:
    """prime-rl #2562's per-rank count is 0/0 on a rank without tokens."""
    result = _run(S.bug_rank_tokens)
    assert not result.passed
    assert "0 response tokens on its rank" in result.message, result.message
    assert "the rank's own token count (both 0)" in result.message


def test_the_check_is_opt_in() -> None:
    kind = get_kind("training_step")
    plain = ConformanceOptions("dapo", kind="training_step")
    assert EMPTY not in [c.name for c in kind.checks(kind.resolve(plain), plain)]
    named = ConformanceOptions("dapo", kind="training_step", checks=(EMPTY, "micro-batches"))
    assert [c.name for c in kind.checks(kind.resolve(named), named)] == ["micro-batches", EMPTY]


def test_report_snippet_of_an_empty_micro_batch_runs_standalone(capsys) -> None:  # type: ignore[no-untyped-def]
    result = _run(S.bug_divides_by_empty)
    code = result.report.split("reproduce (standalone):", 1)[1].split("  replay", 1)[0]
    exec(compile(code, "snippet", "exec"), {})
    assert "accumulated loss:" in capsys.readouterr().out


MARKED = """
from typing import Any

import pytest
from tests.kinds.training_step.distributed_steps import bug_divides_by_empty, token_mean_global

good = pytest.mark.polgrad_conforms(
    "dapo", kind="training_step", checks=("micro-batches", "empty-micro-batches")
)(token_mean_global)
bad = pytest.mark.polgrad_conforms(
    "dapo", kind="training_step", checks=("empty-micro-batches",)
)(bug_divides_by_empty)
"""


def test_marker_opts_in_with_checks(pytester) -> None:  # type: ignore[no-untyped-def]
    pytester.makepyfile(test_steps=MARKED)
    args = ("-p", "no:cacheprovider", "-p", "no:randomly", "--polgrad-max-examples=6", "-rA")
    out = inline_run.run(pytester, *args).stdout.str()
    assert "PASSED test_steps.py::good[dapo-empty-micro-batches]" in out, out
    assert "FAILED test_steps.py::bad[dapo-empty-micro-batches]" in out, out
    assert "NeMo-RL #212" in out


pytest_plugins = ["pytester"]
