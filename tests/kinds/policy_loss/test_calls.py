"""How the function under test is called: verdicts for misbehaving functions, return
values, layouts at the edge, and the KL term following the signature."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from pytest_polgrad.core.engine import build_context, run_check
from pytest_polgrad.core.options import parse_marker
from tests.helpers.sample_losses import dapo, grpo_no_kl

Tensor = torch.Tensor


def _run(fn: Any, reference: str = "dapo", check: str = "value", **options: Any) -> Any:
    ctx = build_context(fn, parse_marker((reference,), options))
    return run_check(ctx, check, max_examples=40, base_seed=0, diagnose=False)


def _raises(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    raise ValueError("cannot handle this batch")


def _per_token(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    return logprobs * advantages[:, None]


def _nan(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    return dapo(logprobs, old_logprobs, advantages, response_mask) * float("nan")


def _integer(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    return response_mask.sum()


def _python_float(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> float:
    return float(dapo(logprobs, old_logprobs, advantages, response_mask))


def _detached(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    return dapo(logprobs.detach(), old_logprobs, advantages, response_mask)


@pytest.mark.parametrize(
    ("fn", "check", "words"),
    [
        (_raises, "value", "the function raised on a valid batch: ValueError: cannot handle"),
        (_per_token, "value", "returned a tensor of shape [1, 1]; the loss must be a scalar"),
        (_nan, "value", "the function returned nan for a valid batch"),
        (_integer, "value", "returned a torch.int64 tensor; the loss must be floating"),
        (_python_float, "value", "returned float"),
        (_detached, "gradient", "not differentiable in logprobs"),
    ],
    ids=["raises", "non-scalar", "nan", "integer", "python-float", "detached"],
)
def test_misbehaving_functions_get_a_verdict(fn: Any, check: str, words: str) -> None:
    result = _run(fn, check=check)
    assert not result.passed
    assert words in result.report
    assert "Traceback" not in result.report
    assert "B=1, T=1" in result.report  # shrunk to the smallest batch


def test_tuple_and_dict_returns() -> None:
    def as_tuple(**kw: Tensor) -> tuple[Tensor, dict[str, float]]:
        return dapo(**kw), {"clipfrac": 0.0}

    def as_dict(**kw: Tensor) -> dict[str, Tensor]:
        return {"policy_loss": dapo(**kw), "entropy": torch.zeros(())}

    assert _run(as_tuple).passed
    assert _run(as_dict, loss="policy_loss").passed
    missing = _run(as_dict)
    assert "returned a dict without key 'loss' (keys: ['entropy', 'policy_loss'])" in missing.report


def _assumes_prefix(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """Wrong for left padding: rebuilds the mask as a prefix of each row's length."""
    width = response_mask.shape[1]
    prefix = torch.arange(width)[None, :] < response_mask.sum(dim=1, keepdim=True)
    return dapo(logprobs, old_logprobs, advantages, prefix)


def _packed(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    cu_seqlens: Tensor,
) -> Tensor:
    """DAPO over 1-D streams: advantages [B] expanded with the row lengths."""
    assert logprobs.dim() == 1 and cu_seqlens.dtype == torch.int32
    per_row = advantages.repeat_interleave((cu_seqlens[1:] - cu_seqlens[:-1]).long())
    ratio = torch.exp(torch.where(response_mask, logprobs - old_logprobs, 0.0))
    per = torch.maximum(-per_row * ratio, -per_row * ratio.clamp(0.8, 1.28))
    return torch.where(response_mask, per, 0.0).sum() / response_mask.sum()


def test_layouts_at_the_edge() -> None:
    for check in ("value", "gradient", "masked-positions", "inputs-unchanged"):
        assert _run(dapo, check=check, layout="left").passed, check  # all via the mask
        assert _run(_packed, check=check, layout="packed").passed, check
    assert _run(_assumes_prefix, layout="right").passed
    assert not _run(_assumes_prefix, layout="left").passed


def _grpo_with_kl(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    ref_logprobs: Tensor,
) -> Tensor:
    """GRPO as in the paper: policy term plus 0.04 * k3, both seq-mean-token-mean."""
    lr = torch.where(response_mask, ref_logprobs - logprobs, 0.0)
    k3 = torch.where(response_mask, torch.exp(lr) - 1 - lr, 0.0)
    kl = (k3.sum(dim=1) / response_mask.sum(dim=1)).mean()
    return grpo_no_kl(logprobs, old_logprobs, advantages, response_mask) + 0.04 * kl


def _grpo_ignoring_ref(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    ref_logprobs: Tensor,
) -> Tensor:
    return grpo_no_kl(logprobs, old_logprobs, advantages, response_mask)


def test_kl_term_follows_the_signature() -> None:
    with_kl = _run(_grpo_with_kl, "grpo")
    assert with_kl.passed and not any(
        "without the reference's as-loss KL" in n for n in with_kl.notes
    )
    assert _run(_grpo_with_kl, "grpo", check="gradient").passed
    without = _run(grpo_no_kl, "grpo")
    assert without.passed
    assert any("without the reference's as-loss KL term" in n for n in without.notes)
    assert not _run(_grpo_ignoring_ref, "grpo").passed


SNIPPETS: dict[str, tuple[str, str, str, dict[str, Any]]] = {
    # case: (wrong loss, reference, check, options)
    "right": ("dapo_wrong_eps", "dapo", "value", {"layout": "right"}),
    "left": ("dapo_wrong_eps", "dapo", "value", {"layout": "left"}),
    "packed": ("dapo_wrong_eps", "dapo", "value", {"layout": "packed"}),
    "gradient": ("cispo_no_stop_gradient", "cispo", "gradient", {"eps_high": 2.0}),
    "inputs-unchanged": ("dapo_inplace", "dapo", "inputs-unchanged", {}),
}


@pytest.fixture(scope="module")
def snippets_ran(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``{case: (report, stdout)}``: each case's failing report, and what its reproduce
    snippet printed, run from the repository root; every snippet runs in one fresh
    interpreter (tests/helpers/snippet_driver.py). A report that could not be made is the
    failure of its case only (``(None, traceback)``)."""
    import traceback
    from pathlib import Path

    from tests.helpers import sample_losses
    from tests.helpers.snippet_driver import run_snippets

    root = str(Path(__file__).parents[3])
    made: dict[str, Any] = {}
    jobs = []
    for case, (name, reference, check, options) in SNIPPETS.items():
        try:
            result = _run(getattr(sample_losses, name), reference, check, **options)
            assert not result.passed, f"{name} passed {check}"
            text = result.report.split("reproduce (standalone):\n", 1)[1]
            code = text.split("  replay")[0]
        except Exception:
            made[case] = (None, traceback.format_exc())
            continue
        made[case] = (result.report, code)
        jobs.append((case, code, root))
    stdout = run_snippets(jobs, tmp_path_factory.mktemp("conformance_snippets"))
    return {case: (r, stdout[case] if r is not None else c) for case, (r, c) in made.items()}


def _snippet_output(snippets_ran: dict[str, Any], case: str) -> str:
    report, stdout = snippets_ran[case]
    if report is None:
        pytest.fail(stdout, pytrace=False)
    assert not stdout.startswith("FAILED"), stdout
    return str(stdout)


@pytest.mark.parametrize("layout", ["right", "left", "packed"])
def test_the_report_snippet_runs_standalone(layout: str, snippets_ran: dict[str, Any]) -> None:
    """The reproduce snippet rebuilds the shrunk batch, calls the function and the
    reference, and prints both numbers (run in a fresh interpreter)."""
    out = _snippet_output(snippets_ran, layout)
    printed = out.split()
    fn_value, ref_value = float(printed[1]), float(printed[3])
    assert fn_value != pytest.approx(ref_value, rel=1e-6)  # the snippet reproduces the finding
    assert "largest gradient difference at a response position" in out


def test_snippet_shows_what_the_check_compared(snippets_ran: dict[str, Any]) -> None:
    for case, shown in (
        ("gradient", "largest gradient difference"),
        ("inputs-unchanged", "inputs modified in place: ['old_logprobs']"),
    ):
        out = _snippet_output(snippets_ran, case)
        assert shown in out, (case, out)
        if case == "gradient":
            line = next(x for x in out.splitlines() if "largest gradient difference" in x)
            assert float(line.split(":")[1].split()[0]) > 1e-6


def _gspo(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """GSPO written by hand: length-normalised sequence ratio, clip 3e-4 / 4e-4."""
    lengths = response_mask.sum(dim=1)
    seq_log_ratio = torch.where(response_mask, logprobs - old_logprobs, 0.0).sum(dim=1) / lengths
    s = torch.exp(seq_log_ratio)
    per_seq = torch.maximum(-advantages * s, -advantages * s.clamp(1 - 3e-4, 1 + 4e-4))
    return per_seq.mean()


@pytest.mark.parametrize("reference", ["gspo", "gspo_token"])
def test_gspo_losses_pass_every_applicable_check(reference: str) -> None:
    from pytest_polgrad.core.engine import applicable_checks, resolve_config

    opts = parse_marker((reference,), {})
    for check in applicable_checks(resolve_config(opts), opts):
        result = _run(_gspo, reference, check)
        assert result.passed, result.report


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kl_gradient_tolerance_in_float32(seed: int) -> None:
    """k3's gradient, exp(ref - lp) - 1, cancels for ref close to lp: float32 rounding of
    a correct loss must stay within tolerance (review finding)."""
    from tests.kinds.policy_loss.test_calls import _grpo_with_kl as loss

    for check in ("gradient", "on-policy"):
        ctx = build_context(loss, parse_marker(("grpo",), {"dtype": "float32"}))
        result = run_check(ctx, check, max_examples=150, base_seed=seed, diagnose=False)
        assert result.passed, result.report


def test_float16_extreme_domain_stays_representable() -> None:
    assert _run(dapo, check="extreme-finite", dtype="float16").passed


def test_assert_conforms_rejects_checks_that_do_not_run() -> None:
    from pytest_polgrad import assert_conforms

    with pytest.raises(ValueError, match="golden runs only under pytest"):
        assert_conforms(dapo, "dapo", checks=["golden"])
    with pytest.raises(ValueError, match=r"expect= names \['micro-batch'\]"):
        assert_conforms(dapo, "dapo", expect={"micro-batch": "n/a"})


def _multiplies_by_mask(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """Correct for finite padding, but NaN * 0 = NaN: padding NaN leaks through."""
    m = response_mask.to(logprobs.dtype)
    ratio = torch.exp((logprobs - old_logprobs) * m)
    a = advantages[:, None]
    per = torch.maximum(-a * ratio, -a * ratio.clamp(0.8, 1.28))
    return (per * m).sum() / m.sum()


def test_padding_nan_option() -> None:
    assert _run(_multiplies_by_mask, check="padding-values").passed
    nan = _run(_multiplies_by_mask, check="padding-values", padding_nan=True)
    assert not nan.passed and "the function returned nan for a valid batch" in nan.report
    assert _run(dapo, check="padding-values", padding_nan=True).passed  # masks with where


def test_diagnosis_notices_a_batch_dependent_deviation() -> None:
    """A loss correct on short rows but truncating past 64 tokens: the corpus match is
    reported together with the fact that it fails on the (long) failing batch."""

    def truncating(
        logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
    ) -> Tensor:
        cut = slice(None), slice(0, 64)
        return dapo(logprobs[cut], old_logprobs[cut], advantages, response_mask[cut])

    ctx = build_context(truncating, parse_marker(("dapo",), {}))
    result = run_check(ctx, "value", max_examples=100, base_seed=0)
    assert not result.passed
    assert "matches token-mean, token ratio, pg_clip eps 0.2/0.28, no KL term — dapo" in (
        result.diagnosis
    )
    assert "does not hold on the failing batch (B=1, T=65)" in result.diagnosis


def test_reference_as_a_config_and_the_tolerance_multiplier() -> None:
    from polgrad_reference import ClipConfig, PolicyLossConfig

    config = PolicyLossConfig(clip=ClipConfig(0.2, 0.28), aggregation="token-mean")  # type: ignore[arg-type]
    opts = parse_marker((config,), {})
    assert opts.reference_id == "custom"
    assert run_check(build_context(dapo, opts), "value", max_examples=30, base_seed=0).passed

    def off_by_1e3(**kw: Tensor) -> Tensor:
        return dapo(**kw) * (1 + 1e-3)

    assert not _run(off_by_1e3).passed
    assert _run(off_by_1e3, tolerance=1e3).passed
