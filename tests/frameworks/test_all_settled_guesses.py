"""The guesses a new-user trial made about the frameworks (issue 27, section 2), each
settled in docs/frameworks.md or docs/conformance.md and shown here on the released
verl 0.9.1 and TRL 1.16.0."""

from __future__ import annotations

from typing import Any

import torch

from pytest_polgrad import ConformanceError, assert_conforms
from pytest_polgrad.frameworks import trl, verl

Tensor = torch.Tensor


def _failed(fn: Any, reference: Any, **options: Any) -> list[str]:
    options.setdefault("max_examples", 3)
    try:
        report = assert_conforms(fn, reference, **options)
    except ConformanceError as exc:
        report = exc.report
    return sorted(r.check for r in report.results if not r.passed)


def test_verl_token_sum_norm_default_is_dr_grpo_times_the_width() -> None:
    """verl's ``seq-mean-token-sum-norm`` without ``loss_scale_factor`` is Dr.GRPO (with
    verl's dual clip) divided by the padded width: times ``T`` it is Dr.GRPO at
    ``budget=1`` on every check, ``padding-columns`` included; unscaled it fails there."""
    loss = verl.policy_loss("vanilla", loss_agg_mode="seq-mean-token-sum-norm")

    def times_width(
        logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
    ) -> Tensor:
        out = loss(
            logprobs=logprobs,
            old_logprobs=old_logprobs,
            advantages=advantages,
            response_mask=response_mask,
        )
        return out * response_mask.shape[-1]

    options = {
        "budget": 1,
        "dual_clip": 3.0,
        "advantages": "token",
        "checks": ("value", "gradient", "padding-columns"),
    }
    assert _failed(times_width, "dr_grpo", **options) == []
    assert "padding-columns" in _failed(loss, "dr_grpo", **options)


def test_verl_loss_scale_factor_takes_effect_in_global_batch_info_only() -> None:
    """Called directly, verl's losses read ``loss_scale_factor`` from
    ``config.global_batch_info`` (the actor copies ``ActorConfig.loss_scale_factor`` there
    before each micro-batch): there it is Dr.GRPO's fixed budget, while the
    ``ActorConfig`` field alone leaves the padded width (``padding-columns`` fails)."""
    options = {
        "budget": 4096,
        "dual_clip": 3.0,
        "advantages": "token",
        "checks": ("value", "gradient", "padding-columns"),
    }
    in_batch_info = verl.policy_loss(
        "vanilla",
        loss_agg_mode="seq-mean-token-sum-norm",
        global_batch_info={"loss_scale_factor": 4096},
    )
    field_only = verl.policy_loss(
        "vanilla", loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=4096
    )
    assert _failed(in_batch_info, "dr_grpo", **options) == []
    assert "padding-columns" in _failed(field_only, "dr_grpo", **options)


_GSPO_EPS: dict[str, Any] = {"epsilon": 3e-4, "epsilon_high": 4e-4}


def test_trl_gspo_is_loss_type_grpo_at_the_sequence_level() -> None:
    """TRL's GSPO is ``loss_type="grpo"`` with ``importance_sampling_level="sequence"``
    (eps 3e-4 / 4e-4): it conforms to ``gspo``. The default ``loss_type="dapo"`` at the
    sequence level is a token mean of the sequence terms, and does not."""
    checks = ("value", "gradient")
    gspo = trl.grpo_loss(loss_type="grpo", importance_sampling_level="sequence", **_GSPO_EPS)
    dapo = trl.grpo_loss(loss_type="dapo", importance_sampling_level="sequence", **_GSPO_EPS)
    assert _failed(gspo, "gspo", checks=checks) == []
    assert "value" in _failed(dapo, "gspo", checks=checks)


def test_trl_luspo_needs_the_sequence_level() -> None:
    """TRL's ``loss_type="luspo"`` is LUSPO only with
    ``importance_sampling_level="sequence"``; at TRL's default ``"token"`` it only logs a
    warning and computes a token-ratio loss, which fails ``luspo``."""
    checks = ("value", "gradient")
    reference = {"eps_low": 0.2, "eps_high": 0.2}  # TRL's epsilon defaults
    sequence = trl.grpo_loss(loss_type="luspo", importance_sampling_level="sequence")
    token = trl.grpo_loss(loss_type="luspo")
    assert _failed(sequence, "luspo", checks=checks, **reference) == []
    assert _failed(token, "luspo", checks=checks, **reference) != []
