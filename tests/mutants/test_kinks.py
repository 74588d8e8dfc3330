"""The kink rule of docs/tolerance.md ("Kinks"), at its boundaries.

A token is ambiguous (its gradient excluded from the comparison) when its ratio lies
within ``4 u c bound`` of a clip bound, with ``c = 1 + |lr_t|`` for inputs exact in the
loosest accepted precision and ``c = 1 + |logprobs_t| + |old_logprobs_t|`` for rounded
inputs; a sequence ratio's band is the row's largest token band times ``1 + log2 n`` and
makes its whole row ambiguous. The audit of issue 13 found this rule untested: a wider or
narrower band, a dropped condition number or summation factor, or a forgotten bound
(dual clip) survived. Each case below sits at 0.5x / 1.5x / 4x of the band it probes.
"""

from __future__ import annotations

import math

import pytest
import torch

from polgrad_reference import ALGORITHMS, PolicyLossConfig, SurrogateKind
from pytest_polgrad.core.tolerance import KINK_ULPS, Tolerance, unit_roundoff
from pytest_polgrad.kinds.policy_loss.oracle import Oracle

F64 = torch.float64
OLD = -1.0
EPS = KINK_ULPS * unit_roundoff(torch.float32)  # float64 inputs, float32 accepted inside


def _ratio_at(bound: float, distance: float) -> float:
    """The ratio ``bound (1 + distance)``, with ``distance`` relative to the bound."""
    return bound * (1.0 + distance)


def _ambiguous(
    cfg: PolicyLossConfig, ratios: list[float], adv: float, *, native: bool, old: float = OLD
) -> torch.Tensor:
    lr = torch.tensor([[math.log(r) for r in ratios]], dtype=F64)
    batch = {
        "logprobs": old + lr,
        "old_logprobs": torch.full_like(lr, old),
        "advantages": torch.tensor([adv], dtype=F64),
        "response_mask": torch.ones_like(lr, dtype=torch.bool),
    }
    return Oracle(cfg)(batch, kink_eps=EPS, native_kinks=native).ambiguous[0]


def test_the_band_is_what_tolerance_hands_the_oracle() -> None:
    assert Tolerance(torch.float64).kink_band == (EPS, False)
    assert Tolerance(torch.float32).kink_band == (EPS, True)
    assert Tolerance(torch.float64, strict=True).kink_band == (
        KINK_ULPS * unit_roundoff(torch.float64),
        True,
    )
    assert KINK_ULPS == 4.0  # docs/tolerance.md: three roundings, a factor 2 of margin


@pytest.mark.parametrize("side", [-1.0, 1.0])
def test_token_band_native_inputs_scales_with_one_plus_the_log_ratio(side: float) -> None:
    cfg = ALGORITHMS["dapo"].loss
    bounds = [cfg.clip.low, cfg.clip.high]
    assert None not in bounds
    ratios = []
    for bound in bounds:
        assert bound is not None
        c = 1.0 + abs(math.log(bound))
        ratios += [_ratio_at(bound, side * f * EPS * c) for f in (0.5, 1.5, 4.0)]
    got = _ambiguous(cfg, ratios, 1.0, native=True).tolist()
    assert got == [True, False, False, True, False, False]


def test_token_band_rounded_inputs_uses_the_inputs_magnitudes() -> None:
    """At 1.5x the native band the token is clear for exact inputs but ambiguous for
    rounded ones, whose condition number ``1 + |lp| + |old|`` is larger here."""
    cfg = ALGORITHMS["dapo"].loss
    high = cfg.clip.high
    assert high is not None
    native_c = 1.0 + abs(math.log(high))
    rounded_c = 1.0 + abs(OLD + math.log(high)) + abs(OLD)
    assert 1.5 * native_c < rounded_c < 4.0 * native_c
    ratios = [_ratio_at(high, f * EPS * native_c) for f in (1.5, 4.0)]
    assert _ambiguous(cfg, ratios, 1.0, native=True).tolist() == [False, False]
    assert _ambiguous(cfg, ratios, 1.0, native=False).tolist() == [True, False]


def test_dual_clip_bound_has_a_band_too() -> None:
    cfg = ALGORITHMS["ppo_dual_clip"].loss
    dual = cfg.clip.dual_clip
    assert dual is not None
    c = 1.0 + math.log(dual)
    ratios = [_ratio_at(dual, f * EPS * c) for f in (-0.5, 0.5, 4.0)]
    # old = -2: the logprobs stay <= 0 at ratios near the dual clip (3)
    got = _ambiguous(cfg, ratios, -1.0, native=True, old=-2.0)
    assert got.tolist() == [True, True, False]


def test_no_band_for_surrogates_without_a_clip_kink() -> None:
    cfg = PolicyLossConfig(surrogate=SurrogateKind.REINFORCE)
    assert not bool(_ambiguous(cfg, [1.2, 1.2 * (1 + 1e-9)], 1.0, native=True).any())


@pytest.mark.parametrize(("factor", "want"), [(2.5, True), (3.5, False)])
def test_sequence_ratio_band_carries_the_summation_factor(factor: float, want: bool) -> None:
    """GSPO, n = 4 tokens: ``1 + log2 4 = 3`` times the largest token band; the whole row
    is ambiguous or none of it is. All four log-ratios are equal, so the sequence ratio
    is each token's ratio."""
    cfg = ALGORITHMS["gspo"].loss
    high = cfg.clip.high
    assert high is not None
    c = 1.0 + abs(math.log(high))
    r = _ratio_at(high, factor * EPS * c)
    got = _ambiguous(cfg, [r] * 4, 1.0, native=True)
    assert got.tolist() == [want] * 4
