"""Cost of the training step on a real process group against the simulated accumulation.

Usage::

    python bench/distributed.py [--calls 15] [--sizes small,large] [--worlds 2,4]

For each size (``small``: B=8, T=6, the runner tests' step; ``large``: B=64, T=512, random
response lengths) and world size, each rank runs two micro-batches (rows dealt in order).
The step is DAPO's per-token surrogate (the reference, token-sum) scaled by the step's
global token count times the world size. Figures, one process, one torch thread:

* ``simulated``: the kit's ``accumulate`` (every micro-batch of every rank in this
  process, gradients summed and averaged in float64);
* ``ddp`` / ``fsdp``: ``run_step`` on a warm pool of gloo ranks (the job sent, every rank's
  micro-batches through DDP with ``no_sync`` or FSDP2 ``fully_shard``, the gradient back);
* ``start``: the first call of a world size, three ways: ``cold`` (the process's first
  pool: the zygote's interpreter importing torch and what DDP / FSDP2 import on first use,
  then ``world`` forks joining the group, the first DDP wrap), ``warm`` (a new pool from
  the same zygote, as after a killed pool: forks, the group, the wrap) and ``spawn`` (no
  zygote: ``world`` interpreters importing all of it each, the path taken when none can
  fork).

Each per-call figure is the median of ``--calls`` calls after one warm-up call. The
closing note multiplies them out for one marked step whose data-parallel check runs 100
examples plus the corpus's 8 canonical steps, and for one CI run: ``--marked`` marked steps
(default 10), each with its two multi-rank split checks (``data-parallel``,
``generation-steps``) on the group, one pool start per world size (the test process's).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from polgrad_reference import get_algorithm, policy_loss
from pytest_polgrad.core.engine import build_context
from pytest_polgrad.core.options import ConformanceOptions
from pytest_polgrad.kinds.training_step import distributed
from pytest_polgrad.kinds.training_step.kind import accumulate
from pytest_polgrad.strategies import Split

DAPO = get_algorithm("dapo").loss
SIZES = {"small": (8, 6), "large": (64, 512)}
CHECK_CALLS = 108
"""One split check's calls of the step: 100 examples plus the 8 canonical steps."""


def dapo_step(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    global_tokens: int,
    world_size: int,
) -> torch.Tensor:
    """Token-mean over the step's global token count, times the world size (DAPO
    arXiv:2503.14476 Eq. 8 under an all-reduce mean)."""
    out = policy_loss(
        DAPO.replace(aggregation="token-sum", budget=None),
        logprobs=logprobs,
        old_logprobs=old_logprobs,
        advantages=advantages,
        response_mask=response_mask,
    )
    tok = torch.where(response_mask, out.token_loss, 0.0)
    return tok.sum() / global_tokens * world_size


def make_batch(rows: int, width: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    if rows == 8:
        lengths = torch.tensor([1, 2, 1, 3, 6, 5, 6, 4])
    else:
        lengths = torch.randint(1, width + 1, (rows,), generator=g)
    mask = torch.arange(width)[None, :] < lengths[:, None]
    lp = -(torch.rand((rows, width), generator=g, dtype=torch.float64) * 2 + 0.1)
    old = lp - (torch.rand((rows, width), generator=g, dtype=torch.float64) - 0.5) * 0.3
    adv = torch.randn(rows, generator=g, dtype=torch.float64)
    return {"logprobs": lp, "old_logprobs": old, "advantages": adv, "response_mask": mask}


def make_split(rows: int, world: int, accumulation: int = 2) -> Split:
    """Rows dealt in order: ``world x accumulation`` chunks, the last one takes the rest."""
    parts = world * accumulation
    size = rows // parts
    bounds = [i * size for i in range(parts)] + [rows]
    chunks = [tuple(range(bounds[i], bounds[i + 1])) for i in range(parts)]
    ranks = [tuple(chunks[r * accumulation : (r + 1) * accumulation]) for r in range(world)]
    return Split(tuple(ranks))


def median_ms(fn: Callable[[], Any], calls: int) -> float:
    fn()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=15)
    parser.add_argument("--sizes", default="small,large")
    parser.add_argument("--worlds", default="2,4")
    parser.add_argument("--marked", type=int, default=10, help="marked steps per CI run")
    args = parser.parse_args()
    torch.set_num_threads(1)
    sizes = [s.strip() for s in args.sizes.split(",")]
    worlds = [int(w) for w in args.worlds.split(",")]
    ctx = build_context(dapo_step, ConformanceOptions("dapo", kind="training_step"))

    starts: dict[int, float] = {}
    kinds: dict[int, dict[str, float]] = {}
    rows_out = []
    for world in worlds:
        batch = make_batch(*SIZES["small"])
        kinds[world] = {}
        for kind in ("spawn", "cold", "warm"):
            distributed._FORK = kind != "spawn"
            distributed.shutdown(zygote=kind != "warm")
            begin = time.perf_counter()
            distributed.run_step(dapo_step, batch, make_split(8, world), wrap="ddp")
            kinds[world][kind] = time.perf_counter() - begin
        starts[world] = kinds[world]["cold"]
        for size in sizes:
            rows, width = SIZES[size]
            batch = make_batch(rows, width)
            split = make_split(rows, world)
            inputs = {**batch, "split": split}
            sim = median_ms(partial(accumulate, ctx, inputs), args.calls)
            real = {
                wrap: median_ms(
                    partial(distributed.run_step, dapo_step, batch, split, wrap=wrap), args.calls
                )
                for wrap in distributed.WRAPS
            }
            rows_out.append((size, rows, width, world, sim, real["ddp"], real["fsdp"]))
    distributed.shutdown()

    print(f"{'size':>6} {'B x T':>9} {'world':>5} {'simulated':>10} {'ddp':>9} {'fsdp':>9} "
          f"{'ddp/sim':>8} {'fsdp/sim':>8}")  # fmt: skip
    for size, rows, width, world, sim, ddp, fsdp in rows_out:
        print(f"{size:>6} {f'{rows} x {width}':>9} {world:>5} {sim:>8.2f}ms {ddp:>7.1f}ms "
              f"{fsdp:>7.1f}ms {ddp / sim:>7.0f}x {fsdp / sim:>7.0f}x")  # fmt: skip
    print()
    for world, by in kinds.items():
        print(f"pool start, world {world}: cold {by['cold']:.1f} s (the process's first pool), "
              f"warm {by['warm']:.2f} s (a new pool, same zygote), spawn {by['spawn']:.1f} s "
              "(an interpreter per rank)")  # fmt: skip
    print()
    for size, _rows, _width, world, sim, ddp, fsdp in rows_out:
        per_check = {
            "simulated": sim * CHECK_CALLS / 1e3,
            "ddp": ddp * CHECK_CALLS / 1e3 + starts[world],
            "fsdp": fsdp * CHECK_CALLS / 1e3,
        }
        print(f"one split check ({CHECK_CALLS} steps), {size}, world {world}: simulated "
              f"{per_check['simulated']:.2f} s; ddp {per_check['ddp']:.1f} s with the pool's "
              f"start; fsdp {per_check['fsdp']:.1f} s more on the same pool")  # fmt: skip
    print()
    checks = args.marked * 2 * CHECK_CALLS / 1e3  # calls of a CI run, in thousands
    for size, _rows, _width, world, sim, ddp, fsdp in rows_out:
        print(f"one CI run ({args.marked} marked steps x 2 split checks), {size}, world {world}: "
              f"simulated {sim * checks:.1f} s; ddp {ddp * checks + starts[world]:.1f} s; fsdp "
              f"{fsdp * checks + starts[world]:.1f} s (each with one pool start)")  # fmt: skip


if __name__ == "__main__":
    main()
