"""Diagnosis notes say only what is true of the match: the KL kind's note on k3's gradient
appears for k3 itself, not for a k3 with the ratio inverted; an unstated-constant line
quotes each knob's own registry note, and a knob no note leaves open (a dual clip for
grpo) is not excused."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from polgrad_reference import ALGORITHMS, get_algorithm
from pytest_polgrad.core.engine import build_context, run_check
from pytest_polgrad.core.options import ConformanceOptions, parse_marker
from pytest_polgrad.kinds.policy_loss.diagnose.diagnosis import Explanation, explain
from tests.helpers.sample_losses import reference_loss

_K3_NOTE = "k3's gradient is not the gradient of KL(pi || ref)"


def _kl_diagnosis(fn: Any, check: str, reference: str) -> str:
    opts = ConformanceOptions(reference, kind="kl")
    result = run_check(build_context(fn, opts), check, max_examples=15, base_seed=0)
    assert not result.passed, result.report
    return result.diagnosis


def _k3_flipped(logprobs, ref_logprobs, response_mask):  # type: ignore[no-untyped-def]
    """k3 with the ratio inverted: exp(logprobs - ref) - 1 - (logprobs - ref)."""
    lr = torch.where(response_mask, logprobs - ref_logprobs, 0.0)
    return torch.expm1(lr) - lr


def _k3(logprobs, ref_logprobs, response_mask):  # type: ignore[no-untyped-def]
    lr = torch.where(response_mask, ref_logprobs - logprobs, 0.0)
    return torch.expm1(lr) - lr


@pytest.mark.parametrize("check", ["value", "gradient"])
def test_flipped_k3_match_gets_no_k3_gradient_note(check: str) -> None:
    # its gradient r - 1 (r = pi / ref) is, in expectation, half the gradient of the
    # chi-squared divergence, not the forward KL's: the k3 note would be false here
    text = _kl_diagnosis(_k3_flipped, check, "grpo")
    assert "k3 with the sign of the log-ratio flipped" in text, text
    assert _K3_NOTE not in text, text


def test_k3_match_keeps_its_gradient_note() -> None:
    # k3 differentiated as a loss, judged against k3+ (straight-through): the note is true
    text = _kl_diagnosis(_k3, "gradient", "k3+")
    assert _K3_NOTE in text, text


def _explain(fn: Any, reference: str) -> Explanation:
    opts = parse_marker((reference,), {})
    ctx = build_context(fn, opts)
    return explain(ctx.fut, ctx.config, ctx.tolerance, reference=reference, reference_id=reference)


def _note(reference: str, knob: str) -> str:
    return next(u.note for u in ALGORITHMS[reference].unstated if u.knob == knob)


def test_a_dual_clip_is_not_excused_by_the_eps_note() -> None:
    # grpo's registry leaves eps open ("clip"), not a dual clip: no unstated-constant line
    cfg = get_algorithm("grpo").derive(kl=None, dual_clip=3.0).loss
    found = _explain(reference_loss(cfg), "grpo")
    assert found.best is not None and "dual-clip 3" in found.summary, found.text
    assert "does not publish" not in found.text, found.text
    assert _note("grpo", "clip") not in found.text


def test_an_eps_difference_quotes_the_eps_note() -> None:
    cfg = get_algorithm("grpo").derive(kl=None, eps_low=0.3, eps_high=0.3).loss
    found = _explain(reference_loss(cfg), "grpo")
    assert "does not publish" in found.text, found.text
    assert f"clip.eps_low (registry value 'eps_low=eps_high=0.2': {_note('grpo', 'clip')})" in (
        found.text
    )
    assert '@pytest.mark.polgrad_conforms("grpo", eps_low=0.3, eps_high=0.3)' in found.text
    # a typo'd eps is not only told how to silence the failure
    assert "not the registry's value: if that is a mistake, it is the bug" in found.text


def test_eps_and_dual_clip_together_are_not_excused() -> None:
    cfg = get_algorithm("grpo").derive(kl=None, eps_low=0.3, eps_high=0.3, dual_clip=3.0).loss
    found = _explain(reference_loss(cfg), "grpo")
    assert found.best is not None and "dual-clip 3" in found.summary, found.text
    assert "does not publish" not in found.text, found.text


def test_each_knob_quotes_its_own_note() -> None:
    # dr_grpo leaves both its budget and its eps open, with different notes
    cfg = get_algorithm("dr_grpo").derive(budget=1024, eps_low=0.3, eps_high=0.3).loss
    found = _explain(reference_loss(cfg), "dr_grpo")
    assert "does not publish" in found.text, found.text
    budget, eps = _note("dr_grpo", "budget"), _note("dr_grpo", "clip")
    assert f"budget (registry value 4096: {budget})" in found.text, found.text
    assert f"clip.eps_low (registry value 'eps_low=eps_high=0.2': {eps})" in found.text
    assert f"clip.eps_high (registry value 'eps_low=eps_high=0.2': {eps})" in found.text
    line = '@pytest.mark.polgrad_conforms("dr_grpo", eps_low=0.3, eps_high=0.3, budget=1024)'
    assert line in found.text, found.text
