"""The training-step kind: correct accumulation schemes pass, the framework bugs are caught.

Every step below computes the per-token surrogate with the reference (so only the scaling
under test differs) and then scales the micro-batch loss as a trainer would.
"""

from __future__ import annotations

import pytest
import torch

from polgrad_reference import PolicyLossConfig, get_algorithm, policy_loss
from pytest_polgrad.core.engine import CheckResult, build_context, run_check
from pytest_polgrad.core.kinds import get_kind
from pytest_polgrad.core.options import ConformanceOptions, MarkerError
from pytest_polgrad.core.verdicts import Verdict
from pytest_polgrad.kinds.training_step.kind import accumulate
from pytest_polgrad.strategies import Split
from tests.helpers import inline_run

SPLIT_CHECKS = ("full-batch", "micro-batches", "data-parallel", "generation-steps")


def _token_losses(
    cfg: PolicyLossConfig,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Per-token surrogate ``[b, T]`` (0 at padding), optionally computed in ``dtype``."""
    if dtype is not None:
        logprobs, old_logprobs, advantages = (
            logprobs.to(dtype),
            old_logprobs.to(dtype),
            advantages.to(dtype),
        )
    out = policy_loss(
        cfg.replace(aggregation="token-sum", budget=None),
        logprobs=logprobs,
        old_logprobs=old_logprobs,
        advantages=advantages,
        response_mask=response_mask,
    )
    return torch.where(response_mask, out.token_loss, 0.0)


DAPO = get_algorithm("dapo").loss


def token_mean_step(logprobs, old_logprobs, advantages, response_mask, global_tokens, world_size):
    """verl 0.9.1 agg_loss convention: global token count, times dp_size."""
    tok = _token_losses(DAPO, logprobs, old_logprobs, advantages, response_mask)
    return tok.sum() / global_tokens * world_size


def token_mean_step_f32(
    logprobs, old_logprobs, advantages, response_mask, global_tokens, world_size
):
    tok = _token_losses(DAPO, logprobs, old_logprobs, advantages, response_mask, torch.float32)
    return (tok.sum() / global_tokens * world_size).to(logprobs.dtype)


def token_mean_step_info(logprobs, old_logprobs, advantages, response_mask, step):
    """The whole StepInfo object, and backward() called by the step itself."""
    tok = _token_losses(DAPO, logprobs, old_logprobs, advantages, response_mask)
    (tok.sum() / step.global_tokens * step.world_size).backward()


def seq_mean_token_mean_step(
    logprobs, old_logprobs, advantages, response_mask, global_rows, world_size
):
    cfg = get_algorithm("grpo").loss.replace(kl=None)
    tok = _token_losses(cfg, logprobs, old_logprobs, advantages, response_mask)
    return (tok.sum(dim=1) / response_mask.sum(dim=1)).sum() / global_rows * world_size


def seq_mean_token_sum_step(
    logprobs, old_logprobs, advantages, response_mask, global_rows, world_size
):
    cfg = get_algorithm("rloo").loss
    tok = _token_losses(cfg, logprobs, old_logprobs, advantages, response_mask)
    return tok.sum() / global_rows * world_size


def token_sum_norm_step(logprobs, old_logprobs, advantages, response_mask, global_rows, world_size):
    cfg = get_algorithm("dr_grpo").loss
    tok = _token_losses(cfg, logprobs, old_logprobs, advantages, response_mask, torch.float32)
    return (tok.sum() / (global_rows * 64) * world_size).to(logprobs.dtype)


# ---- the acceptance mutants (issue 9) --------------------------------------------------


def mean_of_micro_batch_means(
    logprobs, old_logprobs, advantages, response_mask, gradient_accumulation_steps
):
    """SkyRL #925: each micro-batch's own token-mean, divided by the accumulation steps."""
    tok = _token_losses(DAPO, logprobs, old_logprobs, advantages, response_mask)
    return tok.sum() / response_mask.sum() / gradient_accumulation_steps


def accumulation_divided_twice(
    logprobs, old_logprobs, advantages, response_mask, global_tokens, world_size,
    gradient_accumulation_steps,
):  # fmt: skip
    """ms-swift #10116: the global normaliser, then loss / gradient_accumulation_steps."""
    loss = token_mean_step(logprobs, old_logprobs, advantages, response_mask, global_tokens,
                           world_size)  # fmt: skip
    return loss / gradient_accumulation_steps


def sample_count_weighted(
    logprobs, old_logprobs, advantages, response_mask, micro_batch_rows, rank_rows
):
    """verl #5625/#5641: micro-batch token-mean scaled by its share of the samples."""
    tok = _token_losses(DAPO, logprobs, old_logprobs, advantages, response_mask)
    return tok.sum() / response_mask.sum() * (micro_batch_rows / rank_rows)


def torch_mean_bypass(
    logprobs, old_logprobs, advantages, response_mask, gradient_accumulation_steps
):
    """verl #7913 pattern: a plain torch.mean over the padded micro-batch."""
    tok = _token_losses(DAPO, logprobs, old_logprobs, advantages, response_mask)
    return torch.mean(tok) / gradient_accumulation_steps


def rank_local_token_count(
    logprobs, old_logprobs, advantages, response_mask, rank_tokens, world_size
):
    """agg_loss's formula fed the rank's own token count (no all-reduce of the count)."""
    tok = _token_losses(DAPO, logprobs, old_logprobs, advantages, response_mask)
    return tok.sum() / rank_tokens * world_size


def generation_batch_count(
    logprobs, old_logprobs, advantages, response_mask, generation_tokens, world_size
):
    """TRL #6024: num_items_in_batch of the generation batch, not of the optimizer step."""
    tok = _token_losses(DAPO, logprobs, old_logprobs, advantages, response_mask)
    return tok.sum() / (generation_tokens / world_size)


def _run(
    fn, check: str, reference: str = "dapo", examples: int = 15, *, diagnose=True, **options
) -> CheckResult:
    opts = ConformanceOptions(reference, kind="training_step", **options)
    ctx = build_context(fn, opts)
    return run_check(ctx, check, max_examples=examples, base_seed=0, diagnose=diagnose)


CORRECT = [
    (token_mean_step, "dapo", {}),
    (token_mean_step_f32, "dapo", {}),
    (token_mean_step, "dapo", {"dtype": "bfloat16"}),
    (token_mean_step_f32, "dapo", {"dtype": "float32"}),
    (token_mean_step_info, "dapo", {}),
    (seq_mean_token_mean_step, "grpo", {}),
    (seq_mean_token_sum_step, "rloo", {}),
    (token_sum_norm_step, "dr_grpo", {"budget": 64}),
]


@pytest.mark.parametrize(
    "check", [*SPLIT_CHECKS, "masked-positions", "padding-values", "inputs-unchanged"]
)
@pytest.mark.parametrize(
    ("fn", "reference", "options"),
    CORRECT,
    ids=[f"{f.__name__}-{r}-{o.get('dtype', 'float64')}" for f, r, o in CORRECT],
)
def test_correct_accumulation_passes(fn, reference, options, check) -> None:
    options = dict(options)
    overrides = {"budget": options.pop("budget")} if "budget" in options else {}
    result = _run(fn, check, reference, overrides=overrides, **options)
    assert result.passed, result.report
    assert result.examples > 8  # the corpus steps and drawn ones ran


MUTANTS = [
    (mean_of_micro_batch_means, "micro-batches", "mean of micro-batch means"),
    (accumulation_divided_twice, "micro-batches", "divided by the accumulation steps twice"),
    (sample_count_weighted, "micro-batches", "weighted by sample counts, not token counts"),
    (torch_mean_bypass, "micro-batches", "plain torch.mean over each micro-batch's padded"),
    (rank_local_token_count, "data-parallel", "normalised per rank by the rank's own counts"),
    (generation_batch_count, "generation-steps", "generation batch's token count"),
]


@pytest.mark.parametrize(("fn", "check", "named"), MUTANTS, ids=[m[0].__name__ for m in MUTANTS])
def test_mutant_is_flagged_under_its_split_with_a_diagnosis(fn, check, named) -> None:
    result = _run(fn, check)
    assert not result.passed
    assert "accumulated" in result.message and "with the split" in result.message
    assert named in result.diagnosis, result.diagnosis


def test_uniform_factor_is_named_with_its_usual_cause() -> None:
    result = _run(accumulation_divided_twice, "micro-batches")
    assert "the gradient is 0.5x the reference's" in result.diagnosis or (
        "x the reference's: divided by the number of accumulation steps twice" in result.diagnosis
    ), result.diagnosis


def test_mutants_pass_where_their_bug_cannot_show() -> None:
    """No false alarm: one micro-batch on one rank hides every scaling bug above except
    the padded torch.mean (which divides by padding) -- the checks agree."""
    for fn, _, _ in MUTANTS:
        result = _run(fn, "full-batch", diagnose=False)  # verdicts only
        assert result.passed is (fn is not torch_mean_bypass), (fn.__name__, result.message)


def test_report_snippet_runs_standalone(capsys) -> None:
    result = _run(mean_of_micro_batch_means, "micro-batches")
    code = result.report.split("reproduce (standalone):", 1)[1].split("  replay", 1)[0]
    exec(compile(code, "snippet", "exec"), {})
    printed = capsys.readouterr().out
    assert "accumulated loss:" in printed and "gradient / reference" in printed


def test_accumulation_matches_a_hand_computed_split() -> None:
    """Rows of lengths 1 and 3 on two ranks, token-mean over 4 tokens: every token's
    gradient is d l / d lp / 4 after the x2 world-size factor and the /2 all-reduce mean."""
    kind = get_kind("training_step")
    opts = ConformanceOptions("dapo", kind="training_step")
    ctx = kind.context(token_mean_step, "token_mean_step", kind.resolve(opts), opts)
    mask = torch.tensor([[True, False, False], [True, True, True]])
    lp = torch.tensor([[-1.0, 0.0, 0.0], [-0.5, -2.0, -1.5]], dtype=torch.float64)
    batch = {"logprobs": lp, "old_logprobs": lp.clone(), "response_mask": mask,
             "advantages": torch.tensor([1.0, -2.0], dtype=torch.float64)}  # fmt: skip
    acc = accumulate(ctx, {**batch, "split": Split((((0,),), ((1,),)))})
    # on-policy, ratio 1 inside the clip: d(-r A)/d lp = -A per token, weight 1/4
    expected = torch.tensor([[-0.25, 0, 0], [0.5, 0.5, 0.5]], dtype=torch.float64)
    assert torch.allclose(acc.grad, expected, rtol=0, atol=1e-15)
    assert acc.loss == pytest.approx((-1.0 + 3 * 2.0) / 4, abs=1e-15)


pytest_plugins = ["pytester"]

MARKED_STEPS = """
import pytest
import torch


def _tokens(logprobs, old_logprobs, advantages, response_mask):
    r = torch.exp(torch.where(response_mask, logprobs - old_logprobs, 0.0))
    a = advantages[:, None]
    per = torch.maximum(-a * r, -a * r.clamp(0.8, 1.28))
    return torch.where(response_mask, per, 0.0)


@pytest.mark.polgrad_conforms("dapo", kind="training_step")
def verl_style(logprobs, old_logprobs, advantages, response_mask, global_tokens, world_size):
    tok = _tokens(logprobs, old_logprobs, advantages, response_mask)
    return tok.sum() / global_tokens * world_size


@pytest.mark.polgrad_conforms("dapo", kind="training_step", checks=["micro-batches"])
def mean_of_means(logprobs, old_logprobs, advantages, response_mask, gradient_accumulation_steps):
    tok = _tokens(logprobs, old_logprobs, advantages, response_mask)
    return tok.sum() / response_mask.sum() / gradient_accumulation_steps
"""


def test_marker_generates_training_step_items_goldens_and_reports(pytester) -> None:
    pytester.makepyfile(test_steps=MARKED_STEPS)
    args = ("-p", "no:cacheprovider", "-p", "no:randomly", "--polgrad-max-examples=10")
    inline_run.run(pytester, *args, "--snapshot-update")
    result = inline_run.run(pytester, *args, "-rA")
    out = result.stdout.str()
    every = (*SPLIT_CHECKS, "masked-positions", "padding-values", "inputs-unchanged",
             "deterministic", "golden")  # fmt: skip
    for check in every:
        assert f"PASSED test_steps.py::verl_style[dapo-{check}]" in out, out
    assert "FAILED test_steps.py::mean_of_means[dapo-micro-batches]" in out
    assert "mean of micro-batch means" in out
    result.assert_outcomes(passed=len(every), failed=1)


def trl_generation_rescaled(
    logprobs, old_logprobs, advantages, response_mask, generation_tokens, world_size,
    gradient_accumulation_steps, steps_per_generation,
):  # fmt: skip
    """TRL 1.16.0 grpo_trainer.py (dapo/cispo): num_items_in_batch of the generation batch,
    divided by the processes and rescaled by gradient_accumulation_steps /
    steps_per_generation -- exact only when the optimizer steps of one generation batch
    hold equal token counts."""
    tok = _token_losses(DAPO, logprobs, old_logprobs, advantages, response_mask)
    normaliser = generation_tokens / world_size * gradient_accumulation_steps
    return tok.sum() / (normaliser / steps_per_generation)


def test_trl_generation_rescaled_normaliser_passes_until_generation_steps_differ() -> None:
    for check in ("full-batch", "micro-batches", "data-parallel"):
        assert _run(trl_generation_rescaled, check).passed, check
    result = _run(trl_generation_rescaled, "generation-steps")
    assert not result.passed
    assert "rescaled by gradient_accumulation_steps / steps_per_generation" in result.diagnosis


def nan_leaking_step(logprobs, old_logprobs, advantages, response_mask, global_tokens, world_size):
    """Masking by multiplication: NaN at padding survives 0 * NaN."""
    r = torch.exp(logprobs - old_logprobs)
    return (-(advantages[:, None] * r) * response_mask).sum() / global_tokens * world_size


def test_padding_values_catches_a_nan_leak_and_passes_where_masking() -> None:
    assert _run(token_mean_step, "padding-values", padding_nan=True).passed
    result = _run(nan_leaking_step, "padding-values", padding_nan=True)
    assert not result.passed


def gspo_step(logprobs, old_logprobs, advantages, response_mask, global_rows, world_size):
    cfg = get_algorithm("gspo").loss
    tok = _token_losses(cfg, logprobs, old_logprobs, advantages, response_mask)
    return (tok.sum(dim=1) / response_mask.sum(dim=1)).sum() / global_rows * world_size


@pytest.mark.parametrize("check", SPLIT_CHECKS)
def test_sequence_ratio_step_passes(check) -> None:
    assert _run(gspo_step, check, "gspo").passed


def nan_step(logprobs, old_logprobs, advantages, response_mask, global_tokens, world_size):
    return token_mean_step(logprobs, old_logprobs, advantages, response_mask, global_tokens,
                           world_size) * float("nan")  # fmt: skip


def test_non_finite_micro_batch_loss_is_a_verdict() -> None:
    result = _run(nan_step, "full-batch")
    assert not result.passed
    assert "the function returned nan for rank 0 micro-batch 0" in result.message


def test_bad_marker_options_are_marker_errors() -> None:
    kind = get_kind("training_step")
    with pytest.raises(MarkerError, match="unknown override 'bugdet'"):
        kind.resolve(ConformanceOptions("dr_grpo", kind="training_step", overrides={"bugdet": 8}))
    with pytest.raises(MarkerError, match="layout='left' is not supported"):
        kind.resolve(ConformanceOptions("dapo", kind="training_step", layout="left"))
    with pytest.raises(MarkerError, match="did you mean 'grpo'"):
        kind.resolve(ConformanceOptions("gpro", kind="training_step"))


def test_a_step_without_logprobs_is_a_verdict() -> None:
    kind = get_kind("training_step")
    opts = ConformanceOptions("dapo", kind="training_step")
    with pytest.raises(Verdict, match="has no 'logprobs' parameter"):
        kind.context(lambda lp, response_mask: 0, "f", kind.resolve(opts), opts)


def _upcast(fn):  # type: ignore[no-untyped-def]
    """``fn`` computing in float32 on bfloat16 inputs (as verl and TRL do), same signature."""
    import inspect

    def step(**kw):  # type: ignore[no-untyped-def]
        return fn(**{k: v.float() if torch.is_tensor(v) and v.is_floating_point() else v
                     for k, v in kw.items()})  # fmt: skip

    step.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
    return step


def scaled_2_percent_step(logprobs, old_logprobs, advantages, response_mask, global_tokens,
                          world_size):  # fmt: skip
    """A 2% scale error: within bfloat16's rounding, not within float32's."""
    return token_mean_step(logprobs, old_logprobs, advantages, response_mask, global_tokens,
                           world_size) * 1.02  # fmt: skip


@pytest.mark.parametrize("check", SPLIT_CHECKS)
def test_a_bfloat16_fed_step_that_upcasts_is_judged_at_float32_with_strict(check) -> None:
    """As for the policy loss (docs/tolerance.md, "Which precision"): strict judges a step fed
    bfloat16 at float32, where a 2% error shows; by default it passes within bfloat16's
    rounding. The correct step passes both ways (720 hand runs at default sizes: 0 alarms)."""
    for strict in (False, True):
        good = _run(_upcast(token_mean_step), check, dtype="bfloat16", strict=strict)
        assert good.passed, good.report
    assert _run(_upcast(scaled_2_percent_step), check, dtype="bfloat16").passed
    wrong = _run(
        _upcast(scaled_2_percent_step), check, dtype="bfloat16", strict=True, diagnose=False
    )
    assert not wrong.passed


def test_a_uniform_factor_and_its_inverse_get_opposite_causes() -> None:
    """``k`` accumulation steps: 1/k means the division by k happened twice, k that it is
    missing; world size ``w``: 1/w means the all-reduce mean's factor is missing, w that it
    is applied twice (issue 27: swapping the pairs survived, since the test accepted a bare
    "0.5x")."""
    from pytest_polgrad.kinds.training_step.kind import _meaning
    from pytest_polgrad.strategies import Split

    k2 = Split(ranks=(((0,), (1,)),))  # one rank, 2 micro-batches
    assert "divided by the number of accumulation steps twice" in _meaning(0.5, k2)
    assert "missing" not in _meaning(0.5, k2)
    assert _meaning(2.0, k2) == "the division by the number of accumulation steps is missing"
    w2 = Split(ranks=(((0,),), ((1,),)))  # two ranks, one micro-batch each
    assert "world-size factor is missing" in _meaning(0.5, w2)
    assert _meaning(2.0, w2) == "multiplied by the world size twice"
