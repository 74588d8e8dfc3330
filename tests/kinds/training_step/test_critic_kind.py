"""``kind="critic_step"``: the critic's value loss marked with ``polgrad_conforms``.

The global token-mean critic step conforms in float64, computed in float32 inside, from
float32 and from bfloat16 inputs, simulated and on a real DDP group; verl PR #6957's value
loss normalised per micro-batch is flagged under its split with its K-fold factor and
named by the diagnosis, through ``assert_conforms`` and through the pytest plugin.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_polgrad import ConformanceError, assert_conforms
from pytest_polgrad.core.engine import build_context
from pytest_polgrad.core.kinds import get_kind
from pytest_polgrad.core.options import ConformanceOptions, MarkerError
from pytest_polgrad.core.verdicts import CheckFailure
from pytest_polgrad.kinds.training_step import distributed as D
from pytest_polgrad.kinds.training_step.critic import critic_batch
from tests.helpers import inline_run
from tests.kinds.training_step import distributed_steps as S

pytest_plugins = ["pytester"]

T = torch.Tensor
FAST: dict[str, Any] = {"kind": "critic_step", "max_examples": 4, "max_batch": 6, "max_length": 8}
K_FOLD = "4x the reference's: normalised per micro-batch; 4 micro-batches"
NAMED = "(verl PR #6957's value loss)"


def critic_float32_inside(
    values: T, old_values: T, returns: T, response_mask: T, global_tokens: int, world_size: int
) -> T:
    """The global token-mean critic step computed in float32 whatever the inputs' dtype."""
    args = (values.float(), old_values.float(), returns.float(), response_mask)
    return S.critic_global(*args, global_tokens, world_size)


def critic_upcast(
    values: T, old_values: T, returns: T, response_mask: T, global_tokens: int, world_size: int
) -> T:
    """The global token-mean critic step, bf16 inputs upcast to float32 first."""
    return critic_float32_inside(values, old_values, returns, response_mask, global_tokens,
                                 world_size)  # fmt: skip


def critic_missing_world(
    values: T, old_values: T, returns: T, response_mask: T, global_tokens: int
) -> T:
    """The global token count without the world-size factor: 1/W on W ranks."""
    return S.critic_global(values, old_values, returns, response_mask, global_tokens, 1)


CORRECT = [
    (S.critic_global, "float64"),
    (critic_float32_inside, "float64"),
    (S.critic_global, "float32"),
    (S.critic_global, "bfloat16"),
    (critic_upcast, "bfloat16"),
]


@pytest.mark.parametrize(("step", "dtype"), CORRECT, ids=lambda x: getattr(x, "__name__", x))
def test_a_correct_critic_step_conforms(step: object, dtype: str) -> None:
    report = assert_conforms(step, "ppo", dtype=dtype, **FAST)  # type: ignore[arg-type]
    assert [r.check for r in report.results] == [
        "full-batch", "micro-batches", "data-parallel", "masked-positions",
        "padding-values", "inputs-unchanged", "deterministic",
    ]  # fmt: skip


def test_verl_6957_per_micro_batch_value_loss_is_flagged_and_named() -> None:
    with pytest.raises(ConformanceError) as info:
        assert_conforms(S.bug_critic_per_micro_batch, "ppo", **FAST)
    results = {r.check: r for r in info.value.report.results}
    assert results["full-batch"].passed  # one micro-batch cannot show it
    assert not results["micro-batches"].passed and not results["data-parallel"].passed
    text = str(info.value)
    assert "the value term is mis-scaled" in text and K_FOLD in text, text
    assert NAMED in results["micro-batches"].diagnosis, results["micro-batches"].diagnosis


def test_a_missing_world_size_factor_is_flagged_under_data_parallel_only() -> None:
    with pytest.raises(ConformanceError) as info:
        assert_conforms(critic_missing_world, "ppo", **FAST)
    failed = [r.check for r in info.value.report.results if not r.passed]
    assert failed == ["data-parallel"], failed
    assert "world-size factor is missing" in str(info.value)


def critic_whitens_with_padding(
    values: T, old_values: T, returns: T, response_mask: T, global_tokens: int, world_size: int
) -> T:
    """Returns scaled by the std of the padded tensor, padding included: the loss depends on
    the values at padding."""
    scaled = returns / returns.nan_to_num(0.0).std()
    return S.critic_global(values, old_values, scaled, response_mask, global_tokens, world_size)


def test_a_step_reading_the_values_at_padding_is_flagged() -> None:
    with pytest.raises(ConformanceError) as info:
        assert_conforms(critic_whitens_with_padding, "ppo", checks=("padding-values",), **FAST)
    assert "when only the values at padding change" in str(info.value), str(info.value)


def test_the_clip_range_is_the_references() -> None:
    """The steps clip at 0.2: against 'verl' (clip 0.5) they do not conform."""
    with pytest.raises(ConformanceError, match="full-batch"):
        assert_conforms(S.critic_global, "verl", checks=("full-batch",), **FAST)
    assert_conforms(S.critic_global, "verl", clip_range=0.2, checks=("full-batch",), **FAST)


def critic_all_reduced(
    values: T, old_values: T, returns: T, response_mask: T, rank_tokens: int, world_size: int
) -> T:
    """The step's own global count, all-reduced from the ranks' (as verl's engine does):
    runs only on a real process group."""
    n = torch.tensor(float(rank_tokens), dtype=torch.float64)
    torch.distributed.all_reduce(n)
    return S.critic_global(values, old_values, returns, response_mask, int(n), world_size)


def test_on_a_real_ddp_group() -> None:
    """The data-parallel check's splits run on 2 gloo ranks: the correct step passes (float64,
    float32 inside, bf16 inputs), a step all-reducing its own count runs as written (and
    cannot run simulated), verl PR #6957's step is flagged and named."""
    on_group: dict[str, Any] = {**FAST, "distributed": "ddp", "max_examples": 2}
    on_group["checks"] = ("data-parallel",)
    for step, dtype in [CORRECT[0], CORRECT[1], CORRECT[3]]:
        assert_conforms(step, "ppo", dtype=dtype, **on_group)
    assert_conforms(critic_all_reduced, "ppo", **on_group)
    with pytest.raises(ConformanceError, match="process group"):
        assert_conforms(critic_all_reduced, "ppo", **{**on_group, "distributed": None})
    with pytest.raises(ConformanceError) as info:
        assert_conforms(S.bug_critic_per_micro_batch, "ppo", **on_group)
    assert "normalised per micro-batch" in str(info.value)
    assert NAMED in info.value.report.results[0].diagnosis


def test_on_a_real_fsdp_group_of_4_ranks() -> None:
    """The same under FSDP2 on 4 gloo ranks: the correct step passes (float64, bf16 inputs),
    a step all-reducing its own count runs as written (on the group, then), and verl PR
    #6957's step is flagged there, its factor and scheme named."""
    on_group: dict[str, Any] = {**FAST, "distributed": "fsdp", "world_size": 4,
                                "max_examples": 2, "checks": ("data-parallel",)}  # fmt: skip
    for step, dtype in [CORRECT[0], CORRECT[3]]:
        assert_conforms(step, "ppo", dtype=dtype, **on_group)
    assert_conforms(critic_all_reduced, "ppo", **on_group)
    with pytest.raises(ConformanceError) as info:
        assert_conforms(S.bug_critic_per_micro_batch, "ppo", **on_group)
    assert "the value term is mis-scaled" in str(info.value), str(info.value)
    assert "normalised per micro-batch" in str(info.value)
    assert NAMED in info.value.report.results[0].diagnosis
    # the corpus's data-parallel steps hold 2 ranks: a step of 4, through the check itself
    opts = ConformanceOptions("ppo", kind="critic_step", distributed="fsdp", world_size=4)
    four = {**critic_batch((3,) * 8), "split": S.split_of(4)}
    D.shutdown(zygote=False)
    assert _data_parallel(build_context(S.critic_global, opts), four) <= 1.0
    assert [p.world_size for p in D.pools()] == [4], D.pools()
    with pytest.raises(CheckFailure, match=r"4 rank\(s\) x 2 micro-batch.*2x the reference's"):
        _data_parallel(build_context(S.bug_critic_per_micro_batch, opts), four)


def _data_parallel(ctx: Any, inputs: dict[str, Any]) -> float:
    (check,) = [c for c in get_kind("critic_step").checks(ctx.config, ctx.options)
                if c.name == "data-parallel"]  # fmt: skip
    return check.run(ctx, inputs)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"reference": "grpo"}, "reference must be one of 'ppo', 'verl', 'unclipped'"),
        ({"clip_range": -1.0}, "clip_range must be a positive number"),
        ({"eps_high": 0.28}, "unknown option.*the critic_step overrides \\['clip_range'\\]"),
        ({"layout": "left"}, "right-padded"),
        ({"checks": ("value",)}, "value"),
    ],
)
def test_bad_markers_are_clear_errors(options: dict[str, Any], named: str) -> None:
    reference = options.pop("reference", "ppo")
    with pytest.raises(MarkerError, match=named):
        assert_conforms(S.critic_global, reference, kind="critic_step", **options)


def test_the_report_snippet_runs_standalone(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConformanceError) as info:
        assert_conforms(S.bug_critic_per_micro_batch, "ppo", checks=("micro-batches",), **FAST)
    report = str(info.value)
    code = report.split("reproduce (standalone):", 1)[1].split("  replay", 1)[0]
    exec(compile(code, "snippet", "exec"), {})
    printed = capsys.readouterr().out
    assert "gradient / reference (least squares): 4.0" in printed, printed


MARKED = """
import pytest
from tests.kinds.training_step import distributed_steps as S


@pytest.mark.polgrad_conforms("ppo", kind="critic_step", max_batch=6, max_length=8)
def good(values, old_values, returns, response_mask, global_tokens, world_size):
    return S.critic_global(values, old_values, returns, response_mask, global_tokens, world_size)


@pytest.mark.polgrad_conforms(
    "ppo", kind="critic_step", checks=("micro-batches",), max_batch=6, max_length=8
)
def verl_6957(values, old_values, returns, response_mask, micro_batch_tokens):
    return S.bug_critic_per_micro_batch(values, old_values, returns, response_mask,
                                        micro_batch_tokens)
"""


def test_the_marker_generates_critic_items_and_goldens(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_critics=MARKED)
    pytester.syspathinsert(str(Path(__file__).parents[3]))
    args = ("-p", "no:cacheprovider", "-p", "no:randomly", "--polgrad-max-examples=3")
    inline_run.run(pytester, *args, "--snapshot-update")
    result = inline_run.run(pytester, *args, "-rA")
    out = result.stdout.str()
    every = ("full-batch", "micro-batches", "data-parallel", "masked-positions",
             "padding-values", "inputs-unchanged", "deterministic", "golden")  # fmt: skip
    for check in every:
        assert f"PASSED test_critics.py::good[ppo-{check}]" in out, out
    assert "FAILED test_critics.py::verl_6957[ppo-micro-batches]" in out, out
    assert K_FOLD in out and NAMED in out
    result.assert_outcomes(passed=len(every), failed=1)  # checks= drops verl_6957's golden
