"""Two conditioning cases the tolerance model must know, found by the random pool's
false-alarm sweep: SAPO's gradient amplifies rounding by its curvature past the gate, and
Clip-Cov / KL-Cov select tokens by a covariance whose near-ties rounding can flip (the
loss jumps by a whole token, so such a batch is not judged). Each is shown to pass a
correct function computing in float32 and to still catch a wrong one."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from polgrad_reference import ALGORITHMS, policy_loss
from pytest_polgrad.core.engine import build_context
from pytest_polgrad.core.options import parse_marker
from pytest_polgrad.core.tolerance import Tolerance
from pytest_polgrad.core.verdicts import CheckFailure
from pytest_polgrad.kinds.policy_loss.checks import check_gradient, check_value
from pytest_polgrad.kinds.policy_loss.oracle import Oracle

Tensor = torch.Tensor


def _reference(name: str, *, float32: bool, **changes: object) -> Callable[..., Tensor]:
    cfg = ALGORITHMS[name].loss
    if changes:
        cfg = cfg.replace(params=cfg.params.__class__(**{**cfg.params.__dict__, **changes}))  # type: ignore[union-attr]

    def loss(
        logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
    ) -> Tensor:
        cast = (lambda t: t.float()) if float32 else (lambda t: t)
        out = policy_loss(
            cfg,
            logprobs=cast(logprobs),
            old_logprobs=cast(old_logprobs),
            advantages=cast(advantages),
            response_mask=response_mask,
        ).loss
        return out.to(logprobs.dtype)

    return loss


# the sweep's SAPO case: one token at ratio e^1.94 = 6.9, far past the gate (A < 0)
SAPO_TOKEN = {
    "logprobs": torch.tensor([[-0.5042987333483735]], dtype=torch.float64),
    "old_logprobs": torch.tensor([[-2.4434242882235298]], dtype=torch.float64),
    "advantages": torch.tensor([-3.9269995675848253], dtype=torch.float64),
    "response_mask": torch.tensor([[True]]),
}


def test_sapo_in_float32_passes_past_the_gate_and_a_wrong_tau_is_caught() -> None:
    opts = parse_marker(("sapo",), {})
    ok = build_context(_reference("sapo", float32=True), opts)
    check_gradient(ok, SAPO_TOKEN)  # raised 1.02x the tolerance before the curvature term
    wrong = build_context(_reference("sapo", float32=True, tau_neg=1.1), opts)
    with pytest.raises(CheckFailure):  # tau_neg 1.1 against 1.05 fails the gradient check
        check_gradient(wrong, SAPO_TOKEN)


# the sweep's DRO case: one token with advantage 0, so the loss is the penalty
# beta/2 lr^2 alone, computed in float32 from logprobs near -20
DRO_TOKEN = {
    "logprobs": torch.tensor([[-20.223142385482788]], dtype=torch.float64),
    "old_logprobs": torch.tensor([[-20.0]], dtype=torch.float64),
    "advantages": torch.tensor([0.0], dtype=torch.float64),
    "response_mask": torch.tensor([[True]]),
}


def test_dro_in_float32_at_zero_advantage_passes_and_a_wrong_beta_is_caught() -> None:
    opts = parse_marker(("dro",), {})
    ok = build_context(_reference("dro", float32=True), opts)
    check_value(ok, DRO_TOKEN)  # raised 1.11x the tolerance before the penalty slope term
    wrong = build_context(_reference("dro", float32=True, beta=1.001), opts)
    with pytest.raises(CheckFailure):  # beta 1.001 against 1.0 fails the value check
        check_value(wrong, DRO_TOKEN)


def test_the_curvature_term_is_one_where_the_gradient_is_proportional_to_r() -> None:
    for name in ("dapo", "grpo", "cispo"):
        oracle = Oracle(ALGORITHMS[name].loss)
        ratio = torch.tensor([[0.5, 1.0, 7.0]], dtype=torch.float64)
        assert bool((oracle._curvature(ratio, torch.ones_like(ratio)) == 1.0).all()), name
    sapo = Oracle(ALGORITHMS["sapo"].loss)
    far = sapo._curvature(torch.tensor([[6.9]], dtype=torch.float64), -torch.ones(1, 1))
    assert float(far) > 7.0  # 1 + tau r |1 - 2 s| with tau = 1.05, s ~ 1


def _near_tie(gap: float) -> dict[str, Tensor]:
    """Six tokens; the top two covariances (tokens 0 and 1, ``k = 1``) differ by about
    ``gap``."""
    lp = torch.tensor([[-0.5, -0.5 - gap, -2.0, -2.0, -2.0, -2.0]], dtype=torch.float64)
    adv = torch.tensor([[3.0, 3.0, 0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    return {
        "logprobs": lp,
        "old_logprobs": lp - 0.01,
        "advantages": adv,
        "response_mask": torch.ones(1, 6, dtype=torch.bool),
    }


def test_a_kl_cov_selection_within_rounding_is_undecided_and_a_clear_one_is_judged() -> None:
    oracle = Oracle(ALGORITHMS["kl_cov"].loss)
    eps32, native = Tolerance(torch.float32).kink_band
    eps64, _ = Tolerance(torch.float64, strict=True).kink_band
    tie, clear = _near_tie(1e-9), _near_tie(0.05)
    assert oracle(tie, kink_eps=eps32, native_kinks=native).undecided
    assert not oracle(tie, kink_eps=eps64, native_kinks=native).undecided
    assert not oracle(clear, kink_eps=eps32, native_kinks=native).undecided


def test_kl_cov_with_a_wrong_coefficient_is_still_caught_on_a_clear_selection() -> None:
    opts = parse_marker(("kl_cov",), {"dtype": "float32"})
    batch = {k: (v.float() if v.is_floating_point() else v) for k, v in _near_tie(0.05).items()}
    check_value(build_context(_reference("kl_cov", float32=True), opts), batch)
    wrong = build_context(_reference("kl_cov", float32=True, kl_coef=2.0), opts)
    with pytest.raises(CheckFailure):  # kl_coef 2 against 1 fails the value check
        check_value(wrong, batch)


def test_kl_cov_in_float32_at_zero_advantage_passes_and_a_wrong_coefficient_is_caught() -> None:
    """KL-Cov's penalty ``kl_coef |lr|`` on the tokens it selects does not vanish with the
    advantage: one selected token with A = 0 and logprobs near -32, computed in float32,
    read 4.35x the tolerance until the value scale took its slope (``--polgrad-seed 13``
    of the sweep's functions)."""
    token = {
        "logprobs": torch.tensor([[-32.22313117980957]], dtype=torch.float64),
        "old_logprobs": torch.tensor([[-32.0]], dtype=torch.float64),
        "advantages": torch.tensor([0.0], dtype=torch.float64),
        "response_mask": torch.tensor([[True]]),
    }
    opts = parse_marker(("kl_cov",), {})
    check_value(build_context(_reference("kl_cov", float32=True), opts), token)
    with pytest.raises(CheckFailure):  # kl_coef 1.001 against 1 fails the value check
        check_value(build_context(_reference("kl_cov", float32=True, kl_coef=1.001), opts), token)


def test_the_value_only_oracle_matches_the_full_one_bitwise() -> None:
    """``Oracle.value`` (the diagnosis ranks hundreds of candidates with it) gives exactly
    the loss, value scale and token count of the full oracle, for every registry entry
    (KL, IS correction, selections, budgets) on every canonical batch, in float64 and
    from bfloat16 inputs; its output's policy and KL terms sum to
    the loss (the diagnosis fits a KL coefficient from them)."""
    from pytest_polgrad.core.corpus import canonical_corpus

    for dtype in (torch.float64, torch.bfloat16):
        corpus = canonical_corpus(dtype=dtype, advantages="sequence")
        for name, spec in ALGORITHMS.items():
            oracle = Oracle(spec.loss)
            for label, batch in corpus.items():
                full = oracle(batch, kink_eps=1e-6)
                fast = oracle.value(batch)
                assert fast == (full.loss, full.value_scale, full.n_tokens), (name, label, dtype)
                out = oracle.reference(batch)  # the KL fit reads the two terms from it
                kl = 0.0 if out.kl_loss is None else float(out.kl_loss)
                assert math.isclose(float(out.policy_loss) + kl, full.loss, rel_tol=1e-12)


# the default-size sweep's SAPO case (--polgrad-seed 24): ratio e^3.05 = 21 with A < 0,
# so s = sigmoid(1.05 * 20) is 1 - 7.6e-10, which float32 rounds to 1
SAPO_SATURATED = {
    "logprobs": torch.tensor([[-3.5761192260257815]], dtype=torch.float64),
    "old_logprobs": torch.tensor([[-6.622177194961574]], dtype=torch.float64),
    "advantages": torch.tensor([-3.0], dtype=torch.float64),
    "response_mask": torch.tensor([[True]]),
}


def test_sapo_in_float32_with_a_saturated_gate_passes_and_a_wrong_tau_is_caught() -> None:
    """``4 s (1 - s) r |A|`` is 1.85e-7 here, and 0 in float32 (``1 - s`` rounds away):
    the gradient scale takes the absolute rounding of ``s`` (it read 1010x before)."""
    opts = parse_marker(("sapo",), {})
    check_gradient(build_context(_reference("sapo", float32=True), opts), SAPO_SATURATED)
    wrong = build_context(_reference("sapo", float32=True, tau_neg=1.1), opts)
    with pytest.raises(CheckFailure):  # tau_neg 1.1 against 1.05, past the gate
        check_gradient(wrong, SAPO_TOKEN)


def _overflowing_rows(dtype: torch.dtype, advantages: tuple[float, float]) -> dict[str, Tensor]:
    """Two rows of 3000 tokens with log-ratios +0.3 and -0.3: the sequence-product ratio
    ``exp(sum_t lr_t)`` is inf on row 0 and 0 on row 1, in every precision."""
    old = torch.full((2, 3000), -2.0, dtype=torch.float64)
    lp = torch.cat([old[:1] + 0.3, old[1:] - 0.3])
    batch = {
        "logprobs": lp,
        "old_logprobs": old,
        "advantages": torch.tensor(advantages, dtype=torch.float64),
        "response_mask": torch.ones(2, 3000, dtype=torch.bool),
        "ref_logprobs": lp - 0.1,
        "rollout_logprobs": old + 0.05,
    }
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in batch.items()}


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_scale_is_finite_where_a_long_rows_ratio_overflows(name: str) -> None:
    """A scale of inf accepts any value and NaN fails every one: bypass_pg's CISPO weight
    on a sequence-product ratio read both (the ratio overflowed, not the truncated weight
    the loss applies), a false alarm of the default-size sweep (--polgrad-seed 22, 24)."""
    oracle = Oracle(ALGORITHMS[name].loss)
    for advantages in ((0.0, 0.0), (1.0, -1.0)):
        result = oracle(_overflowing_rows(torch.float64, advantages), kink_eps=1e-15)
        if not math.isfinite(result.loss):
            continue  # an untruncated ratio overflows the loss itself: nothing to scale
        assert math.isfinite(result.value_scale), (name, advantages)
        assert math.isfinite(result.value_scale_native), (name, advantages)
        assert bool(torch.isfinite(result.grad_scale).all()), (name, advantages)


def test_bypass_pg_in_float32_passes_an_overflowing_row_and_a_wrong_cap_is_caught() -> None:
    cfg = ALGORITHMS["bypass_pg"].loss
    opts = parse_marker(("bypass_pg",), {"dtype": "float32"})
    batch = _overflowing_rows(torch.float32, (1.0, -1.0))

    def capped(cap: float) -> Callable[..., Tensor]:
        wrong = cfg.replace(clip=cfg.clip.replace(eps_high=cap))

        def loss(
            logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
        ) -> Tensor:
            kw = {"old_logprobs": old_logprobs, "advantages": advantages}
            return policy_loss(wrong, logprobs=logprobs, response_mask=response_mask, **kw).loss

        return loss

    check_value(build_context(capped(2.0), opts), batch)
    with pytest.raises(CheckFailure):  # a cap of 2.5 against 2 (it passed on inf before)
        check_value(build_context(capped(2.5), opts), batch)
