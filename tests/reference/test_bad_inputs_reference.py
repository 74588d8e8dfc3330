"""Issue 28, reference bullet: meta, sparse and quantized tensors get a named
``InputTypeError`` (never a raw torch ``RuntimeError``); positive log-probabilities are
refused by ``policy_loss`` and the KL functions as they are by the entropy estimate;
``categorical_kl`` takes ``-inf`` logits (an excluded token) as ``token_entropy`` does."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

from polgrad_reference import (
    CovarianceSelection,
    InputError,
    InputTypeError,
    PolicyLossConfig,
    categorical_kl,
    covariance_selection,
    kl_estimate,
    kl_penalized_rewards,
    policy_loss,
    reverse_kl_surrogate,
    sampled_token_entropy,
    token_entropy,
)
from tests.helpers.ragged import build

F64 = torch.float64
INF = float("inf")
CFG = PolicyLossConfig()


def _batch() -> dict[str, Any]:
    b = build([1, 3], seed=0, width=4)
    del b["ref_logprobs"], b["rollout_logprobs"]
    return b


def _quantized(t: torch.Tensor) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized creation is deprecated, still possible
        return torch.quantize_per_tensor(t.float().nan_to_num(), 0.1, 0, torch.qint8)


def _all_meta(b: dict[str, Any]) -> dict[str, Any]:
    return {k: t.to("meta") if isinstance(t, torch.Tensor) else t for k, t in b.items()}


LAYOUT_CASES: dict[str, tuple[Callable[[dict[str, Any]], dict[str, Any]], str]] = {
    "sparse logprobs": (
        lambda b: {**b, "logprobs": b["logprobs"].nan_to_num().to_sparse()},
        r"logprobs must be a dense \(strided\) tensor, got layout torch.sparse_coo; .*to_dense",
    ),
    "sparse csr advantages": (
        lambda b: {**b, "advantages": b["advantages"][:, None].expand(2, 4).to_sparse_csr()},
        r"advantages must be a dense \(strided\) tensor, got layout torch.sparse_csr",
    ),
    "quantized old_logprobs": (
        lambda b: {**b, "old_logprobs": _quantized(b["old_logprobs"])},
        r"old_logprobs is a quantized tensor \(torch.qint8\); pass old_logprobs.dequantize\(\)",
    ),
    "all on meta": (
        _all_meta,
        r"logprobs is a meta tensor \(shape \[2, 4\], no data\)",
    ),
}


@pytest.mark.parametrize("case", list(LAYOUT_CASES))
def test_policy_loss_names_a_tensor_it_cannot_read(case: str) -> None:
    change, words = LAYOUT_CASES[case]
    with pytest.raises(InputTypeError, match=words):
        policy_loss(CFG, **change(_batch()))


def test_token_entropy_on_meta_names_the_tensor() -> None:
    with pytest.raises(InputTypeError, match=r"is a meta tensor"):
        token_entropy(
            logits=torch.zeros(1, 2, 3, dtype=F64, device="meta"),
            response_mask=torch.ones(1, 2, dtype=torch.bool, device="meta"),
        )


def test_sparse_logits_are_named() -> None:
    with pytest.raises(InputTypeError, match=r"p_logits must be a dense \(strided\) tensor"):
        categorical_kl(
            p_logits=torch.zeros(2, 3, dtype=F64).to_sparse(), q_logits=torch.zeros(2, 3, dtype=F64)
        )


def _positive(b: dict[str, Any]) -> torch.Tensor:
    lp: torch.Tensor = b["logprobs"].clone()
    lp[1, 2] = 0.5
    return lp


def test_policy_loss_refuses_a_positive_logprob_at_a_response_position() -> None:
    b = _batch()
    with pytest.raises(InputError, match=r"logprobs must be <= 0, got positive values at \(1, 2\)"):
        policy_loss(CFG, **{**b, "logprobs": _positive(b)})


def test_zero_and_positive_padding_logprobs_are_fine() -> None:
    """``0`` is a token of probability 1; a positive value at padding is never read."""
    b = _batch()
    lp = b["logprobs"].clone()
    lp[1, 0] = 0.0
    lp[0, 3] = 7.0  # padding (row 0 has one token)
    assert bool(policy_loss(CFG, **{**b, "logprobs": lp}).loss.isfinite())


def test_covariance_selection_refuses_positive_logprobs() -> None:
    b = _batch()
    params = CovarianceSelection(fraction=0.5, kl_coef=0.5)
    cfg = PolicyLossConfig(surrogate="kl_cov", params=params)  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"logprobs must be <= 0"):
        covariance_selection(cfg, **{**b, "logprobs": _positive(b)})


KL_CALLS: dict[str, Callable[..., torch.Tensor]] = {
    "kl_estimate": lambda **kw: kl_estimate("k3", **kw),
    "reverse_kl_surrogate": reverse_kl_surrogate,
    "kl_penalized_rewards": lambda **kw: kl_penalized_rewards(
        coef=0.1, rewards=torch.zeros(2, dtype=F64), **kw
    ),
    "sampled_token_entropy": lambda **kw: sampled_token_entropy(
        logprobs=kw["logprobs"], response_mask=kw["response_mask"]
    ),
}


@pytest.mark.parametrize("name", list(KL_CALLS))
def test_token_functions_refuse_positive_logprobs(name: str) -> None:
    b = _batch()
    args = {"logprobs": _positive(b), "ref_logprobs": b["old_logprobs"]}
    with pytest.raises(InputError, match=r"logprobs must be <= 0, got positive values at \(1, 2\)"):
        KL_CALLS[name](response_mask=b["response_mask"], **args)


def test_categorical_kl_takes_minus_inf_logits_as_token_entropy_does() -> None:
    """``KL(p || q)`` with ``p_2 = q_2 = 0`` is the KL over the two other outcomes."""
    p = torch.tensor([[0.0, -INF, 1.0]], dtype=F64, requires_grad=True)
    q = torch.tensor([[0.5, -INF, 1.0]], dtype=F64, requires_grad=True)
    kl = categorical_kl(p_logits=p, q_logits=q)
    two = categorical_kl(
        p_logits=torch.tensor([[0.0, 1.0]], dtype=F64),
        q_logits=torch.tensor([[0.5, 1.0]], dtype=F64),
    )
    torch.testing.assert_close(kl.detach(), two, rtol=0, atol=1e-15)
    gp, gq = torch.autograd.grad(kl.sum(), (p, q))
    assert bool(gp.isfinite().all()) and bool(gq.isfinite().all())
    assert float(gp[0, 1]) == 0.0 and float(gq[0, 1]) == 0.0
    # the same logits are accepted by token_entropy
    assert bool(
        token_entropy(logits=p.detach()[None], response_mask=torch.ones(1, 1, dtype=torch.bool))
        .isfinite()
        .all()
    )


KL_LOGIT_CASES: dict[str, tuple[list[float], list[float], str]] = {
    "q excludes a token p has": (
        [0.5, 1.0, 0.0],
        [0.5, 1.0, -INF],
        r"KL\(p \|\| q\) is \+inf: q_logits are -inf where p has probability > 0, at positions "
        r"\(0, 2\)",
    ),
    "p all -inf": ([-INF, -INF, -INF], [0.0, 0.0, 0.0], r"p_logits is -inf over the whole last"),
    "q all -inf": ([-INF, -INF, 0.0], [-INF, -INF, -INF], r"q_logits is -inf over the whole last"),
    "p NaN": (
        [float("nan"), 0.0, 0.0],
        [0.0, 0.0, 0.0],
        r"p_logits holds NaN at positions \(0, 0\)",
    ),
    "q +inf": ([0.0, 0.0, 0.0], [0.0, INF, 0.0], r"q_logits holds \+inf at positions \(0, 1\)"),
}


@pytest.mark.parametrize("case", list(KL_LOGIT_CASES))
def test_categorical_kl_refuses_what_has_no_finite_kl(case: str) -> None:
    p, q, words = KL_LOGIT_CASES[case]
    with pytest.raises(InputError, match=words):
        categorical_kl(p_logits=torch.tensor([p], dtype=F64), q_logits=torch.tensor([q], dtype=F64))


REFERENCE_BAD_INPUT_COUNT = len(LAYOUT_CASES) + 2 + 2 + len(KL_CALLS) + len(KL_LOGIT_CASES)
"""Distinct bad inputs above: layouts, meta logits, sparse logits, positive logprobs to
``policy_loss`` and ``covariance_selection``, to the token functions, and bad logits."""
