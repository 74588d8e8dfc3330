"""Kept-mass bias of the trainer/rollout ratio under a truncating sampler
(docs/logprobs.md, "The truncation bias").

Null: with ``top_p = 1`` and ``top_k = 0`` nothing is truncated and the ratio is exactly 1.
Closed form: under truncation the ratio at a kept token is the kept mass ``M``, checked
against the realised ``exp(trainer_lp - sampler_lp)`` of tokens drawn from the sampler.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from polgrad_reference.diagnostics.sampling import sampling_bias
from polgrad_reference.errors import ConfigError, InputError, InputTypeError
from polgrad_reference.logprobs import sampler_log_softmax, sampler_logprobs, token_logprobs

F64 = torch.float64


def _zipf(
    seed: int, b: int, t: int, v: int, s_range: tuple[float, float] = (1.05, 6.0)
) -> torch.Tensor:
    """Zipf-shaped logits ``-s log(rank) + N(0, 0.5^2)``, ``s`` uniform per position, over
    a random permutation of the vocabulary (bench/logprobs_figures.py's family)."""
    g = torch.Generator().manual_seed(seed)
    log_rank = torch.arange(1, v + 1, dtype=F64).log()
    s = s_range[0] + (s_range[1] - s_range[0]) * torch.rand((b, t, 1), generator=g, dtype=F64)
    z = -s * log_rank + 0.5 * torch.randn((b, t, v), generator=g, dtype=F64)
    return z[..., torch.randperm(v, generator=g)]


def _mask(seed: int, b: int, t: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t + 1, (b, 1), generator=g)
    return torch.arange(t)[None] < lengths


@pytest.mark.parametrize("tau", [1.0, 0.6, 1.4])
@pytest.mark.parametrize("dtype", [F64, torch.float32, torch.bfloat16])
def test_no_truncation_gives_ratio_exactly_one(tau: float, dtype: torch.dtype) -> None:
    z = _zipf(0, 4, 8, 300).to(dtype)
    mask = _mask(0, 4, 8)
    r = sampling_bias(logits=z, response_mask=mask, temperature=tau)
    assert r.mean_ratio == 1.0 and r.min_ratio == 1.0 and r.mean_log_ratio == 0.0
    assert r.frac_outside_band == 0.0 and r.mean_sequence_log_ratio == 0.0
    assert bool((r.token_ratio == 1.0).all()) and r.mean_kept_tokens == 300.0
    assert r.n_tokens == int(mask.sum()) and r.n_sequences == 4


def test_ratio_is_the_realised_trainer_over_sampler_ratio() -> None:
    """Draw tokens from the sampler; ``exp(trainer_lp - sampler_lp)`` equals the reported
    ``token_ratio`` at every response token (the closed form ``w = M``)."""
    b, t, v = 6, 10, 400
    z = _zipf(1, b, t, v)
    mask = _mask(1, b, t)
    tau, top_p, top_k = 0.8, 0.8, 50
    lq = sampler_log_softmax(logits=z, temperature=tau, top_p=top_p, top_k=top_k)
    g = torch.Generator().manual_seed(2)
    y = torch.multinomial(lq.exp().reshape(-1, v), 1, generator=g).reshape(b, t)
    rollout = sampler_logprobs(logits=z, tokens=y, temperature=tau, top_p=top_p, top_k=top_k)
    trainer = token_logprobs(logits=z, input_ids=y, shift="none", temperature=tau)
    realised = torch.exp(trainer - rollout)
    r = sampling_bias(
        logits=z, response_mask=mask, temperature=tau, top_p=top_p, top_k=top_k, tokens=y
    )
    torch.testing.assert_close(r.token_ratio[mask], realised[mask], rtol=1e-12, atol=0.0)
    assert r.n_outside_kept == 0
    assert r.mean_ratio == pytest.approx(float(realised[mask].mean()), rel=1e-12)


def test_top_p_08_biases_the_ratio_below_one() -> None:
    """TRL #6789's setting, qualitatively: at top_p = 0.8 every ratio lies in [0.8, 1),
    the mean is well below 1 and a large share of tokens falls outside [0.9, 1.1]."""
    z = _zipf(3, 8, 32, 2048)
    mask = torch.ones(8, 32, dtype=torch.bool)
    r = sampling_bias(logits=z, response_mask=mask, temperature=1.0, top_p=0.8)
    assert r.min_ratio >= 0.8 and float(r.token_ratio.max()) < 1.0
    assert 0.85 < r.mean_ratio < 0.95
    assert 0.25 < r.frac_outside_band < 0.75
    assert r.mean_log_ratio < math.log(r.mean_ratio) < 0.0  # Jensen
    # a sequence-level ratio compounds it over the 32 tokens of a row
    assert r.mean_sequence_log_ratio == pytest.approx(32 * r.mean_log_ratio, rel=1e-12)
    milder = sampling_bias(logits=z, response_mask=mask, temperature=1.0, top_p=0.95)
    assert r.mean_ratio < milder.mean_ratio < 1.0 and milder.min_ratio >= 0.95


def test_per_row_summaries() -> None:
    z = _zipf(4, 5, 7, 200)
    mask = _mask(4, 5, 7)
    mask[2] = False  # an empty row
    r = sampling_bias(logits=z, response_mask=mask, temperature=1.0, top_k=5, band=(0.95, 1.05))
    w = r.token_ratio
    assert bool((w[~mask] == 1.0).all())
    for row in range(5):
        sel = w[row][mask[row]]
        if sel.numel() == 0:
            assert math.isnan(float(r.row_mean_ratio[row])) and r.row_log_ratio[row] == 0.0
            continue
        assert float(r.row_mean_ratio[row]) == pytest.approx(float(sel.mean()), rel=1e-14)
        assert float(r.row_log_ratio[row]) == pytest.approx(float(sel.log().sum()), rel=1e-12)
        outside = float(((sel < 0.95) | (sel > 1.05)).double().mean())
        assert float(r.row_frac_outside[row]) == pytest.approx(outside, rel=1e-14)
    has = mask.any(dim=1)
    assert r.min_row_mean_ratio == float(r.row_mean_ratio[has].min())
    assert r.min_sequence_log_ratio == float(r.row_log_ratio[has].min())
    assert r.max_row_frac_outside == float(r.row_frac_outside[has].max())
    assert r.mean_kept_tokens >= 5.0


def test_full_vocabulary_logprobs_give_the_same_result_as_logits() -> None:
    z = _zipf(5, 3, 6, 256) + 7.0
    mask = _mask(5, 3, 6)
    a = sampling_bias(logits=z, response_mask=mask, temperature=0.7, top_p=0.9, top_k=20)
    lp = torch.log_softmax(z, dim=-1)
    b = sampling_bias(logprobs=lp, response_mask=mask, temperature=0.7, top_p=0.9, top_k=20)
    torch.testing.assert_close(a.token_ratio, b.token_ratio, rtol=1e-12, atol=0.0)


def test_tokens_outside_the_kept_set_are_counted() -> None:
    z = torch.log(torch.tensor([[[0.5, 0.3, 0.2], [0.6, 0.3, 0.1]]], dtype=F64))
    mask = torch.ones(1, 2, dtype=torch.bool)
    r = sampling_bias(
        logits=z, response_mask=mask, temperature=1.0, top_k=2, tokens=torch.tensor([[0, 2]])
    )
    assert r.n_outside_kept == 1 and "1 token(s) outside the kept set" in r.summary()
    assert r.token_ratio[0].tolist() == pytest.approx([0.8, 0.9], rel=1e-14)


def test_metrics_summary_and_padding_may_hold_nan() -> None:
    z = _zipf(6, 2, 4, 64)
    mask = torch.tensor([[True, True, False, False], [True, False, False, False]])
    z[~mask] = math.nan  # padding is never read
    r = sampling_bias(logits=z, response_mask=mask, temperature=1.0, top_p=0.8)
    m = r.as_metrics()
    assert m["sampling/n_tokens"] == 3.0 and "sampling/mean_ratio" in m
    assert "sampling/n_outside_kept" not in m
    assert "top_p=0.8" in r.summary() and "outside [0.9, 1.1]" in r.summary()


@pytest.mark.parametrize(
    ("over", "error", "match"),
    [
        ({"logits": None}, ConfigError, "exactly one of logits and logprobs"),
        ({"logprobs": torch.zeros(2, 3, 5)}, ConfigError, "exactly one of logits and logprobs"),
        ({"logits": torch.zeros(2, 3)}, InputError, r"logits must have shape \[B, T, V\]"),
        ({"logits": torch.zeros(2, 3, 5, dtype=torch.int64)}, InputTypeError, "floating-point"),
        ({"response_mask": torch.ones(2, 3)}, InputTypeError, "response_mask must be a torch.bool"),
        ({"response_mask": torch.zeros(2, 3, dtype=torch.bool)}, InputError, "selects no token"),
        ({"top_p": 0.0}, ConfigError, "top_p must lie in"),
        ({"top_k": -1}, ConfigError, "top_k must be an integer >= 0"),
        ({"temperature": 0.0}, ConfigError, "temperature must be finite and > 0"),
        ({"band": (1.1, 0.9)}, ConfigError, "band must satisfy"),
        ({"tokens": torch.zeros(2, 3)}, InputError, "tokens must be an integer tensor"),
        ({"tokens": torch.zeros(2, 2, dtype=torch.int64)}, InputError, "tokens must have shape"),
    ],
)
def test_bad_input_names_the_argument(over: dict[str, Any], error: type, match: str) -> None:
    kw: dict[str, Any] = {
        "logits": torch.zeros(2, 3, 5, dtype=F64),
        "response_mask": torch.ones(2, 3, dtype=torch.bool),
        "temperature": 1.0,
    }
    with pytest.raises(error, match=match):
        sampling_bias(**{**kw, **over})


def test_nan_logits_at_a_response_token_are_named() -> None:
    z = torch.zeros(2, 3, 5, dtype=F64)
    z[1, 2, 0] = math.nan
    with pytest.raises(InputError, match=r"response positions \(1, 2\)"):
        sampling_bias(logits=z, response_mask=torch.ones(2, 3, dtype=torch.bool), temperature=1.0)
