"""The advantages tolerance's per-batch parts are made once per (reference, batch) and never
served for a batch modified since (issue 32)."""

from __future__ import annotations

import pytest
import torch

from pytest_polgrad.core.options import ConformanceOptions
from pytest_polgrad.kinds import _advantage_reference as R
from pytest_polgrad.kinds.advantages import KIND


def _ref(name: str) -> R.AdvantageReference:
    return KIND.resolve(ConformanceOptions(name, kind="advantages"))


def _batch() -> dict[str, torch.Tensor]:
    return R.advantage_corpus(torch.float64)["groups"].as_kwargs()


@pytest.mark.parametrize("name", ["gae", "reinforce_pp", "grpo"])
def test_a_batch_modified_in_place_gets_a_fresh_scale(name: str) -> None:
    ref, kw = _ref(name), _batch()
    expected = R.expected_advantages(ref, kw, frozenset(kw))
    before = R.tolerance_scale(ref, kw, expected)
    kw["rewards"].mul_(1000.0)  # same tensor object, new values
    after = R.tolerance_scale(ref, kw, expected)
    fresh = R.tolerance_scale(ref, {k: v.clone() for k, v in kw.items()}, expected)
    assert torch.equal(after, fresh)
    assert not torch.equal(after, before)


def test_the_pre_whitening_std_is_computed_once_per_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = [0]
    real = R._pre_whitening_std

    def counted(ref: R.AdvantageReference, t: dict[str, torch.Tensor]) -> float:
        calls[0] += 1
        return real(ref, t)

    monkeypatch.setattr(R, "_pre_whitening_std", counted)
    ref, kw = _ref("gae"), _batch()
    expected = R.expected_advantages(ref, kw, frozenset(kw))
    first = R.tolerance_scale(ref, kw, expected)
    for _ in range(3):
        assert torch.equal(R.tolerance_scale(ref, dict(kw), expected), first)
    assert calls[0] == 1
