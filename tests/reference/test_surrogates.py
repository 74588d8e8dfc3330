"""``polgrad_reference.surrogates``: each surrogate's per-token value and gradient by hand,
on both sides of every clip, and ``clip_region`` at its open boundaries.

The values are worked out in the comments (clip eps 0.2 / 0.28: bounds 0.8 and 1.28; CISPO
eps_high 2: cap 3; dual clip c = 3). These call :func:`surrogate` directly, so a mutant of
one branch fails here by name, before any aggregation or registry entry is involved.
"""

from __future__ import annotations

import math

import pytest
import torch

from polgrad_reference import ClipBounds, ClipConfig, SurrogateKind, clip_region
from polgrad_reference.config import QuadraticPenalty, SoftGate
from polgrad_reference.surrogates import surrogate

F64 = torch.float64
CLIP = ClipConfig(eps_low=0.2, eps_high=0.28)


def _value_and_grads(
    kind: SurrogateKind,
    ratios: list[float],
    adv: list[float],
    clip: ClipConfig = CLIP,
    **kw: object,
) -> tuple[list[float], list[float], list[float]]:
    """Per-token loss and its gradients with respect to ``ratio`` and ``logprobs``."""
    ratio = torch.tensor([ratios], dtype=F64, requires_grad=True)
    lp = torch.full_like(ratio, -0.5).requires_grad_()
    out = surrogate(
        kind,
        ratio=ratio,
        advantages=torch.tensor([adv], dtype=F64),
        logprobs=lp,
        clip=clip,
        log_ratio=ratio.detach().log(),
        **kw,  # type: ignore[arg-type]
    )
    g_r, g_lp = torch.autograd.grad(out.sum(), (ratio, lp), allow_unused=True)
    zeros = [0.0] * len(ratios)
    return (
        out.detach()[0].tolist(),
        zeros if g_r is None else g_r[0].tolist(),
        zeros if g_lp is None else g_lp[0].tolist(),
    )


def test_pg_clip_positive_advantage_clips_above_only() -> None:
    # A = +1: -min(r, clip(r)) = -0.5, -0.9, -1.28 (clipped at 1.28: zero gradient)
    value, g_r, _ = _value_and_grads(SurrogateKind.PG_CLIP, [0.5, 0.9, 1.5], [1.0, 1.0, 1.0])
    assert value == pytest.approx([-0.5, -0.9, -1.28], abs=1e-15)
    assert g_r == [-1.0, -1.0, 0.0]


def test_pg_clip_negative_advantage_clips_below_only() -> None:
    # A = -1: max(r, clip(r)) = 0.8 (clipped at 0.8: zero gradient), 0.9, 1.5
    value, g_r, _ = _value_and_grads(SurrogateKind.PG_CLIP, [0.5, 0.9, 1.5], [-1.0] * 3)
    assert value == pytest.approx([0.8, 0.9, 1.5], abs=1e-15)
    assert g_r == [0.0, 1.0, 1.0]


def test_dual_clip_caps_negative_advantage_losses_at_c() -> None:
    # A = -2, c = 3: min(max(2r, 2 clip(r)), 6) = 4 (r = 2), 6 (r = 4, capped: no gradient);
    # A = +2 tokens are untouched by the dual clip: -min(2r, 2 clip(r)) = -2.56, -2.56
    dual = ClipConfig(eps_low=0.2, eps_high=0.28, dual_clip=3.0)
    value, g_r, _ = _value_and_grads(
        SurrogateKind.PG_CLIP, [2.0, 4.0, 2.0, 4.0], [-2.0, -2.0, 2.0, 2.0], clip=dual
    )
    assert value == pytest.approx([4.0, 6.0, -2.56, -2.56], abs=1e-15)
    assert g_r == [2.0, 0.0, 0.0, 0.0]


def test_pg_and_reinforce() -> None:
    value, g_r, g_lp = _value_and_grads(SurrogateKind.PG, [0.5, 2.0], [1.0, -3.0])
    assert (value, g_r, g_lp) == ([-0.5, 6.0], [-1.0, 3.0], [0.0, 0.0])
    value, g_r, g_lp = _value_and_grads(SurrogateKind.REINFORCE, [0.5, 2.0], [1.0, -3.0])
    # -A log pi with log pi = -0.5; the ratio is ignored
    assert (value, g_r, g_lp) == ([0.5, -1.5], [0.0, 0.0], [-1.0, 3.0])


def test_cispo_weight_is_truncated_at_the_cap_and_detached() -> None:
    """``-sg(min(r, 3)) A log pi``: the gradient reaches log pi with the truncated
    weight, on both sides of the cap, and never reaches the ratio."""
    cispo = ClipConfig(eps_low=None, eps_high=2.0)
    value, g_r, g_lp = _value_and_grads(
        SurrogateKind.CISPO, [0.5, 2.0, 4.0], [1.0, 1.0, 1.0], clip=cispo
    )
    assert value == pytest.approx([0.25, 1.0, 1.5], abs=1e-15)  # -w * 1 * (-0.5)
    assert g_lp == [-0.5, -2.0, -3.0]
    assert g_r == [0.0, 0.0, 0.0]


def test_cispo_with_a_lower_bound_truncates_below_too() -> None:
    both = ClipConfig(eps_low=0.2, eps_high=0.28)
    _, _, g_lp = _value_and_grads(SurrogateKind.CISPO, [0.5, 1.0, 1.5], [-1.0] * 3, clip=both)
    assert g_lp == pytest.approx([0.8, 1.0, 1.28], abs=1e-15)


def test_sapo_gate_values_and_unit_slope_at_one() -> None:
    """``-(4/tau) sigmoid(tau (r - 1)) A``, tau_pos = 1 for A > 0, tau_neg = 1.05 else."""
    gate = SoftGate(tau_pos=1.0, tau_neg=1.05)
    value, g_r, _ = _value_and_grads(
        SurrogateKind.SAPO, [1.0, 1.0, 1.5, 1.0], [1.0, -1.0, 1.0, 0.0], params=gate
    )
    sig = 1.0 / (1.0 + math.exp(-0.5))
    assert value == pytest.approx([-2.0, 2.0 / 1.05, -4.0 * sig, 0.0], abs=1e-15)
    # d/dr at r = 1 is -(4/tau) tau / 4 A = -A: the policy gradient on-policy
    assert g_r[:2] == pytest.approx([-1.0, 1.0], abs=1e-15)
    assert g_r[2] == pytest.approx(-4.0 * sig * (1.0 - sig), abs=1e-15)


def test_dro_adds_the_quadratic_penalty() -> None:
    # -A log pi + beta/2 (log r)^2 with beta = 1, log pi = -0.5
    value, _, g_lp = _value_and_grads(
        SurrogateKind.DRO, [1.0, math.e], [2.0, 2.0], params=QuadraticPenalty(beta=1.0)
    )
    assert value == pytest.approx([1.0, 1.5], abs=1e-15)
    assert g_lp == [-2.0, -2.0]  # log_ratio is passed detached here


@pytest.mark.parametrize(
    ("ratio", "adv", "inside"),
    [
        (1.28, 1.0, False),  # open boundary: at r = high the gradient is still non-zero
        (1.28 + 1e-12, 1.0, True),
        (1.28 + 1e-12, -1.0, False),  # A < 0 is not clipped above
        (0.8, -1.0, False),
        (0.8 - 1e-12, -1.0, True),
        (0.8 - 1e-12, 1.0, False),
        (5.0, 0.0, False),  # A = 0: never in the region
    ],
)
def test_clip_region_boundaries(ratio: float, adv: float, inside: bool) -> None:
    got = clip_region(
        ratio=torch.tensor([[ratio]], dtype=F64),
        advantages=torch.tensor([[adv]], dtype=F64),
        clip=CLIP,
    )
    assert bool(got) is inside


def test_clip_region_dual_clip_and_absolute_bounds() -> None:
    dual = ClipConfig(eps_low=0.2, eps_high=0.28, dual_clip=3.0)
    r = torch.tensor([[3.0, 3.0 + 1e-12, 2.0]], dtype=F64)
    a = torch.full_like(r, -1.0)
    assert clip_region(ratio=r, advantages=a, clip=dual).tolist() == [[False, True, False]]
    absolute = ClipConfig(eps_low=None, eps_high=5.0, bounds=ClipBounds.ABSOLUTE)
    r = torch.tensor([[5.0, 5.5, 0.01]], dtype=F64)
    assert clip_region(ratio=r, advantages=torch.ones_like(r), clip=absolute).tolist() == [
        [False, True, False]
    ]


def test_dppo_tv_trust_region_bounds_are_inclusive() -> None:
    """DPPO-TV keeps a token whose probability step is exactly at the threshold:
    ``p - p_old <= delta_high`` for ``A > 0``, ``>= -delta_low`` for ``A <= 0`` (verl 0.9.1
    ``dppo_tv``). Probabilities 0.5 / 0.75 / 0.25 are exact in float64, steps exactly 0.25;
    a step just beyond the threshold is dropped (loss and gradient 0)."""
    from polgrad_reference.config import DivergenceMask

    gate = DivergenceMask(delta_low=0.25, delta_high=0.25, is_cap=None)
    p_old = torch.tensor([[0.5, 0.5, 0.5, 0.5]], dtype=F64)
    p = torch.tensor([[0.75, 0.25, 0.75 + 1e-9, 0.25 - 1e-9]], dtype=F64)
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]], dtype=F64)
    assert (p - p_old)[0, :2].tolist() == [0.25, -0.25]
    lp = p.log().requires_grad_()
    old = p_old.log()
    out = surrogate(
        SurrogateKind.DPPO_TV,
        ratio=torch.exp(lp - old),
        advantages=adv,
        logprobs=lp,
        clip=CLIP,
        log_ratio=(lp - old).detach(),
        old_logprobs=old,
        params=gate,
    )
    (grad,) = torch.autograd.grad(out.sum(), lp)
    kept = (grad != 0)[0].tolist()
    assert kept == [True, True, False, False]


@pytest.mark.parametrize(
    ("name", "kinks"),
    [
        ("ppo", (0.8, 1.2)),
        ("dapo", (0.8, 1.28)),
        ("ppo_dual_clip", (0.8, 1.2, 3.0)),
        ("cispo", (3.0,)),  # no lower truncation; the dual clip never applies to CISPO
        ("gmpo", (math.exp(-0.4), math.exp(0.4))),  # log-space clip: both bounds
        ("kl_cov", (1.0,)),  # |log r|
        ("sapo", ()),
        ("dppo_tv", ()),  # gates on probabilities, not on the ratio
        ("reinforce_pp", (0.8, 1.2)),
    ],
)
def test_kink_ratios_are_every_branch_point(name: str, kinks: tuple[float, ...]) -> None:
    """Every bound, none missing: a missed kink is a gradient compared across a branch."""
    from polgrad_reference import ALGORITHMS, kink_ratios

    assert kink_ratios(ALGORITHMS[name].loss) == pytest.approx(kinks, rel=1e-15)


@pytest.mark.parametrize(
    ("adv", "p", "delta_low", "delta_high", "kept"),
    [
        # A < 0 moving p down: gated on delta_low (0.05 < D ~ 0.087), never on delta_high
        (-1.0, 0.3, 0.05, 0.2, False),
        (-1.0, 0.3, 0.2, 0.05, True),
        # A > 0 moving p up: gated on delta_high, never on delta_low
        (1.0, 0.7, 0.2, 0.05, False),
        (1.0, 0.7, 0.05, 0.2, True),
    ],
)
def test_dppo_kl_gates_each_sign_on_its_own_threshold(
    adv: float, p: float, delta_low: float, delta_high: float, kept: bool
) -> None:
    """DPPO binary-KL (verl 0.9.1 ``dppo_kl``): ``A > 0`` keeps a token with
    ``D <= delta_high or p <= p_old``, ``A <= 0`` one with ``D <= delta_low or p >= p_old``;
    ``D(0.5 -> 0.3) = D(0.5 -> 0.7) ~ 0.087`` lies between unequal thresholds, so a gate
    that reads the other sign's threshold keeps what it should drop (issue 27)."""
    from polgrad_reference.config import DivergenceMask

    gate = DivergenceMask(delta_low=delta_low, delta_high=delta_high, is_cap=None)
    old = torch.tensor([[math.log(0.5)]], dtype=F64)
    lp = torch.tensor([[math.log(p)]], dtype=F64, requires_grad=True)
    out = surrogate(
        SurrogateKind.DPPO_KL,
        ratio=torch.exp(lp - old),
        advantages=torch.tensor([[adv]], dtype=F64),
        logprobs=lp,
        clip=CLIP,
        log_ratio=(lp - old).detach(),
        old_logprobs=old,
        params=gate,
    )
    (grad,) = torch.autograd.grad(out.sum(), lp)
    assert bool(grad[0, 0] != 0) is kept


@pytest.mark.parametrize("log_w", [-25.0, -40.0])
def test_vespo_does_not_clamp_the_log_sequence_ratio(log_w: float) -> None:
    """VESPO's weight ``phi(w) = exp(lambda + k log w - lambda w)`` is computed from the
    unclamped ``log w`` (TRL 1.16.0 clamps it to ``[log 1e-8, 20]``, the reference does
    not, as its docstring says): at ``log w = -25`` the loss is ``e^(3 - 50) * A * 0.5``
    ~ 1.2e-21, not the clamped ``e^(3 + 2 log 1e-8)``-sized 6e-14 (issue 27)."""
    from polgrad_reference.config import GammaWeight

    gamma = GammaWeight()  # k_pos 2, lambda_pos 3
    lr = torch.tensor([[log_w / 2, log_w / 2]], dtype=F64)
    lp = torch.full_like(lr, -0.5)
    out = surrogate(
        SurrogateKind.VESPO,
        ratio=lr.exp(),
        advantages=torch.ones_like(lr),
        logprobs=lp,
        clip=CLIP,
        log_ratio=lr,
        params=gamma,
    )
    phi = math.exp(3.0 + 2.0 * log_w - 3.0 * math.exp(log_w))
    assert out[0].tolist() == pytest.approx([0.5 * phi, 0.5 * phi], rel=1e-12, abs=0.0)


@pytest.mark.parametrize(
    ("p", "adv", "kept"),
    [
        # p_old = 1: D = -log p. A < 0 moving p down keeps D <= 0.2, i.e. p >= e^-0.2 ~ 0.819
        (0.9, -1.0, True),  # D ~ 0.105: inside the region
        (0.5, -1.0, False),  # D ~ 0.693: outside
        (1.0, -1.0, True),  # D = 0 (both terms 0 log 0)
        # A > 0 at p_old = 1: p <= p_old always holds
        (0.5, 1.0, True),
    ],
)
def test_dppo_kl_at_p_old_one_takes_the_zero_log_zero_limit(
    p: float, adv: float, kept: bool
) -> None:
    """DPPO binary-KL at ``p_old = 1`` (``old_logprobs == -0.0``): the second term of
    ``D = p_old log(p_old/p) + (1-p_old) log((1-p_old)/(1-p))`` is ``0 log 0 = 0``, so
    ``D = -log p``, as verl 0.9.1 ``dppo_kl`` computes it (its 1e-8 keeps the log finite).
    Computed as ``0 * (-inf - log(1-p))`` it is NaN and masks a token inside the trust
    region (issue 27)."""
    from polgrad_reference.config import DivergenceMask

    gate = DivergenceMask(delta_low=0.2, delta_high=0.2, is_cap=None)
    old = torch.tensor([[-0.0]], dtype=F64)
    lp = torch.tensor([[math.log(p)]], dtype=F64, requires_grad=True)
    out = surrogate(
        SurrogateKind.DPPO_KL,
        ratio=torch.exp(lp - old),
        advantages=torch.tensor([[adv]], dtype=F64),
        logprobs=lp,
        clip=CLIP,
        log_ratio=(lp - old).detach(),
        old_logprobs=old,
        params=gate,
    )
    (grad,) = torch.autograd.grad(out.sum(), lp)
    assert bool(grad[0, 0] != 0) is kept
    assert torch.isfinite(out).all()
