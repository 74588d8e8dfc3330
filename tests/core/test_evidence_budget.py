"""A declared deviation that the canonical corpus does not show is not called stale on
the evidence of a small budget (issue 27: the same verdict at budgets 5, 20, 100 and 300).

``rare_shape`` is DAPO except on batches whose shape satisfies ``(31 B + T) mod 13 = 5``,
where its loss is 1% too large: no corpus batch and none of the first 5 drawn batches at
seed 0 has such a shape, and one of the first 100 has (TRL's VESPO clamp behaves so: only
long rows far off-policy show it). Before ``evidence_budget`` the 5-example run said "now
passes; remove it from expect=" and the 100-example run excused the deviation.
"""

from __future__ import annotations

import pytest

from polgrad_reference import ALGORITHMS
from polgrad_reference.loss import policy_loss
from pytest_polgrad import ConformanceError, assert_conforms
from pytest_polgrad.core.expect import evidence_budget
from tests.helpers import inline_run

pytest_plugins = ["pytester"]

REASON = "1% too large on rare shapes"


def dapo(logprobs, old_logprobs, advantages, response_mask):  # type: ignore[no-untyped-def]
    return policy_loss(
        ALGORITHMS["dapo"].loss,
        logprobs=logprobs,
        old_logprobs=old_logprobs,
        advantages=advantages,
        response_mask=response_mask,
    ).loss


def rare_shape(logprobs, old_logprobs, advantages, response_mask):  # type: ignore[no-untyped-def]
    rows, width = logprobs.shape
    scale = 1.01 if (31 * rows + width) % 13 == 5 else 1.0
    return dapo(logprobs, old_logprobs, advantages, response_mask) * scale


@pytest.mark.parametrize("budget", [5, 20, 100])
def test_a_deviation_only_a_drawn_batch_shows_is_excused_at_every_budget(budget: int) -> None:
    report = assert_conforms(
        rare_shape, "dapo", checks=("value",), expect={"value": REASON}, max_examples=budget
    )
    assert report.ok and not report.results[0].passed


def test_a_correct_function_declared_deviating_is_still_stale_at_a_small_budget() -> None:
    with pytest.raises(ConformanceError, match="passes now; remove it from expect="):
        assert_conforms(dapo, "dapo", checks=("value",), expect={"value": REASON}, max_examples=5)


def test_the_evidence_budget_is_the_default_profiles() -> None:
    assert evidence_budget(5) == 100 and evidence_budget(99) == 100
    assert evidence_budget(100) is None and evidence_budget(300) is None


def test_under_the_marker_a_small_budget_gives_the_expected_failure(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_rare="""
import pytest
from polgrad_reference import ALGORITHMS
from polgrad_reference.loss import policy_loss


@pytest.mark.polgrad_conforms("dapo", checks=("value",), expect={"value": "rare"})
def rare_shape(logprobs, old_logprobs, advantages, response_mask):
    out = policy_loss(ALGORITHMS["dapo"].loss, logprobs=logprobs, old_logprobs=old_logprobs,
                      advantages=advantages, response_mask=response_mask).loss
    rows, width = logprobs.shape
    return out * 1.01 if (31 * rows + width) % 13 == 5 else out
"""
    )
    result = inline_run.run(pytester, "-p", "no:cacheprovider", "--polgrad-max-examples=5")
    result.assert_outcomes(xfailed=1)
