"""Diagnosis: the candidate space reaches what frameworks ship, value and gradient are
scored separately, and constants a source leaves unstated are named with the marker line
that declares them (issue 14, "Diagnosis")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from polgrad_reference import (
    ClipBounds,
    ClipConfig,
    KLEstimator,
    KLRatioWeight,
    get_algorithm,
)
from pytest_polgrad.core.calls import FunctionUnderTest
from pytest_polgrad.core.engine import resolve_config
from pytest_polgrad.core.options import parse_marker
from pytest_polgrad.core.tolerance import Tolerance
from pytest_polgrad.kinds.policy_loss.diagnose.diagnosis import Explanation, diagnose, explain
from tests.helpers.sample_losses import reference_loss

Loss = Callable[..., torch.Tensor]


def _explain(fn: Loss, reference: str, dtype: torch.dtype = torch.float64) -> Explanation:
    opts = parse_marker((reference,), {"dtype": str(dtype).removeprefix("torch.")})
    return explain(
        FunctionUnderTest(fn, opts),
        resolve_config(opts),
        Tolerance(dtype),
        reference=reference,
        reference_id=reference,
    )


def _ppo_token_mean(eps_high: float, *, dual: float | None, detach_clipped: bool = False) -> Loss:
    def loss(logprobs, old_logprobs, advantages, response_mask):  # type: ignore[no-untyped-def]
        ratio = torch.exp(logprobs - old_logprobs)
        adv = advantages[:, None]
        clipped = ratio.clamp(0.8, 1.0 + eps_high)
        if detach_clipped:
            clipped = clipped.detach()
        pg = torch.maximum(-adv * ratio, -adv * clipped)
        if dual is not None:
            pg = torch.where(adv < 0, torch.minimum(pg, -dual * adv), pg)
        mask = response_mask
        return torch.where(mask, pg, 0.0).sum() / mask.sum()

    return loss


def test_always_on_dual_clip_is_named() -> None:
    found = _explain(_ppo_token_mean(0.28, dual=3.0), "dapo")
    assert found.best is not None
    assert "matches token-mean, token ratio, pg_clip eps 0.2/0.28, dual-clip 3" in found.text
    assert "the reference 'dapo' is token-mean, token ratio, pg_clip eps 0.2/0.28, no KL" in (
        found.text
    )


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_dual_clip_found_in_float32_too(dtype: torch.dtype) -> None:
    found = _explain(_ppo_token_mean(0.28, dual=3.0), "dapo", dtype)
    assert "pg_clip eps 0.2/0.28, dual-clip 3" in found.summary


def test_value_matches_but_gradient_does_not_is_a_stop_gradient_diagnosis() -> None:
    found = _explain(_ppo_token_mean(0.28, dual=None, detach_clipped=True), "dapo")
    assert found.best is None
    assert "the loss VALUE matches token-mean, token ratio, pg_clip eps 0.2/0.28" in found.text
    assert "— dapo" in found.text
    assert "stop-gradient is missing or misplaced" in found.text
    assert "gradient is not" in found.summary


def test_a_correct_loss_is_not_called_a_stop_gradient_bug() -> None:
    found = _explain(reference_loss(get_algorithm("dapo").loss), "dapo")
    assert found.best is not None and "stop-gradient" not in found.text
    assert found.summary.startswith("is ") and "dapo" in found.summary


@pytest.mark.parametrize(
    ("reference", "changes", "keyword"),
    [
        ("cispo", {"eps_high": 0.2}, "eps_high=0.2"),
        ("dr_grpo", {"budget": 1024}, "budget=1024"),
    ],
)
def test_unstated_constant_is_named_with_its_marker_line(
    reference: str, changes: dict[str, Any], keyword: str
) -> None:
    cfg = get_algorithm(reference).derive(**changes).loss
    found = _explain(reference_loss(cfg), reference)
    assert "does not publish" in found.text, found.text
    assert f'@pytest.mark.polgrad_conforms("{reference}", {keyword})' in found.text


def test_unstated_kl_coefficient_is_named() -> None:
    spec = get_algorithm("grpo")
    assert spec.loss.kl is not None
    cfg = spec.loss.replace(kl=spec.loss.kl.replace(coef=0.01))
    # grpo's KL coefficient is stated (0.04, Sec. 4.2): a different one is NOT excused.
    found = _explain(reference_loss(cfg), "grpo")
    assert "does not publish" not in found.text
    assert "k3 KL x 0.01 in the loss" in found.text


def test_a_stated_difference_gets_no_unstated_hint() -> None:
    # DAPO publishes eps_high = 0.28 (Sec. 3.1): eps 0.2 is a real deviation.
    found = _explain(reference_loss(get_algorithm("dapo").derive(eps_high=0.2).loss), "dapo")
    assert "does not publish" not in found.text
    assert "pg_clip eps 0.2/0.2" in found.summary


def test_kl_estimator_refinement_finds_another_estimator() -> None:
    spec = get_algorithm("grpo")
    assert spec.loss.kl is not None
    cfg = spec.loss.replace(kl=spec.loss.kl.replace(estimator=KLEstimator.K2))
    found = _explain(reference_loss(cfg), "grpo")
    assert "k2 KL x 0.04 in the loss" in found.summary


def test_top_zero_returns_the_whole_ranking() -> None:
    opts = parse_marker(("dapo",), {})
    fut = FunctionUnderTest(reference_loss(get_algorithm("dapo").loss), opts)
    everything = diagnose(fut, resolve_config(opts), Tolerance(torch.float64), top=0)
    assert len(everything) > 100
    assert everything[0].matches
    assert [m.error for m in everything] == sorted(m.error for m in everything)


def _variant_found(reference: str, variant: Any) -> Explanation:
    found = _explain(reference_loss(variant), reference)
    assert found.best is not None, found.text
    assert found.best.config == variant or found.best.error <= 1.0
    return found


def test_cispo_truncated_on_both_sides_is_found() -> None:
    # verl 0.9.1 compute_policy_loss_cispo clamps the IS weight at 1 - eps_low too.
    variant = get_algorithm("cispo").loss.replace(clip=ClipConfig(0.2, 0.28))
    found = _variant_found("cispo", variant)
    assert "cispo eps 0.2/0.28" in found.summary


def test_cispo_with_an_absolute_cap_is_found() -> None:
    # TRL 1.16.0 loss_type="cispo" clamps the weight at epsilon_high itself.
    variant = get_algorithm("cispo").loss.replace(
        clip=ClipConfig(None, 2.0, bounds=ClipBounds.ABSOLUTE)
    )
    found = _variant_found("cispo", variant)
    assert "ratio bounds [0, 2] (absolute)" in found.summary


@pytest.mark.parametrize(
    ("estimator", "weight", "words"),
    [
        (KLEstimator.K3_PLUS, KLRatioWeight.NONE, "k3+ KL x 0.04"),
        (KLEstimator.K3, KLRatioWeight.UNDETACHED, "k3 KL (undetached ratio-weighted) x 0.04"),
    ],
)
def test_kl_variants_are_found(estimator: KLEstimator, weight: KLRatioWeight, words: str) -> None:
    spec = get_algorithm("grpo")
    assert spec.loss.kl is not None
    variant = spec.loss.replace(kl=spec.loss.kl.replace(estimator=estimator, ratio_weight=weight))
    found = _variant_found("grpo", variant)
    assert words in found.summary, found.summary


def test_straight_through_k3_is_not_confused_with_k3() -> None:
    # k3+ has k3's value but k2's gradient: a plain k3 function must be told apart.
    spec = get_algorithm("grpo")
    found = _explain(reference_loss(spec.loss), "grpo")
    assert "k3 KL x 0.04" in found.summary and "k3+" not in found.summary


def test_a_surrogate_parameters_are_part_of_the_description() -> None:
    from pytest_polgrad.kinds.policy_loss.diagnose.diagnosis import describe_config

    text = describe_config(get_algorithm("sapo").loss)
    assert "sapo (tau_pos=1, tau_neg=1.05)" in text


def test_swapped_clip_bounds_are_named() -> None:
    """eps_low and eps_high in each other's place (new-user trial: it read "no match,
    closest 0.3/0.3")."""
    swapped = reference_loss(get_algorithm("dapo").loss.replace(clip=ClipConfig(0.28, 0.2)))
    found = _explain(swapped, "dapo")
    assert "matches token-mean, token ratio, pg_clip eps 0.28/0.2" in found.text, found.text


def _grpo_kl_wrong_sign(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
) -> torch.Tensor:
    """GRPO's seq-mean-token-mean loss with its k3 KL term (x 0.04) *subtracted*."""
    ratio = torch.exp(logprobs - old_logprobs)
    a = advantages[:, None]
    pg = torch.maximum(-a * ratio, -a * ratio.clamp(0.8, 1.2))
    lr = ref_logprobs - logprobs
    k3 = torch.exp(lr) - lr - 1.0
    per = torch.where(response_mask, pg - 0.04 * k3, 0.0)
    return (per.sum(dim=1) / response_mask.sum(dim=1)).mean()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_a_kl_term_of_the_wrong_sign_is_named(dtype: torch.dtype) -> None:
    """``pg - 0.04 k3`` against GRPO's ``pg + 0.04 k3``: no config can say it (a KL
    coefficient is >= 0), so the diagnosis fits the coefficient and names the sign; it
    used to name a KL-Cov candidate "off by 1.18x" (new-user trial)."""
    found = _explain(_grpo_kl_wrong_sign, "grpo", dtype)
    assert found.best is None
    assert "minus 0.04 x its KL term, so the KL term enters with the opposite sign" in found.text
    assert "kl_cov" not in found.text, found.text
    assert "minus" not in _explain(reference_loss(get_algorithm("grpo").loss), "grpo", dtype).text


def test_the_closest_candidate_is_chosen_on_value_and_gradient() -> None:
    """With nothing matching, value-only scoring stops at the first batch whose value
    misses and never scores the gradient: a KL-Cov candidate came within 1.18x the
    tolerance in value for the wrong-sign KL loss while its gradient is about 3e5x off,
    and was named the closest. The nearest candidates by value are now scored in full,
    and only a fully scored one is named."""
    from pytest_polgrad.kinds.policy_loss.diagnose.diagnosis import Match, closest

    opts = parse_marker(("grpo",), {})
    ranking = diagnose(FunctionUnderTest(_grpo_kl_wrong_sign, opts), resolve_config(opts),
                       Tolerance(torch.float64), top=0)  # fmt: skip
    target = resolve_config(opts)
    named, _ = closest(ranking, target)
    assert named.grad_error < float("inf") and named.error == max(
        named.value_error, named.grad_error
    )
    unscored = Match(ranking[-1].config, 1.2, value_error=1.2)  # gradient never looked at
    scored = Match(target, 500.0, value_error=3.0, grad_error=500.0)  # > 100x the other
    assert closest([unscored, scored], target) == (scored, True)
