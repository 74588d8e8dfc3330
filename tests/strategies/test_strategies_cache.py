"""The cached strategy builders keep ints and floats apart: ``lru_cache`` treats ``(1, 3)``
and ``(1.0, 3)`` as one key, so a float bound cached first would make every later draw
with the int bound fail with Hypothesis' ``InvalidArgument`` (a new-user trial reported
such a failure of ``batches()`` after an advantages check in the same process)."""

from __future__ import annotations

import torch
from hypothesis import given, settings

from pytest_polgrad import assert_conforms
from pytest_polgrad.strategies import _cache, batches


def test_int_and_float_bounds_are_cached_apart() -> None:
    _cache.ints.cache_clear()
    floats = _cache.ints(1.0, 3)  # type: ignore[arg-type]
    assert _cache.ints(1, 3) is not floats
    assert _cache.choice((1, 2)) is not _cache.choice((1.0, 2.0))


def _grpo(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(rewards)
    for g in group_ids.unique():
        m = group_ids == g
        r = rewards[m]
        out[m] = (r - r.mean()) / (r.std() + 1e-6) if r.numel() > 1 else 0.0
    return out


def test_batches_still_draw_after_an_advantages_check() -> None:
    @settings(max_examples=10, deadline=None, database=None)
    @given(batches())
    def prop(batch: object) -> None:
        assert batch is not None

    prop()
    assert_conforms(_grpo, "grpo", kind="advantages", max_examples=5)
    prop()
