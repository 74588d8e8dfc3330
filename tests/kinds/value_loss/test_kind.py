"""The value-loss kind through the public API: correct critic losses pass every check
(float64, float32 internally, bfloat16 inputs, left padding), realistic wrong ones fail
with a diagnosis naming what they compute (docs/conformance.md, "Value loss")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from pytest_polgrad import assert_conforms
from pytest_polgrad.api import ConformanceError, ConformanceReport
from pytest_polgrad.core.options import MarkerError
from tests.helpers import inline_run

BUDGET = 12
T = torch.Tensor


def _run(fn: Callable[..., Any], reference: str, **options: Any) -> ConformanceReport:
    try:
        return assert_conforms(
            fn, reference, kind="value_loss", max_examples=BUDGET, seed=2, **options
        )
    except ConformanceError as exc:
        return exc.report


def _failed(report: ConformanceReport) -> dict[str, Any]:
    return {r.check: r for r in report.results if not r.passed}


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, x, 0.0).sum() / mask.sum()


def _clipped(values: torch.Tensor, old_values: torch.Tensor, clip: float) -> torch.Tensor:
    return old_values + (values - old_values).clamp(-clip, clip)


def value_loss_verl_style(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    clip: float = 0.2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl 0.9.1's convention (re-implemented): 0.5 * agg(max(l1, l2)), returns a tuple."""
    l1 = (values - returns) ** 2
    l2 = (_clipped(values, old_values, clip) - returns) ** 2
    frac = _masked_mean((l2 > l1).to(values.dtype), response_mask)
    return 0.5 * _masked_mean(torch.maximum(l1, l2), response_mask), frac


def value_loss_ok(values: T, old_values: T, returns: T, response_mask: T) -> T:
    return value_loss_verl_style(values, old_values, returns, response_mask)[0]


def value_loss_float32(values: T, old_values: T, returns: T, response_mask: T) -> T:
    args = (values.float(), old_values.float(), returns.float())
    return value_loss_verl_style(*args, response_mask)[0].to(values.dtype)


def value_loss_clip05(values: T, old_values: T, returns: T, response_mask: T) -> T:
    return value_loss_verl_style(values, old_values, returns, response_mask, clip=0.5)[0]


def value_loss_min(values: T, old_values: T, returns: T, response_mask: T) -> T:
    """The clip on the wrong side: min of the two terms (optimistic)."""
    l1 = (values - returns) ** 2
    l2 = (_clipped(values, old_values, 0.2) - returns) ** 2
    return 0.5 * _masked_mean(torch.minimum(l1, l2), response_mask)


def value_loss_no_half(values: T, old_values: T, returns: T, response_mask: T) -> T:
    return 2.0 * value_loss_ok(values, old_values, returns, response_mask)


def value_loss_unclipped(values: T, old_values: T, returns: T, response_mask: T) -> T:
    return 0.5 * _masked_mean((values - returns) ** 2, response_mask)


def value_loss_seq_mean(values: T, old_values: T, returns: T, response_mask: T) -> T:
    l1 = (values - returns) ** 2
    l2 = (_clipped(values, old_values, 0.2) - returns) ** 2
    per = torch.where(response_mask, torch.maximum(l1, l2), 0.0)
    return 0.5 * (per.sum(dim=1) / response_mask.sum(dim=1)).mean()


def value_loss_padded_mean(values: T, old_values: T, returns: T, response_mask: T) -> T:
    """Masks by multiplication, then averages over every position, padding included."""
    l1 = (values - returns) ** 2
    l2 = (_clipped(values, old_values, 0.2) - returns) ** 2
    return 0.5 * (torch.maximum(l1, l2) * response_mask).mean()


def value_loss_clip_returns(values: T, old_values: T, returns: T, response_mask: T) -> T:
    """Clips around the returns instead of the old values."""
    l1 = (values - returns) ** 2
    l2 = (_clipped(values, returns, 0.2) - returns) ** 2
    return 0.5 * _masked_mean(torch.maximum(l1, l2), response_mask)


def value_loss_capped(values: T, old_values: T, returns: T, response_mask: T) -> T:
    """A 'robust' cap of the per-token loss at 100: wrong once errors are large."""
    l1 = (values - returns) ** 2
    l2 = (_clipped(values, old_values, 0.2) - returns) ** 2
    return 0.5 * _masked_mean(torch.maximum(l1, l2).clamp(max=100.0), response_mask)


def value_loss_return_scaled(values: T, old_values: T, returns: T, response_mask: T) -> T:
    """Scales the returns by their mean magnitude over the whole padded tensor."""
    scale = returns.abs().mean().detach() / _masked_mean(returns.abs(), response_mask).detach()
    return value_loss_ok(values, old_values, returns * scale, response_mask)


def value_loss_in_place(values: T, old_values: T, returns: T, response_mask: T) -> T:
    loss = value_loss_ok(values, old_values, returns, response_mask)
    returns.mul_(0.5)  # reuses the caller's buffer
    return loss


class _Stateful:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, values: T, old_values: T, returns: T, response_mask: T) -> T:
        self.calls += 1  # a loss scale that alternates between calls (a stale buffer)
        factor = 1.0 + 0.25 * (self.calls % 2)
        return factor * value_loss_ok(values, old_values, returns, response_mask)


_STATEFUL = _Stateful()


def value_loss_stateful(values: T, old_values: T, returns: T, response_mask: T) -> T:
    return _STATEFUL(values, old_values, returns, response_mask)


@pytest.mark.parametrize(
    ("fn", "check", "words"),
    [
        (value_loss_capped, "extreme-values", "differs from the reference"),
        (value_loss_return_scaled, "padding-values", "with other values at padding"),
        (value_loss_padded_mean, "padding-columns", "with 3 more padding columns"),
        (value_loss_in_place, "inputs-unchanged", "modified its input 'returns' in place"),
        (value_loss_stateful, "deterministic", "different"),
    ],
    ids=lambda x: getattr(x, "__name__", None) or (x if isinstance(x, str) else None),
)
def test_structural_bugs_fail_the_check_that_names_them(
    fn: Callable[..., Any], check: str, words: str
) -> None:
    # one verdict: the named check alone (its pool, corpus, shrink and diagnosis are the
    # same as in a run of every check; the other checks' verdicts are not looked at)
    failed = _failed(_run(fn, "ppo", checks=[check]))
    assert check in failed, sorted(failed)
    assert words in failed[check].message, failed[check].message


@pytest.mark.parametrize(
    ("fn", "reference", "options"),
    [
        (value_loss_ok, "ppo", {}),
        (value_loss_verl_style, "ppo", {}),
        (value_loss_float32, "ppo", {}),
        (value_loss_ok, "ppo", {"dtype": "bfloat16"}),
        (value_loss_float32, "ppo", {"dtype": "float32"}),
        (value_loss_ok, "ppo", {"layout": "left"}),
        (value_loss_clip05, "verl", {}),
        (value_loss_unclipped, "unclipped", {}),
        (value_loss_seq_mean, "ppo", {"aggregation": "seq-mean-token-mean"}),
    ],
    ids=lambda x: getattr(x, "__name__", None) or (x if isinstance(x, str) else None),
)
def test_correct_value_losses_pass_every_check(
    fn: Callable[..., Any], reference: str, options: dict[str, Any]
) -> None:
    report = _run(fn, reference, **options)
    assert report.ok, str(report)
    assert {r.check for r in report.results} >= {"value", "gradient", "padding-values"}


@pytest.mark.parametrize(
    ("fn", "check", "words"),
    [
        (value_loss_no_half, "value", "x 1 (no 1/2)"),
        (value_loss_unclipped, "value", "unclipped squared error x 1/2, token-mean — unclipped"),
        (value_loss_clip05, "value", "clipped at +-0.5 squared error x 1/2, token-mean — verl"),
        (value_loss_seq_mean, "value", "seq-mean-token-mean"),
        (value_loss_padded_mean, "value", "token-sum-norm (padded width)"),
    ],
    ids=lambda x: getattr(x, "__name__", None) or (x if isinstance(x, str) else None),
)
def test_wrong_value_losses_are_flagged_with_a_diagnosis(
    fn: Callable[..., Any], check: str, words: str
) -> None:
    failed = _failed(_run(fn, "ppo", checks=[check]))  # one verdict, as above
    assert check in failed, sorted(failed)
    assert words in failed[check].diagnosis, failed[check].diagnosis


def test_clip_on_the_wrong_side_fails_value_and_gradient() -> None:
    failed = _failed(_run(value_loss_min, "ppo"))
    assert {"value", "gradient"} <= set(failed), sorted(failed)
    assert "no candidate value loss matches" in failed["value"].diagnosis


def test_clipping_around_the_returns_is_diagnosed_as_unclipped() -> None:
    """``(clip(V, R - c, R + c) - R)^2 = min((V - R)^2, c^2) <= (V - R)^2``: the max is
    always the unclipped term, and the diagnosis says so."""
    failed = _failed(_run(value_loss_clip_returns, "ppo"))
    assert "value" in failed
    assert "matches unclipped squared error x 1/2, token-mean" in failed["value"].diagnosis


def test_bad_overrides_are_marker_errors() -> None:
    with pytest.raises(MarkerError, match=r"did you mean 'clip_range'"):
        assert_conforms(value_loss_ok, "ppo", kind="value_loss", clip_rang=0.2, max_examples=1)
    with pytest.raises(MarkerError, match="clip_range must be a positive number"):
        assert_conforms(value_loss_ok, "ppo", kind="value_loss", clip_range=-1, max_examples=1)
    with pytest.raises(MarkerError, match="needs budget"):
        assert_conforms(
            value_loss_ok, "ppo", kind="value_loss", aggregation="token-sum-norm", max_examples=1
        )


# ---------------------------------------------------------------- the marker (pytester)

pytest_plugins = ["pytester"]

MARKED = """
import pytest
import torch


def _loss(values, old_values, returns, response_mask, half=0.5):
    clipped = old_values + (values - old_values).clamp(-0.2, 0.2)
    per = torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)
    return half * torch.where(response_mask, per, 0.0).sum() / response_mask.sum()


@pytest.mark.polgrad_conforms("ppo", kind="value_loss")
def good(values, old_values, returns, response_mask):
    return _loss(values, old_values, returns, response_mask)


@pytest.mark.polgrad_conforms("ppo", kind="value_loss", checks=["value"])
def no_half(values, old_values, returns, response_mask):
    return _loss(values, old_values, returns, response_mask, half=1.0)
"""


def test_the_marker_generates_items_goldens_and_a_diagnosis(pytester: pytest.Pytester) -> None:
    import json

    pytester.makepyfile(test_vf=MARKED)
    args = ("-p", "no:cacheprovider", "--polgrad-max-examples=8", "-p", "no:randomly")
    inline_run.run(pytester, *args, "--snapshot-update", "-k", "good").assert_outcomes(passed=8)
    report = pytester.path / "report.json"
    result = inline_run.run(pytester, *args, f"--polgrad-report={report}")
    result.assert_outcomes(passed=8, failed=1)
    assert "x 1 (no 1/2)" in result.stdout.str()
    rows = json.loads(report.read_text())
    assert "test_vf.py::good[ppo-golden]" in {r["nodeid"] for r in rows}
    assert {r["kind"] for r in rows} == {"value_loss"}
