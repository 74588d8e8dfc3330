"""The component strategies: each draws valid values and reaches its advertised cases."""

from __future__ import annotations

import math

import torch
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st

from polgrad_reference.config import PolicyLossConfig
from polgrad_reference.registry import ALGORITHMS
from pytest_polgrad.strategies import (
    DEFAULT_CLIPS,
    EXTREME,
    SEMANTIC,
    Groups,
    advantages,
    algorithm_names,
    groups,
    lengths,
    log_ratio_gaps,
    logprobs,
    loss_configs,
    response_masks,
    row_extents,
)

BUDGET = settings(  # derandomized: the same 100 examples on every run, so CI cannot flake
    max_examples=100, database=None, phases=[Phase.generate], derandomize=True
)


@given(lengths(min_batch=2, max_batch=5, min_length=3, max_length=9))
def test_lengths_respect_bounds(rows: tuple[int, ...]) -> None:
    assert 2 <= len(rows) <= 5
    assert all(3 <= n <= 9 for n in rows)


def test_lengths_reach_a_short_row_beside_a_long_one() -> None:
    find(lengths(), lambda r: min(r) == 1 and max(r) >= 65, settings=BUDGET)


@given(st.sampled_from(["right", "left"]), st.booleans(), st.data())
def test_response_masks(layout: str, holes: bool, data: st.DataObject) -> None:
    mask = data.draw(response_masks(layout=layout, holes=holes, max_length=40))  # type: ignore[arg-type]
    assert mask.dtype == torch.bool and mask.dim() == 2
    assert bool(mask.any(dim=1).all())
    ext = row_extents(mask, layout)  # type: ignore[arg-type]
    edge = mask[:, 0] if layout == "right" else mask[:, -1]
    assert bool(edge.all())  # rows start (right) or end (left) at the edge
    if not holes:
        assert mask.sum(1).tolist() == ext.tolist()


def test_response_masks_reach_holes() -> None:
    def holed(m: torch.Tensor) -> bool:
        ext = row_extents(m, "right")
        return bool((m.sum(1) < ext).any())

    find(response_masks(holes=True), holed, settings=BUDGET)


@given(st.sampled_from([torch.float64, torch.float32, torch.bfloat16]), st.data())
def test_logprobs_are_valid(dtype: torch.dtype, data: st.DataObject) -> None:
    domain = data.draw(st.sampled_from(["semantic", "extreme"]))
    lp = data.draw(logprobs((3, 17), dtype=dtype, domain=domain))
    assert lp.shape == (3, 17) and lp.dtype == dtype
    assert bool(torch.isfinite(lp).all()) and bool((lp <= 0).all())
    assert float(lp.min()) >= (SEMANTIC if domain == "semantic" else EXTREME).min_logprob


def test_logprobs_reach_rare_tokens_and_empty_shapes() -> None:
    find(logprobs(64), lambda t: bool((t < -20).any()), settings=BUDGET)
    find(logprobs(64, domain="extreme"), lambda t: bool((t < -100).any()), settings=BUDGET)
    assert find(logprobs((2, 0)), lambda t: True, settings=BUDGET).shape == (2, 0)


@given(log_ratio_gaps())
def test_log_ratio_gaps_are_bounded(gap: float) -> None:
    assert math.isfinite(gap) and abs(gap) <= SEMANTIC.max_log_ratio


def test_log_ratio_gaps_land_on_both_sides_of_each_boundary() -> None:
    for clip in DEFAULT_CLIPS:
        for bound in (clip.low, clip.high, clip.dual_clip):
            if bound is None:
                continue
            for side in (1, -1):
                find(
                    log_ratio_gaps(clip=clip),
                    lambda g, b=bound, s=side: 0 < s * (math.exp(g) - b) <= 0.025,
                    settings=BUDGET,
                )


@given(st.integers(1, 6), st.integers(1, 9), st.sampled_from(["sequence", "token"]), st.data())
def test_advantages_shapes(b: int, t: int, shape: str, data: st.DataObject) -> None:
    adv = data.draw(advantages(batch_size=b, width=t, shape=shape))  # type: ignore[arg-type]
    assert adv.shape == ((b,) if shape == "sequence" else (b, t))
    assert bool(torch.isfinite(adv).all())


def test_advantages_reach_zero_ties_and_cancelling_signs() -> None:
    strategy = advantages(batch_size=4)
    find(strategy, lambda a: bool((a == 0).all()), settings=BUDGET)
    find(strategy, lambda a: bool((a == a[0]).all()) and float(a[0]) != 0.0, settings=BUDGET)
    find(strategy, lambda a: float(a.sum()) == 0.0 and bool((a != 0).any()), settings=BUDGET)
    find(
        advantages(batch_size=2, domain="extreme"),
        lambda a: float(a.abs().max()) >= 1e6,
        settings=BUDGET,
    )


@given(groups(min_batch=2, max_batch=12))
def test_groups_are_whole(drawn: Groups) -> None:
    size = drawn.group_size
    assert drawn.rewards.shape == drawn.group_ids.shape
    assert drawn.rewards.numel() % size == 0
    assert bool((torch.bincount(drawn.group_ids) == size).all())


def test_groups_reach_equal_rewards_and_interleaved_ids() -> None:
    def equal_group(g: Groups) -> bool:
        return g.group_size >= 2 and any(
            bool((g.rewards[g.group_ids == k] == g.rewards[g.group_ids == k][0]).all())
            for k in g.group_ids.unique()
        )

    find(groups(), equal_group, settings=BUDGET)
    find(
        groups(group_size=2, min_batch=4),
        lambda g: int(g.group_ids[1]) != int(g.group_ids[0]),
        settings=BUDGET,
    )


@given(loss_configs())
def test_loss_configs_come_from_the_registry(config: PolicyLossConfig) -> None:
    assert config in [spec.loss for spec in ALGORITHMS.values()]


@given(loss_configs(vary=True))
def test_varied_loss_configs_are_valid(config: PolicyLossConfig) -> None:
    assert isinstance(config, PolicyLossConfig)


def test_loss_configs_reach_every_algorithm() -> None:
    for name in ALGORITHMS:
        find(algorithm_names(), lambda n, want=name: n == want, settings=BUDGET)
        find(
            loss_configs(algorithms=[name]),
            lambda c, want=name: c == ALGORITHMS[want].loss,
            settings=BUDGET,
        )
