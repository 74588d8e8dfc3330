"""The logprobs kind through the public API: correct implementations (plain, chunked over
the vocabulary, packed, float32 from bfloat16, TRL-style slicing) pass every check in
float64, float32 and bfloat16 inputs; the bugs of issue 31 each fail the check that names
them, with a diagnosis saying what the function computes instead (docs/logprobs.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from pytest_polgrad import assert_conforms
from pytest_polgrad.api import ConformanceError, ConformanceReport
from pytest_polgrad.core.options import MarkerError

BUDGET = 8
T = torch.Tensor


def _run(
    fn: Callable[..., Any], reference: str = "next-token", **options: Any
) -> ConformanceReport:
    try:
        return assert_conforms(
            fn, reference, kind="logprobs", max_examples=BUDGET, seed=3, **options
        )
    except ConformanceError as exc:
        return exc.report


def _failed(report: ConformanceReport) -> dict[str, Any]:
    return {r.check: r for r in report.results if not r.passed}


def _work(z: T) -> T:
    return z if z.dtype == torch.float64 else z.float()


# ---- correct implementations ------------------------------------------------------------


def plain(logits: T, input_ids: T, response_mask: T, temperature: float) -> T:
    lp = torch.log_softmax(_work(logits) / temperature, dim=-1)
    out = torch.zeros(input_ids.shape, dtype=lp.dtype)
    out[:, 1:] = lp[:, :-1].gather(-1, input_ids[:, 1:, None])[..., 0]
    return torch.where(response_mask, out, 0.0)


def trl_style(logits: T, input_ids: T, temperature: float) -> T:
    """Slice the logits, score every position (no mask), pad the first column with 0."""
    z = _work(logits[:, :-1]) / temperature
    picked = z.gather(-1, input_ids[:, 1:, None])[..., 0] - torch.logsumexp(z, dim=-1)
    return torch.nn.functional.pad(picked, (1, 0))


def chunked(logits: T, input_ids: T, response_mask: T, temperature: float) -> T:
    """The normaliser in chunks of 1000 vocabulary entries (two passes: max, shifted sum)."""
    u = _work(logits) / temperature
    m = torch.stack([c.detach().amax(-1) for c in u.split(1000, -1)]).amax(0)
    m = torch.where(torch.isfinite(m), m, 0.0)
    s = sum(torch.exp(c - m[..., None]).sum(-1) for c in u.split(1000, -1))
    lse = m + torch.log(s)
    out = torch.zeros(input_ids.shape, dtype=u.dtype)
    picked = u[:, :-1].gather(-1, input_ids[:, 1:, None])[..., 0] - lse[:, :-1]
    out[:, 1:] = picked
    return torch.where(response_mask, out, 0.0)


def rolled(logits: T, input_ids: T, response_mask: T, temperature: float) -> T:
    """align='logits': out[s] scores input_ids[s + 1] with logits row s (labels rolled)."""
    lp = torch.log_softmax(_work(logits) / temperature, dim=-1)
    labels = torch.roll(input_ids, -1, dims=1)  # within each row: the wrap lands on padding
    return torch.where(response_mask, lp.gather(-1, labels[..., None])[..., 0], 0.0)


def packed_ok(logits: T, input_ids: T, cu_seqlens: T, temperature: float) -> T:
    """Packed [N, V]: the shift inside each cu_seqlens segment; a sequence's first is 0."""
    lp = torch.log_softmax(_work(logits) / temperature, dim=-1)
    n = input_ids.shape[0]
    starts = torch.zeros(n, dtype=torch.bool)
    starts[cu_seqlens[:-1].long().clamp(max=n - 1)] = True
    prev = torch.cat([lp[:1], lp[:-1]])  # row s - 1, never used at a start
    out = prev.gather(-1, input_ids[:, None])[:, 0]
    return torch.where(starts, 0.0, out)


def fixed_temperature(logits: T, input_ids: T, response_mask: T) -> T:
    return plain(logits, input_ids, response_mask, 0.7)


# ---- the bugs --------------------------------------------------------------------------


def no_shift(logits: T, input_ids: T, response_mask: T, temperature: float) -> T:
    lp = torch.log_softmax(_work(logits) / temperature, dim=-1)
    return torch.where(response_mask, lp.gather(-1, input_ids[..., None])[..., 0], 0.0)


def shift_wrong_way(logits: T, input_ids: T, response_mask: T, temperature: float) -> T:
    lp = torch.log_softmax(_work(logits) / temperature, dim=-1)
    out = torch.zeros(input_ids.shape, dtype=lp.dtype)
    out[:, :-1] = lp[:, 1:].gather(-1, input_ids[:, :-1, None])[..., 0]
    return torch.where(response_mask, out, 0.0)


def off_by_one(logits: T, input_ids: T, response_mask: T, temperature: float) -> T:
    """Rolled labels (align='logits') handed to a loss that expects align='token'."""
    lp = torch.log_softmax(_work(logits) / temperature, dim=-1)
    labels = torch.roll(input_ids, -1, dims=1)
    out = lp.gather(-1, labels[..., None])[..., 0]
    return torch.where(response_mask, out, 0.0)


def no_temperature(logits: T, input_ids: T, response_mask: T, temperature: float) -> T:
    return plain(logits, input_ids, response_mask, 1.0)


def temperature_twice(logits: T, input_ids: T, response_mask: T, temperature: float) -> T:
    return plain(logits / temperature, input_ids, response_mask, temperature)


def trainer_without_rollout_temperature(logits: T, input_ids: T, response_mask: T) -> T:
    """The rollout sampled (and reported logprobs) at 0.7; the trainer scores at 1."""
    return plain(logits, input_ids, response_mask, 1.0)


def bf16_log_softmax(logits: T, input_ids: T, response_mask: T, temperature: float) -> T:
    lp = torch.log_softmax(logits / temperature, dim=-1)  # stays in bfloat16
    out = torch.zeros(input_ids.shape, dtype=lp.dtype)
    out[:, 1:] = lp[:, :-1].gather(-1, input_ids[:, 1:, None])[..., 0]
    return torch.where(response_mask, out, torch.zeros((), dtype=lp.dtype))


def packed_roll(logits: T, input_ids: T, cu_seqlens: T, temperature: float) -> T:
    """torch.roll over the whole stream (verl #6475), results moved under their tokens."""
    lp = torch.log_softmax(_work(logits) / temperature, dim=-1)
    labels = torch.roll(input_ids, -1, dims=0)
    from_rows = lp.gather(-1, labels[:, None])[:, 0]  # row s scores token s + 1
    return torch.roll(from_rows, 1, dims=0)


def sentinel_padding(logits: T, input_ids: T, response_mask: T, temperature: float) -> T:
    """INVALID_LOGPROB = 1.0 at padding (TRL PPO before #6121)."""
    return torch.where(response_mask, plain(logits, input_ids, response_mask, temperature), 1.0)


def no_max_shift(logits: T, input_ids: T, response_mask: T, temperature: float) -> T:
    u = _work(logits) / temperature
    lp = u - torch.log(torch.exp(u).sum(-1, keepdim=True))
    out = torch.zeros(input_ids.shape, dtype=lp.dtype)
    out[:, 1:] = lp[:, :-1].gather(-1, input_ids[:, 1:, None])[..., 0]
    return torch.where(response_mask, out, 0.0)


def bad_chunks(logits: T, input_ids: T, response_mask: T, temperature: float) -> T:
    """Chunks of 4096 whose partial log-sum-exps are added, not log-sum-exp'ed."""
    u = _work(logits) / temperature
    lse = (
        sum(torch.logsumexp(c, -1) for c in u.split(4096, -1))
        if u.shape[-1] > 4096
        else (torch.logsumexp(u, -1))
    )
    out = torch.zeros(input_ids.shape, dtype=u.dtype)
    out[:, 1:] = u[:, :-1].gather(-1, input_ids[:, 1:, None])[..., 0] - lse[:, :-1]
    return torch.where(response_mask, out, 0.0)


# ---- tests -----------------------------------------------------------------------------

CORRECT = [
    (plain, "next-token", {}),
    (trl_style, "next-token", {}),
    (chunked, "next-token", {}),
    (rolled, "next-token-rolled", {}),
    (packed_ok, "next-token", {"layout": "packed"}),
    (fixed_temperature, "next-token", {"temperature": 0.7}),
]


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
@pytest.mark.parametrize(
    ("fn", "reference", "options"), CORRECT, ids=[f.__name__ for f, _, _ in CORRECT]
)
def test_correct_implementations_pass_every_check(
    fn: Callable[..., Any], reference: str, options: dict[str, Any], dtype: str
) -> None:
    report = _run(fn, reference, dtype=dtype, **options)
    assert not _failed(report), {k: v.message for k, v in _failed(report).items()}
    names = {r.check for r in report.results}
    assert ("float32-log-softmax" in names) == (dtype == "bfloat16")
    assert ("packed-boundary" in names) == (options.get("layout") == "packed")


MUTANTS = [
    (no_shift, {}, "value", "missing shift"),
    (shift_wrong_way, {}, "value", "shifted the wrong way"),
    (off_by_one, {}, "value", "off by one position"),
    (no_temperature, {}, "temperature", "temperature not applied"),
    (temperature_twice, {}, "temperature", "temperature applied twice"),
    (trainer_without_rollout_temperature, {"temperature": 0.7}, "value", "the rollout applied it"),
    (bf16_log_softmax, {"dtype": "bfloat16"}, "float32-log-softmax", "half precision"),
    (packed_roll, {"layout": "packed"}, "packed-boundary", "reads across the boundary of sequence"),
    (sentinel_padding, {}, "padding-values", "sentinel"),
    (no_max_shift, {}, "large-logits", ""),
    (bad_chunks, {}, "large-vocab", ""),
]


@pytest.mark.parametrize(
    ("fn", "options", "check", "words"), MUTANTS, ids=[m[0].__name__ for m in MUTANTS]
)
def test_each_bug_fails_the_check_that_names_it(
    fn: Callable[..., Any], options: dict[str, Any], check: str, words: str
) -> None:
    failed = _failed(_run(fn, checks=[check], **options))
    assert check in failed, sorted(failed)
    text = failed[check].message + " | " + failed[check].diagnosis
    assert words in text, text


def test_packed_boundary_names_the_sequence_and_its_neighbour() -> None:
    failed = _failed(_run(packed_roll, layout="packed", checks=["packed-boundary"]))
    diagnosis = failed["packed-boundary"].diagnosis
    assert "reads across the boundary of sequence 0" in diagnosis, diagnosis
    assert "changes with sequence " in diagnosis, diagnosis


def test_bfloat16_error_is_what_float32_log_softmax_catches() -> None:
    """The bf16 mutant passes the value check (bf16 arithmetic is within the lenient
    tolerance) and fails only the float32 check: the two checks measure different things."""
    report = _run(bf16_log_softmax, dtype="bfloat16", checks=["value", "float32-log-softmax"])
    assert set(_failed(report)) == {"float32-log-softmax"}


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"shift": "previous"}, "shift must be"),
        ({"align": "row"}, "align must be"),
        ({"temperature": 0}, "temperature must be"),
        ({"layout": "left"}, "layout="),
        ({"overrides": {"temprature": 1.0}}, "did you mean 'temperature'"),
    ],
)
def test_bad_markers_are_named(options: dict[str, Any], words: str) -> None:
    with pytest.raises(MarkerError, match=words):
        assert_conforms(plain, "next-token", kind="logprobs", max_examples=2, **options)


def test_unknown_reference_is_named() -> None:
    with pytest.raises(MarkerError, match="next-token"):
        assert_conforms(plain, "next_token", kind="logprobs", max_examples=2)
