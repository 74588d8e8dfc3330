"""The aggregation kind: correct modes pass (float64, float32 inside, bf16 inputs); wrong
aggregations are flagged with a diagnosis naming the mode they compute."""

from __future__ import annotations

import pytest
import torch

from pytest_polgrad.core.engine import CheckResult, build_context, run_check
from pytest_polgrad.core.kinds import get_kind
from pytest_polgrad.core.options import ConformanceOptions, MarkerError
from tests.helpers import inline_run

CHECKS = ("value", "gradient", "masked-positions", "padding-values", "padding-columns",
          "inputs-unchanged", "deterministic")  # fmt: skip


def _run(fn, check: str, reference: str, examples: int = 15, **options) -> CheckResult:
    opts = ConformanceOptions(reference, kind="aggregation", **options)
    return run_check(build_context(fn, opts), check, max_examples=examples, base_seed=0)


def _kept(x, mask):
    return torch.where(mask, x, 0.0)


def token_mean(loss_mat, loss_mask):
    """verl's agg_loss spelling of the arguments."""
    return _kept(loss_mat, loss_mask).sum() / loss_mask.sum()


def token_mean_f32(x, response_mask):
    return (_kept(x.float(), response_mask).sum() / response_mask.sum()).to(x.dtype)


def seq_mean_token_mean(x, response_mask):
    return (_kept(x, response_mask).sum(dim=1) / (response_mask.sum(dim=1) + 1e-8)).mean()


def seq_mean_token_sum(x, response_mask):
    return _kept(x, response_mask).sum(dim=1).mean()


def token_sum_norm_64(x, response_mask):
    return _kept(x, response_mask).sum() / (x.shape[0] * 64)


def token_sum(per_token_loss, mask):
    return _kept(per_token_loss, mask).sum()


CORRECT = [
    (token_mean, "dapo", {}),
    (token_mean_f32, "dapo", {}),
    (token_mean, "dapo", {"dtype": "bfloat16"}),
    (token_mean_f32, "token-mean", {"dtype": "float32"}),
    (seq_mean_token_mean, "grpo", {}),
    (seq_mean_token_sum, "rloo", {}),
    (token_sum_norm_64, "dr_grpo", {"overrides": {"budget": 64}}),
    (token_sum, "token-sum", {}),
]


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize(
    ("fn", "reference", "options"),
    CORRECT,
    ids=[f"{f.__name__}-{r}-{o.get('dtype', 'float64')}" for f, r, o in CORRECT],
)
def test_correct_aggregation_passes(fn, reference, options, check) -> None:
    result = _run(fn, check, reference, **options)
    assert result.passed, result.report


# ---- wrong ones ----------------------------------------------------------------------


def padded_width_norm(x, response_mask):
    """Dr.GRPO by the padded width (verl's seq-mean-token-sum-norm without a fixed factor)."""
    return _kept(x, response_mask).sum() / (x.shape[0] * x.shape[1])


def mean_over_padded_entries(x, response_mask):
    """A plain torch.mean of the masked values: padding counted in the denominator."""
    return torch.mean(x * response_mask)


def mask_multiplication(x, response_mask):
    """NaN at padding leaks through x * mask (0 * NaN = NaN)."""
    return (x * response_mask).sum() / response_mask.sum()


def forgot_the_mask(x, response_mask):
    return x.sum() / response_mask.sum()


def grpo_instead_of_dapo(x, response_mask):
    return seq_mean_token_mean(x, response_mask)


def sum_instead_of_mean(x, response_mask):
    return _kept(x, response_mask).sum()


MUTANTS = [
    (padded_width_norm, "dr_grpo", {"overrides": {"budget": 64}}, "padding-columns",
     "token-sum-norm dividing by the padded width"),
    (mean_over_padded_entries, "dapo", {}, "value", "token-sum-norm dividing by the padded width"),
    (grpo_instead_of_dapo, "dapo", {}, "gradient", "seq-mean-token-mean"),
    (sum_instead_of_mean, "dapo", {}, "value", "token-sum"),
    (forgot_the_mask, "dapo", {}, "masked-positions", ""),
    (mask_multiplication, "dapo", {"padding_nan": True}, "padding-values", ""),
]  # fmt: skip


@pytest.mark.parametrize(("fn", "reference", "options", "check", "named"), MUTANTS,
                         ids=[m[0].__name__ for m in MUTANTS])  # fmt: skip
def test_wrong_aggregation_is_flagged(fn, reference, options, check, named) -> None:
    result = _run(fn, check, reference, **options)
    assert not result.passed, result.message
    assert named in result.diagnosis, result.diagnosis


def test_fixed_budget_passes_padding_columns_and_padded_width_does_not() -> None:
    """The point of token-sum-norm: a fixed budget does not move when padding is added."""
    assert _run(token_sum_norm_64, "padding-columns", "dr_grpo", overrides={"budget": 64}).passed
    assert not _run(padded_width_norm, "padding-columns", "dr_grpo",
                    overrides={"budget": 64}).passed  # fmt: skip


def test_bad_reference_and_overrides_are_marker_errors() -> None:
    kind = get_kind("aggregation")
    with pytest.raises(MarkerError, match="did you mean 'token-mean'"):
        kind.resolve(ConformanceOptions("token-maen", kind="aggregation"))
    with pytest.raises(MarkerError, match="needs budget"):
        kind.resolve(ConformanceOptions("token-sum-norm", kind="aggregation"))
    with pytest.raises(MarkerError, match="unknown override 'bugdet'"):
        kind.resolve(ConformanceOptions("dapo", kind="aggregation", overrides={"bugdet": 8}))


def test_golden_data_is_tolerant_of_its_own_rounding() -> None:
    kind = get_kind("aggregation")
    opts = ConformanceOptions("dapo", kind="aggregation")
    ctx = kind.context(token_mean, "token_mean", kind.resolve(opts), opts)
    data = kind.golden(ctx)
    assert set(data.data) == set(kind.corpus(ctx))
    ragged = data.data["ragged"]
    assert float(ragged["loss"]) != 0.0 and ragged["grad"].shape == (4, 10)


pytest_plugins = ["pytester"]

MARKED = """
import pytest
import torch


@pytest.mark.polgrad_conforms("dapo", kind="aggregation")
def agg_loss(loss_mat, loss_mask):
    return torch.where(loss_mask, loss_mat, 0.0).sum() / loss_mask.sum()


@pytest.mark.polgrad_conforms("dr_grpo", kind="aggregation", budget=64, checks=["padding-columns"])
def by_padded_width(x, response_mask):
    return torch.where(response_mask, x, 0.0).sum() / (x.shape[0] * x.shape[1])
"""


def test_marker_generates_aggregation_items_and_goldens(pytester) -> None:
    pytester.makepyfile(test_agg=MARKED)
    args = ("-p", "no:cacheprovider", "-p", "no:randomly", "--polgrad-max-examples=10")
    inline_run.run(pytester, *args, "--snapshot-update")
    result = inline_run.run(pytester, *args, "-rA")
    out = result.stdout.str()
    for check in (*CHECKS, "golden"):
        assert f"PASSED test_agg.py::agg_loss[dapo-{check}]" in out, out
    assert "FAILED test_agg.py::by_padded_width[dr_grpo-padding-columns]" in out
    assert "dividing by the padded width" in out
    result.assert_outcomes(passed=len(CHECKS) + 1, failed=1)


def test_report_snippet_runs_standalone(capsys) -> None:
    result = _run(grpo_instead_of_dapo, "value", "dapo")
    code = result.report.split("reproduce (standalone):", 1)[1].split("  replay", 1)[0]
    exec(compile(code, "snippet", "exec"), {})
    assert "function:" in capsys.readouterr().out
