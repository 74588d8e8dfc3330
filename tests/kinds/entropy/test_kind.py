"""The entropy kind through the public API: correct per-token entropies and entropy bonuses
pass every check (float64, float32 internally, bfloat16 inputs), realistic wrong ones fail
with a diagnosis naming what they compute (docs/conformance.md, "Entropy")."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

from pytest_polgrad import assert_conforms
from pytest_polgrad.api import ConformanceError, ConformanceReport
from pytest_polgrad.core.options import MarkerError
from tests.helpers import inline_run

BUDGET = 10
T = torch.Tensor


def _run(fn: Callable[..., Any], reference: str = "entropy", **options: Any) -> ConformanceReport:
    try:
        return assert_conforms(
            fn, reference, kind="entropy", max_examples=BUDGET, seed=3, **options
        )
    except ConformanceError as exc:
        return exc.report


def _failed(report: ConformanceReport) -> dict[str, Any]:
    return {r.check: r for r in report.results if not r.passed}


def _token_mean(x: T, mask: T) -> T:
    return torch.where(mask, x, 0.0).sum() / mask.sum()


def entropy_verl_style(logits: T) -> T:
    """verl 0.9.1 ``entropy_from_logits`` (re-implemented): logsumexp - sum softmax * z."""
    p = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (p * logits).sum(dim=-1)


def per_token_ok(logits: T, response_mask: T) -> T:
    return entropy_verl_style(logits)


def per_token_log_softmax(logits: T, response_mask: T) -> T:
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def per_token_float32(logits: T, response_mask: T) -> T:
    return entropy_verl_style(logits.float()).to(logits.dtype)


def bonus_ok(logits: T, response_mask: T) -> T:
    return _token_mean(entropy_verl_style(logits), response_mask)


def per_token_no_max_shift(logits: T, response_mask: T) -> T:
    """log(sum exp z) without the shift: exp overflows for large logits."""
    logp = logits - torch.log(torch.exp(logits).sum(dim=-1, keepdim=True))
    return -(logp.exp() * logp).sum(dim=-1)


def per_token_bits(logits: T, response_mask: T) -> T:
    return entropy_verl_style(logits) / math.log(2.0)


def bonus_negated(logits: T, response_mask: T) -> T:
    return -bonus_ok(logits, response_mask)


def bonus_seq_mean(logits: T, response_mask: T) -> T:
    h = torch.where(response_mask, entropy_verl_style(logits), 0.0)
    return (h.sum(dim=1) / response_mask.sum(dim=1)).mean()


def bonus_padded_mean(logits: T, response_mask: T) -> T:
    return (entropy_verl_style(logits) * response_mask).mean()


def bonus_sum(logits: T, response_mask: T) -> T:
    return torch.where(response_mask, entropy_verl_style(logits), 0.0).sum()


def per_token_negated(logits: T, response_mask: T) -> T:
    return -entropy_verl_style(logits)


def per_token_wrong_dim(logits: T, response_mask: T) -> T:
    """softmax over the time axis instead of the vocabulary."""
    logp = torch.log_softmax(logits, dim=1)
    return -(logp.exp() * logp).sum(dim=-1)


def per_token_in_place_shift(logits: T, response_mask: T) -> T:
    """Shifts the caller's logits by their max in place to save memory."""
    logits.data.sub_(logits.detach().amax(dim=-1, keepdim=True))
    return entropy_verl_style(logits)


def per_token_global_shift(logits: T, response_mask: T) -> T:
    """One max over the whole tensor (padding included) instead of one per token."""
    z = logits - logits.detach().max()
    e = torch.exp(z)
    p = e / e.sum(dim=-1, keepdim=True)
    return -(p * torch.log(p)).sum(dim=-1)


class _Tempered:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, logits: T, response_mask: T) -> T:
        self.calls += 1  # a temperature schedule kept in the module
        return bonus_ok(logits / (1.0 + 0.01 * self.calls), response_mask)


_TEMPERED = _Tempered()


def bonus_tempered(logits: T, response_mask: T) -> T:
    return _TEMPERED(logits, response_mask)


@pytest.mark.parametrize(
    ("fn", "check", "words"),
    [
        (per_token_global_shift, "padding-values", "with other logits at padding"),
        (bonus_padded_mean, "padding-columns", "with 3 more padding columns"),
        (per_token_in_place_shift, "inputs-unchanged", "modified its input 'logits' in place"),
        (bonus_tempered, "deterministic", "different"),
    ],
    ids=lambda x: getattr(x, "__name__", None) or (x if isinstance(x, str) else None),
)
def test_structural_bugs_fail_the_check_that_names_them(
    fn: Callable[..., Any], check: str, words: str
) -> None:
    # one verdict: the named check alone (its pool, corpus, shrink and diagnosis are the
    # same as in a run of every check; the other checks' verdicts are not looked at)
    failed = _failed(_run(fn, checks=[check]))
    assert check in failed, sorted(failed)
    assert words in failed[check].message, failed[check].message


@pytest.mark.parametrize(
    ("fn", "options"),
    [
        (per_token_ok, {}),
        (per_token_log_softmax, {}),
        (per_token_float32, {}),
        (per_token_ok, {"dtype": "bfloat16"}),
        (per_token_float32, {"dtype": "float32"}),
        (bonus_ok, {}),
        (bonus_ok, {"dtype": "bfloat16"}),
        (bonus_seq_mean, {"aggregation": "seq-mean-token-mean"}),
        (bonus_negated, {"negate": True}),
    ],
    ids=lambda x: getattr(x, "__name__", None) or (str(sorted(x)) if isinstance(x, dict) else None),
)
def test_correct_entropies_pass_every_check(
    fn: Callable[..., Any], options: dict[str, Any]
) -> None:
    report = _run(fn, **options)
    assert report.ok, str(report)
    assert {r.check for r in report.results} >= {"value", "gradient", "large-logits"}


@pytest.mark.parametrize(
    ("fn", "check", "words"),
    [
        (per_token_bits, "value", "per-token H of the softmax in bits (log2)"),
        (bonus_negated, "value", "token-mean of -H of the softmax in nats"),
        (bonus_seq_mean, "value", "seq-mean-token-mean of H"),
        (bonus_padded_mean, "value", "token-sum-norm (padded width) of H"),
        (bonus_sum, "value", "token-sum of H of the softmax in nats"),
        (per_token_negated, "value", "per-token -H of the softmax in nats"),
    ],
    ids=lambda x: getattr(x, "__name__", None) or (x if isinstance(x, str) else None),
)
def test_wrong_entropies_are_flagged_with_a_diagnosis(
    fn: Callable[..., Any], check: str, words: str
) -> None:
    failed = _failed(_run(fn, checks=[check]))  # one verdict, as above
    assert check in failed, sorted(failed)
    assert words in failed[check].diagnosis, failed[check].diagnosis


def test_no_max_shift_fails_on_large_logits_only() -> None:
    failed = _failed(_run(per_token_no_max_shift))
    assert "large-logits" in failed and "value" not in failed, sorted(failed)
    assert "inf" in failed["large-logits"].message or "nan" in failed["large-logits"].message


def test_softmax_over_the_wrong_axis_matches_nothing() -> None:
    failed = _failed(_run(per_token_wrong_dim))
    assert {"value", "gradient"} <= set(failed)
    assert "no candidate entropy matches" in failed["value"].diagnosis


def test_bad_options_are_marker_errors() -> None:
    with pytest.raises(MarkerError, match="did you mean 'negate'"):
        assert_conforms(bonus_ok, "entropy", kind="entropy", negat=True, max_examples=1)
    with pytest.raises(MarkerError, match="did you mean 'entropy'"):
        assert_conforms(bonus_ok, "entropyy", kind="entropy", max_examples=1)
    with pytest.raises(MarkerError, match="layout='right'"):
        assert_conforms(bonus_ok, "entropy", kind="entropy", layout="left", max_examples=1)


# ---------------------------------------------------------------- the marker (pytester)

pytest_plugins = ["pytester"]

MARKED = """
import pytest
import torch


@pytest.mark.polgrad_conforms("entropy", kind="entropy")
def good(logits, response_mask):
    logp = torch.log_softmax(logits, dim=-1)
    h = -(logp.exp() * logp).sum(dim=-1)
    return torch.where(response_mask, h, 0.0).sum() / response_mask.sum()


@pytest.mark.polgrad_conforms("entropy", kind="entropy", checks=["value"])
def negated(logits, response_mask):
    return -good(logits, response_mask)
"""


def test_the_marker_generates_items_goldens_and_a_diagnosis(pytester: pytest.Pytester) -> None:
    import json

    pytester.makepyfile(test_ent=MARKED)
    args = ("-p", "no:cacheprovider", "--polgrad-max-examples=8", "-p", "no:randomly")
    inline_run.run(pytester, *args, "--snapshot-update", "-k", "good").assert_outcomes(passed=8)
    report = pytester.path / "report.json"
    result = inline_run.run(pytester, *args, f"--polgrad-report={report}")
    result.assert_outcomes(passed=8, failed=1)
    assert "token-mean of -H of the softmax in nats" in result.stdout.str()
    rows = json.loads(report.read_text())
    assert "test_ent.py::good[entropy-golden]" in {r["nodeid"] for r in rows}
    assert {r["kind"] for r in rows} == {"entropy"}
