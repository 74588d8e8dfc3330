"""Entropy estimates (docs/diagnostics.md, "Entropy").

The sampled estimator is unbiased on-policy: over R replicates of sampling tokens from
known categorical policies, (sampled - exact) / stderr is within 1.96 in 95% of them
(tolerance 3 binomial standard errors). Off-policy it is biased (the invalid use fails).
"""

from __future__ import annotations

import math

import pytest
import torch

from polgrad_reference.diagnostics import entropy_from_logits, entropy_from_logprobs
from polgrad_reference.errors import ConfigError, InputError, InputTypeError


def _policy(
    seed: int, b: int = 32, t: int = 16, v: int = 12
) -> tuple[torch.Tensor, torch.Tensor, torch.Generator]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.arange(t)[None] < torch.randint(1, t + 1, (b, 1), generator=g)
    logits = 1.5 * torch.randn((b, t, v), generator=g, dtype=torch.float64)
    return logits, mask, g


def _sample_logprobs(
    logits: torch.Tensor, g: torch.Generator, sample_logits: torch.Tensor | None = None
) -> torch.Tensor:
    src = logits if sample_logits is None else sample_logits
    b, t, v = src.shape
    probs = torch.softmax(src, dim=-1).reshape(-1, v)
    tokens = torch.multinomial(probs, 1, generator=g).reshape(b, t, 1)
    return torch.log_softmax(logits, dim=-1).gather(-1, tokens).squeeze(-1)


def test_sampled_estimator_is_unbiased_on_policy_with_calibrated_stderr() -> None:
    reps, inside = 200, 0
    for seed in range(reps):
        logits, mask, g = _policy(seed)
        exact = entropy_from_logits(logits=logits, response_mask=mask)
        est = entropy_from_logprobs(logprobs=_sample_logprobs(logits, g), response_mask=mask)
        inside += abs(est.mean - exact.mean) <= 1.96 * est.stderr
    cover = inside / reps
    assert abs(cover - 0.95) <= 3 * math.sqrt(0.95 * 0.05 / reps) + 0.01, cover


def test_sampled_estimator_is_biased_off_policy() -> None:
    logits, mask, g = _policy(500, b=64)
    exact = entropy_from_logits(logits=logits, response_mask=mask)
    # tokens sampled from a sharper policy, scored by the trainer's: not the entropy
    est = entropy_from_logprobs(
        logprobs=_sample_logprobs(logits, g, 3.0 * logits), response_mask=mask
    )
    assert exact.mean - est.mean > 10 * est.stderr


def test_exact_entropy_closed_forms() -> None:
    mask = torch.tensor([[True, True, False]])
    uniform = torch.zeros((1, 3, 8), dtype=torch.float64)
    assert entropy_from_logits(logits=uniform, response_mask=mask).mean == pytest.approx(
        math.log(8), rel=1e-15
    )
    masked_vocab = uniform.clone()
    masked_vocab[..., 4:] = -math.inf  # four live tokens, the rest masked out
    assert entropy_from_logits(logits=masked_vocab, response_mask=mask).mean == pytest.approx(
        math.log(4), rel=1e-15
    )
    one_hot = torch.full((1, 3, 8), -math.inf, dtype=torch.float64)
    one_hot[..., 2] = 0.0
    assert entropy_from_logits(logits=one_hot, response_mask=mask).mean == 0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_low_precision_logits_are_computed_in_float32(dtype: torch.dtype) -> None:
    logits, mask, _ = _policy(600)
    low = logits.to(dtype)
    got = entropy_from_logits(logits=low, response_mask=mask)
    ref = entropy_from_logits(logits=low.double(), response_mask=mask)
    assert got.mean == pytest.approx(ref.mean, rel=1e-6)  # float32 accumulation


def test_padding_is_ignored_and_chunking_is_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    from polgrad_reference.diagnostics import entropy as module

    logits, mask, _ = _policy(700)
    dirty = logits.clone()
    dirty[~mask] = math.nan
    whole = entropy_from_logits(logits=dirty, response_mask=mask)
    monkeypatch.setattr(module, "_CHUNK_ELEMENTS", 1)  # one row per chunk
    chunked = entropy_from_logits(logits=dirty, response_mask=mask)
    assert whole == chunked
    clean = entropy_from_logits(logits=logits, response_mask=mask)
    assert whole == clean


def test_single_row_stderr_is_not_estimable() -> None:
    logits, mask, _ = _policy(800, b=1)
    mask[0, 0] = True
    assert entropy_from_logits(logits=logits, response_mask=mask).stderr == math.inf


def test_bad_inputs_are_named() -> None:
    logits, mask, g = _policy(900)
    lp = _sample_logprobs(logits, g)
    bad = lp.clone()
    bad[0, 0] = 0.5
    with pytest.raises(InputError, match=r"logprobs must be <= 0, got positive values at \(0, 0\)"):
        entropy_from_logprobs(logprobs=bad, response_mask=mask)
    nan = logits.clone()
    nan[1, 0, 3] = math.nan
    with pytest.raises(InputError, match=r"logits hold NaN at response positions \(1, 0\)"):
        entropy_from_logits(logits=nan, response_mask=mask)
    inf = logits.clone()
    inf[2, 0, 0] = math.inf
    with pytest.raises(InputError, match=r"logits hold \+inf at response positions \(2, 0\)"):
        entropy_from_logits(logits=inf, response_mask=mask)
    dead = logits.clone()
    dead[3, 0] = -math.inf
    with pytest.raises(InputError, match=r"every logit is -inf .* positions \(3, 0\)"):
        entropy_from_logits(logits=dead, response_mask=mask)
    with pytest.raises(InputError, match=r"logits must have shape \[B, T, V\]"):
        entropy_from_logits(logits=logits[:, :-1], response_mask=mask)
    with pytest.raises(InputTypeError, match="logits must have a floating-point dtype"):
        entropy_from_logits(logits=logits.long(), response_mask=mask)


@pytest.mark.parametrize("b", [2, 4])
def test_student_t_interval_covers_at_small_batches(b: int) -> None:
    """1.96 stderr covers 0.68 (B = 2) and 0.85 (B = 4); the t_{B-1} interval 0.95."""
    reps, inside, normal = 400, 0, 0
    for seed in range(reps):
        logits, mask, g = _policy(seed, b=b)
        exact = entropy_from_logits(logits=logits, response_mask=mask).mean
        est = entropy_from_logprobs(logprobs=_sample_logprobs(logits, g), response_mask=mask)
        lo, hi = est.interval(0.95)
        inside += lo <= exact <= hi
        normal += abs(est.mean - exact) <= 1.96 * est.stderr
    tol = 3 * math.sqrt(0.95 * 0.05 / reps)
    assert abs(inside / reps - 0.95) <= tol, inside / reps
    assert normal / reps < 0.95 - tol  # why the t quantile


def test_interval_needs_two_rows_and_a_level() -> None:
    logits, mask, _ = _policy(1, b=1)
    est = entropy_from_logits(logits=logits, response_mask=mask)
    with pytest.raises(InputError, match="too few rows to decide: an entropy interval needs"):
        est.interval()
    two = entropy_from_logits(logits=_policy(1, b=2)[0], response_mask=_policy(1, b=2)[1])
    lo, hi = two.interval(0.9)
    assert lo < two.mean < hi
    with pytest.raises(ConfigError, match="level must be a confidence level"):
        two.interval(95)
