"""Draw rate of ``batches()`` against the cost of ``torch.rand`` for the same tensors.

Usage::

    python bench/strategies.py [--runs 5] [--draws 40] [--threads 1] [--dtype float32]

For each size (B=8, T=64 and B=64, T=4096) the script runs ``--runs`` Hypothesis runs of
``--draws`` examples of ``batches(min_batch=B, max_batch=B, max_length=T, width=T)``.
Inside the test body it times ``torch.rand`` for every tensor of the drawn batch, in its
shape (floating tensors in their dtype, the bool mask and int ids as float32): the cost
of torch's own random numbers for those tensors. The time of one draw is the interval
between two test-body entries minus the previous body, so it includes everything
Hypothesis does per example. Per run it takes medians; it reports the median over runs
of draws per second and of ``draw / torch.rand``. The acceptance bound is a ratio under
2 at the large size; ``--check`` exits 1 when it is not met.

``--threads 1`` is the default: generation is dominated by single-threaded RNG kernels
(torch's CPU generator is sequential), intra-op threads only add scheduling noise to both
sides, and pytest-xdist workers should not oversubscribe cores anyway.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from hypothesis import HealthCheck, Phase, given, settings

from pytest_polgrad.strategies import Batch, batches

SIZES = ((8, 64), (64, 4096))


def _baseline(batch: Batch) -> float:
    start = time.perf_counter()
    for tensor in batch.as_kwargs().values():
        dtype = tensor.dtype if tensor.is_floating_point() else torch.float32
        torch.rand(tensor.shape, dtype=dtype)
    return time.perf_counter() - start


def one_run(b: int, t: int, draws: int, dtype: torch.dtype) -> tuple[float, float]:
    """Median seconds per draw and per torch.rand baseline, over one Hypothesis run."""
    entries: list[float] = []
    bodies: list[float] = []
    baselines: list[float] = []

    @settings(
        max_examples=draws,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(batches(min_batch=b, max_batch=b, max_length=t, width=t, dtype=dtype))
    def body(batch: Batch) -> None:
        entry = time.perf_counter()
        entries.append(entry)
        baselines.append(_baseline(batch))
        bodies.append(time.perf_counter() - entry)

    body()
    per_draw = [entries[i] - entries[i - 1] - bodies[i - 1] for i in range(1, len(entries))]
    return statistics.median(per_draw), statistics.median(baselines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--draws", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--check", action="store_true", help="exit 1 if the bound fails")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    print(
        f"torch {torch.__version__}, {args.threads} thread(s), {args.dtype}, "
        f"{args.runs} runs x {args.draws} draws"
    )
    print(f"{'B':>4} {'T':>6} {'draws/s':>9} {'draw ms':>9} {'rand ms':>9} {'ratio':>7}")
    ratio_large = float("inf")
    for b, t in SIZES:
        results = [one_run(b, t, args.draws, dtype) for _ in range(args.runs)]
        draw = statistics.median(r[0] for r in results)
        rand = statistics.median(r[1] for r in results)
        ratio = statistics.median(r[0] / r[1] for r in results)
        print(
            f"{b:>4} {t:>6} {1.0 / draw:>9.1f} {draw * 1e3:>9.3f} {rand * 1e3:>9.3f} {ratio:>7.2f}"
        )
        if (b, t) == SIZES[-1]:
            ratio_large = ratio
    ok = ratio_large < 2.0
    print(f"large size: draw / torch.rand = {ratio_large:.2f} ({'<' if ok else '>='} 2)")
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
