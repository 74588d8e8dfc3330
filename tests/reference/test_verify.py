"""polgrad_reference.verify: gradcheck with frozen stop-gradients, the finite-difference
formula check, the softmax bandit, the hand-derived goldens (docs/derivations/)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from polgrad_reference import ALGORITHMS, KLEstimator, PolicyLossConfig, surrogates
from polgrad_reference.errors import InputError, InputTypeError
from polgrad_reference.verify import (
    GOLDEN_CASES,
    FrozenStopGradients,
    GoldenCase,
    SoftmaxBandit,
    VerificationError,
    check_golden,
    check_gradient_formula,
    goldens_markdown,
    gradcheck_policy_loss,
    kl_loss_gradient,
    ragged_batch,
    train,
)

F64 = torch.float64
DOCS = Path(__file__).resolve().parents[2] / "docs" / "derivations"


def _inputs(cfg: PolicyLossConfig, seed: int) -> dict[str, Any]:
    batch = ragged_batch(cfg, seed=seed)
    if not cfg.kl_in_loss:
        batch.pop("ref_logprobs")
    if cfg.is_correction is None:
        batch.pop("rollout_logprobs")
    return batch


# ------------------------------------------------------------------ gradcheck


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_gradcheck_every_registry_algorithm_on_ragged_batches(name: str) -> None:
    cfg = ALGORITHMS[name].loss
    reached = 0
    for seed in range(3):
        result = gradcheck_policy_loss(cfg, **_inputs(cfg, seed))
        assert result.ok
        reached += int((result.analytic != 0).sum())
    assert reached > 0, "the batches never reach a token with a gradient"


def test_ragged_batches_reach_the_clipped_branches() -> None:
    # Clipped tokens (zero PPO gradient) and unclipped ones both occur, and GSPO's
    # sequence ratios fall inside and outside 1 +- 4e-4.
    cfg = ALGORITHMS["dapo"].loss
    grads = gradcheck_policy_loss(cfg, **_inputs(cfg, 0)).analytic
    mask = ragged_batch(cfg, seed=0)["response_mask"]
    assert bool(((grads == 0) & mask).any()) and bool(((grads != 0) & mask).any())
    gspo = ALGORITHMS["gspo"].loss
    g = gradcheck_policy_loss(gspo, **_inputs(gspo, 0)).analytic
    rows_with_grad = (g != 0).any(dim=1)
    assert bool(rows_with_grad.any()) and not bool(rows_with_grad.all())


def test_plain_finite_differences_fail_where_frozen_ones_pass() -> None:
    x0 = torch.tensor([1.0, -2.0, 0.5], dtype=F64, requires_grad=True)

    def loss(x: torch.Tensor) -> torch.Tensor:
        return (x.detach() * x).sum()  # gradient x0, not 2 x0

    assert not torch.autograd.gradcheck(loss, (x0,), raise_exception=False)
    frozen = FrozenStopGradients(loss)
    frozen(x0)
    assert torch.autograd.gradcheck(frozen, (x0,))


def test_gradcheck_sees_a_stop_gradient_written_with_no_grad(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A VESPO weight computed in a torch.no_grad() region gives the same autograd
    # gradient, and the frozen formulation holds it too (its first operation on a tensor
    # with a gradient is a cut); the same weight left differentiable is a different loss.
    def hidden(log_ratio, advantages, logprobs, gamma):  # type: ignore[no-untyped-def]
        with torch.no_grad():
            log_w = log_ratio.sum(dim=1, keepdim=True)
            k = torch.where(advantages >= 0, gamma.k_pos, gamma.k_neg)
            lam = torch.where(advantages >= 0, gamma.lambda_pos, gamma.lambda_neg)
            phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))
        return -(phi * advantages) * logprobs

    cfg = ALGORITHMS["vespo"].loss
    right = gradcheck_policy_loss(cfg, **_inputs(cfg, 1))
    monkeypatch.setattr(surrogates, "_vespo", hidden)
    seen = gradcheck_policy_loss(cfg, **_inputs(cfg, 1))
    assert seen.ok and torch.allclose(seen.analytic, right.analytic, rtol=1e-14, atol=1e-18)


class _WrongBackward(torch.autograd.Function):
    """The identity with its derivative off by a factor 1.01 (a wrong hand-written backward)."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        return x.clone()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        return grad * 1.01


def test_gradcheck_catches_a_wrong_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    import polgrad_reference.loss as loss_module

    right = loss_module.ratio  # type: ignore[attr-defined]
    wrong = _WrongBackward.apply
    monkeypatch.setattr(loss_module, "ratio", lambda *a: wrong(right(*a)))  # type: ignore[no-untyped-call]
    cfg = ALGORITHMS["dapo"].loss
    with pytest.raises(VerificationError, match="gradcheck FAILED"):
        gradcheck_policy_loss(cfg, **_inputs(cfg, 0))


def test_gradcheck_bad_input_is_named() -> None:
    cfg = ALGORITHMS["dapo"].loss
    batch = _inputs(cfg, 0)
    with pytest.raises(InputTypeError, match="logprobs must be a float64 tensor"):
        gradcheck_policy_loss(cfg, **{**batch, "logprobs": batch["logprobs"].float()})
    with pytest.raises(InputError, match="step must be a positive finite float"):
        gradcheck_policy_loss(cfg, **batch, step=math.inf)
    with pytest.raises(InputError, match="lengths must be positive ints"):
        ragged_batch(cfg, seed=0, lengths=(0, 2))


# ------------------------------------------------------- finite-difference formula


def _k3_loss(*, logprobs: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    lr = ref - logprobs
    return (torch.exp(lr) - 1 - lr).sum()


def _k3_gradient(*, logprobs: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    return 1 - torch.exp(ref - logprobs)  # d/dlp [e^(ref - lp) - 1 - (ref - lp)]


def _formula_inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    lp = -torch.rand(2, 5, generator=g, dtype=F64) - 0.1
    return {"logprobs": lp, "ref": lp + 0.4 * torch.randn(2, 5, generator=g, dtype=F64)}


def test_formula_check_passes_a_right_derivation_of_right_code() -> None:
    result = check_gradient_formula(_k3_loss, _k3_gradient, _formula_inputs(), wrt="logprobs")
    assert result.ok and result.formula_error < 0.1


def test_formula_check_fails_a_wrong_derivation() -> None:
    def wrong(*, logprobs: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        return torch.exp(ref - logprobs) - 1  # sign error in the derivation

    with pytest.raises(VerificationError, match="the formula"):
        check_gradient_formula(_k3_loss, wrong, _formula_inputs(), wrt="logprobs")


def test_formula_check_fails_wrong_code_with_a_right_derivation() -> None:
    def buggy(*, logprobs: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        lr = logprobs - ref  # the code flips the log-ratio
        return (torch.exp(lr) - 1 - lr).sum()

    with pytest.raises(VerificationError, match="the formula"):
        check_gradient_formula(buggy, _k3_gradient, _formula_inputs(), wrt="logprobs")


def test_formula_check_sees_stop_gradients() -> None:
    def straight_through(*, logprobs: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        lr = ref - logprobs
        k2 = 0.5 * lr * lr
        k3 = torch.exp(lr) - 1 - lr
        return (k2 - k2.detach() + k3.detach()).sum()  # k3's value, k2's gradient

    def k2_grad(*, logprobs: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        return logprobs - ref

    assert check_gradient_formula(straight_through, k2_grad, _formula_inputs(), wrt="logprobs").ok
    with pytest.raises(VerificationError):
        check_gradient_formula(straight_through, _k3_gradient, _formula_inputs(), wrt="logprobs")


def test_formula_check_bad_input_is_named() -> None:
    with pytest.raises(InputError, match="wrt='x' is not among the inputs"):
        check_gradient_formula(_k3_loss, _k3_gradient, _formula_inputs(), wrt="x")
    inputs = {k: v.float() for k, v in _formula_inputs().items()}
    with pytest.raises(InputTypeError, match="must be a float64 tensor"):
        check_gradient_formula(_k3_loss, _k3_gradient, inputs, wrt="logprobs")


# --------------------------------------------------------------------- bandit


BANDIT = SoftmaxBandit(
    rewards=torch.tensor([0.0, 0.3, 1.0, 0.2]), ref_logits=torch.tensor([0.5, 0.0, -0.5, 0.2])
)
THETA = torch.tensor([0.3, -0.2, 0.1, 0.4], dtype=F64)
# Max over 4 logits of |N(0,1)|: P(> 4.5) < 3e-5; 10 is the bias threshold of the claim.
CLT = 4.5


def test_bandit_closed_forms_match_autograd() -> None:
    theta = THETA.clone().requires_grad_(True)
    (dj,) = torch.autograd.grad(BANDIT.objective(theta), theta)
    (dkl,) = torch.autograd.grad(BANDIT.kl(theta), theta)
    assert torch.allclose(dj, BANDIT.objective_gradient(THETA), rtol=1e-14, atol=1e-16)
    assert torch.allclose(dkl, BANDIT.kl_gradient(THETA), rtol=1e-14, atol=1e-16)


@pytest.mark.parametrize("estimator", ["k2", "k1+", "k3+", "abs+"])
def test_k2_gradient_as_a_loss_is_the_kl_gradient(estimator: str) -> None:
    est = kl_loss_gradient(BANDIT, THETA, KLEstimator(estimator), samples=100_000, seed=1)
    assert est.distance(BANDIT.kl_gradient(THETA)) < CLT


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_k1_and_k3_gradients_as_a_loss_are_not_the_kl_gradient(estimator: str) -> None:
    est = kl_loss_gradient(BANDIT, THETA, KLEstimator(estimator), samples=100_000, seed=2)
    assert est.distance(BANDIT.kl_gradient(THETA)) > 10.0


def test_k3_gradient_as_a_loss_is_the_forward_kl_gradient() -> None:
    # E[d k3] = sum_a (pi_a - ref_a) d log pi_a = d KL(ref || pi) = pi - ref on the softmax.
    est = kl_loss_gradient(BANDIT, THETA, KLEstimator.K3, samples=100_000, seed=3)
    forward = torch.softmax(THETA, 0) - torch.softmax(BANDIT.ref_logits, 0)
    assert est.distance(forward) < CLT


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_registry_algorithm_optimises_the_bandit(name: str) -> None:
    run = train(name, BANDIT, steps=150, seed=0)
    assert run.best_arm_probability > 0.9
    assert int(torch.argmax(run.logits)) == int(torch.argmax(BANDIT.rewards))
    assert run.objectives[-1] > 0.9


def test_bandit_bad_input_is_named() -> None:
    with pytest.raises(InputError, match="same shape"):
        SoftmaxBandit(rewards=torch.zeros(3), ref_logits=torch.zeros(4))
    with pytest.raises(InputError, match="at least 2 arms"):
        SoftmaxBandit(rewards=torch.zeros(1), ref_logits=torch.zeros(1))
    with pytest.raises(InputError, match="samples must be >= 2"):
        kl_loss_gradient(BANDIT, THETA, KLEstimator.K2, samples=1, seed=0)


# -------------------------------------------------------------------- goldens


@pytest.mark.parametrize("case", GOLDEN_CASES, ids=lambda c: c.name)
def test_hand_derived_golden(case: GoldenCase) -> None:
    check_golden(case)


def test_a_wrong_golden_is_reported() -> None:
    case = GOLDEN_CASES[0]

    def shifted() -> tuple[torch.Tensor, torch.Tensor]:
        computed, expected = case.evaluate()
        return computed, expected + 1e-9

    with pytest.raises(VerificationError, match="pg-clip-token-mean"):
        check_golden(GoldenCase(case.name, case.claim, case.arithmetic, shifted))


def test_goldens_page_is_current() -> None:
    text = (DOCS / "goldens.md").read_text()
    begin, end = "<!-- BEGIN generated: goldens -->\n", "<!-- END generated: goldens -->"
    assert begin in text and end in text, "docs/derivations/goldens.md lost its markers"
    block = text.split(begin, 1)[1].split(end, 1)[0]
    assert block == goldens_markdown(), "regenerate: python tools/generate_docs.py"
