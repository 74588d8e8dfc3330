"""The pool's fast path (``strategies/_sample.py``): the kit's strategies draw without
Hypothesis, deterministically in the seed and across processes, reaching what the plans
aim at; every kind's strategy has a sampler, and one without falls back to Hypothesis."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import textwrap
from pathlib import Path

import pytest
import torch
from hypothesis import strategies as st

from pytest_polgrad.core import engine
from pytest_polgrad.core.engine import build_context, checks_for, kind_of
from pytest_polgrad.core.options import parse_marker
from pytest_polgrad.strategies import Batch, batches
from pytest_polgrad.strategies._sample import RandomDraw, filtered, mapped, sample, sampleable
from tests.helpers.snippet_driver import HASH_SEED, run_snippets

ROOT = Path(__file__).parents[2]


def _digest(drawn: tuple[Batch, ...]) -> str:
    h = hashlib.sha256()
    for b in drawn:
        for name, t in sorted(b.as_kwargs().items()):
            h.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
            h.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def test_same_seed_same_batches_different_seed_different_batches() -> None:
    strategy = batches(max_batch=6, max_length=40, holes=True, with_rollout_logprobs=True)
    first = _digest(sample(strategy, 11, 20))
    assert _digest(sample(strategy, 11, 20)) == first
    assert _digest(sample(strategy, 12, 20)) != first


def test_a_pool_drawn_in_another_process_is_bitwise_identical(tmp_path: Path) -> None:
    """What xdist needs: another worker (another hash seed, thread count) draws the same
    pool from the same seed: here the suite's snippet interpreter
    (``tests/helpers/snippet_driver.py``: another process, hash seed ``HASH_SEED``, the kit
    imported afresh: ``fresh_kit``)."""
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        import torch
        torch.set_num_threads({max(1, torch.get_num_threads() % 2 + 1)})
        from pytest_polgrad.strategies import batches
        from pytest_polgrad.strategies._sample import sample
        from tests.strategies.test_strategies_sample import _digest
        s = batches(max_batch=6, max_length=40, holes=True, with_rollout_logprobs=True)
        print(_digest(sample(s, 11, 20)))
        """
    )
    out = run_snippets([("pool", code, str(ROOT))], tmp_path, fresh_kit=True)["pool"]
    assert not out.startswith("FAILED"), out
    assert os.environ.get("PYTHONHASHSEED") != HASH_SEED  # another hash seed there
    strategy = batches(max_batch=6, max_length=40, holes=True, with_rollout_logprobs=True)
    assert out.strip() == _digest(sample(strategy, 11, 20))


def test_uniform_choices_reach_what_the_plans_aim_at() -> None:
    """One default-size pool (96 batches, as a 100-example check draws) holds B = 1, a
    one-token row, T > 64, per-token and per-sequence advantages of both signs, tokens
    within 0.01 of both clip boundaries on either side, rollout log-probs present and
    absent, and padding columns."""
    drawn = sample(batches(clip=None), 0, 96)
    rows = {b.logprobs.shape[0] for b in drawn}
    widths = {b.logprobs.shape[1] for b in drawn}
    assert 1 in rows and max(rows) == 8
    assert any(int(b.response_mask.sum(dim=1).min()) == 1 for b in drawn)
    assert max(widths) > 64
    assert {b.advantages.dim() for b in drawn} == {1, 2}
    assert any(bool((b.advantages > 0).any() and (b.advantages < 0).any()) for b in drawn)
    assert any(b.rollout_logprobs is None for b in drawn)
    assert any(b.rollout_logprobs is not None for b in drawn)
    assert any(bool((~b.response_mask).any()) for b in drawn)
    near: dict[tuple[float, int], int] = {(0.8, 1): 0, (0.8, -1): 0, (1.2, 1): 0, (1.2, -1): 0}
    for b in drawn:
        r = torch.exp(b.logprobs.double() - b.old_logprobs.double())[b.response_mask]
        for bound, side in near:
            gap = (r - bound) * side
            near[(bound, side)] += int(((gap > 0) & (gap < 0.01)).sum())
    assert all(count > 0 for count in near.values()), near


def _contexts() -> list[tuple[str, str, dict[str, object]]]:
    return [
        ("policy_loss", "grpo", {}),
        ("policy_loss", "dapo", {"advantages": "token", "holes": True}),
        ("training_step", "grpo", {"kind": "training_step"}),
        ("advantages", "grpo", {"kind": "advantages"}),
        ("kl", "k3", {"kind": "kl"}),
        ("aggregation", "token-mean", {"kind": "aggregation"}),
        ("value_loss", "ppo", {"kind": "value_loss"}),
        ("entropy", "entropy", {"kind": "entropy"}),
    ]


@pytest.mark.parametrize(("kind", "reference", "options"), _contexts(), ids=lambda x: str(x))
def test_every_kinds_strategy_draws_without_hypothesis(
    kind: str, reference: str, options: dict[str, object]
) -> None:
    """No kind of the kit silently pays Hypothesis's per-input cost in its pool."""

    def loss(**kw: torch.Tensor) -> torch.Tensor:
        raise AssertionError("never called")

    opts = parse_marker((reference,), {"max_batch": 4, "max_length": 16, **options})
    k = kind_of(opts)
    assert k.name == kind
    ctx = build_context(loss, opts)
    for name in checks_for(opts):
        check = engine.check_of(k, ctx, name)
        strategy = k.strategy(ctx, check)
        assert sampleable(strategy), (kind, name)
        assert len(sample(strategy, 3, 4)) == 4


def test_a_strategy_without_a_sampler_is_drawn_by_hypothesis() -> None:
    mine = st.lists(st.integers(0, 9), min_size=1, max_size=3)
    assert not sampleable(mine)
    drawn = engine._draw_pool(mine, 5, 10)
    assert len(drawn) == 10 and all(1 <= len(x) <= 3 for x in drawn)
    assert engine._draw_pool(mine, 5, 10) == drawn  # still seeded


def test_map_and_filter_keep_the_fast_path_and_a_hopeless_filter_falls_back() -> None:
    base = batches(max_batch=3, max_length=8)
    rows = mapped(base, lambda b: int(b.logprobs.shape[0]))
    assert sampleable(rows) and set(sample(rows, 1, 30)) <= {1, 2, 3}
    wide = filtered(base, lambda b: b.logprobs.shape[0] == 3)
    assert sampleable(wide)
    assert all(b.logprobs.shape[0] == 3 for b in sample(wide, 1, 5))
    never = filtered(base, lambda b: False, tries=3)
    with pytest.raises(LookupError, match="passed the filter"):
        sample(never, 1, 1)
    assert not sampleable(st.integers(0, 1).map(str))  # Hypothesis's own map: no sampler


@pytest.mark.parametrize(
    "options",
    [
        dict(max_batch=6, max_length=40, holes=True, with_rollout_logprobs=True),
        dict(dtype=torch.bfloat16, padding="nan", layout="packed"),
        dict(domain="extreme", advantage_shape="token", with_ref_logprobs=True),
    ],
)
def test_a_pool_built_together_equals_its_batches_drawn_one_by_one(
    options: dict[str, object],
) -> None:
    """``sample`` draws a staged strategy's plans first and builds them together
    (``staged``, ``build_many``); the batches, and those of a mapped strategy, must be the
    ones the same seeded draws give one at a time."""
    strategy = batches(**options)  # type: ignore[arg-type]
    draw = RandomDraw(31)
    one_by_one = tuple(draw(strategy) for _ in range(12))
    assert _digest(sample(strategy, 31, 12)) == _digest(one_by_one)
    doubled = mapped(strategy, lambda b: dataclasses.replace(b, logprobs=2 * b.logprobs))
    expected = tuple(dataclasses.replace(b, logprobs=2 * b.logprobs) for b in one_by_one)
    assert _digest(sample(doubled, 31, 12)) == _digest(expected) != _digest(one_by_one)
    for batch in sample(strategy, 31, 12):  # copied out of the shared buffers
        for t in batch.as_kwargs().values():
            assert t.untyped_storage().nbytes() == t.numel() * t.element_size()
