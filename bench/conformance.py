"""Benchmark: cost of the conformance engine against the computation it must do anyway.

1. value + gradient checks of a correct GRPO loss at 100 examples each, against the bare
   forward+backward of the function plus the oracle on the very same batches (recorded
   during the run and replayed);
2. a full default run (every check, 100 examples) of one marked function.

Medians over repeated runs in one process. Run: ``python bench/conformance.py``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from pytest_polgrad.engine import applicable_checks, build_context, resolve_config, run_check
from pytest_polgrad.options import parse_marker

Tensor = torch.Tensor


def grpo_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """A correct hand-written GRPO policy term (seq-mean-token-mean, clip 0.2)."""
    ratio = torch.exp(torch.where(response_mask, logprobs - old_logprobs, 0.0))
    a = advantages[:, None]
    per = torch.maximum(-a * ratio, -a * ratio.clamp(0.8, 1.2))
    per = torch.where(response_mask, per, 0.0)
    return (per.sum(dim=1) / response_mask.sum(dim=1)).mean()


def bare(ctx: Any, batch: dict[str, Tensor]) -> None:
    """What any comparison needs: the function's and the oracle's forward+backward."""
    lp = batch["logprobs"].detach().clone().requires_grad_()
    inputs = {k: batch[k] for k in ("old_logprobs", "advantages", "response_mask")}
    torch.autograd.grad(grpo_loss(lp, **inputs), lp)
    ctx.oracle(batch, kink_eps=ctx.tolerance.loosest)


def generation_floor(ctx: Any, examples: int, seed: int) -> float:
    """Seconds Hypothesis needs to draw ``examples`` batches of the value check's strategy
    and run a property that does nothing: the floor under any Hypothesis-driven check."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as fix_seed

    from pytest_polgrad.engine import _strategy

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=(Phase.explicit, Phase.generate),
        suppress_health_check=list(HealthCheck),
    )
    @fix_seed(seed)
    @given(batch=_strategy(ctx, "value"))
    def noop(batch: Any) -> None:
        pass

    t0 = time.perf_counter()
    noop()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--examples", type=int, default=100)
    parser.add_argument("--max-batch", type=int, default=8, help="marker option max_batch")
    parser.add_argument("--max-length", type=int, default=256, help="marker option max_length")
    args = parser.parse_args()
    torch.set_num_threads(1)
    sizes = {"max_batch": args.max_batch, "max_length": args.max_length}
    options = parse_marker(("grpo",), sizes)
    engine_t, bare_t, full_t, floor_t = [], [], [], []
    recorded: list[dict[str, Tensor]] = []

    def recording_loss(
        logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
    ) -> Tensor:
        batch = dict(logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages)
        recorded.append(
            {k: v.detach() for k, v in batch.items()} | {"response_mask": response_mask}
        )
        return grpo_loss(logprobs, old_logprobs, advantages, response_mask)

    for run in range(args.runs):
        recorded.clear()
        ctx = build_context(recording_loss, options)
        t0 = time.perf_counter()
        for check in ("value", "gradient"):
            result = run_check(ctx, check, max_examples=args.examples, base_seed=run)
            assert result.passed, result.report
        engine_t.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for batch in recorded:  # the very batches the two checks evaluated
            bare(ctx, batch)
        bare_t.append(time.perf_counter() - t0)
        floor_t.append(2 * generation_floor(ctx, args.examples, run))
        t0 = time.perf_counter()
        for check in applicable_checks(resolve_config(options), options):
            run_check(
                build_context(grpo_loss, options), check, max_examples=args.examples, base_seed=run
            )
        full_t.append(time.perf_counter() - t0)
    eng, bar, full, floor = (statistics.median(x) for x in (engine_t, bare_t, full_t, floor_t))
    print(
        f"torch {torch.__version__}, 1 thread, {args.examples} examples per check, "
        f"{args.runs} runs, batches up to B={args.max_batch}, T={args.max_length}"
    )
    print(f"value+gradient checks        median {eng:7.3f} s")
    print(f"bare fwd+bwd fn + oracle     median {bar:7.3f} s  (same {len(recorded)} batches)")
    print(f"ratio engine / bare          {eng / bar:7.3f}")
    print(f"generation floor (2 no-op properties) {floor:7.3f} s")
    print(f"engine's own overhead        {eng - bar - floor:7.3f} s beyond floor + bare")
    print(
        f"full default run, all {len(applicable_checks(resolve_config(options), options))} "
        f"checks  median {full:7.3f} s"
    )


if __name__ == "__main__":
    main()
