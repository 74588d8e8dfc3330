"""Every drawn batch keeps the documented promises: valid logprobs inside the domain's
bounds, aimed ratios on the aimed side (in the batch's own dtype too), garbage or NaN at
masked positions, whole groups, at least one token per row."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from polgrad_reference.config import ClipConfig
from pytest_polgrad.strategies import DOMAINS, Batch, batches

DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]
# Bounds hold exactly in float32/float64; half precision rounds each value on its own.
SLACK = {torch.float64: 1e-9, torch.float32: 1e-4, torch.bfloat16: 8.0, torch.float16: 1.0}

options = st.fixed_dictionaries(
    {},
    optional={
        "dtype": st.sampled_from(DTYPES),
        "domain": st.sampled_from(["semantic", "extreme"]),
        "layout": st.sampled_from(["right", "left", "packed"]),
        "holes": st.booleans(),
        "padding": st.sampled_from(["garbage", "nan"]),
        "group_size": st.sampled_from([1, 2, 4]),
        "advantage_shape": st.sampled_from(["sequence", "token"]),
        "clip": st.sampled_from(
            [ClipConfig(0.2, 0.28), ClipConfig(eps_low=None, eps_high=2.0), ClipConfig(3e-4, 4e-4)]
        ),
    },
)


def check_batch(batch: Batch) -> None:
    plan = batch.plan
    assert plan is not None
    dom = DOMAINS[plan.domain]
    slack = SLACK[batch.dtype]
    b = batch.to_layout("right")
    m = b.response_mask
    assert bool((m.sum(1) >= 1).all()), "every row holds a response token"
    lp, old = b.logprobs.double(), b.old_logprobs.double()
    span = torch.arange(b.width)[None, :] < torch.tensor(b.extents)[:, None]
    # packed batches have no padding columns: converting back fills them with zeros
    stored = span if batch.layout == "packed" else torch.ones_like(m)
    if plan.padding == "nan":
        assert bool(torch.isnan(lp[stored & ~m]).all()) and bool(
            torch.isnan(old[stored & ~m]).all()
        )
        assert bool(torch.isfinite(lp[m]).all())
    else:
        assert bool(torch.isfinite(lp[stored]).all())
    known = stored & ~torch.isnan(lp)
    for t in (lp, old):
        assert bool((t[known] <= 0).all())
        assert bool((t[known] >= dom.min_logprob).all())
    gap = (lp - old)[known]
    assert float(gap.abs().max()) <= plan.max_log_ratio + slack
    if b.ref_logprobs is not None:
        ref = b.ref_logprobs.double()
        assert bool((ref[known] <= 0).all()) and bool((ref[known] >= dom.min_logprob).all())
        assert float((ref - lp)[known].abs().max()) <= dom.max_ref_gap + slack
    if b.rollout_logprobs is not None:
        roll = b.rollout_logprobs.double()
        assert bool((roll[known] <= 0).all()) and bool((roll[known] >= dom.min_logprob).all())
        assert float((old - roll)[known].abs().max()) <= dom.max_rollout_gap + slack
        if dom.max_rollout_seq is not None:
            per_row = torch.where(m, old - roll, 0.0).sum(1).abs()
            assert float(per_row.max()) <= dom.max_rollout_seq + slack
    if b.advantages.dim() == 2:
        assert bool(torch.isfinite(b.advantages.double()[m]).all())
    for target in plan.values.token_targets:
        assert bool(m[target.row, target.col])
        log_r = float(b.logprobs[target.row, target.col]) - float(
            b.old_logprobs[target.row, target.col]
        )
        assert target.side * (math.exp(log_r) - target.boundary) > 0, target
        own = float(
            torch.exp(b.logprobs[target.row, target.col] - b.old_logprobs[target.row, target.col])
        )
        assert target.side * (own - target.boundary) > 0, (target, own)  # in the batch dtype
        if target.advantage is not None:
            written = float(b.advantages[target.row, target.col])  # may underflow to +-0
            assert math.copysign(1.0, written) == math.copysign(1.0, target.advantage)
    for seq in plan.values.seq_targets:
        row = m[seq.row]
        log_r = (b.logprobs[seq.row] - b.old_logprobs[seq.row])[row]
        assert seq.side * (math.exp(float(log_r.double().mean())) - seq.boundary) > 0, seq
        own = float(torch.exp(log_r.mean()))
        assert seq.side * (own - seq.boundary) > 0, (seq, own)
    if plan.groups is not None:
        assert b.rewards is not None and b.group_ids is not None
        assert b.group_ids.dtype == torch.int64
        assert bool((torch.bincount(b.group_ids) == plan.groups.size).all())
        assert bool(torch.isfinite(b.rewards.double()).all())


@settings(max_examples=300)
@given(options.flatmap(lambda kw: batches(**kw)))
def test_drawn_batches_keep_their_promises(batch: Batch) -> None:
    check_batch(batch)


@settings(max_examples=40)
@given(batches(padding="garbage", holes=True))
def test_padding_holds_garbage_not_zeros(batch: Batch) -> None:
    """Masked positions hold plausible values that differ from the response tokens'."""
    m = batch.response_mask
    if bool(m.all()):
        return
    lp = batch.logprobs.double()
    assert bool(torch.isfinite(lp[~m]).all())
    assert bool((lp[~m] <= 0).all())
    assert not bool((lp[~m] == 0).all())


@settings(max_examples=30)
@given(batches(clip=ClipConfig(eps_low=None, eps_high=None)))
def test_a_clip_without_boundaries_still_draws(batch: Batch) -> None:
    assert batch.plan is not None
    assert not batch.plan.values.token_targets and not batch.plan.values.seq_targets


@settings(max_examples=30)
@given(batches(min_batch=3, max_batch=3, min_length=5, max_length=7, width=9))
def test_fixed_sizes_are_respected(batch: Batch) -> None:
    assert batch.batch_size == 3 and batch.width == 9
    assert all(5 <= e <= 7 for e in batch.extents)


@settings(max_examples=30)
@given(batches(min_batch=2, max_batch=12, group_size=3))
def test_group_size_gives_whole_groups(batch: Batch) -> None:
    assert batch.batch_size in (3, 6, 9, 12)
    assert batch.rewards is not None and batch.group_ids is not None


def test_the_aimed_column_pattern_of_every_width_is_its_own() -> None:
    """Each width's ``(keep, centre)`` is a slice of one wider cached pattern: it must equal
    the pattern built for that width alone (every aimed column ``c % stride == 0`` gets the
    ``c // stride``-th log-ratio of the aim cycle, every other column keeps its gap)."""
    from pytest_polgrad.strategies._values import _aim_logs, _column_pattern

    aims = ((1.2, 1, 0.01), (0.8, -1, 0.001), (1.28, 1, 0.0001))
    cycle = _aim_logs(aims).tolist()
    for dtype in (torch.float32, torch.float64):
        for stride in (1, 3, 5):
            for width in (1, 2, 3, 255, 256, 257, 1000, 4096):
                keep, centre = _column_pattern(width, stride, aims, dtype)
                aimed = [c % stride == 0 for c in range(width)]
                logs = [
                    cycle[(c // stride) % len(cycle)] if a else 0.0 for c, a in enumerate(aimed)
                ]
                assert keep.shape == centre.shape == (width,)
                assert keep.tolist() == [0.0 if a else 1.0 for a in aimed]
                assert torch.equal(centre, torch.tensor(logs, dtype=torch.float64).to(dtype))
