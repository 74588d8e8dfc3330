"""Bugs that only show at realistic sizes are flagged with default options (issue 8
section 2), and the realistic-size batches every pool holds respect the user's caps.

Search batches stay at most 8 rows x 256 tokens; each pool adds batches of
``REALISTIC_SIZES`` (64 x 384 and 9 x 4096 by default), which the mutants
below need: every one of them passes every check on batches of the search sizes.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_polgrad import assert_conforms
from pytest_polgrad.api import ConformanceError
from pytest_polgrad.core.engine import build_context, run_check
from pytest_polgrad.core.options import parse_marker
from pytest_polgrad.kinds.policy_loss.kind import KIND, REALISTIC_SIZES, SEARCH_ROWS, SEARCH_TOKENS
from tests.helpers import sample_losses as L

Tensor = torch.Tensor


def _token_terms(lp: Tensor, old: Tensor, adv: Tensor, mask: Tensor, hi: float) -> Tensor:
    """Per-token PPO-clip terms (eps_low 0.2, eps_high ``hi``), zero at padding."""
    ratio = torch.exp(torch.where(mask, lp - old, 0.0))
    a = adv[:, None] if adv.dim() == 1 else adv
    per = torch.maximum(-a * ratio, -a * ratio.clamp(0.8, 1.0 + hi))
    return torch.where(mask, per, 0.0)


def dapo_chunked_rows(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """Mutant (a): token-mean over chunks of 8 rows, then the mean of the chunk means."""
    per = _token_terms(logprobs, old_logprobs, advantages, response_mask, 0.28)
    means = [
        per[i : i + 8].sum() / response_mask[i : i + 8].sum() for i in range(0, per.shape[0], 8)
    ]
    return torch.stack(means).mean()


def dapo_sliced_at_300(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """Mutant (b): responses sliced at 300 tokens (a max_response_length left at 300)."""
    sl = slice(0, 300)
    adv = advantages if advantages.dim() == 1 else advantages[:, sl]
    lp, old, mask = logprobs[:, sl], old_logprobs[:, sl], response_mask[:, sl]
    return _token_terms(lp, old, adv, mask, 0.28).sum() / mask.sum().clamp(min=1)


def grpo_segment_means(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """Mutant (c): each row's token mean taken as the mean of its 1024-token segment
    means (a sequence-chunked loss meant to save memory); equal to the GRPO loss unless a
    row is longer than 1024 tokens and its last segment is partial."""
    per = _token_terms(logprobs, old_logprobs, advantages, response_mask, 0.2)
    rows = []
    for b in range(per.shape[0]):
        segments = []
        for start in range(0, per.shape[1], 1024):
            n = response_mask[b, start : start + 1024].sum()
            if int(n) > 0:
                segments.append(per[b, start : start + 1024].sum() / n)
        rows.append(torch.stack(segments).mean())
    return torch.stack(rows).mean()


MUTANTS = [
    (dapo_chunked_rows, "dapo"),
    (dapo_sliced_at_300, "dapo"),
    (grpo_segment_means, "grpo"),
]


@pytest.mark.parametrize(("fn", "reference"), MUTANTS, ids=[m[0].__name__ for m in MUTANTS])
def test_mutant_passes_at_search_sizes(fn: Any, reference: str) -> None:
    """Each mutant is invisible to batches of the search sizes: the realistic ones are needed."""
    caps = {"max_batch": SEARCH_ROWS, "max_length": SEARCH_TOKENS}
    opts = parse_marker((reference,), caps)
    for check in ("value", "gradient"):
        result = run_check(build_context(fn, opts), check, max_examples=40, base_seed=0)
        assert result.passed, result.report


@pytest.mark.parametrize(("fn", "reference"), MUTANTS, ids=[m[0].__name__ for m in MUTANTS])
def test_mutant_is_flagged_with_default_options(fn: Any, reference: str) -> None:
    with pytest.raises(ConformanceError) as info:
        assert_conforms(fn, reference, checks=("value", "gradient"))
    failed = {r.check for r in info.value.report.unexpected_failures}
    assert "gradient" in failed, info.value.report.summary()
    report = info.value.report.unexpected_failures[0].report
    assert "realistic-size batch" in report
    # Hypothesis cannot reproduce a size it does not draw; the kit's shrinker reduced it,
    # and the notes say it is not a batch Hypothesis shrank
    assert "reduced by the kit's shrinker" in report
    notes = info.value.report.unexpected_failures[0].notes
    assert any(
        "did not reproduce the failure" in n and "not one Hypothesis shrank" in n for n in notes
    )
    assert report.count("the realistic-size batch of the pool") == 1  # the batch line alone


def _reduced(fn: Any, reference: str, check: str) -> tuple[Any, str]:
    """The failing result of ``check`` at default options, seed 0, and its batch line."""
    opts = parse_marker((reference,), {})
    result = run_check(build_context(fn, opts), check, max_examples=100, base_seed=0)
    assert not result.passed
    line = next(ln for ln in result.report.splitlines() if ln.strip().startswith("batch"))
    return result, line


def test_realistic_failure_is_reduced_to_a_small_batch() -> None:
    _, line = _reduced(dapo_chunked_rows, "dapo", "value")
    rows = int(line.split("B=")[1].split(",")[0])
    assert 9 <= rows <= 16, line  # needs a second chunk of rows, and nothing more


def test_a_failure_past_1024_tokens_is_reduced_to_about_1024_columns() -> None:
    """Truncation alone stops at 3073 columns (3072 are three whole segments, which pass);
    deleting runs of inner columns gets near the 1025 the mutant needs, and the report's
    literals stay in short lines."""
    result, line = _reduced(grpo_segment_means, "grpo", "gradient")
    width = int(line.split("T=")[1].split(",")[0])
    assert 1025 <= width <= 1024 + 4096 // 64, line
    lines = result.report.splitlines()
    at = next(i for i, ln in enumerate(lines) if "too long to print, saved as" in ln)
    code = Path(lines[at + 1].strip()).read_text()  # under the plugin: saved, not printed
    values = [ln for ln in code.splitlines() if re.fullmatch(r"[\s\[\]0-9.e,+*-]+", ln)]
    assert len(values) > 10 and max(map(len, values)) <= 104  # lines of at most 100, and slack
    assert len(lines) < 60  # the report itself names the file


def _extras(**options: Any) -> list[Any]:
    opts = parse_marker(("dapo",), options)
    ctx = build_context(dapo_sliced_at_300, opts)
    check = KIND.check("value")
    assert check is not None
    return KIND.extra_inputs(ctx, check, seed=1)


def test_realistic_batches_reach_the_sizes_and_are_ragged() -> None:
    batches = _extras()
    sizes = [(b.batch_size, b.width) for b in batches]
    assert sizes == list(REALISTIC_SIZES)
    for b in batches:
        lengths = b.lengths
        assert min(lengths) == 1 and max(lengths) == b.width
        assert len(set(lengths)) > b.batch_size // 2  # ragged, not a few repeated lengths


def test_max_batch_and_max_length_cap_the_realistic_sizes() -> None:
    batches = _extras(max_batch=12, max_length=700)
    assert [(b.batch_size, b.width) for b in batches] == [(12, 384), (9, 700)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_realistic_batches_in_every_dtype(dtype: str) -> None:
    batches = _extras(dtype=dtype)
    assert batches and all(b.dtype == getattr(torch, dtype) for b in batches)
    for b in batches:
        kw = b.as_kwargs()
        mask = kw["response_mask"]
        assert bool(torch.isfinite(kw["logprobs"][mask]).all())
    if dtype == "float16":  # sums over the batch stay representable
        assert max(sum(b.lengths) for b in batches) <= 8192


def _in_float32(fn: Any) -> Any:
    """``fn`` computing in float32 internally (the loss cast back to the input dtype)."""

    def cast(
        logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
    ) -> Tensor:
        out: Tensor = fn(logprobs.float(), old_logprobs.float(), advantages.float(), response_mask)
        return out.to(logprobs.dtype)

    cast.__name__ = cast.__qualname__ = f"{fn.__name__}_in_float32"
    return cast


CORRECT = [
    (L.grpo_no_kl, "grpo", {}),
    (_in_float32(L.grpo_no_kl), "grpo", {}),
    (L.grpo_no_kl, "grpo", {"dtype": "bfloat16"}),
    (L.dapo, "dapo", {}),
    (_in_float32(L.dapo), "dapo", {}),
    (L.dapo, "dapo", {"dtype": "bfloat16"}),
    (L.dapo, "dapo", {"advantages": "token", "dtype": "float32"}),
]


@pytest.mark.parametrize(
    ("fn", "reference", "options"),
    CORRECT,
    ids=[f"{f.__name__}-{r}-{o.get('dtype', 'float64')}" for f, r, o in CORRECT],
)
def test_correct_losses_pass_every_check_on_realistic_sizes(
    fn: Any, reference: str, options: dict[str, Any]
) -> None:
    """No false alarm from the realistic-size batches: 16 examples hold both of them."""
    assert_conforms(fn, reference, max_examples=16, seed=5, **options)
