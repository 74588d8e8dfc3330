"""``pytest_polgrad.frameworks.trl.grpo_loss`` takes ``ref_logprobs`` only when TRL reads
them (``beta != 0``): at TRL's default ``beta=0.0`` a marker naming ``"grpo"`` must then
compare with the reference's loss without its KL term (a false alarm otherwise)."""

from __future__ import annotations

import inspect

from pytest_polgrad.api import assert_conforms
from pytest_polgrad.frameworks import trl


def test_grpo_loss_takes_ref_logprobs_only_with_beta() -> None:
    assert "ref_logprobs" not in inspect.signature(trl.grpo_loss(loss_type="grpo")).parameters
    with_kl = inspect.signature(trl.grpo_loss(loss_type="grpo", beta=0.04)).parameters
    assert "ref_logprobs" in with_kl
    assert with_kl["ref_logprobs"].default is inspect.Parameter.empty


def test_grpo_loss_at_default_beta_conforms_to_grpo() -> None:
    assert_conforms(
        trl.grpo_loss(loss_type="grpo"),
        "grpo",
        checks=["value", "gradient", "on-policy"],
        max_examples=20,
    )
