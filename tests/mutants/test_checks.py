"""``pytest_polgrad.kinds.policy_loss.checks``: what the sampled ``make mutate`` run left unpinned.

- the self-comparison gradient scale includes the function's own gradient per row
  (``|g| + max_row |g|``): a correct loss 3000x the reference's, computed in float32,
  accumulates its micro-batches within its own rounding and must pass (with ``-`` for
  ``+`` it fails at ~1e6 tolerances: a false alarm);
- ``padding-columns`` does not apply to the packed layout, whatever string object the
  layout name is (``is not`` for ``!=`` survived with interned literals);
- a failure's table lists only entries beyond tolerance.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from polgrad_reference import ALGORITHMS
from pytest_polgrad import ConformanceError, assert_conforms
from pytest_polgrad.core.options import ConformanceOptions
from pytest_polgrad.kinds.policy_loss.checks import CHECKS, _worst_entries


def scaled_float32_grpo(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
) -> torch.Tensor:
    """3001.7 x GRPO's seq-mean-token-mean PPO-clip loss, computed in float32."""
    lp, old, adv = logprobs.float(), old_logprobs.float(), advantages.float()
    r = torch.exp(lp - old)
    per_token = torch.maximum(-adv[:, None] * r, -adv[:, None] * r.clamp(0.8, 1.2))
    m = response_mask.float()
    rows = (per_token * m).sum(1) / m.sum(1)
    return (rows.mean() * 3001.7).double()


def test_micro_batch_scale_follows_the_functions_own_gradient() -> None:
    report = assert_conforms(
        scaled_float32_grpo, "grpo", kl=None, checks=("micro-batch",), max_examples=50
    )
    assert report.ok, report.summary()


def test_padding_columns_never_applies_to_a_packed_layout() -> None:
    cfg = ALGORITHMS["dapo"].loss
    applies = CHECKS["padding-columns"].applies
    literal = "packed"
    built = "".join(["pack", "ed"])  # equal to the literal, not the same object
    assert built == literal and built is not literal
    assert not applies(cfg, ConformanceOptions(reference="dapo", layout=built))
    assert applies(cfg, ConformanceOptions(reference="dapo", layout="right"))


def test_failure_table_lists_only_entries_beyond_tolerance() -> None:
    ratios = torch.tensor([[0.5, 3.0, 1.0], [0.0, 2.0, 0.9]], dtype=torch.float64)
    expected = torch.arange(6, dtype=torch.float64).view(2, 3)
    entries = _worst_entries(ratios, expected, -expected)
    assert [pos for pos, _, _ in entries] == [(0, 1), (1, 1)]
    assert entries[0][1:] == (1.0, -1.0)


def _dapo_with_padding_gradient(leak: float | None) -> Callable[..., torch.Tensor]:
    """DAPO whose gradient at padding is ``leak`` (None: NaN), its value unchanged."""
    from tests.helpers.sample_losses import dapo

    def loss(
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
    ) -> torch.Tensor:
        pad = float("nan") if leak is None else leak
        lp = logprobs * 1.0
        lp.register_hook(lambda g: torch.where(response_mask, g, pad))  # type: ignore[no-untyped-call]
        return dapo(lp, old_logprobs, advantages, response_mask)

    return loss


def test_masked_positions_admits_no_gradient_at_padding_however_small() -> None:
    """The check is ``grad == 0`` exactly at padding: a leak of 1e-13 fails, and so does a
    NaN there (``abs(g) > 1e-12`` survived the audit of issue 27, and is False for NaN)."""
    for leak in (1e-13, None):
        try:
            assert_conforms(
                _dapo_with_padding_gradient(leak), "dapo", checks=("masked-positions",),
                max_examples=3,
            )  # fmt: skip
        except ConformanceError as exc:
            assert "not exactly zero" in str(exc)
        else:
            raise AssertionError(f"a padding gradient of {leak} passed masked-positions")
    assert assert_conforms(
        _dapo_with_padding_gradient(0.0), "dapo", checks=("masked-positions",), max_examples=3
    ).ok


def test_self_comparisons_allow_both_evaluations_their_rounding() -> None:
    """Two evaluations of the function each carry rounding error, so the self-comparison
    tolerance is twice one evaluation's: a loss that moves by 1.5x one evaluation's
    tolerance between the two calls passes, 2.5x fails (issue 27: dropping the factor 2
    survived, a false alarm on correct float32 losses at kinks)."""
    import dataclasses
    import math

    from pytest_polgrad.core.corpus import canonical_corpus
    from pytest_polgrad.core.engine import build_context
    from pytest_polgrad.core.options import parse_marker
    from pytest_polgrad.core.verdicts import CheckFailure
    from pytest_polgrad.kinds.policy_loss.checks import _mass_ratio, _same_result, evaluate
    from tests.helpers.sample_losses import dapo

    ctx = build_context(dapo, parse_marker(("dapo",), {}))
    batch = canonical_corpus()["ragged"]
    a = evaluate(ctx, batch)
    assert a.grad is not None
    ref = ctx.expected(batch)
    la = float(a.loss)
    k = _mass_ratio(ref, a.grad.to(torch.float64))
    scale = max(ref.value_scale, k * ref.value_scale, abs(la))
    native = max(ref.value_scale_native, k * ref.value_scale_native, abs(la))
    probe = 1.0  # far beyond every precision's tolerance: the ratio is the loosest one's
    cmp = ctx.tolerance.value(la + probe, la, scale, ref.n_tokens, native_scale=native)
    one = probe / cmp.error  # one evaluation's tolerance at the loosest precision
    width = batch["response_mask"].shape[1]
    for times, passes in ((1.5, True), (2.5, False)):
        b = dataclasses.replace(a, loss=torch.tensor(la + times * one, dtype=torch.float64))
        try:
            _same_result(ctx, batch, a, b, "nothing changes", width)
        except CheckFailure:
            assert not passes, times
        else:
            assert passes, times
    assert math.isfinite(one) and one > 0


def test_self_comparisons_allow_both_gradients_their_rounding() -> None:
    """The gradient half of the self-comparison: its tolerance is twice one evaluation's
    too (the ``2.0 *`` before ``torch.maximum(ref.grad_scale, ...)``), so a gradient entry
    that moves by 1.5x one evaluation's tolerance between the two calls passes, 2.5x fails
    (issue 27: dropping this factor 2 had no targeted test)."""
    import dataclasses
    import math

    from pytest_polgrad.core.corpus import canonical_corpus
    from pytest_polgrad.core.engine import build_context
    from pytest_polgrad.core.options import parse_marker
    from pytest_polgrad.core.verdicts import CheckFailure
    from pytest_polgrad.kinds.policy_loss.checks import _same_result, evaluate
    from tests.helpers.sample_losses import dapo

    ctx = build_context(dapo, parse_marker(("dapo",), {}))
    batch = canonical_corpus()["ragged"]
    a = evaluate(ctx, batch)
    assert a.grad is not None
    ref = ctx.expected(batch)
    assert ref.cond is not None and ref.cond_native is not None
    assert ref.grad_scale_native is not None
    ga = a.grad.to(torch.float64)
    mask = batch["response_mask"]
    own = torch.where(mask, ga.abs(), 0.0)
    own = own + own.amax(dim=1, keepdim=True)
    scale = torch.maximum(ref.grad_scale, own * ref.cond)
    native = torch.maximum(ref.grad_scale_native, own * ref.cond_native)
    b, t = (int(i) for i in ref.clear.nonzero()[0])  # a response token away from any kink
    probe = torch.zeros_like(ga)
    probe[b, t] = 1.0  # far beyond every precision's tolerance: the loosest one's ratio
    _cmp, ratios = ctx.tolerance.tensor(ga + probe, ga, scale, ref.clear, native_scale=native)
    one = 1.0 / float(ratios[b, t])  # one evaluation's tolerance at that token
    width = mask.shape[1]
    for times, passes in ((1.5, True), (2.5, False)):
        moved = ga + times * one * probe
        other = dataclasses.replace(a, grad=moved.to(a.grad.dtype))
        try:
            _same_result(ctx, batch, a, other, "nothing changes", width)
        except CheckFailure as exc:
            assert not passes, times
            assert "gradient changes" in str(exc), exc
        else:
            assert passes, times
    assert math.isfinite(one) and one > 0
