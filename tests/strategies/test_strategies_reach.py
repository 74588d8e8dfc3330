"""Reachability: the default strategy reaches every bug-triggering region in its budget.

Each test runs ``hypothesis.find`` with the default budget of 100 examples (generation
only, no database), so a region reached here is reached by any test that uses the
strategy with default settings. A failure here means the strategy got worse, never that
the test should be loosened.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from hypothesis import Phase, find, settings

from polgrad_reference.registry import ALGORITHMS
from pytest_polgrad.strategies import Batch, batches

BUDGET = settings(  # derandomized: the same 100 examples on every run, so CI cannot flake
    max_examples=100, database=None, phases=[Phase.generate], derandomize=True
)


def reach(condition: Callable[[Batch], bool], **kwargs: object) -> Batch:
    return find(batches(**kwargs), condition, settings=BUDGET)  # type: ignore[arg-type]


def ratios(b: Batch) -> torch.Tensor:
    return torch.exp(b.logprobs.double() - b.old_logprobs.double())


def token_advantages(b: Batch) -> torch.Tensor:
    adv = b.advantages.double()
    return adv if adv.dim() == 2 else adv[:, None].expand(b.logprobs.shape)


def any_token(b: Batch, where: torch.Tensor) -> bool:
    return bool((where & b.response_mask).any())


STRUCTURE = {
    "B=1": lambda b: b.batch_size == 1,
    "T=1": lambda b: b.width == 1,
    "one-token row next to a long row": lambda b: min(b.lengths) == 1 and max(b.lengths) >= 16,
    "T>64": lambda b: b.width > 64,
    "all rows equal length, B>=2": lambda b: b.batch_size >= 2 and len(set(b.lengths)) == 1,
    "padding columns present": lambda b: not bool(b.response_mask.all()),
    "per-token advantages": lambda b: b.advantages.dim() == 2,
    "zero advantage": lambda b: any_token(b, token_advantages(b) == 0.0),
    "advantages of opposite signs": lambda b: (
        any_token(b, token_advantages(b) > 0) and any_token(b, token_advantages(b) < 0)
    ),
}


@pytest.mark.parametrize("name", list(STRUCTURE))
def test_reaches_structure(name: str) -> None:
    reach(STRUCTURE[name])


@pytest.mark.parametrize("eps_high", [0.2, 0.28, 4e-4])
def test_reaches_ratio_just_past_upper_bound_with_positive_advantage(eps_high: float) -> None:
    hi = 1.0 + eps_high

    def hit(b: Batch) -> bool:
        r = ratios(b)
        return any_token(b, (r > hi) & (r < hi + 0.03) & (token_advantages(b) > 0))

    reach(hit)


@pytest.mark.parametrize("eps_low", [0.2, 3e-4])
def test_reaches_ratio_below_lower_bound_with_negative_advantage(eps_low: float) -> None:
    reach(lambda b: any_token(b, (ratios(b) < 1.0 - eps_low) & (token_advantages(b) < 0)))


def test_reaches_ratio_just_inside_lower_bound_with_negative_advantage() -> None:
    def hit(b: Batch) -> bool:
        r = ratios(b)
        return any_token(b, (r > 0.8) & (r < 0.83) & (token_advantages(b) < 0))

    reach(hit)


def test_reaches_ratio_above_dual_clip_with_negative_advantage() -> None:
    reach(lambda b: any_token(b, (ratios(b) > 3.0) & (token_advantages(b) < 0)))


def test_reaches_ratio_just_below_dual_clip_with_negative_advantage() -> None:
    def hit(b: Batch) -> bool:
        r = ratios(b)
        return any_token(b, (r > 2.97) & (r < 3.0) & (token_advantages(b) < 0))

    reach(hit)


def test_reaches_logprob_below_minus_100_in_extreme_domain() -> None:
    reach(lambda b: any_token(b, b.logprobs.double() < -100.0), domain="extreme")


def test_reaches_huge_and_tiny_advantages_in_extreme_domain() -> None:
    reach(lambda b: bool((b.advantages.abs() >= 1e6).any()), domain="extreme")
    reach(
        lambda b: bool(((b.advantages.abs() > 0) & (b.advantages.abs() <= 1e-12)).any()),
        domain="extreme",
    )


def test_reaches_log_ratio_gap_of_25_in_extreme_domain() -> None:
    gap = lambda b: (b.logprobs.double() - b.old_logprobs.double()).abs()  # noqa: E731
    reach(lambda b: any_token(b, gap(b) >= 25.0), domain="extreme")


def test_reaches_group_with_all_equal_rewards() -> None:
    def hit(b: Batch) -> bool:
        if b.rewards is None or b.group_ids is None:
            return False
        for g in b.group_ids.unique():
            members = b.rewards[b.group_ids == g]
            if members.numel() >= 2 and bool((members == members[0]).all()):
                return True
        return False

    reach(hit)


def test_reaches_rollout_weight_past_the_tis_cap() -> None:
    def hit(b: Batch) -> bool:
        if b.rollout_logprobs is None:
            return False
        rho = torch.exp(b.old_logprobs.double() - b.rollout_logprobs.double())
        return any_token(b, rho > 2.0)

    reach(hit)


def test_reaches_sequence_ratio_just_past_gspo_bounds() -> None:
    clip = ALGORITHMS["gspo"].loss.clip
    assert clip.high is not None and clip.low is not None
    hi, lo = clip.high, clip.low

    def seq_ratio(b: Batch) -> torch.Tensor:
        m = b.response_mask
        log_r = torch.where(m, b.logprobs.double() - b.old_logprobs.double(), 0.0)
        return torch.exp(log_r.sum(1) / m.sum(1))

    def row_advantage(b: Batch) -> torch.Tensor:
        adv = b.advantages.double()
        return adv if adv.dim() == 1 else adv[:, 0]

    def above(b: Batch) -> bool:
        s = seq_ratio(b)
        return bool(((s > hi) & (s < hi + 0.03) & (row_advantage(b) > 0)).any())

    def below(b: Batch) -> bool:
        s = seq_ratio(b)
        return bool(((s < lo) & (s > lo - 0.03) & (row_advantage(b) < 0)).any())

    reach(above, clip=clip)
    reach(below, clip=clip)
