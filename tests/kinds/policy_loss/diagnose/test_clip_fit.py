"""Diagnosis names a clip range no registry entry uses: the function's gradient brackets
each PPO-clip bound, its losses pin it down
(``pytest_polgrad/kinds/policy_loss/diagnose/clip_fit.py``); a CISPO cap
is tried between the corpus's ratios. At half precision the bracket alone is said."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from polgrad_reference import RatioKind
from pytest_polgrad.core.calls import FunctionUnderTest
from pytest_polgrad.core.corpus import canonical_corpus
from pytest_polgrad.core.engine import resolve_config
from pytest_polgrad.core.options import parse_marker
from pytest_polgrad.kinds.policy_loss.diagnose.clip_fit import bracket, intervals, shortest
from pytest_polgrad.kinds.policy_loss.diagnose.diagnosis import Explanation, explain
from tests.helpers import sample_losses as L

Loss = Callable[..., torch.Tensor]
Tensor = torch.Tensor


def _explain(fn: Loss, reference: str, **options: object) -> Explanation:
    opts = parse_marker((reference,), dict(options))
    from pytest_polgrad.core.engine import build_context

    tolerance = build_context(fn, opts).tolerance
    return explain(
        FunctionUnderTest(fn, opts),
        resolve_config(opts),
        tolerance,
        reference=reference,
        reference_id=reference,
    )


def _ppo(lo: float, hi: float, *, upcast: bool = False) -> Loss:
    """PPO-clip with clip range ``1 - lo, 1 + hi``, token-mean; ``upcast``: computed in
    float32, returned in the inputs' dtype (as verl and TRL do with bfloat16 inputs)."""

    def loss(
        logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
    ) -> Tensor:
        dtype = logprobs.dtype
        if upcast:
            logprobs, old_logprobs, advantages = (
                t.float() for t in (logprobs, old_logprobs, advantages)
            )
        per = L._ppo_per_token(logprobs, old_logprobs, advantages, response_mask, lo, hi)
        return L._token_mean(per, response_mask).to(dtype)

    return loss


def _cispo(cap: float) -> Loss:
    """CISPO with its weight truncated at ``cap`` (sg(min(r, cap)) A log pi), token-mean."""

    def loss(
        logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
    ) -> Tensor:
        ratio = torch.exp(torch.where(response_mask, logprobs - old_logprobs, 0.0))
        weight = ratio.clamp(max=cap).detach()
        per = -(weight * advantages[:, None]) * torch.where(response_mask, logprobs, 0.0)
        return per.sum() / response_mask.sum()

    return loss


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize(
    ("reference", "lo", "hi", "named"),
    [
        ("dapo", 0.2, 0.25, "pg_clip eps 0.2/0.25"),  # eps_high between two registry values
        ("dapo", 0.15, 0.28, "pg_clip eps 0.15/0.28"),  # eps_low
        ("dapo", 0.1, 0.25, "pg_clip eps 0.1/0.25"),  # both bounds
        ("dapo", 0.2, 0.2475, "pg_clip eps 0.2/0.2475"),  # within 1% of a shorter 0.25
    ],
)
def test_a_clip_range_no_entry_uses_is_named(
    reference: str, lo: float, hi: float, named: str, dtype: str
) -> None:
    found = _explain(_ppo(lo, hi), reference, dtype=dtype)
    assert found.best is not None, found.text
    assert f"this function matches token-mean, token ratio, {named}, no KL term (within" in (
        found.text
    )
    assert "read off the function" in found.text and "exact zeros put it between " in found.text
    line = ", ".join(
        f"{k}={v}" for k, v, ref in (("eps_low", lo, 0.2), ("eps_high", hi, 0.28)) if v != ref
    )
    assert f'declare it: @pytest.mark.polgrad_conforms("{reference}", {line}).' in found.text


def test_a_cispo_cap_no_entry_uses_is_named_with_its_marker_line() -> None:
    found = _explain(_cispo(2.5), "cispo")
    assert "cispo eps none/1.5" in found.text, found.text
    assert '@pytest.mark.polgrad_conforms("cispo", eps_high=1.5)' in found.text
    assert "eps_high 1.5 (a weight capped at 2.5)" in found.text  # the bound is relative


def test_bfloat16_fed_and_upcast_the_bound_is_named_with_strict() -> None:
    """Judged at float32 (strict), the losses pin the bound down: not blamed on a
    stop-gradient, as it was when the value matched dapo's within bfloat16 rounding."""
    found = _explain(_ppo(0.2, 0.25, upcast=True), "dapo", dtype="bfloat16", strict=True)
    assert "stop-gradient" not in found.text
    assert "matches token-mean, token ratio, pg_clip eps 0.2/0.25" in found.text, found.text


def test_at_half_precision_a_read_off_bound_is_named_as_a_representative() -> None:
    """A loss computing in bfloat16, judged strictly: its losses fit a range of bounds, so
    the one named (0.24 for a true 0.25) comes with the range its gradient gives, and no
    marker line."""
    found = _explain(_ppo(0.2, 0.25), "dapo", dtype="bfloat16", strict=True)
    assert "pg_clip eps 0.2/0.2" in found.text, found.text
    assert "the one named is only a representative" in found.text
    low, high = (
        float(x) for x in found.text.split("put it between ")[1].split(";")[0].split(" and ")
    )
    assert low <= 0.25 < high
    assert "declare it" not in found.text


def test_at_half_precision_the_gradient_brackets_the_bound() -> None:
    """bfloat16 arithmetic cannot pin eps_high down (within its tolerance the reference
    itself matches), but the exact zeros of the gradient still bracket it away from 0.28,
    by more than the ratio's rounding: said as such."""
    found = _explain(_ppo(0.2, 0.25), "dapo", dtype="bfloat16")
    assert "stop-gradient" not in found.text
    assert "the function clips elsewhere" in found.text, found.text
    low, high = (float(x) for x in found.summary.split("between ")[1].split(")")[0].split(" and "))
    assert low <= 0.25 < high < 0.28


@pytest.mark.parametrize("fn", [L.dapo, _ppo(0.2, 0.28, upcast=True)])
def test_the_reference_clip_range_is_not_read_as_another(fn: Loss) -> None:
    """A correct DAPO loss: its bracket holds 0.28, so nothing is refitted or claimed."""
    for options in (
        {},
        {"dtype": "float32"},
        {"dtype": "bfloat16"},
        {"dtype": "bfloat16", "strict": True},
    ):
        found = _explain(fn, "dapo", **options)
        assert "clips elsewhere" not in found.text
        assert "0.2/0.28" in found.text, found.text


def test_a_bug_that_is_not_a_clip_range_keeps_its_diagnosis() -> None:
    found = _explain(L.cispo_no_stop_gradient, "cispo")
    assert "stop-gradient" in found.text and "eps none/" in found.text
    assert "none/2," in found.text  # the reference's own cap, not a fitted one


def test_bracket_and_shortest_decimal() -> None:
    corpus = canonical_corpus(dtype=torch.float64, advantages="sequence")
    grads = {}
    for name, batch in corpus.items():
        lp = batch["logprobs"].detach().clone().requires_grad_()
        loss = _ppo(0.2, 0.25)(
            lp, batch["old_logprobs"], batch["advantages"], batch["response_mask"]
        )
        (grads[name],) = torch.autograd.grad(loss, lp)
    high = bracket(corpus, grads, RatioKind.TOKEN, 1.0)
    low = bracket(corpus, grads, RatioKind.TOKEN, -1.0)
    assert high is not None and high[0] <= 0.25 + 1e-12 and 0.25 < high[1] < 0.28
    assert low is not None and low[0] <= 0.2 < low[1]
    assert shortest(0.2500000001, *high, rtol=1e-6) == 0.25
    assert shortest(0.5, *high, rtol=1e-6) is None  # outside the bracket
    # one ratio written twice (1.4999999999999998, 1.5) is one threshold, not a bracket
    assert all(b - a > 1e-9 for a, b in intervals(corpus))


@pytest.mark.parametrize(("dtype", "claimed"), [(torch.float64, True), (torch.bfloat16, False)])
def test_a_bound_within_the_ratios_rounding_is_not_claimed(
    dtype: torch.dtype, claimed: bool
) -> None:
    """One live token at r = 1.1 and one clipped at r = 1.275 bracket eps_high in
    [0.1, 0.275): that excludes dapo's 0.28 in float64, but bfloat16 rounds a ratio near
    1.28 by more than 0.005, so a clipped 1.275 may be the function's rounding of it."""
    from pytest_polgrad.core.tolerance import Tolerance
    from pytest_polgrad.kinds.policy_loss.diagnose.diagnosis import _Scorer

    lp = torch.tensor([[0.0, 0.0]], dtype=torch.float64)
    old = -torch.log(torch.tensor([[1.1, 1.275]], dtype=torch.float64))
    batch = {
        "logprobs": lp,
        "old_logprobs": old,
        "advantages": torch.tensor([1.0], dtype=torch.float64),
        "response_mask": torch.tensor([[True, True]]),
    }
    observed = {"one": (0.0, torch.tensor([[-0.55, 0.0]], dtype=torch.float64))}
    scorer = _Scorer({"one": batch}, observed, Tolerance(dtype), "sequence")
    cfg = resolve_config(parse_marker(("dapo",), {}))
    found = scorer.misplaced_bounds(cfg)
    assert (found == [("eps_high", pytest.approx(0.1), pytest.approx(0.275))]) is claimed, found


def test_which_ends_with_the_reports_diagnosis() -> None:
    """At bfloat16 ``which`` lists 170-odd matches, the first of them eps 0.2/0.2: without
    the report's sentence it contradicted the report (a new-user trial finding)."""
    from pytest_polgrad.__main__ import which

    text = which(_ppo(0.2, 0.25), parse_marker(("dapo",), {"dtype": "bfloat16"}), top=3)
    assert text.splitlines()[1].lstrip().startswith("MATCH")
    assert "diagnosis  no registered semantics matches, but" in text
    assert "the function clips elsewhere" in text.replace("\n" + " " * 13, " ")


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_zeros_the_reference_has_too_are_not_read_as_clipping(dtype: str) -> None:
    """grpo_geo_rs's rollout mask zeroes whole rows: the reference's own loss was told it
    "clips elsewhere" (eps_low between 0.0005 and 0.02). A review finding."""
    from polgrad_reference import get_algorithm

    found = _explain(
        L.reference_loss(get_algorithm("grpo_geo_rs").loss), "grpo_geo_rs", dtype=dtype
    )
    assert "clips elsewhere" not in found.text, found.text


def test_a_detached_loss_keeps_its_stop_gradient_diagnosis() -> None:
    """No live token bounds anything from below: not a clip range (a review finding)."""

    def detached(
        logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
    ) -> Tensor:
        return (
            L.dapo(logprobs.detach(), old_logprobs, advantages, response_mask) + 0 * logprobs.sum()
        )

    found = _explain(detached, "dapo")
    assert "stop-gradient" in found.text and "clips elsewhere" not in found.text, found.text


def test_a_bfloat16_ratio_rounded_across_the_bound_is_not_a_clip_range() -> None:
    """PPO computing in bfloat16, judged strictly: the corpus's 1.2001 rounds across 1.2 in
    bfloat16, so the bracket widens by the inputs' rounding (a review finding)."""
    found = _explain(L.ppo, "ppo", dtype="bfloat16", strict=True)
    assert "clips elsewhere" not in found.text, found.text


def test_a_nan_loss_determines_no_bound() -> None:
    from pytest_polgrad.kinds.policy_loss.diagnose.clip_fit import solve

    assert solve([(float("nan"), 1.0, [2.0]), (1.0, 0.5, [1.0])], 1e-6) is None
