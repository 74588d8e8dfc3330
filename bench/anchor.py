"""Benchmark: the kit against its anchor, the older polgrad package (issue 32).

Ten correct policy losses (six algorithms, several spellings of each) run through
``pytest_polgrad.assert_conforms`` at the default budget and through the older package's
``polgrad.testing.assert_conforms(fn, reference, n_cases=64, shapes=((4, 8), (2, 12)))``,
side by side in one process: each round times the older package's pass over the ten, then
the kit's (fresh ``seed=`` each round, so no pooled batch or cached reference result of an
earlier round is reused: every round is a cold start for the kit's pool), and the figure is
the median of the rounds' ratios. The older package must be importable as ``polgrad``::

    PYTHONPATH=/tmp/oldpg .venv/bin/python bench/anchor.py [--rounds 7] [--profile] [--cpu]

(``pip install --no-deps --target /tmp/oldpg polgrad==0.2.1``). ``--profile`` also prints
the kit's top functions by cumulative and by own time over one extra round (cProfile);
``--cpu`` times this process's CPU time instead of wall time (a machine shared with other
work: the wall time of both sides then varies by 2x from round to round).
Target (issue 32): ratio <= 6x. The older package's check is about ten times smaller (64
float64 batches of at most 4 x 12 tokens, value and gradient only); the kit's runs every
applicable check on its corpus and pool (up to 4096-token rows). No test times anything.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import statistics
import time
from collections.abc import Callable

import torch

Tensor = torch.Tensor


def _masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask, x, 0.0).sum() / mask.sum()


def _row_mean(x: Tensor, mask: Tensor) -> Tensor:
    return (torch.where(mask, x, 0.0).sum(dim=1) / mask.sum(dim=1)).mean()


def _clipped(lp: Tensor, old: Tensor, adv: Tensor, mask: Tensor, lo: float, hi: float) -> Tensor:
    """Per-token PPO clip ``max(-A r, -A clip(r, 1 - lo, 1 + hi))`` (Schulman et al. 2017,
    eq. 7), ``r = exp(lp - old)`` at response tokens."""
    ratio = torch.exp(torch.where(mask, lp - old, 0.0))
    a = adv[:, None]
    return torch.maximum(-a * ratio, -a * ratio.clamp(1.0 - lo, 1.0 + hi))


def ppo(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """PPO clip 0.2, token-mean."""
    per = _clipped(logprobs, old_logprobs, advantages, response_mask, 0.2, 0.2)
    return _masked_mean(per, response_mask)


def ppo_loop(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """PPO clip 0.2, token-mean, the unclipped/clipped pair written out with ``torch.min``
    of the objectives."""
    ratio = torch.exp(torch.where(response_mask, logprobs - old_logprobs, 0.0))
    a = advantages.unsqueeze(-1)
    obj = torch.min(ratio * a, torch.clamp(ratio, 0.8, 1.2) * a)
    return -(obj * response_mask).sum() / response_mask.sum()


def grpo(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """GRPO's policy term: clip 0.2, seq-mean-token-mean (Shao et al. 2024, eq. 3)."""
    per = _clipped(logprobs, old_logprobs, advantages, response_mask, 0.2, 0.2)
    return _row_mean(per, response_mask)


def grpo_float(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """GRPO with a float mask and the row means taken through ``mean`` over rows."""
    m = response_mask.to(logprobs.dtype)
    ratio = torch.exp((logprobs - old_logprobs) * m)
    a = advantages[:, None]
    per = -torch.min(ratio * a, ratio.clamp(0.8, 1.2) * a)
    return ((per * m).sum(-1) / m.sum(-1)).mean()


def dapo(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """DAPO: clip-higher 0.2 / 0.28, token-mean (Yu et al. 2025, eq. 8)."""
    per = _clipped(logprobs, old_logprobs, advantages, response_mask, 0.2, 0.28)
    return _masked_mean(per, response_mask)


def dapo_float(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """DAPO with a float mask."""
    m = response_mask.to(logprobs.dtype)
    ratio = torch.exp((logprobs - old_logprobs) * m)
    a = advantages[:, None]
    per = -torch.min(ratio * a, ratio.clamp(0.8, 1.28) * a)
    return (per * m).sum() / m.sum()


def _seq_ratio(lp: Tensor, old: Tensor, mask: Tensor) -> Tensor:
    """GSPO's sequence ratio ``exp(mean_t (lp - old))`` over each row's tokens (Zheng et al.
    2025, eq. 7)."""
    d = torch.where(mask, lp - old, 0.0)
    return torch.exp(d.sum(dim=1) / mask.sum(dim=1))


def gspo(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """GSPO: sequence ratio, clip 3e-4 / 4e-4, one term per row."""
    s = _seq_ratio(logprobs, old_logprobs, response_mask)
    a = advantages
    return torch.maximum(-a * s, -a * s.clamp(1 - 3e-4, 1 + 4e-4)).mean()


def gspo_token(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """GSPO-token: ``sg[s] * exp(lp - sg[lp])`` per token, clipped as GSPO, seq-mean-token-mean
    (Zheng et al. 2025, eq. 13)."""
    s = _seq_ratio(logprobs, old_logprobs, response_mask).detach()
    r = s[:, None] * torch.exp(logprobs - logprobs.detach())
    a = advantages[:, None]
    per = torch.maximum(-a * r, -a * r.clamp(1 - 3e-4, 1 + 4e-4))
    return _row_mean(per, response_mask)


def rloo(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """RLOO's REINFORCE term ``-A log pi``, seq-mean-token-sum (Ahmadian et al. 2024)."""
    per = torch.where(response_mask, -advantages[:, None] * logprobs, 0.0)
    return per.sum(dim=1).mean()


def rloo_float(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """RLOO with a float mask and a per-row sum."""
    m = response_mask.to(logprobs.dtype)
    return -(advantages * (logprobs * m).sum(-1)).mean()


LOSSES: tuple[tuple[Callable[..., Tensor], str], ...] = (
    (ppo, "ppo"),
    (ppo_loop, "ppo"),
    (grpo, "grpo"),
    (grpo_float, "grpo"),
    (dapo, "dapo"),
    (dapo_float, "dapo"),
    (gspo, "gspo"),
    (gspo_token, "gspo_token"),
    (rloo, "rloo"),
    (rloo_float, "rloo"),
)
"""Ten correct policy losses and the registry name both packages know them by."""


def _settled(clock: Callable[[], float] = time.perf_counter) -> float:
    """``clock()`` after a full collector pass, the heap then frozen (a pass falling inside a
    timed segment would weigh on it)."""
    gc.collect()
    gc.freeze()
    return clock()


def run_old() -> None:
    """The ten through the older package's ``assert_conforms``."""
    from polgrad.testing import (  # type: ignore[import-not-found]  # PYTHONPATH=/tmp/oldpg
        assert_conforms as old_assert_conforms,
    )

    for fn, name in LOSSES:
        old_assert_conforms(fn, name, n_cases=64, shapes=((4, 8), (2, 12)))


def run_kit(seed: int) -> None:
    """The ten through the kit's ``assert_conforms`` at the default budget."""
    from pytest_polgrad import assert_conforms

    for fn, name in LOSSES:
        assert_conforms(fn, name, seed=seed)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seed", type=int, default=7000, help="the first round's seed")
    parser.add_argument("--profile", action="store_true", help="cProfile one more kit round")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument(
        "--cpu", action="store_true", help="CPU time of this process, not wall time"
    )
    args = parser.parse_args()
    clock = time.process_time if args.cpu else time.perf_counter
    torch.set_num_threads(1)
    run_old()  # imports and first-call warm-up of both, untimed
    run_kit(args.seed - 1)
    old_t: list[float] = []
    kit_t: list[float] = []
    for i in range(args.rounds):
        t0 = _settled(clock)
        run_old()
        old_t.append(clock() - t0)
        t0 = _settled(clock)
        run_kit(args.seed + i)
        kit_t.append(clock() - t0)
    ratios = [k / o for k, o in zip(kit_t, old_t, strict=True)]
    what = "CPU" if args.cpu else "wall"
    print(
        f"torch {torch.__version__}, 1 thread, {args.rounds} rounds, ten correct policy losses, "
        f"{what} time"
    )
    print(f"older polgrad assert_conforms (64 cases)  median {statistics.median(old_t):7.3f} s")
    print(f"pytest_polgrad assert_conforms (default)  median {statistics.median(kit_t):7.3f} s")
    print(
        f"ratio (per round)                         median {statistics.median(ratios):7.2f} x"
        f"   [{', '.join(f'{r:.2f}' for r in ratios)}]   (target <= 6)"
    )
    if args.profile:
        prof = cProfile.Profile()
        gc.collect()
        prof.enable()
        run_kit(args.seed + args.rounds)
        prof.disable()
        stats = pstats.Stats(prof)
        stats.sort_stats("cumulative").print_stats(args.top)
        stats.sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
