"""Benchmark: the reference ``policy_loss`` vs each framework's own implementation of the
same loss, forward+backward, B=64, T=4096, float32, CPU.

The loss is PPO's clipped surrogate with eps 0.2 and token-mean aggregation, as each
framework ships it: verl 0.9.1 ``compute_policy_loss_vanilla`` (which adds the dual-clip
floor c = 3, so its reference row is ``ppo`` with ``dual_clip=3``), TRL 1.16.0
``GRPOTrainer._compute_loss(loss_type="bnpo")`` (through the adapter: the trainer method
with its metric bookkeeping, as it runs in training) and OpenRLHF 0.11.2 ``PolicyLoss()``.
Time: median of interleaved repetitions in one process, one thread. Peak memory: the peak
of live tensor bytes during one forward+backward, from the torch profiler's allocation
events. Needs the frameworks tier environment:

    .venv-frameworks/bin/python bench/frameworks.py [--reps N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from polgrad_reference import ALGORITHMS, policy_loss
from pytest_polgrad.frameworks import openrlhf, trl, verl

B, T = 64, 4096
Batch = dict[str, torch.Tensor]
Loss = Callable[[Batch], torch.Tensor]


def make_inputs(seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    logprobs = -torch.rand((B, T), generator=g) * 5
    return {
        "logprobs": logprobs,
        "old_logprobs": logprobs + (torch.rand((B, T), generator=g) - 0.5) * 0.6,
        "advantages": torch.randn((B,), generator=g),
        "response_mask": mask,
    }


def _reference(dual_clip: float | None) -> Loss:
    cfg = ALGORITHMS["ppo"].derive(dual_clip=dual_clip).loss

    def run(x: Batch) -> torch.Tensor:
        return policy_loss(cfg, **x).loss

    return run


def _framework(fn: Callable[..., torch.Tensor]) -> Loss:
    def run(x: Batch) -> torch.Tensor:
        return fn(**x)

    return run


def implementations() -> dict[str, Loss]:
    return {
        "verl vanilla": _framework(verl.policy_loss("vanilla", loss_agg_mode="token-mean")),
        "reference ppo+dual3": _reference(3.0),
        "trl bnpo": _framework(trl.grpo_loss(loss_type="bnpo")),
        "openrlhf PolicyLoss": _framework(openrlhf.policy_loss()),
        "reference ppo": _reference(None),
    }


def step(fn: Loss, x: Batch) -> None:
    lp = x["logprobs"].detach().requires_grad_()
    fn({**x, "logprobs": lp}).backward()


def peak_tensor_mib(fn: Loss, x: Batch) -> float:
    """Peak of live CPU tensor bytes during one forward+backward (MiB), from the torch
    profiler's allocation events (inputs, allocated before, are not counted)."""
    step(fn, x)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step(fn, x)
    events = prof.profiler.kineto_results.events()  # type: ignore[union-attr]
    live = peak = 0
    for _, nbytes in sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]"):
        live += nbytes
        peak = max(peak, live)
    return peak / 2**20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    x = make_inputs()
    impls = implementations()
    for _ in range(2):
        for fn in impls.values():
            step(fn, x)
    times: dict[str, list[float]] = {k: [] for k in impls}
    for _ in range(args.reps):
        for key, fn in impls.items():
            t0 = time.perf_counter()
            step(fn, x)
            times[key].append(time.perf_counter() - t0)
    mem = {key: peak_tensor_mib(fn, x) for key, fn in impls.items()}
    med = {key: statistics.median(v) * 1e3 for key, v in times.items()}
    print(f"B={B} T={T} float32, {args.reps} interleaved reps, 1 thread, torch {torch.__version__}")
    print(f"{'implementation':<22} {'median ms':>10} {'peak tensor MiB':>16}")
    for key in impls:
        print(f"{key:<22} {med[key]:>10.2f} {mem[key]:>16.1f}")
    frameworks = [k for k in impls if not k.startswith("reference")]
    fastest = min(frameworks, key=med.__getitem__)
    for ref in ("reference ppo+dual3", "reference ppo"):
        print(
            f"{ref}: {med[ref] / med[fastest]:.3f}x the time of the fastest framework "
            f"({fastest}), {mem[ref] / mem[fastest]:.3f}x its peak memory"
        )


if __name__ == "__main__":
    main()
