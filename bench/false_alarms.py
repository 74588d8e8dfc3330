"""Probe: the false-alarm sweep's correct functions at other seeds and sizes, by hand.

CI's sweep (``tests/kinds/policy_loss/test_sweep_correct.py``) runs every correct loss of
the suite and
every other registry entry (computed by the reference itself) in the modes of its
``MODES`` (float64, float64 strict, float32 inside, float32 inputs, bfloat16 and float16
inputs, each also upcast and strict) at seed 0, at the default sizes. This script runs
the same functions and modes at the seeds you name, at the default sizes (realistic-size
batches included) or at small ones (4 x 24), and lists every run that fails: each one is
a false alarm of the kit (the functions are correct) until shown otherwise.

Run: ``python bench/false_alarms.py --seeds 17 18 [--sizes small] [--pooled 30]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SMALL: dict[str, Any] = {"max_batch": 4, "max_length": 24}
"""``--sizes small``: the sweep's sizes before it ran at the default ones."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", required=True)
    parser.add_argument("--sizes", choices=("default", "small"), default="default")
    parser.add_argument("--pooled", type=int, default=30, help="pooled batches per check")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    import torch

    from pytest_polgrad import ConformanceError, assert_conforms
    from tests.kinds.policy_loss import test_sweep_correct as sweep

    torch.set_num_threads(1)
    sizes: dict[str, Any] = SMALL if args.sizes == "small" else {}
    runs: list[tuple[str, str, Any, dict[str, Any], int]] = []
    for label, reference, fn, options in sweep.CORRECT:
        extra = {"eps_high": 2.0} if reference == "cispo" else {}
        runs.append((label, reference, fn, {**options, **extra}, args.pooled))
    for name in sweep._registry_rest():  # a third of the budget, as in the sweep
        runs.append((name, name, sweep._reference_function(name), {}, max(args.pooled // 3, 1)))
    alarms: list[str] = []
    started, count = time.perf_counter(), 0
    for seed in args.seeds:
        for mode, (wrap, mode_options) in sweep.MODES.items():
            for label, reference, fn, options, pooled in runs:
                count += 1
                kw = {**sizes, **options, **mode_options}
                try:
                    assert_conforms(
                        wrap(fn), reference, max_examples=sweep.CORPUS + pooled, seed=seed, **kw
                    )
                except ConformanceError as exc:
                    failed = [line.strip() for line in str(exc).splitlines() if "FAILED" in line]
                    alarms.append(f"seed {seed} {mode:16s} {label:24s} {'; '.join(failed)}")
    took = time.perf_counter() - started
    print(f"{count} runs ({args.sizes} sizes, {args.pooled} pooled batches) in {took:.0f} s:")
    print(f"{len(alarms)} false alarm(s)")
    for line in alarms:
        print("  " + line)
    raise SystemExit(1 if alarms else 0)


if __name__ == "__main__":
    main()
