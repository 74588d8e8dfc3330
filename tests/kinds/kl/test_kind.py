"""The KL kind: value and gradient against the reference estimators, clamps, straight-through
and the as-loss vs in-reward distinction; realistic wrong estimators are named."""

from __future__ import annotations

import pytest
import torch

from pytest_polgrad.core.engine import CheckResult, build_context, run_check
from pytest_polgrad.core.kinds import get_kind
from pytest_polgrad.core.options import ConformanceOptions, MarkerError
from tests.helpers import inline_run


def _run(fn, check: str, reference: str, examples: int = 15, **options) -> CheckResult:
    opts = ConformanceOptions(reference, kind="kl", **options)
    return run_check(build_context(fn, opts), check, max_examples=examples, base_seed=0)


def _lr(logprobs, ref_logprobs, response_mask):
    return torch.where(response_mask, ref_logprobs - logprobs, 0.0)


def k3(logprobs, ref_logprobs, response_mask):
    lr = _lr(logprobs, ref_logprobs, response_mask)
    return torch.exp(lr) - 1 - lr


def k3_f32(logprobs, ref_logprobs, response_mask):
    return k3(logprobs.float(), ref_logprobs.float(), response_mask).to(logprobs.dtype)


def k3_seq_mean(logprobs, ref_logprobs, response_mask):
    """Aggregated as GRPO aggregates its loss (the reference 'grpo' kl term)."""
    k = torch.where(response_mask, k3(logprobs, ref_logprobs, response_mask), 0.0)
    return (k.sum(dim=1) / response_mask.sum(dim=1)).mean()


def k3_clamped(logprob, ref_logprob):
    """verl's spelling and its +-10 clamp of k3 (no mask argument)."""
    kl = torch.clamp(ref_logprob - logprob, min=-20, max=20)
    return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)


def k3_plus(logprobs, ref_logprobs, response_mask):
    lr = _lr(logprobs, ref_logprobs, response_mask)
    k2 = 0.5 * lr * lr
    return k2 - k2.detach() + (torch.exp(lr) - 1 - lr).detach()


def k1(logprobs, ref_logprobs, response_mask):
    return torch.where(response_mask, logprobs - ref_logprobs, 0.0)


def k1_f32(logprobs, ref_logprobs, response_mask):
    """k1 computed in float32 from float64 inputs (the rounded log-ratio's error, slope 1)."""
    return k1(logprobs.float(), ref_logprobs.float(), response_mask).to(logprobs.dtype)


def abs_f32(logprobs, ref_logprobs, response_mask):
    return k1_f32(logprobs, ref_logprobs, response_mask).abs()


def k2(logprobs, ref_logprobs, response_mask):
    return 0.5 * _lr(logprobs, ref_logprobs, response_mask) ** 2


CORRECT = [
    (k3, "grpo", {}, ("value", "gradient")),
    (k3_f32, "grpo", {}, ("value", "gradient")),
    (k3, "grpo", {"dtype": "bfloat16"}, ("value", "gradient")),
    (k3_seq_mean, "grpo", {}, ("value", "gradient")),
    (k3_clamped, "grpo", {"overrides": {"clamp": 10}}, ("value", "gradient")),
    (k3_plus, "k3+", {}, ("value", "gradient")),
    (k1, "rloo", {}, ("value",)),
    (k1_f32, "k1", {}, ("value", "gradient")),
    (abs_f32, "abs", {"dtype": "bfloat16"}, ("value", "gradient")),
    (k2, "k2", {"dtype": "float32"}, ("value", "gradient")),
]


@pytest.mark.parametrize(("fn", "reference", "options", "checks"), CORRECT,
                         ids=[f"{c[0].__name__}-{c[1]}-{c[2].get('dtype', 'float64')}"
                              for c in CORRECT])  # fmt: skip
def test_correct_estimator_passes(fn, reference, options, checks) -> None:
    for check in (*checks, "masked-positions", "padding-values", "inputs-unchanged",
                  "deterministic"):  # fmt: skip
        result = _run(fn, check, reference, **options)
        assert result.passed, result.report


def k3_sign_flipped(logprobs, ref_logprobs, response_mask):
    lr = torch.where(response_mask, logprobs - ref_logprobs, 0.0)
    return torch.exp(lr) - 1 - lr


def k2_without_half(logprobs, ref_logprobs, response_mask):
    return _lr(logprobs, ref_logprobs, response_mask) ** 2


def k1_wrong_direction(logprobs, ref_logprobs, response_mask):
    return _lr(logprobs, ref_logprobs, response_mask)


MUTANTS = [
    (k3_sign_flipped, "grpo", {}, "value", "k3 with the sign of the log-ratio flipped"),
    (k2_without_half, "k2", {}, "value", "k2 without the 1/2"),
    (k1_wrong_direction, "rloo", {}, "value", "k1 in the wrong direction"),
    (k3, "grpo", {"overrides": {"clamp": 10}}, "value", "k3, no clamp"),  # missing clamp
    (k3_clamped, "grpo", {}, "value", "k3, clamped to +-10"),  # a clamp where none should be
    (k3, "k3+", {}, "gradient", "k3, no clamp, in the loss"),  # value right, gradient not
    (k3_plus, "grpo", {}, "gradient", "k3+"),
]


@pytest.mark.parametrize(("fn", "reference", "options", "check", "named"), MUTANTS,
                         ids=[f"{m[0].__name__}-{m[1]}-{m[3]}" for m in MUTANTS])  # fmt: skip
def test_wrong_estimator_is_flagged_and_named(fn, reference, options, check, named) -> None:
    result = _run(fn, check, reference, **options)
    assert not result.passed, result.message
    assert named in result.diagnosis, result.diagnosis


def test_k3_as_loss_diagnosis_says_its_gradient_is_not_the_kl_gradient() -> None:
    result = _run(k3, "gradient", "k3+")
    assert "k3's gradient is not the gradient of KL(pi || ref)" in result.diagnosis


def test_in_reward_placement_has_no_gradient_check() -> None:
    kind = get_kind("kl")
    opts = ConformanceOptions("rloo", kind="kl")
    names = [c.name for c in kind.checks(kind.resolve(opts), opts)]
    assert "gradient" not in names and "value" in names
    loss = ConformanceOptions("grpo", kind="kl")
    assert "gradient" in [c.name for c in kind.checks(kind.resolve(loss), loss)]


def test_bad_reference_and_overrides_are_marker_errors() -> None:
    kind = get_kind("kl")
    with pytest.raises(MarkerError, match="has no KL term"):
        kind.resolve(ConformanceOptions("dapo", kind="kl"))
    with pytest.raises(MarkerError, match="did you mean"):
        kind.resolve(ConformanceOptions("gpro", kind="kl"))
    with pytest.raises(MarkerError, match="clamp must be a positive number"):
        kind.resolve(ConformanceOptions("grpo", kind="kl", overrides={"clamp": -1}))


pytest_plugins = ["pytester"]

MARKED = """
import pytest
import torch


@pytest.mark.polgrad_conforms("grpo", kind="kl", clamp=10)
def kl_penalty(logprob, ref_logprob):
    kl = torch.clamp(ref_logprob - logprob, min=-20, max=20)
    return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)


@pytest.mark.polgrad_conforms("grpo", kind="kl", checks=["value"])
def flipped(logprobs, ref_logprobs, response_mask):
    lr = torch.where(response_mask, logprobs - ref_logprobs, 0.0)
    return torch.exp(lr) - 1 - lr
"""


def test_marker_generates_kl_items_and_goldens(pytester) -> None:
    pytester.makepyfile(test_kl=MARKED)
    args = ("-p", "no:cacheprovider", "-p", "no:randomly", "--polgrad-max-examples=10")
    inline_run.run(pytester, *args, "--snapshot-update")
    result = inline_run.run(pytester, *args, "-rA")
    out = result.stdout.str()
    checks = ("value", "gradient", "masked-positions", "padding-values", "inputs-unchanged",
              "deterministic", "golden")  # fmt: skip
    for check in checks:
        assert f"PASSED test_kl.py::kl_penalty[grpo-{check}]" in out, out
    assert "FAILED test_kl.py::flipped[grpo-value]" in out
    assert "k3 with the sign of the log-ratio flipped" in out
    result.assert_outcomes(passed=len(checks), failed=1)


def k3_ratio_weighted(logprobs, ref_logprobs, old_logprobs, response_mask):
    """TRL 1.16.0 use_bias_correction_kl: per-token k3 times the (undetached) policy ratio."""
    ratio = torch.exp(torch.where(response_mask, logprobs - old_logprobs, 0.0))
    return ratio * k3(logprobs, ref_logprobs, response_mask)


def k3_ratio_detached(logprobs, ref_logprobs, old_logprobs, response_mask):
    ratio = torch.exp(torch.where(response_mask, logprobs - old_logprobs, 0.0)).detach()
    return ratio * k3(logprobs, ref_logprobs, response_mask)


def test_ratio_weighted_kl_passes_and_a_detached_ratio_is_named() -> None:
    undetached = {"overrides": {"ratio_weight": "undetached"}}
    for check in ("value", "gradient"):
        assert _run(k3_ratio_weighted, check, "grpo", **undetached).passed, check
    assert _run(k3_ratio_detached, "value", "grpo", **undetached).passed  # same value
    result = _run(k3_ratio_detached, "gradient", "grpo", **undetached)
    assert not result.passed
    assert "ratio-weighted (detached)" in result.diagnosis, result.diagnosis


def test_report_snippet_runs_standalone(capsys) -> None:
    result = _run(k3_sign_flipped, "value", "grpo")
    code = result.report.split("reproduce (standalone):", 1)[1].split("  replay", 1)[0]
    exec(compile(code, "snippet", "exec"), {})
    assert "reference:" in capsys.readouterr().out


def k3_plus_clamped(logprob, ref_logprob):
    """verl's order for 'k3+' with its clamp: clamped k3 value, k2's unclamped gradient."""
    kl = torch.clamp(ref_logprob - logprob, min=-20, max=20)
    value = torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)
    k2 = 0.5 * (logprob - ref_logprob).square()
    return k2 - k2.detach() + value.detach()


def test_clamped_straight_through_keeps_the_k2_gradient() -> None:
    for check in ("value", "gradient"):
        assert _run(k3_plus_clamped, check, "k3+", overrides={"clamp": 10}).passed, check


def _clamped(estimator: str, bound: float):
    """k1 or abs with the log-ratio clamped to ``[-bound, bound]`` (OpenRLHF 0.11.2
    ``compute_approx_kl`` clamps every estimator's value to +-10, k1 included)."""

    def fn(logprobs, ref_logprobs, response_mask):
        lr = torch.where(response_mask, logprobs - ref_logprobs, 0.0).clamp(-bound, bound)
        return lr.abs() if estimator == "abs" else lr

    fn.__name__ = f"{estimator}_clamped_{bound:g}"
    return fn


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16", "float16"])
@pytest.mark.parametrize("bound", [10.0, 20.0])
@pytest.mark.parametrize("estimator", ["k1", "abs"])
def test_a_clamp_at_a_shipped_bound_fails_on_the_corpus(estimator, bound, dtype) -> None:
    """Issue 27: the corpus reached log-ratios of +-9 only, so OpenRLHF's k1 clamped at
    +-10 passed every check at 100 examples; now one example (the corpus) shows it."""
    result = _run(_clamped(estimator, bound), "value", estimator, examples=1, dtype=dtype)
    assert not result.passed, result.report


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16", "float16"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("estimator", ["k1", "abs", "k2", "k3"])
def test_correct_estimators_pass_on_the_wide_corpus(estimator, seed, dtype) -> None:
    """The other side of the wider corpus and of k1/abs's tighter rounding bound (slope 1):
    correct estimators, computing in the inputs' dtype, pass value and gradient."""
    fn = {"k1": k1, "abs": lambda logprobs, ref_logprobs, response_mask: k1(
        logprobs, ref_logprobs, response_mask).abs(), "k2": k2, "k3": k3}[estimator]  # fmt: skip
    for check in ("value", "gradient"):
        opts = ConformanceOptions(estimator, kind="kl", dtype=dtype)
        result = run_check(build_context(fn, opts), check, max_examples=30, base_seed=seed)
        assert result.passed, result.report
