"""Benchmark: what a check costs for each kind, cold and warm, against the function's own time
(issue 32).

For each kind, two correct and one or two wrong functions (the kinds' own test functions,
``tests/kinds/<kind>/test_kind.py``, and two of ``bench/anchor.py``'s policy losses) run
through ``assert_conforms`` at the default budget: *cold* (every pool forgotten, a new
``seed=``: the kit draws the pool and computes every reference), then *warm* (the same
seed again: the pool and the reference results on it are shared, as for a second marked
function with the same options). Each row gives the wall time, the function's own calls
(its forward, and the backward through what it returned where the kind takes one, timed
where the kit calls it: ``pytest_polgrad/core/clock.py``) and the ratio of the two; the
difference is the kit's (pool, reference, comparisons, search, shrinking, diagnosis,
report). The function's own time is its time on the very batches the kit gave it, so the
ratio is the kit's cost per unit of the function's: 1.0x would be a kit that costs nothing.
Medians of ``--runs`` runs, each cold run on a new seed.

Run: ``python bench/kinds.py [--runs 3] [--kinds policy_loss kl ...]``. No test times
anything; figures depend on the machine (docs/engine.md, "Cost", has one sitting's).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

Case = tuple[str, Callable[..., Any], str, dict[str, Any]]
"""(kind, function, reference, options)."""


def cases() -> list[Case]:
    """Every kind's functions, correct ones first."""
    sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
    import anchor

    from tests.helpers import sample_losses as L
    from tests.kinds.advantages import test_kind as adv
    from tests.kinds.aggregation import test_kind as agg
    from tests.kinds.entropy import test_kind as ent
    from tests.kinds.kl import test_kind as kl
    from tests.kinds.logprobs import test_kind as lp
    from tests.kinds.training_step import test_kind as step
    from tests.kinds.value_loss import test_kind as val

    return [
        ("policy_loss", anchor.grpo, "grpo", {}),
        ("policy_loss", anchor.dapo, "dapo", {}),
        ("policy_loss", L.dapo_wrong_eps, "dapo", {}),
        ("training_step", step.token_mean_step, "dapo", {}),
        ("training_step", step.seq_mean_token_mean_step, "grpo", {}),
        ("training_step", step.mean_of_micro_batch_means, "dapo", {}),
        ("advantages", adv.grpo_loop, "grpo", {}),
        ("advantages", adv.rloo_ok, "rloo", {}),
        ("advantages", adv.grpo_no_std, "grpo", {}),
        ("kl", kl.k3, "grpo", {}),
        ("kl", kl.k1_f32, "k1", {}),
        ("kl", kl.k3_sign_flipped, "grpo", {}),
        ("aggregation", agg.token_mean, "dapo", {}),
        ("aggregation", agg.seq_mean_token_mean, "grpo", {}),
        ("aggregation", agg.mean_over_padded_entries, "dapo", {}),
        ("value_loss", val.value_loss_ok, "ppo", {}),
        ("value_loss", val.value_loss_verl_style, "ppo", {}),
        ("value_loss", val.value_loss_unclipped, "ppo", {}),
        ("entropy", ent.per_token_ok, "entropy", {}),
        ("entropy", ent.bonus_ok, "entropy", {}),
        ("entropy", ent.per_token_no_max_shift, "entropy", {}),
        ("logprobs", lp.plain, "next-token", {}),
        ("logprobs", lp.trl_style, "next-token", {}),
        ("logprobs", lp.off_by_one, "next-token", {}),
    ]


def run_once(case: Case, seed: int) -> tuple[float, float, bool]:
    """``(seconds, the function's own seconds, passed)`` of one ``assert_conforms``."""
    from pytest_polgrad import ConformanceError, assert_conforms

    kind, fn, reference, options = case
    start = time.perf_counter()
    try:
        report = assert_conforms(fn, reference, kind=kind, seed=seed, **options)
        passed = True
    except ConformanceError as exc:
        report, passed = exc.report, False
    total = time.perf_counter() - start
    return total, report.function_seconds, passed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=9000)
    parser.add_argument("--kinds", nargs="*", default=None)
    args = parser.parse_args()
    import gc

    import torch

    # this checkout's kit, not an installed one (the import below would fix it for cases())
    sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
    from pytest_polgrad.core.engine import clear_pools

    torch.set_num_threads(1)
    chosen = [c for c in cases() if args.kinds is None or c[0] in args.kinds]
    for case in chosen:  # imports, first calls and per-process caches, untimed
        run_once(case, args.seed - 1)
    rows = []
    for case in chosen:
        cold: list[tuple[float, float]] = []
        warm: list[tuple[float, float]] = []
        verdict = True
        for i in range(args.runs):
            seed = args.seed + i
            clear_pools()
            gc.collect()
            total, own, verdict = run_once(case, seed)
            cold.append((total, own))
            gc.collect()
            total, own, _ = run_once(case, seed)
            warm.append((total, own))
        rows.append((case, verdict, cold, warm))

    def figures(runs: list[tuple[float, float]]) -> str:
        total = statistics.median(t for t, _ in runs)
        own = statistics.median(o for _, o in runs)
        ratio = statistics.median(t / o if o > 0 else float("inf") for t, o in runs)
        return f"{total:7.3f} {own:7.3f} {ratio:7.1f}x"

    print(f"torch {torch.__version__}, 1 thread, default budget, medians of {args.runs} runs")
    print(f"{'kind':<14} {'function':<26} {'verdict':<7} {'cold s':>7} {'fn s':>7} "
          f"{'ratio':>8} {'warm s':>7} {'fn s':>7} {'ratio':>8}")  # fmt: skip
    for (kind, fn, _, _), passed, cold, warm in rows:
        print(
            f"{kind:<14} {fn.__name__:<26} {'passes' if passed else 'fails':<7} "
            f"{figures(cold)} {figures(warm)}"
        )
    for kind in dict.fromkeys(c[0] for c in chosen):
        mine = [r for r in rows if r[0][0] == kind]
        cold_mean = statistics.mean(statistics.median(t for t, _ in r[2]) for r in mine)
        warm_mean = statistics.mean(statistics.median(t for t, _ in r[3]) for r in mine)
        print(f"{kind:<14} mean of {len(mine)}: cold {cold_mean:.3f} s, warm {warm_mean:.3f} s")


if __name__ == "__main__":
    main()
